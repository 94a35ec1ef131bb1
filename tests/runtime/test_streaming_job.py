"""The Spark runtime on a real broker, real Spark and real Delta: output equals the test
driver's, poison records reach the DLQ once, and a job killed at any step resumes to exactly
the output of a clean run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid

import pytest

from streamplatform.config import ConfigError
from streamplatform.runtime.microbatch import StreamingJob

from .support import (
    CRASHING_RUN,
    RECORDS,
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    job_config,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_dedup_job_equals_the_test_driver_and_dlq_gets_each_poison_once(
    spark, kafka_settings, source_topic, tmp_path
):
    source, sent = source_topic
    app = f"rt-{uuid.uuid4().hex[:6]}"
    job = StreamingJob(dedup_topology(source, "deduplicated"),
                       job_config(kafka_settings, tmp_path, app, source), spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()

    assert len(results) == 3
    assert [r.batch_id for r in results] == list(range(len(results)))
    assert sum(r.records_in for r in results) == RECORDS
    assert results[-1].lag == 0
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)  # no source record twice
    # Every record keeps its header (headers cross to and from Python as JSON).
    for row in spark.read.format("delta").load(f"{tmp_path}/delta/{app}/deduplicated").collect():
        index = json.loads(row.value)["n"]
        assert [(h.key, h.value) for h in row.headers] == [("i", str(index).encode())]
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3
    assert sum(r.dlq_records for r in results) == 3
    assert sum(r.duplicates_dropped for r in results) > 0
    assert job.run_until_caught_up() == []  # caught up: nothing more to do


def test_a_missing_dlq_topic_stops_start_up_naming_it(
    spark, kafka_settings, source_topic, tmp_path
):
    source, _ = source_topic
    config = job_config(kafka_settings, tmp_path, "no-dlq", source) | {
        "errors.dead.letter.queue.topic.name": "no-such-dlq"
    }
    with pytest.raises(ConfigError, match="no-such-dlq"):
        StreamingJob(dedup_topology(source, "x"), config, spark=spark, delta_sinks=["x"])


def test_a_broker_that_is_down_is_a_clear_error(tmp_path):
    config = {
        "application.id": "down",
        "bootstrap.servers": "127.0.0.1:9",
        "state.dir": str(tmp_path),
    }
    with pytest.raises(ConnectionError, match="bootstrap.servers=127.0.0.1:9"):
        StreamingJob(dedup_topology("a", "b"), config, delta_sinks=["b"])


STEPS = ["after_plan", "during_tasks", "after_outputs", "after_commit"]
# Every batch bigger than 1 record: the tasks spill all their rows to files, and the driver
# appends the sink from them after the tasks (the default path for big batches).
SPILLED = {"platform.sink.driver.max.records": 1}
# A dedup budget of 2 KB: the ids move out of memory after every few records and at every
# commit, so the killed batch and its replay decide through store lookups and the index.
SMALL_BUDGET = {"statestore.cache.max.bytes": 2048}


@pytest.mark.parametrize(
    ("step", "batch", "overrides"),
    [(step, batch, {}) for step in STEPS for batch in (0, 1)]
    + [("during_tasks", 1, SPILLED), ("after_outputs", 1, SPILLED)]
    + [("during_tasks", 1, SMALL_BUDGET), ("after_outputs", 1, SMALL_BUDGET)],
    ids=lambda value: {str(SPILLED): "spilled", str(SMALL_BUDGET): "small-budget", "{}": ""}.get(
        str(value)
    ),
)
@pytest.mark.child_process
def test_a_job_killed_at_any_step_resumes_to_the_clean_output(
    spark, kafka_settings, source_topic, tmp_path, step, batch, overrides
):
    source, sent = source_topic
    app = f"crash-{step.replace('_', '-')}-{uuid.uuid4().hex[:4]}"
    config = job_config(kafka_settings, tmp_path, app, source, **overrides)
    script = CRASHING_RUN.format(
        tests=os.path.dirname(os.path.dirname(__file__)), config=config, source=source
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        env=os.environ | {"STREAMPLATFORM_FAULT": f"{step}:{batch}"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = child.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the Spark JVM the killed driver left behind
    assert child.returncode == -signal.SIGKILL, output[-3000:]

    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == batch + (step == "after_commit")
    assert results[0].replayed == (step != "after_commit")
    if overrides == SMALL_BUDGET:  # the replay did run with ids out of memory
        assert sum(r.metrics.get("dedup_spills", 0) for r in results) > 0

    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3


@pytest.mark.parametrize("same_job", [False, True], ids=["new-job", "same-job"])
def test_a_wiped_state_dir_is_restored_from_the_changelog(
    spark, kafka_settings, source_topic, tmp_path, same_job
):
    source, sent = source_topic
    app = f"wipe-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source)

    def new_job():
        return StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                            delta_sinks=["deduplicated"])  # fmt: skip

    job = new_job()
    first = job.run(max_batches=2)
    assert sum(r.restored_records for r in first) == 0

    shutil.rmtree(tmp_path / app / "state")  # the executor's disk is gone
    # A new job resolves the changelog's files for its first batch. The same job does not (it
    # resolves them only at its start and after failovers): its tasks find themselves behind
    # and read the changelog's files from the Delta log themselves, in the same attempt.
    job = job if same_job else new_job()
    rest = job.run_until_caught_up()
    job.close()
    assert rest[0].restored_records > 0  # replayed from the Delta changelog
    restores = rest[0].restores
    assert {task for task, _, _ in restores} == {"0_0", "0_1", "0_2"}
    assert sum(rows for _, _, rows in restores) == rest[0].restored_records
    assert all(where.endswith(str(tmp_path / app / "state")) for _, where, _ in restores)
    assert rest[0].metrics["tasks_restored"] == 3
    assert sum(r.records_in for r in first + rest) == RECORDS
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)


@pytest.mark.parametrize(
    ("driver_max_records", "side_file"),
    # 0: Spark's source and Delta writer; the tasks leave their other rows in side files.
    # 1: every batch is bigger: the tasks read Kafka and spill all their rows, the sink's too.
    [(0, "0_2.parquet"), pytest.param(1, "0_2.arrow", marks=pytest.mark.slow)],  # ~8 s each
)
def test_a_task_whose_side_file_never_reaches_the_driver_fails_the_batch_uncommitted(
    spark, kafka_settings, source_topic, tmp_path, monkeypatch, driver_max_records, side_file
):
    """On hosts that do not share the Delta root's mount, a task's side file is not where the
    driver reads. Here it is deleted before the driver reads the side files: the batch must
    fail, with nothing committed as consumed, and its re-run must lose nothing."""
    from streamplatform import MissingTaskOutputs
    from streamplatform.runtime.paths import delta_write, direct

    source, sent = source_topic
    app = f"side-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source,
                        **{"platform.sink.driver.max.records": driver_max_records})  # fmt: skip
    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    read_side_files = direct.read_side_files
    lost = []

    def lose_task_0_2(directory):
        for file in os.listdir(directory):
            if file.startswith("0_2."):  # task 0_2 read the poison record of batch 0
                os.remove(os.path.join(directory, file))
                lost.append(file)
        return read_side_files(directory)

    for path in (direct, delta_write):
        monkeypatch.setattr(path, "read_side_files", lose_task_0_2)
    with pytest.raises(MissingTaskOutputs, match="task 0_2 had records"):
        job.run_batch()
    assert lost == [side_file]
    assert job.commit_log.last() is None  # nothing committed as consumed
    assert not os.path.exists(f"{tmp_path}/delta/{app}/_dlq")  # nor half of the outputs
    assert not os.path.exists(f"{tmp_path}/delta/{app}/_changelog")
    if side_file.endswith(".arrow"):
        # The sink rows were in the lost file too: a sink appended without them, under the
        # batch's transaction id, would be skipped by the re-run and lose them for good.
        assert not os.path.exists(f"{tmp_path}/delta/{app}/deduplicated")

    for path in (direct, delta_write):
        monkeypatch.setattr(path, "read_side_files", read_side_files)
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == 0 and results[0].replayed
    assert sum(r.records_in for r in results) == RECORDS
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3
    changelog_tasks = {
        (r.task, r.batch_id)
        for r in spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_changelog").collect()
    }
    assert ("0_2", 0) in changelog_tasks
