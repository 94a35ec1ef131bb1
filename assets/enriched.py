"""``transactions_enriched``: the FX-enriched transactions, one partition per UTC day.

A partition is the day's rows in the Delta table ``<delta root>/tables/transactions_enriched``
(partitioned by ``day``; a materialization replaces exactly its day). Two ways to compute it,
chosen by run config (``mode``):

- ``stream`` (default): the rows the streaming join wrote for that day (the enrichment job's
  Delta sink; ``fx_rate_versions`` runs the job);
- ``batch_as_of`` (what the backfill sensor launches): a batch as-of join of the day's
  deduplicated transactions — exactly the offsets the streaming job consumed — with the
  versioned snapshot of the FX rates. It is what the streaming join produces when every rate
  version is known before the transactions it applies to, so it corrects days that late rate
  versions made wrong.

Rows keep the sink's shape (key, value, timestamp, source coordinates) plus parsed columns.
"""

from typing import Any

import dagster as dg
from pydantic import Field

import pipelines
from assets.lateness import DAY_MS, day_bounds, day_of
from assets.streaming import fx_rate_versions, transactions_deduplicated
from assets.streams import JobSpec, committed, delta_version, enrichment_job
from resources import (
    DeltaRootResource,
    KafkaResource,
    SparkResource,
    StateDirResource,
    StreamsResource,
)
from streamplatform.versioned_snapshot import batch_as_of_join, read_versioned_snapshot

# The demo's event time starts on 2026-01-01 (pipelines.START_MS) and covers a few days: a
# week of daily partitions, not every day from then until today (the UI would offer hundreds
# of empty ones). A pipeline on live data would end at today instead (end_offset=1).
DAILY = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-08")
ENRICHED_TABLE = ("tables", "transactions_enriched")
STREAM, BATCH_AS_OF = "stream", "batch_as_of"
TRANSACTION_SCHEMA = (
    "id STRING, account STRING, amount DOUBLE, currency STRING, rate DOUBLE, "
    "rate_valid_from LONG, amount_eur DOUBLE"
)
SINK_COLUMNS = ["key", "value", "timestamp", "headers", "source_topic", "source_partition",
                "source_offset"]  # fmt: skip


class EnrichedConfig(dg.Config):
    mode: str = Field(
        default=STREAM,
        description="stream: the streaming join's rows of the day; batch_as_of: recompute the "
        "day with a batch as-of join over the FX-rate versioned snapshot (backfills).",
    )


def stream_rows(spark: Any, spec: JobSpec, day: str) -> Any:
    """The streaming join's rows of ``day`` (its Delta sink), or None before the first."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = spec.table(pipelines.ENRICHED)
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    start, end = day_bounds(day)
    rows = spark.read.format("delta").load(path)
    return rows.where((F.col("timestamp") >= start) & (F.col("timestamp") < end)).select(
        *SINK_COLUMNS
    )


def stream_days(spark: Any, spec: JobSpec) -> list[str]:
    """The UTC days the streaming join has written rows for (sorted; none before the first)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = spec.table(pipelines.ENRICHED)
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    stamps = spark.read.format("delta").load(path).select(
        (F.col("timestamp") / DAY_MS).cast("long").alias("d")).distinct().collect()  # fmt: skip
    return sorted({day_of(int(r.d) * DAY_MS) for r in stamps})


def batch_rows(spark: Any, spec: JobSpec, day: str, as_of_version: int | None = None) -> Any:
    """The day recomputed: the deduplicated transactions the streaming job consumed, as-of
    joined with the versioned snapshot (at ``as_of_version`` of ``_versions``, default now)."""
    from pyspark.sql import functions as F

    from streamplatform.spark import read_kafka_ranges

    _, consumed = committed(spec)
    versions = spec.table("_versions")
    if delta_version(spark, versions) is None:
        return None
    low = _low_watermarks(spec, pipelines.DEDUPLICATED)
    parts = {
        partition: (low.get(partition, 0), offset)
        for (topic, partition), offset in consumed.items()
        if topic == pipelines.DEDUPLICATED and offset > low.get(partition, 0)
    }
    if not parts:
        return None
    ranges = {pipelines.DEDUPLICATED: parts}
    start, end = day_bounds(day)
    transactions = read_kafka_ranges(spark, spec.settings, ranges).withColumn(
        "timestamp", (F.col("timestamp").cast("double") * 1000).cast("long")
    )
    transactions = transactions.where((F.col("timestamp") >= start) & (F.col("timestamp") < end))
    snapshot = read_versioned_snapshot(spark, versions, spec.versioned_store, as_of_version)
    return batch_as_of_join(transactions, snapshot, pipelines.convert)


def _low_watermarks(spec: JobSpec, topic: str) -> dict[int, int]:
    from streamplatform.kafka import end_offsets

    return {p: low for p, (low, _) in end_offsets(spec.settings, topic).items()}


def with_columns(rows: Any, day: str, computed_by: str) -> Any:
    """Sink-shaped rows plus ``day``, ``computed_by`` and the parsed transaction fields."""
    from pyspark.sql import functions as F

    parsed = F.from_json(F.col("value").cast("string"), TRANSACTION_SCHEMA)
    return (
        rows.withColumn("tx", parsed)
        .select(
            F.lit(day).alias("day"),
            F.col("key").cast("string").alias("currency_key"),
            "tx.*",
            *SINK_COLUMNS,
            F.lit(computed_by).alias("computed_by"),
        )
        .drop("headers")
    )


@dg.asset(
    partitions_def=DAILY,
    deps=[transactions_deduplicated, fx_rate_versions],
    group_name="streaming",
    kinds={"spark", "delta"},
    description=(
        "Deduplicated transactions with the FX rate valid at their time and the amount in EUR, "
        "one partition per UTC day. Default: the streaming join's rows of the day; the backfill "
        "sensor recomputes days hit by late rate versions with a batch as-of join "
        "(mode=batch_as_of). Guarantee (exactly_once_v2): each deduplicated transaction once, "
        "as the dedup job commits its Kafka output in transactions and the enrichment job "
        "reads it read_committed and writes its Delta sink once per batch; a day's "
        "materialization replaces exactly that day."
    ),
)
def transactions_enriched(
    context: dg.AssetExecutionContext,
    config: EnrichedConfig,
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dg.MaterializeResult:
    from pyspark.sql import functions as F

    if config.mode not in (STREAM, BATCH_AS_OF):
        raise dg.Failure(f"mode={config.mode!r}: expected {STREAM!r} or {BATCH_AS_OF!r}")
    day = context.partition_key
    spec = enrichment_job(streams, kafka, delta_root, state_dir)
    session = spark.spark_session
    versions_version = delta_version(session, spec.table("_versions"))
    if config.mode == STREAM:
        rows = stream_rows(session, spec, day)
    else:
        rows = batch_rows(session, spec, day, versions_version)
    path = delta_root.table(*ENRICHED_TABLE)
    if rows is None:
        raise dg.Failure(
            f"Nothing to enrich for {day}: the enrichment job "
            f"({spec.application_id}) has not run yet. Materialize fx_rate_versions first.",
        )
    daily = with_columns(rows, day, config.mode)
    (
        daily.write.format("delta")
        .mode("overwrite")
        .partitionBy("day")
        .option("replaceWhere", f"day = '{day}'")
        .save(path)
    )
    stats = (
        session.read.format("delta")
        .load(path)
        .where(F.col("day") == day)
        .agg(
            F.count("*").alias("rows"),
            F.countDistinct("currency").alias("currencies"),
            F.sum("amount_eur").alias("amount_eur"),
            F.min("source_offset").alias("first_offset"),
            F.max("source_offset").alias("last_offset"),
        )
        .first()
    )
    context.log.info(f"{day}: {stats.rows} enriched transactions ({config.mode})")
    return dg.MaterializeResult(
        metadata={
            "day": day,
            "computed_by": config.mode,
            "rows": int(stats.rows),
            "currencies": int(stats.currencies),
            "amount_eur_total": float(stats.amount_eur or 0.0),
            "versions_log_version": -1 if versions_version is None else versions_version,
            "table": dg.MetadataValue.path(path),
            "table_version": delta_version(session, path) or 0,
        }
    )
