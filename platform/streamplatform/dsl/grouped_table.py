"""A table grouped by a new key (``KTable.group_by``) and its aggregations, as Kafka Streams'
``KGroupedTable``: ``count()``, ``reduce(adder, subtractor)`` and ``aggregate(initializer,
adder, subtractor)``.

A table's update replaces the key's previous value, so its group must lose the previous pair
and gain the new one. Kafka Streams has the table send its old value with each update; ours
forward only new values, so the grouping node (``TableGroupBy``) keeps the pair it last
selected for each key in a store of its own (transactional like every store), which works
after filter, map_values or a join as well. As Kafka Streams 4.4's ``KTableRepartitionMap``,
it forwards through the repartition topic (always: the key changes):

- one record ``Change(new, old)`` when the old and new pairs have the same group key (compared
  as serialized keys), so the group is updated once;
- otherwise ``Change(None, old)`` to the old group first, then ``Change(new, None)`` to the new
  one (each only when that pair exists: a pair with a None key or value is in no group).

The aggregation (``TableAggregate``) subtracts the old value, then adds the new one, as
Kafka Streams' ``KTableAggregate``/``KTableReduce``: a group that loses its last member keeps
its result (a count of 0 is forwarded as 0, not as a tombstone); a subtractor returning None
deletes the group (a tombstone). Results are stored and cached as the stream aggregations'
(aggregate.py: 8-byte timestamp + value bytes, the record cache).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from streamplatform.dsl.aggregate import _Aggregation
from streamplatform.dsl.graph import ProcessorNode
from streamplatform.dsl.kstream import KStream
from streamplatform.dsl.ktable import KTable
from streamplatform.dsl.processor import Processor, ProcessorContext, engine_store
from streamplatform.records import Record
from streamplatform.serdes import Serde, Serdes, SerializationError
from streamplatform.state import Stores

_LENGTH = struct.Struct(">i")
_NEW, _OLD = 1, 2  # ChangeSerde's flags: which of the two values the record carries


class Change(NamedTuple):
    """What a table grouping sends to its aggregation: the value to add to the group
    (``new``) and the one to subtract (``old``), either None."""

    new: Any
    old: Any


class ChangeSerde:
    """The repartition topic's value serde of a table grouping: a flags byte (which values
    are present), the new value's length (4 bytes, big-endian) and bytes, then the old
    value's bytes, each in ``inner``."""

    def __init__(self, inner: Serde) -> None:
        self.inner = inner
        self.name = f"change({inner.name})"

    def serialize(self, change: Change | None) -> bytes | None:
        if change is None:
            return None
        new = None if change.new is None else self.inner.serialize(change.new) or b""
        old = None if change.old is None else self.inner.serialize(change.old) or b""
        flags = (_NEW if new is not None else 0) | (_OLD if old is not None else 0)
        new_bytes = new or b""
        return bytes((flags,)) + _LENGTH.pack(len(new_bytes)) + new_bytes + (old or b"")

    def deserialize(self, data: bytes | None) -> Change | None:
        if data is None:
            return None
        data = bytes(data)
        if len(data) < 5 or data[0] > _NEW | _OLD:
            raise SerializationError("not a table grouping's change record", raw=data)
        flags, size = data[0], _LENGTH.unpack_from(data, 1)[0]
        new = self.inner.deserialize(data[5 : 5 + size]) if flags & _NEW else None
        old = self.inner.deserialize(data[5 + size :]) if flags & _OLD else None
        return Change(new, old)


class TableGroupBy(Processor):
    """Kafka Streams' ``KTableRepartitionMap``: each table update as the changes of the
    groups it leaves and joins (see the module's docstring). ``store``: table key -> the pair
    last selected for it (4-byte length + group key bytes + value bytes)."""

    def __init__(
        self,
        store_name: str,
        table_key_serde: Serde,
        selector: Callable[[Any, Any], tuple[Any, Any]],
        key_serde: Serde,
        value_serde: Serde,
    ) -> None:
        self.store_name = store_name
        self.table_key_serde = table_key_serde
        self.selector = selector
        self.key_serde = key_serde
        self.value_serde = value_serde

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)

    def _selected(self, key: Any, value: Any) -> tuple[Any, Any, bytes] | None:
        """``selector(key, value)`` and the group key's bytes; None for no group."""
        if value is None:
            return None
        pair = self.selector(key, value)
        if pair is None:
            return None
        group, grouped = pair
        if group is None or grouped is None:
            return None
        return group, grouped, self.key_serde.serialize(group) or b""

    def process(self, record: Record) -> None:
        if record.key is None:
            return  # a table has no None key (its source drops them)
        raw_key = self.table_key_serde.serialize(record.key) or b""
        transaction = self.store.transaction
        stored = transaction.get(raw_key)
        new = self._selected(record.key, record.value)
        if new is None:
            if stored is not None:
                transaction.delete(raw_key)
        else:
            value_bytes = self.value_serde.serialize(new[1]) or b""
            transaction.put(raw_key, _LENGTH.pack(len(new[2])) + new[2] + value_bytes)
        forward = self.context.forward
        if stored is None:
            old = None
        else:
            size = _LENGTH.unpack_from(stored)[0]
            old_group = stored[4 : 4 + size]
            old = (old_group, self.value_serde.deserialize(stored[4 + size :]))
        if old is not None and new is not None and old[0] == new[2]:
            forward(record._replace(key=new[0], value=Change(new[1], old[1])))
            return
        if old is not None:
            group = self.key_serde.deserialize(old[0])
            forward(record._replace(key=group, value=Change(None, old[1])))
        if new is not None:
            forward(record._replace(key=new[0], value=Change(new[1], None)))


class TableAggregate(_Aggregation):
    """Kafka Streams' ``KTableAggregate`` (``initializer`` given: ``adder(key, value, agg)``,
    ``subtractor(key, value, agg)``) or ``KTableReduce`` (``initializer`` None:
    ``adder(agg, value)``, ``subtractor(agg, value)``, a group's first value its first
    result), on the ``Change`` records of a table grouping."""

    def __init__(
        self,
        store_name: str,
        key_serde: Serde,
        result_serde: Serde,
        initializer: Callable[[], Any] | None,
        adder: Callable[..., Any],
        subtractor: Callable[..., Any],
    ) -> None:
        super().__init__(store_name, key_serde, result_serde, initializer, adder)
        self.adder = adder
        self.subtractor = subtractor

    def reads_values(self) -> bool:
        return True  # the Change records' old and new values, whatever the aggregator

    def process(self, record: Record) -> None:
        key, change = record.key, record.value
        if key is None or change is None:
            self.dropped_records += 1
            return
        raw_key = self.key_serde.serialize(key) or b""
        old = self.cache.get(raw_key)
        if old is not None and old[0] is None:
            old = None  # deleted (a subtractor returned None): the group has no result
        reduce = self.initializer is None
        result = None if old is None else old[0]
        timestamp = record.timestamp
        # First subtract the old value (only from an existing result), then add the new one;
        # the timestamps as Kafka Streams takes them.
        if change.old is not None and old is not None:
            result = (self.subtractor(result, change.old) if reduce
                      else self.subtractor(key, change.old, result))  # fmt: skip
            timestamp = max(timestamp, old[1])
        if change.new is not None:
            if reduce:
                if result is None:
                    result = change.new
                else:
                    result = self.adder(result, change.new)
                    timestamp = max(record.timestamp, old[1]) if old is not None else timestamp
            else:
                start = self.initializer() if result is None else result  # type: ignore[misc]
                result = self.adder(key, change.new, start)
                if old is not None:
                    timestamp = max(record.timestamp, old[1])
        self.cache.put(raw_key, result, timestamp, record, None)


def _count_add(key: Any, value: Any, count: int) -> int:
    return count + 1


def _count_subtract(key: Any, value: Any, count: int) -> int:
    return count - 1


def _zero() -> int:
    return 0


# For type checkers and editors only: the groups' key type, the selected values' type and an
# aggregate's type (what the adder returns).
K = TypeVar("K")
V = TypeVar("V")
VA = TypeVar("VA")


class KGroupedTable(Generic[K, V]):
    """A table grouped by ``selector``'s keys: ``count``, ``reduce`` or ``aggregate`` give a
    KTable of each group's result (materialized: its own store). ``KGroupedTable[K, V]``:
    generic in the groups' key and the selected values' types, for type checkers and editors
    (``count()`` gives a ``KTable[K, int]``)."""

    def __init__(
        self,
        table: KTable,
        selector: Callable[[Any, Any], tuple[Any, Any]],
        key_serde: Serde,
        value_serde: Serde,
        name: str | None = None,
    ) -> None:
        self._table = table
        self._selector = selector
        self.key_serde = key_serde
        self.value_serde = value_serde
        self._name = name  # the grouping node's and its store's; None: generated

    def count(self, name: str | None = None) -> KTable[K, int]:
        """Members per group: +1 for a pair that joins it, -1 for one that leaves it."""
        return self._aggregate("KTABLE-COUNT", name, _zero, _count_add, _count_subtract,
                               Serdes.long())  # fmt: skip

    def reduce(
        self,
        adder: Callable[[V, V], V],
        subtractor: Callable[[V, V], V],
        name: str | None = None,
    ) -> KTable[K, V]:
        """``adder(aggregate, value)`` for a value that joins a group, ``subtractor(aggregate,
        value)`` for one that leaves it; a group's first value is its first result. The
        results keep the grouping's value serde."""
        self._check(adder=adder, subtractor=subtractor)
        return self._aggregate("KTABLE-REDUCE", name, None, adder, subtractor,
                               self.value_serde)  # fmt: skip

    def aggregate(
        self,
        initializer: Callable[[], Any],
        adder: Callable[[K, V, VA], VA],
        subtractor: Callable[[K, V, VA], VA],
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KTable[K, VA]:
        """``adder(key, value, aggregate)`` for a value that joins a group (starting from
        ``initializer()``), ``subtractor(key, value, aggregate)`` for one that leaves it;
        ``value_serde`` writes the results (JSON when not given)."""
        self._check(initializer=initializer, adder=adder, subtractor=subtractor)
        return self._aggregate("KTABLE-AGGREGATE", name, initializer, adder, subtractor,
                               value_serde or Serdes.json())  # fmt: skip

    @staticmethod
    def _check(**functions: Any) -> None:
        for what, function in functions.items():
            if not callable(function):
                raise TypeError(f"{what} must be callable, got {function!r}")

    def _aggregate(
        self,
        kind: str,
        name: str | None,
        initializer: Callable[[], Any] | None,
        adder: Callable[..., Any],
        subtractor: Callable[..., Any],
        result_serde: Serde,
    ) -> KTable:
        """The grouping node (with its store of selected pairs), the repartition topic, the
        aggregation node (with its store of results): a KTable of the results."""
        table, builder = self._table, self._table._builder
        base = name or builder.new_name(kind)
        select_name = self._name or builder.new_name("KTABLE-SELECT")
        pairs = builder.add_store(Stores.persistent_key_value_store(f"{select_name}-STATE-STORE"),
                                  table.key_serde, self.key_serde)  # fmt: skip
        args = (pairs, table.key_serde, self._selector, self.key_serde, self.value_serde)
        select = ProcessorNode(select_name, lambda: TableGroupBy(*args), (pairs,))
        builder.add_node(select, parents=[table._node])
        changes = KStream(builder, select_name, self.key_serde, ChangeSerde(self.value_serde))
        grouped = changes._repartition(base)
        store = builder.add_store(Stores.persistent_key_value_store(f"{base}-STATE-STORE"),
                                  self.key_serde, result_serde)  # fmt: skip
        key_serde = self.key_serde
        node = grouped._then(
            kind,
            lambda: TableAggregate(store, key_serde, result_serde, initializer, adder, subtractor),
            stores=(store,),
            name=base,
        )
        table = KTable(builder, node._node, store, key_serde, result_serde)
        table._aggregated = True
        return table
