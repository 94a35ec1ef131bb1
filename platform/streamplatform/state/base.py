"""What every store shares: its StateDB, its writing transaction, offsets, 2PC, limits, close.

Commit model: a store has one *writing transaction* (a task writes through one transaction
and commits it at each commit point). `commit(offsets)`, `prepare`, the uncommitted counters
and the limit check on the store act on it; a key-value store can open more transactions
with `new_transaction()`, each committed, counted and closed on its own.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import rocksdict

from streamplatform.records import TopicPartition
from streamplatform.state.checks import check_limit
from streamplatform.state.db import META, Offsets, StateDB, normalize_offsets
from streamplatform.state.errors import StateStoreError
from streamplatform.state.overlay import Overlay, StagedWrites
from streamplatform.state.rocks import StoreOptions
from streamplatform.state.transaction import IsolationLevel, Transaction

__all__ = ["StoreBase"]

# In the ``meta`` column family while the store holds part of a changelog batch applied in
# chunks (`apply_changelog_chunk`), until the last part writes the batch's offsets.
_CHANGELOG_PART = b"changelog_part_applied"


class _Wipe:
    """Deletes every stored key of some column families: one range delete per family from
    its first key to its last, plus the last key. A replace reads those two keys into Python,
    not one per stored key, however large the store."""

    num_bytes = 0

    def __init__(self, bounds: list[tuple[str, bytes, bytes]]) -> None:
        self._bounds = bounds  # (column family, first key, last key)

    def __len__(self) -> int:
        return len(self._bounds)

    def entries(self) -> Iterable[tuple[str, bytes, bytes | None]]:
        raise TypeError("a wipe is a range delete, written by a commit: it has no entries")

    def write_to(
        self, batch: rocksdict.WriteBatch, handles: Mapping[str, rocksdict.ColumnFamily]
    ) -> None:
        for column_family, first, last in self._bounds:
            batch.delete_range(first, last, handles[column_family])  # [first, last)
            batch.delete(last, handles[column_family])

    def clear(self) -> None:
        self._bounds = []


class StoreBase:
    """A RocksDB-backed store whose writes go through transactions (KIP-892)."""

    KIND: ClassVar[str]
    """Recorded in the store's metadata so a directory is never opened as the wrong kind."""
    COLUMN_FAMILIES: ClassVar[tuple[str, ...]]

    def __init__(
        self,
        path: str | os.PathLike[str],
        isolation_level: IsolationLevel,
        options: StoreOptions | None,
        max_uncommitted_records: int | None,
        max_uncommitted_bytes: int | None,
    ) -> None:
        if not isinstance(isolation_level, IsolationLevel):
            raise TypeError(f"isolation_level must be an IsolationLevel, got {isolation_level!r}")
        if options is not None and not isinstance(options, StoreOptions):
            raise TypeError(f"options must be StoreOptions, got {type(options).__name__}")
        self._max_records = check_limit("max_uncommitted_records", max_uncommitted_records)
        self._max_bytes = check_limit("max_uncommitted_bytes", max_uncommitted_bytes)
        self._isolation_level = isolation_level
        self._options = options or StoreOptions()
        self._db = StateDB(Path(path), self.KIND, self.COLUMN_FAMILIES, self._options)
        self._transactions: weakref.WeakSet[Transaction] = weakref.WeakSet()
        self._writer: Transaction | None = None

    def _new_transaction(self) -> Transaction:
        raise NotImplementedError

    def _open_transaction(self) -> Transaction:
        if self._db.closed:
            raise StateStoreError(f"state store {self._db.path} is closed")
        transaction = self._new_transaction()
        self._transactions.add(transaction)
        return transaction

    def _writing_transaction(self) -> Transaction:
        if self._writer is None or self._writer.closed:
            self._writer = self._open_transaction()
        return self._writer

    @property
    def path(self) -> Path:
        return self._db.path

    def rocksdb_metrics(self) -> dict[str, int]:
        """Kafka Streams' RocksDB metrics of the store (memtables, keys, block cache)."""
        return self._db.rocksdb_metrics(self.COLUMN_FAMILIES)

    @property
    def isolation_level(self) -> IsolationLevel:
        return self._isolation_level

    @property
    def options(self) -> StoreOptions:
        """The options the store was opened with."""
        return self._options

    @property
    def closed(self) -> bool:
        return self._db.closed

    @property
    def commit_sequence(self) -> int:
        """The status marker: how many commits (and committed settles) the store has applied."""
        return self._db.commit_sequence

    @property
    def prepared_batch_id(self) -> int | None:
        """The batch prepared and not yet settled, also after a crash and reopen; else None."""
        return self._db.prepared_batch_id

    def committed_offset(self, topic_partition: TopicPartition | tuple[str, int]) -> int | None:
        """The offset stored with the last commit for `topic_partition`, None if none."""
        return self._db.committed_offset(topic_partition)

    def committed_offsets(self) -> dict[TopicPartition, int]:
        """Every committed offset of the store."""
        return self._db.committed_offsets()

    def commit(self, offsets: Offsets | None = None) -> None:
        """Commit the writing transaction with `offsets`, atomically (see Transaction.commit)."""
        self._writing_transaction().commit(offsets)
        self._after_commit()

    def prepare(self, batch_id: int, offsets: Offsets | None = None) -> None:
        """Durably stage the writing transaction as batch `batch_id` (see Transaction.prepare)."""
        self._writing_transaction().prepare(batch_id, offsets)
        self._after_prepare()

    def settle(self, batch_id: int, committed: bool) -> bool:
        """Apply (committed=True) or discard prepared batch `batch_id`, with its offsets.

        Returns True when the prepared batch was applied or discarded, False when there was
        nothing to settle (nothing prepared, or `batch_id` already settled the same way), so
        settling again after a retry is harmless. Raises StateStoreError for a batch id other
        than the prepared one, or for an outcome contradicting the one already recorded.
        """
        if isinstance(batch_id, bool) or not isinstance(batch_id, int):
            raise TypeError(f"batch_id must be an int, got {batch_id!r}")
        if not isinstance(committed, bool):
            raise TypeError(f"committed must be a bool, got {committed!r}")
        self._check_open()
        changed = self._db.settle(batch_id, committed)
        if changed:
            self._after_settle()
        return changed

    def staged_writes(self) -> list[tuple[str, bytes, bytes | None]]:
        """The writing transaction's staged writes as ``(column family, key, value)`` (value
        None = delete): what the Spark runtime ships as the batch's changelog. Only
        READ_COMMITTED transactions stage; READ_UNCOMMITTED writes are applied already."""
        return self._writing_transaction().staged_entries()

    def apply_changelog(
        self, writes: Iterable[tuple[str, bytes, bytes | None]], offsets: Offsets | None = None
    ) -> None:
        """Apply writes captured by `staged_writes` (of this store's kind, elsewhere) and
        `offsets` in one atomic commit: how a restore or a standby replays the changelog.
        Also the last part of a batch applied in chunks (`apply_changelog_chunk`): the one
        that writes the batch's offsets."""
        self._check_open()
        self._commit_changelog(_overlays(writes), offsets)

    def replace_with_changelog(
        self, writes: Iterable[tuple[str, bytes, bytes | None]], offsets: Offsets | None = None
    ) -> None:
        """Make the committed data exactly ``writes`` (a snapshot of a store of this kind, as
        ``staged_writes`` entries), with ``offsets``, in one atomic commit: every stored key
        that ``writes`` does not put is deleted. How a restore brings a copy that is older
        than the changelog's snapshot up to it (the snapshot keeps no deletes)."""
        self._check_open()
        self._commit_changelog([self._wipe(), *_overlays(writes)], offsets)

    def apply_changelog_chunk(
        self, writes: Iterable[tuple[str, bytes, bytes | None]], *, replace: bool = False
    ) -> None:
        """Apply part of a changelog batch too large for one write (a snapshot of millions of
        keys), in one atomic commit without offsets; ``replace``: delete every stored key
        first (the first part of a `replace_with_changelog`). `apply_changelog` with the
        batch's offsets writes its last part.

        Until then the store keeps its committed offsets while its data is part of the way to
        the batch, and `changelog_part_applied` says so: only a restore that applies the
        whole batch again may use the store (changelog.replay)."""
        self._check_open()
        part = Overlay(META)
        part.put(_CHANGELOG_PART, b"\x01")
        staged: list[StagedWrites] = [self._wipe()] if replace else []
        self._db.commit([*staged, *_overlays(writes), part], {})
        self._after_changelog_chunk()

    @property
    def changelog_part_applied(self) -> bool:
        """True while the store holds part of a changelog batch (`apply_changelog_chunk`)
        whose last part, with the offsets, is not written: its data is then neither that of
        its committed offsets nor the batch's, also after a crash and reopen."""
        self._check_open()
        return self._db.columns[META].get(_CHANGELOG_PART) is not None

    def _commit_changelog(self, staged: list[StagedWrites], offsets: Offsets | None) -> None:
        applied = normalize_offsets(offsets)
        if self.changelog_part_applied:  # this commit writes the offsets: the batch is whole
            done = Overlay(META)
            done.put(_CHANGELOG_PART, None)
            staged.append(done)
        self._db.commit(staged, applied)
        self._after_settle()

    def _wipe(self) -> _Wipe:
        """What deletes every stored key of the store's data column families."""
        bounds = []
        for column_family in self.COLUMN_FAMILIES:
            stored = self._db.iterator(column_family)
            stored.seek_to_first()
            if not stored.valid():
                continue
            first = stored.key()
            stored.seek_to_last()
            bounds.append((column_family, first, stored.key()))
        return _Wipe(bounds)

    def approximate_num_uncommitted_entries(self) -> int:
        """Uncommitted writes of the writing transaction (distinct keys staged)."""
        writer = self._writer
        return 0 if writer is None else writer.approximate_num_uncommitted_entries()

    def approximate_num_uncommitted_bytes(self) -> int:
        """Uncommitted key + value bytes of the writing transaction; a delete counts its key."""
        writer = self._writer
        return 0 if writer is None else writer.approximate_num_uncommitted_bytes()

    def uncommitted_limit_exceeded(self, extra_entries: int = 0, extra_bytes: int = 0) -> bool:
        """True once the writing transaction passes a limit: time for the runtime to commit.

        The limits are `statestore.uncommitted.max.records` / `.max.bytes`, given to the
        constructor as `max_uncommitted_records` / `max_uncommitted_bytes` (None = unlimited).
        `extra_entries` / `extra_bytes`: writes a caller holds for the store but has not
        handed to it yet. Cheap enough to ask after every record.
        """
        writer = self._writer
        if writer is None:
            return (self._max_records is not None and extra_entries > self._max_records) or (
                self._max_bytes is not None and extra_bytes > self._max_bytes
            )
        return writer.uncommitted_exceeds(
            self._max_records, self._max_bytes, extra_entries, extra_bytes
        )

    def _check_open(self) -> None:
        if self._db.closed:
            raise StateStoreError(f"state store {self._db.path} is closed")

    def _after_commit(self) -> None:
        """Called after the writing transaction committed."""

    def _after_prepare(self) -> None:
        """Called after the writing transaction prepared a batch."""

    def _after_settle(self) -> None:
        """Called after a prepared batch was applied or discarded, and after a changelog
        batch was applied."""

    def _after_changelog_chunk(self) -> None:
        """Called after part of a changelog batch was applied (`apply_changelog_chunk`)."""
        self._after_settle()

    def close(self) -> None:
        """Discard uncommitted writes, end open scans and release the directory."""
        for transaction in list(self._transactions):
            transaction.close()
        self._writer = None
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _overlays(writes: Iterable[tuple[str, bytes, bytes | None]]) -> list[StagedWrites]:
    """Changelog writes ``(column family, key, value)`` staged per column family, in order."""
    staged: dict[str, Overlay] = {}
    for column_family, key, value in writes:
        if column_family not in staged:
            staged[column_family] = Overlay(column_family)
        staged[column_family].put(key, value)
    return list(staged.values())
