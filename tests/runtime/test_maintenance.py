"""Table maintenance (runtime/maintenance.py) and restores from changelog snapshots.

- Random batches of puts and deletes to a key-value and a versioned store, logged as the
  runtime logs them; the changelog snapshotted part-way. An empty copy, a copy older than the
  snapshot and one newer than it all replay to exactly the writer's data (a copy older than
  the snapshot that kept a key deleted before it would differ), reading the snapshot and the
  tail only.
- A real job: maintenance between batches, and after a driver killed with its batch's outputs
  written but not committed; the restart (state dir wiped, so it restores from the snapshot)
  re-runs that batch and its appends are still skipped: the output equals the test driver's.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import uuid

import pyarrow as pa
import pytest

from streamplatform import cli
from streamplatform.runtime import changelog
from streamplatform.runtime.delta_direct import append, transaction_version
from streamplatform.runtime.maintenance import (
    MaintenanceError,
    maintain,
    snapshot_changelog,
)
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.runtime.task_run import BATCH_MARKER
from streamplatform.state import IsolationLevel, TransactionalKeyValueStore, VersionedKeyValueStore

from .support import (
    CRASHING_RUN,
    RECORDS,
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    job_config,
)

SCHEMA = pa.schema([
    ("task", pa.string()), ("store", pa.string()), ("seq", pa.int64()),
    ("column_family", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
    ("batch_id", pa.int64()),
])  # fmt: skip


def _open(directory, name):
    path = directory / name
    if name == "kv":
        return TransactionalKeyValueStore(path, IsolationLevel.READ_COMMITTED)
    return VersionedKeyValueStore(path, history_retention_ms=50, segment_interval_ms=10,
                                  isolation_level=IsolationLevel.READ_COMMITTED)  # fmt: skip


def _contents(store):
    """Every stored entry of every data column family (the store's whole committed data)."""
    found = {}
    for column_family in store.COLUMN_FAMILIES:
        entries = store._db.iterator(column_family)
        entries.seek_to_first()
        while entries.valid():
            found[(column_family, entries.key())] = entries.value()
            entries.next()
    return found


def _write_batch(stores, rng, batch, path):
    """One batch of random writes to each store, committed, and logged as changelog rows."""
    rows = []
    for name, store in stores.items():
        for _ in range(rng.randint(0, 12)):
            key = b"k%d" % rng.randrange(15)
            if name == "kv":
                if rng.random() < 0.35:
                    store.transaction.delete(key)
                else:
                    store.transaction.put(key, b"v%d" % batch)
            else:
                value = None if rng.random() < 0.3 else b"v%d" % batch
                store.put(key, value, batch * 10 + rng.randrange(10))
        for seq, (column_family, key, value) in enumerate(store.staged_writes()):
            rows.append(("0_0", name, seq, column_family, key, value, batch))
        store.commit({BATCH_MARKER: batch})
    table = pa.table(list(zip(*rows, strict=True)) if rows else [[]] * 7, schema=SCHEMA)
    append(path, table, "app-changelog", batch, ["task"])


def _replay(directory, files, up_to):
    stores = {name: _open(directory, name) for name in ("kv", "versioned")}
    try:
        changelog.replay(files, stores, up_to, BATCH_MARKER)
        return {name: _contents(store) for name, store in stores.items()}
    finally:
        for store in stores.values():
            store.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_copies_older_newer_and_empty_replay_from_a_snapshot_to_the_writers_data(tmp_path, seed):
    rng = random.Random(seed)
    path = str(tmp_path / "_changelog")
    writer = {name: _open(tmp_path / "writer", name) for name in ("kv", "versioned")}
    stale, snapshot_at, last = 6, 14, 20
    for batch in range(last + 1):
        _write_batch(writer, rng, batch, path)
        if batch == stale:  # a copy left behind at batch 6 (an executor that lost the task)
            _replay(tmp_path / "stale", changelog.files_by_task(path)["0_0"], stale)
        if batch == 16:  # a copy ahead of the snapshot
            _replay(tmp_path / "ahead", changelog.files_by_task(path)["0_0"], 16)
    expected = {name: _contents(store) for name, store in writer.items()}
    for store in writer.values():
        store.close()
    rows_before = sum(f.last_batch <= snapshot_at for f in changelog.files_by_task(path)["0_0"])

    report = snapshot_changelog(path, snapshot_at, min_files=2)
    files = changelog.files_by_task(path)["0_0"]
    assert report.tasks_snapshotted == 1 and report.changelog_files_replaced == rows_before
    assert report.changelog_rows_after < report.changelog_rows_before
    assert [f.snapshot for f in files] == [True] + [False] * (last - snapshot_at)
    assert files[0].last_batch == snapshot_at
    assert transaction_version(path, "app-changelog") == last  # the appends' ids survive

    for copy in ("empty", "stale", "ahead"):
        assert _replay(tmp_path / copy, files, last) == expected, copy
    # A copy at the snapshot or after it reads the tail only.
    assert [f for f in files if f.overlaps(16, last)] == files[-(last - 16) :]


def test_a_table_that_would_forget_its_transaction_ids_is_refused(tmp_path):
    from deltalake import write_deltalake

    path = str(tmp_path / "app" / "_dlq")
    write_deltalake(
        path,
        pa.table({"batch_id": [0]}),
        configuration={"delta.setTransactionRetentionDuration": "interval 1 hour"},
    )
    with pytest.raises(MaintenanceError, match="delta.setTransactionRetentionDuration"):
        maintain(str(tmp_path / "app"), "app")
    with pytest.raises(ValueError, match="retention_hours"):
        maintain(str(tmp_path / "app"), "app", retention_hours=0.5)


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.child_process
@pytest.mark.parametrize(
    "where", ["local", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.slow])]
)
def test_maintenance_between_batches_and_after_a_crash_keeps_re_runs_exactly_once(
    spark, kafka_settings, source_topic, tmp_path, capsys, monkeypatch, request, where
):
    """On a local disk, and on the S3 server: there the job has its storage settings, and the
    command line takes them from the standard AWS environment."""
    source, sent = source_topic
    app = f"maintain-{uuid.uuid4().hex[:6]}"
    delta_root = f"{tmp_path}/delta"
    storage_settings = {}
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        delta_root = f"s3://{server.bucket}/maintain-{uuid.uuid4().hex[:6]}"
        storage_settings = server.settings
        for variable, value in server.environment.items():
            monkeypatch.setenv(variable, value)
    config = job_config(kafka_settings, tmp_path, app, source,
                        **{"platform.max.records.per.batch": 10,  # 8 batches
                           "platform.delta.root": delta_root, **storage_settings})  # fmt: skip
    app_root = f"{delta_root}/{app}"
    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    first = job.run(max_batches=3)
    between = maintain(app_root, app, min_changelog_files=2)
    assert between.tasks_snapshotted == 3 and between.snapshot_batch == 2
    first += job.run(max_batches=2)
    job.close()

    # A driver killed after its batch 5's outputs are written, before its commit.
    script = CRASHING_RUN.format(
        tests=os.path.dirname(os.path.dirname(__file__)), config=config, source=source
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=os.environ | {"STREAMPLATFORM_FAULT": "after_outputs:5"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = child.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == -signal.SIGKILL, output[-3000:]

    # After the crash, from the command line.
    assert cli.main(["maintain", "--application-id", app, "--delta-root", delta_root,
                     "--min-changelog-files", "2"]) == 0  # fmt: skip
    after = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert after["snapshot_batch"] == 4 and after["tasks_snapshotted"] == 3
    assert after["files_compacted"] > 0  # the offset log's one file per batch
    shutil.rmtree(tmp_path / app / "state")  # every task restores from the snapshots
    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    rest = job.run_until_caught_up()
    job.close()
    assert rest[0].batch_id == 5 and rest[0].replayed
    assert rest[0].restored_records > 0
    assert sum(r.records_in for r in first + rest) == RECORDS
    rows = delta_rows(spark, f"{app_root}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)  # batch 5's sink rows once
    dlq = spark.read.format("delta").load(f"{app_root}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3
