"""A batch's changelog rows on the Spark path (TaskBatchRunner, in this process): deletes of
keys the committed store never held are not shipped (a dedup that spills hands its ids to the
store and expires most of them within the batch; the transaction drops them before the
changelog and the prepared batch are written), real deletes are, and the changelog replayed
into an empty store rebuilds the task's store."""

from __future__ import annotations

import json

import pyarrow as pa

from streamplatform.config import StreamsConfig
from streamplatform.runtime import task_cache
from streamplatform.runtime.executor import ChangelogWrites, TaskBatchRunner
from streamplatform.runtime.task import Task
from streamplatform.state import IsolationLevel, TransactionalKeyValueStore

from .support import dedup_topology, stream_batch

SECOND = 1_000


def _batch(state_dir, batch_id: int, runs: ChangelogWrites, records) -> list[dict]:
    settings = {
        "application.id": "changelog-rows", "bootstrap.servers": "unused:9092",
        "processing.guarantee": "exactly_once_v2", "state.dir": str(state_dir),
        "platform.task.cache.idle.ms": 0,  # opened anew each batch: settles the last one
        "statestore.cache.max.bytes": 2_000,  # the dedup spills its ids to the store often
    }  # fmt: skip
    runner = TaskBatchRunner(
        dedup_topology("in", "out"), settings, batch_id,
        batch_id - 1 if batch_id else None, {}, {"in": 1, "out": 1},
        stream_topic="in", fingerprint="f", task_runs=runs,
    )  # fmt: skip
    rows = pa.Table.from_batches(
        list(runner.run_partition(iter([stream_batch(records)])))
    ).to_pylist()
    runs.last_run["0_0"] = batch_id  # the driver committed it
    return rows


def _records(first_offset: int, count: int, start: int) -> list[tuple[int, int, bytes, bytes]]:
    """``count`` records a second apart from ``start``, ids repeating every 150 records."""
    return [
        (offset, start + (offset - first_offset) * SECOND, b"k",
         json.dumps({"id": f"id-{offset % 150}"}).encode())
        for offset in range(first_offset, first_offset + count)
    ]  # fmt: skip


def test_changelog_has_no_blind_deletes_and_rebuilds_the_store(tmp_path):
    runs, changelog, deletes = ChangelogWrites(0, {}), [], []
    committed: set[bytes] = set()  # the store's keys after each committed batch
    # Batch 0: 400 s of records against a 60 s interval: most ids expire within the batch.
    # Batch 1: the ids committed by batch 0 expire (real deletes), and more come and go.
    for batch_id, records in enumerate((_records(0, 400, 0), _records(400, 300, 400 * SECOND))):
        rows = _batch(tmp_path / "state", batch_id, runs, records)
        writes = [(r["column_family"], r["key"], r["value"]) for r in rows
                  if r["kind"] == "changelog" and r["column_family"] == "data"]  # fmt: skip
        assert writes, "the batch wrote its store"
        batch_deletes = [key for _, key, value in writes if value is None]
        # Every delete shipped is of a key the committed store held before the batch.
        assert set(batch_deletes) <= committed, batch_id
        deletes.append(len(batch_deletes))
        changelog.append(writes)
        for _, key, value in writes:
            (committed.add if value is not None else committed.discard)(key)
    assert deletes[0] == 0 and deletes[1] > 0, deletes  # real deletes stay

    task_cache.close_all()
    topology = dedup_topology("in", "out")
    task = Task(topology, topology.subtopologies[0], 0,
                StreamsConfig({"application.id": "changelog-rows"}), tmp_path / "state",
                lambda topic: 1, isolation_level=IsolationLevel.READ_COMMITTED)  # fmt: skip
    try:
        (store,) = task.stores.values()
        store.settle(store.prepared_batch_id, committed=True)  # the driver committed batch 1
        stored = list(store.range())
    finally:
        task.close()
    with TransactionalKeyValueStore(tmp_path / "replayed") as replayed:
        for writes in changelog:
            replayed.apply_changelog(writes)
        assert list(replayed.range()) == stored
    assert {key for key, _ in stored} == committed
