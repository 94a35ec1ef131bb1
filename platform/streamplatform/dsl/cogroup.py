"""``KGroupedStream.cogroup``: one aggregate from several grouped streams (KIP-150).

    totals = (purchases.group_by_key().cogroup(lambda k, purchase, total: total + purchase)
              .cogroup(refunds.group_by_key(), lambda k, refund, total: total - refund)
              .aggregate(lambda: 0, value_serde=Serdes.long(), name="totals"))

Each grouped stream brings its own aggregator; every record updates its key's one aggregate
(kept in one store, with one record cache), with its own stream's aggregator. As in Kafka
Streams the streams must be keyed alike (the first one's key serde writes the keys), and a
stream whose key changed is repartitioned first, each to a topic of its own.

How: each stream's records are tagged with the position of their stream (``(i, value)``) and
the tagged streams merged into the grouped stream of one ordinary aggregation, whose
aggregator hands each value to its stream's aggregator. So a cogrouped aggregate is the same
processor, store, record cache, windows and emission as ``aggregate``: over all time, per
time or sliding window (``windowed_by``) or per session (with a merger). Over all time a
record with a None value is dropped and counted, as ``aggregate`` drops it; per window it is
aggregated, as there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from streamplatform.dsl.processor import Processor
from streamplatform.dsl.windows import SessionWindows, SlidingWindows, TimeWindows, Windowed
from streamplatform.records import Record
from streamplatform.serdes import Serde

if TYPE_CHECKING:
    from streamplatform.dsl.grouped import KGroupedStream
    from streamplatform.dsl.kstream import KStream
    from streamplatform.dsl.ktable import KTable

Aggregator = Callable[[Any, Any, Any], Any]

__all__ = ["CogroupedKStream"]

# For type checkers and editors only: the key type, the aggregate's type (what the aggregators
# return) and a further grouped stream's value type.
K = TypeVar("K")
VA = TypeVar("VA")
VO = TypeVar("VO")


class _Tag(Processor):
    """Forwards ``(position, value)``; a None value as None when ``keep_none`` is off (the
    aggregation over all time drops it)."""

    def __init__(self, position: int, keep_none: bool) -> None:
        self.position = position
        self.keep_none = keep_none

    def process(self, record: Record) -> None:
        value = record[1]
        if value is not None or self.keep_none:
            value = (self.position, value)
        self.context.forward(record._replace(value=value))


class _Dispatch:
    """The aggregation's aggregator: each tagged value to its stream's aggregator."""

    def __init__(self, aggregators: Sequence[Aggregator]) -> None:
        self.aggregators = tuple(aggregators)

    def __call__(self, key: Any, tagged: tuple[int, Any], aggregate: Any) -> Any:
        position, value = tagged
        return self.aggregators[position](key, value, aggregate)


class CogroupedKStream(Generic[K, VA]):
    """Grouped streams and their aggregators, aggregated together (Kafka Streams'
    ``CogroupedKStream``): ``cogroup`` adds one, ``aggregate`` or ``windowed_by`` ends it.
    ``CogroupedKStream[K, VA]``: generic in the key and the aggregate's types, for type
    checkers and editors."""

    def __init__(self, parts: Sequence[tuple[KStream, Aggregator]]) -> None:
        self._parts = list(parts)

    def cogroup(
        self, grouped: KGroupedStream[K, VO], aggregator: Callable[[K, VO, VA], VA]
    ) -> CogroupedKStream[K, VA]:
        stream = grouped._stream
        if stream._builder is not self._parts[0][0]._builder:
            raise ValueError("cogroup: the grouped stream belongs to another StreamsBuilder")
        return CogroupedKStream([*self._parts, (stream, aggregator)])

    def aggregate(
        self, initializer: Callable[[], Any], value_serde: Serde | None = None,
        name: str | None = None,
    ) -> KTable[K, VA]:  # fmt: skip
        """The aggregate of every key over all time, from ``initializer()``; ``value_serde``
        writes it (JSON when not given); ``name`` names it and its store
        (``<name>-STATE-STORE``)."""
        from streamplatform.dsl.grouped import KGroupedStream

        base = name or self._parts[0][0]._builder.new_name("COGROUPKSTREAM-AGGREGATE")
        merged = self._merged(base, keep_none=False)
        return KGroupedStream(merged).aggregate(initializer, self._dispatch(), value_serde,
                                                 base)  # fmt: skip

    def windowed_by(
        self, windows: TimeWindows | SlidingWindows | SessionWindows
    ) -> CogroupedWindowedKStream[K, VA]:
        """Aggregate per time or sliding window, or per session."""
        if not isinstance(windows, TimeWindows | SlidingWindows | SessionWindows):
            raise TypeError("windowed_by takes TimeWindows, SlidingWindows or SessionWindows, "
                            f"got {type(windows).__name__}")  # fmt: skip
        return CogroupedWindowedKStream(self, windows)

    def _dispatch(self) -> _Dispatch:
        return _Dispatch([aggregator for _, aggregator in self._parts])

    def _merged(self, base: str, keep_none: bool) -> KStream:
        """The tagged streams, merged: repartitioned first where a key changed."""
        merged: KStream | None = None
        for position, (stream, _) in enumerate(self._parts):
            keyed = stream._repartition(f"{base}-{position}") if stream._key_changed else stream
            tagged = keyed._then("COGROUP-TAG", functools.partial(_Tag, position, keep_none))
            merged = tagged if merged is None else merged.merge(tagged)
        assert merged is not None
        return merged


class CogroupedWindowedKStream(Generic[K, VA]):
    """A cogrouped stream aggregated per window or session (Kafka Streams'
    ``TimeWindowedCogroupedKStream`` and ``SessionWindowedCogroupedKStream``)."""

    def __init__(self, cogrouped: CogroupedKStream[K, VA],
                 windows: TimeWindows | SlidingWindows | SessionWindows) -> None:  # fmt: skip
        self._cogrouped = cogrouped
        self._windows = windows

    def aggregate(
        self, initializer: Callable[[], Any], merger: Callable[[K, VA, VA], VA] | None = None,
        value_serde: Serde | None = None, name: str | None = None,
    ) -> KTable[Windowed[K], VA]:  # fmt: skip
        """Per window from ``initializer()``; sessions also need ``merger(key, agg1, agg2)``
        for two sessions a record bridges."""
        from streamplatform.dsl.grouped import SessionWindowedKStream, TimeWindowedKStream

        cogrouped = self._cogrouped
        base = name or cogrouped._parts[0][0]._builder.new_name("COGROUPKSTREAM-AGGREGATE")
        merged = cogrouped._merged(base, keep_none=True)
        if isinstance(self._windows, SessionWindows):
            if merger is None:
                raise ValueError("a cogrouped session aggregate needs a merger(key, agg1, agg2)")
            return SessionWindowedKStream(merged, self._windows).aggregate(
                initializer, cogrouped._dispatch(), merger, value_serde, base
            )
        return TimeWindowedKStream(merged, self._windows).aggregate(
            initializer, cogrouped._dispatch(), value_serde, base
        )
