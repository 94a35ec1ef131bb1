"""KTable: a changelog stream (a table topic, or an aggregation's results) and its operators.

A table forwards its updates as records, a None value being a tombstone (the key was
deleted, or, after ``filter``, no longer passes). ``to_stream()`` makes them a KStream, to
write to a topic (updates and tombstones, as Kafka Streams writes a table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from streamplatform.dsl.graph import ProcessorNode
from streamplatform.dsl.printing import key_joiner
from streamplatform.dsl.processor import PassThrough, Processor, ProcessorContext, engine_store
from streamplatform.dsl.table_join import INNER, LEFT, LEFT_JOIN, OUTER, RIGHT, TableJoinSide
from streamplatform.records import Record
from streamplatform.serdes import Serde
from streamplatform.state import Stores

if TYPE_CHECKING:
    from streamplatform.dsl.builder import StreamsBuilder
    from streamplatform.dsl.grouped_table import KGroupedTable
    from streamplatform.dsl.kstream import KStream
    from streamplatform.dsl.suppress import Suppressed
    from streamplatform.state.stores import KeyValueStoreSpec

_HAS_VALUE = b"\x01"  # a filter's store: the key has a value in the filtered table

# The table's key and value types (for type checkers and editors only), and those an operator
# makes: KR, VR its new key and value, VO the other table's value.
K = TypeVar("K")
V = TypeVar("V")
KR = TypeVar("KR")
VR = TypeVar("VR")
VO = TypeVar("VO")


class TableFilter(Processor):
    """Kafka Streams' ``KTableFilter``: passes an update whose value ``predicate(key, value)``
    accepts (``negate``: rejects); any other update becomes a tombstone.

    Once something downstream asks for old values (``settings["old_values"]``, set by
    KTable._send_old_values), Kafka Streams' filter also computes the filtered old value and
    forwards nothing when both are None (``if (sendOldValues && oldValue == null && newValue
    == null) return;``). Our tables forward new values only, so the filter then keeps the keys
    it has a value for in a store of its own (``settings["store"]``): a key without one there
    had no (passing) old value.

    On a versioned table (``versioned``) Kafka Streams' filter forwards every update, old
    values sent or not (``if (!useVersionedSemantics) {...}``, KIP-914): so does ours."""

    def __init__(
        self,
        predicate: Callable[[Any, Any], bool],
        negate: bool,
        settings: dict[str, Any] | None = None,
        key_serde: Serde | None = None,
        versioned: bool = False,
    ) -> None:
        self.predicate = predicate
        self.negate = negate
        self.versioned = versioned
        # Read when the task is created: the store is added after the filter (_send_old_values).
        self.store_name = None if settings is None else settings["store"]
        self.key_serde = key_serde

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        if self.store_name is not None:
            self.store = engine_store(context, self.store_name)

    def process(self, record: Record) -> None:
        value = record.value
        if value is not None and bool(self.predicate(record.key, value)) == self.negate:
            value = None
        if self.store_name is not None and self.key_serde is not None and not self.versioned:
            raw_key = self.key_serde.serialize(record.key)
            if raw_key is not None:  # a table has no None key (its source drops them)
                transaction = self.store.transaction
                had_value = transaction.get(raw_key) is not None
                if value is None:
                    if not had_value:
                        return  # no value before, none after: Kafka Streams forwards nothing
                    transaction.delete(raw_key)
                elif not had_value:
                    transaction.put(raw_key, _HAS_VALUE)
        self.context.forward(record._replace(value=value))


class TableMapValues(Processor):
    """``mapper(value)`` for every update but a tombstone, which stays one."""

    def __init__(self, mapper: Callable[[Any], Any]) -> None:
        self.mapper = mapper

    def process(self, record: Record) -> None:
        value = record.value
        self.context.forward(record._replace(value=None if value is None else self.mapper(value)))


def _join_side(
    store: str,
    kind: str,
    side: bytes,
    key_serde: Serde,
    serdes: dict[bytes, Serde],
    joiner: Callable[[Any, Any, Any], Any],
    filters: tuple[dict[str, Any], ...],
    versioned: bool,
    retentions: dict[bytes, int],
) -> Callable[[], Processor]:
    """The supplier of one side of a table-table join. Whether its input's filters send old
    values is read when the task is created: operators added after the join may ask for them
    (KTable._send_old_values). A filter of a versioned table drops nothing (TableFilter)."""
    return lambda: TableJoinSide(
        store, kind, side, key_serde, serdes, joiner,
        drops_unchanged=not versioned and any(f["old_values"] for f in filters),
        versioned=versioned, retentions=retentions,
    )  # fmt: skip


class KTable(Generic[K, V]):
    """A table: its updates come from node ``node``; ``store`` holds its current values
    (the table's own store for a table topic or an aggregation). ``KTable[K, V]``: generic in
    its key and value types, for type checkers and editors (``count()`` gives a
    ``KTable[K, int]``)."""

    def __init__(
        self,
        builder: StreamsBuilder,
        node: str,
        store: str,
        key_serde: Serde[K],
        value_serde: Serde[V],
    ) -> None:
        self._builder = builder
        self._node = node
        self._materialized = True  # the store holds this table's values (joinable)
        self._windows: Any = None  # the TimeWindows of a windowed aggregation's table
        # An aggregation's store: each value is its timestamp (8 bytes), then its bytes; the
        # latest results are in the aggregation's record cache (join.py reads through it).
        self._aggregated = False
        # For table-table joins (table_join.py): the tables this one is derived from, and the
        # settings of the filters between it and the last table that has values of its own
        # (a source, an aggregation, a join), which Kafka Streams' "send old values" changes.
        self._upstream: tuple[KTable, ...] = ()
        self._filters: tuple[dict[str, Any], ...] = ()
        self.store_name = store
        # Not Serde[K]: operators change them in place (map_values).
        self.key_serde: Serde = key_serde
        self.value_serde: Serde = value_serde

    def filter(self, predicate: Callable[[K, V], bool]) -> KTable[K, V]:
        """Keys whose value passes ``predicate(key, value)``; the others become tombstones."""
        return self._filter(predicate, negate=False)

    def filter_not(self, predicate: Callable[[K, V], bool]) -> KTable[K, V]:
        return self._filter(predicate, negate=True)

    def _filter(self, predicate: Callable[[Any, Any], bool], negate: bool) -> KTable:
        """The filter's settings: whether it sends old values, and then its store (named
        after its node), both set by _send_old_values when something downstream asks."""
        builder, key_serde, versioned = self._builder, self.key_serde, self._versioned()
        node = builder.new_name("KTABLE-FILTER")
        settings: dict[str, Any] = {"old_values": False, "store": None, "node": node}

        def supplier() -> Processor:
            return TableFilter(predicate, negate, settings, key_serde, versioned)

        return self._then(node, supplier, settings)

    def map_values(
        self, mapper: Callable[[V], VR], value_serde: Serde | None = None
    ) -> KTable[K, VR]:
        """``mapper(value)`` for each update; ``value_serde`` writes the new values (the
        table's when not given)."""
        table = self._then("KTABLE-MAPVALUES", lambda: TableMapValues(mapper))
        table.value_serde = value_serde or self.value_serde
        return table

    def suppress(self, suppressed: Suppressed) -> KTable[K, V]:
        """``Suppressed.until_window_closes()``: each window's final result only, forwarded
        once the window closes (a windowed aggregation's table only).
        ``Suppressed.until_time_limit(wait, buffer_config)``: each key's latest update,
        forwarded ``wait`` ms of stream time after the key's first buffered update (any
        table; suppress_time_limit.py). ``.with_name(name)`` names the suppression and its
        buffer store (``<name>-STATE-STORE``)."""
        from streamplatform.dsl.suppress import Suppressed, WindowCloseSuppression
        from streamplatform.dsl.suppress_time_limit import TimeLimitSuppression

        if not isinstance(suppressed, Suppressed):
            raise TypeError("suppress: takes a Suppressed (Suppressed.until_window_closes() or "
                            f"until_time_limit(...)), got {type(suppressed).__name__}")  # fmt: skip
        if suppressed.kind == "until_window_closes" and self._windows is None:
            raise ValueError("suppress(until_window_closes) needs the table of a windowed "
                             "aggregation (windowed_by(...).count() and the like)")  # fmt: skip
        builder = self._builder
        name = suppressed.name or builder.new_name("KTABLE-SUPPRESS")
        key_serde, value_serde = self.key_serde, self.value_serde
        store = builder.add_store(Stores.persistent_key_value_store(f"{name}-STATE-STORE"),
                                  key_serde, value_serde)  # fmt: skip
        supplier: Callable[[], Processor]
        if suppressed.kind == "until_time_limit":
            wait, config = suppressed.time_to_wait_ms, suppressed.buffer_config
            supplier = lambda: TimeLimitSuppression(name, store, key_serde, value_serde,  # noqa: E731
                                                    wait, config)  # fmt: skip
        else:
            grace = self._windows.grace_ms
            supplier = lambda: WindowCloseSuppression(store, key_serde, value_serde, grace)  # noqa: E731
        # Kafka Streams' suppression asks its table for old values (enableSendingOldValues).
        self._send_old_values()
        builder.add_node(ProcessorNode(name, supplier, (store,)), parents=[self._node])
        table = KTable(builder, name, self.store_name, key_serde, value_serde)
        table._materialized = False
        return table

    @overload
    def join(
        self,
        other: KTable[K, VO],
        joiner: Callable[..., VR],
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KTable[K, VR]: ...

    @overload
    def join(
        self,
        other: KTable[Any, VO],
        foreign_key_extractor: Callable[..., Any],
        joiner: Callable[..., VR],
        value_serde: Serde | None = None,
        name: str | None = None,
        store: KeyValueStoreSpec | None = None,
    ) -> KTable[K, VR]: ...

    def join(self, other: KTable[Any, Any], *args: Any, **kwargs: Any) -> KTable[Any, Any]:
        """Inner join with ``other`` on the key, ``join(other, joiner)``: ``joiner(value,
        other_value)`` for every key both tables have (table_join.py). ``value_serde`` writes
        the results (this table's when not given). Both tables must be co-partitioned (the
        same key, the same partition count); any table of the same builder can be joined,
        derived ones too.

        On a foreign key (Kafka Streams' KIP-213), ``join(other, foreign_key_extractor,
        joiner)``: ``foreign_key_extractor(value)`` (or ``(key, value)``) is the key of
        ``other`` each value of this table joins, ``joiner(value, other_value)`` the result,
        keyed by this table's key, for every key whose foreign key ``other`` has; the tables
        need not be co-partitioned (fk_join.py). ``store=`` keeps the results in that
        key-value store; ``name`` names its internal topics and stores."""
        from streamplatform.dsl.fk_join import foreign_key_join, join_arguments

        fk, joiner, value_serde, name, store = join_arguments("join", args, kwargs)
        if fk is not None:
            return foreign_key_join(self, other, fk, joiner, False, value_serde, name, store)
        return self._join(other, joiner, INNER, value_serde, name)

    @overload
    def left_join(
        self,
        other: KTable[K, VO],
        joiner: Callable[..., VR],
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KTable[K, VR]: ...

    @overload
    def left_join(
        self,
        other: KTable[Any, VO],
        foreign_key_extractor: Callable[..., Any],
        joiner: Callable[..., VR],
        value_serde: Serde | None = None,
        name: str | None = None,
        store: KeyValueStoreSpec | None = None,
    ) -> KTable[K, VR]: ...

    def left_join(self, other: KTable[Any, Any], *args: Any, **kwargs: Any) -> KTable[Any, Any]:
        """Like ``join``, for every key this table has: ``other_value`` None when ``other``
        has none (``left_join(other, joiner)``: on the key; ``left_join(other,
        foreign_key_extractor, joiner)``: on a foreign key, also for a None foreign key)."""
        from streamplatform.dsl.fk_join import foreign_key_join, join_arguments

        fk, joiner, value_serde, name, store = join_arguments("left_join", args, kwargs)
        if fk is not None:
            return foreign_key_join(self, other, fk, joiner, True, value_serde, name, store)
        return self._join(other, joiner, LEFT_JOIN, value_serde, name)

    def outer_join(
        self,
        other: KTable[K, VO],
        joiner: Callable[..., VR],
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KTable[K, VR]:
        """Like ``join``, for every key either table has (None for the side that has none)."""
        return self._join(other, joiner, OUTER, value_serde, name)

    def _join(
        self,
        other: KTable,
        joiner: Callable[..., Any],
        kind: str,
        value_serde: Serde | None,
        name: str | None,
    ) -> KTable:
        """A processor per side and a merge node, as Kafka Streams' KTableKTableJoinNode; the
        result is not materialized (Kafka Streams does not materialize it by default): its
        store is the join's own, which holds both sides, not the results."""
        if not isinstance(other, KTable):
            raise TypeError(f"join: a table joins a KTable, got {type(other).__name__}")
        if other._builder is not self._builder:
            raise ValueError("join: the other table belongs to another StreamsBuilder")
        if other is self or other._node == self._node:
            raise ValueError("join: a table cannot be joined with itself")
        if not callable(joiner):
            raise TypeError(
                "join: joiner must be callable: (left_value, right_value) or "
                "(key, left_value, right_value) -> value"
            )
        if kind in (LEFT_JOIN, OUTER):
            self._send_old_values()
        if kind == OUTER:
            other._send_old_values()
        builder = self._builder
        base = name or builder.new_name("KTABLE-MERGE")
        # It holds both sides' values: recorded by its key serde only.
        store = builder.add_store(Stores.persistent_key_value_store(f"{base}-STATE-STORE"),
                                  self.key_serde)  # fmt: skip
        key_serde = self.key_serde
        serdes = {LEFT: self.value_serde, RIGHT: other.value_serde}
        # A windowed side's store retention: the other side no longer finds its old windows.
        retentions: dict[bytes, int] = {}
        for side, table in ((LEFT, self), (RIGHT, other)):
            retention = table._window_retention()
            if retention is not None:
                retentions[side] = retention
        sides = []
        for side, parent, kind_name in ((LEFT, self, "JOINTHIS"), (RIGHT, other, "JOINOTHER")):
            supplier = _join_side(store, kind, side, key_serde, serdes, key_joiner(joiner),
                                  parent._filters, parent._versioned(), retentions)  # fmt: skip
            node = ProcessorNode(builder.new_name(f"KTABLE-{kind_name}"), supplier, (store,))
            builder.add_node(node, parents=[parent._node])
            sides.append(node.name)
        merge = ProcessorNode(base, PassThrough)
        builder.add_node(merge, parents=sides)
        table = KTable(builder, merge.name, store, key_serde, value_serde or self.value_serde)
        table._materialized = False
        table._upstream = (self, other)
        return table

    def group_by(
        self,
        selector: Callable[[K, V], tuple[KR, VR]],
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KGroupedTable[KR, VR]:
        """Group by ``selector(key, value) -> (new_key, new_value)``, for ``count``,
        ``reduce(adder, subtractor)`` or ``aggregate(initializer, adder, subtractor)``: each
        update of this table subtracts the key's previous pair from its group and adds the new
        one (grouped_table.py). ``key_serde``/``value_serde`` write the repartition topic (this
        table's when not given). A pair with a None key or value is in no group. ``name``
        names the grouping node and its store of selected pairs (``<name>-STATE-STORE``;
        generated when not given: docs/upgrades.md)."""
        from streamplatform.dsl.grouped_table import KGroupedTable

        if not callable(selector):
            raise TypeError("group_by: selector must be callable (key, value) -> (key, value)")
        self._refuse_versioned("group_by")
        self._send_old_values()
        return KGroupedTable(self, selector, key_serde or self.key_serde,
                             value_serde or self.value_serde, name)  # fmt: skip

    def to_stream(self) -> KStream[K, V]:
        """The table's updates as a stream (tombstones included)."""
        from streamplatform.dsl.kstream import KStream

        return KStream(self._builder, self._node, self.key_serde, self.value_serde)

    def _versioned(self) -> bool:
        """Kafka Streams' "versioned or versioned upstream" (InternalStreamsBuilder): a table
        read into a versioned store, or derived from one by filter / map_values. A join's
        result is not (KTableKTableJoinNode has no versioned output; its updates are all
        latest), nor a suppression's (Kafka Streams refuses to suppress a versioned table)."""
        if self._upstream:
            return all(table._versioned() for table in self._upstream)
        spec = self._builder._stores.get(self.store_name)
        return self._materialized and getattr(spec, "kind", None) == "versioned"

    def _window_retention(self) -> int | None:
        """The retention of the window store a table-table join reads this table through: a
        time or sliding windowed aggregation's (Kafka Streams' default, size + grace; 2 *
        time difference + grace), also through filter / map_values; None for other tables
        (session windows and joins of windowed tables are not covered: their lookups are
        kept forever)."""
        from streamplatform.dsl.windows import SlidingWindows, TimeWindows

        if isinstance(self._windows, (TimeWindows, SlidingWindows)):
            return int(self._windows.retention_ms)
        if len(self._upstream) == 1 and not self._aggregated:
            return self._upstream[0]._window_retention()
        return None

    def _refuse_versioned(self, operation: str) -> None:
        """A versioned table (or one derived from it) is refused: Kafka Streams drops its
        out-of-order updates in groupings (KIP-914: KTableRepartitionMap), and our grouping
        does not yet tell them apart."""
        spec = self._builder._stores.get(self.store_name)
        if getattr(spec, "kind", None) == "versioned":
            raise ValueError(
                f"{operation}: the table is versioned ({self.store_name!r}); group_by "
                "takes tables with a plain key-value store"
            )

    def _send_old_values(self) -> None:
        """Kafka Streams' ``enableSendingOldValues``, asked of a table by a left or outer
        join, a join whose result needs them, and a grouping: a filter that sends old values
        forwards no update that leaves a key without a value before and after (a tombstone
        for a key that had none, or a value it filters out); the joins drop those updates
        from such a filter (table_join.py)."""
        for settings in self._filters:
            settings["old_values"] = True
            if settings["store"] is None:
                # It tells which keys have a value (TableFilter); declared on the filter's
                # node so that its tasks get it (read when a task is created).
                store = self._builder.add_store(
                    Stores.persistent_key_value_store(f"{settings['node']}-STATE-STORE"),
                    self.key_serde,
                )
                node = self._builder._nodes[settings["node"]]
                assert isinstance(node, ProcessorNode)
                node.stores = (*node.stores, store)
                settings["store"] = store
        for table in self._upstream:
            table._send_old_values()

    def _then(
        self,
        kind: str,
        supplier: Callable[[], Processor],
        filter_settings: dict[str, Any] | None = None,
    ) -> KTable:
        """A derived table, by a processor of ``kind`` (a filter: its node's name, already
        generated, and its settings)."""
        builder = self._builder
        name = kind if filter_settings is not None else builder.new_name(kind)
        node = ProcessorNode(name, supplier)
        builder.add_node(node, parents=[self._node])
        # A derived table has no store of its own (Kafka Streams materializes one only on
        # demand): it cannot be joined (KStream.join refuses it).
        table = KTable(builder, node.name, self.store_name, self.key_serde, self.value_serde)
        table._materialized = False
        table._upstream = (self,)
        table._filters = self._filters + ((filter_settings,) if filter_settings else ())
        return table
