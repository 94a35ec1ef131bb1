"""Transactions (KIP-892): isolated uncommitted writes, committed atomically with offsets.

A transaction holds its writes in `Overlay`s (one per column family) and hands them to
`StateDB.commit`, which writes them with the offsets and the status marker as one batch.

- READ_COMMITTED (exactly-once): nothing leaves the transaction before `commit`; reads inside
  it see its own writes merged over committed data; everyone else sees committed data only.
- READ_UNCOMMITTED (at-least-once): every write operation is applied to RocksDB at once (as
  one small atomic batch), so every reader sees it; `commit` then stores the offsets and the
  status marker, and `close` cannot take applied writes back.

Transactions are not thread-safe: a task writes through one transaction from one thread.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from types import TracebackType

from streamplatform.state.checks import check_bytes
from streamplatform.state.db import Offsets, StateDB, normalize_offsets
from streamplatform.state.errors import StateStoreError
from streamplatform.state.overlay import ABSENT, Overlay, StagedWrites, merge_with_stored

__all__ = [
    "DATA",
    "IsolationLevel",
    "KeyValueTransaction",
    "Transaction",
    "check_bounds",
    "prefix_end",
    "scan",
]


class IsolationLevel(enum.Enum):
    """What readers outside a transaction see of its uncommitted writes (KIP-892)."""

    READ_COMMITTED = "read_committed"
    """Nothing until commit. Used under processing.guarantee=exactly_once_v2."""
    READ_UNCOMMITTED = "read_uncommitted"
    """Everything, at once. Used under processing.guarantee=at_least_once."""


class Transaction:
    """Writes staged per column family, committed or prepared as one unit, or discarded."""

    def __init__(
        self,
        db: StateDB,
        staged: tuple[StagedWrites, ...],
        isolation_level: IsolationLevel,
        before_persist: Callable[[], None] | None = None,
    ) -> None:
        self._db = db
        self._staged = staged
        # Lets a store stage derived state (a versioned store's stream time) once per write-out.
        self._before_persist = before_persist
        self._isolation_level = isolation_level
        self._apply_each_write = isolation_level is IsolationLevel.READ_UNCOMMITTED
        # Under READ_UNCOMMITTED writes leave the overlay at once; these count them until commit.
        self._applied_entries = 0
        self._applied_bytes = 0
        # Writes unstaged again (see KeyValueTransaction) still count as uncommitted until the
        # next commit, as they did when they stayed staged: the limits cut batches as before.
        self._unstaged_entries = 0
        self._unstaged_bytes = 0
        self._closed = False

    @property
    def isolation_level(self) -> IsolationLevel:
        return self._isolation_level

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StateStoreError(f"transaction on state store {self._db.path} is closed")

    def end_write(self) -> None:
        """End one write operation: under READ_UNCOMMITTED, apply what it staged now."""
        if self._apply_each_write:
            self._stage_derived()
            entries, nbytes = self._staged_sizes()
            self._db.apply(self._staged)
            self._applied_entries += entries
            self._applied_bytes += nbytes
            self._clear()

    def _stage_derived(self) -> None:
        if self._before_persist is not None:
            self._before_persist()

    def _staged_sizes(self) -> tuple[int, int]:
        entries = nbytes = 0
        for writes in self._staged:
            entries += len(writes)
            nbytes += writes.num_bytes
        return entries, nbytes

    def _clear(self) -> None:
        for writes in self._staged:
            writes.clear()
        self._unstaged_entries = self._unstaged_bytes = 0

    def staged_entries(self) -> list[tuple[str, bytes, bytes | None]]:
        """What a commit would write now, as (column family, key, value); None deletes."""
        self._stage_derived()
        return [entry for writes in self._staged for entry in writes.entries()]

    def approximate_num_uncommitted_entries(self) -> int:
        """Writes not yet committed (distinct keys staged, plus writes applied since commit)."""
        return self._staged_sizes()[0] + self._applied_entries + self._unstaged_entries

    def approximate_num_uncommitted_bytes(self) -> int:
        """Key + value bytes not yet committed; a delete counts its key."""
        return self._staged_sizes()[1] + self._applied_bytes + self._unstaged_bytes

    def uncommitted_exceeds(
        self,
        max_records: int | None,
        max_bytes: int | None,
        extra_entries: int = 0,
        extra_bytes: int = 0,
    ) -> bool:
        """True when the uncommitted entries (plus `extra_entries`, writes not handed over
        yet) pass `max_records` or their bytes (plus `extra_bytes`) `max_bytes` (None: no
        limit). The same numbers as the two approximations above, in one cheap call: the
        runtime asks after every few records."""
        staged = self._staged
        if len(staged) == 1:
            writes = staged[0]
            entries, nbytes = len(writes), writes.num_bytes
        else:
            entries, nbytes = self._staged_sizes()
        entries += extra_entries
        nbytes += extra_bytes
        return (
            max_records is not None
            and entries + self._applied_entries + self._unstaged_entries > max_records
        ) or (
            max_bytes is not None
            and nbytes + self._applied_bytes + self._unstaged_bytes > max_bytes
        )

    def commit(self, offsets: Offsets | None = None) -> None:
        """Write everything staged plus `offsets` atomically; the transaction stays open, empty.

        `offsets` maps TopicPartition (or a (topic, partition) tuple) to the offset to store;
        partitions not named keep their previously committed offset.
        """
        self._check_open()
        normalized = normalize_offsets(offsets)
        self._stage_derived()
        self._db.commit(self._staged, normalized)
        self._clear()
        self._applied_entries = self._applied_bytes = 0

    def prepare(self, batch_id: int, offsets: Offsets | None = None) -> None:
        """Persist the staged writes and `offsets` as batch `batch_id` without applying them.

        The store's `settle(batch_id, committed)` later applies or discards them, also after a
        crash and reopen. Only READ_COMMITTED transactions can prepare: under READ_UNCOMMITTED
        the writes are already applied.
        """
        self._check_open()
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise ValueError(f"batch_id must be an int >= 0, got {batch_id!r}")
        if self._apply_each_write:
            raise StateStoreError(
                f"state store {self._db.path}: prepare needs IsolationLevel.READ_COMMITTED; "
                "READ_UNCOMMITTED writes are applied as they happen"
            )
        normalized = normalize_offsets(offsets)
        self._stage_derived()
        self._db.prepare(batch_id, self._staged, normalized)
        self._clear()

    def close(self) -> None:
        """Discard what is staged and end the transaction (applied writes stay applied)."""
        self._clear()
        self._applied_entries = self._applied_bytes = 0
        self._closed = True

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


DATA = "data"
"""The column family holding a key-value store's data."""


class KeyValueTransaction(Transaction):
    """A transaction on a key-value store: bytes keys to bytes values, read-your-writes."""

    def __init__(self, db: StateDB, isolation_level: IsolationLevel) -> None:
        self._data = Overlay(DATA)
        super().__init__(db, (self._data,), isolation_level)
        self._stored = db.columns[DATA]
        # Keys this transaction put right after reading them as absent from committed data
        # ("fresh"), valid while the stored data stays at generation `_fresh_generation`.
        # Deleting a fresh key again unstages it rather than staging a delete: the committed
        # data does not hold it, so the delete would change nothing, and a deduplication store
        # puts and expires most of its ids within one transaction. `_missed` is the key of the
        # last read that found nothing (staged or committed), at `_missed_generation`.
        self._fresh: set[bytes] = set()
        self._fresh_generation = -1
        self._missed: bytes | None = None
        self._missed_generation = -1

    def get(self, key: bytes) -> bytes | None:
        """The value of `key` as this transaction sees it: its own writes, then committed data."""
        # The checks inline (check_bytes, _check_open): this runs once or twice per record.
        if not isinstance(key, bytes):
            check_bytes("key", key)
        if self._closed:
            self._check_open()
        value = self._data.writes.get(key, ABSENT)
        if value is ABSENT:
            value = self._stored.get(key)
            if value is None:
                self._missed = key
                self._missed_generation = self._db.generation
            return value
        return value  # type: ignore[return-value]

    def put(self, key: bytes, value: bytes | None) -> None:
        """Stage `key` = `value`; a None value deletes the key, as in Kafka Streams."""
        if not isinstance(key, bytes):
            check_bytes("key", key)
        if value is not None and not isinstance(value, bytes):
            check_bytes("value", value)
        if self._closed:
            self._check_open()
        if self._apply_each_write:
            self._data.put(key, value)
            self.end_write()
            return
        if value is None:
            fresh = self._fresh
            if fresh and key in fresh:
                fresh.discard(key)
                if self._fresh_generation == self._db.generation:
                    self._data.discard(key)  # never committed: nothing to delete
                    # Counted as the staged delete it replaces: one entry, its key's bytes.
                    self._unstaged_entries += 1
                    self._unstaged_bytes += len(key)
                    return
        elif key is self._missed:
            self._missed = None
            generation = self._db.generation
            if self._missed_generation == generation and key not in self._data.writes:
                if self._fresh_generation != generation:
                    self._fresh.clear()
                    self._fresh_generation = generation
                self._fresh.add(key)
        self._data.put(key, value)

    def delete(self, key: bytes) -> None:
        """Stage the deletion of `key`; it hides the stored value from this transaction's reads."""
        self.put(key, None)

    def keys(self, start: bytes, end: bytes) -> list[bytes]:
        """The keys ``range(start, end)`` gives, in order, as a list: no value is read, and
        only the staged keys in the range are put in order (an expiry's read of its time
        index, in a store that reads no other range)."""
        check_bytes("start", start)
        check_bytes("end", end)
        self._check_open()
        writes = self._data.writes
        staged = self._data.keys_between(start, end)
        stored = [key for key in stored_keys(self._db, start, end) if key not in writes]
        return sorted([key for key in staged if writes[key] is not None] + stored)

    def delete_range(self, start: bytes, end: bytes) -> int:
        """Delete every key with start <= key < end, as ``delete`` of each key that
        ``range(start, end)`` gives would, in one call, and return how many: a segmented
        window store dropping an expired segment. A key put after this transaction read it as
        absent leaves the transaction; every other key gets a staged delete, which the commit
        writes and logs as ``delete`` would. No value is read."""
        check_bytes("start", start)
        check_bytes("end", end)
        self._check_open()
        if self._apply_each_write:  # each delete applied at once, as delete does it
            keys = [key for key, _ in self.range(start, end)]
            for key in keys:
                self.put(key, None)
            return len(keys)
        data, generation = self._data, self._db.generation
        writes = data.writes
        # Committed keys not staged: each gets a staged delete. Read before the overlay
        # changes, as range would read them; keys only.
        stored = [key for key in stored_keys(self._db, start, end) if key not in writes]
        unstage = self._fresh if self._fresh_generation == generation else ()
        turned, gone = data.delete_between(start, end, unstage)
        if self._fresh:  # a deleted key is no longer one put after a read as absent
            for keys in (gone, turned, stored):
                self._fresh.difference_update(keys)
        # Counted as the staged deletes they replace, as `put` counts a fresh key's.
        self._unstaged_entries += len(gone)
        self._unstaged_bytes += sum(map(len, gone))
        data.delete_all(stored)
        return len(stored) + len(turned) + len(gone)

    def delete_each(self, keys: list[bytes]) -> None:
        """``delete`` each of ``keys`` (distinct), in one call: a window store's expiry, which
        deletes most of a commit's windows in it. A key put after this transaction read it
        as absent leaves the transaction; every other key gets a staged delete."""
        for key in keys:
            if type(key) is not bytes:
                check_bytes("key", key)
        self._check_open()
        if self._apply_each_write:
            for key in keys:
                self.put(key, None)
            return
        fresh = self._fresh
        if fresh:
            gone = [key for key in keys if key in fresh]
            if gone:
                fresh.difference_update(gone)
                if self._fresh_generation == self._db.generation:  # never committed
                    self._data.discard_all(gone)
                    # Counted as the staged deletes they replace, as `put` counts them.
                    self._unstaged_entries += len(gone)
                    self._unstaged_bytes += sum(map(len, gone))
                    unstaged = set(gone)
                    keys = [key for key in keys if key not in unstaged]
        self._data.delete_each(keys)

    def put_all(self, items: list[tuple[bytes, bytes | None]]) -> None:
        """``put(key, value)`` for each item, in order: one call for many writes (a commit's
        hand-over of what a processor held). Puts of bytes go to the overlay in bulk; a delete,
        a key just read as absent, anything to check or a write applied at once takes ``put``."""
        self._check_open()
        if self._apply_each_write:
            for key, value in items:
                self.put(key, value)
            return
        bulk: list[tuple[bytes, bytes]] = []
        missed = self._missed
        for key, value in items:
            if type(value) is bytes and type(key) is bytes and key is not missed:
                bulk.append((key, value))
                continue
            if bulk:
                self._data.put_all(bulk)
                bulk = []
            self.put(key, value)
            missed = self._missed
        if bulk:
            self._data.put_all(bulk)

    def drop_blind_deletes(self) -> int:
        """Unstage every staged delete of a key that committed data does not hold, and return
        how many went. Such a delete changes nothing (reads see no value either way), yet the
        commit would write it as a tombstone and ship it in the changelog: a deduplication or
        a window store on window close puts and expires most of its keys within one batch.
        One committed read per staged delete; run once, right before a commit or prepare."""
        self._check_open()
        stored = self._stored.get
        blind = [key for key, value in self._data.writes.items() if value is None
                 and stored(key) is None]  # fmt: skip
        self._data.discard_all(blind)
        # Counted as the staged deletes they were, as a fresh key's unstaged delete is.
        self._unstaged_entries += len(blind)
        self._unstaged_bytes += sum(map(len, blind))
        return len(blind)

    def range(
        self, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs with start <= key < end in key order; None leaves a side open.

        Merges this transaction's writes over committed data, as of this call: later writes
        and commits, here or elsewhere, do not change what the iterator yields.
        """
        check_bounds(start, end)
        self._check_open()
        return scan(self._db, self._data.sorted_items(start, end), start, end)

    def prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs whose key starts with `prefix`, in key order (see `range`)."""
        check_bytes("prefix", prefix)
        return self.range(prefix, prefix_end(prefix))

    def _clear(self) -> None:
        super()._clear()
        self._fresh = set()
        self._missed = None

    def close(self) -> None:
        if not self._closed:
            del self._stored  # the column object keeps the DB, and its lock, alive
        super().close()


def check_bounds(start: bytes | None, end: bytes | None) -> None:
    """Raise TypeError naming `start` or `end` when given and not bytes."""
    if start is not None:
        check_bytes("start", start)
    if end is not None:
        check_bytes("end", end)


def scan(
    db: StateDB, staged: list[tuple[bytes, bytes | None]], start: bytes | None, end: bytes | None
) -> Iterator[tuple[bytes, bytes]]:
    """Stored data of the ``data`` column family in [start, end), with `staged` merged over it."""
    stored = db.iterator(DATA)
    if start is None:
        stored.seek_to_first()
    else:
        stored.seek(start)
    return db.track(merge_with_stored(stored, staged, end))


def stored_keys(db: StateDB, start: bytes, end: bytes) -> list[bytes]:
    """The keys of the ``data`` column family's stored data in [start, end), in order."""
    stored = db.iterator(DATA)
    stored.seek(start)
    keys: list[bytes] = []
    while stored.valid():
        key = stored.key()
        if key >= end:
            break
        keys.append(key)
        stored.next()
    return keys


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with `prefix`; None when there is none."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
