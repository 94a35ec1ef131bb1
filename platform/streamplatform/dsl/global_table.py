"""GlobalKTable: a table every task holds whole, and the stream-global table joins.

Kafka Streams' ``StreamsBuilder.globalTable``: the table is read from **all** partitions of its
topic, so a stream joins it on any key it derives from a record (``KStream.join(global_table,
key_selector, joiner)``), with no repartition and no co-partitioning. The table's topic is not a
source of any sub-topology: no task reads it as a stream, and it makes no tasks.

**Its store.** A plain key-value store (``<topic>-STATE-STORE``, or the ``name`` given) holding
the topic's raw key and value bytes, as a KTable's plain store holds them (dsl/join.py), so the
join reads it the same way. It has no changelog: the topic is its changelog, as in Kafka
Streams; the store's spec says so (``KeyValueStoreSpec.global_topic``). Every task whose
sub-topology joins the table keeps a copy of it (``Task.global_stores``), fed by the runtime or
the TopologyTestDriver with ``apply_global_records``; ``Topology.global_tables()`` lists the
tables to feed. A record with a None key is skipped (Kafka Streams' table source drops it), a
None value deletes the key.

**The join** (Kafka Streams' KStreamKTableJoinProcessor, as used for global tables): for each
stream record, ``key_selector(key, value)`` gives the table's key; the result keeps the stream
record's key and timestamp.

- A record with a None value is dropped (``dropped_records``), by the inner and the left join.
- A None mapped key: the inner join drops the record (``dropped_records``); the left join
  joins it with None (Kafka Streams 4.x).
- No table value for the mapped key: the inner join forwards nothing; the left join
  ``joiner(value, None)``.
- A None stream key is no reason to drop: the join key is the mapped key.

The joiner is ``joiner(value, table_value)``, ``joiner(key, value, table_value)`` (Kafka
Streams' ValueJoinerWithKey, given the stream record's key) or ``joiner(key, mapped_key, value,
table_value)`` (ValueJoinerWithStreamAndMappedKey), told apart by their number of required
arguments. Kafka Streams calls ``key_selector`` twice per record (to decide dropping, then to
join); here it is called once, which is the same for a selector without side effects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from streamplatform.dsl.printing import takes_key
from streamplatform.dsl.processor import Processor, ProcessorContext, engine_store
from streamplatform.records import Record
from streamplatform.serdes import Serde

if TYPE_CHECKING:
    from streamplatform.dsl.builder import StreamsBuilder

__all__ = ["GlobalKTable", "GlobalTableSpec"]

K = TypeVar("K")  # the table's key and value types, for type checkers and editors only
V = TypeVar("V")


class GlobalTableSpec(NamedTuple):
    """A global table as the runtime feeds it: its topic (read whole, every partition), its
    store's name in each task's ``global_stores``, and the topic's serdes."""

    topic: str
    store_name: str
    key_serde: Serde
    value_serde: Serde


class GlobalKTable(Generic[K, V]):
    """Kafka Streams' ``GlobalKTable``: only joined (``KStream.join`` / ``left_join`` with a
    key selector); it has no operators of its own. ``GlobalKTable[K, V]``: generic in its key
    and value types, for type checkers and editors."""

    def __init__(self, builder: StreamsBuilder, spec: GlobalTableSpec) -> None:
        self._builder = builder
        self.spec = spec

    @property
    def topic(self) -> str:
        return self.spec.topic

    @property
    def store_name(self) -> str:
        return self.spec.store_name

    @property
    def key_serde(self) -> Serde:
        return self.spec.key_serde

    @property
    def value_serde(self) -> Serde:
        return self.spec.value_serde

    def queryable_store_name(self) -> str:
        """Kafka Streams' ``queryableStoreName()``: a global table is always materialized."""
        return self.spec.store_name


def global_joiner(joiner: Callable[..., Any]) -> Callable[[Any, Any, Any, Any], Any]:
    """``joiner`` as StreamGlobalTableJoin calls it, ``(key, mapped_key, value,
    table_value)``: itself when it takes the four, else one that drops what it does not
    take (``(key, value, table_value)``: Kafka Streams' ValueJoinerWithKey, the stream's key)."""
    if takes_key(joiner, 3):
        return joiner
    if takes_key(joiner, 2):

        def with_key(key: Any, mapped_key: Any, value: Any, table_value: Any) -> Any:
            return joiner(key, value, table_value)

        return with_key

    def values_only(key: Any, mapped_key: Any, value: Any, table_value: Any) -> Any:
        return joiner(value, table_value)

    return values_only


class StreamGlobalTableJoin(Processor):
    """A stream record joined with the global table's value at ``key_selector(key, value)``
    (see the module's docstring for None keys and values); ``left`` keeps records with no
    match."""

    def __init__(
        self,
        table: GlobalTableSpec,
        key_selector: Callable[[Any, Any], Any],
        joiner: Callable[[Any, Any, Any, Any], Any],  # (key, mapped key, value, table value)
        left: bool,
    ) -> None:
        self.table = table
        self.key_selector = key_selector
        self.joiner = joiner
        self.left = left
        self.joined = 0  # counted per task instance (task_metrics())
        self.misses = 0
        self.dropped_records = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.table.store_name)

    def task_metrics(self) -> dict[str, int]:
        """Records joined, those that found no table value (dropped by an inner join,
        joined with None by a left join) and those dropped for a None value or (inner join)
        a None mapped key: Kafka Streams' dropped-records."""
        return {"join_joined": self.joined, "join_misses": self.misses,
                "dropped_records": self.dropped_records}  # fmt: skip

    def process(self, record: Record) -> None:
        key, value = record[0], record[1]
        if value is None:
            self.dropped_records += 1  # Kafka Streams: "Skipping record due to null join key
            return  # or value"
        mapped_key = self.key_selector(key, value)
        table_value = None
        if mapped_key is None:
            if not self.left:
                self.dropped_records += 1
                return
        else:
            raw_key = self.table.key_serde.serialize(mapped_key)
            if raw_key is not None:
                raw = self.store.transaction.get(raw_key)
                if raw is not None:
                    table_value = self.table.value_serde.deserialize(raw)
        if table_value is None:
            self.misses += 1
            if not self.left:
                return
        else:
            self.joined += 1
        joined = self.joiner(key, mapped_key, value, table_value)
        self.context.forward(record._replace(value=joined))
