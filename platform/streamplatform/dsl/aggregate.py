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
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from streamplatform.dsl.processor import Processor, ProcessorContext, engine, engine_store
from streamplatform.dsl.windows import Window, Windowed
from streamplatform.records import NO_SOURCE, ProducerRecord, Record
from streamplatform.serdes import Serde, Serdes

_TIMESTAMP = struct.Struct(">q")
_STREAM_TIME_KEY = b"m:stream-time"  # the processor's own stream time, kept with the store


class KeptStreamTime:
    """A processor's own stream time (the largest timestamp it has seen), kept in its store
    and written once per commit (``save`` from ``flush``), so that a reopened or restored
    task goes on from it."""

    def __init__(self, store: Any, key: bytes = _STREAM_TIME_KEY) -> None:
        """``key``: where in the store (another key keeps another time of the processor)."""
        self.store = store
        self.key = key
        saved = store.transaction.get(key)
        self.time = self.saved = -1 if saved is None else _TIMESTAMP.unpack(saved)[0]

    def save(self) -> None:
        if self.time != self.saved:
            self.store.transaction.put(self.key, _TIMESTAMP.pack(self.time))
            self.saved = self.time


class ResultCache:
    """An aggregation's results in front of its store, as Kafka Streams' caching store and its
    record cache: results are read and written in memory; at the commit (``flush``) the ones
    written since go to the store's transaction and their updates are forwarded, in the order
    of their last update; over ``max_bytes`` the least recently written go at once. With
    ``max_bytes`` 0 each result goes to the store, and its update on, as it is made.

    An entry is ``[result, timestamp, record, window, dirty, source]``: the record that made
    the result, and its window's start (None over all time), make the update forwarded at the
    flush;
    ``record`` None: nothing is forwarded for it (results forwarded only when their window
    closes). ``source`` is the task's source record then (its topic, partition, offset and
    headers): an update forwarded later goes on with it, as Kafka Streams' cache keeps each
    entry's record context, so that it is written as coming from that record."""

    # Counted per entry besides its key's length: what CPython 3.11 allocates for an entry of a
    # count() (its dict slot, the entry list, the key object, the result, the record that
    # made it and the task's source record), measured with tracemalloc (docs/memory.md). A
    # larger result or record value is not counted: nothing is serialized to size it.
    _ENTRY_BYTES = 575

    def __init__(self, aggregation: _Aggregation, max_bytes: int) -> None:
        self.aggregation = aggregation
        self.max_bytes = max_bytes
        # In write order, the oldest first. An OrderedDict: taking the oldest out of a plain
        # dict (next(iter(d))) walks past every slot freed before it, so a full cache that
        # evicts at every put would cost O(entries) per record.
        self.entries: OrderedDict[bytes, list[Any]] = OrderedDict()
        self.bytes = 0
        found = engine(getattr(aggregation, "context", None))
        self.task = None if found is None else found.task

    def get(self, key: bytes) -> tuple[Any, int] | None:
        entry = self.entries.get(key)
        if entry is not None:
            return entry[0], entry[1]
        return self.aggregation._read(key)

    def put(self, key: bytes, result: Any, timestamp: int, record: Record | None,
            window: Any) -> None:  # fmt: skip
        if self.max_bytes <= 0:
            self.aggregation._store(key, result, timestamp, record, window)
            return
        entries = self.entries
        source = None if self.task is None else self.task.current
        entry = entries.get(key)
        if entry is not None:  # rewritten in place, and last: the order is the write order
            entries.move_to_end(key)
            entry[:] = result, timestamp, record, window, True, source
            return
        self.bytes += len(key) + self._ENTRY_BYTES
        entries[key] = [result, timestamp, record, window, True, source]
        if self.bytes > self.max_bytes:
            self.evict_over_budget()

    def evict_over_budget(self) -> None:
        """The least recently written entries leave until the cache is within its bytes."""
        entries = self.entries
        while self.bytes > self.max_bytes and entries:
            self._evict(*entries.popitem(last=False))

    def pop(self, key: bytes) -> list[Any] | None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.bytes -= len(key) + self._ENTRY_BYTES
        return entry

    def flush(self) -> None:
        """Write what was written since the last flush, and forward its updates."""
        for key, entry in self.entries.items():
            if entry[4]:
                self._store(key, entry)
                entry[2] = None
                entry[4] = False

    def _evict(self, key: bytes, entry: list[Any]) -> None:
        self.bytes -= len(key) + self._ENTRY_BYTES
        if entry[4]:
            self._store(key, entry)

    def _store(self, key: bytes, entry: list[Any]) -> None:
        """The entry to the store, its update on as coming from its source record."""
        task = self.task
        if task is None:
            self.aggregation._store(key, entry[0], entry[1], entry[2], entry[3])
            return
        current, task.current = task.current, entry[5]
        try:
            self.aggregation._store(key, entry[0], entry[1], entry[2], entry[3])
        finally:
            task.current = current


def count_one(key: Any, value: Any, count: int) -> int:
    """count()'s aggregator."""
    return count + 1


def zero() -> int:
    """count()'s initializer."""
    return 0


def is_count(initializer: Any, aggregator: Any) -> bool:
    """Whether an aggregation is count() (the C cores count without calling Python)."""
    return initializer is zero and aggregator is count_one


def _cache_bytes(context: ProcessorContext) -> int:
    """This aggregation's share of its task's ``statestore.cache.max.bytes`` (0 in a
    context that has none)."""
    return int(getattr(context, "cache_max_bytes", 0))


def results_name(store_name: str) -> str:
    """What a task shares an aggregation's results (its record cache) under."""
    return f"results:{store_name}"


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

    def reads_values(self) -> bool:
        return not is_count(self.initializer, self.aggregator)  # counting: None or not

    def uses_record_cache(self) -> bool:
        return True

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        self.cache = ResultCache(self, _cache_bytes(context))
        # A stream joined with this table reads its results through the cache, as Kafka
        # Streams' join reads through the caching store (join.py).
        found = engine(context)
        task = None if found is None else found.task
        if task is not None:
            task.shared[results_name(self.store_name)] = self.cache

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

    def _store(self, key: bytes, result: Any, timestamp: int, record: Record | None,
               window: Any) -> None:  # fmt: skip
        """A result leaves the cache: to the store, and the update ``record`` made (None:
        nothing to forward) goes on."""
        self._write(key, result, timestamp)
        if record is not None:
            self._forward(record, window, result, timestamp)

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

    def _direct_sink(self, context: ProcessorContext) -> tuple[str, list, list] | None:
        """Where a windowed C core writes the final results of closed windows itself, as the
        sink's delivery function would (the same bytes: the store keys hold the windowed
        key's, and a count is 8 bytes big-endian): when this aggregation's only child is a
        sink of an external topic (``Task.direct_sink``) whose key serde writes this
        aggregation's windowed keys as its store keys hold them (``_writes_windowed_key``)
        and whose value serde is the long serde. Then (its topic, the task's output list,
        their sources), else None. Anything the core cannot write so goes the usual way
        (forwarded as a Record)."""
        runtime = engine(context)
        found = None if runtime is None else runtime.task.direct_sink(runtime.node)
        if found is None:
            return None
        sink, topic, output, sources = found
        if not self._writes_windowed_key(sink.key_serde) or sink.value_serde is not Serdes.long():
            return None
        return topic, output, sources

    def _sink_arguments(self, context: ProcessorContext | None) -> dict[str, Any]:
        """A windowed C core's direct-sink arguments: the sink ``_direct_sink(context)``
        finds, or none (``context`` None: every result is forwarded)."""
        sink = None if context is None else self._direct_sink(context)
        return {
            "sink_topic": None if sink is None else sink[0],
            "sink_append": None if sink is None else sink[1].append,
            "sink_sources_append": None if sink is None else sink[2].append,
            "producer_type": ProducerRecord, "no_source": NO_SOURCE,
        }  # fmt: skip

    def _writes_windowed_key(self, serde: Any) -> bool:
        """Whether ``serde`` writes this aggregation's windowed keys as its store keys hold
        them (none by default: only windowed aggregations' cores write to a sink)."""
        return False


class StreamAggregate(_Aggregation):
    """count / reduce / aggregate of a grouped stream over all time: a KTable of results."""

    def process(self, record: Record) -> None:
        if record.key is None or record.value is None:
            self.dropped_records += 1
            return
        key = self.key_serde.serialize(record.key) or b""
        result, timestamp = self._updated(record, self.cache.get(key))
        self.cache.put(key, result, timestamp, record, None)


# Sliding windows and sessions (sliding_aggregate.py, session_aggregate.py) look up a key's
# windows by time, as Kafka Streams' window and session stores do, so their store is laid out
# twice: b"k" + key length (4 bytes) + key + window suffix -> timestamp + result (a key's
# windows in time order), and b"t" + window suffix + key -> b"" (every window in time order:
# expiry, and final results on window close). The suffix is the window's time (8 bytes,
# big-endian: its start for sliding windows, its end for sessions), then for sessions the
# start. Timestamps are not negative (Kafka Streams drops such records), so the
# big-endian bytes sort as the numbers.
_KEYED_PREFIX = b"k"
_TIME_PREFIX = b"t"
_STORE_TIME_KEY = b"m:store-time"  # the largest window time written: what retention counts from
_EMITTED_KEY = b"m:emitted-to"  # on window close: the window close time last emitted to
_LATEST = 2**63 - 1


def keyed_prefix(key: bytes) -> bytes:
    """Where a key's windows start in a ``KeyedWindowAggregation``'s store."""
    return _KEYED_PREFIX + len(key).to_bytes(4, "big") + key


class KeyedWindowCache(ResultCache):
    """The record cache of a ``KeyedWindowAggregation``: also finds a key's cached windows
    (``by_prefix``), since its lookups are ranges of a key's windows, not single keys."""

    def __init__(self, aggregation: _Aggregation, max_bytes: int) -> None:
        super().__init__(aggregation, max_bytes)
        self.by_prefix: dict[bytes, set[bytes]] = {}

    def put(self, key: bytes, result: Any, timestamp: int, record: Record | None,
            window: Any) -> None:  # fmt: skip
        if self.max_bytes > 0 and key not in self.entries:
            self.by_prefix.setdefault(_prefix_of(key), set()).add(key)
        super().put(key, result, timestamp, record, window)

    def pop(self, key: bytes) -> list[Any] | None:
        entry = super().pop(key)
        if entry is not None:
            self._unindex(key)
        return entry

    def _evict(self, key: bytes, entry: list[Any]) -> None:
        self._unindex(key)
        super()._evict(key, entry)

    def _unindex(self, key: bytes) -> None:
        prefix = _prefix_of(key)
        keys = self.by_prefix.get(prefix)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_prefix[prefix]


def _prefix_of(store_key: bytes) -> bytes:
    return store_key[: 5 + int.from_bytes(store_key[1:5], "big")]


class KeyedWindowAggregation(_Aggregation):
    """What sliding-window and session aggregations share: a key's windows found by time
    through the record cache and the store, Kafka Streams' retention (a window whose time is
    ``retention_ms`` behind the largest window time written is no longer seen, as Kafka
    Streams' segmented stores hide it), expiry of those windows from the store at the commit,
    and the final results of ``EmitStrategy.on_window_close()``.

    A subclass sets ``retention_ms``, ``emit_final`` and ``suffix_tail`` (the bytes of the
    window suffix after its time: 8 for sessions, 0 for sliding windows)."""

    retention_ms: int
    emit_final: bool
    suffix_tail: int
    # Kafka Streams' time-first store (sliding windows on window close) hides a window only
    # once it is a whole retention behind, not retention - 1 as its other stores do.
    time_first: bool = False
    # The subclass's C core (None: the Python reference runs). On window close it may hold
    # writes back from the store's transaction until the flush: write_held(below) writes them,
    # but those of windows created since the last flush that the expiry would delete again.
    _core: Any = None

    def uses_record_cache(self) -> bool:
        return not self.emit_final

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        # On window close Kafka Streams' store has no cache: every write goes to it at once,
        # where the final results are found.
        self.cache = KeyedWindowCache(self, 0 if self.emit_final else _cache_bytes(context))
        self.stream_time = KeptStreamTime(self.store)
        self.store_time = KeptStreamTime(self.store, _STORE_TIME_KEY)
        self.emitted_to = KeptStreamTime(self.store, _EMITTED_KEY)
        self.expired_below = 0  # window times below it are gone from the store

    def flush(self) -> None:
        super().flush()
        core = self._core
        if core is not None:  # what it held back, but for the windows expired just below
            core.write_held(self.store_time.time - self.retention_ms)
        self._expire()
        self.stream_time.save()
        self.store_time.save()
        self.emitted_to.save()

    def _visible_from(self) -> int:
        """The earliest window time still seen: Kafka Streams' store stream time - retention
        + 1 (+ 0 in its time-first store)."""
        return max(0, self.store_time.time - self.retention_ms + (0 if self.time_first else 1))

    def _key_windows(self, prefix: bytes, low: int, high: int) -> list[tuple[bytes, Any, int]]:
        """The key's windows (``prefix``) whose time is in [low, high) and still seen, in time
        order: (store key, result, timestamp), the cache's over the store's."""
        low = max(low, self._visible_from())
        if high <= low:
            return []
        found: dict[bytes, tuple[Any, int]] = {}
        deserialize = self.result_serde.deserialize
        for store_key, raw in self.store.transaction.range(
            prefix + _TIMESTAMP.pack(low), prefix + _TIMESTAMP.pack(high)
        ):
            found[store_key] = (deserialize(raw[8:]), _TIMESTAMP.unpack_from(raw)[0])
        entries, at = self.cache.entries, len(prefix)
        for store_key in self.cache.by_prefix.get(prefix, ()):  # type: ignore[attr-defined]
            if low <= _TIMESTAMP.unpack_from(store_key, at)[0] < high:
                entry = entries[store_key]
                found[store_key] = (entry[0], entry[1])
        return [(k, *found[k]) for k in sorted(found) if found[k][0] is not None]

    def _put(self, store_key: bytes, time: int, result: Any, timestamp: int,
             record: Record | None, window: Window) -> None:  # fmt: skip
        """Write a window's result (None: delete the window), its update forwarded unless
        only final results are."""
        # Kafka Streams' store counts the window's time at every write reaching it: with a
        # cache, a deletion of a window the store never had does not.
        if (result is not None or self.cache.max_bytes <= 0) and time > self.store_time.time:
            self.store_time.time = time
        forwarded = None if self.emit_final else record
        self.cache.put(store_key, result, timestamp, forwarded, window)

    def _store(self, key: bytes, result: Any, timestamp: int, record: Record | None,
               window: Any) -> None:  # fmt: skip
        # Kafka Streams' caching store: deleting a window its store never had (created and
        # deleted in the cache) neither writes nor forwards anything. Without the cache the
        # deletion goes on all the same.
        if result is None and self.cache.max_bytes > 0 and self.store.transaction.get(key) is None:
            return
        super()._store(key, result, timestamp, record, window)

    def _write(self, key: bytes, result: Any, timestamp: int) -> None:
        super()._write(key, result, timestamp)
        index = self._time_key(key)
        if self.result_serde.serialize(result) is None:
            self.store.transaction.delete(index)
        else:
            self.store.transaction.put(index, b"")

    def _forward(self, record: Record, window: Any, result: Any, timestamp: int) -> None:
        self.context.forward(record._replace(key=Windowed(record.key, window), value=result,
                                             timestamp=timestamp))  # fmt: skip

    def _time_key(self, store_key: bytes) -> bytes:
        """The time index's key of the window at ``store_key``: b"t" + suffix + key, the
        order of Kafka Streams' time-first stores ([start][key] for windows, [end][start]
        [key] for sessions)."""
        suffix_at = len(store_key) - 8 - self.suffix_tail
        return _TIME_PREFIX + store_key[suffix_at:] + store_key[5:suffix_at]

    def _store_key(self, time_key: bytes) -> tuple[bytes, bytes, bytes]:
        """The time index's key back to (store key, key bytes, suffix)."""
        key_at = 9 + self.suffix_tail
        key, suffix = time_key[key_at:], time_key[1:key_at]
        return keyed_prefix(key) + suffix, key, suffix

    def _closed_windows(self, low: int, high: int) -> list[tuple[bytes, bytes, Any, int]]:
        """Every key's windows with time in [low, high], in time then key order, as Kafka
        Streams' time-ordered store gives them: (key bytes, suffix, result, timestamp). With
        no cache (on window close) the store has them all. Its time-first window store hides
        those a retention behind; its session store shows them all."""
        if self.time_first:
            low = max(low, self._visible_from())
        if high < low:
            return []
        transaction, out = self.store.transaction, []
        bounds = _TIME_PREFIX + _TIMESTAMP.pack(low), _TIME_PREFIX + _TIMESTAMP.pack(high + 1)
        for time_key in transaction.keys(*bounds):
            store_key, key, suffix = self._store_key(time_key)
            raw = transaction.get(store_key)
            if raw is not None:
                out.append((key, suffix, self.result_serde.deserialize(raw[8:]),
                            _TIMESTAMP.unpack_from(raw)[0]))  # fmt: skip
        return out

    def _expire(self) -> None:
        """Windows no longer seen leave the store (and the cache; their updates went on at the
        flush before). Those at the time-first retention bound stay: a final result may still
        be read there."""
        below = self.store_time.time - self.retention_ms
        if below <= self.expired_below:
            return
        transaction = self.store.transaction
        low = _TIME_PREFIX + _TIMESTAMP.pack(self.expired_below)
        high = _TIME_PREFIX + _TIMESTAMP.pack(below)
        # Each window's key and its time-index key deleted in one call, as delete of each
        # would: most of a commit's windows on window close, created and expired within it.
        time_keys = transaction.keys(low, high)
        if time_keys:
            store_keys = [self._store_key(time_key)[0] for time_key in time_keys]
            transaction.delete_each(store_keys + time_keys)
            if self.cache.entries:
                for store_key in store_keys:
                    self.cache.pop(store_key)
        self.expired_below = below
