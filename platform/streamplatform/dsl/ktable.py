"""KTable: a changelog stream (a table topic, or an aggregation's results) and its operators.

A table forwards its updates as records, a None value being a tombstone (the key was
deleted, or, after ``filter``, no longer passes). ``to_stream()`` makes them a KStream, to
write to a topic (updates and tombstones, as Kafka Streams writes a table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamplatform.dsl.graph import ProcessorNode
from streamplatform.dsl.processor import Processor
from streamplatform.records import Record
from streamplatform.serdes import Serde
from streamplatform.state import Stores

if TYPE_CHECKING:
    from streamplatform.dsl.builder import StreamsBuilder
    from streamplatform.dsl.kstream import KStream
    from streamplatform.dsl.suppress import Suppressed


class TableFilter(Processor):
    """Passes an update whose value ``predicate(key, value)`` accepts (``negate``: rejects);
    any other update becomes a tombstone, as Kafka Streams' table filter forwards it."""

    def __init__(self, predicate: Callable[[Any, Any], bool], negate: bool) -> None:
        self.predicate = predicate
        self.negate = negate

    def process(self, record: Record) -> None:
        value = record.value
        if value is not None and bool(self.predicate(record.key, value)) == self.negate:
            value = None
        self.context.forward(record._replace(value=value))


class TableMapValues(Processor):
    """``mapper(value)`` for every update but a tombstone, which stays one."""

    def __init__(self, mapper: Callable[[Any], Any]) -> None:
        self.mapper = mapper

    def process(self, record: Record) -> None:
        value = record.value
        self.context.forward(record._replace(value=None if value is None else self.mapper(value)))


class KTable:
    """A table: its updates come from node ``node``; ``store`` holds its current values
    (the table's own store for a table topic or an aggregation)."""

    def __init__(
        self, builder: StreamsBuilder, node: str, store: str, key_serde: Serde, value_serde: Serde
    ) -> None:
        self._builder = builder
        self._node = node
        self._materialized = True  # the store holds this table's values (joinable)
        self._windows: Any = None  # the TimeWindows of a windowed aggregation's table
        self.store_name = store
        self.key_serde = key_serde
        self.value_serde = value_serde

    def filter(self, predicate: Callable[[Any, Any], bool]) -> KTable:
        """Keys whose value passes ``predicate(key, value)``; the others become tombstones."""
        return self._then("KTABLE-FILTER", lambda: TableFilter(predicate, negate=False))

    def filter_not(self, predicate: Callable[[Any, Any], bool]) -> KTable:
        return self._then("KTABLE-FILTER", lambda: TableFilter(predicate, negate=True))

    def map_values(self, mapper: Callable[[Any], Any], value_serde: Serde | None = None) -> KTable:
        """``mapper(value)`` for each update; ``value_serde`` writes the new values (the
        table's when not given)."""
        table = self._then("KTABLE-MAPVALUES", lambda: TableMapValues(mapper))
        table.value_serde = value_serde or self.value_serde
        return table

    def suppress(self, suppressed: Suppressed) -> KTable:
        """``Suppressed.until_window_closes()``: each window's final result only, forwarded
        once the window closes (a windowed aggregation's table only)."""
        from streamplatform.dsl.suppress import WindowCloseSuppression

        if self._windows is None:
            raise ValueError("suppress(until_window_closes) needs the table of a windowed "
                             "aggregation (windowed_by(...).count() and the like)")  # fmt: skip
        builder, grace = self._builder, self._windows.grace_ms
        name = builder.new_name("KTABLE-SUPPRESS")
        store = builder.add_store(Stores.persistent_key_value_store(f"{name}-STATE-STORE"))
        key_serde, value_serde = self.key_serde, self.value_serde
        node = ProcessorNode(name, lambda: WindowCloseSuppression(store, key_serde, value_serde,
                                                                   grace), (store,))  # fmt: skip
        builder.add_node(node, parents=[self._node])
        table = KTable(builder, name, self.store_name, key_serde, value_serde)
        table._materialized = False
        return table

    def to_stream(self) -> KStream:
        """The table's updates as a stream (tombstones included)."""
        from streamplatform.dsl.kstream import KStream

        return KStream(self._builder, self._node, self.key_serde, self.value_serde)

    def _then(self, kind: str, supplier: Callable[[], Processor]) -> KTable:
        builder = self._builder
        node = ProcessorNode(builder.new_name(kind), supplier)
        builder.add_node(node, parents=[self._node])
        # A derived table has no store of its own (Kafka Streams materializes one only on
        # demand): it cannot be joined (KStream.join refuses it).
        table = KTable(builder, node.name, self.store_name, self.key_serde, self.value_serde)
        table._materialized = False
        return table
