"""The versioned store's history cache (history_cache.py): never stale, bounded, worth it.

Most tests run the same operations on a store whose cache loads a key at its first lookup
that misses and on a store without the cache, and compare every `get(key, as_of)`.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from streamplatform.state import (
    IsolationLevel,
    StoreOptions,
    VersionedKeyValueStore,
    VersionedRecord,
)
from streamplatform.state.history_cache import (
    MISSES_PER_EVICTING_LOAD,
    TOO_LARGE,
    HistoryCache,
)

K = b"key"
TP = ("input", 0)
NO_CACHE = StoreOptions(history_cache_bytes=0)
TIMES = range(-1, 80)


def _load_at_first_miss(cache: HistoryCache, key: bytes) -> bool:
    return cache.capacity > 0


@pytest.fixture
def eager() -> Iterator[None]:
    """Load a key's history at its first lookup that misses, not its second."""
    with mock.patch.object(HistoryCache, "admit", _load_at_first_miss):
        yield


def cached(store: VersionedKeyValueStore, key: bytes = K) -> bool:
    entry = store._histories.get(key)
    return entry is not None and entry is not TOO_LARGE


class Pair:
    """One store with the history cache, one without; writes go to both, reads compare."""

    def __init__(self, path: Path, retention: int = 1_000, **kwargs) -> None:
        self.paths = (path / "cached", path / "plain")
        self.kwargs = dict(kwargs, history_retention_ms=retention)
        self.open()

    def open(self) -> None:
        self.cached = VersionedKeyValueStore(self.paths[0], **self.kwargs)
        self.plain = VersionedKeyValueStore(self.paths[1], options=NO_CACHE, **self.kwargs)

    def reopen(self) -> None:
        self.close()
        self.open()

    def close(self) -> None:
        self.cached.close()
        self.plain.close()

    def both(self, method: str, *args):
        expected = getattr(self.plain, method)(*args)
        assert getattr(self.cached, method)(*args) == expected, (method, args)
        return expected

    def check(self, key: bytes = K) -> None:
        """Every as_of agrees; the key's history is then cached (when it may be)."""
        for as_of in TIMES:
            assert self.cached.get(key, as_of) == self.plain.get(key, as_of), as_of
        assert self.cached.get_versions(key, 0, 100) == self.plain.get_versions(key, 0, 100)


@pytest.fixture
def pair(tmp_path: Path, eager: None) -> Iterator[Pair]:
    stores = Pair(tmp_path)
    yield stores
    stores.close()


def _history(pair: Pair, key: bytes = K) -> None:
    for ts, value in ((10, b"a"), (20, b"b"), (30, None), (40, b""), (50, b"e")):
        pair.both("put", key, value, ts)
    pair.check(key)
    assert cached(pair.cached, key)


def test_a_key_read_twice_is_then_read_from_memory(tmp_path: Path) -> None:
    with VersionedKeyValueStore(tmp_path / "v", 1_000) as store:
        for ts in range(0, 100, 10):
            store.put(K, b"v%d" % ts, ts)
        store.commit()
        assert store.get(K, 15) == VersionedRecord(b"v10", 10, 20)
        assert not cached(store)  # a key read once costs no load
        assert store.get(K, 25) == VersionedRecord(b"v20", 20, 30)
        assert cached(store)
        with (
            mock.patch.object(store._history, "first_after", side_effect=AssertionError),
            mock.patch.object(store._history, "load", side_effect=AssertionError),
        ):
            for ts in range(0, 90, 10):
                assert store.get(K, ts + 5) == VersionedRecord(b"v%d" % ts, ts, ts + 10)
            assert store.get(K, 95) == VersionedRecord(b"v90", 90, None)


@pytest.mark.parametrize(
    ("key", "value", "ts"),
    [
        (K, b"new", 60),  # in order: the latest moves to history
        (K, None, 60),  # a tombstone in order
        (K, b"mid", 25),  # out of order: shortens b, ends at the tombstone
        (K, None, 15),  # an older tombstone splits a
        (K, b"first", 5),  # before every version
        (K, b"b2", 20),  # replaces an older version
        (K, b"e2", 50),  # replaces the latest
        (K, b"at", 30),  # replaces the older tombstone with a value
        (b"other", b"x", 60),  # another key moves stream time only
    ],
)
def test_writes_to_a_cached_key_keep_it_true(pair: Pair, key: bytes, value, ts: int) -> None:
    _history(pair)
    pair.both("put", key, value, ts)
    pair.check()
    pair.both("delete", K, 35)
    pair.check()
    pair.both("commit", {TP: 1})
    pair.check()


def test_many_out_of_order_writes_to_a_cached_key(pair: Pair) -> None:
    _history(pair)
    for i, ts in enumerate((33, 12, 47, 3, 33, 21, 50, 18, 44, 30, 1, 49)):
        pair.both("put", K, None if i % 4 == 3 else b"w%d" % i, ts)
        pair.check()
        if i % 5 == 4:
            pair.both("commit", {TP: i})


def test_prepare_and_settle_reload_what_is_committed(pair: Pair) -> None:
    _history(pair)
    pair.both("commit", {TP: 1})
    pair.check()
    pair.both("put", K, b"staged", 25)  # staged: read-your-writes through the cache
    pair.check()
    assert pair.cached.get(K, 27) == VersionedRecord(b"staged", 25, 30)
    pair.both("prepare", 1, {TP: 2})
    assert pair.cached._history_cache.num_bytes == 0
    pair.check()  # prepared, not applied: the committed view again
    assert pair.cached.get(K, 27) == VersionedRecord(b"b", 20, 30)
    pair.both("settle", 1, False)
    pair.check()
    assert pair.cached.get(K, 27) == VersionedRecord(b"b", 20, 30)
    pair.both("put", K, b"again", 25)
    pair.both("prepare", 2, {TP: 3})
    pair.check()
    pair.both("settle", 2, True)
    assert pair.cached._history_cache.num_bytes == 0
    pair.check()
    assert pair.cached.get(K, 27) == VersionedRecord(b"again", 25, 30)


def test_apply_changelog_reloads(tmp_path: Path, eager: None) -> None:
    with VersionedKeyValueStore(tmp_path / "source", 1_000) as source:
        source.put(K, b"older", 15)
        changelog = source.staged_writes()  # an out-of-order version, without the rest
    pair = Pair(tmp_path)
    try:
        _history(pair)
        pair.both("commit", {TP: 1})
        pair.check()
        # Replayed changelog: latest b"older"@15 (what the source saw) and stream time 15.
        pair.both("apply_changelog", changelog, {TP: 2})
        assert pair.cached._history_cache.num_bytes == 0
        pair.check()
        assert pair.cached.get(K) == VersionedRecord(b"older", 15, None)
    finally:
        pair.close()


def test_changelog_of_a_cached_key_replayed_on_a_cached_replica(
    tmp_path: Path, eager: None
) -> None:
    with (
        VersionedKeyValueStore(tmp_path / "source", 1_000) as source,
        VersionedKeyValueStore(tmp_path / "replica", 1_000) as replica,
    ):
        for ts in (10, 20, 30):
            source.put(K, b"v%d" % ts, ts)
        replica.apply_changelog(source.staged_writes(), {TP: 1})
        source.commit({TP: 1})
        assert replica.get(K, 15) == VersionedRecord(b"v10", 10, 20)
        assert cached(replica)
        source.put(K, b"v25", 25)  # out of order: rewrites v20 to end at 25
        replica.apply_changelog(source.staged_writes(), {TP: 2})
        source.commit({TP: 2})
        for as_of in TIMES:
            assert replica.get(K, as_of) == source.get(K, as_of), as_of


def test_segment_expiry_empties_the_cache_and_the_boundary_still_answers(
    tmp_path: Path, eager: None
) -> None:
    pair = Pair(tmp_path, retention=100, segment_interval_ms=50)
    try:
        for ts in (0, 20, 95, 100, 130, 150, 199):
            pair.both("put", K, b"v%d" % ts, ts)
        pair.both("commit", {TP: 1})  # stream time 199, boundary 99: segment 0 dropped
        # Loaded at the boundary: the version ending just after it is kept.
        assert pair.cached.get(K, 99) == VersionedRecord(b"v95", 95, 100)
        assert cached(pair.cached)
        pair.check()
        pair.both("put", K, b"v200", 200)  # boundary 100
        assert pair.cached.get(K, 99) is None  # expired now
        assert pair.cached.get(K, 100) == VersionedRecord(b"v100", 100, 130)
        pair.check()
        pair.both("put", b"other", b"x", 260)  # boundary 160
        pair.check()
        assert cached(pair.cached)
        pair.both("commit", {TP: 2})  # drops segments 1 and 2 ([50, 150))
        assert pair.cached._history_cache.num_bytes == 0
        pair.check()
        assert pair.cached.get(K, 160) == VersionedRecord(b"v150", 150, 199)
    finally:
        pair.close()


def test_reopen_starts_empty_and_forgets_what_was_not_committed(pair: Pair) -> None:
    _history(pair)
    pair.both("commit", {TP: 1})
    pair.both("put", K, b"uncommitted", 25)
    pair.check()
    pair.reopen()
    assert not pair.cached._histories
    pair.check()
    assert pair.cached.get(K, 27) == VersionedRecord(b"b", 20, 30)


def test_read_uncommitted_writes_keep_the_cache_true(tmp_path: Path, eager: None) -> None:
    pair = Pair(tmp_path, isolation_level=IsolationLevel.READ_UNCOMMITTED)
    try:
        _history(pair)
        for ts, value in ((25, b"x"), (45, None), (60, b"y"), (5, b"z")):
            pair.both("put", K, value, ts)
            pair.check()
        pair.reopen()  # applied at once: nothing to lose
        pair.check()
        assert pair.cached.get(K, 26) == VersionedRecord(b"x", 25, 30)
    finally:
        pair.close()


def test_keys_read_once_are_not_loaded(tmp_path: Path) -> None:
    with VersionedKeyValueStore(tmp_path / "v", 1_000) as store:
        keys = [b"k%d" % i for i in range(100)]
        for key in keys:
            store.put(key, b"a", 1)
            store.put(key, b"b", 2)
        for key in keys:
            assert store.get(key, 1) == VersionedRecord(b"a", 1, 2)
        assert not store._histories


def test_bounded_with_eviction_and_keys_too_large(tmp_path: Path, eager: None) -> None:
    options = StoreOptions(history_cache_bytes=40_000)  # a key may take 5,000 bytes
    with VersionedKeyValueStore(tmp_path / "v", 10_000, options=options) as store:
        keys = [b"k%02d" % i for i in range(40)]
        for ts in range(1, 11):  # ten versions per key: ~2,500 bytes
            for key in keys:
                store.put(key, b"%s@%d" % (key, ts), ts)
        for ts in range(11, 100):  # "big" gets 99 versions: more than a key may take
            store.put(b"big", b"x" * 10, ts)
        cache = store._history_cache
        loads = []
        real_load = store._history.load

        def counting_load(key, *args):
            loads.append(key)
            return real_load(key, *args)

        with mock.patch.object(store._history, "load", counting_load):
            for _ in range(3):
                for key in keys:
                    assert store.get(key, 5) == VersionedRecord(b"%s@5" % key, 5, 6)
                    assert cache.num_bytes <= cache.capacity
                    assert store.get(keys[0], 3) == VersionedRecord(b"k00@3", 3, 4)  # hot
                    assert store.get(b"big", 50) == VersionedRecord(b"x" * 10, 50, 51)  # hot
        assert 5 <= len(store._histories) < len(keys)
        assert cached(store, keys[0])  # the CLOCK gave the hot key its second chances
        assert loads.count(keys[0]) == 1
        assert store._histories[b"big"] is TOO_LARGE  # kept while read: one failed load
        assert loads.count(b"big") == 1
        assert store.get(b"big", 60) == VersionedRecord(b"x" * 10, 60, 61)


def test_replacing_a_cached_version_keeps_the_count(tmp_path: Path, eager: None) -> None:
    with VersionedKeyValueStore(tmp_path / "v", 1_000) as store:
        for ts in (1, 2, 3):
            store.put(K, b"v%d" % ts, ts)
        assert store.get(K, 1) == VersionedRecord(b"v1", 1, 2)
        counted = store._history_cache.num_bytes
        store.put(K, b"w1", 1)
        store.put(K, b"w2", 2)
        assert store._history_cache.num_bytes == counted
        assert list(store._histories[K][0][:-1]) == [2, 3]
        store.put(K, b"longer", 1)
        assert store._history_cache.num_bytes == counted + 4
        assert store.get(K, 1) == VersionedRecord(b"longer", 1, 2)


def test_a_cached_key_growing_too_large_is_dropped(tmp_path: Path, eager: None) -> None:
    options = StoreOptions(history_cache_bytes=40_000)
    with VersionedKeyValueStore(tmp_path / "v", 10_000, options=options) as store:
        store.put(K, b"a", 1)
        store.put(K, b"b", 2)
        assert store.get(K, 1) == VersionedRecord(b"a", 1, 2)
        assert cached(store)
        for ts in range(3, 100):
            store.put(K, b"v%d" % ts, ts)
        assert store._histories[K] is TOO_LARGE
        assert store._history_cache.num_bytes <= store._history_cache.key_limit
        assert store.get(K, 1) == VersionedRecord(b"a", 1, 2)
        assert store.get(K, 50) == VersionedRecord(b"v50", 50, 51)


def test_a_working_set_larger_than_the_cache_does_not_make_every_lookup_a_load(
    tmp_path: Path,
) -> None:
    options = StoreOptions(history_cache_bytes=40_000)  # ~16 of the 200 keys
    with VersionedKeyValueStore(tmp_path / "v", 10_000, options=options) as store:
        keys = [b"k%03d" % i for i in range(200)]
        for ts in range(1, 11):
            for key in keys:
                store.put(key, b"v", ts)
        loads = 0
        real_load = store._history.load

        def counting_load(*args):
            nonlocal loads
            loads += 1
            return real_load(*args)

        with mock.patch.object(store._history, "load", counting_load):
            lookups = 0
            for _ in range(10):
                for i in range(0, 200, 1):
                    key = keys[(i * 7919) % 200]
                    assert store.get(key, 5) == VersionedRecord(b"v", 5, 6)
                    lookups += 1
        # Loads that fill free space, then at most one per MISSES_PER_EVICTING_LOAD misses.
        assert loads <= 40 + lookups // MISSES_PER_EVICTING_LOAD


def test_off_caches_nothing(tmp_path: Path, eager: None) -> None:
    with VersionedKeyValueStore(tmp_path / "v", 1_000, options=NO_CACHE) as store:
        store.put(K, b"a", 1)
        store.put(K, b"b", 2)
        for _ in range(3):
            assert store.get(K, 1) == VersionedRecord(b"a", 1, 2)
        assert not store._histories


@pytest.mark.parametrize(
    ("value_size", "versions", "slack"),
    [
        (0, 20, 2.0),  # b"" (and a tombstone) has no bytes object of its own: overcounted
        (64, 20, 1.2),
        (1_000, 5, 1.2),
        (64, 1, 1.2),
    ],
)
def test_counted_bytes_cover_the_memory_taken(
    tmp_path: Path, eager: None, value_size: int, versions: int, slack: float
) -> None:
    with VersionedKeyValueStore(tmp_path / "v", 10**9) as store:
        keys = [os.urandom(12) for _ in range(300)]
        for i in range(versions + 1):
            for key in keys:  # epoch milliseconds: ints that are objects of their own
                store.put(key, os.urandom(value_size), 1_700_000_000_000 + 1_000 * i)
        store.commit()
        latest = {key: store._latest(key)[0] for key in keys}  # type: ignore[index]
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for key in keys:
                store._load_history(key, latest[key])
            taken = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        counted = store._history_cache.num_bytes
        # Keys' own bytes exist already here; in a store they are held by the cache too.
        taken += len(keys) * (33 + 12)
        # The cache's own hash table grows in steps (a resize allocates a whole new table), so
        # what tracemalloc sees may exceed an exact per-entry count by a little: 2% is allowed.
        assert 0.98 * taken <= counted <= slack * taken
