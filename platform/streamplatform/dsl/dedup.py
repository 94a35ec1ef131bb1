"""Deduplication within a time interval (KIP-655), with the KIP's boundary, late-record and
replay rules as Kafka settled them.

The store keeps, per id, the (timestamp, offset) of the last record it let through, and an
expiry index by timestamp (layout and purge in dedup_store.py). Stream time is the task's
(largest timestamp processed, None keys included); the processor saves it in its own store so
that it survives a restart together with the entries it explains.

Memory holds a bounded part of the ids: the processor's share of ``statestore.cache.max.bytes``
(its *budget*). While every stored id fits in half of it, memory holds them all: a record's
lookup is a dict lookup, and a miss means a new id (most are). Entries older than
``stream_time - interval`` can never cause a drop again and leave memory through an in-memory
time index, in runs: once the horizon has moved on by 1/64 of the interval since the last
purge, and exactly at every commit. The index is a queue of the entries that arrived in
timestamp order (nearly all: popping its head is O(1)) and a heap of the others.

When the ids outgrow the budget, a commit empties memory of them (they are all in the store by
then) and from then on a miss of the dict asks the store (RocksDB, its bloom filters and block
cache): memory holds only the ids of the current commit. The store's own index expires what
memory no longer holds, at every commit. Once stream time has moved more than the interval past
the last time memory let ids go, none of those can cause a drop any more, and misses stop
asking the store until memory lets ids go again. The budget bounds the ids held between commits too:
past 15/16 of it (the task asks after every few records) the processor hands its held writes
to the store's transaction and empties memory, as a commit would, without ending the batch;
the transaction's writes are then bounded by the uncommitted limits, which commit early. So
the memory of a deduplication is bounded by its budget, whatever the interval and the rate.

Under READ_COMMITTED (exactly once) no one sees a write before the commit, so the writes wait
in a dict until ``before_commit()`` hands them to the store's transaction, which stays what
commits, prepares and leaves as the changelog: an id stored and expired within one commit
interval (nearly all, when the interval is short next to a batch) never reaches the store. The
waiting writes count towards the store's uncommitted limits (``uncommitted_limit_exceeded``) as
the store counts staged writes, one per id: an id stored and expired before the hand-over
counts for nothing, so a long batch of short-lived ids is not cut early for writes it never
makes.
Under READ_UNCOMMITTED every write goes to the store at once, as readers expect to see it,
and its index key at the commit.

The per-record part (the rule, the index, the held writes) is ``_DedupCore``, the reference;
``_dedup_core.Core`` does the same in C for held writes with the runtime's task, when the
package was built with a C compiler (``tests/dsl/test_dedup_core.py`` holds the two to the
same results). The processor calls neither per record: the task calls the core's ``process``.
Store keys and packed entries are built only for the writes handed to the store, and most ids
expire before that. The held writes are counted towards the uncommitted byte limit by
characters, not UTF-8 bytes.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from streamplatform.dsl.dedup_store import (
    ENTRY_BYTES,
    HEAP_ITEM_BYTES,
    INDEX_ITEM_BYTES,
    META_KEY,
    NO_OFFSET,
    SLOT_BYTES,
    DedupStore,
    Entry,
    MemoryKey,
    held_size,
    key_from_store,
    mean_key_bytes,
    memory_key,
    pack_entry,
    store_key,
    unpack_entry,
)
from streamplatform.dsl.processor import (
    Processor,
    ProcessorContext,
    engine,
    engine_store,
    single_forward,
)
from streamplatform.identity import canonical_bytes
from streamplatform.records import Record
from streamplatform.state import IsolationLevel

# Re-exported: tests and tools read the layout from here.
__all__ = [
    "DeduplicationProcessor", "canonical_bytes", "key_from_store", "memory_key", "should_forward",
    "store_key",
]  # fmt: skip
_pack, _unpack = pack_entry, unpack_entry
_META_KEY = META_KEY
_PURGE_SLACK_FRACTION = 64  # entries held past expiry: at most 1/64 of an interval's worth
_NEVER_PURGED = -(2**63)
_ABSENT = object()  # not among the held writes

try:  # the C per-record path, built with the package where a C compiler is available
    from streamplatform.dsl import _dedup_core as _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]
# Tests set this to False to run the pure-Python core where the C one would run.
NATIVE_CORE = True


def should_forward(
    entry: tuple[int, int] | None,
    timestamp: int,
    offset: int | None,
    stream_time: int,
    interval: int,
) -> bool:
    """KIP-655's rule for a record with a non-None id. Both ends of the interval are inclusive."""
    if entry is None:
        return True
    entry_ts, entry_offset = entry
    return (
        stream_time - entry_ts > interval
        or entry_ts - timestamp > interval
        or (offset is not None and offset == entry_offset)  # the same record, replayed
    )


class _DedupCore:
    """The in-memory half of a DeduplicationProcessor: KIP-655's rule per record, the expiry
    index and the writes waiting for the commit. This is the reference implementation;
    ``_dedup_core.Core`` (C, built with the package when a compiler is there) does the same
    for the buffered case with the runtime's task, where nearly all records go, and
    ``tests/dsl/test_dedup_core.py`` holds the two to the same results.

    ``put`` is None when writes wait in ``pending`` for the commit (READ_COMMITTED), else
    the store's put, called at once. ``task`` is the runtime's task (its stream time and
    current record read directly), or None to go through ``context``.
    """

    __slots__ = (
        "interval", "purge_slack", "purge_after", "id_of", "per_key", "forward", "task",
        "context", "put", "entries", "pending", "in_store", "in_order", "expiry", "_pushed",
        "forwarded", "dropped", "late", "pending_entries", "pending_bytes", "lookup",
    )  # fmt: skip

    def __init__(
        self,
        *,
        interval: int,
        purge_slack: int,
        purge_after: int,
        id_of: Callable[[Any, Any], Any],
        per_key: bool,
        forward: Callable[[Record], None],
        task: Any,
        context: ProcessorContext,
        put: Callable[[bytes, bytes | None], None] | None,
        entries: dict[MemoryKey, Entry],
        in_order: deque[tuple[int, MemoryKey, Entry]],
        in_store: set[MemoryKey],
    ) -> None:
        self.interval, self.purge_slack, self.purge_after = interval, purge_slack, purge_after
        self.id_of, self.per_key, self.forward = id_of, per_key, forward
        self.task, self.context, self.put = task, context, put
        # The expiry index: entries stored in timestamp order, as (timestamp, key, entry)
        # items (a queue, oldest first), and the others as (timestamp, n, key, entry) items (a
        # heap; n orders equal timestamps, as keys of different types cannot be compared). An
        # item is current while its entry object is the one in `entries`.
        self.entries, self.in_order, self.in_store = entries, in_order, in_store
        self.expiry: list[tuple[int, int, MemoryKey, Entry]] = []
        self._pushed = itertools.count()
        # Writes waiting for the commit (None: a delete), and the keys the store's view holds
        # (committed, or handed over since): an expired id not among them was never handed
        # over, and its put is dropped instead of followed by a delete.
        self.pending: dict[MemoryKey, Entry | None] = {}
        # The held writes as the store counts staged ones: one per id (a put expired before
        # it was handed over is gone), its key and a put's 16-byte entry.
        self.pending_entries = self.pending_bytes = 0
        self.forwarded = self.dropped = 0
        self.late = 0  # forwarded but too old to open a window
        # Set by the processor once `entries` no longer holds every stored id: the store's
        # answer for an id missing from `entries`.
        self.lookup: Callable[[MemoryKey], Entry | None] | None = None

    def process(self, record: Record) -> None:
        # should_forward(), inlined: this runs once per record. The id's in-memory key is
        # memory_key(id), inlined for the common cases: a str id, and the (str key, str id)
        # pair of deduplicate_by_key_value.
        key = record[0]
        if self.per_key:
            identity = None if key is None else self.id_of(key, record[1])
            if identity is not None:
                if type(key) is str and type(identity) is str:
                    id_key: MemoryKey = (key, identity)
                else:
                    id_key = memory_key((key, identity))
        else:
            identity = self.id_of(key, record[1])
            if identity is not None:
                id_key = identity if type(identity) is str else memory_key(identity)
        if identity is None:
            self.forwarded += 1
            self.forward(record)
            return
        task = self.task
        if task is not None:
            stream_time = task.stream_time
            current = task.current
            offset = None if current is None else current[2]
        else:
            context = self.context
            stream_time = context.stream_time
            offset = context.offset
        interval = self.interval
        entries = self.entries
        stored = entries.get(id_key)
        if stored is None and self.lookup is not None:
            stored = self.lookup(id_key)
        timestamp = record[2]
        if stored is not None:
            entry_ts, entry_offset = stored
            if not (
                stream_time - entry_ts > interval
                or entry_ts - timestamp > interval
                or (offset is not None and offset == entry_offset)
            ):
                self.dropped += 1
                return
        horizon = stream_time - interval
        in_order = self.in_order
        if timestamp >= horizon:
            entry = entries[id_key] = (timestamp, NO_OFFSET if offset is None else offset)
            if self.put is None:
                pending = self.pending
                before = pending.get(id_key, _ABSENT)
                pending[id_key] = entry
                if before is _ABSENT:  # a new held write: its key and the entry's 16 bytes
                    self.pending_entries += 1
                    # held_size(id_key) + 16, inlined for the (str key, str id) pair.
                    self.pending_bytes += (
                        len(id_key[0]) + len(id_key[1]) + 28
                        if type(id_key) is tuple
                        else held_size(id_key) + 16
                    )
                elif before is None:  # a held delete becomes a put again
                    self.pending_bytes += 16
            else:
                self.put(store_key(id_key), _pack(*entry))
            if not in_order or timestamp >= in_order[-1][0]:
                in_order.append((timestamp, id_key, entry))
            else:
                heapq.heappush(self.expiry, (timestamp, next(self._pushed), id_key, entry))
        else:
            self.late += 1
        self.forwarded += 1
        self.forward(record)
        if horizon > self.purge_after:
            self.purge(horizon)

    def purge(self, horizon: int) -> None:
        """Delete the entries older than ``horizon``; the next purge waits until the horizon
        has passed this one by the slack (``purge_after``)."""
        self.purge_after = horizon + self.purge_slack
        if self.put is not None:
            put = self.put
            for id_key in self._expire(horizon):
                put(store_key(id_key), None)  # a delete
            return
        pending, in_store = self.pending, self.in_store
        entries = nbytes = 0
        for id_key in self._expire(horizon):
            size = (
                len(id_key[0]) + len(id_key[1]) + 12
                if type(id_key) is tuple
                else held_size(id_key)
            )  # fmt: skip
            before = pending.get(id_key, _ABSENT)
            if id_key in in_store:
                pending[id_key] = None
                if before is _ABSENT:  # a new held delete: its key
                    entries += 1
                    nbytes += size
                elif before is not None:  # a held put becomes a delete: its entry goes
                    nbytes -= 16
            elif before is not _ABSENT:  # never handed over: nothing to delete
                del pending[id_key]
                entries -= 1
                nbytes -= size if before is None else size + 16
        self.pending_entries += entries
        self.pending_bytes += nbytes

    def _expire(self, horizon: int) -> list[MemoryKey]:
        """Take the entries older than ``horizon`` out of the index and the dict, and return
        their keys (a list: a run of thousands is cheaper to append than to yield); an index
        item whose entry was replaced since (the id stored again) only leaves the index."""
        in_order, expiry, entries = self.in_order, self.expiry, self.entries
        expired: list[MemoryKey] = []
        append, popleft, get = expired.append, in_order.popleft, entries.get
        while in_order and in_order[0][0] < horizon:
            _, id_key, entry = popleft()
            if get(id_key) is entry:
                del entries[id_key]
                append(id_key)
        pop = heapq.heappop
        while expiry and expiry[0][0] < horizon:
            _, _, id_key, entry = pop(expiry)
            if get(id_key) is entry:
                del entries[id_key]
                append(id_key)
        return expired


class DeduplicationProcessor(Processor):
    """Forwards the first of duplicates; see :func:`should_forward` and the module docstring.

    ``id_of(key, value)`` returns the record's id or None (None: forwarded, no trace kept).
    With ``per_key`` (deduplicate_by_key_value) the id is ``(key, id_of(key, value))``, None
    when either is None.
    """

    def __init__(
        self,
        store_name: str,
        interval_ms: int,
        id_of: Callable[[Any, Any], Any],
        per_key: bool = False,
    ) -> None:
        self.store_name = store_name
        self.interval = interval_ms
        self.id_of = id_of
        self.per_key = per_key
        self._core: _DedupCore | _native.Core | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._state_store = engine_store(context, self.store_name)
        self.store = self._state_store.transaction
        self._dedup_store = DedupStore(self.store, self.interval)
        saved = self.store.get(_META_KEY)
        if saved is not None:
            stream_time = _unpack(saved)[0]
            # The last commit purged the store's index up to its horizon.
            self._dedup_store.purged_to = stream_time - self.interval
            restore = getattr(context, "restore_stream_time", None)
            if restore is not None:
                restore(stream_time)
        self._saved_stream_time: int | None = None
        self._dedup_store.index_missing_entries()
        # The processor's budget (module docstring); past `_spill_at` it hands its held writes
        # to the store's transaction and empties memory. A budget of 0 keeps no id in memory
        # past a commit and never spills.
        self.budget = dedup_budget(context)
        self._spill_at = self.budget - self.budget // 16 if self.budget > 0 else None
        self.peak_memory_bytes = 0
        self.spills = 0
        # Every stored id, when they fit in half the budget (the other half is for the ids
        # of the next commits); else none, and misses ask the store.
        loaded = self._dedup_store.load(self.budget // 2)
        entries: dict[MemoryKey, Entry] = {} if loaded is None else loaded
        in_order: deque[tuple[int, MemoryKey, Entry]] = deque(
            sorted(((entry[0], key, entry) for key, entry in entries.items()), key=itemgetter(0))
        )
        # Under READ_COMMITTED the writes wait in the core until before_commit().
        buffered = self.store.isolation_level is IsolationLevel.READ_COMMITTED
        # Under READ_UNCOMMITTED: the store keys written since the last commit, and the
        # timestamp of each one's last put, for their index keys at the commit.
        self._written: dict[bytes, int] = {}
        # The runtime's own context lets the per-record path read the task's stream time and
        # current record directly, and call a single child without the forward loop; any
        # other ProcessorContext goes through the protocol.
        found = engine(context)
        task = None if found is None else found.task
        forward = single_forward(context)
        # Purging waits until the horizon has moved on by a sliver of the interval since the
        # last purge: an entry just past the horizon can no longer cause a drop (the rule reads
        # its timestamp), so it may stay a little longer, and one purge then takes out a run
        # of entries instead of one call per record taking out one or two. before_commit()
        # purges to the exact horizon, so what is committed does not depend on when purges ran.
        purge_slack = self.interval // _PURGE_SLACK_FRACTION
        in_store: set[MemoryKey] = set(entries) if buffered else set()
        if buffered and task is not None and _native is not None and NATIVE_CORE:
            self._core = _native.Core(
                interval=self.interval, purge_slack=purge_slack, purge_after=_NEVER_PURGED,
                id_of=self.id_of, per_key=self.per_key, forward=forward, task=task,
                memory_key=memory_key, entries=entries, in_order=in_order, in_store=in_store,
            )  # fmt: skip
        else:
            self._core = _DedupCore(
                interval=self.interval, purge_slack=purge_slack, purge_after=_NEVER_PURGED,
                id_of=self.id_of, per_key=self.per_key, forward=forward, task=task,
                context=context, put=None if buffered else self._put_through, entries=entries,
                in_order=in_order, in_store=in_store,
            )  # fmt: skip
        # While memory does not hold every stored id, a miss asks the store; until when: no
        # id outside memory can cause a drop once the horizon has passed the stream time at
        # which memory last let ids go (``_lookup_until``, module docstring). Every stored
        # entry's timestamp is at most that stream time (a saved one, here).
        self._lookup_until: int | None = None
        if loaded is None:
            self._core.lookup = self._dedup_store.lookup
            self._lookup_until = None if saved is None else _unpack(saved)[0]
        self._key_bytes = mean_key_bytes(entries)
        # The task calls the core's process directly: no Python frame of this class per
        # record.
        self.process = self._core.process  # type: ignore[method-assign]

    def process(self, record: Record) -> None:
        self._initialised().process(record)

    def _initialised(self) -> _DedupCore | _native.Core:
        if self._core is None:
            raise RuntimeError(f"{type(self).__name__} used before init()")
        return self._core

    # Forwards the record it was given, unchanged, or nothing: a sink fed only through
    # deduplications writes the bytes it read (sink_writers.written_as_read).
    forwards_unchanged = True

    def held_writes(self) -> dict[str, Callable[[], bool]]:
        return {self.store_name: self.uncommitted_limit_exceeded}

    def uses_record_cache(self) -> bool:
        return True  # its ids in memory

    def task_metrics(self) -> dict[str, int]:
        return {f"dedup_{name}": value for name, value in self.metrics().items()}

    def memory_bytes(self) -> int:
        """What memory holds of the ids now, in bytes: the entries, their index items, the
        writes held for the commit and the in-store set, counted per object as CPython
        allocates them (dedup_store.py) with the keys' mean size. This is what the budget
        bounds."""
        core = self._initialised()
        return (
            len(core.entries) * (ENTRY_BYTES + self._key_bytes)
            + len(core.in_order) * INDEX_ITEM_BYTES
            + len(core.expiry) * HEAP_ITEM_BYTES
            + (len(core.pending) + len(core.in_store) + len(self._written)) * SLOT_BYTES
        )

    def uncommitted_limit_exceeded(self) -> bool:
        """The store's uncommitted limits, counting the writes still waiting here (the task
        asks this instead of the store, between two records). Being asked is also when the
        processor keeps to its budget: past it, it spills (``_spill``) before answering."""
        core = self._initialised()
        if core.lookup is not None:
            self._stop_lookups_once_complete(core)
        if self._spill_at is not None:
            used = self.memory_bytes()
            if used > self._spill_at:
                self._spill()
                used = self.memory_bytes()
            if used > self.peak_memory_bytes:
                self.peak_memory_bytes = used
        # Each held write becomes two store writes: a put with its index key, a delete with
        # its index key's (at the commit's purge of the index).
        return self._state_store.uncommitted_limit_exceeded(
            2 * core.pending_entries, 2 * core.pending_bytes
        )

    def _spill(self) -> None:
        """Memory is nearly at the budget between two commits: hand the held writes to the
        store's transaction (where the uncommitted limits bound them) and empty memory of the
        ids. The task asks between two records (``uncommitted_limit_exceeded``)."""
        core = self._initialised()
        horizon = self.context.stream_time - self.interval
        core.purge(horizon)  # the exact horizon: nothing expired is handed over
        self._hand_over_held(horizon)
        self._forget_entries()
        self.spills += 1

    def _hand_over_held(self, horizon: int) -> None:
        """The writes held for the commit to the store's transaction: under exactly once the
        pending puts and deletes with their index keys, under at least once the index keys of
        the puts already written."""
        core = self._initialised()
        if core.pending:
            self._key_bytes = mean_key_bytes(core.pending, self._key_bytes)
        if core.pending or core.pending_entries:
            native = _native is not None and isinstance(core, _native.Core)
            self._dedup_store.hand_over(
                core.pending, core.in_store, _native.handed_over if native else None
            )
            core.pending.clear()
            core.pending_entries = core.pending_bytes = 0
        if self._written:
            self._key_bytes = mean_key_bytes(map(key_from_store, self._written), self._key_bytes)
            self._dedup_store.index_written(self._written, horizon)
            self._written.clear()

    def _put_through(self, stored: bytes, value: bytes | None) -> None:
        """READ_UNCOMMITTED: a write to the store at once; a put's index key waits for the
        commit (``DedupStore.index_written``)."""
        self.store.put(stored, value)
        if value is not None:
            self._written[stored] = _unpack(value)[0]

    def before_commit(self) -> None:
        """Hand the waiting writes to the store, purge the store's index, save the task's
        stream time with the entries it explains, and keep memory within the budget (the
        task calls this before committing or preparing)."""
        core = self._initialised()
        stream_time = self.context.stream_time
        horizon = stream_time - self.interval
        core.purge(horizon)
        self._hand_over_held(horizon)
        self._dedup_store.purge(horizon)
        if stream_time != self._saved_stream_time:
            self.store.put(_META_KEY, _pack(stream_time, 0))
            self._saved_stream_time = stream_time
        used = self.memory_bytes()
        self.peak_memory_bytes = max(self.peak_memory_bytes, used)
        if used > self.budget // 2 and core.entries:
            self._forget_entries()
        elif core.lookup is not None:
            self._stop_lookups_once_complete(core)

    def _forget_entries(self) -> None:
        """Empty memory of the ids (all in the store's transaction, nothing held: this runs
        right after the hand-over); from now on a miss of the entries asks the store."""
        core = self._initialised()
        core.entries.clear()
        core.in_order.clear()
        del core.expiry[:]
        core.in_store.clear()
        core.lookup = self._dedup_store.lookup
        # Every entry let go has a timestamp at most the stream time (that of a record seen).
        self._lookup_until = self.context.stream_time

    def _stop_lookups_once_complete(self, core: _DedupCore | _native.Core) -> None:
        """Misses stop asking the store once no entry outside memory can cause a drop: every
        such entry is at most ``_lookup_until`` old, and KIP-655's rule forwards past an entry
        that stream time has passed by more than the interval. Memory holds every id stored
        since, so a miss is a new id again."""
        until = self._lookup_until
        if until is not None and self.context.stream_time - self.interval > until:
            core.lookup = None
            self._lookup_until = None

    def metrics(self) -> dict[str, int]:
        core = self._core
        if core is None:
            return {"forwarded": 0, "dropped": 0, "late": 0, "spills": 0}
        return {"forwarded": core.forwarded, "dropped": core.dropped, "late": core.late,
                "spills": self.spills}  # fmt: skip


def dedup_budget(context: ProcessorContext) -> int:
    """The deduplication's memory budget: its share of its task's
    ``statestore.cache.max.bytes`` (0 in a context that has none)."""
    return int(getattr(context, "cache_max_bytes", 0))
