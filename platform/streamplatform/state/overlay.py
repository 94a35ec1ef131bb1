"""Uncommitted writes held in memory, and ordered scans that merge them with stored data.

rocksdict has no WriteBatchWithIndex, so a transaction keeps its writes in plain dicts
(`Overlay`, one per column family) and builds the RocksDB WriteBatch only at commit. The
dict makes puts and point reads O(1). Its keys are sorted only when a range scan needs
them: a transaction that never scans never pays for ordering, and keys added after a scan
are appended and merged by the next scan's sort (one pass over two sorted runs).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Generator, Iterable, Mapping
from typing import Protocol

import rocksdict

__all__ = ["ABSENT", "Overlay", "StagedWrites", "merge_with_stored"]

# Keys added since the last scan that the next scan inserts one by one (more: one sort).
_INSERT_AT_MOST = 64

ABSENT = object()
"""Marks a key a transaction did not touch (None in `Overlay.writes` is a staged delete)."""


class StagedWrites(Protocol):
    """What a transaction needs from a group of staged writes (one or more column families)."""

    num_bytes: int
    """Approximate key + value bytes staged; a delete counts its key."""

    def __len__(self) -> int:
        """Approximate number of staged entries."""
        ...

    def entries(self) -> Iterable[tuple[str, bytes, bytes | None]]:
        """(column family, key, value) as stored in RocksDB; a None value deletes the key."""
        ...

    def write_to(
        self, batch: rocksdict.WriteBatch, handles: Mapping[str, rocksdict.ColumnFamily]
    ) -> None:
        """Add every staged write to `batch`."""
        ...

    def clear(self) -> None: ...


class Overlay:
    """Staged puts and deletes of one column family: key -> value, None for a delete."""

    __slots__ = ("column_family", "writes", "num_bytes", "_sorted_keys", "_sorted_upto")

    def __init__(self, column_family: str) -> None:
        self.column_family = column_family
        self.writes: dict[bytes, bytes | None] = {}
        self.num_bytes = 0
        """Key plus value sizes of the staged writes; a delete counts its key."""
        self._sorted_keys: list[bytes] | None = None
        self._sorted_upto = 0  # _sorted_keys[:_sorted_upto] is in order, the rest appended

    def __len__(self) -> int:
        return len(self.writes)

    def put(self, key: bytes, value: bytes | None) -> None:
        writes = self.writes
        old = writes.get(key, ABSENT)
        if old is ABSENT:
            self.num_bytes += len(key) if value is None else len(key) + len(value)
            if self._sorted_keys is not None:
                self._sorted_keys.append(key)
        else:
            self.num_bytes += (0 if value is None else len(value)) - (
                0 if old is None else len(old)  # type: ignore[arg-type]
            )
        writes[key] = value

    def discard(self, key: bytes) -> None:
        """Unstage `key` (a put or a delete) as if it had never been written."""
        old = self.writes.pop(key, ABSENT)
        if old is ABSENT:
            return
        self.num_bytes -= len(key) if old is None else len(key) + len(old)  # type: ignore[arg-type]
        if self._sorted_keys is not None:  # sorted again by the next scan
            self._sorted_keys = None
            self._sorted_upto = 0

    def sorted_items(
        self, start: bytes | None, end: bytes | None
    ) -> list[tuple[bytes, bytes | None]]:
        """A copy of the staged writes with start <= key < end, in key order."""
        keys = self._sorted_keys
        if keys is None:
            keys = self._sorted_keys = sorted(self.writes)
        elif self._sorted_upto < len(keys):
            added = len(keys) - self._sorted_upto
            if added <= _INSERT_AT_MOST:
                # A few keys since the last scan (a scan after every write or so, as a
                # stream-stream join's): each into place by bisection, not a pass over all
                # the staged keys, which made a batch of such scans quadratic.
                appended = keys[self._sorted_upto :]
                del keys[self._sorted_upto :]
                for key in appended:
                    insort(keys, key)
            else:
                keys.sort()
        self._sorted_upto = len(keys)
        lo = 0 if start is None else bisect_left(keys, start)
        hi = len(keys) if end is None else bisect_left(keys, end)
        writes = self.writes
        return [(key, writes[key]) for key in keys[lo:hi]]

    def entries(self) -> Iterable[tuple[str, bytes, bytes | None]]:
        name = self.column_family
        return ((name, key, value) for key, value in self.writes.items())

    def write_to(
        self, batch: rocksdict.WriteBatch, handles: Mapping[str, rocksdict.ColumnFamily]
    ) -> None:
        column_family = handles[self.column_family]
        put, delete = batch.put, batch.delete
        for key, value in self.writes.items():
            if value is None:
                delete(key, column_family)
            else:
                put(key, value, column_family)

    def clear(self) -> None:
        self.writes = {}
        self.num_bytes = 0
        self._sorted_keys = None
        self._sorted_upto = 0


def merge_with_stored(
    stored: rocksdict.RdictIter, staged: list[tuple[bytes, bytes | None]], end: bytes | None
) -> Generator[tuple[bytes, bytes], None, None]:
    """Yield stored and staged entries below `end` in key order; staged ones win, None hides.

    `stored` must already be positioned at the scan's start. RocksDB pins the data an
    iterator sees when the iterator is created, so the scan is a consistent snapshot even if
    a commit happens while it is consumed.
    """
    i, n = 0, len(staged)
    while stored.valid():
        key = stored.key()
        if end is not None and key >= end:
            break
        while i < n and staged[i][0] < key:
            staged_key, value = staged[i]
            i += 1
            if value is not None:
                yield staged_key, value
        if i < n and staged[i][0] == key:
            value = staged[i][1]
            i += 1
            if value is not None:
                yield key, value
        else:
            yield key, stored.value()
        stored.next()
    for staged_key, value in staged[i:]:
        if value is not None:
            yield staged_key, value
