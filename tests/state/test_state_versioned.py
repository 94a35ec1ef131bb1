"""KIP-889 rules of docs/semantics.md, one test each, on VersionedKeyValueStore."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import AccessType, Options, Rdict

from streamplatform.state import (
    PUT_RETURN_CODE_NOT_PUT,
    VALID_TO_UNDEFINED,
    IsolationLevel,
    StateStoreError,
    VersionedKeyValueStore,
    VersionedRecord,
)
from streamplatform.state.history import default_segment_interval

K = b"key"


@pytest.fixture
def store(tmp_path: Path):
    with VersionedKeyValueStore(tmp_path / "v", history_retention_ms=100) as s:
        yield s


def test_return_codes_are_kafkas() -> None:
    assert PUT_RETURN_CODE_NOT_PUT == -(2**63)  # Long.MIN_VALUE
    assert VALID_TO_UNDEFINED == -1


def test_put_exactly_at_retention_boundary_is_accepted(store: VersionedKeyValueStore) -> None:
    store.put(b"other", b"x", 1_000)  # stream time 1000, boundary 900
    assert store.put(K, b"at", 900) == VALID_TO_UNDEFINED
    assert store.get(K, 900) == VersionedRecord(b"at", 900, None)


def test_put_one_ms_before_retention_boundary_is_not_put(store: VersionedKeyValueStore) -> None:
    store.put(b"other", b"x", 1_000)
    assert store.put(K, b"late", 899) == PUT_RETURN_CODE_NOT_PUT
    assert store.get(K) is None
    assert store.stream_time == 1_000


def test_zero_retention_accepts_only_stream_time_and_keeps_no_history(tmp_path: Path) -> None:
    with VersionedKeyValueStore(tmp_path / "v", history_retention_ms=0) as store:
        assert store.put(K, b"a", 10) == VALID_TO_UNDEFINED
        assert store.put(K, b"b", 20) == VALID_TO_UNDEFINED
        assert store.put(K, b"late", 19) == PUT_RETURN_CODE_NOT_PUT
        assert store.put(K, b"b2", 20) == VALID_TO_UNDEFINED  # same timestamp replaces
        assert store.get(K, 20) == VersionedRecord(b"b2", 20, None)
        assert store.get(K, 15) is None  # expired, and the latest version is newer


def test_empty_value_is_a_value_and_none_is_a_tombstone(store: VersionedKeyValueStore) -> None:
    store.put(K, b"", 10)
    assert store.get(K) == VersionedRecord(b"", 10, None)
    store.put(K, None, 20)
    assert store.get(K) is None
    assert store.get(K, 15) == VersionedRecord(b"", 10, 20)
    assert store.get(K, 25) is None


def test_tombstone_with_nothing_before_it_bounds_a_later_older_put(
    store: VersionedKeyValueStore,
) -> None:
    assert store.put(K, None, 50) == VALID_TO_UNDEFINED
    assert store.get(K) is None
    assert store.put(K, b"older", 30) == 50  # valid until the tombstone
    assert store.get(K, 40) == VersionedRecord(b"older", 30, 50)
    assert store.get(K, 50) is None
    assert store.get(K) is None


def test_same_key_and_timestamp_replaces_latest_and_older_versions(
    store: VersionedKeyValueStore,
) -> None:
    store.put(K, b"a", 10)
    store.put(K, b"b", 20)
    assert store.put(K, b"b2", 20) == VALID_TO_UNDEFINED
    assert store.put(K, b"a2", 10) == 20
    assert store.get_versions(K, 0, 100, ascending=True) == [
        VersionedRecord(b"a2", 10, 20),
        VersionedRecord(b"b2", 20, None),
    ]


def test_out_of_order_put_shortens_predecessor_and_returns_its_valid_to(
    store: VersionedKeyValueStore,
) -> None:
    store.put(K, b"a", 10)
    store.put(K, b"c", 30)
    assert store.put(K, b"b", 20) == 30
    assert store.put(K, b"z", 5) == 10  # before every version: valid until the first
    assert store.get(K, 15) == VersionedRecord(b"a", 10, 20)
    assert store.get(K, 25) == VersionedRecord(b"b", 20, 30)
    assert store.get(K, 7) == VersionedRecord(b"z", 5, 10)
    assert store.get(K, 4) is None


def test_kip_889_temporal_join_example(store: VersionedKeyValueStore) -> None:
    # Table B: b0@0, then b3@3; stream A looks up at its own timestamp, a2@2 arriving last.
    store.put(b"B", b"b0", 0)
    assert store.get(b"B", 1).value == b"b0"  # a1@1 -> (a1, b0)
    store.put(b"B", b"b3", 3)
    assert store.get(b"B", 4).value == b"b3"  # a4@4 -> (a4, b3)
    assert store.get(b"B", 2).value == b"b0"  # a2@2 -> (a2, b0)


def test_delete_returns_what_was_valid_and_ends_it(store: VersionedKeyValueStore) -> None:
    store.put(K, b"a", 10)
    store.put(K, b"c", 30)
    assert store.delete(K, 20) == VersionedRecord(b"a", 10, 30)
    assert store.get(K, 15) == VersionedRecord(b"a", 10, 20)
    assert store.get(K, 25) is None
    assert store.delete(K, 40) == VersionedRecord(b"c", 30, None)
    assert store.get(K) is None
    assert store.delete(b"never", 40) is None


def test_delete_outside_retention_returns_none_and_changes_nothing(
    store: VersionedKeyValueStore,
) -> None:
    store.put(K, b"a", 10)
    store.put(b"other", b"x", 500)  # boundary 400
    assert store.delete(K, 399) is None
    assert store.get(K) == VersionedRecord(b"a", 10, None)
    assert store.stream_time == 500


def test_expired_query_is_answered_by_the_latest_version_only(
    store: VersionedKeyValueStore,
) -> None:
    store.put(b"single", b"s", 10)
    store.put(K, b"old", 0)
    store.put(K, b"new", 150)
    store.put(b"other", b"x", 300)  # stream time 300, boundary 200
    # 50 is expired: the latest version of K (150) is newer, so nothing answers, although
    # the version valid at 50 may still be on disk.
    assert store.get(K, 50) is None
    # The latest version of "single" started before as_of: it answers the expired query.
    assert store.get(b"single", 50) == VersionedRecord(b"s", 10, None)
    assert store.get(K, 200) == VersionedRecord(b"new", 150, None)


def test_get_versions_overlapping_a_range_newest_first(store: VersionedKeyValueStore) -> None:
    for ts, value in ((10, b"a"), (20, None), (30, b"c"), (40, b"d")):
        store.put(K, value, ts)
    assert store.get_versions(K, 15, 35) == [
        VersionedRecord(b"c", 30, 40),
        VersionedRecord(b"a", 10, 20),
    ]
    assert store.get_versions(K, 40, 40) == [VersionedRecord(b"d", 40, None)]
    assert store.get_versions(K, 0, 5) == []
    with pytest.raises(ValueError, match="from_ts"):
        store.get_versions(K, 10, 5)


def _disk_keys(path: Path, column_family: str) -> list[bytes]:
    """Keys of a column family as RocksDB holds them, read with the store closed."""
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only(False))
    try:
        return list(db.get_column_family(column_family).keys())
    finally:
        db.close()


def test_whole_segments_are_dropped_after_the_commit_passing_them(tmp_path: Path) -> None:
    path = tmp_path / "v"
    with VersionedKeyValueStore(path, history_retention_ms=100, segment_interval_ms=50) as store:
        for ts in range(0, 200, 10):  # versions valid_to 10..190 land in segments 0..3
            store.put(K, b"v%d" % ts, ts)
        store.put(b"gone", b"x", 10)
        store.put(b"gone", None, 20)  # a latest tombstone, filed in segment 0
        store.commit()  # stream time 190, boundary 90: segment 0 ([0, 50)) is behind it
    # K's 19 older versions minus the 4 ending in segment 0; gone's one ended there too.
    assert len(_disk_keys(path, "history")) == 15
    assert b"gone" not in _disk_keys(path, "latest")
    with VersionedKeyValueStore(path, history_retention_ms=100) as store:
        assert store.get(K, 95) == VersionedRecord(b"v90", 90, 100)
        store.put(K, b"far", 1_000)
        store.commit()  # boundary 900: only v190, valid until 1000, is still history
    assert len(_disk_keys(path, "history")) == 1
    with VersionedKeyValueStore(path, history_retention_ms=100) as store:
        assert store.get(K, 950) == VersionedRecord(b"v190", 190, 1_000)


@pytest.mark.parametrize(
    ("retention_ms", "interval_ms"),
    [
        (0, 2_000),
        (6_000, 2_000),
        (60_000, 20_000),  # hr <= 60 s: max(hr/3, 2 s)
        (60_001, 20_000),
        (300_000, 60_000),  # hr <= 5 min: max(hr/5, 20 s)
        (300_001, 60_000),
        (3_600_000, 300_000),  # hr <= 1 h: max(hr/12, 60 s)
        (3_600_001, 300_000),
        (86_400_000, 3_600_000),  # else: max(hr/24, 5 min)
    ],
)
def test_default_segment_interval_per_band(
    tmp_path: Path, retention_ms: int, interval_ms: int
) -> None:
    assert default_segment_interval(retention_ms) == interval_ms
    with VersionedKeyValueStore(tmp_path / "v", retention_ms) as store:
        assert store.segment_interval_ms == interval_ms


def test_stream_time_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "v"
    with VersionedKeyValueStore(path, history_retention_ms=100) as store:
        store.put(K, b"a", 1_000)
        store.commit()
        store.put(K, b"uncommitted", 5_000)
    with VersionedKeyValueStore(path, history_retention_ms=100) as store:
        assert store.stream_time == 1_000
        assert store.put(K, b"late", 899) == PUT_RETURN_CODE_NOT_PUT
        assert store.get(K) == VersionedRecord(b"a", 1_000, None)


def test_stream_time_survives_reopen_under_read_uncommitted(tmp_path: Path) -> None:
    path = tmp_path / "v"
    ru = IsolationLevel.READ_UNCOMMITTED
    with VersionedKeyValueStore(path, 100, isolation_level=ru) as store:
        store.put(K, b"a", 1_000)  # applied at once, stream time with it
    with VersionedKeyValueStore(path, 100, isolation_level=ru) as store:
        assert store.stream_time == 1_000
        assert store.get(K) == VersionedRecord(b"a", 1_000, None)


def test_reads_see_own_uncommitted_writes_and_reopen_discards_them(tmp_path: Path) -> None:
    path = tmp_path / "v"
    with VersionedKeyValueStore(path, history_retention_ms=1_000) as store:
        store.put(K, b"a", 10)
        store.commit()
        store.put(K, b"b", 20)
        store.put(K, b"a2", 10)  # replaces a committed older version, uncommitted
        assert store.get(K, 15) == VersionedRecord(b"a2", 10, 20)
        assert store.approximate_num_uncommitted_entries() > 0
    with VersionedKeyValueStore(path, history_retention_ms=1_000) as store:
        assert store.get_versions(K, 0, 100) == [VersionedRecord(b"a", 10, None)]


def test_latest_cache_off_gives_the_same_answers(tmp_path: Path) -> None:
    from streamplatform.state import StoreOptions

    options = StoreOptions(latest_cache_entries=0)
    with VersionedKeyValueStore(tmp_path / "v", 1_000, options=options) as store:
        store.put(K, b"a", 10)
        store.put(K, b"b", 20)
        assert store.get(K) == VersionedRecord(b"b", 20, None)
        assert store.get(K, 15) == VersionedRecord(b"a", 10, 20)


def test_segment_interval_cannot_change_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "v"
    VersionedKeyValueStore(path, 100, segment_interval_ms=10).close()
    with VersionedKeyValueStore(path, 100) as store:  # None: keep what is on disk
        assert store.segment_interval_ms == 10
    with pytest.raises(StateStoreError, match="segment_interval_ms=10"):
        VersionedKeyValueStore(path, 100, segment_interval_ms=20)
    VersionedKeyValueStore(path, 100).close()  # the failed open released the directory


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.put("k", b"v", 1), "key must be bytes"),
        (lambda s: s.put(b"k", "v", 1), "value must be bytes"),
        (lambda s: s.put(b"k", b"v", 1.0), "timestamp must be an int"),
        (lambda s: s.put(b"k", b"v", -1), "timestamp must be between"),
        (lambda s: s.get(b"k".decode()), "key must be bytes"),
        (lambda s: s.delete(b"k", None), "timestamp must be an int"),
        (lambda s: s.get_versions(b"k", "0", 1), "from_ts must be an int"),
    ],
)
def test_bad_arguments_are_named(store: VersionedKeyValueStore, call, message: str) -> None:
    store.put(b"k", b"v", 5)
    with pytest.raises((TypeError, ValueError), match=message):
        call(store)


def test_as_of_must_be_an_int(store: VersionedKeyValueStore) -> None:
    store.put(K, b"v", 5)
    with pytest.raises(TypeError, match="as_of must be an int"):
        store.get(K, "5")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"history_retention_ms": -1}, "history_retention_ms"),
        ({"history_retention_ms": 10, "segment_interval_ms": 0}, "segment_interval_ms"),
    ],
)
def test_bad_constructor_arguments_are_named(tmp_path: Path, kwargs, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        VersionedKeyValueStore(tmp_path / "v", **kwargs)
