"""VersionedKeyValueStore: every version of a key, queryable as of a time (KIP-889).

Column families: ``latest`` (key -> newest version, never expires), ``history`` (older
versions filed by valid_to into segments) and ``tombstones`` (an index of latest tombstones),
laid out as history.py describes; stream time and the segment interval live in ``meta``. Semantics
are those of docs/semantics.md (KIP-889):

- stream time is the largest timestamp of any accepted put or delete; it survives reopen;
- a put older than ``stream_time - history_retention`` is dropped (PUT_RETURN_CODE_NOT_PUT);
- a put returns the new version's valid_to, or VALID_TO_UNDEFINED when it became the latest;
- a query older than ``stream_time - history_retention`` is answered by the latest version
  only (when its timestamp <= as_of), never by history still on disk;
- a segment (versions whose valid_to falls in one segment interval) is dropped whole once it
  is behind ``stream_time - history_retention``, after the commit that moved stream time.

A tombstone that becomes the latest version stays in ``latest`` (flagged) so that one point
lookup always finds a key's newest version; the tombstone index purges it once it is behind
the retention, so deleted keys do not pile up.

The store's reads and writes go through its writing transaction (base.py): under
READ_COMMITTED its reads see its own uncommitted writes and `commit(offsets)` makes them
durable with the offsets; under READ_UNCOMMITTED each put is applied at once.

Two caches answer reads without RocksDB, both as the writing transaction sees the data: the
latest version of recently used keys (`StoreOptions.latest_cache_entries`) and the whole live
history of keys read often at older times (`StoreOptions.history_cache_bytes`,
history_cache.py), which makes `get(key, as_of)` on an older version a bisect in memory.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections import OrderedDict
from typing import NamedTuple

import rocksdict

from streamplatform.state.base import StoreBase
from streamplatform.state.checks import check_bytes, check_time, check_timestamp
from streamplatform.state.db import META
from streamplatform.state.errors import StateStoreError
from streamplatform.state.history import (
    HISTORY,
    LATEST,
    TIME_SIZE,
    TOMBSTONES,
    VALUE_AT,
    HistoryOverlay,
    HistoryReader,
    agree_segment_interval,
    drop_segments_before,
    encode_version,
    pack_time,
    unpack_time,
)
from streamplatform.state.history_cache import (
    END,
    KEY_COST,
    TOO_LARGE,
    VERSION_COST,
    Entry,
    HistoryCache,
)
from streamplatform.state.overlay import ABSENT, Overlay
from streamplatform.state.rocks import StoreOptions
from streamplatform.state.transaction import IsolationLevel, Transaction

__all__ = [
    "PUT_RETURN_CODE_NOT_PUT",
    "VALID_TO_UNDEFINED",
    "VersionedKeyValueStore",
    "VersionedRecord",
]

PUT_RETURN_CODE_NOT_PUT = -(2**63)
"""`put` result for a record older than the history retention (Kafka's Long.MIN_VALUE)."""
VALID_TO_UNDEFINED = -1
"""`put` result when the new version became the key's latest version."""

_STREAM_TIME = b"stream_time"
_NO_STREAM_TIME = -1


class VersionedRecord(NamedTuple):
    """One version of a key: valid from `timestamp` (inclusive) to `valid_to` (exclusive).

    `valid_to` is None for the latest version, whose validity has no end yet.
    """

    value: bytes
    timestamp: int
    valid_to: int | None


# A key's latest version as cached: (timestamp, record or None for a tombstone, encoding).
_Latest = tuple[int, VersionedRecord | None, bytes]

_new_tuple = tuple.__new__  # VersionedRecord(...) runs a Python-level __new__: 3x slower


def _record(value: bytes, timestamp: int, valid_to: int | None) -> VersionedRecord:
    return _new_tuple(VersionedRecord, (value, timestamp, valid_to))


def _decode_latest(version: bytes) -> _Latest:
    timestamp = unpack_time(version)
    if version[TIME_SIZE] == 0:
        return timestamp, None, version
    return timestamp, _record(version[VALUE_AT:], timestamp, None), version


def _cached_record(valid_to: int, version: bytes) -> tuple:
    """A history version as the history cache holds it: a VersionedRecord, or for a
    tombstone a plain (None, valid_from, valid_to) tuple, never handed out."""
    if version[TIME_SIZE] == 0:
        return (None, unpack_time(version), valid_to)
    return _new_tuple(VersionedRecord, (version[VALUE_AT:], unpack_time(version), valid_to))


def _version_at(entry: Entry, as_of: int) -> VersionedRecord | None:
    """The record valid at `as_of` in a cached history (history_cache.py), None if none."""
    record = entry[1][bisect_right(entry[0], as_of)]
    if record[0] is None or record[1] > as_of:  # a tombstone, LAST, or before the first
        return None
    return record


class VersionedKeyValueStore(StoreBase):
    """A persistent versioned bytes -> bytes store; timestamps are int milliseconds >= 0."""

    KIND = "versioned"
    COLUMN_FAMILIES = (LATEST, HISTORY, TOMBSTONES)

    def __init__(
        self,
        path: str | os.PathLike[str],
        history_retention_ms: int,
        segment_interval_ms: int | None = None,
        *,
        isolation_level: IsolationLevel = IsolationLevel.READ_COMMITTED,
        options: StoreOptions | None = None,
        max_uncommitted_records: int | None = None,
        max_uncommitted_bytes: int | None = None,
    ) -> None:
        if type(history_retention_ms) is not int or history_retention_ms < 0:
            raise ValueError(
                f"history_retention_ms must be an int >= 0, got {history_retention_ms!r}"
            )
        if segment_interval_ms is not None and (
            type(segment_interval_ms) is not int or segment_interval_ms <= 0
        ):
            raise ValueError(
                f"segment_interval_ms must be None or an int > 0, got {segment_interval_ms!r}"
            )
        super().__init__(
            path, isolation_level, options, max_uncommitted_records, max_uncommitted_bytes
        )
        try:
            self._interval = agree_segment_interval(
                self._db, history_retention_ms, segment_interval_ms
            )
        except StateStoreError:
            super().close()
            raise
        self._retention = history_retention_ms
        self._latest_writes = Overlay(LATEST)
        self._history_writes = HistoryOverlay(self._interval)
        self._tombstone_writes = Overlay(TOMBSTONES)
        self._meta_writes = Overlay(META)
        self._txn = self._writing_transaction()
        self._apply_each_write = isolation_level is IsolationLevel.READ_UNCOMMITTED
        self._latest_column: rocksdict.Rdict = self._db.columns[LATEST]
        self._history = HistoryReader(self._db, self._history_writes)
        self._cache: OrderedDict[bytes, _Latest | None] = OrderedDict()
        self._cache_size = self._options.latest_cache_entries
        self._history_cache = HistoryCache(self._options.history_cache_bytes)
        self._histories = self._history_cache.entries
        self._expired_below = 0  # segments below this id are dropped already
        self._open = True
        self._stream_time = self._persisted_stream_time = _NO_STREAM_TIME
        self._reload_committed_view()
        self._expire()

    def _new_transaction(self) -> Transaction:
        staged = (
            self._latest_writes,
            self._history_writes,
            self._tombstone_writes,
            self._meta_writes,
        )
        return Transaction(self._db, staged, self._isolation_level, self._stage_stream_time)

    def _stage_stream_time(self) -> None:
        """Stage stream time once per write-out rather than at every put that advances it."""
        if self._stream_time != self._persisted_stream_time:
            self._meta_writes.put(_STREAM_TIME, pack_time(self._stream_time))
            self._persisted_stream_time = self._stream_time

    @property
    def history_retention_ms(self) -> int:
        return self._retention

    @property
    def segment_interval_ms(self) -> int:
        return self._interval

    @property
    def stream_time(self) -> int | None:
        """The largest timestamp of any accepted put or delete, None before the first."""
        return None if self._stream_time == _NO_STREAM_TIME else self._stream_time

    # -- writes ---------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes | None, timestamp: int) -> int:
        """Add the version `value` (None: a tombstone) of `key` valid from `timestamp`.

        Returns the new version's valid_to, VALID_TO_UNDEFINED (-1) when it became the
        latest version, or PUT_RETURN_CODE_NOT_PUT when `timestamp` is older than
        stream time minus history retention (nothing is stored then).
        """
        check_bytes("key", key)
        if value is not None:
            check_bytes("value", value)
        check_timestamp("timestamp", timestamp)
        self._check_writable()
        if timestamp < self._stream_time - self._retention:
            return PUT_RETURN_CODE_NOT_PUT
        valid_to = self._put(key, value, timestamp)
        if self._apply_each_write:
            self._txn.end_write()
        return valid_to

    def delete(self, key: bytes, timestamp: int) -> VersionedRecord | None:
        """Put a tombstone for `key` at `timestamp`; return the version valid there, if any.

        Outside the history retention nothing changes and None is returned.
        """
        check_bytes("key", key)
        check_timestamp("timestamp", timestamp)
        self._check_writable()
        if timestamp < self._stream_time - self._retention:
            return None
        previous = self._get_as_of(key, timestamp)
        self._put(key, None, timestamp)
        if self._apply_each_write:
            self._txn.end_write()
        return previous

    def _check_writable(self) -> None:
        if not self._open:
            raise StateStoreError(f"state store {self.path} is closed")
        if self._db.prepared_batch_id is not None:
            raise StateStoreError(
                f"state store {self.path}: batch {self._db.prepared_batch_id} is prepared; "
                "settle it before writing"
            )

    def _put(self, key: bytes, value: bytes | None, timestamp: int) -> int:
        if timestamp > self._stream_time:
            self._stream_time = timestamp
        version = encode_version(timestamp, value)
        latest = self._latest(key)
        if latest is not None and timestamp < latest[0]:
            return self._put_older(key, version, timestamp, latest[0])
        if latest is not None and timestamp > latest[0]:
            self._stage_history(key, timestamp, latest[2])
        self._latest_writes.put(key, version)
        if value is None:
            self._tombstone_writes.put(pack_time(timestamp // self._interval) + key, b"")
            self._remember(key, (timestamp, None, version))
        else:
            self._remember(key, (timestamp, VersionedRecord(value, timestamp, None), version))
        return VALID_TO_UNDEFINED

    def _put_older(self, key: bytes, version: bytes, timestamp: int, latest_ts: int) -> int:
        """Insert a version older than the latest one, shortening its predecessor."""
        stage = self._stage_history
        found = self._first_after(key, timestamp, latest_ts)
        if found is None:  # older than every version in history: valid until the latest
            stage(key, latest_ts, version)
            return latest_ts
        valid_to, successor = found
        valid_from = unpack_time(successor)
        if valid_from > timestamp:  # before every stored version, up to the first of them
            stage(key, valid_from, version)
            return valid_from
        if valid_from < timestamp:  # the version valid at `timestamp` now ends there
            stage(key, timestamp, successor)
        stage(key, valid_to, version)
        return valid_to

    def _stage_history(self, key: bytes, valid_to: int, version: bytes) -> None:
        """Stage a history version; every history write goes here, to keep the cache true."""
        self._history_writes.put(key, valid_to, version)
        if key in self._histories:
            self._history_cache.update(key, valid_to, _cached_record(valid_to, version))

    # -- reads ----------------------------------------------------------------------------

    def get(self, key: bytes, as_of: int | None = None) -> VersionedRecord | None:
        """The latest version of `key`, or with `as_of` the version valid at that time.

        None when there is no such version, when it is a tombstone, or when `as_of` is older
        than the history retention and the latest version is newer than `as_of`.
        """
        if not isinstance(key, bytes):  # check_bytes inlined: this is the hottest read path
            check_bytes("key", key)
        if not self._open:
            raise StateStoreError(f"state store {self.path} is closed")
        latest = self._cache.get(key, ABSENT)
        if latest is ABSENT:
            latest = self._load_latest(key)
        if latest is None:
            return None
        if as_of is None:
            return latest[1]  # type: ignore[index]
        if type(as_of) is not int:
            raise TypeError(f"as_of must be an int (milliseconds), got {type(as_of).__name__}")
        if as_of >= latest[0]:  # type: ignore[index]
            return latest[1]  # type: ignore[index]
        # An older version. Inlined: the expiry rule, then a hit in the history cache.
        if as_of < 0 or as_of < self._stream_time - self._retention:
            return None  # expired: only the latest version may answer, and it is newer
        entry = self._histories.get(key)
        if entry is None or entry is TOO_LARGE:
            return self._get_older_missed(key, as_of, latest[0])  # type: ignore[index]
        entry[3] = True  # read again: the CLOCK's second chance
        record = entry[1][bisect_right(entry[0], as_of)]
        if record[0] is None or record[1] > as_of:  # a tombstone, LAST, or before the first
            return None
        return record

    def _get_as_of(self, key: bytes, as_of: int) -> VersionedRecord | None:
        latest = self._latest(key)
        if latest is None:
            return None
        if as_of >= latest[0]:
            return latest[1]
        return self._get_older(key, as_of, latest[0])

    def _get_older(self, key: bytes, as_of: int, latest_ts: int) -> VersionedRecord | None:
        """The version valid at `as_of`, older than the latest version (from `latest_ts`)."""
        if as_of < 0 or as_of < self._stream_time - self._retention:
            return None  # expired: only the latest version may answer, and it is newer
        entry = self._histories.get(key)
        if entry is None or entry is TOO_LARGE:
            return self._get_older_missed(key, as_of, latest_ts)
        entry[3] = True  # read again: the CLOCK's second chance
        return _version_at(entry, as_of)

    def _get_older_missed(self, key: bytes, as_of: int, latest_ts: int) -> VersionedRecord | None:
        """`_get_older` for a key the history cache does not hold: load it, or ask RocksDB."""
        if key in self._histories:  # TOO_LARGE: keep the mark while the key is read
            self._histories.move_to_end(key)
        elif self._history_cache.admit(key):
            entry = self._load_history(key, latest_ts)
            if entry is not TOO_LARGE:
                return _version_at(entry, as_of)
        found = self._history.first_after(key, as_of, latest_ts)
        if found is None:
            return None
        valid_to, version = found
        valid_from = unpack_time(version)
        if valid_from > as_of or version[TIME_SIZE] == 0:
            return None
        return _record(version[VALUE_AT:], valid_from, valid_to)

    def _load_history(self, key: bytes, latest_ts: int) -> Entry:
        """Load `key`'s history into the history cache (see history_cache.py); its entry."""
        floor = max(self._stream_time - self._retention, 0)
        max_bytes = self._history_cache.key_limit - KEY_COST - len(key)
        loaded = self._history.load(key, floor, latest_ts, max_bytes, VERSION_COST)
        if loaded is None:
            return self._history_cache.add(key, None)
        valid_tos, versions, value_bytes = loaded
        records = [_cached_record(t, v) for t, v in zip(valid_tos, versions, strict=True)]
        return self._history_cache.add(key, (valid_tos, records, value_bytes))

    def _first_after(self, key: bytes, time: int, latest_ts: int) -> tuple[int, bytes] | None:
        """(valid_to, version) of `key`'s history version with the smallest valid_to > `time`
        (HistoryReader.first_after), from the history cache when it holds the key.

        `time` must not be expired: a cached history may lack versions ending by
        stream time minus history retention."""
        entry = self._histories.get(key)
        if entry is None or entry is TOO_LARGE:
            return self._history.first_after(key, time, latest_ts)
        value, valid_from, valid_to = entry[1][bisect_right(entry[0], time)]
        if valid_to == END:  # LAST
            return None
        return valid_to, encode_version(valid_from, value)

    def get_versions(
        self, key: bytes, from_ts: int, to_ts: int, ascending: bool = False
    ) -> list[VersionedRecord]:
        """Every non-tombstone version of `key` whose validity overlaps [from_ts, to_ts].

        Versions that ended before stream time minus history retention are expired and left
        out, like expired `get(key, as_of)` answers; the latest version never expires.
        Ordered by timestamp, newest first unless `ascending`.
        """
        check_bytes("key", key)
        check_time("from_ts", from_ts)
        check_time("to_ts", to_ts)
        if from_ts > to_ts:
            raise ValueError(f"from_ts ({from_ts}) must not be after to_ts ({to_ts})")
        if not self._open:
            raise StateStoreError(f"state store {self.path} is closed")
        latest = self._latest(key)
        if latest is None:
            return []
        latest_ts, latest_record, _ = latest
        records = []
        # A history version overlaps when valid_from <= to_ts and valid_to > floor.
        floor = max(from_ts, self._stream_time - self._retention, 0)
        if floor < latest_ts:
            for valid_to, version in sorted(
                self._history.versions_after(key, floor, latest_ts).items()
            ):
                valid_from = unpack_time(version)
                if valid_from > to_ts:
                    break
                if version[TIME_SIZE] != 0:
                    records.append(_record(version[VALUE_AT:], valid_from, valid_to))
        if latest_record is not None and latest_ts <= to_ts:
            records.append(latest_record)
        if not ascending:
            records.reverse()
        return records

    def _latest(self, key: bytes) -> _Latest | None:
        latest = self._cache.get(key, ABSENT)
        if latest is ABSENT:
            return self._load_latest(key)
        return latest  # type: ignore[return-value]

    def _load_latest(self, key: bytes) -> _Latest | None:
        version = self._latest_writes.writes.get(key)
        if version is None:
            version = self._latest_column.get(key)
        latest = None if version is None else _decode_latest(version)
        self._remember(key, latest)
        return latest

    def _remember(self, key: bytes, latest: _Latest | None) -> None:
        cache = self._cache
        cache[key] = latest
        if len(cache) > self._cache_size:
            cache.popitem(last=False)

    # -- commit hooks and expiry ----------------------------------------------------------

    def _reload_committed_view(self) -> None:
        """Forget what was cached and take stream time from disk (after prepare or settle)."""
        self._cache.clear()
        self._history_cache.clear()
        stored = self._db.columns[META].get(_STREAM_TIME)
        self._stream_time = _NO_STREAM_TIME if stored is None else unpack_time(stored)
        self._persisted_stream_time = self._stream_time

    def _after_commit(self) -> None:
        self._expire()

    def _after_prepare(self) -> None:
        self._reload_committed_view()

    def _after_settle(self) -> None:
        self._reload_committed_view()
        self._expire()

    def _after_changelog_chunk(self) -> None:
        # No expiry part-way: stream time may come in a chunk before history segments it has
        # expired, which an expiry run in between would count as dropped and leave until the
        # next open. The last part (`apply_changelog`) expires on the whole batch.
        self._reload_committed_view()

    def _expire(self) -> None:
        """Drop the segments behind the history retention, if stream time passed new ones.

        Runs when nothing is staged (at open, after a commit or a settle), on committed
        stream time. What it removes can only answer expired queries, so it needs no
        atomicity with the commit: after a crash in between, the next open does it.
        """
        boundary = self._stream_time - self._retention
        first_live = boundary // self._interval if boundary > 0 else 0
        if first_live <= self._expired_below:
            return
        for key in drop_segments_before(self._db, first_live, boundary):
            self._cache.pop(key, None)
        self._history_cache.clear()  # rare (once per segment interval): simpler than trimming
        self._expired_below = first_live

    def close(self) -> None:
        """Discard uncommitted writes and release the directory."""
        if self._open:
            self._open = False
            self._cache.clear()
            self._history_cache.clear()
            self._history.close()
            # The column object keeps the DB, and its lock, alive: it must go before the DB.
            del self._latest_column
        super().close()
