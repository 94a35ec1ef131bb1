"""Aggregations on Spark behave as in the test driver: several records per key in each
micro-batch, windows closing across batches, late records dropped, exactly once into Kafka."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from streamplatform import TimeWindowedSerde
from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import (
    PARTITIONS,
    job_config,
    make_views,
    read_topic,
    spend_per_user_topology,
    suppressed_views_per_window_topology,
    through_the_test_driver,
    views_per_spend_topology,
    views_per_window_topology,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]
WINDOWED = TimeWindowedSerde(Serdes.string(), 10_000)


def _run(spark, kafka_settings, tmp_path, topology_of, views=600):
    app = f"agg-{uuid.uuid4().hex[:6]}"
    source, sink = f"{app}-views", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS), TopicSpec(sink, PARTITIONS)])
    sent = make_views(kafka_settings, source, views)
    config = job_config(kafka_settings, tmp_path, app, source) | {
        "platform.max.records.per.batch": 50,  # per partition: 4 batches, ~25 views a user in each
        "errors.dead.letter.queue.topic.name": None,
    }
    job = StreamingJob(topology_of(source, sink), config, spark=spark)
    results = job.run_until_caught_up()
    job.close()
    assert len(results) >= 4
    return source, sink, sent, results


@pytest.mark.parametrize(
    "topology_of",
    # ~9 s each; make test keeps the first (suppress() against Kafka Streams is in
    # tests/reference, in both tiers)
    [views_per_window_topology,
     pytest.param(suppressed_views_per_window_topology, marks=pytest.mark.slow)],
)  # fmt: skip
def test_each_windows_final_count_reaches_kafka_once_as_in_the_test_driver(
    spark, kafka_settings, tmp_path, topology_of
):
    """On window close, or every update suppressed until the window closes: the same."""
    source, sink, sent, results = _run(spark, kafka_settings, tmp_path, topology_of)
    got = [(WINDOWED.deserialize(r.key), Serdes.long().deserialize(r.value), r.timestamp)
           for r in read_topic(kafka_settings, sink)]  # fmt: skip
    expected = through_the_test_driver(topology_of(source, sink), source, sink,
                                       sent, WINDOWED, Serdes.long())  # fmt: skip
    assert len(expected) > 20
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    assert len({key for key, _, _ in got}) == len(got)  # each window once
    # The late views were dropped on Spark too, and counted.
    assert sum(r.metrics.get("dropped_records", 0) for r in results) > 0


def test_a_table_forwards_each_keys_last_update_of_a_batch_and_ends_as_in_the_test_driver(
    spark, kafka_settings, tmp_path
):
    """The record cache at the end of each micro-batch: one update per user and batch (the
    batch's last), and the same totals in the end as every update in the test driver."""
    source, sink, sent, results = _run(spark, kafka_settings, tmp_path, spend_per_user_topology)
    records = read_topic(kafka_settings, sink)
    got = [(r.key.decode(), Serdes.long().deserialize(r.value), r.timestamp) for r in records]
    expected = through_the_test_driver(spend_per_user_topology(source, sink), source, sink,
                                       sent, Serdes.string(), Serdes.long())  # fmt: skip
    assert set(got) <= set(expected)  # each a total the user really had, with its timestamp
    final = {key: total for key, total, _ in expected}
    assert {key: total for key, total, _ in got} == final
    assert len(got) < len(expected)  # the cache dropped the intermediate updates...
    per_user = Counter(key for key, _, _ in got)
    assert max(per_user.values()) <= len(results)  # ...to at most one per user and batch


def test_a_count_after_group_by_ends_as_in_the_test_driver(spark, kafka_settings, tmp_path):
    """group_by re-keys: the views are repartitioned inside each micro-batch (the
    direct-stages path) to the task of their new key; every count in the end equals the test driver's."""
    source, sink, sent, results = _run(spark, kafka_settings, tmp_path, views_per_spend_topology)
    assert {r.path for r in results} == {"direct-stages-driver"}
    got = [(r.key.decode(), Serdes.long().deserialize(r.value)) for r in
           read_topic(kafka_settings, sink)]  # fmt: skip
    expected = through_the_test_driver(views_per_spend_topology(source, sink), source, sink,
                                       sent, Serdes.string(), Serdes.long())  # fmt: skip
    assert {key: count for key, count in got} == {key: count for key, count, _ in expected}
    assert sum(r.records_in for r in results) == len(sent)
