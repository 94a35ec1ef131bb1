"""A bounded in-memory copy of hot keys' histories, for `get(key, as_of)` on older versions.

A temporal join looks the same keys up at many times. In RocksDB each lookup of an older
version is one seek per segment searched (history.py); this cache keeps a key's live history
decoded instead: ``valid_tos`` ascending (an unsigned 64-bit array: a bisect then reads a few
cache lines, not one int object per probe) and ``records``, the version ending at each
valid_to as a ``VersionedRecord`` (a tombstone as a plain ``(None, valid_from, valid_to)``
tuple), both ending with a sentinel (`END`, `LAST`). The version valid at ``t`` is then
``records[bisect_right(valid_tos, t)]`` if it started by ``t``: no RocksDB call at all.

Never stale, because the cache holds exactly what the store's writing transaction sees
(staged writes over stored data) for every query that is not expired:

- a key is loaded (`HistoryReader.load`) with every version whose valid_to is above
  ``max(stream_time - history_retention, 0)``. That floor only rises while the cache lives
  (stream time only grows between two clears), and a query at ``t`` that is not expired
  needs only versions with valid_to > t >= the floor;
- every history write of the store goes through `update` as it is staged, so a cached key
  follows its puts, deletes and out-of-order puts;
- whatever changes the transaction's view other than a write clears the cache: `prepare`
  (the staged writes leave the transaction), `settle`, `apply_changelog` and close
  (versioned.py); segment expiry too, although what it drops only expired queries could
  read, to free the memory. A commit, or a write applied at once under READ_UNCOMMITTED, moves
  data from staged to stored without changing the view.

Bounded by `capacity` bytes (StoreOptions.history_cache_bytes), counted as the values plus
`VERSION_COST` per version and `KEY_COST` plus the key per key: the Python objects around
them, measured with tracemalloc on CPython 3.11 (tests/state/test_state_history_cache.py).
Not counted: the admission's memory of up to `SEEN_KEYS` keys.

Eviction is CLOCK (a second chance for keys read again since they were loaded or the hand
last passed them), which costs a read one list store instead of an LRU reordering.
Admission guards against loads that do not pay (a load costs about as much as 10 lookups in
RocksDB): a key is loaded at its second lookup that missed among the last `SEEN_KEYS` keys
that missed, so a key read once costs no load; once the cache is full, a load that evicts
waits for `MISSES_PER_EVICTING_LOAD` misses since the previous one, so a working set larger
than the cache cannot make every lookup a load; a key whose history would take more than an
eighth of the capacity is marked `TOO_LARGE` and read from RocksDB.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import OrderedDict
from typing import Any

__all__ = [
    "END",
    "KEY_COST",
    "LAST",
    "MISSES_PER_EVICTING_LOAD",
    "SEEN_KEYS",
    "TOO_LARGE",
    "VERSION_COST",
    "HistoryCache",
]

END = 2**63
"""Sentinel valid_to above every timestamp (at most 2**63 - 1)."""
LAST = (None, END, END)
"""Sentinel record after the last version: answers like a tombstone."""
VERSION_COST = 188
"""Bytes a cached version takes besides its value: the record, its two ints, the value's
bytes header, an array and a list slot (measured: 186)."""
KEY_COST = 400
"""Bytes a cached key takes besides the key: the key's bytes header, its OrderedDict node,
the entry, an array and a list (measured: 340 to 390)."""
SEEN_KEYS = 10_000
"""Keys remembered after one lookup that missed (a key is loaded at its second)."""
MISSES_PER_EVICTING_LOAD = 32
"""Once the cache is full, lookups that missed between two loads that evict."""

Entry = list[Any]
"""[valid_tos: array("Q"), records: list[tuple], cost: int, read since the hand passed: bool]"""
TOO_LARGE: Entry = [[], [], 0, False]
"""Marks a key whose history is too large to cache: its lookups go to RocksDB. Shared by
all such keys, so never flagged as read: a lookup moves the key to the back instead."""


class HistoryCache:
    """Keys' histories as the writing transaction sees them; see the module docstring."""

    __slots__ = ("entries", "capacity", "key_limit", "num_bytes", "_seen", "_misses")

    def __init__(self, capacity: int) -> None:
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()
        """key -> Entry or TOO_LARGE, in the CLOCK's order. Cleared in place only, so that a
        reference to it stays valid."""
        self.capacity = capacity
        self.key_limit = capacity // 8
        """The most bytes one key may take."""
        self.num_bytes = 0
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._misses = 0  # lookups that missed since the last load that evicted

    def admit(self, key: bytes) -> bool:
        """At a lookup of `key` that missed (not cached): True to load its history now."""
        if not self.capacity:
            return False
        self._misses += 1
        seen = self._seen
        if key not in seen:
            seen[key] = None
            if len(seen) > SEEN_KEYS:
                seen.popitem(last=False)
            return False
        if self.num_bytes > self.capacity - self.key_limit:  # the load may have to evict
            if self._misses < MISSES_PER_EVICTING_LOAD:
                return False
            self._misses = 0
        del seen[key]
        return True

    def add(self, key: bytes, loaded: tuple[list[int], list[tuple], int] | None) -> Entry:
        """Cache `key`'s history: (valid_tos, records, total length of the values), or mark
        the key TOO_LARGE when `loaded` is None. Returns its entry."""
        if loaded is None:
            entry, cost = TOO_LARGE, KEY_COST + len(key)
        else:
            valid_tos, records, value_bytes = loaded
            valid_tos.append(END)
            records.append(LAST)
            cost = KEY_COST + len(key) + value_bytes + VERSION_COST * (len(records) - 1)
            entry = [array("Q", valid_tos), records, cost, False]
        self.entries[key] = entry
        self.num_bytes += cost
        self._evict()
        return entry

    def update(self, key: bytes, valid_to: int, record: tuple) -> None:
        """A history write of `key` was staged: apply it to the cached history, if any."""
        entry = self.entries.get(key)
        if entry is None or entry is TOO_LARGE:
            return
        valid_tos, records, cost, _ = entry
        i = bisect_left(valid_tos, valid_to)
        value = record[0]
        if valid_tos[i] == valid_to:  # never the sentinel: valid_to < END
            old = records[i][0]
            delta = (0 if value is None else len(value)) - (0 if old is None else len(old))
            records[i] = record
        else:
            valid_tos.insert(i, valid_to)
            records.insert(i, record)
            delta = (0 if value is None else len(value)) + VERSION_COST
        cost += delta
        if cost > self.key_limit:
            self.entries[key] = TOO_LARGE
            delta -= cost - KEY_COST - len(key)
        else:
            entry[2] = cost
        self.num_bytes += delta
        self._evict()

    def _evict(self) -> None:
        entries = self.entries
        while self.num_bytes > self.capacity and entries:
            key, entry = entries.popitem(last=False)
            if entry[3]:  # read since the hand last passed: a second chance (TOO_LARGE: never)
                entry[3] = False
                entries[key] = entry
            else:
                self.num_bytes -= KEY_COST + len(key) if entry is TOO_LARGE else entry[2]

    def clear(self) -> None:
        self.entries.clear()
        self.num_bytes = 0
