"""Looking into a dead letter queue: its Delta mirror (exactly once, queryable) or its topic.

- :func:`read_mirror` / :func:`mirror_records`: the runtime's mirror
  ``<platform.delta.root>/<application.id>/_dlq`` as a DataFrame / decoded records;
- :func:`read_topic`: the DLQ topic itself with a consumer (at least once: the runtime writes
  Kafka sinks at least once, so a record may appear twice; the mirror never repeats one);
- :func:`summarize`: counts by exception, by source partition, first and last timestamp.

    >>> from streamplatform.dlq.records import DlqRecord, SourceCoordinates
    >>> records = [DlqRecord.from_headers(None, b"x", t, [("__streams.errors.exception", b"E")],
    ...                                   SourceCoordinates("tx", 0, t)) for t in (3, 9)]
    >>> summary = summarize(records)
    >>> summary.records, summary.by_exception, summary.first_timestamp, summary.last_timestamp
    (2, {'E': 2}, 3, 9)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamplatform.dlq.records import DlqRecord

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MIRROR_TABLE = "_dlq"


def mirror_path(delta_root: str, application_id: str) -> str:
    """Where the runtime mirrors ``application_id``'s DLQ in Delta."""
    return f"{delta_root.rstrip('/')}/{application_id}/{MIRROR_TABLE}"


def table_exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def read_mirror(spark: SparkSession, path: str, since_batch: int | None = None) -> DataFrame | None:
    """The mirror's rows (``topic, key, value, timestamp, headers, source_topic,
    source_partition, source_offset, batch_id``) after ``since_batch``; None without a mirror
    (a job that never sent anything to its DLQ has none)."""
    if not table_exists(spark, path):
        return None
    frame = spark.read.format("delta").load(path)
    return frame if since_batch is None else frame.where(frame["batch_id"] > since_batch)


def mirror_records(
    spark: SparkSession, path: str, since_batch: int | None = None
) -> list[DlqRecord]:
    """The mirror's records after ``since_batch``, decoded, in (batch, source) order."""
    frame = read_mirror(spark, path, since_batch)
    if frame is None:
        return []
    rows = frame.orderBy("batch_id", "source_topic", "source_partition", "source_offset").collect()
    return [DlqRecord.from_mirror_row(row.asDict()) for row in rows]


def read_topic(
    settings: Mapping[str, Any],
    topic: str,
    max_records: int = 10_000,
    timeout_s: float = 10.0,
) -> list[DlqRecord]:
    """Up to ``max_records`` records of the DLQ topic, from the beginning, decoded (source
    coordinates from the error headers). Reads without a consumer group: nothing is committed."""
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from streamplatform.kafka.clients import consumer, describe_topics

    partitions = describe_topics(settings, [topic], timeout_s)[topic]
    reader = consumer(settings, group_id=f"streamplatform-dlq-inspect-{topic}")
    records: list[DlqRecord] = []
    try:
        ends: dict[int, int] = {}
        starts: dict[int, int] = {}
        for partition in range(partitions):
            low, high = reader.get_watermark_offsets(
                KafkaTopicPartition(topic, partition), timeout=timeout_s
            )
            if high > low:
                starts[partition], ends[partition] = low, high
        reader.assign([KafkaTopicPartition(topic, p, starts[p]) for p in ends])
        remaining = dict(ends)
        while remaining and len(records) < max_records:
            message = reader.poll(timeout_s)
            if message is None:
                break
            if message.error():
                raise RuntimeError(f"Reading DLQ topic {topic!r}: {message.error()}")
            raw_headers = message.headers() or []
            pairs = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
            headers = [(str(name), _raw(value)) for name, value in pairs]
            records.append(
                DlqRecord.from_headers(
                    _raw(message.key()), _raw(message.value()), int(message.timestamp()[1] or 0),
                    headers,
                    dlq_topic=topic,
                )
            )  # fmt: skip
            at, offset = message.partition(), message.offset()
            if at is not None and offset is not None and offset + 1 >= ends[at]:
                remaining.pop(at, None)
    finally:
        reader.close()
    return records


def _raw(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


@dataclass(frozen=True)
class DlqSummary:
    """What a set of DLQ records holds, for a report or a Dagster materialization."""

    records: int
    by_exception: dict[str, int] = field(default_factory=dict)
    by_source_partition: dict[str, int] = field(default_factory=dict)
    replays_that_failed: int = 0
    first_timestamp: int | None = None
    last_timestamp: int | None = None


def summarize(records: Iterable[DlqRecord]) -> DlqSummary:
    """Counts by exception class and by source ``topic/partition``; timestamps' range."""
    exceptions: Counter[str] = Counter()
    partitions: Counter[str] = Counter()
    replays = 0
    timestamps: list[int] = []
    for record in records:
        exceptions[record.error.exception or "unknown"] += 1
        partitions[f"{record.source.topic}/{record.source.partition}"] += 1
        replays += record.replay_of is not None
        timestamps.append(record.timestamp)
    return DlqSummary(
        records=len(timestamps),
        by_exception=dict(exceptions.most_common()),
        by_source_partition=dict(sorted(partitions.items())),
        replays_that_failed=replays,
        first_timestamp=min(timestamps, default=None),
        last_timestamp=max(timestamps, default=None),
    )
