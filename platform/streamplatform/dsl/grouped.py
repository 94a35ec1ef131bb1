"""Grouped streams and their aggregations, as Kafka Streams names them.

``stream.group_by_key()`` (or ``group_by(selector)``, which re-keys and so repartitions) gives
a ``KGroupedStream``; ``count()``, ``reduce(reducer)`` and ``aggregate(initializer,
aggregator)`` give a ``KTable`` of the results, ``windowed_by(TimeWindows...)`` or
``windowed_by(SlidingWindows...)`` a ``TimeWindowedKStream`` and ``windowed_by(SessionWindows
...)`` a ``SessionWindowedKStream``, whose results are keyed by ``Windowed(key, window)``. The
processors are in aggregate.py, sliding_aggregate.py and session_aggregate.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from streamplatform.dsl.aggregate import StreamAggregate, count_one, zero
from streamplatform.dsl.ktable import KTable
from streamplatform.dsl.processor import Processor
from streamplatform.dsl.session_aggregate import SessionWindowAggregate
from streamplatform.dsl.sliding_aggregate import SlidingWindowAggregate
from streamplatform.dsl.window_aggregate import WindowedAggregate
from streamplatform.dsl.windows import (
    EmitStrategy,
    SessionWindowedSerde,
    SessionWindows,
    SlidingWindows,
    TimeWindowedSerde,
    TimeWindows,
    Windowed,
)
from streamplatform.serdes import Serde, Serdes
from streamplatform.state import Stores

if TYPE_CHECKING:
    from streamplatform.dsl.cogroup import CogroupedKStream
    from streamplatform.dsl.kstream import KStream

# For type checkers and editors only: the grouped stream's key and value types, the results'
# key type (the key, or ``Windowed[key]`` per window) and an aggregate's type (what the
# aggregator returns: ``initializer`` is Any, so ``aggregate(dict, ...)`` is no type error).
K = TypeVar("K")
V = TypeVar("V")
KT = TypeVar("KT")
VA = TypeVar("VA")


class _Aggregations(Generic[K, V, KT]):
    """count, reduce and aggregate, for a grouped stream over all time or per window."""

    _stream: KStream[K, V]
    _windows: Any = None  # per window: the windows; over all time: None

    def count(self, name: str | None = None) -> KTable[KT, int]:
        """Records per key (per key and window). A None value is not counted over all time,
        and is in a window, as in Kafka Streams."""
        return self._aggregate("COUNT", name, zero, count_one, Serdes.long())

    def reduce(self, reducer: Callable[[V, V], V], name: str | None = None) -> KTable[KT, V]:
        """``reducer(aggregate, value)``; a key's first value is its first result. The
        results keep the stream's value serde."""
        return self._aggregate("REDUCE", name, None, lambda k, v, agg: reducer(agg, v),
                               self._stream.value_serde)  # fmt: skip

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[K, V, VA], VA],
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KTable[KT, VA]:
        """``aggregator(key, value, aggregate)``, starting from ``initializer()`` for each key;
        ``value_serde`` writes the results (JSON when not given)."""
        return self._aggregate("AGGREGATE", name, initializer, aggregator,
                               value_serde or Serdes.json())  # fmt: skip

    def _aggregate(
        self,
        kind: str,
        name: str | None,
        initializer: Callable[[], Any] | None,
        aggregator: Callable[[Any, Any, Any], Any],
        result_serde: Serde,
    ) -> KTable:
        """Add the aggregation's node after the stream (repartitioned first when its key
        changed), with its store: a KTable of its results."""
        stream = self._stream
        builder = stream._builder
        base = name or builder.new_name(kind)
        keyed = stream._repartition(base) if stream._key_changed else stream
        # Recorded as the results' key serde: a windowed one names the window's size too.
        store = builder.add_store(Stores.persistent_key_value_store(f"{base}-STATE-STORE"),
                                  self._table_key_serde(), result_serde)  # fmt: skip
        args = (store, stream.key_serde, result_serde, initializer, aggregator)
        node = keyed._then(kind, lambda: self._processor(args), stores=(store,), name=base)
        table = KTable(builder, node._node, store, self._table_key_serde(), result_serde)
        table._windows = self._windows
        table._aggregated = True
        return table

    def _processor(self, args: tuple) -> Processor:
        """The aggregation's processor, from (store, key serde, result serde, initializer,
        aggregator)."""
        raise NotImplementedError

    def _table_key_serde(self) -> Serde:
        raise NotImplementedError


class KGroupedStream(_Aggregations[K, V, K]):
    """A stream whose records are grouped by key (repartitioned first when the key changed).
    ``KGroupedStream[K, V]``: generic in its key and value types, for type checkers and
    editors (``count()`` gives a ``KTable[K, int]``)."""

    def __init__(self, stream: KStream[K, V]) -> None:
        self._stream = stream

    @overload
    def windowed_by(self, windows: TimeWindows | SlidingWindows) -> TimeWindowedKStream[K, V]: ...
    @overload
    def windowed_by(self, windows: SessionWindows) -> SessionWindowedKStream[K, V]: ...

    def windowed_by(
        self, windows: TimeWindows | SlidingWindows | SessionWindows
    ) -> TimeWindowedKStream | SessionWindowedKStream:
        """Aggregate per time window (tumbling or hopping), per sliding window or per
        session."""
        if isinstance(windows, SessionWindows):
            return SessionWindowedKStream(self._stream, windows)
        if not isinstance(windows, TimeWindows | SlidingWindows):
            raise TypeError("windowed_by takes TimeWindows, SlidingWindows or SessionWindows, "
                            f"got {type(windows).__name__}")  # fmt: skip
        return TimeWindowedKStream(self._stream, windows)

    def cogroup(self, aggregator: Callable[[K, V, VA], VA]) -> CogroupedKStream[K, VA]:
        """This grouped stream's records in an aggregate shared with other grouped streams
        (KIP-150): ``.cogroup(other_grouped, its_aggregator)`` adds one, ``.aggregate(...)``
        or ``.windowed_by(...).aggregate(...)`` ends it (cogroup.py)."""
        from streamplatform.dsl.cogroup import CogroupedKStream

        return CogroupedKStream([(self._stream, aggregator)])

    def _processor(self, args: tuple) -> Processor:
        return StreamAggregate(*args)

    def _table_key_serde(self) -> Serde:
        return self._stream.key_serde


class TimeWindowedKStream(_Aggregations[K, V, Windowed[K]]):
    """A grouped stream aggregated per time window or sliding window (Kafka Streams'
    ``TimeWindowedKStream`` too, for both). A None value is counted per time window, and
    dropped (and counted in ``dropped_records``) per sliding window, as in Kafka Streams.
    ``TimeWindowedKStream[K, V]``: its results are keyed by ``Windowed[K]`` (``count()``
    gives a ``KTable[Windowed[K], int]``)."""

    _windows: TimeWindows | SlidingWindows

    def __init__(self, stream: KStream[K, V], windows: TimeWindows | SlidingWindows) -> None:
        self._stream = stream
        self._windows = windows
        self._emit = EmitStrategy.on_window_update()

    def emit_strategy(self, strategy: EmitStrategy) -> TimeWindowedKStream[K, V]:
        """``EmitStrategy.on_window_close()``: forward each window's final result only."""
        windowed = TimeWindowedKStream(self._stream, self._windows)
        windowed._emit = strategy
        return windowed

    def _processor(self, args: tuple) -> Processor:
        if isinstance(self._windows, SlidingWindows):
            return SlidingWindowAggregate(self._windows, self._emit, *args)
        return WindowedAggregate(self._windows, self._emit, *args)

    def _table_key_serde(self) -> Serde:
        # A sliding window [start, start + d] is written as a time window of size d, as
        # Kafka Streams writes it.
        windows = self._windows
        if isinstance(windows, SlidingWindows):
            return TimeWindowedSerde(self._stream.key_serde, windows.time_difference_ms)
        return TimeWindowedSerde(self._stream.key_serde, windows.size_ms)


@dataclass(frozen=True)
class _SessionClose:
    """What ``KTable.suppress`` reads of a session table's windows: a session closes gap +
    grace after its end (its ``grace_ms`` there), as Kafka Streams' suppression counts it."""

    grace_ms: int


def _add(key: Any, one: int, two: int) -> int:
    return one + two


class SessionWindowedKStream(_Aggregations[K, V, Windowed[K]]):
    """A grouped stream aggregated per session (``SessionWindows``): results keyed by
    ``Windowed(key, Window(start, end))`` (end inclusive: the session's last record), written
    by ``SessionWindowedSerde``. A None value is aggregated, as in Kafka Streams."""

    _windows: SessionWindows

    def __init__(self, stream: KStream[K, V], windows: SessionWindows) -> None:
        self._stream = stream
        self._windows = windows
        self._emit = EmitStrategy.on_window_update()
        self._merger: Callable[[Any, Any, Any], Any] = _add

    def emit_strategy(self, strategy: EmitStrategy) -> SessionWindowedKStream[K, V]:
        """``EmitStrategy.on_window_close()``: forward each session's final result only."""
        return self._copy(strategy, self._merger)

    def count(self, name: str | None = None) -> KTable[Windowed[K], int]:
        """Records per session, None values too; merged sessions' counts add up."""
        return self._copy(self._emit, _add)._aggregate("COUNT", name, zero, count_one,
                                                      Serdes.long())  # fmt: skip

    def reduce(
        self, reducer: Callable[[V, V], V], name: str | None = None
    ) -> KTable[Windowed[K], V]:
        """``reducer(aggregate, value)``; a session's first value is its first result, and
        merged sessions reduce as ``reducer(earlier, later)`` (Kafka Streams' merger for a
        reduce)."""

        def merger(key: Any, one: Any, two: Any) -> Any:
            return two if one is None else reducer(one, two)

        return self._copy(self._emit, merger)._aggregate(
            "REDUCE", name, None, lambda k, v, agg: reducer(agg, v), self._stream.value_serde
        )

    def aggregate(  # type: ignore[override]  # a session aggregation needs a merger
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[K, V, VA], VA],
        merger: Callable[[K, VA, VA], VA],
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KTable[Windowed[K], VA]:
        """``aggregator(key, value, aggregate)`` from ``initializer()``; ``merger(key, agg1,
        agg2)`` joins two sessions' results when a record bridges them."""
        return self._copy(self._emit, merger)._aggregate(
            "AGGREGATE", name, initializer, aggregator, value_serde or Serdes.json()
        )

    def _copy(self, emit: EmitStrategy, merger: Callable[[Any, Any, Any], Any]
              ) -> SessionWindowedKStream[K, V]:  # fmt: skip
        windowed = SessionWindowedKStream(self._stream, self._windows)
        windowed._emit, windowed._merger = emit, merger
        return windowed

    def _aggregate(self, *args: Any) -> KTable:
        table = super()._aggregate(*args)
        table._windows = _SessionClose(self._windows.close_after_end_ms)
        return table

    def _processor(self, args: tuple) -> Processor:
        return SessionWindowAggregate(self._windows, self._emit, self._merger, *args)

    def _table_key_serde(self) -> Serde:
        return SessionWindowedSerde(self._stream.key_serde)
