"""KIP-892 rules of docs/semantics.md, one test each, on TransactionalKeyValueStore."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamplatform.records import TopicPartition
from streamplatform.state import (
    IsolationLevel,
    StateStoreError,
    TransactionalKeyValueStore,
)

RC, RU = IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED
TP = TopicPartition("orders", 0)


@pytest.fixture
def store(tmp_path: Path):
    with TransactionalKeyValueStore(tmp_path / "kv") as s:
        yield s


def test_read_committed_hides_uncommitted_writes_from_everyone_else(
    store: TransactionalKeyValueStore,
) -> None:
    writer, reader = store.transaction, store.new_transaction()
    writer.put(b"k", b"v")
    assert writer.get(b"k") == b"v"
    assert store.get(b"k") is None
    assert reader.get(b"k") is None
    assert list(store.range()) == []
    writer.commit()
    assert store.get(b"k") == b"v"
    assert reader.get(b"k") == b"v"


def test_read_uncommitted_writes_reach_rocksdb_at_once(tmp_path: Path) -> None:
    with TransactionalKeyValueStore(tmp_path / "kv", RU) as store:
        writer, reader = store.transaction, store.new_transaction()
        writer.put(b"k", b"v")
        assert store.get(b"k") == b"v"
        assert reader.get(b"k") == b"v"
        writer.close()  # nothing to take back: the write is applied
        assert store.get(b"k") == b"v"
    with TransactionalKeyValueStore(tmp_path / "kv", RU) as store:
        assert store.get(b"k") == b"v"


def test_read_your_writes_in_get_range_and_prefix(store: TransactionalKeyValueStore) -> None:
    txn = store.transaction
    for key in (b"a1", b"a2", b"a3", b"b1"):
        txn.put(key, b"stored")
    txn.commit()
    txn.delete(b"a2")  # a staged delete hides the stored key
    txn.put(b"a4", b"new")
    txn.put(b"a1", b"changed")
    txn.put(b"a0", b"")  # an empty value is a value
    assert txn.get(b"a2") is None
    assert store.get(b"a2") == b"stored"
    expected = [(b"a0", b""), (b"a1", b"changed"), (b"a3", b"stored"), (b"a4", b"new")]
    assert list(txn.prefix(b"a")) == expected
    assert list(txn.range(b"a1", b"a4")) == expected[1:3]
    assert list(txn.range()) == [*expected, (b"b1", b"stored")]
    assert list(store.prefix(b"a")) == [(b"a1", b"stored"), (b"a2", b"stored"), (b"a3", b"stored")]


def test_prefix_of_ff_bytes_runs_to_the_end(store: TransactionalKeyValueStore) -> None:
    txn = store.transaction
    for key in (b"\xfe", b"\xff", b"\xff\x00", b"\xff\xff\x01"):
        txn.put(key, key)
    assert [k for k, _ in txn.prefix(b"\xff")] == [b"\xff", b"\xff\x00", b"\xff\xff\x01"]
    assert [k for k, _ in txn.prefix(b"")] == [b"\xfe", b"\xff", b"\xff\x00", b"\xff\xff\x01"]


def test_scan_is_a_snapshot_that_survives_a_concurrent_commit(
    store: TransactionalKeyValueStore,
) -> None:
    writer = store.transaction
    for key in (b"a", b"b", b"c"):
        writer.put(key, b"old")
    writer.commit()
    scan = store.range()
    assert next(scan) == (b"a", b"old")
    writer.put(b"b", b"new")
    writer.delete(b"c")
    writer.put(b"bb", b"new")
    writer.commit()
    assert list(scan) == [(b"b", b"old"), (b"c", b"old")]
    assert list(store.range()) == [(b"a", b"old"), (b"b", b"new"), (b"bb", b"new")]


def test_transaction_scan_is_fixed_when_created(store: TransactionalKeyValueStore) -> None:
    txn = store.transaction
    txn.put(b"a", b"1")
    scan = txn.range()
    txn.put(b"b", b"2")
    assert list(scan) == [(b"a", b"1")]


def test_blind_deletes_are_dropped_and_real_ones_kept(store: TransactionalKeyValueStore) -> None:
    """A staged delete of a key committed data does not hold leaves the transaction (it would
    only be a tombstone and a changelog row); one of a committed key stays. Reads, scans and
    the committed result are the same either way."""
    txn = store.transaction
    txn.put(b"kept", b"1")
    txn.put(b"gone", b"2")
    txn.commit()
    for key in (b"a", b"b", b"c", b"gone", b"never"):
        txn.put(key, b"x")
    txn.range()  # a scan: the staged keys are now in order, and must leave it too
    for key in (b"a", b"gone", b"never", b"c"):
        txn.delete(key)
    assert txn.drop_blind_deletes() == 3  # a, never, c: not committed
    assert txn.staged_entries() == [("data", b"b", b"x"), ("data", b"gone", None)]
    assert list(txn.range()) == [(b"b", b"x"), (b"kept", b"1")]
    assert txn.get(b"a") is None and txn.get(b"gone") is None
    txn.put(b"z", b"y")  # the order is rebuilt for a write after the drop
    assert [key for key, _ in txn.range()] == [b"b", b"kept", b"z"]
    txn.commit()
    assert list(store.range()) == [(b"b", b"x"), (b"kept", b"1"), (b"z", b"y")]


@pytest.mark.parametrize("level", [RC, RU])
def test_put_all_is_puts_one_by_one(tmp_path: Path, level: IsolationLevel) -> None:
    """``put_all`` leaves what the same puts one at a time leave: the staged writes and
    counters (a delete of a key just read as absent and put is unstaged, not staged), the
    committed store, a bad key named."""
    writes = [(b"b", b"1"), (b"a", b"2"), (b"fresh", b"3"), (b"b", b"4"), (b"gone", None),
              (b"fresh", None), (b"c", b"5")]  # fmt: skip
    seen = []
    for name, bulk in (("one", False), ("all", True)):
        with TransactionalKeyValueStore(tmp_path / name, isolation_level=level) as store:
            txn = store.transaction
            txn.put(b"gone", b"0")
            txn.commit()
            txn.range()  # staged keys kept in order from here on
            assert txn.get(b"fresh") is None  # read as absent: its put and delete cancel
            if bulk:
                txn.put_all(writes)
            else:
                for key, value in writes:
                    txn.put(key, value)
            seen.append((txn.staged_entries(), list(txn.range()),
                         txn.approximate_num_uncommitted_entries(),
                         txn.approximate_num_uncommitted_bytes()))  # fmt: skip
            with pytest.raises(TypeError, match="key"):
                txn.put_all([(b"d", b"6"), ("not bytes", b"7")])
            txn.commit()
            seen.append(list(store.range()))
    assert seen[:2] == seen[2:]


def test_closing_a_transaction_discards_it(store: TransactionalKeyValueStore) -> None:
    txn = store.new_transaction()
    txn.put(b"k", b"v")
    txn.close()
    assert store.get(b"k") is None
    assert store.new_transaction().get(b"k") is None
    with pytest.raises(StateStoreError, match="closed"):
        txn.put(b"k", b"v")
    with store.new_transaction() as scoped:  # leaving the block closes, so discards
        scoped.put(b"k", b"v")
    assert scoped.closed and store.get(b"k") is None


def test_reopen_discards_uncommitted_and_keeps_committed(tmp_path: Path) -> None:
    with TransactionalKeyValueStore(tmp_path / "kv") as store:
        store.transaction.put(b"kept", b"1")
        store.commit({TP: 7})
        store.transaction.put(b"lost", b"2")
    with TransactionalKeyValueStore(tmp_path / "kv") as store:
        assert list(store.range()) == [(b"kept", b"1")]
        assert store.committed_offset(TP) == 7
        assert store.commit_sequence == 1


def test_committed_offset(store: TransactionalKeyValueStore) -> None:
    assert store.committed_offset(TP) is None
    store.commit({TP: 5, ("payments", 3): 9})
    assert store.committed_offset(("orders", 0)) == 5
    assert store.committed_offset(TopicPartition("payments", 3)) == 9
    store.commit({("orders", 0): 6})  # partitions not named keep their offset
    assert store.committed_offsets() == {TP: 6, TopicPartition("payments", 3): 9}
    assert store.committed_offset(("orders", 1)) is None


@pytest.mark.parametrize(
    ("offsets", "error"),
    [({("t",): 1}, TypeError), ({("t", 0): -1}, ValueError), ({("t", 0): "1"}, ValueError)],
)
def test_bad_offsets_are_rejected(store: TransactionalKeyValueStore, offsets, error) -> None:
    with pytest.raises(error, match="offsets"):
        store.commit(offsets)


def test_uncommitted_counters_count_keys_values_and_tombstone_keys(
    store: TransactionalKeyValueStore,
) -> None:
    txn = store.transaction
    txn.put(b"ab", b"123")  # 2 + 3
    txn.put(b"ab", b"1")  # overwrite: still one entry, now 2 + 1
    txn.delete(b"xyz")  # a tombstone counts its key: 3
    assert store.approximate_num_uncommitted_entries() == 2
    assert store.approximate_num_uncommitted_bytes() == 6
    other = store.new_transaction()
    other.put(b"k", b"v")
    assert other.approximate_num_uncommitted_bytes() == 2  # each transaction counts its own
    assert store.approximate_num_uncommitted_entries() == 2  # the store: its writer's
    store.commit()
    assert store.approximate_num_uncommitted_entries() == 0
    assert store.approximate_num_uncommitted_bytes() == 0
    assert other.approximate_num_uncommitted_entries() == 1


def test_uncommitted_counters_under_read_uncommitted_run_until_commit(tmp_path: Path) -> None:
    with TransactionalKeyValueStore(tmp_path / "kv", RU) as store:
        store.transaction.put(b"ab", b"123")
        store.transaction.delete(b"c")
        assert store.approximate_num_uncommitted_entries() == 2
        assert store.approximate_num_uncommitted_bytes() == 6
        store.commit()
        assert store.approximate_num_uncommitted_entries() == 0


@pytest.mark.parametrize(
    ("limits", "writes_before", "writes_after"),
    [
        ({"max_uncommitted_records": 2}, 2, 3),  # exceeded when passing 2 records
        ({"max_uncommitted_bytes": 10}, 2, 3),  # 4 bytes per write: 8, then 12
        ({"max_uncommitted_records": 2, "max_uncommitted_bytes": 100}, 2, 3),
    ],
)
def test_uncommitted_limits(tmp_path: Path, limits, writes_before: int, writes_after: int) -> None:
    with TransactionalKeyValueStore(tmp_path / "kv", **limits) as store:
        for i in range(writes_before):
            store.transaction.put(b"k%d" % i, b"vv")
        assert not store.uncommitted_limit_exceeded()
        for i in range(writes_before, writes_after):
            store.transaction.put(b"k%d" % i, b"vv")
        assert store.uncommitted_limit_exceeded()
        store.commit()
        assert not store.uncommitted_limit_exceeded()


def test_no_limits_never_exceeded(store: TransactionalKeyValueStore) -> None:
    for i in range(100):
        store.transaction.put(b"%d" % i, b"x" * 100)
    assert not store.uncommitted_limit_exceeded()


def test_bad_limits_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_uncommitted_bytes"):
        TransactionalKeyValueStore(tmp_path / "kv", max_uncommitted_bytes=-1)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.put("k", b"v"), "key must be bytes"),
        (lambda t: t.put(b"k", bytearray(b"v")), "value must be bytes"),
        (lambda t: t.get(1), "key must be bytes"),
        (lambda t: t.delete(None), "key must be bytes"),
        (lambda t: t.range("a"), "start must be bytes"),
        (lambda t: t.range(None, 5), "end must be bytes"),
        (lambda t: t.prefix("a"), "prefix must be bytes"),
    ],
)
def test_bad_arguments_are_named(store: TransactionalKeyValueStore, call, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        call(store.transaction)


def test_closed_store_refuses_work_and_releases_the_directory(tmp_path: Path) -> None:
    store = TransactionalKeyValueStore(tmp_path / "kv")
    txn = store.transaction
    scan = store.range()
    store.close()
    with pytest.raises(StateStoreError, match="closed"):
        store.get(b"k")
    with pytest.raises(StateStoreError, match="closed"):
        txn.get(b"k")
    assert list(scan) == []  # open scans are ended
    TransactionalKeyValueStore(tmp_path / "kv").close()


def test_wrong_kind_of_store_is_refused(tmp_path: Path) -> None:
    from streamplatform.state import VersionedKeyValueStore

    VersionedKeyValueStore(tmp_path / "s", 10).close()
    with pytest.raises(StateStoreError, match="versioned store, not a key_value store"):
        TransactionalKeyValueStore(tmp_path / "s")
