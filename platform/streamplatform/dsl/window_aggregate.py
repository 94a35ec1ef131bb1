"""count / reduce / aggregate per time window (``TimeWindows``: tumbling or hopping).

What every aggregation does (the record cache, the store, when updates go on) is in
aggregate.py. This module adds the windows: a record joins every window it falls into that
has not closed (window end > stream time - grace; this processor's stream time, the largest
timestamp it has seen); one for a closed window is dropped and counted (``dropped_records``).
Closed windows leave the store as stream time passes them. With
``EmitStrategy.on_window_close()`` nothing is forwarded on update: each window's final result
goes on once, when it closes, in window start then key order (Kafka Streams').

The store holds b"w" + window start (8 bytes, big-endian) + key -> timestamp + result, so
windows are in time order, and ``m:stored-to``: the latest window start ever written to it.
A window starting after that cannot be in the store, so its first record reads nothing and
its close deletes nothing; most windows open and close between two commits, in the cache only.

``WindowedAggregate.process`` and ``_close_windows`` below are the reference.
``_window_core.Core`` (C, built with the package where a C compiler is available) does the
same per record and per close, and ``tests/dsl/test_window_core.py`` holds the two to the same
results. What C saves is the interpreter's work around the same Python objects (the cache's
OrderedDict and entries, the store's transaction through the helpers below).
"""

from __future__ import annotations

from typing import Any

from streamplatform.dsl.aggregate import _TIMESTAMP, KeptStreamTime, _Aggregation, is_count
from streamplatform.dsl.processor import ProcessorContext, single_forward
from streamplatform.dsl.windows import (
    EmitStrategy,
    TimeWindowedSerde,
    TimeWindows,
    Window,
    Windowed,
)
from streamplatform.records import Record
from streamplatform.serdes import Serdes

try:  # the C per-record path, built with the package where a C compiler is available
    from streamplatform.dsl import _window_core as _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]
# Tests set this to False to run the Python reference where the C core would run.
NATIVE_CORE = True

WINDOW_PREFIX = b"w"  # b"w" + start (8 bytes, big-endian) + key: windows in time order
_STORED_TO_KEY = b"m:stored-to"
_WINDOWS_END = b"x"  # above every window key


class WindowedAggregate(_Aggregation):
    """count / reduce / aggregate of a grouped stream per time window (``TimeWindows``): a
    KTable keyed by ``Windowed(key, window)``."""

    def __init__(self, windows: TimeWindows, emit: EmitStrategy, *aggregation: Any) -> None:
        """``aggregation``: what ``StreamAggregate`` takes."""
        super().__init__(*aggregation)
        self.windows = windows
        self.emit_final = emit == EmitStrategy.on_window_close()
        self._core: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.stream_time = KeptStreamTime(self.store)
        self.stored_to = KeptStreamTime(self.store, _STORED_TO_KEY)
        if self.stored_to.saved == -1:  # a new store, or one written before stored_to was kept
            self.stored_to.time = self._latest_stored_start()
        self.closed_to = self.stream_time.time - self.windows.grace_ms  # ending by it: gone
        self.next_end = self._next_end()
        self.pending_close: int | None = None
        # Windows starting before it are gone from the store: a closing scan starts there
        # (not at the first key, past every window deleted in this batch's transaction).
        self.gone_below = 0
        self._core = self._native_core(context)
        if self._core is not None:
            self.process = self._core.process  # type: ignore[method-assign]

    def _native_core(self, context: ProcessorContext) -> Any:
        """The C core doing what ``process`` and ``_close_windows`` do, or None (not built,
        or switched off by a test)."""
        if _native is None or not NATIVE_CORE:
            return None
        return _native.Core(
            aggregation=self, cache=self.cache, stream_time=self.stream_time,
            stored_to=self.stored_to, task=self.cache.task,
            key_serialize=self.key_serde.serialize, key_deserialize=self.key_serde.deserialize,
            string_keys=self.key_serde is Serdes.string(), initializer=self.initializer,
            aggregator=self.aggregator, count=is_count(self.initializer, self.aggregator),
            size=self.windows.size_ms, advance=self.windows.advance_ms,
            grace=self.windows.grace_ms, emit_final=self.emit_final,
            forward=single_forward(context),
            record_type=Record, windowed_type=Windowed, window_type=Window,
            **self._sink_arguments(context),
        )  # fmt: skip

    def _window(self, start: int) -> Window:
        return Window(start, start + self.windows.size_ms)

    def _writes_windowed_key(self, serde: Any) -> bool:
        """Whether ``serde`` writes this aggregation's windowed keys as its store keys hold
        them: Kafka Streams' time-windowed serde of its key serde, for its window size."""
        return (isinstance(serde, TimeWindowedSerde) and serde.inner is self.key_serde
                and serde.size_ms == self.windows.size_ms)  # fmt: skip

    def _next_end(self) -> int:
        """The earliest window end after ``closed_to``: closing is looked at only once stream
        time passes a window's end (plus grace), not at every record."""
        size, advance = self.windows.size_ms, self.windows.advance_ms
        return (max(0, (self.closed_to - size) // advance + 1)) * advance + size

    def _latest_stored_start(self) -> int:
        """The latest window start in the store (-1: none), read once from a store that does
        not keep it yet."""
        latest = -1
        for store_key, _ in self.store.transaction.range(WINDOW_PREFIX, _WINDOWS_END):
            latest = max(latest, _TIMESTAMP.unpack_from(store_key, 1)[0])
        return latest

    def _write(self, key: bytes, result: Any, timestamp: int) -> None:
        super()._write(key, result, timestamp)
        start = _TIMESTAMP.unpack_from(key, 1)[0]
        if start > self.stored_to.time:
            self.stored_to.time = start

    def flush(self) -> None:
        super().flush()
        if self.pending_close is not None:  # on update: closed windows go once forwarded
            self._close_windows(None, self.pending_close)
            self.pending_close = None
        self.stream_time.save()
        self.stored_to.save()

    def process(self, record: Record) -> None:
        if record.key is None:
            self.dropped_records += 1
            return
        timestamp, stream_time = record.timestamp, self.stream_time
        if timestamp > stream_time.time:
            stream_time.time = timestamp
        close = stream_time.time - self.windows.grace_ms
        key = self.key_serde.serialize(record.key) or b""
        cache, size = self.cache, self.windows.size_ms
        entries = cache.entries
        forwarded = None if self.emit_final else record  # on window close: no update goes on
        for start in self.windows.window_starts(timestamp):
            if start + size <= close:
                self.dropped_records += 1  # its window has closed: too late
                continue
            store_key = WINDOW_PREFIX + _TIMESTAMP.pack(start) + key
            entry = entries.get(store_key)
            if entry is not None:
                old: tuple[Any, int] | None = entry[0], entry[1]
            elif start > self.stored_to.time:
                old = None  # never stored
            else:
                old = self._read(store_key)
            result, result_timestamp = self._updated(record, old)
            cache.put(store_key, result, result_timestamp, forwarded, start)
        if close >= self.next_end:
            if self.emit_final:
                self._close_windows(record, close)
            else:  # their last updates go on at the flush, in their order (Kafka Streams')
                self.pending_close = close

    def _close_windows(self, record: Record | None, close: int) -> None:
        """Windows that ended at or before ``close``: their final results go on
        (on_window_close; ``record`` the one that closed them), any update of theirs not
        forwarded yet goes on, and they leave the store and the cache."""
        if self._core is not None:
            self._core.close_windows(record, close)
            return
        size = self.windows.size_ms
        low, high = self.gone_below, close - size + 1
        self.closed_to = close
        self.next_end = self._next_end()
        self.gone_below = max(self.gone_below, high)
        stored_to = self.stored_to.time
        closed = self._stored_windows(low, high) if low <= stored_to else {}
        high_key = WINDOW_PREFIX + _TIMESTAMP.pack(high)
        cache = self.cache
        for store_key in [k for k in cache.entries if k < high_key and k[:1] == WINDOW_PREFIX]:
            entry = cache.pop(store_key)
            assert entry is not None
            if entry[4] and entry[2] is not None:  # an update not forwarded yet
                self._forward(entry[2], entry[3], entry[0], entry[1])
            closed[store_key] = (entry[0], entry[1])
        stored = []
        for store_key in sorted(closed):  # by window start, then key, as Kafka Streams
            start = _TIMESTAMP.unpack_from(store_key, 1)[0]
            if record is not None:
                result, timestamp = closed[store_key]
                windowed = Windowed(self.key_serde.deserialize(store_key[9:]),
                                    self._window(start))  # fmt: skip
                self.context.forward(record._replace(key=windowed, value=result,
                                                     timestamp=timestamp))  # fmt: skip
            if start <= stored_to:  # else it was never written to the store
                stored.append(store_key)
        self._delete_stored(stored)

    def _stored_windows(self, low: int, high: int) -> dict[bytes, tuple[Any, int]]:
        """The store's windows starting in [low, high): store key -> (result, timestamp)."""
        transaction, deserialize = self.store.transaction, self.result_serde.deserialize
        bounds = WINDOW_PREFIX + _TIMESTAMP.pack(low), WINDOW_PREFIX + _TIMESTAMP.pack(high)
        return {
            store_key: (deserialize(raw[8:]), _TIMESTAMP.unpack_from(raw)[0])
            for store_key, raw in transaction.range(*bounds)
        }

    def _delete_stored(self, store_keys: list[bytes]) -> None:
        transaction = self.store.transaction
        for store_key in store_keys:
            transaction.delete(store_key)
