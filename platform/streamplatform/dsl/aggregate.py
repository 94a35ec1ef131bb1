"""The aggregations of grouped streams: count, reduce and aggregate, over all time or per window.

Each keeps its results in a key-value store of the task (RocksDB, transactional like every
store: KIP-892), value = the result's timestamp (8 bytes) + its bytes, and forwards the
table's updates as records: the key (or ``Windowed(key, window)``), the new result, and as
timestamp the largest timestamp of the records aggregated, as Kafka Streams does.

**When updates are forwarded.** As in Kafka Streams, through a record cache
(``statestore.cache.max.bytes``, per task here; ``ResultCache``): results are kept in memory,
the latest per key goes to the store and on at the next commit, in the order of the keys'
last updates; what the cache has no room for goes at once, the least recently written first.
With the cache off (0) every update goes to the store and on as it is made. On Spark a commit
is the end of a micro-batch, so a key updated many times in a batch forwards once; the test
driver commits after every record by default.

**Windows** (windows.py): a record joins every window it falls into that has not closed
(window end > stream time - grace; this processor's stream time, the largest timestamp it
has seen); one for a closed window is dropped and counted (``dropped_records``). Closed
windows leave the store as stream time passes them. With ``EmitStrategy.on_window_close()``
nothing is forwarded on update: each window's final result goes on once, when it closes.

Records with a None key are dropped and counted, as in Kafka Streams; so are records with a
None value, except in windowed aggregations (Kafka Streams counts those).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from streamplatform.dsl.processor import Processor, ProcessorContext, engine_store
from streamplatform.dsl.windows import EmitStrategy, TimeWindows, Window, Windowed
from streamplatform.records import Record
from streamplatform.serdes import Serde

_TIMESTAMP = struct.Struct(">q")
_WINDOW_PREFIX = b"w"  # b"w" + start (8 bytes, big-endian) + key: windows in time order
_STREAM_TIME_KEY = b"m:stream-time"  # the processor's own stream time, kept with the store


class KeptStreamTime:
    """A processor's own stream time (the largest timestamp it has seen), kept in its store
    and written once per commit (``save`` from ``flush``), so that a reopened or restored
    task goes on from it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        saved = store.transaction.get(_STREAM_TIME_KEY)
        self.time = self.saved = -1 if saved is None else _TIMESTAMP.unpack(saved)[0]

    def save(self) -> None:
        if self.time != self.saved:
            self.store.transaction.put(_STREAM_TIME_KEY, _TIMESTAMP.pack(self.time))
            self.saved = self.time


class ResultCache:
    """An aggregation's results in front of its store, as Kafka Streams' caching store and its
    record cache: results are read and written in memory; at the commit (``flush``) the ones
    written since go to the store's transaction and their updates are forwarded, in the order
    of their last update; over ``max_bytes`` the least recently written go at once. With
    ``max_bytes`` 0 each result goes to the store, and its update on, as it is made.

    An entry is ``[result, timestamp, record, window, dirty]``: the record that made the
    result, and its window's start (None over all time), make the update forwarded at the
    flush;
    ``record`` None: nothing is forwarded for it (results forwarded only when their window
    closes)."""

    _ENTRY_BYTES = 96  # counted per entry besides its key (the result is not serialized)

    def __init__(self, aggregation: _Aggregation, max_bytes: int) -> None:
        self.aggregation = aggregation
        self.max_bytes = max_bytes
        self.entries: dict[bytes, list[Any]] = {}
        self.bytes = 0

    def get(self, key: bytes) -> tuple[Any, int] | None:
        entry = self.entries.get(key)
        if entry is not None:
            return entry[0], entry[1]
        return self.aggregation._read(key)

    def put(self, key: bytes, result: Any, timestamp: int, record: Record | None,
            window: int | None) -> None:  # fmt: skip
        if self.max_bytes <= 0:
            self.aggregation._write(key, result, timestamp)
            if record is not None:
                self.aggregation._forward(record, window, result, timestamp)
            return
        entries = self.entries
        if entries.pop(key, None) is None:  # re-inserted: the dict's order is the write order
            self.bytes += len(key) + self._ENTRY_BYTES
        entries[key] = [result, timestamp, record, window, True]
        while self.bytes > self.max_bytes and entries:
            first = next(iter(entries))
            self._evict(first, entries.pop(first))

    def pop(self, key: bytes) -> list[Any] | None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.bytes -= len(key) + self._ENTRY_BYTES
        return entry

    def flush(self) -> None:
        """Write what was written since the last flush, and forward its updates."""
        aggregation = self.aggregation
        for key, entry in self.entries.items():
            if entry[4]:
                aggregation._write(key, entry[0], entry[1])
                if entry[2] is not None:
                    aggregation._forward(entry[2], entry[3], entry[0], entry[1])
                entry[2] = None
                entry[4] = False

    def _evict(self, key: bytes, entry: list[Any]) -> None:
        self.bytes -= len(key) + self._ENTRY_BYTES
        if entry[4]:
            self.aggregation._write(key, entry[0], entry[1])
            if entry[2] is not None:
                self.aggregation._forward(entry[2], entry[3], entry[0], entry[1])


def _cache_bytes(context: ProcessorContext) -> int:
    """This task's ``statestore.cache.max.bytes`` (0 in a context that has none)."""
    return int(getattr(context, "cache_max_bytes", 0))


class _Aggregation(Processor):
    """What every aggregation shares: its store, its key serde, the result serde, the cache."""

    dropped_records: int = 0

    def __init__(
        self,
        store_name: str,
        key_serde: Serde,
        result_serde: Serde,
        initializer: Callable[[], Any] | None,
        aggregator: Callable[[Any, Any, Any], Any],
    ) -> None:
        self.store_name = store_name
        self.key_serde = key_serde
        self.result_serde = result_serde
        # aggregator(key, value, aggregate), starting from initializer(); a reduce has no
        # initializer: a key's first value is its first result.
        self.initializer = initializer
        self.aggregator = aggregator

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        self.cache = ResultCache(self, _cache_bytes(context))

    def flush(self) -> None:
        """Before each commit: the cached results to the store, their updates on."""
        self.cache.flush()

    def task_metrics(self) -> dict[str, int]:
        return {"dropped_records": self.dropped_records}

    def _updated(self, record: Record, old: tuple[Any, int] | None) -> tuple[Any, int]:
        """The result and its timestamp after ``record``, from the ``old`` one (None: the
        key's, or window's, first record)."""
        if old is None:
            if self.initializer is None:
                return record.value, record.timestamp
            return self.aggregator(record.key, record.value, self.initializer()), record.timestamp
        return self.aggregator(record.key, record.value, old[0]), max(record.timestamp, old[1])

    def _read(self, key: bytes) -> tuple[Any, int] | None:
        """A stored (result, timestamp), or None."""
        raw = self.store.transaction.get(key)
        if raw is None:
            return None
        return self.result_serde.deserialize(raw[8:]), _TIMESTAMP.unpack_from(raw)[0]

    def _write(self, key: bytes, result: Any, timestamp: int) -> None:
        """Write ``result`` (None deletes the key, as Kafka Streams' stores take a null
        aggregate)."""
        data = self.result_serde.serialize(result)
        if data is None:
            self.store.transaction.delete(key)
        else:
            self.store.transaction.put(key, _TIMESTAMP.pack(timestamp) + data)

    def _forward(self, record: Record, window: int | None, result: Any, timestamp: int) -> None:
        """The update ``record`` made: its key (in the window starting at ``window``), the
        result, its timestamp."""
        key = record.key if window is None else Windowed(record.key, self._window(window))
        self.context.forward(record._replace(key=key, value=result, timestamp=timestamp))

    def _window(self, start: int) -> Window:
        raise NotImplementedError  # windowed aggregations only


class StreamAggregate(_Aggregation):
    """count / reduce / aggregate of a grouped stream over all time: a KTable of results."""

    def process(self, record: Record) -> None:
        if record.key is None or record.value is None:
            self.dropped_records += 1
            return
        key = self.key_serde.serialize(record.key) or b""
        result, timestamp = self._updated(record, self.cache.get(key))
        self.cache.put(key, result, timestamp, record, None)


class WindowedAggregate(_Aggregation):
    """count / reduce / aggregate of a grouped stream per time window (``TimeWindows``): a
    KTable keyed by ``Windowed(key, window)``."""

    def __init__(self, windows: TimeWindows, emit: EmitStrategy, *aggregation: Any) -> None:
        """``aggregation``: what ``StreamAggregate`` takes."""
        super().__init__(*aggregation)
        self.windows = windows
        self.emit_final = emit == EmitStrategy.on_window_close()

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.stream_time = KeptStreamTime(self.store)
        self.closed_to = self.stream_time.time - self.windows.grace_ms  # ending by it: gone
        self.next_end = self._next_end()
        self.pending_close: int | None = None
        # Windows starting before it are gone from the store: a closing scan starts there
        # (not at the first key, past every window deleted in this batch's transaction).
        self.gone_below = 0

    def _window(self, start: int) -> Window:
        return Window(start, start + self.windows.size_ms)

    def _next_end(self) -> int:
        """The earliest window end after ``closed_to``: closing is looked at only once stream
        time passes a window's end (plus grace), not at every record."""
        size, advance = self.windows.size_ms, self.windows.advance_ms
        return (max(0, (self.closed_to - size) // advance + 1)) * advance + size

    def flush(self) -> None:
        super().flush()
        if self.pending_close is not None:  # on update: closed windows go once forwarded
            self._close_windows(None, self.pending_close)
            self.pending_close = None
        self.stream_time.save()

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
        forwarded = None if self.emit_final else record  # on window close: no update goes on
        for start in self.windows.window_starts(timestamp):
            if start + size <= close:
                self.dropped_records += 1  # its window has closed: too late
                continue
            store_key = _WINDOW_PREFIX + _TIMESTAMP.pack(start) + key
            result, result_timestamp = self._updated(record, cache.get(store_key))
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
        size = self.windows.size_ms
        low = _WINDOW_PREFIX + _TIMESTAMP.pack(self.gone_below)
        high = _WINDOW_PREFIX + _TIMESTAMP.pack(close - size + 1)
        self.closed_to = close
        self.next_end = self._next_end()
        self.gone_below = max(self.gone_below, close - size + 1)
        transaction = self.store.transaction
        closed: dict[bytes, tuple[Any, int]] = {}
        for store_key, raw in transaction.range(low, high):
            closed[store_key] = (self.result_serde.deserialize(raw[8:]),
                                 _TIMESTAMP.unpack_from(raw)[0])  # fmt: skip
        cache = self.cache
        for store_key in [k for k in cache.entries if k < high and k[:1] == _WINDOW_PREFIX]:
            entry = cache.pop(store_key)
            assert entry is not None
            if entry[4] and entry[2] is not None:  # an update not forwarded yet
                self._forward(entry[2], entry[3], entry[0], entry[1])
            closed[store_key] = (entry[0], entry[1])
        for store_key in sorted(closed):  # by window start, then key, as Kafka Streams
            if record is not None:
                result, timestamp = closed[store_key]
                start = _TIMESTAMP.unpack_from(store_key, 1)[0]
                windowed = Windowed(self.key_serde.deserialize(store_key[9:]),
                                    self._window(start))  # fmt: skip
                self.context.forward(record._replace(key=windowed, value=result,
                                                     timestamp=timestamp))  # fmt: skip
            transaction.delete(store_key)
