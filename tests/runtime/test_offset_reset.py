"""``auto.offset.reset`` on Spark with a real broker: where partitions the job never committed
start — a new job (earliest, latest, by_duration, none) and a partition added to a source later
(after a restart, as Kafka Streams' new tasks). Kafka Streams' default, earliest, is what every
other test runs with."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import NewPartitions

from streamplatform import StreamsBuilder
from streamplatform.config import ConfigError
from streamplatform.kafka import TopicSpec, admin_client, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import job_config, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]  # ~10 s each


def _copy(source: str, sink: str):
    b = StreamsBuilder()
    b.stream(source, Serdes.string(), Serdes.string()).to(sink)
    return b.build()


def _topics(kafka_settings, partitions: int = 1) -> tuple[str, str]:
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_settings, [TopicSpec(source, partitions), TopicSpec(sink, 1),
                                   TopicSpec(f"{source}-dlq", 1)])  # fmt: skip
    return source, sink


def _produce(kafka_settings, topic: str, values: list[str], partition: int = 0,
             timestamp: int | None = None) -> None:  # fmt: skip
    writer = producer(kafka_settings)
    for value in values:
        extra = {} if timestamp is None else {"timestamp": timestamp}
        writer.produce(topic, key="k", value=value, partition=partition, **extra)
    assert writer.flush(30) == 0


def _values(kafka_settings, sink: str) -> list[str]:
    return sorted(r.value.decode() for r in read_topic(kafka_settings, sink))


def test_latest_skips_the_backlog_and_reads_what_arrives_from_the_start_on(
    spark, kafka_settings, tmp_path
):
    source, sink = _topics(kafka_settings)
    _produce(kafka_settings, source, ["old-1", "old-2"])
    config = job_config(kafka_settings, tmp_path, f"latest-{uuid.uuid4().hex[:6]}", source,
                        **{"auto.offset.reset": "latest"})  # fmt: skip
    job = StreamingJob(_copy(source, sink), config, spark=spark)
    try:
        assert job.run_batch() is None  # the backlog is skipped: nothing to read
        _produce(kafka_settings, source, ["new-1"])
        # "latest" was resolved once: what arrived since the start is read, not skipped again.
        assert job.run_batch().records_in == 1
    finally:
        job.close()
    _produce(kafka_settings, source, ["new-2"])
    again = StreamingJob(_copy(source, sink), config, spark=spark)  # committed: goes on
    try:
        again.run_until_caught_up()
    finally:
        again.close()
    assert _values(kafka_settings, sink) == ["new-1", "new-2"]


def test_a_partition_added_later_starts_as_set_and_the_others_go_on(
    spark, kafka_settings, tmp_path
):
    """One partition, latest; the job commits, stops; the topic gets a second partition with
    a backlog of its own; restarted, the job reads partition 0 on from its committed position
    and partition 1 from its end (earliest would read its backlog)."""
    source, sink = _topics(kafka_settings)
    config = job_config(kafka_settings, tmp_path, f"grown-{uuid.uuid4().hex[:6]}", source,
                        **{"auto.offset.reset": "latest"})  # fmt: skip
    job = StreamingJob(_copy(source, sink), config, spark=spark)
    try:
        assert job.run_batch() is None
        _produce(kafka_settings, source, ["p0-a"])
        assert job.run_batch().records_in == 1
    finally:
        job.close()
    admin = admin_client(kafka_settings)
    admin.create_partitions([NewPartitions(source, 2)])[source].result(30)
    _produce(kafka_settings, source, ["p0-b"], partition=0)
    _produce(kafka_settings, source, ["p1-backlog"], partition=1)
    again = StreamingJob(_copy(source, sink), config, spark=spark)
    try:
        again.run_until_caught_up()
        _produce(kafka_settings, source, ["p1-new"], partition=1)
        again.run_until_caught_up()
    finally:
        again.close()
    assert _values(kafka_settings, sink) == ["p0-a", "p0-b", "p1-new"]


def test_by_duration_starts_at_the_records_of_that_long_ago(spark, kafka_settings, tmp_path):
    source, sink = _topics(kafka_settings)
    now = int(time.time() * 1000)
    _produce(kafka_settings, source, ["two-hours-ago"], timestamp=now - 2 * 3_600_000)
    _produce(kafka_settings, source, ["ten-minutes-ago"], timestamp=now - 600_000)
    _produce(kafka_settings, source, ["just-now"], timestamp=now)
    config = job_config(kafka_settings, tmp_path, f"since-{uuid.uuid4().hex[:6]}", source,
                        **{"auto.offset.reset": "by_duration:PT1H"})  # fmt: skip
    job = StreamingJob(_copy(source, sink), config, spark=spark)
    try:
        job.run_until_caught_up()
    finally:
        job.close()
    assert _values(kafka_settings, sink) == ["just-now", "ten-minutes-ago"]


def test_none_refuses_to_start_a_partition_with_no_committed_position(
    spark, kafka_settings, tmp_path
):
    source, sink = _topics(kafka_settings)
    _produce(kafka_settings, source, ["a"])
    config = job_config(kafka_settings, tmp_path, f"none-{uuid.uuid4().hex[:6]}", source,
                        **{"auto.offset.reset": "none"})  # fmt: skip
    job = StreamingJob(_copy(source, sink), config, spark=spark)
    try:
        with pytest.raises(ConfigError, match=rf"no committed position for {source}-0 and "
                           "auto.offset.reset=none"):  # fmt: skip
            job.run_batch()
    finally:
        job.close()
    assert read_topic(kafka_settings, sink) == []
