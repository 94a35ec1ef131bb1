"""A team's own job (pageviews.py: a filter, a dedup, a counting processor with a typed store,
a Kafka sink and a Delta sink) gives on Spark the answer it gives in the test driver, with
several records per key in one micro-batch, under both guarantees; and a batch that failed
after its tasks ran leaves no state behind under either."""

from __future__ import annotations

import uuid

import pytest
from pyspark import cloudpickle

from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime.logs import CommitLog
from streamplatform.runtime.microbatch import StreamingJob

from . import pageviews as pageviews_module
from .pageviews import (
    PARTITIONS,
    counts_per_user,
    duplicates_in,
    expected_counts,
    make_views,
    pageviews,
    produce_views,
)
from .support import read_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark]
# The session's Spark workers started before this folder was on any path they know: the job's
# module travels by value, as a team's package installed on the workers would be imported.
cloudpickle.register_pickle_by_value(pageviews_module)
VIEWS = 80  # 40 per partition, 20 per user: one batch holds every view of a user


def _pageviews_job(spark, kafka_settings, tmp_path, guarantee):
    """The job over topics of its own holding VIEWS views: ``(job, app, views, counts topic)``."""
    suffix = uuid.uuid4().hex[:6]
    views_topic, counts_topic = f"views-{suffix}", f"counts-{suffix}"
    create_topics(
        kafka_settings, [TopicSpec(views_topic, PARTITIONS), TopicSpec(counts_topic, PARTITIONS)]
    )
    views = make_views(VIEWS)
    produce_views(kafka_settings, views_topic, views)
    app = f"pageviews-{suffix}"
    job = StreamingJob(
        pageviews(views_topic, counts_topic, "deduplicated"),
        _config(kafka_settings, tmp_path, app, guarantee),
        spark=spark,
        delta_sinks=["deduplicated"],
    )
    return job, app, views, counts_topic


def _config(kafka_settings, tmp_path, app, guarantee, **overrides):
    return {
        "application.id": app,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": guarantee,
        "state.dir": str(tmp_path / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
    } | overrides


@pytest.mark.parametrize(
    "guarantee", ["exactly_once_v2", pytest.param("at_least_once", marks=pytest.mark.slow)]
)
def test_the_counting_processor_counts_on_spark_as_in_the_test_driver(
    spark, kafka_settings, tmp_path, guarantee
):
    job, app, views, counts_topic = _pageviews_job(spark, kafka_settings, tmp_path, guarantee)
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert [r.batch_id for r in results] == [0]  # every view of a user in one batch
    assert results[0].guarantee == guarantee
    assert CommitLog(f"{tmp_path}/delta/{app}/_commits", app).last().guarantee == guarantee

    expected = expected_counts(views)
    on_spark = counts_per_user(read_topic(kafka_settings, counts_topic))
    assert on_spark == expected
    assert all(counts == list(range(1, len(counts) + 1)) for counts in on_spark.values())
    deduplicated = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/deduplicated")
    assert deduplicated.count() == sum(len(counts) for counts in on_spark.values())


@pytest.mark.parametrize(
    "guarantee", ["exactly_once_v2", pytest.param("at_least_once", marks=pytest.mark.slow)]
)
def test_a_batch_that_failed_after_its_tasks_leaves_no_state_under_either_guarantee(
    spark, kafka_settings, tmp_path, monkeypatch, guarantee
):
    """Batch 0 fails after its tasks ran and wrote their outputs (the injected failure at
    ``after_outputs``); the replay in the same process starts from the last commit's state:
    the counts are the uninterrupted run's (only Kafka records may repeat, under
    at_least_once), and the dedup does not take the failed attempt's ids for duplicates."""
    monkeypatch.setenv("STREAMPLATFORM_FAIL_ONCE", "after_outputs:0")
    monkeypatch.setenv("STREAMPLATFORM_FAIL_ONCE_FILE", str(tmp_path / "failed-once"))
    job, app, views, counts_topic = _pageviews_job(spark, kafka_settings, tmp_path, guarantee)
    try:
        with pytest.raises(RuntimeError, match="injected failure at after_outputs of batch 0"):
            job.run_batch()
        replay = job.run_batch()
        assert replay is not None and replay.replayed and replay.batch_id == 0
        assert job.run_batch() is None
    finally:
        job.close()

    expected = expected_counts(views)
    committed = counts_per_user(read_topic(kafka_settings, counts_topic))
    if guarantee == "exactly_once_v2":
        assert committed == expected  # each count once
    else:
        # The failed attempt's counts were sent (at least once), then the replay's: the same
        # numbers again, never counts that go on from the failed attempt's state.
        for user, counts in committed.items():
            assert counts == expected[user] * 2, user
    assert replay.duplicates_dropped == duplicates_in(views)
