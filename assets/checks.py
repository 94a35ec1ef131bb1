"""``no_duplicates_within_interval``: the dedup job's output checked against KIP-655's rule.

The output topic holds each (currency, id) exactly as often as KIP-655's rule allows over the
input the job consumed (``dedup_audit.py``): no repeat within the interval, none lost. The
integration's own checks (``caught_up``, ``dlq_ratio``, ``offsets_contiguous``) come with every
streaming asset; this one is the example's, since it knows what an id is.
"""

# No `from __future__ import annotations`: Dagster reads the decorated functions' annotations.

from collections import Counter
from typing import Any

import dagster as dg

import pipelines
from assets.dedup_audit import NOT_DESERIALIZED, compare, expected_forwards
from pipelines import Topics
from streamplatform.dagster import StreamingJobSpec, StreamplatformResource, consumed_offsets
from streamplatform.serdes import Serdes

MAX_LISTED = 20
Ranges = dict[str, dict[int, tuple[int, int]]]


def _read_topic(spark: Any, settings: dict[str, Any], ranges: Ranges) -> list:
    from pyspark.sql import functions as F

    from streamplatform import read_kafka_ranges

    if not ranges:
        return []
    frame = read_kafka_ranges(spark, settings, ranges)
    return frame.select(
        "partition", "offset", F.col("key").cast("string").alias("key"), "value",
        (F.col("timestamp").cast("double") * 1000).cast("long").alias("timestamp"),
    ).collect()  # fmt: skip


def _deserialize(value: bytes | None) -> Any:
    try:
        return Serdes.json().deserialize(value)
    except Exception:
        return NOT_DESERIALIZED


def _whole_topic(resource: StreamplatformResource, topic: str) -> Ranges:
    parts = resource.end_offsets(topic)
    return {topic: {p: r for p, r in parts.items() if r[1] > r[0]}}


def no_duplicates_check(dedup_job: StreamingJobSpec, topics: Topics) -> dg.AssetChecksDefinition:
    """The check on the dedup job's asset (module docstring)."""

    @dg.asset_check(
        asset=dg.AssetKey(dedup_job.name),
        name="no_duplicates_within_interval",
        description="Each (currency, id) appears in the output as often as KIP-655 allows over "
        "the input: no duplicate within the 10-minute interval, none lost.",
    )
    def no_duplicates_within_interval(
        streamplatform: StreamplatformResource,
    ) -> dg.AssetCheckResult:
        spark = streamplatform.spark_session
        settings = streamplatform.job_settings(dedup_job)
        consumed = consumed_offsets(streamplatform, dedup_job)
        low = _whole_topic(streamplatform, topics.transactions)[topics.transactions]
        inputs: Ranges = {}
        for (topic, partition), offset in consumed.items():
            start = low.get(partition, (0, 0))[0]
            if topic == topics.transactions and offset > start:
                inputs.setdefault(topic, {})[partition] = (start, offset)
        rows = [(r.partition, r.offset, r.key, _deserialize(r.value), r.timestamp)
                for r in _read_topic(spark, settings, inputs)]  # fmt: skip
        interval = int(pipelines.DEDUP_INTERVAL.total_seconds() * 1000)
        expected = expected_forwards(rows, interval)
        # The output as a read_committed reader sees it (exactly_once_v2 writes it in Kafka
        # transactions: aborted attempts are not output).
        actual: Counter[tuple[Any, Any]] = Counter()
        output = _whole_topic(streamplatform, topics.deduplicated)
        for row in _read_topic(spark, settings, output):
            value = _deserialize(row.value)
            if isinstance(value, dict) and value.get("id") is not None:
                actual[(row.key, value["id"])] += 1
        extra, missing = compare(expected, actual)
        return dg.AssetCheckResult(
            passed=not extra and not missing,
            metadata={
                "input_records": len(rows),
                "output_ids": len(actual),
                "output_records": sum(actual.values()),
                "duplicates_within_interval": sum(extra.values()),
                "missing": sum(missing.values()),
                "duplicate_examples": dg.MetadataValue.json(
                    {str(k): v for k, v in list(extra.items())[:MAX_LISTED]}
                ),
                "missing_examples": dg.MetadataValue.json(
                    {str(k): v for k, v in list(missing.items())[:MAX_LISTED]}
                ),
                "interval_ms": interval,
            },
        )

    return no_duplicates_within_interval
