"""The deduplication's store, and the estimate of what memory holds of it.

Store layout (one transactional key-value store, bytes keys):

    b"i" + canonical_bytes(id)                       -> timestamp (8) + offset (8; -1: none)
    b"x" + sortable(timestamp) + canonical_bytes(id)  -> b""   (the expiry index)
    b"m"                                             -> saved stream time

Every id entry is written with an index key for its timestamp, in the same commit
(``hand_over`` under exactly once, ``index_written`` under at least once). At every commit
``purge`` walks the index below the horizon: each index key goes, and its id entry with it
when the entry still has that timestamp (an id stored again since has a newer entry and its
own index key). So the store itself knows what expires, and memory may hold any part of the
ids or none: the processor (dedup.py) keeps in memory only what fits in its budget, and asks
the store (``lookup``) for the rest. ``sortable`` is the timestamp plus 2**63, big-endian, so
the index is in timestamp order for every int64.

In memory an id is held by the cheapest exact key (``memory_key``): a str id as the str, a
pair of strs (deduplicate_by_key_value's (key, id) over string keys and ids) as the tuple,
anything else as its store key; its entry as a ``(timestamp, offset)`` tuple.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from streamplatform.identity import canonical_bytes

_ENTRY = struct.Struct(">qq")
pack_entry, unpack_entry = _ENTRY.pack, _ENTRY.unpack
META_KEY = b"m"
ID_PREFIX = b"i"
INDEX_PREFIX = b"x"
NO_OFFSET = -1
_SORTABLE = struct.Struct(">Q")
_SIGN = 2**63
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

MemoryKey = str | tuple[str, str] | bytes
Entry = tuple[int, int]  # (timestamp, offset) of the last record forwarded for an id

_U32_AT = struct.Struct(">I").unpack_from

# What memory holds per id, in bytes, as CPython 3.11 on 64 bits allocates it (measured with
# tracemalloc; docs/configuration.md, "Memory"). The key object's own size is added to these.
ENTRY_BYTES = 165  # its slot in the entries dict and the (timestamp, offset) tuple
INDEX_ITEM_BYTES = 72  # its (timestamp, key, entry) item in the in-order deque
HEAP_ITEM_BYTES = 112  # or its (timestamp, n, key, entry) item in the expiry heap
SLOT_BYTES = 40  # a slot in another dict or set (writes held for the commit, ids in the store)
_DEFAULT_KEY_BYTES = 64  # a str of ~15 characters, until keys are seen


def memory_key(identity: Any) -> MemoryKey:
    """The in-memory key of an id: the id itself when it is a str or a pair of strs (hashable,
    immutable, and as exact as its store key), else what ``key_from_store`` gives for its
    store key, so that a key loaded from the store always equals the key of its id."""
    kind = type(identity)
    if kind is str:
        return identity  # type: ignore[no-any-return]
    if kind is tuple and len(identity) == 2:
        first, second = identity
        if type(first) is str and type(second) is str:
            return identity  # type: ignore[no-any-return]
    return key_from_store(ID_PREFIX + canonical_bytes(identity))


def store_key(key: MemoryKey) -> bytes:
    """The store key of an in-memory key (``ID_PREFIX + canonical_bytes(id)``)."""
    return key if type(key) is bytes else ID_PREFIX + canonical_bytes(key)


def key_from_store(stored: bytes) -> MemoryKey:
    """The in-memory key of a store key: the inverse of ``store_key``."""
    if stored[1:2] == b"s":
        return stored[2:].decode()
    if stored[1:2] == b"(" and len(stored) >= 12 and stored[6:7] == b"s":
        # b"i(" + size(first) + b"s" + first + size(second) + b"s" + second, where a size
        # is 4 bytes big-endian and counts the b"s" too (canonical_bytes).
        first_end = 6 + _U32_AT(stored, 2)[0]
        second_start = first_end + 4
        if (
            second_start < len(stored)
            and stored[second_start : second_start + 1] == b"s"
            and second_start + _U32_AT(stored, first_end)[0] == len(stored)
        ):
            return (stored[7:first_end].decode(), stored[second_start + 1 :].decode())
    return stored


def held_size(key: MemoryKey) -> int:
    """Approximately ``len(store_key(key))`` (characters for bytes), without building it."""
    if type(key) is str:
        return len(key) + 2
    if type(key) is tuple:
        return len(key[0]) + len(key[1]) + 12
    return len(key)


def index_key(timestamp: int, stored: bytes) -> bytes:
    """The expiry index key of the id entry ``stored`` (b"i" + id) at ``timestamp``; with
    ``stored`` = b"i", the first index key at that timestamp (a bound for scans)."""
    timestamp = min(max(timestamp, _INT64_MIN), _INT64_MAX)
    return INDEX_PREFIX + _SORTABLE.pack(timestamp + _SIGN) + stored[1:]


def key_object_bytes(key: MemoryKey) -> int:
    """What the key object itself takes in memory (a pair: the tuple and both strs)."""
    if type(key) is tuple:
        return sys.getsizeof(key) + sys.getsizeof(key[0]) + sys.getsizeof(key[1])
    return sys.getsizeof(key)


def mean_key_bytes(keys: Iterable[MemoryKey], default: int = _DEFAULT_KEY_BYTES) -> int:
    """The mean size of up to 32 of ``keys`` (``default`` when there is none)."""
    sizes = [key_object_bytes(key) for key in islice(keys, 32)]
    return sum(sizes) // len(sizes) if sizes else default


HandedOver = Callable[
    [dict[MemoryKey, Entry | None], set[MemoryKey], Callable[[MemoryKey], bytes]],
    list[tuple[bytes, bytes | None]],
]


def handed_over(
    pending: dict[MemoryKey, Entry | None],
    in_store: set[MemoryKey],
    store_key: Callable[[MemoryKey], bytes] = store_key,
) -> list[tuple[bytes, bytes | None]]:
    """The store writes of the writes held for the commit, in order: per held put the id's
    entry and its index key, per held delete the id's deletion; ``in_store`` follows them.
    The reference of ``_dedup_core.handed_over`` (which calls ``store_key`` for keys it does
    not build itself)."""
    writes: list[tuple[bytes, bytes | None]] = []
    write, add, discard = writes.append, in_store.add, in_store.discard
    for id_key, entry in pending.items():
        stored = store_key(id_key)
        if entry is None:
            write((stored, None))
            discard(id_key)
        else:
            write((stored, pack_entry(*entry)))
            write((index_key(entry[0], stored), b""))
            add(id_key)
    return writes


class DedupStore:
    """The store side of a deduplication: reads, the commit's writes and the index purge,
    through the store's writing transaction (``transaction``)."""

    def __init__(self, transaction: Any, interval: int) -> None:
        self.transaction = transaction
        self.interval = interval
        # The index below this timestamp is already purged, so a purge scans from here and
        # never over the deletion markers of earlier purges. None: from the index's start.
        self.purged_to: int | None = None

    def lookup(self, key: MemoryKey) -> Entry | None:
        """The stored entry of an id (its in-memory key), or None."""
        value = self.transaction.get(store_key(key))
        return None if value is None else unpack_entry(value)  # type: ignore[no-any-return]

    def load(self, limit_bytes: int) -> dict[MemoryKey, Entry] | None:
        """Every stored entry, if they take at most ``limit_bytes`` in memory (counted as the
        processor counts them, with their index item and in-store slot); else None, having
        read no more than that."""
        per_entry = ENTRY_BYTES + INDEX_ITEM_BYTES + SLOT_BYTES
        entries: dict[MemoryKey, Entry] = {}
        used = 0
        for key, value in self.transaction.prefix(ID_PREFIX):
            id_key = key_from_store(key)
            entries[id_key] = unpack_entry(value)
            used += per_entry + key_object_bytes(id_key)
            if used > limit_bytes:
                return None
        return entries

    def index_missing_entries(self) -> int:
        """Give every id entry its index key when the store has entries and no index at all
        (written before the index existed); returns how many were indexed. One pass over the
        ids, once per such store."""
        # The index first: it is there in every store but an empty one or an old one.
        if next(iter(self.transaction.prefix(INDEX_PREFIX)), None) is not None:
            return 0
        if next(iter(self.transaction.prefix(ID_PREFIX)), None) is None:
            return 0
        put, indexed = self.transaction.put, 0
        for key, value in list(self.transaction.prefix(ID_PREFIX)):
            put(index_key(unpack_entry(value)[0], key), b"")
            indexed += 1
        return indexed

    def hand_over(
        self,
        pending: dict[MemoryKey, Entry | None],
        in_store: set[MemoryKey],
        writes_of: HandedOver | None = None,
    ) -> None:
        """Give the writes held for the commit to the transaction, in one call: a put with
        its index key, a delete alone (its index key goes when the index passes it).
        ``writes_of``: what builds them (``handed_over``, or the C core's equal)."""
        self.transaction.put_all((writes_of or handed_over)(pending, in_store, store_key))

    def index_written(self, written: dict[bytes, int], horizon: int) -> None:
        """Under at least once the entries went to the store at once: index those still live
        at the commit (``written``: store key -> timestamp of its last put), as ``hand_over``
        does under exactly once, so that both leave the same store."""
        put = self.transaction.put
        for stored, timestamp in written.items():
            if timestamp >= horizon:
                put(index_key(timestamp, stored), b"")

    def purge(self, horizon: int) -> int:
        """Delete the index keys below ``horizon``, and the id entries they name that still
        have their timestamp; returns how many entries went."""
        start = INDEX_PREFIX if self.purged_to is None else index_key(self.purged_to, ID_PREFIX)
        end = index_key(horizon, ID_PREFIX)
        transaction = self.transaction
        get, put = transaction.get, transaction.put
        deleted = 0
        # One scan: it sees the store and the staged writes as of its start, so the deletes
        # below do not disturb it. (Scans of a few thousand keys each copied every staged key
        # up to the horizon again: quadratic in the keys staged since the last commit.)
        for key, _ in transaction.range(start, end):
            put(key, None)
            stored = ID_PREFIX + key[9:]
            value = get(stored)
            if value is not None and unpack_entry(value)[0] == (
                _SORTABLE.unpack_from(key, 1)[0] - _SIGN
            ):
                put(stored, None)
                deleted += 1
        self.purged_to = horizon if self.purged_to is None else max(self.purged_to, horizon)
        return deleted
