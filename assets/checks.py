"""Asset checks: the guarantees the streaming assets claim, verified from their data.

- ``no_duplicates_within_interval`` (transactions_deduplicated): the output holds each
  (currency, id) exactly as often as KIP-655's rule allows over the input (``dedup_audit.py``);
- ``offsets_contiguous`` (stream_offsets): in both jobs' offset and commit logs every batch
  starts where the previous one was consumed up to, batch ids have no gaps, and consumed
  offsets stay within the planned ranges;
- ``dlq_below_threshold`` (dlq_records): DLQ records / records read stays under
  ``STREAMPLATFORM_DLQ_MAX_RATIO`` (default 1%);
- ``stream_equals_batch_join`` (transactions_enriched): on a sampled day that no late rate
  version touched, the streaming join's rows equal the batch as-of join's, row for row.
"""

import os
import random
from collections import Counter
from typing import Any

import dagster as dg

import pipelines
from assets.dedup_audit import NOT_DESERIALIZED, compare, expected_forwards
from assets.enriched import batch_rows, stream_days, stream_rows, transactions_enriched
from assets.operations import dlq_records, stream_offsets
from assets.streaming import fx_rate_versions, transactions_deduplicated
from assets.streams import JobSpec, committed, dedup_job, delta_version, enrichment_job
from resources import (
    DeltaRootResource,
    KafkaResource,
    SparkResource,
    StateDirResource,
    StreamsResource,
)
from streamplatform.dagster.checks import offset_log_problems
from streamplatform.serdes import Serdes

MAX_LISTED = 20


def _read_topic(spark: Any, spec: JobSpec, ranges: dict[str, dict[int, tuple[int, int]]]) -> list:
    from pyspark.sql import functions as F

    from streamplatform.spark import read_kafka_ranges

    if not ranges:
        return []
    frame = read_kafka_ranges(spark, spec.settings, ranges)
    return frame.select(
        "partition", "offset", F.col("key").cast("string").alias("key"), "value",
        (F.col("timestamp").cast("double") * 1000).cast("long").alias("timestamp"),
    ).collect()  # fmt: skip


def _deserialize(value: bytes | None) -> Any:
    try:
        return Serdes.json().deserialize(value)
    except Exception:
        return NOT_DESERIALIZED


def _whole_topic(spec: JobSpec, topic: str) -> dict[str, dict[int, tuple[int, int]]]:
    from streamplatform.kafka import end_offsets

    parts = {p: (low, high) for p, (low, high) in end_offsets(spec.settings, topic).items()}
    return {topic: {p: r for p, r in parts.items() if r[1] > r[0]}}


@dg.asset_check(
    asset=transactions_deduplicated,
    description="Each (currency, id) appears in the output as often as KIP-655 allows over the "
    "input: no duplicate within the 10-minute interval, none lost.",
)
def no_duplicates_within_interval(
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dg.AssetCheckResult:
    spec = dedup_job(streams, kafka, delta_root, state_dir)
    session = spark.spark_session
    _, consumed = committed(spec)
    inputs: dict[str, dict[int, tuple[int, int]]] = {}
    low = _whole_topic(spec, pipelines.TRANSACTIONS)[pipelines.TRANSACTIONS]
    for (topic, partition), offset in consumed.items():
        start = low.get(partition, (0, 0))[0]
        if topic == pipelines.TRANSACTIONS and offset > start:
            inputs.setdefault(topic, {})[partition] = (start, offset)
    rows = [(r.partition, r.offset, r.key, _deserialize(r.value), r.timestamp)
            for r in _read_topic(session, spec, inputs)]  # fmt: skip
    interval = int(pipelines.DEDUP_INTERVAL.total_seconds() * 1000)
    expected = expected_forwards(rows, interval)
    actual: Counter[tuple[Any, Any]] = Counter()
    for row in _read_topic(session, spec, _whole_topic(spec, pipelines.DEDUPLICATED)):
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
            "duplicate_examples": dg.MetadataValue.json(dict(list(extra.items())[:MAX_LISTED])),
            "missing_examples": dg.MetadataValue.json(dict(list(missing.items())[:MAX_LISTED])),
            "interval_ms": interval,
        },
    )


def log_gaps(spark: Any, spec: JobSpec) -> tuple[int, list[str]]:
    """Batches in the job's logs and every break of contiguity found, described."""
    return offset_log_problems(spark, spec.app_root)


@dg.asset_check(
    asset=stream_offsets,
    description="Offset and commit logs of both jobs are contiguous: no gap, no overlap.",
)
def offsets_contiguous(
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dg.AssetCheckResult:
    session = spark.spark_session
    metadata: dict[str, Any] = {}
    problems: list[str] = []
    for spec in (dedup_job(streams, kafka, delta_root, state_dir),
                 enrichment_job(streams, kafka, delta_root, state_dir)):  # fmt: skip
        batches, found = log_gaps(session, spec)
        metadata[f"{spec.application_id}.batches"] = batches
        problems += [f"{spec.application_id}: {p}" for p in found]
    return dg.AssetCheckResult(
        passed=not problems,
        metadata=metadata | {"problems": dg.MetadataValue.json(problems[:MAX_LISTED])},
    )


def dlq_max_ratio() -> float:
    return float(os.environ.get("STREAMPLATFORM_DLQ_MAX_RATIO", "0.01"))


@dg.asset_check(
    asset=dlq_records,
    description="DLQ records stay below STREAMPLATFORM_DLQ_MAX_RATIO (default 1%) of the "
    "records read.",
)
def dlq_below_threshold(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    event = context.instance.get_latest_materialization_event(dlq_records.key)
    materialization = None if event is None else event.asset_materialization
    if materialization is None:
        return dg.AssetCheckResult(passed=True, description="dlq_records not materialized yet")
    ratio = float(materialization.metadata["dlq_ratio"].value)
    limit = dlq_max_ratio()
    return dg.AssetCheckResult(
        passed=ratio <= limit,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "dlq_ratio": ratio,
            "max_ratio": limit,
            "dlq_records": int(materialization.metadata["dlq_records"].value),
        },  # fmt: skip
    )


def late_days_so_far(context: dg.AssetCheckExecutionContext) -> set[str]:
    """Every day any fx_rate_versions materialization reported as touched by late versions."""
    days: set[str] = set()
    records = context.instance.fetch_materializations(fx_rate_versions.key, limit=1000).records
    for record in records:
        materialization = record.asset_materialization
        if materialization is not None and "late_days" in materialization.metadata:
            days |= set(materialization.metadata["late_days"].value)
    return days


def rows_key(frame: Any) -> Counter[tuple[Any, ...]]:
    rows = frame.select("source_partition", "source_offset", "key", "value").collect()
    return Counter(
        (r.source_partition, r.source_offset, bytes(r.key), bytes(r.value)) for r in rows
    )


@dg.asset_check(
    asset=transactions_enriched,
    description="On a sampled day no late rate version touched, the streaming join's rows "
    "equal the batch as-of join over the versioned snapshot.",
)
def stream_equals_batch_join(
    context: dg.AssetCheckExecutionContext,
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dg.AssetCheckResult:
    spec = enrichment_job(streams, kafka, delta_root, state_dir)
    session = spark.spark_session
    if delta_version(session, spec.table(pipelines.ENRICHED)) is None:
        return dg.AssetCheckResult(passed=True, description="the streaming join has not run yet")
    days = stream_days(session, spec)
    late = late_days_so_far(context)
    clean = [day for day in days if day not in late]
    if not clean:
        return dg.AssetCheckResult(
            passed=True,
            description="every day with joined rows had late rate versions; the backfill "
            "sensor recomputes them with the batch join",
            metadata={"days": len(days), "late_days": len(late)},
        )
    day = random.Random(context.run.run_id).choice(clean)
    streamed = rows_key(stream_rows(session, spec, day))
    batch = batch_rows(session, spec, day)
    recomputed = rows_key(batch) if batch is not None else Counter()
    only_stream, only_batch = streamed - recomputed, recomputed - streamed
    return dg.AssetCheckResult(
        passed=not only_stream and not only_batch,
        metadata={
            "sampled_day": day,
            "stream_rows": sum(streamed.values()),
            "batch_rows": sum(recomputed.values()),
            "only_in_stream": sum(only_stream.values()),
            "only_in_batch": sum(only_batch.values()),
            "days_with_rows": len(days),
            "days_with_late_versions": len(late),
        },
    )


all_asset_checks = [
    no_duplicates_within_interval,
    offsets_contiguous,
    dlq_below_threshold,
    stream_equals_batch_join,
]
