"""count / reduce / aggregate of a grouped stream over sliding windows (``SlidingWindows``),
as Kafka Streams' ``KStreamSlidingWindowAggregate`` computes them, step for step.

Kafka Streams keeps only the windows records make: for a record at t, its left window
[t - d, t] (d the time difference) and, once a later record of the key falls within d of it,
its right window [t + 1, t + 1 + d]. Each record updates the windows it falls into, creates its
left window (from the previous record's window when that one is within d) and its right window
(from the window of the next record), and the right window of the previous record when that
one is missing. A record before d (t < d) goes into the window [0, d] that holds every early
record. The windows are looked up latest first, as Kafka Streams' reverse iterator reads them
(what a RocksDB store gives it), which decides which window a new one is copied from.

A record with a None key or value is dropped and counted; so is one whose left window has
closed (its end + grace is behind stream time), and each window it would update that has
closed counts once more, as Kafka Streams counts them. Each update goes on keyed
``Windowed(key, Window(start, start + d))`` with the largest timestamp of the window's
records; with ``EmitStrategy.on_window_close()`` only each window's final result does.

``SlidingWindowAggregate.process`` below (with ``KeyedWindowAggregation._key_windows``) is the
reference. ``_sliding_core.Core`` (C, built with the package where a C compiler is available)
does the same per record, and ``tests/dsl/test_sliding_core.py`` holds the two to the same
results. What C saves is the interpreter's work around the same Python objects (the cache's
OrderedDict, entries and index of a key's windows; the store's transaction), and reads of the
store: it keeps each key's windows between records (results no aggregator can change in place
only), and on window close the windows not yet emitted, so that a record's final results need
no scan of the store's time index; both within the task's cache share (docs/memory.md), read
again from the store when dropped. On window close with int64 results (a count's), a kept
key's updates stay in its kept windows until the commit's flush (``write_held``), where each
window still seen goes to the store once, and the windows the commit's expiry would delete
do not go at all; before its kept windows leave memory, a key's go to the store. A count's
final results into a sink that takes them as they come (``_writes_windowed_key``, the long
serde) are written into the sink's rows by the core itself (``_Aggregation._direct_sink``).
"""

from __future__ import annotations

from typing import Any

from streamplatform.dsl.aggregate import (
    _TIMESTAMP,
    KeyedWindowAggregation,
    _cache_bytes,
    is_count,
    keyed_prefix,
)
from streamplatform.dsl.processor import ProcessorContext, single_forward
from streamplatform.dsl.windows import (
    EmitStrategy,
    SlidingWindows,
    TimeWindowedSerde,
    Window,
    Windowed,
)
from streamplatform.records import Record
from streamplatform.serdes import Serdes

try:  # the C per-record path, built with the package where a C compiler is available
    from streamplatform.dsl import _sliding_core as _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]
# Tests set this to False to run the Python reference where the C core would run.
NATIVE_CORE = True

_Found = tuple[Any, int] | None  # a window's (result, timestamp), None: no window


class SlidingWindowAggregate(KeyedWindowAggregation):
    """A grouped stream aggregated over sliding windows: a KTable keyed by
    ``Windowed(key, window)``."""

    suffix_tail = 0  # a window's suffix is its start

    def __init__(self, windows: SlidingWindows, emit: EmitStrategy, *aggregation: Any) -> None:
        """``aggregation``: what ``StreamAggregate`` takes."""
        super().__init__(*aggregation)
        self.windows = windows
        self.difference = windows.time_difference_ms
        self.retention_ms = windows.retention_ms
        self.emit_final = emit == EmitStrategy.on_window_close()
        self.time_first = self.emit_final  # Kafka Streams' store for final results
        self._core: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._core = self._native_core(context)
        if self._core is not None:
            self.process = self._core.process  # type: ignore[method-assign]

    def _native_core(self, context: ProcessorContext) -> Any:
        """The C core doing what ``process`` does, or None (not built, or switched off by a
        test)."""
        if _native is None or not NATIVE_CORE:
            return None
        return _native.Core(
            aggregation=self, cache=self.cache, store=self.store, stream_time=self.stream_time,
            store_time=self.store_time, emitted_to=self.emitted_to, task=self.cache.task,
            key_serialize=self.key_serde.serialize, key_deserialize=self.key_serde.deserialize,
            string_keys=self.key_serde is Serdes.string(),
            result_deserialize=self.result_serde.deserialize, initializer=self.initializer,
            aggregator=self.aggregator, count=is_count(self.initializer, self.aggregator),
            difference=self.difference, grace=self.windows.grace_ms,
            retention=self.retention_ms, time_first=self.time_first,
            emit_final=self.emit_final, forward=single_forward(context), record_type=Record,
            windowed_type=Windowed, window_type=Window,
            result_serialize=self.result_serde.serialize,
            long_results=self.result_serde is Serdes.long(),
            # on window close: the windows not emitted yet held within the task's cache share
            memory_bytes=_cache_bytes(context),
            **self._sink_arguments(context if self.emit_final else None),  # final results only
        )  # fmt: skip

    def _writes_windowed_key(self, serde: Any) -> bool:
        """Kafka Streams' time-windowed serde of the key serde, for a window of the time
        difference (``grouped.py``): the key's bytes, then the window's start."""
        return (isinstance(serde, TimeWindowedSerde) and serde.inner is self.key_serde
                and serde.size_ms == self.difference)  # fmt: skip

    def process(self, record: Record) -> None:
        if record.key is None or record.value is None:
            self.dropped_records += 1
            return
        timestamp = record.timestamp
        if timestamp > self.stream_time.time:
            self.stream_time.time = timestamp
        close = self.stream_time.time - self.windows.grace_ms
        if timestamp + self.difference < close:
            self.dropped_records += 1  # even its left window has closed: too late
            return
        prefix = keyed_prefix(self.key_serde.serialize(record.key) or b"")
        if timestamp < self.difference:
            self._process_early(record, prefix, close)
            return  # as Kafka Streams: no final results looked for after an early record
        self._process(record, prefix, close)
        if self.emit_final:
            self._emit_final(record, close)

    def _process(self, record: Record, prefix: bytes, close: int) -> None:
        """Kafka Streams' ``processReverse``: the key's windows from the record's right window
        back to the first one ending before the record."""
        timestamp, difference = record.timestamp, self.difference
        starts: set[int] = set()
        left: _Found = None  # the window the record's left window is made from
        right: _Found = None  # the window the record's right window is made from
        left_exists = right_exists = False
        previous: int | None = None  # the timestamp of the key's previous record
        low = max(0, timestamp - 2 * difference)
        for store_key, result, latest in reversed(self._key_windows(prefix, low, timestamp + 2)):
            start = _TIMESTAMP.unpack_from(store_key, len(prefix))[0]
            starts.add(start)
            end = start + difference
            if start == timestamp + 1:
                right_exists = True
            elif end > timestamp:
                if right is None:
                    right = (result, latest)
                self._update(record, prefix, start, (result, latest), close)
            elif end == timestamp:
                left_exists = True
                self._update(record, prefix, start, (result, latest), close)
                if latest >= timestamp:
                    return  # every window the record needs exists
                previous = latest
            else:
                left, previous = (result, latest), latest
                break
        self._create_windows(record, prefix, close, starts, left, right, left_exists,
                             right_exists, previous)  # fmt: skip

    def _create_windows(self, record: Record, prefix: bytes, close: int, starts: set[int],
                        left: _Found, right: _Found, left_exists: bool, right_exists: bool,
                        previous: int | None) -> None:  # fmt: skip
        timestamp, difference = record.timestamp, self.difference
        if previous is not None:  # the previous record's right window, if the record is in it
            start = previous + 1
            if start not in starts and start + difference >= timestamp:
                self._update(record, prefix, start, (self._initial(), timestamp), close)
        if not left_exists:
            if left is not None and previous is not None and timestamp - difference <= previous:
                made: _Found = (left[0], timestamp)
            else:
                made = (self._initial(), timestamp)
            self._update(record, prefix, timestamp - difference, made, close)
        if not right_exists and right is not None and right[1] > timestamp:
            self._create_right_window(record, prefix, right)

    def _process_early(self, record: Record, prefix: bytes, close: int) -> None:
        """Kafka Streams' ``processEarly``: a record before the time difference goes into the
        window [0, d], which holds every early record, windows starting at 0 or before
        being impossible."""
        timestamp = record.timestamp
        combined: _Found = None
        right: _Found = None
        right_exists = False
        starts: set[int] = set()
        previous: int | None = None
        for store_key, result, latest in self._key_windows(prefix, 0, timestamp + 2):
            start = _TIMESTAMP.unpack_from(store_key, len(prefix))[0]
            starts.add(start)
            if start == 0:
                combined = (result, latest)
                if latest < timestamp:
                    previous = latest
            elif start <= timestamp:
                right = (result, latest)
                self._update(record, prefix, start, (result, latest), close)
            else:
                right_exists = True  # starts at timestamp + 1
        if right is None and combined is not None and combined[1] > timestamp:
            right = combined  # holds only records after this one: its right window's
        if not right_exists and right is not None and right[1] > timestamp:
            self._create_right_window(record, prefix, right)
        if previous is not None and previous + 1 not in starts:
            self._update(record, prefix, previous + 1, (self._initial(), timestamp), close)
        if combined is None:
            combined = (self._initial(), timestamp)
        self._update(record, prefix, 0, combined, close)

    def _create_right_window(self, record: Record, prefix: bytes, right: tuple[Any, int]) -> None:
        """The record's right window, with the records after it (``right``): not this
        record's, and made even if it has closed, as in Kafka Streams."""
        start = record.timestamp + 1
        self._put(prefix + _TIMESTAMP.pack(start), start, right[0], right[1], record,
                  Window(start, start + self.difference))  # fmt: skip

    def _update(self, record: Record, prefix: bytes, start: int, old: _Found,
                close: int) -> None:  # fmt: skip
        """Kafka Streams' ``updateWindowAndForward``: the record into the window starting at
        ``start`` (``old`` its result and timestamp), unless the window has closed."""
        end = start + self.difference
        if end < close:
            self.dropped_records += 1
            return
        aggregate = None if old is None else old[0]
        result = self._aggregated(record, aggregate)
        timestamp = record.timestamp
        if aggregate is not None and old is not None:
            timestamp = max(timestamp, old[1])
        self._put(prefix + _TIMESTAMP.pack(start), start, result, timestamp, record,
                  Window(start, end))  # fmt: skip

    def _initial(self) -> Any:
        return None if self.initializer is None else self.initializer()

    def _aggregated(self, record: Record, aggregate: Any) -> Any:
        """The aggregator on ``aggregate`` (None: none yet); a reduce's first value is its
        result."""
        if aggregate is None and self.initializer is None:
            return record.value
        return self.aggregator(record.key, record.value, aggregate)

    def _emit_final(self, record: Record, close: int) -> None:
        """On window close: the windows that ended before ``close`` since the last time, with
        their results' timestamps (Kafka Streams' ``maybeForwardFinalResult``)."""
        emitted = self.emitted_to.time
        if emitted != -1 and emitted >= close:
            return
        upper = close - self.difference - 1  # a window [start, start + d] ends before close
        if upper < 0:
            return
        lower = 0 if emitted == -1 else max(0, emitted - self.difference)
        for key, suffix, result, timestamp in self._closed_windows(lower, upper):
            start = _TIMESTAMP.unpack(suffix)[0]
            window = Window(start, start + self.difference)
            self._forward(record._replace(key=self.key_serde.deserialize(key)), window, result,
                          timestamp)  # fmt: skip
        self.emitted_to.time = close
