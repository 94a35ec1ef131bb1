"""VersionedKeyValueStore: every version of a key, queryable as of a time (KIP-889).

Column families: ``latest`` (key -> newest version, never expires), ``history`` (older
versions filed by valid_to into segments) and ``tombstones`` (an index of latest tombstones),
laid out as history.py describes; stream time and the segment interval live in ``meta``. Semantics
are those of NOTES.md, KIP-889:

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
"""

from __future__ import annotations

import os
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
    HistoryOverlay,
    HistoryReader,
    agree_segment_interval,
    drop_segments_before,
    encode_version,
    pack_time,
    unpack_time,
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


def _decode_latest(version: bytes) -> _Latest:
    timestamp = unpack_time(version)
    if version[TIME_SIZE] == 0:
        return timestamp, None, version
    return timestamp, VersionedRecord(version[TIME_SIZE + 1 :], timestamp, None), version


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
            self._history_writes.put(key, timestamp, latest[2])
        self._latest_writes.put(key, version)
        if value is None:
            self._tombstone_writes.put(pack_time(timestamp // self._interval) + key, b"")
            self._remember(key, (timestamp, None, version))
        else:
            self._remember(key, (timestamp, VersionedRecord(value, timestamp, None), version))
        return VALID_TO_UNDEFINED

    def _put_older(self, key: bytes, version: bytes, timestamp: int, latest_ts: int) -> int:
        """Insert a version older than the latest one, shortening its predecessor."""
        history = self._history_writes
        found = self._history.first_after(key, timestamp, latest_ts)
        if found is None:  # older than every version in history: valid until the latest
            history.put(key, latest_ts, version)
            return latest_ts
        valid_to, successor = found
        valid_from = unpack_time(successor)
        if valid_from > timestamp:  # before every stored version, up to the first of them
            history.put(key, valid_from, version)
            return valid_from
        if valid_from < timestamp:  # the version valid at `timestamp` now ends there
            history.put(key, timestamp, successor)
        history.put(key, valid_to, version)
        return valid_to

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
        return self._get_older(key, as_of, latest[0])  # type: ignore[index]

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
        found = self._history.first_after(key, as_of, latest_ts)
        if found is None:
            return None
        valid_to, version = found
        valid_from = unpack_time(version)
        if valid_from > as_of or version[TIME_SIZE] == 0:
            return None
        return VersionedRecord(version[TIME_SIZE + 1 :], valid_from, valid_to)

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
                    value = version[TIME_SIZE + 1 :]
                    records.append(VersionedRecord(value, valid_from, valid_to))
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
        self._expired_below = first_live

    def close(self) -> None:
        """Discard uncommitted writes and release the directory."""
        if self._open:
            self._open = False
            self._cache.clear()
            self._history.close()
            # The column object keeps the DB, and its lock, alive: it must go before the DB.
            del self._latest_column
        super().close()
