"""The runtime under at_least_once, with bounded uncommitted state, and across a broker restart."""

from __future__ import annotations

import uuid

import pytest

from streamplatform.kafka import LocalBroker, TopicSpec, create_topics
from streamplatform.runtime.changelog import TASK_OFFSETS
from streamplatform.runtime.microbatch import StreamingJob

from .support import (
    RECORDS,
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    job_config,
    make_input,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _run(spark, kafka_settings, tmp_path, source, **overrides):
    app = f"mode-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source, **overrides)
    job = StreamingJob(dedup_topology(source, "out"), config, spark=spark, delta_sinks=["out"])
    results = job.run_until_caught_up()
    job.close()
    return results, delta_rows(spark, f"{tmp_path}/delta/{app}/out")


def test_at_least_once_gives_the_same_output(spark, kafka_settings, source_topic, tmp_path):
    source, sent = source_topic
    results, rows = _run(
        spark, kafka_settings, tmp_path, source,
        **{"processing.guarantee": "at_least_once", "platform.max.records.per.batch": 1000},
    )  # fmt: skip
    assert len(results) == 1
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)


def test_batches_are_cut_to_keep_uncommitted_state_bounded(
    spark, kafka_settings, source_topic, tmp_path
):
    source, sent = source_topic
    app = f"bounded-{uuid.uuid4().hex[:6]}"
    overrides = {"statestore.uncommitted.max.records": 25, "platform.max.records.per.batch": 1000}
    config = job_config(kafka_settings, tmp_path, app, source, **overrides)
    job = StreamingJob(dedup_topology(source, "out"), config, spark=spark, delta_sinks=["out"])
    results = job.run_until_caught_up()
    job.close()
    # Planned: everything in one batch. A task stops once its store holds more than 25
    # uncommitted entries, so the work takes several batches...
    assert len(results) >= 3
    assert sum(r.records_in for r in results) == RECORDS
    # ...and no task carried more into a commit than 25 entries, plus the writes of the record
    # that passed the limit (its put and the delete of an id it expired, each with its expiry
    # index key), plus the saved stream time. (The task's own stream time row is an offset,
    # not a store entry.)
    changelog = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_changelog")
    entries = changelog.where(changelog.column_family != TASK_OFFSETS)
    per_commit = entries.groupBy("batch_id", "task").count().collect()
    assert max(row["count"] for row in per_commit) <= 25 + 4 + 1
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/out")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)


@pytest.mark.slow  # ~30 s: a broker of its own, restarted
def test_a_broker_restart_between_batches_is_survived(spark, tmp_path):
    with LocalBroker(tmp_path / "own-broker") as broker:
        settings = {"bootstrap.servers": broker.bootstrap_servers}
        source = "restart-source"
        create_topics(settings, [TopicSpec(source, 3), TopicSpec(f"{source}-dlq", 1)])
        sent = make_input(settings, source)
        config = job_config(settings, tmp_path, "restart", source)
        job = StreamingJob(dedup_topology(source, "out"), config, spark=spark, delta_sinks=["out"])
        first = job.run(max_batches=1)
        broker.restart()  # same address, same data; the job's clients reconnect
        rest = job.run_until_caught_up()
        job.close()
    assert len(first) == 1 and len(rest) >= 1
    assert sum(r.records_in for r in first + rest) == RECORDS
    rows = delta_rows(spark, f"{tmp_path}/delta/restart/out")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
