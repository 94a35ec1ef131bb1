"""Small batches whose tasks run in the driver process (a local master): the same outputs and
state as tasks run by Spark, tasks kept between batches for certain, and tasks handed between
the driver and Spark's Python workers as batch sizes change, losing and doubling nothing."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime import kafka_input, task_cache
from streamplatform.runtime.microbatch import StreamingJob

from .support import (
    PARTITIONS,
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    job_config,
    make_input,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]

DRIVER_LIMIT = 60  # batches of at most 60 records run in the driver
# (records of the wave, where its tasks run): 120 and 90 records go to Spark, 30 stay here.
WAVES = [
    (range(0, 120), "spark"),
    (range(120, 150), "driver"),
    (range(150, 240), "spark"),  # takes the tasks the driver keeps
    (range(240, 270), "driver"),  # takes them back from the Python workers
    (range(270, 300), "driver"),  # and finds them kept: certain in the driver
]


def test_tasks_move_between_the_driver_and_spark_workers_losing_and_doubling_nothing(
    spark, kafka_settings, tmp_path
):
    source = f"drv-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS), TopicSpec(f"{source}-dlq", 1)])
    app = f"drv-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source, **{
        "platform.max.records.per.batch": 1_000,  # each wave is one batch
        "platform.driver.tasks.max.records": DRIVER_LIMIT,
    })  # fmt: skip
    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    sent = []
    for number, (indices, where) in enumerate(WAVES):
        sent += make_input(kafka_settings, source, indices)
        (result,) = job.run_until_caught_up()
        assert result.records_in == len(indices)
        in_driver = result.metrics["tasks_in_driver"]
        # A Spark batch's three tasks on local[2]: the last one runs in the driver beside them.
        assert in_driver == (PARTITIONS if where == "driver" else 1), (number, result.metrics)
        if number == len(WAVES) - 1:
            assert result.metrics.get("tasks_reused", 0) == PARTITIONS  # kept since the last wave
    state = tmp_path / app / "state" / app
    assert any(kept.startswith(str(state)) for kept in task_cache.kept_tasks())
    job.close()
    assert not any(kept.startswith(str(state)) for kept in task_cache.kept_tasks())

    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)  # no source record twice
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3


# A batch that Spark runs (more records than DRIVER_LIMIT): three tasks on local[2] make two
# waves, so the driver runs the last wave's task itself, beside the Spark job's two.
BESIDE_SPARK = {"platform.driver.tasks.max.records": 0, "platform.driver.tasks.beside.spark": 1}
SPILLED = {"platform.sink.driver.max.records": 1}  # the tasks spill their rows to files


@pytest.mark.parametrize(
    # ~9 s and ~5 s: rows to the driver in make test-all
    "overrides",
    [pytest.param({}, marks=pytest.mark.slow), SPILLED],
    ids=["rows-to-the-driver", "spilled"],
)
def test_a_batch_spark_runs_has_its_last_wave_run_in_the_driver_beside_it(
    spark, kafka_settings, tmp_path, overrides
):
    source = f"lane-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS), TopicSpec(f"{source}-dlq", 1)])
    app = f"lane-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source, **BESIDE_SPARK, **overrides,
                        **{"platform.max.records.per.batch": 1_000})  # fmt: skip
    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    sent = []
    for indices in (range(0, 150), range(150, 300)):
        sent += make_input(kafka_settings, source, indices)
        (result,) = job.run_until_caught_up()
        assert result.records_in == len(indices)
        assert result.metrics["tasks_in_driver"] == 1, result.metrics
    assert result.metrics["tasks_reused"] >= 1  # the driver's task, kept since the first batch
    state = tmp_path / app / "state" / app
    assert [kept for kept in task_cache.kept_tasks() if kept.startswith(str(state))] == [
        str(state / "0_2")  # the last task, the one of the last wave
    ]
    reader = job.config.kafka_settings("consumer")
    assert kafka_input.kept_consumers(reader) == 1  # the driver's task read its range here
    job.close()
    assert kafka_input.kept_consumers(reader) == 0  # closed with the job, not at exit

    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3


def test_a_driver_task_that_fails_beside_spark_fails_the_batch_uncommitted(
    spark, kafka_settings, tmp_path, monkeypatch
):
    """The driver's task fails half-way: the batch raises that failure (not a missing-output
    error) after Spark's tasks ended, commits nothing, and its re-run writes every record once."""
    from streamplatform.runtime import executor

    source = f"lanef-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS), TopicSpec(f"{source}-dlq", 1)])
    app = f"lanef-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source, **BESIDE_SPARK, **SPILLED)
    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    sent = make_input(kafka_settings, source)
    run_queues = executor.TaskBatchRunner.run_queues

    def fail_half_way(self, *args):  # only here: Spark's workers import the module
        for number, rows in enumerate(run_queues(self, *args)):
            yield rows
            if number == 0:
                raise RuntimeError("the driver's task failed")

    monkeypatch.setattr(executor.TaskBatchRunner, "run_queues", fail_half_way)
    with pytest.raises(RuntimeError, match="the driver's task failed"):
        job.run_batch()
    assert job.commit_log.last() is None
    assert not os.path.exists(f"{tmp_path}/delta/{app}/deduplicated")
    assert not [t for t in threading.enumerate() if t.name.endswith("-driver-tasks")]

    monkeypatch.setattr(executor.TaskBatchRunner, "run_queues", run_queues)
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == 0 and results[0].replayed
    assert sum(r.records_in for r in results) == len(sent)
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
