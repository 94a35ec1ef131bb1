"""Spark reads exact Kafka offset ranges (headers included) and writes Delta idempotently."""

from __future__ import annotations

import pytest

from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.spark import read_kafka_ranges

pytestmark = [pytest.mark.broker, pytest.mark.spark]

RECORDS_PER_PARTITION = 10


@pytest.fixture
def three_partition_topic(kafka_settings, topic_name):
    """10 records in each of 3 partitions; value "p<partition>-<offset>", two headers each."""
    create_topics(kafka_settings, [TopicSpec(topic_name, partitions=3)])
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    for partition in range(3):
        for offset in range(RECORDS_PER_PARTITION):
            writer.produce(
                topic_name,
                partition=partition,
                key=f"k{offset % 4}",
                value=f"p{partition}-{offset}",
                headers=[("trace", f"t{partition}{offset}".encode()), ("trace", b"again")],
            )
    assert writer.flush(30) == 0
    return topic_name


def _rows(df):
    return sorted(
        (r["partition"], r["offset"], r["key"].decode(), r["value"].decode(), r["headers"])
        for r in df.collect()
    )


def test_exact_offset_ranges_with_headers(spark, kafka_settings, three_partition_topic):
    topic = three_partition_topic
    ranges = {topic: {0: (2, 7), 1: (0, 10), 2: (5, 6)}}
    df = read_kafka_ranges(spark, kafka_settings, ranges)

    assert df.rdd.getNumPartitions() == 3  # one Spark partition per Kafka partition
    rows = _rows(df)
    expected_offsets = [(0, o) for o in range(2, 7)] + [(1, o) for o in range(10)] + [(2, 5)]
    assert [(p, o) for p, o, *_ in rows] == expected_offsets  # ending offsets are exclusive
    for partition, offset, key, value, headers in rows:
        assert key == f"k{offset % 4}"
        assert value == f"p{partition}-{offset}"
        # Headers keep their order and a repeated name, as in Kafka.
        assert [(h["key"], bytes(h["value"])) for h in headers] == [
            ("trace", f"t{partition}{offset}".encode()),
            ("trace", b"again"),
        ]


def test_delta_append_is_idempotent_by_txn_version_and_time_travels(
    spark, kafka_settings, three_partition_topic, tmp_path
):
    topic = three_partition_topic
    table = str(tmp_path / "delta" / "events")

    def append(ranges, version):
        df = read_kafka_ranges(spark, kafka_settings, {topic: ranges}).select(
            "topic", "partition", "offset", "value", "headers"
        )
        (
            df.write.format("delta")
            .mode("append")
            .option("txnAppId", "test-app")
            .option("txnVersion", str(version))
            .save(table)
        )

    def count(**read_options):
        return spark.read.format("delta").options(**read_options).load(table).count()

    batch_0 = {0: (0, 5), 1: (0, 5), 2: (0, 5)}
    batch_1 = {0: (5, 10), 1: (5, 10), 2: (5, 10)}
    append(batch_0, version=0)
    assert count() == 15

    append(batch_0, version=0)  # the same batch again, e.g. after a crash before its commit
    assert count() == 15
    duplicates = (
        spark.read.format("delta").load(table).groupBy("partition", "offset").count()
        .where("count > 1").count()
    )  # fmt: skip
    assert duplicates == 0

    append(batch_1, version=1)
    assert count() == 30
    assert count(versionAsOf=0) == 15  # time travel to the first batch
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert sorted(row["version"] for row in history) == [0, 1]  # the skipped write made no version

    headers = spark.read.format("delta").load(table).where("partition = 1 AND offset = 3")
    [row] = headers.collect()
    assert bytes(row["headers"][0]["value"]) == b"t13"
