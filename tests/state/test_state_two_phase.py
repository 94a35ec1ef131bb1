"""Two-phase commit for the Spark runtime: prepare(batch_id) then settle(batch_id, committed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamplatform.state import (
    PUT_RETURN_CODE_NOT_PUT,
    IsolationLevel,
    StateStoreError,
    TransactionalKeyValueStore,
    VersionedKeyValueStore,
    VersionedRecord,
)

TP = ("orders", 0)


def _prepared_store(path: Path) -> TransactionalKeyValueStore:
    """A store with b"old" committed at offset 1, and batch 7 prepared at offset 5."""
    store = TransactionalKeyValueStore(path)
    store.transaction.put(b"old", b"1")
    store.commit({TP: 1})
    store.transaction.put(b"new", b"2")
    store.transaction.delete(b"old")
    store.prepare(7, {TP: 5})
    return store


def test_prepare_persists_without_applying(tmp_path: Path) -> None:
    with _prepared_store(tmp_path / "kv") as store:
        assert store.prepared_batch_id == 7
        assert list(store.range()) == [(b"old", b"1")]
        assert store.transaction.get(b"new") is None  # the write set left the transaction
        assert store.committed_offset(TP) == 1
        assert store.approximate_num_uncommitted_entries() == 0


@pytest.mark.parametrize("reopen", [False, True], ids=["same-store", "after-reopen"])
def test_settle_committed_applies_data_and_offsets(tmp_path: Path, reopen: bool) -> None:
    store = _prepared_store(tmp_path / "kv")
    if reopen:
        store.close()
        store = TransactionalKeyValueStore(tmp_path / "kv")
        assert store.prepared_batch_id == 7
    with store:
        assert store.settle(7, committed=True) is True
        assert store.prepared_batch_id is None
        assert list(store.range()) == [(b"new", b"2")]
        assert store.committed_offset(TP) == 5
        assert store.commit_sequence == 2
    with TransactionalKeyValueStore(tmp_path / "kv") as store:
        assert list(store.range()) == [(b"new", b"2")]
        assert store.prepared_batch_id is None


@pytest.mark.parametrize("reopen", [False, True], ids=["same-store", "after-reopen"])
def test_settle_discarded_drops_the_batch(tmp_path: Path, reopen: bool) -> None:
    store = _prepared_store(tmp_path / "kv")
    if reopen:
        store.close()
        store = TransactionalKeyValueStore(tmp_path / "kv")
    with store:
        assert store.settle(7, committed=False) is True
        assert list(store.range()) == [(b"old", b"1")]
        assert store.committed_offset(TP) == 1
        assert store.commit_sequence == 1
        store.transaction.put(b"next", b"3")  # the store is writable again
        store.commit({TP: 6})
        assert store.get(b"next") == b"3"


def test_settle_is_idempotent_and_refuses_contradictions(tmp_path: Path) -> None:
    with _prepared_store(tmp_path / "kv") as store:
        with pytest.raises(StateStoreError, match="batch 7 is prepared, not batch 6"):
            store.settle(6, committed=True)
        assert store.settle(7, committed=True) is True
        assert store.settle(7, committed=True) is False  # a retried task settles again: no-op
        with pytest.raises(StateStoreError, match="batch 7 was already committed"):
            store.settle(7, committed=False)
        assert store.settle(3, committed=False) is False  # nothing prepared: nothing to do
    with TransactionalKeyValueStore(tmp_path / "kv") as store:
        assert store.settle(7, committed=True) is False  # remembered across reopen
        with pytest.raises(StateStoreError, match="already committed"):
            store.settle(7, committed=False)


def test_commit_and_prepare_wait_for_settle(tmp_path: Path) -> None:
    with _prepared_store(tmp_path / "kv") as store:
        with pytest.raises(StateStoreError, match="settle it first"):
            store.commit({TP: 9})
        with pytest.raises(StateStoreError, match="settle it first"):
            store.prepare(8)


def test_prepare_needs_read_committed(tmp_path: Path) -> None:
    ru = IsolationLevel.READ_UNCOMMITTED
    with (
        TransactionalKeyValueStore(tmp_path / "kv", ru) as store,
        pytest.raises(StateStoreError, match="READ_COMMITTED"),
    ):
        store.prepare(1)


@pytest.mark.parametrize("batch_id", [-1, "1", True])
def test_bad_batch_ids(tmp_path: Path, batch_id) -> None:
    with (
        TransactionalKeyValueStore(tmp_path / "kv") as store,
        pytest.raises((TypeError, ValueError), match="batch_id"),
    ):
        store.prepare(batch_id)


def test_versioned_store_prepares_and_settles_with_stream_time(tmp_path: Path) -> None:
    path = tmp_path / "v"
    with VersionedKeyValueStore(path, history_retention_ms=100) as store:
        store.put(b"k", b"a", 10)
        store.commit({TP: 1})
        store.put(b"k", b"b", 500)
        store.prepare(1, {TP: 2})
        assert store.get(b"k") == VersionedRecord(b"a", 10, None)  # committed view
        assert store.stream_time == 10
        with pytest.raises(StateStoreError, match="settle it before writing"):
            store.put(b"k", b"c", 600)
    with VersionedKeyValueStore(path, history_retention_ms=100) as store:
        assert store.prepared_batch_id == 1
        store.settle(1, committed=True)
        assert store.stream_time == 500
        assert store.get(b"k", 450) == VersionedRecord(b"a", 10, 500)
        assert store.committed_offset(TP) == 2
        store.put(b"k", b"c", 600)
        store.prepare(2, {TP: 3})
        store.settle(2, committed=False)
        assert store.stream_time == 500
        assert store.get(b"k") == VersionedRecord(b"b", 500, None)
        assert store.put(b"k", b"late", 399) == PUT_RETURN_CODE_NOT_PUT
        assert store.put(b"k", b"on time", 400) == 500


def test_staged_writes_replayed_elsewhere_give_the_same_store(tmp_path: Path) -> None:
    # What the Spark runtime ships as a batch's changelog, and how a restore replays it.
    with VersionedKeyValueStore(tmp_path / "a", history_retention_ms=100) as source:
        source.put(b"k", b"a", 10)
        source.put(b"k", b"b", 20)
        source.put(b"gone", None, 15)
        changelog = source.staged_writes()
        source.commit({TP: 3})
        assert source.staged_writes() == []
    with VersionedKeyValueStore(tmp_path / "b", history_retention_ms=100) as replica:
        replica.apply_changelog(changelog, {TP: 3})
        assert replica.committed_offset(TP) == 3
        assert replica.stream_time == 20
        assert replica.get_versions(b"k", 0, 100) == [
            VersionedRecord(b"b", 20, None),
            VersionedRecord(b"a", 10, 20),
        ]
        assert replica.get(b"gone", 16) is None


def test_the_store_that_prepared_a_batch_settles_it_without_reading_it_back(
    tmp_path: Path, monkeypatch
) -> None:
    """A task kept open between batches settles what it prepared from memory; only a store
    reopened since reads the write set back (the after-reopen cases above)."""
    from streamplatform.state.db import StateDB

    def read_back(self, committed):
        raise AssertionError("the write set was read back")

    store = _prepared_store(tmp_path / "kv")
    monkeypatch.setattr(StateDB, "_read_prepared", read_back)
    with store:
        assert store.settle(7, committed=True) is True
        assert list(store.range()) == [(b"new", b"2")]
        assert store.committed_offset(TP) == 5
