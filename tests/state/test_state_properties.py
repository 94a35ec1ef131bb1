"""Random operation sequences, with reopens, against plain in-memory models of docs/semantics.md."""

from __future__ import annotations

import contextlib
import copy
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform.state import (
    PUT_RETURN_CODE_NOT_PUT,
    VALID_TO_UNDEFINED,
    IsolationLevel,
    StoreOptions,
    TransactionalKeyValueStore,
    VersionedKeyValueStore,
    VersionedRecord,
)
from streamplatform.state.history_cache import HistoryCache

RC, RU = IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED
TP = ("input", 0)
SETTINGS = settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# Keys that are prefixes of each other, empty, and 0xff-heavy exercise the byte ordering.
KEYS = st.sampled_from([b"", b"a", b"a\x00", b"ab", b"b", b"\xff", b"\xff\xff"])
VALUES = st.binary(max_size=3)


# -- key-value store --------------------------------------------------------------------


class KeyValueModel:
    """KIP-892 as a dict: committed data plus the writing transaction's staged writes."""

    def __init__(self, isolation: IsolationLevel) -> None:
        self.isolation = isolation
        self.committed: dict[bytes, bytes] = {}
        self.staged: dict[bytes, bytes | None] = {}  # None: a staged delete
        self.offset: int | None = None
        self.entries = self.nbytes = 0  # uncommitted, as the store counts them

    def write(self, key: bytes, value: bytes | None) -> None:
        size = len(key) + (0 if value is None else len(value))
        if self.isolation is RU:  # applied at once, counted per write until commit
            self._apply(key, value)
            self.entries += 1
            self.nbytes += size
            return
        self.staged[key] = value
        self.entries = len(self.staged)
        self.nbytes = sum(len(k) + (0 if v is None else len(v)) for k, v in self.staged.items())

    def _apply(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.committed.pop(key, None)
        else:
            self.committed[key] = value

    def view(self) -> dict[bytes, bytes]:
        merged = dict(self.committed)
        for key, value in self.staged.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return merged

    def commit(self, offset: int) -> None:
        for key, value in self.staged.items():
            self._apply(key, value)
        self.discard()
        self.offset = offset

    def discard(self) -> None:
        self.staged = {}
        self.entries = self.nbytes = 0


def scan(data: dict[bytes, bytes], start: bytes | None, end: bytes | None) -> list:
    return sorted(
        (k, v)
        for k, v in data.items()
        if (start is None or k >= start) and (end is None or k < end)
    )


KV_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, VALUES),
        st.tuples(st.just("delete"), KEYS),
        st.tuples(st.just("get"), KEYS),
        st.tuples(st.just("store_get"), KEYS),
        st.tuples(st.just("range"), st.none() | KEYS, st.none() | KEYS),
        st.tuples(st.just("prefix"), KEYS),
        st.tuples(st.just("commit")),
        st.tuples(st.just("close_transaction")),
        st.tuples(st.just("reopen")),
    ),
    max_size=30,
)


def run_key_value(isolation: IsolationLevel, ops: list[tuple]) -> None:
    model = KeyValueModel(isolation)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "kv"
        store = TransactionalKeyValueStore(path, isolation)
        try:
            for step, (op, *args) in enumerate(ops):
                txn = store.transaction
                if op == "put":
                    txn.put(*args)
                    model.write(*args)
                elif op == "delete":
                    txn.delete(*args)
                    model.write(args[0], None)
                elif op == "get":
                    assert txn.get(*args) == model.view().get(args[0])
                elif op == "store_get":
                    assert store.get(*args) == model.committed.get(args[0])
                elif op == "range":
                    assert list(txn.range(*args)) == scan(model.view(), *args)
                    assert list(store.range(*args)) == scan(model.committed, *args)
                elif op == "prefix":
                    expected = [
                        (k, v) for k, v in scan(model.view(), None, None) if k.startswith(args[0])
                    ]
                    assert list(txn.prefix(*args)) == expected
                elif op == "commit":
                    store.commit({TP: step})
                    model.commit(step)
                elif op == "close_transaction":
                    txn.close()
                    model.discard()
                else:
                    store.close()
                    store = TransactionalKeyValueStore(path, isolation)
                    model.discard()
                assert store.approximate_num_uncommitted_entries() == model.entries
                assert store.approximate_num_uncommitted_bytes() == model.nbytes
                assert store.committed_offset(TP) == model.offset
        finally:
            store.close()


@SETTINGS
@given(KV_OPS)
def test_key_value_store_matches_model_read_committed(ops: list[tuple]) -> None:
    run_key_value(RC, ops)


@SETTINGS
@given(KV_OPS)
def test_key_value_store_matches_model_read_uncommitted(ops: list[tuple]) -> None:
    run_key_value(RU, ops)


# -- versioned store --------------------------------------------------------------------


class VersionedModel:
    """KIP-889 as docs/semantics.md states it, over every version ever accepted (nothing expires)."""

    def __init__(self, retention: int) -> None:
        self.retention = retention
        self.versions: dict[bytes, dict[int, bytes | None]] = {}  # key -> {timestamp: value}
        self.stream_time: int | None = None

    def expired(self, time: int) -> bool:
        return self.stream_time is not None and time < self.stream_time - self.retention

    def put(self, key: bytes, value: bytes | None, ts: int) -> int:
        if self.expired(ts):
            return PUT_RETURN_CODE_NOT_PUT
        self.stream_time = ts if self.stream_time is None else max(self.stream_time, ts)
        versions = self.versions.setdefault(key, {})
        versions[ts] = value
        later = [t for t in versions if t > ts]
        return min(later) if later else VALID_TO_UNDEFINED

    def _record(self, key: bytes, ts: int) -> VersionedRecord | None:
        versions = self.versions[key]
        if versions[ts] is None:
            return None
        later = [t for t in versions if t > ts]
        return VersionedRecord(versions[ts], ts, min(later) if later else None)

    def get(self, key: bytes, as_of: int | None = None) -> VersionedRecord | None:
        versions = self.versions.get(key, {})
        if not versions:
            return None
        latest = max(versions)
        if as_of is None or as_of >= latest:
            return self._record(key, latest)
        if self.expired(as_of):  # only the latest version may answer, and it is newer
            return None
        started = [t for t in versions if t <= as_of]
        return self._record(key, max(started)) if started else None

    def delete(self, key: bytes, ts: int) -> VersionedRecord | None:
        if self.expired(ts):
            return None
        previous = self.get(key, ts)
        self.put(key, None, ts)
        return previous

    def get_versions(self, key: bytes, start: int, end: int, ascending: bool) -> list:
        versions = self.versions.get(key, {})
        records = []
        for ts in sorted(versions):
            record = self._record(key, ts)
            if record is None or ts > end:
                continue
            valid_to = record.valid_to
            if valid_to is not None and (valid_to <= start or self.expired(valid_to - 1)):
                continue
            records.append(record)
        return records if ascending else records[::-1]


TIMES = st.integers(min_value=0, max_value=60)
VERSIONED_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.none() | VALUES, TIMES),
        st.tuples(st.just("delete"), KEYS, TIMES),
        st.tuples(st.just("get"), KEYS, st.none() | TIMES),
        st.tuples(st.just("get_versions"), KEYS, TIMES, TIMES, st.booleans()),
        st.tuples(st.just("commit")),
        st.tuples(st.just("two_phase"), st.booleans(), st.booleans()),
        st.tuples(st.just("reopen")),
    ),
    max_size=30,
)
RETENTIONS = st.sampled_from([0, 5, 20, 1_000])
INTERVALS = st.sampled_from([None, 1, 3, 7])


# History cache settings: as shipped; loading a key at its first lookup that misses (so that
# nearly every older read is served by the cache); the same with a cache of ~4 keys of ~8
# versions each (eviction, keys too large to cache).
CACHES = {
    "default": (None, False),
    "eager": (None, True),
    "tiny": (StoreOptions(history_cache_bytes=16_000), True),
}
# For the cache: few keys, so that each gets many versions, and many reads; after every
# operation on a key its whole history is read back (see `sweep` in run_versioned).
FEW_KEYS = st.sampled_from([b"", b"a", b"ab"])
CACHE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), FEW_KEYS, st.none() | VALUES, TIMES),
        st.tuples(st.just("put"), FEW_KEYS, VALUES, TIMES),
        st.tuples(st.just("delete"), FEW_KEYS, TIMES),
        st.tuples(st.just("get"), FEW_KEYS, TIMES),
        st.tuples(st.just("get_versions"), FEW_KEYS, TIMES, TIMES, st.booleans()),
        st.tuples(st.just("commit")),
        st.tuples(st.just("two_phase"), st.booleans(), st.booleans()),
        st.tuples(st.just("reopen")),
    ),
    max_size=40,
)


def _load_at_first_miss(cache: HistoryCache, key: bytes) -> bool:
    return cache.capacity > 0


def run_versioned(
    isolation: IsolationLevel,
    retention: int,
    interval: int | None,
    ops: list[tuple],
    cache: str = "default",
    sweep: bool = False,
) -> None:
    model = VersionedModel(retention)
    committed = copy.deepcopy(model)
    options, eager = CACHES[cache]

    def open_store(path: Path) -> VersionedKeyValueStore:
        return VersionedKeyValueStore(
            path, retention, interval, isolation_level=isolation, options=options
        )

    loading = (
        mock.patch.object(HistoryCache, "admit", _load_at_first_miss)
        if eager
        else contextlib.nullcontext()
    )
    with loading, tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "v"
        store = open_store(path)
        try:
            for step, (op, *args) in enumerate(ops):
                if op == "put":
                    assert store.put(*args) == model.put(*args)
                elif op == "delete":
                    assert store.delete(*args) == model.delete(*args)
                elif op == "get":
                    assert store.get(*args) == model.get(*args)
                elif op == "get_versions":
                    key, a, b, ascending = args
                    start, end = min(a, b), max(a, b)
                    assert store.get_versions(key, start, end, ascending) == model.get_versions(
                        key, start, end, ascending
                    )
                elif op == "commit" or (op == "two_phase" and isolation is RU):
                    store.commit({TP: step})  # READ_UNCOMMITTED cannot prepare
                    committed = copy.deepcopy(model)
                elif op == "two_phase":
                    outcome, reopen_between = args
                    store.prepare(step, {TP: step})
                    if reopen_between:
                        store.close()
                        store = open_store(path)
                    assert store.settle(step, outcome)
                    if outcome:
                        committed = copy.deepcopy(model)
                    else:
                        model = copy.deepcopy(committed)
                else:
                    store.close()
                    store = open_store(path)
                    if isolation is RC:  # READ_UNCOMMITTED applied every write already
                        model = copy.deepcopy(committed)
                assert store.stream_time == model.stream_time
                if sweep:
                    for key in {args[0]} if op in ("put", "delete", "get") else model.versions:
                        for as_of in range(-1, 62):
                            assert store.get(key, as_of) == model.get(key, as_of), (key, as_of)
        finally:
            store.close()


@SETTINGS
@given(RETENTIONS, INTERVALS, VERSIONED_OPS)
def test_versioned_store_matches_model_read_committed(
    retention: int, interval: int | None, ops: list[tuple]
) -> None:
    run_versioned(RC, retention, interval, ops)


@SETTINGS
@given(RETENTIONS, INTERVALS, VERSIONED_OPS)
def test_versioned_store_matches_model_read_uncommitted(
    retention: int, interval: int | None, ops: list[tuple]
) -> None:
    run_versioned(RU, retention, interval, ops)


@SETTINGS
@given(st.sampled_from(list(CACHES)), RETENTIONS, INTERVALS, CACHE_OPS)
def test_versioned_store_history_cache_matches_model_read_committed(
    cache: str, retention: int, interval: int | None, ops: list[tuple]
) -> None:
    run_versioned(RC, retention, interval, ops, cache, sweep=True)


@SETTINGS
@given(st.sampled_from(list(CACHES)), RETENTIONS, INTERVALS, CACHE_OPS)
def test_versioned_store_history_cache_matches_model_read_uncommitted(
    cache: str, retention: int, interval: int | None, ops: list[tuple]
) -> None:
    run_versioned(RU, retention, interval, ops, cache, sweep=True)
