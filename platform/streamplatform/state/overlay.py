"""Uncommitted writes held in memory, and ordered scans that merge them with stored data.

rocksdict has no WriteBatchWithIndex, so a transaction keeps its writes in plain dicts
(`Overlay`, one per column family) and builds the RocksDB WriteBatch only at commit. The
dict makes puts and point reads O(1). Its keys are sorted only when a range scan needs
them: a transaction that never scans never pays for ordering. Keys added after a scan wait
in a list; the next scan puts a few of them into place (`SortedKeys`: chunks of a few
hundred keys, so an insertion moves one chunk, not every key staged) or sorts everything
again when many came.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Container, Generator, Iterable, Mapping
from operator import itemgetter
from typing import Protocol

import rocksdict

__all__ = ["ABSENT", "Overlay", "StagedWrites", "merge_with_stored"]

# Keys added since the last scan that the next scan inserts one by one; more than this (and
# more than 1/8 of the keys already in order) are sorted in with everything in one sort.
_INSERT_AT_MOST = 64
# SortedKeys' chunk size: a chunk splits in two above twice this.
_CHUNK = 256

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


class SortedKeys:
    """Keys in order, as a list of sorted chunks: inserting or removing a key moves the keys
    of one chunk (at most 2 x ``_CHUNK``), where one flat list moved half the staged keys.
    Staging hundreds of thousands of keys with a scan between writes (a windowed aggregation
    on window close writes its store and reads a key's windows per record) made a flat list
    quadratic."""

    __slots__ = ("_chunks", "_lasts", "_chunk")

    def __init__(self, keys: list[bytes], chunk: int) -> None:
        """``keys``: sorted, no duplicates; a chunk splits in two above twice ``chunk``."""
        self._chunks = [keys[at : at + chunk] for at in range(0, len(keys), chunk)]
        self._lasts = [part[-1] for part in self._chunks]  # each chunk's largest key
        self._chunk = chunk

    def insert(self, key: bytes) -> None:
        """Put ``key`` (not yet here) into place."""
        lasts, chunks = self._lasts, self._chunks
        if not chunks:
            chunks.append([key])
            lasts.append(key)
            return
        at = bisect_left(lasts, key)
        if at == len(lasts):  # above every key: the last chunk grows
            at -= 1
        chunk = chunks[at]
        insort(chunk, key)
        lasts[at] = chunk[-1]
        size = self._chunk
        if len(chunk) > 2 * size:
            chunks.insert(at + 1, chunk[size:])
            del chunk[size:]
            lasts.insert(at, chunk[-1])

    def insert_all(self, keys: list[bytes]) -> None:
        """``insert`` each of ``keys`` (none here yet, no repeats)."""
        for key in keys:
            self.insert(key)

    def remove(self, key: bytes) -> bool:
        """Take ``key`` out; False when it is not here."""
        lasts = self._lasts
        at = bisect_left(lasts, key)
        if at == len(lasts):
            return False
        chunk = self._chunks[at]
        index = bisect_left(chunk, key)
        if index == len(chunk) or chunk[index] != key:
            return False
        del chunk[index]
        if chunk:
            lasts[at] = chunk[-1]
        else:
            del self._chunks[at], lasts[at]
        return True

    def between(self, start: bytes | None, end: bytes | None) -> list[bytes]:
        """The keys with start <= key < end, in order (None: that side open)."""
        chunks = self._chunks
        at = 0 if start is None else bisect_left(self._lasts, start)
        out: list[bytes] = []
        while at < len(chunks):
            chunk = chunks[at]
            low = 0 if start is None else bisect_left(chunk, start)
            start = None  # the chunks after this one are all above start
            if end is not None and chunk[-1] >= end:
                out += chunk[low : bisect_left(chunk, end)]
                break
            out += chunk[low:]
            at += 1
        return out

    def items_between(
        self, start: bytes | None, end: bytes | None, writes: dict[bytes, bytes | None]
    ) -> list[tuple[bytes, bytes | None]]:
        """(key, ``writes[key]``) for the keys ``between(start, end)``."""
        return [(key, writes[key]) for key in self.between(start, end)]

    def remove_between(self, start: bytes | None, end: bytes | None) -> list[bytes]:
        """Take out the keys ``between(start, end)`` and return them, in order: one pass over
        the chunks they fill (a segment of a window store dropped whole), not a search each."""
        chunks, lasts = self._chunks, self._lasts
        at = 0 if start is None else bisect_left(lasts, start)
        removed: list[bytes] = []
        while at < len(chunks):
            chunk = chunks[at]
            low = 0 if start is None else bisect_left(chunk, start)
            high = len(chunk) if end is None else bisect_left(chunk, end)
            ended = high < len(chunk)  # a key at or above end: the chunks after it keep theirs
            removed += chunk[low:high]
            del chunk[low:high]
            if chunk:
                lasts[at] = chunk[-1]
                at += 1
            else:
                del chunks[at], lasts[at]
            if ended:
                break
        return removed


# The C twin of SortedKeys (state/_sorted_keys.c), the same results for less interpreter work
# per insertion and range read; tests/state/test_overlay.py holds the two together, and
# NATIVE_SORTED_KEYS lets them run the reference.
try:  # built with the package where a C compiler is available (setup.py)
    from streamplatform.state import _sorted_keys
except ImportError:  # pragma: no cover - depends on the build
    _sorted_keys = None  # type: ignore[assignment]
NATIVE_SORTED_KEYS = _sorted_keys is not None


def sorted_keys(keys: list[bytes]) -> SortedKeys:
    """A SortedKeys of ``keys`` (sorted, no duplicates) at the chunk size ``_CHUNK``: the C
    one when built and ``NATIVE_SORTED_KEYS``."""
    if NATIVE_SORTED_KEYS and _sorted_keys is not None:
        return _sorted_keys.SortedKeys(keys, _CHUNK)  # type: ignore[return-value]  # same API
    return SortedKeys(keys, _CHUNK)


class Overlay:
    """Staged puts and deletes of one column family: key -> value, None for a delete."""

    __slots__ = ("column_family", "writes", "num_bytes", "_sorted", "_added", "_in_order")

    def __init__(self, column_family: str) -> None:
        self.column_family = column_family
        self.writes: dict[bytes, bytes | None] = {}
        self.num_bytes = 0
        """Key plus value sizes of the staged writes; a delete counts its key."""
        self._sorted: SortedKeys | None = None  # None until a scan needs the order
        self._added: list[bytes] = []  # keys staged since the last scan, not yet in _sorted
        self._in_order = 0  # how many keys _sorted holds

    def __len__(self) -> int:
        return len(self.writes)

    def put(self, key: bytes, value: bytes | None) -> None:
        writes = self.writes
        old = writes.get(key, ABSENT)
        if old is ABSENT:
            self.num_bytes += len(key) if value is None else len(key) + len(value)
            if self._sorted is not None:
                self._added.append(key)
        else:
            self.num_bytes += (0 if value is None else len(value)) - (
                0 if old is None else len(old)  # type: ignore[arg-type]
            )
        writes[key] = value

    def put_all(self, items: list[tuple[bytes, bytes]]) -> None:
        """``put`` each (key, value) of ``items`` in order, none a delete: one call for many."""
        writes = self.writes
        keys = list(map(itemgetter(0), items))
        if writes.keys().isdisjoint(keys):  # all new (a hand-over's): the dict's own loops
            before = len(writes)
            writes.update(items)
            if len(writes) - before == len(keys):  # and distinct
                self.num_bytes += sum(map(len, keys)) + sum(map(len, map(itemgetter(1), items)))
            else:  # a key more than once: its last value counts
                self.num_bytes += sum(len(key) + len(value) for key, value in dict(items).items())
            if self._sorted is not None:
                self._added += dict.fromkeys(keys)
            return
        put = self.put  # some keys staged already: one by one
        for key, value in items:
            put(key, value)

    def discard(self, key: bytes) -> None:
        """Unstage `key` (a put or a delete) as if it had never been written."""
        old = self.writes.pop(key, ABSENT)
        if old is ABSENT:
            return
        self.num_bytes -= len(key) if old is None else len(key) + len(old)  # type: ignore[arg-type]
        if self._sorted is not None:
            if self._sorted.remove(key):
                self._in_order -= 1
            else:
                self._added.remove(key)

    def discard_all(self, keys: list[bytes]) -> None:
        """``discard`` each of ``keys`` (all staged here), in one pass: the order is built anew
        at the next scan instead of each key leaving it."""
        writes, unstaged = self.writes, 0
        for key in keys:
            old = writes.pop(key)
            unstaged += len(key) if old is None else len(key) + len(old)
        self.num_bytes -= unstaged
        if keys and self._sorted is not None:
            self._sorted, self._added, self._in_order = None, [], 0

    def sorted_items(
        self, start: bytes | None, end: bytes | None
    ) -> list[tuple[bytes, bytes | None]]:
        """A copy of the staged writes with start <= key < end, in key order."""
        return self._ordered().items_between(start, end, self.writes)

    def keys_between(self, start: bytes, end: bytes) -> list[bytes]:
        """The staged keys (puts and deletes) with start <= key < end, in no particular order,
        without putting every staged key in order: an expiry's one read of a range, in a
        store that reads no other range, would sort them all."""
        ordered, added = self._sorted, self._added
        if ordered is None:
            return [key for key in self.writes if start <= key < end]
        return ordered.between(start, end) + [key for key in added if start <= key < end]

    def delete_between(
        self, start: bytes, end: bytes, unstage: Container[bytes]
    ) -> tuple[list[bytes], list[bytes]]:
        """Every staged put with start <= key < end becomes a staged delete, or leaves the
        overlay when its key is in ``unstage``; staged deletes stay. Returns the keys whose put
        became a delete, then the keys unstaged, in no particular order.

        The staged keys are not put in order for it: a store that never scans (a stream-stream
        join's, which drops a segment now and then) would sort every staged key at each drop."""
        writes, ordered = self.writes, self._sorted
        keys = self.keys_between(start, end)
        puts = [key for key in keys if writes[key] is not None]
        gone = [key for key in puts if key in unstage]
        turned = [key for key in puts if key not in unstage] if gone else puts
        unstaged = 0
        for key in gone:
            unstaged += len(key) + len(writes.pop(key))  # type: ignore[arg-type]
        for key in turned:
            unstaged += len(writes[key])  # type: ignore[arg-type]
            writes[key] = None
        self.num_bytes -= unstaged
        if ordered is not None and gone:
            self._unorder(ordered, start, end, gone, len(gone) == len(keys))
        return turned, gone

    def _unorder(
        self, ordered: SortedKeys, start: bytes, end: bytes, gone: list[bytes], every: bool
    ) -> None:
        """Take ``gone`` (keys unstaged, all in [start, end)) out of the order and of the keys
        waiting for it; ``every``: they are every staged key of the range."""
        waiting = set(gone).intersection(self._added) if self._added else set()
        if waiting:
            self._added = [key for key in self._added if key not in waiting]
        if every:  # the common case: the range leaves the order in one pass
            self._in_order -= len(ordered.remove_between(start, end))
            return
        for key in gone:
            if key not in waiting:
                ordered.remove(key)
                self._in_order -= 1

    def delete_each(self, keys: list[bytes]) -> None:
        """``put(key, None)`` for each of ``keys`` (distinct), staged or not, in one call."""
        writes, change, new = self.writes, 0, []
        for key in keys:
            old = writes.get(key, ABSENT)
            if old is ABSENT:
                change += len(key)
                new.append(key)
            elif old is not None:
                change -= len(old)  # type: ignore[arg-type]
            writes[key] = None
        self.num_bytes += change
        if new and self._sorted is not None:
            self._added += new

    def delete_all(self, keys: list[bytes]) -> None:
        """Stage a delete of each of ``keys`` (none staged here yet, no repeats)."""
        self.writes.update(dict.fromkeys(keys))
        self.num_bytes += sum(map(len, keys))
        if self._sorted is not None:
            self._added += keys

    def _ordered(self) -> SortedKeys:
        """The staged keys in order, the keys staged since the last scan put into place."""
        ordered, added = self._sorted, self._added
        if ordered is None or (len(added) > _INSERT_AT_MOST and len(added) > self._in_order // 8):
            ordered = self._sorted = sorted_keys(sorted(self.writes))
            self._in_order = len(self.writes)
            added.clear()
        elif added:
            # A few keys since the last scan (a scan after every write or so, as a windowed
            # aggregation's or a stream-stream join's): each into place.
            ordered.insert_all(added)
            self._in_order += len(added)
            added.clear()
        return ordered

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
        self._sorted = None
        self._added = []
        self._in_order = 0


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
