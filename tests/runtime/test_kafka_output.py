"""Kafka outputs keep event time and headers (at least once, their source too); a partition idle for a batch does
not make the next batch run twice."""

from __future__ import annotations

import json
import uuid

import pytest

from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime.microbatch import StreamingJob

from .support import dedup_topology, expected_with_the_test_driver, job_config

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _topic_rows(spark, kafka_settings, topic):
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_settings["bootstrap.servers"])
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
        .collect()
    )
    return [
        (
            bytes(r.value),
            int(r.timestamp.timestamp() * 1000 + 0.5),
            [(h.key, bytes(h.value)) for h in r.headers or []],
        )
        for r in rows
    ]


def _dedup_into_kafka(spark, kafka_settings, tmp_path, source, **overrides):
    """The dedup job from ``source`` into a Kafka topic of its own; the topic's rows."""
    app = f"kout-{uuid.uuid4().hex[:6]}"
    sink = f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(sink, 3)])
    config = job_config(kafka_settings, tmp_path, app, source, **overrides)
    job = StreamingJob(dedup_topology(source, sink), config, spark=spark)
    job.run_until_caught_up()
    job.close()
    return _topic_rows(spark, kafka_settings, sink)


def test_kafka_sinks_and_the_dlq_topic_keep_each_records_timestamp_headers_and_source(
    spark, kafka_settings, source_topic, tmp_path
):
    source, sent = source_topic
    out = _dedup_into_kafka(spark, kafka_settings, tmp_path, source)
    assert sorted(v for v, _, _ in out) == sorted(
        v for _, v in expected_with_the_test_driver(source, sent)
    )
    for value, timestamp, headers in out:
        index = json.loads(value)["n"]  # the input's position; support.make_input's timestamps
        _, _, _, sent_at = sent[index]
        assert timestamp == sent_at, value  # event time, not the time of the write
        # The source's headers and nothing else under exactly_once_v2, as in Kafka Streams.
        assert headers == [("i", str(index).encode())]

    # Every runtime test writes this source's poison records to the same DLQ topic: each
    # copy has the poison record's own timestamp, and its headers, then the error headers.
    poison = [row for row in _topic_rows(spark, kafka_settings, f"{source}-dlq")]
    poison_times = {t for _, _, v, t in sent if v == b"{poison"}
    assert poison and all(v == b"{poison" for v, _, _ in poison)
    assert {t for _, t, _ in poison} == poison_times
    for _, _, headers in poison:
        assert headers[0][0] == "i"
        assert any(k.startswith("__streams.errors.") for k, _ in headers[1:])


def test_at_least_once_each_sink_record_names_its_source_record_so_readers_can_drop_repeats(
    spark, kafka_settings, source_topic, tmp_path
):
    source, sent = source_topic
    out = _dedup_into_kafka(spark, kafka_settings, tmp_path, source,
                            **{"processing.guarantee": "at_least_once"})  # fmt: skip
    assert len(out) == len(expected_with_the_test_driver(source, sent))
    for value, _, headers in out:
        index = json.loads(value)["n"]
        # The source's headers, then its coordinates and the output's number among its outputs.
        assert headers == [("i", str(index).encode()),
                           ("__streamplatform.source", f"{source}/{index % 3}/{index // 3}/0".encode())]  # fmt: skip


def test_a_partition_idle_for_a_batch_does_not_make_the_next_batch_run_twice(
    spark, kafka_settings, tmp_path
):
    from streamplatform.kafka import producer

    source = f"idle-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(source, 2), TopicSpec(f"{source}-dlq", 1)])
    writer = producer(kafka_settings)

    def send(partition: int, first: int) -> None:
        for n in range(first, first + 5):
            value = json.dumps({"id": f"tx-{n}", "n": n}).encode()
            writer.produce(source, key=b"k", value=value, partition=partition, timestamp=n)
        assert writer.flush(60) == 0

    job = StreamingJob(
        dedup_topology(source, "out"), job_config(kafka_settings, tmp_path, "idle", source),
        spark=spark, delta_sinks=["out"],
    )  # fmt: skip
    send(0, 0), send(1, 100)
    results = job.run_until_caught_up()
    send(0, 10)  # partition 1 has nothing new: its task does not run in this batch
    results += job.run_until_caught_up()
    send(1, 110)  # its task runs again, one batch behind the commit log
    results += job.run_until_caught_up()
    job.close()
    assert [r.records_in for r in results] == [10, 5, 5]
    # Its state was not lost: no restore, and the batch ran once.
    assert [r.metrics.get("tasks_restored", 0) for r in results] == [0, 0, 0]
    assert sum(r.restored_records for r in results) == 0
    rows = spark.read.format("delta").load(f"{tmp_path}/delta/idle/out").count()
    assert rows == 20
