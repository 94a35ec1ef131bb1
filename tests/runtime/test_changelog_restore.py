"""Restores that stream the changelog into the stores (changelog.replay, issue 32).

- A snapshot of 300,000 live ids restores into an empty store with a traced Python peak far
  below what its rows take as Python objects (153 MB when every row became a dict): the
  snapshot is read and applied in chunks. The store then holds exactly the expected data.
- A restore that fails between two chunks of a snapshot (an empty copy, a copy older than the
  snapshot) leaves the store's committed position as it was, also across a reopen; the next
  restore (from the same snapshot, or from a later one that deleted keys meanwhile) ends with
  exactly the expected data, without keys of the old copy or of the part applied.
- Snapshotted changelogs of a key-value and a versioned store replayed in chunks of 3 rows:
  empty, older and newer copies end with the writer's data (test_maintenance's scenario).
- Files listed without batch statistics (each spans every batch) are read together and
  sorted: the batches apply in order, a key's last write winning.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pyarrow as pa
import pytest

from streamplatform.runtime import changelog
from streamplatform.runtime.delta_direct import append
from streamplatform.runtime.maintenance import snapshot_changelog
from streamplatform.runtime.task_run import BATCH_MARKER
from streamplatform.state import IsolationLevel, TransactionalKeyValueStore

from .test_maintenance import (
    test_copies_older_newer_and_empty_replay_from_a_snapshot_to_the_writers_data as _scenario,
)

SCHEMA = pa.schema([
    ("task", pa.string()), ("store", pa.string()), ("seq", pa.int64()),
    ("column_family", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
    ("batch_id", pa.int64()),
])  # fmt: skip
TASK, STORE = "0_0", "dedup"
SOURCE = ("orders", 0)  # a task offset (stream time, punctuation) travelling in the changelog
Model = dict[bytes, bytes]


def _id(number: int) -> bytes:
    return b"id-%09d" % number


class Changelog:
    """A task's changelog of one key-value store, and the data its batches leave (``model``)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.model: Model = {}
        self.last = -1

    def batch(
        self, puts: range = range(0), deletes: range = range(0), task_offset: int | None = None
    ) -> int:
        """Append the next batch: ``puts`` and ``deletes`` of ids, in that order."""
        batch = self.last = self.last + 1
        keys = [_id(i) for i in puts] + [_id(i) for i in deletes]
        values: list[bytes | None] = [b"v%d" % batch] * len(puts) + [None] * len(deletes)
        column_families = ["data"] * len(keys)
        if task_offset is not None:
            offset_rows = changelog.task_offset_rows({SOURCE: task_offset})
            column_families += [column_family for column_family, _, _ in offset_rows]
            keys += [key for _, key, _ in offset_rows]
            values += [value for _, _, value in offset_rows]
        n = len(keys)
        rows = pa.table({
            "task": [TASK] * n, "store": [STORE] * n, "seq": list(range(n)),
            "column_family": column_families, "key": keys, "value": values,
            "batch_id": [batch] * n,
        }, schema=SCHEMA)  # fmt: skip
        append(self.path, rows, "test-changelog", batch, ["task"])
        self.model.update((_id(i), b"v%d" % batch) for i in puts)
        for i in deletes:
            self.model.pop(_id(i), None)
        return batch

    def snapshot(self) -> None:
        snapshot_changelog(self.path, self.last, min_files=2)

    def files(self) -> list[changelog.ChangelogFile]:
        return changelog.files_by_task(self.path)[TASK]


def _store(path: Path) -> TransactionalKeyValueStore:
    return TransactionalKeyValueStore(path, IsolationLevel.READ_COMMITTED)


def _replay(store: TransactionalKeyValueStore, log: Changelog, up_to: int | None = None) -> int:
    up_to = log.last if up_to is None else up_to
    return changelog.replay(log.files(), {STORE: store}, up_to, BATCH_MARKER)


def _data(store: TransactionalKeyValueStore) -> Model:
    return dict(store.range())


def test_a_large_snapshot_restores_in_bounded_python_memory(tmp_path):
    log = Changelog(tmp_path / "_changelog")
    log.batch(puts=range(0, 200_000))
    log.batch(puts=range(200_000, 320_000), deletes=range(0, 20_000), task_offset=7)
    log.snapshot()
    tail = log.batch(puts=range(5, 10), deletes=range(300_000, 300_010), task_offset=9)
    files = log.files()
    assert [f.snapshot for f in files] == [True, False] and len(log.model) == 299_995
    store = _store(tmp_path / "store")
    try:
        tracemalloc.start()
        try:
            replayed = _replay(store, log)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 30 * 2**20, f"traced peak {peak / 2**20:.1f} MB"
        assert replayed == 300_000 + 15
        assert store.committed_offset(BATCH_MARKER) == tail
        assert store.committed_offset(SOURCE) == 9 and not store.changelog_part_applied
        assert _data(store) == log.model
    finally:
        store.close()


def _failing_after_first_chunk(monkeypatch):
    """Make the second chunk of a snapshot fail (a worker killed part-way through)."""
    original = TransactionalKeyValueStore.apply_changelog_chunk
    calls = []

    def apply_changelog_chunk(self, writes, *, replace=False):
        calls.append(replace)
        if len(calls) > 1:
            raise RuntimeError("killed between two chunks")
        original(self, writes, replace=replace)

    monkeypatch.setattr(TransactionalKeyValueStore, "apply_changelog_chunk", apply_changelog_chunk)
    return calls


@pytest.mark.parametrize("copy", ["empty", "older"])
@pytest.mark.parametrize("later_snapshot", [False, True])
def test_a_snapshot_restore_interrupted_between_chunks_is_redone(
    tmp_path, monkeypatch, copy, later_snapshot
):
    monkeypatch.setattr(changelog, "SNAPSHOT_CHUNK_ROWS", 100)
    log = Changelog(tmp_path / "_changelog")
    log.batch(puts=range(0, 600), task_offset=3)
    store = _store(tmp_path / "store")
    if copy == "older":  # holds batch 0, with ids that batch 1 deletes
        _replay(store, log)
    held = store.committed_offset(BATCH_MARKER)
    log.batch(puts=range(600, 1000), deletes=range(0, 100))
    log.snapshot()
    log.batch(puts=range(5, 8), deletes=range(700, 705), task_offset=4)

    calls = _failing_after_first_chunk(monkeypatch)
    with pytest.raises(RuntimeError, match="killed between two chunks"):
        _replay(store, log)
    assert calls == [True, False]  # the first chunk replaced what the store held
    assert store.committed_offsets() == ({} if held is None else {BATCH_MARKER: 0, SOURCE: 3})
    assert store.changelog_part_applied and 0 < len(_data(store)) <= 100
    store.close()
    monkeypatch.undo()
    monkeypatch.setattr(changelog, "SNAPSHOT_CHUNK_ROWS", 100)

    if later_snapshot:  # maintenance replaced that snapshot meanwhile, deleting ids in it
        log.batch(deletes=range(100, 300))
        log.snapshot()
        log.batch(puts=range(1000, 1010))
    store = _store(tmp_path / "store")  # reopened, as after a crash
    try:
        assert store.committed_offset(BATCH_MARKER) == held and store.changelog_part_applied
        _replay(store, log)
        assert store.committed_offset(BATCH_MARKER) == log.last
        assert store.committed_offset(SOURCE) == 4 and not store.changelog_part_applied
        assert _data(store) == log.model
    finally:
        store.close()


def test_a_copy_at_the_snapshot_never_applies_a_chunk(tmp_path, monkeypatch):
    log = Changelog(tmp_path / "_changelog")
    log.batch(puts=range(0, 50))
    snapshot = log.batch(puts=range(50, 100), deletes=range(0, 10))
    store = _store(tmp_path / "store")
    try:
        _replay(store, log)
        log.snapshot()
        log.batch(deletes=range(10, 20))
        calls = _failing_after_first_chunk(monkeypatch)
        _replay(store, log)
        assert calls == [] and store.committed_offset(BATCH_MARKER) == snapshot + 1
        assert _data(store) == log.model
    finally:
        store.close()


def test_every_copy_replays_a_snapshot_applied_in_small_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(changelog, "SNAPSHOT_CHUNK_ROWS", 3)
    _scenario(tmp_path, 2)


def test_files_without_batch_statistics_replay_in_batch_order(tmp_path):
    log = Changelog(tmp_path / "_changelog")
    log.batch(puts=range(0, 20), task_offset=1)
    older = _store(tmp_path / "older")
    try:
        _replay(older, log)
        log.batch(puts=range(10, 30), deletes=range(0, 5))
        log.batch(puts=range(0, 3), deletes=range(25, 30), task_offset=2)
        log.batch(puts=range(12, 14))
        no_stats = [changelog.ChangelogFile(f.path, -1, 2**62) for f in log.files()]
        empty = _store(tmp_path / "empty")
        try:
            for store in (empty, older):
                changelog.replay(no_stats, {STORE: store}, log.last, BATCH_MARKER)
                assert store.committed_offsets() == {BATCH_MARKER: log.last, SOURCE: 2}
                assert _data(store) == log.model
        finally:
            empty.close()
    finally:
        older.close()


def test_a_snapshot_in_several_files_is_streamed_file_after_file(tmp_path, monkeypatch):
    """delta-rs splits a large snapshot into several files: they are read one after another,
    a chunk at a time, never loaded together and sorted (a store larger than memory)."""
    path = str(tmp_path / "_changelog")
    keys = [_id(i) for i in range(1_000)]
    for part, chunk in enumerate((keys[:600], keys[600:])):
        n = len(chunk)
        first_seq = -1_000 + (0 if part == 0 else 600)
        rows = pa.table({
            "task": [TASK] * n, "store": [STORE] * n,
            "seq": list(range(first_seq, first_seq + n)), "column_family": ["data"] * n,
            "key": chunk, "value": [b"v3"] * n, "batch_id": [3] * n,
        }, schema=SCHEMA)  # fmt: skip
        append(path, rows, "snapshot-in-parts", part, ["task"])
    files = changelog.files_by_task(path)[TASK]
    assert len(files) == 2 and all(f.snapshot and f.last_batch == 3 for f in files)

    def loaded_whole(*args):
        raise AssertionError("a snapshot's files were read whole and sorted")

    monkeypatch.setattr(changelog, "_sorted_batches", loaded_whole)
    store = _store(tmp_path / "store")
    try:
        assert changelog.replay(files, {STORE: store}, 3, BATCH_MARKER) == 1_000
        assert _data(store) == dict.fromkeys(keys, b"v3")
        assert store.committed_offset(BATCH_MARKER) == 3
    finally:
        store.close()
