"""Small batches whose tasks run in the driver process (a local master): the same outputs and
state as tasks run by Spark, tasks kept between batches for certain, and tasks handed between
the driver and Spark's Python workers as batch sizes change, losing and doubling nothing."""

from __future__ import annotations

import uuid

import pytest

from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime import task_cache
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
        assert in_driver == (PARTITIONS if where == "driver" else 0), (number, result.metrics)
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
