"""The aggregations of grouped streams: count, reduce and aggregate, over all time or per window.

Each keeps its results in a key-value store of the task (RocksDB, transactional like every
store: KIP-892), value = the result's timestamp (8 bytes) + its bytes, and forwards the
table's updates as records: the key (or ``Windowed(key, window)``), the new result, and as
timestamp the largest timestamp of the records aggregated, as Kafka Streams does.

**When updates are forwarded.** As in Kafka Streams, through a record cache
(``statestore.cache.max.bytes``, per task here): the latest update per key waits for the next
commit, then goes on in the order of the keys' last updates; an update the cache has no room
for goes on at once, the least recently updated first. With the cache off (0) every update
goes on as it is made. On Spark a commit is the end of a micro-batch, so a key updated many
times in a batch forwards once; the test driver commits after every record by default.

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


class RecordCache:
    """The latest update per key since the last commit (Kafka Streams' record cache for one
    store): ``put`` keeps it, ``flush`` forwards every one in the order of their last update.
    Over ``max_bytes`` the least recently updated are forwarded at once; ``max_bytes`` 0
    forwards every update as it comes."""

    _OVERHEAD = 64  # bytes counted per entry besides its key and value

    def __init__(self, forward: Callable[[Record], None], max_bytes: int) -> None:
        self.forward = forward
        self.max_bytes = max_bytes
        self.entries: dict[Any, tuple[Record, int]] = {}
        self.bytes = 0

    def put(self, key: Any, record: Record, size: int) -> None:
        if self.max_bytes <= 0:
            self.forward(record)
            return
        old = self.entries.pop(key, None)  # re-inserted: the dict's order is the update order
        if old is not None:
            self.bytes -= old[1]
        size += self._OVERHEAD
        self.entries[key] = (record, size)
        self.bytes += size
        while self.bytes > self.max_bytes and self.entries:
            first = next(iter(self.entries))
            evicted, evicted_size = self.entries.pop(first)
            self.bytes -= evicted_size
            self.forward(evicted)

    def flush(self) -> None:
        entries, self.entries, self.bytes = self.entries, {}, 0
        for record, _ in entries.values():
            self.forward(record)


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
        self.cache = RecordCache(context.forward, _cache_bytes(context))

    def flush(self) -> None:
        """Before each commit: forward the cached updates."""
        self.cache.flush()

    def task_metrics(self) -> dict[str, int]:
        return {"dropped_records": self.dropped_records}

    def _result(self, raw: bytes | None) -> tuple[Any, int] | None:
        """A stored (result, timestamp), or None."""
        if raw is None:
            return None
        return self.result_serde.deserialize(raw[8:]), _TIMESTAMP.unpack_from(raw)[0]

    def _updated(self, record: Record, raw: bytes | None) -> tuple[Any, int]:
        """The result and its timestamp after ``record``, from the stored ``raw`` (None: the
        key's, or window's, first record)."""
        old = self._result(raw)
        if old is None:
            if self.initializer is None:
                return record.value, record.timestamp
            return self.aggregator(record.key, record.value, self.initializer()), record.timestamp
        return self.aggregator(record.key, record.value, old[0]), max(record.timestamp, old[1])

    def _store(self, key: bytes, result: Any, timestamp: int) -> int:
        """Write ``result`` (None deletes the key, as Kafka Streams' stores take a null
        aggregate); returns its size in bytes."""
        data = self.result_serde.serialize(result)
        if data is None:
            self.store.transaction.delete(key)
            return len(key)
        self.store.transaction.put(key, _TIMESTAMP.pack(timestamp) + data)
        return len(key) + len(data)


class StreamAggregate(_Aggregation):
    """count / reduce / aggregate of a grouped stream over all time: a KTable of results."""

    def process(self, record: Record) -> None:
        if record.key is None or record.value is None:
            self.dropped_records += 1
            return
        key = self.key_serde.serialize(record.key) or b""
        result, timestamp = self._updated(record, self.store.transaction.get(key))
        size = self._store(key, result, timestamp)
        self.cache.put(key, record._replace(value=result, timestamp=timestamp), size)


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
        saved = self.store.transaction.get(_STREAM_TIME_KEY)
        self.stream_time = -1 if saved is None else _TIMESTAMP.unpack(saved)[0]
        self.closed_to = self._close_time()  # windows ending at or before it are gone

    def _close_time(self) -> int:
        return self.stream_time - self.windows.grace_ms

    def process(self, record: Record) -> None:
        if record.key is None:
            self.dropped_records += 1
            return
        timestamp = record.timestamp
        if timestamp > self.stream_time:
            self.stream_time = timestamp
            self.store.transaction.put(_STREAM_TIME_KEY, _TIMESTAMP.pack(timestamp))
        close = self._close_time()
        key = self.key_serde.serialize(record.key) or b""
        transaction = self.store.transaction
        for window in self.windows.windows_for(timestamp):
            if window.end <= close:
                self.dropped_records += 1  # its window has closed: too late
                continue
            store_key = _WINDOW_PREFIX + _TIMESTAMP.pack(window.start) + key
            result, result_timestamp = self._updated(record, transaction.get(store_key))
            size = self._store(store_key, result, result_timestamp)
            if not self.emit_final:
                update = record._replace(key=Windowed(record.key, window), value=result,
                                         timestamp=result_timestamp)  # fmt: skip
                self.cache.put(store_key, update, size)
        if close > self.closed_to:
            self._close_windows(record, close)

    def _close_windows(self, record: Record, close: int) -> None:
        """Windows that ended at or before ``close`` (and after the last close): their final
        results go on (on_window_close), and they leave the store."""
        size = self.windows.size_ms
        low = _WINDOW_PREFIX + _TIMESTAMP.pack(max(0, self.closed_to - size + 1))
        high = _WINDOW_PREFIX + _TIMESTAMP.pack(close - size + 1)
        self.closed_to = close
        if close - size + 1 <= 0:
            return  # no window has ended yet
        transaction = self.store.transaction
        closed = list(transaction.range(low, high))
        if self.emit_final:
            self.cache.flush()  # updates before final results, never after
        for store_key, raw in closed:
            start = _TIMESTAMP.unpack_from(store_key, 1)[0]
            result, timestamp = self._result(raw)  # type: ignore[misc]
            if self.emit_final:
                key = self.key_serde.deserialize(store_key[9:])
                windowed = Windowed(key, Window(start, start + size))
                self.context.forward(record._replace(key=windowed, value=result,
                                                     timestamp=timestamp))  # fmt: skip
            transaction.delete(store_key)
