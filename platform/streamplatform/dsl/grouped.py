"""Grouped streams and their aggregations, as Kafka Streams names them.

``stream.group_by_key()`` (or ``group_by(selector)``, which re-keys and so repartitions) gives
a ``KGroupedStream``; ``count()``, ``reduce(reducer)`` and ``aggregate(initializer,
aggregator)`` give a ``KTable`` of the results, ``windowed_by(TimeWindows...)`` a
``TimeWindowedKStream`` whose results are keyed by ``Windowed(key, window)``. The processors
are in aggregate.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamplatform.dsl.aggregate import StreamAggregate, WindowedAggregate
from streamplatform.dsl.ktable import KTable
from streamplatform.dsl.processor import Processor
from streamplatform.dsl.windows import EmitStrategy, TimeWindowedSerde, TimeWindows
from streamplatform.serdes import Serde, Serdes
from streamplatform.state import Stores

if TYPE_CHECKING:
    from streamplatform.dsl.kstream import KStream


def _count(key: Any, value: Any, count: int) -> int:
    return count + 1


def _zero() -> int:
    return 0


class _Aggregations:
    """count, reduce and aggregate, for a grouped stream over all time or per window."""

    _stream: KStream
    _windows: TimeWindows | None = None  # per window: the windows; over all time: None

    def count(self, name: str | None = None) -> KTable:
        """Records per key (per key and window). A None value is not counted over all time,
        and is in a window, as in Kafka Streams."""
        return self._aggregate("COUNT", name, _zero, _count, Serdes.long())

    def reduce(self, reducer: Callable[[Any, Any], Any], name: str | None = None) -> KTable:
        """``reducer(aggregate, value)``; a key's first value is its first result. The
        results keep the stream's value serde."""
        return self._aggregate("REDUCE", name, None, lambda k, v, agg: reducer(agg, v),
                               self._stream.value_serde)  # fmt: skip

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KTable:
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
        store = builder.add_store(Stores.persistent_key_value_store(f"{base}-STATE-STORE"))
        args = (store, stream.key_serde, result_serde, initializer, aggregator)
        node = keyed._then(kind, lambda: self._processor(args), stores=(store,), name=base)
        table = KTable(builder, node._node, store, self._table_key_serde(), result_serde)
        table._windows = self._windows
        return table

    def _processor(self, args: tuple) -> Processor:
        """The aggregation's processor, from (store, key serde, result serde, initializer,
        aggregator)."""
        raise NotImplementedError

    def _table_key_serde(self) -> Serde:
        raise NotImplementedError


class KGroupedStream(_Aggregations):
    """A stream whose records are grouped by key (repartitioned first when the key changed)."""

    def __init__(self, stream: KStream) -> None:
        self._stream = stream

    def windowed_by(self, windows: TimeWindows) -> TimeWindowedKStream:
        """Aggregate per time window (tumbling or hopping)."""
        if not isinstance(windows, TimeWindows):
            raise TypeError(f"windowed_by takes TimeWindows, got {type(windows).__name__}")
        return TimeWindowedKStream(self._stream, windows)

    def _processor(self, args: tuple) -> Processor:
        return StreamAggregate(*args)

    def _table_key_serde(self) -> Serde:
        return self._stream.key_serde


class TimeWindowedKStream(_Aggregations):
    """A grouped stream aggregated per time window."""

    _windows: TimeWindows

    def __init__(self, stream: KStream, windows: TimeWindows) -> None:
        self._stream = stream
        self._windows = windows
        self._emit = EmitStrategy.on_window_update()

    def emit_strategy(self, strategy: EmitStrategy) -> TimeWindowedKStream:
        """``EmitStrategy.on_window_close()``: forward each window's final result only."""
        windowed = TimeWindowedKStream(self._stream, self._windows)
        windowed._emit = strategy
        return windowed

    def _processor(self, args: tuple) -> Processor:
        return WindowedAggregate(self._windows, self._emit, *args)

    def _table_key_serde(self) -> Serde:
        return TimeWindowedSerde(self._stream.key_serde, self._windows.size_ms)
