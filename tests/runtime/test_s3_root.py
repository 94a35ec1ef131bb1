"""The Delta root on object storage: the local S3 server (moto's S3 API), reached by delta-rs and
pyarrow in the driver and tasks and by Hadoop's S3A in Spark, with the same output, restores,
fencing and crash recovery as on a local disk."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pyarrow as pa
import pytest

from streamplatform import storage
from streamplatform.runtime import delta_direct
from streamplatform.runtime.microbatch import StreamingJob

from .support import (
    CRASHING_RUN,
    DRIVER,
    RECORDS,
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    job_config,
)

pytestmark = [pytest.mark.s3]
TESTS = os.path.dirname(os.path.dirname(__file__))
SPILLED = {"platform.sink.driver.max.records": 1}  # every task spills its rows to a file
SPARK_WRITES = {"platform.sink.driver.max.records": 0}  # Spark's Kafka source and Delta writer


def s3_job_config(kafka_settings, s3_server, tmp_path, app, source, **overrides):
    """``job_config`` with the Delta root in the local S3 server's bucket (state stays on the
    local disk, as an executor's)."""
    root = f"s3://{s3_server.bucket}/{tmp_path.name}-{uuid.uuid4().hex[:6]}"
    return (job_config(kafka_settings, tmp_path, app, source, **overrides)
            | s3_server.settings | {"platform.delta.root": root})  # fmt: skip


def _objects(s3_server, prefix: str) -> list[str]:
    """The keys under ``prefix`` of the server's bucket."""
    fs, path = storage.filesystem(f"s3://{s3_server.bucket}/{prefix}")
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return [i.path for i in infos if i.type == pafs.FileType.File]


@pytest.fixture
def s3_storage(s3_server):
    """This process's storage settings for the server's bucket, as a job registers them."""
    storage.configure({"platform.delta.root": f"s3://{s3_server.bucket}/x", **s3_server.settings})
    return s3_server


# --- delta-rs and the claim on S3 -------------------------------------------------------


def test_two_writers_of_one_table_version_on_s3_never_both_commit(s3_storage):
    """The fencing's foundation: Delta's commit of version V is a conditional put; of eight
    writers racing for each version, exactly one wins it (a server or client that overwrote
    instead would let several "win" and lose their commits)."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    path = f"s3://{s3_storage.bucket}/race-{uuid.uuid4().hex[:6]}"
    delta_direct.write(path, pa.table({"n": [0]}), mode="append")
    for version in range(1, 6):
        tables = [delta_direct.open_table(path) for _ in range(8)]
        outcomes: list[str] = []
        start = threading.Barrier(len(tables))

        def commit(table, n, start=start, outcomes=outcomes):
            start.wait()
            try:
                delta_direct.write(
                    table,
                    pa.table({"n": [n]}),
                    mode="append",
                    commit_properties=CommitProperties(max_commit_retries=0),
                )
                outcomes.append("won")
            except CommitFailedError:
                outcomes.append("lost")

        threads = [threading.Thread(target=commit, args=(t, i)) for i, t in enumerate(tables)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["lost"] * 7 + ["won"], outcomes
        assert delta_direct.open_table(path).version() == version
    assert delta_direct.read(path).num_rows == 6


# --- the dedup job with its root on S3 ----------------------------------------------------


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.parametrize(
    ("overrides", "paths"),
    [
        ({}, {"direct-driver"}),
        # ~25 s each: make test keeps the default path on S3, make test-all runs these too.
        pytest.param(SPILLED, {"direct-spilled"}, marks=pytest.mark.slow),
        pytest.param(SPARK_WRITES, {"delta-write"}, marks=pytest.mark.slow),
    ],
    ids=["direct", "spilled", "spark-writes"],
)
def test_the_dedup_job_on_an_s3_root_equals_the_test_driver_and_restores_from_it(
    spark, kafka_settings, s3_server, source_topic, tmp_path, overrides, paths
):
    """Each path's own files go through the S3 API: the driver's delta-rs appends (direct), the
    tasks' spill files and the driver streaming them into the sink (spilled), Spark's Kafka
    source and Delta writer through S3A with the tasks' side files (spark-writes). Then the
    local state is wiped and the tasks restore from the changelog on S3."""
    source, sent = source_topic
    app = f"s3-{uuid.uuid4().hex[:6]}"
    config = s3_job_config(kafka_settings, s3_server, tmp_path, app, source, **overrides)
    root = config["platform.delta.root"]

    def new_job():
        return StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                            delta_sinks=["deduplicated"])  # fmt: skip

    job = new_job()
    # On a local master the tasks' side files stay on this host's disk (the job's state
    # directory), as Spark keeps its shuffle files: scratch read once by the driver.
    staging = job.context.staging_root()
    assert staging == str((tmp_path / app / "state").absolute() / app / "_staging")
    assert storage.join(root, app, "_staging") in job.context.staging_roots()  # cleaned too
    first = job.run(max_batches=2)
    job.close()
    assert {r.path for r in first} == paths
    shutil.rmtree(tmp_path / app / "state")  # the executor's disk is gone
    job = new_job()
    rest = job.run_until_caught_up()
    job.close()
    assert rest[0].restored_records > 0  # replayed from the changelog on S3
    assert sum(r.records_in for r in first + rest) == RECORDS

    rows = delta_rows(spark, f"{root}/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)  # no source record twice
    dlq = spark.read.format("delta").load(f"{root}/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3
    prefix = root.removeprefix(f"s3://{s3_server.bucket}/")
    keys = _objects(s3_server, prefix)
    assert any("/_changelog/" in key for key in keys)
    # Side files of committed batches are gone; nothing of the job went to the local disk.
    assert not [key for key in keys if "/_staging/" in key and "/side/" in key]
    assert not (tmp_path / "delta").exists()


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.slow  # ~20 s
def test_a_spill_file_missing_on_s3_fails_the_batch_uncommitted_and_the_re_run_loses_nothing(
    spark, kafka_settings, s3_server, source_topic, tmp_path, monkeypatch
):
    """Task 0_2's spill file (its sink rows too) is deleted before the driver lists the files
    (on a local master they are on this host's disk, the tables on S3): the batch fails with
    nothing committed or appended, and runs again."""
    from streamplatform import MissingTaskOutputs

    source, sent = source_topic
    app = f"s3-lost-{uuid.uuid4().hex[:6]}"
    config = s3_job_config(kafka_settings, s3_server, tmp_path, app, source, **SPILLED)
    root = config["platform.delta.root"]
    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    local_copy = storage.local_copy
    lost = []

    def lose_task_0_2(directory):  # before the driver fetches the files
        for file in storage.list_files(directory, ".arrow"):
            if file.rsplit("/", 1)[1].startswith("0_2."):
                fs, path = storage.filesystem(file)
                fs.delete_file(path)
                lost.append(file.rsplit("/", 1)[1])
        return local_copy(directory)

    monkeypatch.setattr(storage, "local_copy", lose_task_0_2)
    with pytest.raises(MissingTaskOutputs, match="task 0_2 had records"):
        job.run_batch()
    assert lost == ["0_2.arrow"]
    assert job.commit_log.last() is None  # nothing committed as consumed
    for table in ("deduplicated", "_dlq", "_changelog"):  # nor any of the outputs
        assert not delta_direct.is_table(f"{root}/{app}/{table}")

    monkeypatch.setattr(storage, "local_copy", local_copy)
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == 0 and results[0].replayed
    rows = delta_rows(spark, f"{root}/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)


# --- crashes and a second driver with the root on S3 -------------------------------------


def _run_child(script: str, env: dict[str, str], timeout_s: float = 300) -> tuple[int, str]:
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=os.environ | env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = child.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the Spark JVM a killed driver left behind
    return child.returncode, output


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.slow  # a killed driver process each, then the job: ~30-40 s each
@pytest.mark.child_process
@pytest.mark.parametrize(
    ("step", "overrides"),
    [(step, {}) for step in ("after_plan", "during_tasks", "after_outputs", "after_commit")]
    + [("during_tasks", SPILLED), ("after_outputs", SPILLED)],
    ids=lambda value: "spilled" if value == SPILLED else ("" if value == {} else value),
)
def test_a_job_on_an_s3_root_killed_at_any_step_resumes_to_the_clean_output(
    spark, kafka_settings, s3_server, source_topic, tmp_path, step, overrides
):
    """SIGKILL at each crash point of batch 1 (the tasks' spill files on S3 included), then a
    new driver: the output on S3 equals the test driver's, each record once."""
    source, sent = source_topic
    app = f"s3-crash-{uuid.uuid4().hex[:4]}"
    config = s3_job_config(kafka_settings, s3_server, tmp_path, app, source, **overrides)
    code, output = _run_child(CRASHING_RUN.format(tests=TESTS, config=config, source=source),
                              {"STREAMPLATFORM_FAULT": f"{step}:1"})  # fmt: skip
    assert code == -signal.SIGKILL, output[-3000:]

    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == 1 + (step == "after_commit")
    assert results[0].replayed == (step != "after_commit")
    root = config["platform.delta.root"]
    rows = delta_rows(spark, f"{root}/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    dlq = spark.read.format("delta").load(f"{root}/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.slow  # three driver processes, each with its own Spark: ~60 s
@pytest.mark.child_process
def test_two_drivers_at_once_on_an_s3_root_one_refused_and_the_output_exactly_once(
    spark, kafka_settings, s3_server, source_topic, tmp_path
):
    """A driver paused with batch 1's outputs written (on S3), not committed; a second driver
    of the same application.id is refused, a third waits, and takes the job over once the
    first ends: the output is the test driver's, each record once."""
    source, sent = source_topic
    config = s3_job_config(kafka_settings, s3_server, tmp_path, "two", source)
    pause = tmp_path / "pause"
    pause.mkdir()

    def driver(settings, env=None) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", DRIVER.format(tests=TESTS, config=settings, source=source)],
            env=os.environ | (env or {}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip

    first = driver(config, {"STREAMPLATFORM_PAUSE": "after_outputs:1",
                            "STREAMPLATFORM_PAUSE_DIR": str(pause)})  # fmt: skip
    children = [first]
    try:
        deadline = time.monotonic() + 240
        while not (pause / "paused").exists():
            assert first.poll() is None, first.stdout.read()
            assert time.monotonic() < deadline, "the first driver never reached batch 1's end"
            time.sleep(0.05)
        refused = driver(config)
        children.append(refused)
        output, _ = refused.communicate(timeout=120)
        assert refused.returncode == 3 and "REFUSED" in output and "held by run" in output
        waiting = driver(config | {"platform.claim.wait.ms": 300_000})
        children.append(waiting)
        time.sleep(3)
        assert waiting.poll() is None  # neither refused nor done: waiting for the first
        (pause / "resume").touch()
        for child in (first, waiting):
            output, _ = child.communicate(timeout=300)
            assert child.returncode == 0 and "FINISHED" in output, output[-3000:]
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

    root = config["platform.delta.root"]
    rows = delta_rows(spark, f"{root}/two/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    commits = spark.read.format("delta").load(f"{root}/two/_commits").collect()
    assert sorted(r.batch_id for r in commits) == list(range(len(commits)))  # each batch once
