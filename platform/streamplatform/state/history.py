"""On-disk layout of a versioned store's history, its uncommitted writes, reads and expiry.

Encodings (integers big-endian; timestamps and segment ids biased by 2**63 so that byte
order is numeric order):

- a *version* (the value in ``latest`` and ``history``): ``valid_from(8)`` then ``\\x01 value``
  or ``\\x00`` for a tombstone, so ``b""`` and a tombstone stay distinct;
- a *history key*: ``segment(8) key_length(4) key valid_to(8)`` with ``segment = valid_to //
  segment_interval`` (KIP-889's layout). Segment first makes a whole segment one key range,
  dropped with one range delete; the key length keeps one key's versions contiguous even
  when another key extends it; valid_to last orders them in time, so the version valid at
  ``t`` is the first entry after ``t`` in the first segment that has one;
- a *tombstone index key* (``tombstones``): ``segment(8) key``, one per tombstone that became
  its key's latest version, filed by the tombstone's timestamp, so that expired latest
  tombstones can be found and purged.

A key-first history (``key valid_to``) was measured too: it makes every as-of lookup one
seek instead of one per segment searched (1.3 on average in bench/state_bench.py), but its
segments then need an index, a third write per version, and a delete per expired version.
Writes outnumber older-version reads in temporal joins, so the KIP's layout stays; keys read
often at older times are served from memory instead (history_cache.py, loaded by
`HistoryReader.load`: one seek per segment, once per key).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping

import rocksdict

from streamplatform.state.db import META, StateDB
from streamplatform.state.errors import StateStoreError

__all__ = [
    "HISTORY",
    "LATEST",
    "MAX_LOAD_SEGMENTS",
    "TOMBSTONES",
    "VALUE_AT",
    "HistoryOverlay",
    "HistoryReader",
    "agree_segment_interval",
    "default_segment_interval",
    "drop_segments_before",
    "encode_version",
    "pack_time",
    "unpack_time",
]

_TIME = struct.Struct(">Q")
_BIAS = 1 << 63
_KEY_LENGTH = struct.Struct(">I")
VALUE_FLAG = b"\x01"
TOMBSTONE_FLAG = b"\x00"
TIME_SIZE = _TIME.size
VALUE_AT = TIME_SIZE + 1  # where the value starts in an encoded version
LATEST, HISTORY, TOMBSTONES = "latest", "history", "tombstones"
_SEGMENT_INTERVAL = b"segment_interval_ms"
MAX_LOAD_SEGMENTS = 64
"""`HistoryReader.load` reads at most this many segments. KIP-889's default intervals put
at most 26 in a retention; only an explicit interval far below the retention gives more."""
_SECOND = 1000
_MINUTE = 60 * _SECOND


def pack_time(value: int) -> bytes:
    """Encode a timestamp or segment id so that byte order is numeric order."""
    return _TIME.pack(value + _BIAS)


def unpack_time(data: bytes, offset: int = 0) -> int:
    return _TIME.unpack_from(data, offset)[0] - _BIAS


def encode_version(valid_from: int, value: bytes | None) -> bytes:
    if value is None:
        return _TIME.pack(valid_from + _BIAS) + TOMBSTONE_FLAG
    return _TIME.pack(valid_from + _BIAS) + VALUE_FLAG + value


def history_prefix(segment: int, key: bytes) -> bytes:
    """The common start of every history key of `key` in `segment`."""
    return _TIME.pack(segment + _BIAS) + _KEY_LENGTH.pack(len(key)) + key


def default_segment_interval(history_retention_ms: int) -> int:
    """KIP-889's default segment interval (ms) for a history retention (ms)
    (docs/semantics.md)."""
    hr = history_retention_ms
    if hr <= 60 * _SECOND:
        return max(hr // 3, 2 * _SECOND)
    if hr <= 5 * _MINUTE:
        return max(hr // 5, 20 * _SECOND)
    if hr <= 60 * _MINUTE:
        return max(hr // 12, 60 * _SECOND)
    return max(hr // 24, 5 * _MINUTE)


def agree_segment_interval(db: StateDB, retention: int, requested: int | None) -> int:
    """The store's segment interval: the one on disk wins, a different explicit one is an error.

    History is filed by it, so it cannot change once versions exist.
    """
    meta = db.columns[META]
    stored = meta.get(_SEGMENT_INTERVAL)
    if stored is not None:
        interval = unpack_time(stored)
        if requested is not None and requested != interval:
            raise StateStoreError(
                f"versioned store {db.path} was created with segment_interval_ms="
                f"{interval}; it cannot be reopened with {requested}"
            )
        return interval
    interval = requested if requested is not None else default_segment_interval(retention)
    meta.put(_SEGMENT_INTERVAL, pack_time(interval))
    return interval


class HistoryOverlay:
    """Uncommitted history versions: key -> {valid_to: encoded version}.

    Grouped by key because every history read is about one key. History writes are never
    deletes (a version whose validity shrinks is rewritten under its new valid_to, and its
    old slot is taken by the newcomer), so values are bytes.
    """

    __slots__ = ("by_key", "num_bytes", "interval", "_count")

    def __init__(self, segment_interval: int) -> None:
        self.by_key: dict[bytes, dict[int, bytes]] = {}
        self.num_bytes = 0
        self.interval = segment_interval
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def put(self, key: bytes, valid_to: int, version: bytes) -> None:
        versions = self.by_key.get(key)
        if versions is None:
            versions = self.by_key[key] = {}
        old = versions.get(valid_to)
        if old is None:
            self._count += 1
            self.num_bytes += len(key) + TIME_SIZE + len(version)
        else:
            self.num_bytes += len(version) - len(old)
        versions[valid_to] = version

    def entries(self) -> Iterator[tuple[str, bytes, bytes | None]]:
        interval = self.interval
        for key, versions in self.by_key.items():
            for valid_to, version in versions.items():
                history_key = history_prefix(valid_to // interval, key) + pack_time(valid_to)
                yield HISTORY, history_key, version

    def write_to(
        self, batch: rocksdict.WriteBatch, handles: Mapping[str, rocksdict.ColumnFamily]
    ) -> None:
        put, history = batch.put, handles[HISTORY]
        for _, history_key, version in self.entries():
            put(history_key, version, history)

    def clear(self) -> None:
        self.by_key = {}
        self.num_bytes = 0
        self._count = 0


class HistoryReader:
    """Reads one key's history as its writing transaction sees it: staged over committed.

    One RocksDB iterator is reused for every lookup until the stored data changes (a commit,
    or a write under READ_UNCOMMITTED): creating one costs as much as a lookup.
    """

    def __init__(self, db: StateDB, staged: HistoryOverlay) -> None:
        self._db = db
        self._staged = staged
        self._interval = staged.interval
        self._iterator: rocksdict.RdictIter | None = None
        self._generation = -1

    def _stored(self) -> rocksdict.RdictIter:
        if self._iterator is None or self._generation != self._db.generation:
            self._iterator = self._db.iterator(HISTORY)
            self._generation = self._db.generation
        return self._iterator

    def first_after(self, key: bytes, time: int, latest_ts: int) -> tuple[int, bytes] | None:
        """(valid_to, version) of the version of `key` with the smallest valid_to > `time`.

        That is the version valid at `time`, if any version is. Stored versions end by
        `latest_ts` (the latest version's start): later segments are not searched.
        """
        staged = self._staged.by_key.get(key)
        staged_best = None
        if staged:
            for valid_to in staged:
                if valid_to > time and (staged_best is None or valid_to < staged_best):
                    staged_best = valid_to
            if staged_best is not None:
                latest_ts = staged_best  # stored versions ending later cannot win
        iterator = self._iterator
        if iterator is None or self._generation != self._db.generation:
            iterator = self._stored()
        interval = self._interval
        key_part = _KEY_LENGTH.pack(len(key)) + key
        after = _TIME.pack(time + 1 + _BIAS)
        segment, last_segment = (time + 1) // interval, latest_ts // interval
        while segment <= last_segment:
            prefix = _TIME.pack(segment + _BIAS) + key_part
            iterator.seek(prefix + after)
            stored_key = iterator.key()  # None once the iterator runs off the end
            if stored_key is not None and stored_key.startswith(prefix):
                valid_to = _TIME.unpack_from(stored_key, len(prefix))[0] - _BIAS
                if staged_best is None or valid_to < staged_best:
                    return valid_to, iterator.value()
                break
            segment += 1
        if staged_best is None:
            return None
        return staged_best, staged[staged_best]  # type: ignore[index]

    def versions_after(self, key: bytes, floor: int, latest_ts: int) -> dict[int, bytes]:
        """Every history version of `key` with valid_to > `floor`: {valid_to: version}."""
        versions = {}
        iterator = self._stored()
        after = pack_time(floor + 1)
        for segment in range((floor + 1) // self._interval, latest_ts // self._interval + 1):
            prefix = history_prefix(segment, key)
            iterator.seek(prefix + after)
            while (stored_key := iterator.key()) is not None and stored_key.startswith(prefix):
                versions[unpack_time(stored_key, len(prefix))] = iterator.value()
                iterator.next()
        staged = self._staged.by_key.get(key)
        if staged:
            versions.update((t, v) for t, v in staged.items() if t > floor)
        return versions

    def load(
        self, key: bytes, floor: int, latest_ts: int, max_bytes: int, version_cost: int
    ) -> tuple[list[int], list[bytes], int] | None:
        """Every history version of `key` with valid_to > `floor`, for the history cache.

        Returns (valid_tos ascending, versions, total length of their values), or None as
        soon as the values' lengths plus `version_cost` per version pass `max_bytes`, or
        when they span more than MAX_LOAD_SEGMENTS segments (a seek each).
        """
        valid_tos: list[int] = []
        versions: list[bytes] = []
        value_bytes = count = 0
        segments = range((floor + 1) // self._interval, latest_ts // self._interval + 1)
        if len(segments) > MAX_LOAD_SEGMENTS:
            return None
        iterator = self._stored()
        key_at, value_at, step = iterator.key, iterator.value, iterator.next
        after = pack_time(floor + 1)
        for segment in segments:
            prefix = history_prefix(segment, key)
            iterator.seek(prefix + after)
            while (stored_key := key_at()) is not None and stored_key.startswith(prefix):
                version = value_at()
                valid_tos.append(unpack_time(stored_key, len(prefix)))
                versions.append(version)
                value_bytes += len(version) - VALUE_AT
                count += 1
                if value_bytes + count * version_cost > max_bytes:
                    return None
                step()
        staged = self._staged.by_key.get(key)
        if staged:
            merged = dict(zip(valid_tos, versions, strict=True))
            merged.update((t, v) for t, v in staged.items() if t > floor)
            valid_tos = sorted(merged)
            versions = [merged[t] for t in valid_tos]
            value_bytes = sum(len(v) for v in versions) - VALUE_AT * len(versions)
            if value_bytes + len(versions) * version_cost > max_bytes:
                return None
        return valid_tos, versions, value_bytes

    def close(self) -> None:
        """Drop the iterator: it keeps the DB, and its lock, alive."""
        self._iterator = None


def drop_segments_before(db: StateDB, first_live: int, boundary: int) -> list[bytes]:
    """Drop every segment below `first_live` in one batch; return the latest keys purged.

    History and tombstone index lose one key range each. A latest tombstone listed in the
    dropped index range is deleted from ``latest`` if it still is its key's latest version
    and older than `boundary` (stream time minus history retention): it can then only answer
    expired queries, and dropping it keeps deleted keys from piling up.
    """
    start, end = pack_time(0), pack_time(first_live)
    batch = rocksdict.WriteBatch(raw_mode=True)
    latest, latest_column = db.handles[LATEST], db.columns[LATEST]
    purged = []
    index = db.iterator(TOMBSTONES)
    index.seek_to_first()
    while (index_key := index.key()) is not None and index_key < end:
        key = index_key[TIME_SIZE:]
        version = latest_column.get(key)
        if version is not None and version[TIME_SIZE] == 0 and unpack_time(version) < boundary:
            batch.delete(key, latest)
            purged.append(key)
        index.next()
    del index  # it keeps the DB alive
    batch.delete_range(start, end, db.handles[HISTORY])
    batch.delete_range(start, end, db.handles[TOMBSTONES])
    db.write(batch)
    return purged
