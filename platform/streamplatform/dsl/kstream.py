"""KStream and KTable: the DSL's operators, each adding nodes to the builder's graph.

A stream remembers its current serdes (``to`` defaults to them) and whether an operator
changed its key since it was last partitioned by key; key-based operators that need records of
one key in one task (deduplication by key, joins) then insert a repartition topic first, as
Kafka Streams does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from streamplatform.dsl import processor as ops
from streamplatform.dsl.dedup import DeduplicationProcessor
from streamplatform.dsl.global_table import GlobalKTable, StreamGlobalTableJoin, global_joiner
from streamplatform.dsl.graph import (
    REPARTITION_SUFFIX,
    ProcessorNode,
    RecordContext,
    SinkNode,
    SourceNode,
    TopicNameExtractor,
    as_topic_extractor,
)
from streamplatform.dsl.join import GraceBuffer, StreamTableJoin
from streamplatform.dsl.ktable import KTable
from streamplatform.dsl.printing import Printed, PrintProcessor, key_joiner, takes_key
from streamplatform.dsl.stream_join import JoinSpec, JoinStores, JoinWindows, StreamStreamJoinSide
from streamplatform.serdes import Serde
from streamplatform.state import Stores
from streamplatform.state.stores import StoreSpec, VersionedStoreSpec, duration_ms

if TYPE_CHECKING:
    from streamplatform.dsl.builder import StreamsBuilder
    from streamplatform.dsl.grouped import KGroupedStream

__all__ = ["KStream", "KTable"]

# The stream's key and value types (for type checkers and editors only; nothing is checked at
# run time), and those an operator makes: KR, VR its new key and value, VO the other side's value.
K = TypeVar("K")
V = TypeVar("V")
KR = TypeVar("KR")
VR = TypeVar("VR")
VO = TypeVar("VO")


def _interval(value: timedelta | int) -> int:
    millis = duration_ms(value, "interval")
    if millis < 0:
        raise ValueError(f"interval must not be negative, got {value!r}")
    return millis


class KStream(Generic[K, V]):
    """A record stream. Operators return a new KStream; the graph grows in the builder.

    ``KStream[K, V]``: generic in its key and value types, for type checkers and editors
    (``builder.stream(topic, Serdes.string(), Serdes.json())`` is a ``KStream[str, Any]``;
    ``map_values(mapper)`` a ``KStream[K, <what mapper returns>]``)."""

    def __init__(
        self,
        builder: StreamsBuilder,
        node: str,
        key_serde: Serde[K],
        value_serde: Serde[V],
        key_changed: bool = False,
    ) -> None:
        self._builder = builder
        self._node = node
        # Not Serde[K]: operators change them in place (group_by, a join's merged stream).
        self.key_serde: Serde = key_serde
        self.value_serde: Serde = value_serde
        self._key_changed = key_changed

    def _then(
        self,
        kind: str,
        supplier: Callable[[], ops.Processor],
        *,
        stores: tuple[str, ...] = (),
        key_changed: bool | None = None,
        name: str | None = None,
    ) -> KStream:
        node = ProcessorNode(name or self._builder.new_name(kind), supplier, stores)
        self._builder.add_node(node, parents=[self._node])
        changed = self._key_changed if key_changed is None else key_changed
        return KStream(self._builder, node.name, self.key_serde, self.value_serde, changed)

    # Stateless operators -------------------------------------------------------------------

    def filter(self, predicate: Callable[[K, V], bool]) -> KStream[K, V]:
        return self._then("FILTER", lambda: ops.Filter(predicate))

    def filter_not(self, predicate: Callable[[K, V], bool]) -> KStream[K, V]:
        return self._then("FILTER", lambda: ops.Filter(predicate, negate=True))

    @overload
    def map_values(self, mapper: Callable[[V], VR]) -> KStream[K, VR]: ...
    @overload
    def map_values(self, mapper: Callable[[K, V], VR]) -> KStream[K, VR]: ...

    def map_values(self, mapper: Callable[..., Any]) -> KStream:
        """``mapper(value)``, or ``mapper(key, value)`` (Kafka Streams' ValueMapperWithKey)
        when it takes two arguments; the key stays."""
        if takes_key(mapper, 1):
            return self._then("MAPVALUES", lambda: ops.MapValuesWithKey(mapper))
        return self._then("MAPVALUES", lambda: ops.MapValues(mapper))

    def map(self, mapper: Callable[[K, V], tuple[KR, VR]]) -> KStream[KR, VR]:
        return self._then("MAP", lambda: ops.Map(mapper), key_changed=True)

    def select_key(self, selector: Callable[[K, V], KR]) -> KStream[KR, V]:
        return self._then("KEY-SELECT", lambda: ops.SelectKey(selector), key_changed=True)

    def flat_map(self, mapper: Callable[[K, V], Iterable[tuple[KR, VR]]]) -> KStream[KR, VR]:
        """``mapper(key, value)`` returns any number of ``(key, value)`` pairs, each a record
        with the input's timestamp; key-based operators after it repartition first."""
        return self._then("FLATMAP", lambda: ops.FlatMap(mapper), key_changed=True)

    @overload
    def flat_map_values(self, mapper: Callable[[V], Iterable[VR]]) -> KStream[K, VR]: ...
    @overload
    def flat_map_values(self, mapper: Callable[[K, V], Iterable[VR]]) -> KStream[K, VR]: ...

    def flat_map_values(self, mapper: Callable[..., Iterable[Any]]) -> KStream:
        """``mapper(value)``, or ``mapper(key, value)``, returns any number of values."""
        with_key = takes_key(mapper, 1)
        return self._then("FLATMAPVALUES", lambda: ops.FlatMapValues(mapper, with_key))

    def peek(self, action: Callable[[K, V], Any]) -> KStream[K, V]:
        return self._then("PEEK", lambda: ops.Peek(action))

    def foreach(self, action: Callable[[K, V], Any]) -> None:
        """``action(key, value)`` for each record: a terminal operation (nothing follows).
        On Spark it runs where the task runs, and again for a replayed batch."""
        self._then("FOREACH", lambda: ops.Foreach(action))

    def print(self, printed: Printed | None = None) -> None:
        """Each record as a line ``[label]: key, value`` (``Printed``: standard output by
        default, or a file; printing.py): a terminal operation."""
        printed = printed or Printed.to_sys_out()
        name = self._builder.new_name("PRINTER")
        self._then("PRINTER", lambda: PrintProcessor(printed, name), name=name)

    def to_table(self, name: str | None = None, store: StoreSpec | None = None) -> KTable[K, V]:
        """The stream as a table (Kafka Streams' ``toTable``): each record an update of its
        key's value, a None value a tombstone, a record without a key dropped. Its store is
        ``store`` (a key-value or versioned store) or ``<name>-STATE-STORE``; a stream whose
        key changed is repartitioned first, as in Kafka Streams."""
        from streamplatform.dsl.join import TableSource

        base = name or self._builder.new_name("TOTABLE")
        keyed = self._repartition(base) if self._key_changed else self
        spec = store or Stores.persistent_key_value_store(f"{base}-STATE-STORE")
        key_serde, value_serde = self.key_serde, self.value_serde
        if spec.key_serde is None and spec.value_serde is None:  # typed for get_state_store
            spec = dataclasses.replace(spec, key_serde=key_serde, value_serde=value_serde)
        store_name = self._builder.add_store(spec, key_serde, value_serde)
        node = keyed._then("TOTABLE", lambda: TableSource(store_name, key_serde, value_serde),
                           stores=(store_name,), name=base)  # fmt: skip
        return KTable(self._builder, node._node, store_name, key_serde, value_serde)

    def process(
        self, processor_supplier: Callable[[], ops.Processor], *store_names: str
    ) -> KStream:
        """A user processor; ``store_names`` must be stores added with ``add_state_store``.
        It may change keys, so key-based operators after it repartition first."""
        for store in store_names:
            self._builder.require_store(store)
        return self._then("PROCESSOR", processor_supplier, stores=store_names, key_changed=True)

    def process_values(
        self, processor_supplier: Callable[[], ops.Processor], *store_names: str
    ) -> KStream[K, Any]:
        """A user processor that keeps each record's key (Kafka Streams' fixed-key processor,
        ``processValues``): key-based operators after it need no repartition. It must forward
        records with the key it was given (Kafka Streams' API cannot do otherwise; this one
        does not check)."""
        for store in store_names:
            self._builder.require_store(store)
        return self._then("PROCESSVALUES", processor_supplier, stores=store_names)

    # Deduplication (KIP-655) ------------------------------------------------------------------

    def deduplicate_by_key(
        self, interval: timedelta | int, name: str | None = None
    ) -> KStream[K, V]:
        """Drop records whose key was seen within ``interval``; None keys always pass."""
        return self._deduplicate(name, interval, lambda key, value: key, repartition_by_id=False)

    def deduplicate_by_key_value(
        self,
        id_selector: Callable[[K, V], Any],
        interval: timedelta | int,
        name: str | None = None,
    ) -> KStream[K, V]:
        """Drop records whose (key, id) was seen within ``interval``; None key or id pass."""
        return self._deduplicate(name, interval, id_selector, repartition_by_id=False, per_key=True)

    def deduplicate(
        self,
        id_selector: Callable[[K, V], Any],
        interval: timedelta | int,
        name: str | None = None,
    ) -> KStream[K, V]:
        """Drop records whose id was seen within ``interval`` across all keys; None ids pass.
        Records are first repartitioned by id, so one task sees every record of an id."""
        return self._deduplicate(name, interval, id_selector, repartition_by_id=True)

    def _deduplicate(
        self,
        name: str | None,
        interval: timedelta | int,
        id_of: Callable[[Any, Any], Any],
        repartition_by_id: bool,
        per_key: bool = False,
    ) -> KStream:
        interval_ms = _interval(interval)
        base = name or self._builder.new_name("DEDUPLICATE")
        if repartition_by_id:
            stream = self._repartition(base, partition_by=id_of)
        else:
            stream = self._repartition(base) if self._key_changed else self
        store = self._builder.add_store(Stores.persistent_key_value_store(f"{base}-store"))
        return stream._then(
            "DEDUPLICATE",
            lambda: DeduplicationProcessor(store, interval_ms, id_of, per_key),
            stores=(store,),
            name=base,
        )

    # Merging, branching, repartitioning ----------------------------------------------------------

    def merge(self, other: KStream[K, V]) -> KStream[K, V]:
        """The records of this stream and ``other``, as each arrives (Kafka Streams' merge:
        no order between the two beyond what the task reads). The serdes are this stream's."""
        if other._builder is not self._builder:
            raise ValueError("merge: the other stream belongs to another StreamsBuilder")
        node = ProcessorNode(self._builder.new_name("MERGE"), ops.PassThrough)
        self._builder.add_node(node, parents=[self._node, other._node])
        changed = self._key_changed or other._key_changed
        return KStream(self._builder, node.name, self.key_serde, self.value_serde, changed)

    def split(self, prefix: str = "") -> BranchedKStream[K, V]:
        """Branches of this stream: ``split().branch(predicate, name)...default_branch()``
        returns ``{prefix + name: KStream}``; a record goes to the first branch whose
        predicate accepts it (else to the default branch, else nowhere)."""
        return BranchedKStream(self, prefix)

    def repartition(self, name: str | None = None) -> KStream[K, V]:
        """Through a repartition topic by the current key (``<application.id>-<name>-
        repartition``; on Spark a shuffle inside the micro-batch), as Kafka Streams'
        ``repartition()``."""
        return self._repartition(name or self._builder.new_name("REPARTITION"))

    # Grouping and aggregation --------------------------------------------------------------------

    def group_by_key(self) -> KGroupedStream[K, V]:
        """Group by the current key, for ``count``, ``reduce``, ``aggregate`` or
        ``windowed_by``; repartitioned first when an operator changed the key."""
        from streamplatform.dsl.grouped import KGroupedStream

        return KGroupedStream(self)

    def group_by(
        self,
        selector: Callable[[K, V], KR],
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
    ) -> KGroupedStream[KR, V]:
        """Group by ``selector(key, value)``: the records are re-keyed and repartitioned, as
        Kafka Streams does (``key_serde``/``value_serde`` write the repartition topic; the
        stream's when not given). A None key is dropped by the aggregation, and counted."""
        from streamplatform.dsl.grouped import KGroupedStream

        keyed = self._then("KEY-SELECT", lambda: ops.SelectKey(selector), key_changed=True)
        keyed.key_serde = key_serde or self.key_serde
        keyed.value_serde = value_serde or self.value_serde
        return KGroupedStream(keyed)

    # Joins (KIP-889 when the table is versioned) -----------------------------------------------
    # Typed by what is joined: a table (``joiner`` takes 2 or 3 arguments: Callable[..., VR]), a
    # stream (with JoinWindows) or a global table (``join(global_table, key_selector, joiner)``).

    @overload
    def join(
        self,
        other: KTable[K, VO],
        joiner: Callable[..., VR],
        windows: None = None,
        name: str | None = None,
        *,
        grace: timedelta | int | None = None,
    ) -> KStream[K, VR]: ...
    @overload
    def join(
        self,
        other: KStream[K, VO],
        joiner: Callable[..., VR],
        windows: JoinWindows,
        name: str | None = None,
        *,
        grace: None = None,
    ) -> KStream[K, VR]: ...
    @overload
    def join(
        self,
        other: GlobalKTable[Any, VO],
        joiner: Callable[[K, V], Any],
        windows: Callable[..., VR],
        name: str | None = None,
        *,
        grace: None = None,
    ) -> KStream[K, VR]: ...

    def join(
        self,
        other: KTable | KStream | GlobalKTable,
        joiner: Callable[..., Any],
        windows: JoinWindows | Callable[..., Any] | None = None,
        name: str | None = None,
        *,
        grace: timedelta | int | None = None,
    ) -> KStream:
        """Inner join on the key; ``joiner(this_value, other_value)``. With a table: each
        record joins the table's value (the version valid at its time for a versioned
        table). With a stream: within ``windows`` (``JoinWindows``), every pair of records of
        one key close enough in time. ``name`` names the join's nodes, stores and
        repartition topics (Kafka Streams' ``Joined.as`` / ``StreamJoined.withName``; with a
        stream: ``<name>-this-join-store``, ``<name>-other-join-store``); generated when not
        given (docs/upgrades.md). ``grace`` (a versioned table only; Kafka Streams'
        ``Joined.withGracePeriod``, KIP-923): each record waits until stream time is
        ``grace`` past it, then joins the version valid at its time; the records wait in the
        store ``<name>-Buffer``.

        With a ``GlobalKTable`` (Kafka Streams' ``join(globalTable, keySelector, joiner)``):
        ``join(global_table, key_selector, joiner)``; each record joins the table's value at
        ``key_selector(key, value)``, keeping its key (dsl/global_table.py)."""
        if isinstance(other, GlobalKTable):
            return self._join_global(other, joiner, windows, left=False, name=name)
        if isinstance(other, KStream):
            if grace is not None:
                raise ValueError("join: grace= is for a stream-table join (a versioned table); a "
                                 "stream-stream join takes its grace in JoinWindows")  # fmt: skip
            return self._join_stream(other, joiner, windows, left_outer=False, right_outer=False,
                                     name=name)  # fmt: skip
        return self._join(other, joiner, left=False, name=name, grace=grace)

    @overload
    def left_join(
        self,
        other: KTable[K, VO],
        joiner: Callable[..., VR],
        windows: None = None,
        name: str | None = None,
        *,
        grace: timedelta | int | None = None,
    ) -> KStream[K, VR]: ...
    @overload
    def left_join(
        self,
        other: KStream[K, VO],
        joiner: Callable[..., VR],
        windows: JoinWindows,
        name: str | None = None,
        *,
        grace: None = None,
    ) -> KStream[K, VR]: ...
    @overload
    def left_join(
        self,
        other: GlobalKTable[Any, VO],
        joiner: Callable[[K, V], Any],
        windows: Callable[..., VR],
        name: str | None = None,
        *,
        grace: None = None,
    ) -> KStream[K, VR]: ...

    def left_join(
        self,
        other: KTable | KStream | GlobalKTable,
        joiner: Callable[..., Any],
        windows: JoinWindows | Callable[..., Any] | None = None,
        name: str | None = None,
        *,
        grace: timedelta | int | None = None,
    ) -> KStream:
        """Like ``join``, but a record of this stream with no match joins None (with a stream:
        once its window has closed with no partner; its third store is
        ``<name>-outer-shared-join-store``). ``grace``: as for ``join``. With a
        ``GlobalKTable``: ``left_join(global_table, key_selector, joiner)``, a record with no
        match (or a None mapped key) joins None."""
        if isinstance(other, GlobalKTable):
            return self._join_global(other, joiner, windows, left=True, name=name)
        if isinstance(other, KStream):
            if grace is not None:
                raise ValueError("join: grace= is for a stream-table join (a versioned table); a "
                                 "stream-stream join takes its grace in JoinWindows")  # fmt: skip
            return self._join_stream(other, joiner, windows, left_outer=True, right_outer=False,
                                     name=name)  # fmt: skip
        return self._join(other, joiner, left=True, name=name, grace=grace)

    def outer_join(
        self,
        other: KStream[K, VO],
        joiner: Callable[..., VR],
        windows: JoinWindows,
        name: str | None = None,
    ) -> KStream[K, VR]:
        """Like ``join`` with a stream, but a record of either side with no partner joins None
        once its window has closed (``joiner(value, None)`` or ``joiner(None, value)``)."""
        if not isinstance(other, KStream):
            raise TypeError(f"outer_join takes a KStream, got {type(other).__name__}")
        return self._join_stream(other, joiner, windows, left_outer=True, right_outer=True,
                                 name=name)  # fmt: skip

    def _join_global(
        self,
        table: GlobalKTable,
        key_selector: Callable[[Any, Any], Any],
        joiner: Any,
        left: bool,
        name: str | None,
    ) -> KStream:
        """The join processor reads the task's copy of the table's store: no repartition,
        whatever happened to the key (the table is whole in every task)."""
        if table._builder is not self._builder:
            raise ValueError("join: the global table belongs to another StreamsBuilder")
        if not callable(key_selector) or not callable(joiner):
            raise TypeError("a stream-global table join takes (global_table, key_selector, "
                            "joiner): key_selector(key, value) -> the table's key")  # fmt: skip
        spec, with_keys = table.spec, global_joiner(joiner)
        return self._then(
            "LEFTJOIN" if left else "JOIN",
            lambda: StreamGlobalTableJoin(spec, key_selector, with_keys, left),
            stores=(spec.store_name,),
            name=name,
        )

    def _join_stream(
        self,
        other: KStream,
        joiner: Callable[..., Any],
        windows: JoinWindows | Callable[..., Any] | None,
        left_outer: bool,
        right_outer: bool,
        name: str | None = None,
    ) -> KStream:
        """Each side through its join processor (repartitioned first when its key changed),
        the two merged: the joined stream, with this stream's serdes. Named, the sides are
        ``<name>-this-join`` and ``<name>-other-join``, as Kafka Streams names their stores."""
        if other._builder is not self._builder:
            raise ValueError("join: the other stream belongs to another StreamsBuilder")
        if not isinstance(windows, JoinWindows):
            raise TypeError("a stream-stream join needs JoinWindows "
                            "(JoinWindows.of_time_difference_and_grace(...))")  # fmt: skip
        builder = self._builder
        kind = "OUTER" if right_outer else "LEFT" if left_outer else ""
        this_name = f"{name}-this-join" if name else builder.new_name(f"{kind}JOINTHIS")
        other_name = f"{name}-other-join" if name else builder.new_name(f"{kind}JOINOTHER")
        left = self._repartition(this_name) if self._key_changed else self
        right = other._repartition(other_name) if other._key_changed else other
        key_serde = self.key_serde
        shared = None
        if left_outer:
            shared = f"{name}-outer-shared-join" if name else builder.new_name("OUTERSHARED")
        stores = JoinStores(
            builder.add_store(Stores.persistent_key_value_store(f"{this_name}-store"),
                              key_serde, self.value_serde),
            builder.add_store(Stores.persistent_key_value_store(f"{other_name}-store"),
                              key_serde, other.value_serde),
            builder.add_store(Stores.persistent_key_value_store(f"{shared}-store"), key_serde)
            if shared else None,
        )  # fmt: skip
        spec = JoinSpec(stores, windows, key_joiner(joiner), self.key_serde, self.value_serde,
                        other.value_serde, left_outer, right_outer)  # fmt: skip
        names = stores.names()
        this_side = left._then("JOIN", lambda: StreamStreamJoinSide(spec, left=True),
                               stores=names, name=this_name)  # fmt: skip
        other_side = right._then("JOIN", lambda: StreamStreamJoinSide(spec, left=False),
                                 stores=names, name=other_name)  # fmt: skip
        merged = this_side.merge(other_side)
        merged.key_serde, merged.value_serde = self.key_serde, self.value_serde
        merged._key_changed = False
        return merged

    def _join(
        self,
        table: KTable,
        joiner: Callable[..., Any],
        left: bool,
        name: str | None,
        grace: timedelta | int | None = None,
    ) -> KStream:
        if table._builder is not self._builder:
            raise ValueError("join: the table belongs to another StreamsBuilder")
        if not table._materialized:
            raise ValueError(
                "join: this table is derived (filter / map_values) and has no store of its "
                "own; join the table it comes from and apply the operator to the stream"
            )
        if getattr(table.key_serde, "inner", None) is not None:
            raise ValueError("join: a windowed table's keys are (key, window); a stream joins "
                             "a table of plain keys")  # fmt: skip
        grace_ms = None
        if grace is not None:  # refused as Kafka Streams refuses it when building
            grace_ms = duration_ms(grace, "grace")
            if grace_ms < 0:
                raise ValueError(f"join: grace must not be negative, got {grace!r}")
            spec = self._builder._stores.get(table.store_name)
            if not isinstance(spec, VersionedStoreSpec):
                raise ValueError(
                    f"join: a grace period needs a versioned table; the table's store "
                    f"{table.store_name!r} is not versioned (Stores."
                    "persistent_versioned_key_value_store). Kafka Streams: KTable must be "
                    "versioned to use a grace period in a stream table join."
                )
            if grace_ms > spec.history_retention_ms:
                raise ValueError(
                    f"join: the grace period ({grace_ms} ms) is longer than the history "
                    f"retention of the table's store {table.store_name!r} "
                    f"({spec.history_retention_ms} ms). Kafka Streams: History retention must "
                    "be at least grace period."
                )
        if self._key_changed:
            stream = self._repartition(name or self._builder.new_name("JOIN"))
        else:
            stream = self
        kind = "LEFTJOIN" if left else "JOIN"
        stores: tuple[str, ...] = (table.store_name,)
        buffer = None
        if grace_ms is not None:
            # Named after the join, as Kafka Streams' "<name>-Buffer" (KIP-1111: a generated
            # name changes when an operator is added upstream).
            name = name or self._builder.new_name(kind)
            buffer_store = self._builder.add_store(
                Stores.persistent_key_value_store(f"{name}-Buffer"), stream.key_serde,
                stream.value_serde,
            )  # fmt: skip
            buffer = GraceBuffer(buffer_store, grace_ms, stream.key_serde, stream.value_serde)
            stores += (buffer_store,)
        aggregated = table._aggregated
        with_key = key_joiner(joiner)
        return stream._then(
            kind,
            lambda: StreamTableJoin(
                table.store_name, table.key_serde, table.value_serde, with_key, left, aggregated,
                buffer,
            ),
            stores=stores,
            name=name,
        )  # fmt: skip

    # Sinks and repartitioning --------------------------------------------------------------------

    def to(
        self,
        topic: str | TopicNameExtractor | Callable[[K, V, RecordContext], str],
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
    ) -> None:
        """Write the stream to ``topic``; serdes default to the stream's current ones.

        ``topic`` may be a topic name extractor instead (Kafka Streams' ``to(TopicNameExtractor,
        Produced)``): ``extractor(key, value, record_context) -> topic`` (or an object with
        ``extract``) chooses each record's topic, written with these serdes. The topics it
        returns must exist; an extractor that raises goes to the processing exception handler."""
        builder = self._builder
        extractor = None
        if not isinstance(topic, str):
            extractor = as_topic_extractor(topic)
            label = getattr(extractor, "__qualname__", type(extractor).__name__)
            topic = f"<topic extractor {label}>"  # shown by describe(); no topic of this name
        sink = SinkNode(
            builder.new_name("SINK"),
            topic,
            key_serde or self.key_serde,
            value_serde or self.value_serde,
            topic_extractor=extractor,
        )
        builder.add_node(sink, parents=[self._node])

    def _repartition(
        self, base: str, partition_by: Callable[[Any, Any], Any] | None = None
    ) -> KStream:
        topic = base + REPARTITION_SUFFIX
        sink = SinkNode(
            f"{base}-repartition-sink",
            topic,
            self.key_serde,
            self.value_serde,
            internal=True,
            partition_by=partition_by,
        )
        self._builder.add_node(sink, parents=[self._node])
        source = SourceNode(
            f"{base}-repartition-source", topic, self.key_serde, self.value_serde, internal=True
        )
        self._builder.add_node(source, parents=[])
        return KStream(self._builder, source.name, self.key_serde, self.value_serde)


class BranchedKStream(Generic[K, V]):
    """``KStream.split()``: branches added in order; ``default_branch``/``no_default_branch``
    end it and return the branches by name (Kafka Streams' names: the prefix, then the
    branch's name or its position, from 1; the default branch's position is 0)."""

    def __init__(self, stream: KStream[K, V], prefix: str) -> None:
        self._stream = stream
        self._prefix = prefix
        self._predicates: list[Callable[[Any, Any], bool]] = []
        self._names: list[str] = []
        self._children: list[str] = []  # the branches' nodes, in the predicates' order
        predicates, children = self._predicates, self._children
        self._node = ProcessorNode(stream._builder.new_name("BRANCH"),
                                   lambda: ops.Branch(predicates, children))  # fmt: skip
        stream._builder.add_node(self._node, parents=[stream._node])

    def branch(
        self, predicate: Callable[[K, V], bool], name: str | None = None
    ) -> BranchedKStream[K, V]:
        self._predicates.append(predicate)
        self._names.append(self._prefix + (name or str(len(self._predicates))))
        return self

    def default_branch(self, name: str | None = None) -> dict[str, KStream[K, V]]:
        self._predicates.append(lambda key, value: True)
        self._names.append(self._prefix + (name or "0"))
        return self._branches()

    def no_default_branch(self) -> dict[str, KStream[K, V]]:
        return self._branches()

    def _branches(self) -> dict[str, KStream[K, V]]:
        stream, builder = self._stream, self._stream._builder
        branches: dict[str, KStream[K, V]] = {}
        for name in self._names:
            child = ProcessorNode(builder.new_name("BRANCH-CHILD"), ops.PassThrough)
            builder.add_node(child, parents=[self._node.name])
            self._children.append(child.name)
            branches[name] = KStream(builder, child.name, stream.key_serde, stream.value_serde,
                                     stream._key_changed)  # fmt: skip
        return branches
