"""``transactions_enriched``: the FX-enriched transactions, one partition per UTC day.

A partition is the day's rows in the Delta table ``<delta root>/tables/transactions_enriched``
(partitioned by ``day``; a materialization replaces exactly its day). Two ways to compute it,
chosen by run config (``mode``):

- ``stream`` (default): the rows the streaming join wrote for that day (the enrichment job's
  Delta sink);
- ``batch_as_of`` (what ``enriched_backfill`` runs, launched by the late-version backfill
  sensor): a batch as-of join of the day's deduplicated transactions — exactly the offsets the
  streaming job consumed — with the versioned snapshot of the FX rates. It is what the
  streaming join produces when every rate version is known before the transactions it applies
  to, so it corrects days that late rate versions made wrong.

Rows keep the sink's shape (key, value, timestamp, source coordinates) plus parsed columns.
The check ``stream_equals_batch_join`` compares both ways on a sampled day no late version
touched.
"""

# No `from __future__ import annotations`: Dagster reads the decorated functions' annotations.

import random
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from pydantic import Field

import pipelines
from pipelines import Topics
from streamplatform import batch_as_of_join, read_versioned_snapshot
from streamplatform.dagster import (
    StreamingJobSpec,
    StreamplatformResource,
    consumed_offsets,
    snapshot_asset_name,
)

# The demo's event time starts on 2026-01-01 (pipelines.START_MS) and covers a few days: a
# week of daily partitions, not every day from then until today (the UI would offer hundreds
# of empty ones). A pipeline on live data would end at today instead (end_offset=1).
DAILY = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-08")
ASSET = "transactions_enriched"
BACKFILL_JOB = "enriched_backfill"
STREAM, BATCH_AS_OF = "stream", "batch_as_of"
TRANSACTION_SCHEMA = (
    "id STRING, account STRING, amount DOUBLE, currency STRING, rate DOUBLE, "
    "rate_valid_from LONG, amount_eur DOUBLE"
)
SINK_COLUMNS = ["key", "value", "timestamp", "headers", "source_topic", "source_partition",
                "source_offset"]  # fmt: skip
DAY_MS = 86_400_000


def day_of(timestamp_ms: int) -> str:
    """The UTC day of an epoch-millisecond timestamp, as a partition key of :data:`DAILY`."""
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).strftime("%Y-%m-%d")


def day_bounds(day: str) -> tuple[int, int]:
    """``[start, end)`` of the UTC day ``day`` (``YYYY-MM-DD``) in epoch milliseconds."""
    start = int(datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp() * 1000)
    return start, start + DAY_MS


def delta_table_version(spark: Any, path: str) -> int | None:
    """The current version of the Delta table at ``path``, or None when there is none."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    row = DeltaTable.forPath(spark, path).history(1).select("version").first()
    return None if row is None else int(row[0])


@dataclass(frozen=True)
class Enrichment:
    """The enrichment job's tables and input on one :class:`StreamplatformResource`."""

    job: StreamingJobSpec
    topics: Topics
    resource: StreamplatformResource

    @property
    def sink(self) -> str:
        return f"{self.resource.app_root(self.job)}/{self.topics.enriched}"

    @property
    def versions(self) -> str:
        return f"{self.resource.app_root(self.job)}/_versions"

    @property
    def table(self) -> str:
        """The daily table this asset writes."""
        return f"{self.resource.delta_root_path()}/tables/{ASSET}"

    def consumed(self) -> dict[tuple[str, int], int]:
        """The offsets the job has consumed up to, from its commit log."""
        return consumed_offsets(self.resource, self.job)


def stream_rows(spark: Any, enrichment: Enrichment, day: str) -> Any:
    """The streaming join's rows of ``day`` (its Delta sink), or None before the first."""
    from pyspark.sql import functions as F

    if delta_table_version(spark, enrichment.sink) is None:
        return None
    start, end = day_bounds(day)
    rows = spark.read.format("delta").load(enrichment.sink)
    return rows.where((F.col("timestamp") >= start) & (F.col("timestamp") < end)).select(
        *SINK_COLUMNS
    )


def stream_days(spark: Any, enrichment: Enrichment) -> list[str]:
    """The UTC days the streaming join has written rows for (sorted; none before the first)."""
    from pyspark.sql import functions as F

    if delta_table_version(spark, enrichment.sink) is None:
        return []
    stamps = spark.read.format("delta").load(enrichment.sink).select(
        (F.col("timestamp") / DAY_MS).cast("long").alias("d")).distinct().collect()  # fmt: skip
    return sorted({day_of(int(r.d) * DAY_MS) for r in stamps})


def batch_rows(
    spark: Any, enrichment: Enrichment, day: str, as_of_version: int | None = None
) -> Any:
    """The day recomputed: the deduplicated transactions the streaming job consumed, as-of
    joined with the versioned snapshot (at ``as_of_version`` of ``_versions``, default now)."""
    from pyspark.sql import functions as F

    from streamplatform import read_kafka_ranges

    if delta_table_version(spark, enrichment.versions) is None:
        return None
    topic = enrichment.topics.deduplicated
    low = {p: low for p, (low, _) in enrichment.resource.end_offsets(topic).items()}
    parts = {
        partition: (low.get(partition, 0), offset)
        for (name, partition), offset in enrichment.consumed().items()
        if name == topic and offset > low.get(partition, 0)
    }
    if not parts:
        return None
    settings = enrichment.resource.job_settings(enrichment.job)
    start, end = day_bounds(day)
    transactions = read_kafka_ranges(spark, settings, {topic: parts}).withColumn(
        "timestamp", (F.col("timestamp").cast("double") * 1000).cast("long")
    )
    transactions = transactions.where((F.col("timestamp") >= start) & (F.col("timestamp") < end))
    snapshot = read_versioned_snapshot(spark, enrichment.versions, pipelines.RATES_STORE,
                                       as_of_version)  # fmt: skip
    return batch_as_of_join(transactions, snapshot, pipelines.convert)


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


class EnrichedConfig(dg.Config):
    mode: str = Field(
        default=STREAM,
        description="stream: the streaming join's rows of the day; batch_as_of: recompute the "
        "day with a batch as-of join over the FX-rate versioned snapshot (backfills).",
    )


def enriched_definitions(enrichment_job: StreamingJobSpec, topics: Topics) -> dg.Definitions:
    """The daily asset, its backfill job and its check, for the declared enrichment job."""
    snapshot_key = dg.AssetKey(snapshot_asset_name(enrichment_job, pipelines.RATES_STORE))

    @dg.asset(
        name=ASSET,
        partitions_def=DAILY,
        deps=[dg.AssetKey(enrichment_job.name), snapshot_key],
        group_name="streaming",
        kinds={"spark", "delta"},
        description=(
            "Deduplicated transactions with the FX rate valid at their time and the amount in "
            "EUR, one partition per UTC day. Default: the streaming join's rows of the day; "
            f"`{BACKFILL_JOB}` recomputes days hit by late rate versions with a batch as-of "
            "join (mode=batch_as_of). Guarantee (exactly_once_v2): each deduplicated "
            "transaction once, as the dedup job commits its Kafka output in transactions and "
            "the enrichment job reads it read_committed and writes its Delta sink once per "
            "batch; a day's materialization replaces exactly that day."
        ),
    )
    def transactions_enriched(
        context: dg.AssetExecutionContext,
        config: EnrichedConfig,
        streamplatform: StreamplatformResource,
    ) -> dg.MaterializeResult:
        from pyspark.sql import functions as F

        if config.mode not in (STREAM, BATCH_AS_OF):
            raise dg.Failure(f"mode={config.mode!r}: expected {STREAM!r} or {BATCH_AS_OF!r}")
        day = context.partition_key
        enrichment = Enrichment(enrichment_job, topics, streamplatform)
        spark = streamplatform.spark_session
        versions_version = delta_table_version(spark, enrichment.versions)
        if config.mode == STREAM:
            rows = stream_rows(spark, enrichment, day)
        else:
            rows = batch_rows(spark, enrichment, day, versions_version)
        if rows is None:
            raise dg.Failure(
                f"Nothing to enrich for {day}: the enrichment job ({enrichment_job.app_id}) has "
                f"not run yet. Materialize {enrichment_job.name} first.",
            )
        (
            with_columns(rows, day, config.mode)
            .write.format("delta")
            .mode("overwrite")
            .partitionBy("day")
            .option("replaceWhere", f"day = '{day}'")
            .save(enrichment.table)
        )
        stats = (
            spark.read.format("delta")
            .load(enrichment.table)
            .where(F.col("day") == day)
            .agg(
                F.count("*").alias("rows"),
                F.countDistinct("currency").alias("currencies"),
                F.sum("amount_eur").alias("amount_eur"),
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
                "table": dg.MetadataValue.path(enrichment.table),
                "table_version": delta_table_version(spark, enrichment.table) or 0,
            }
        )

    @dg.asset_check(
        asset=transactions_enriched,
        description="On a sampled day no late rate version touched, the streaming join's rows "
        "equal the batch as-of join over the versioned snapshot.",
    )
    def stream_equals_batch_join(
        context: dg.AssetCheckExecutionContext, streamplatform: StreamplatformResource
    ) -> dg.AssetCheckResult:
        enrichment = Enrichment(enrichment_job, topics, streamplatform)
        spark = streamplatform.spark_session
        days = stream_days(spark, enrichment)
        if not days:
            return dg.AssetCheckResult(passed=True, description="the streaming join has not run")
        late = late_days_so_far(context.instance, snapshot_key)
        clean = [day for day in days if day not in late]
        if not clean:
            return dg.AssetCheckResult(
                passed=True,
                description="every day with joined rows had late rate versions; the backfill "
                "sensor recomputes them with the batch join",
                metadata={"days": len(days), "late_days": len(late)},
            )
        day = random.Random(context.run.run_id).choice(clean)
        streamed = rows_key(stream_rows(spark, enrichment, day))
        batch = batch_rows(spark, enrichment, day)
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

    backfill = dg.define_asset_job(
        name=BACKFILL_JOB,
        selection=[transactions_enriched],
        config={"ops": {ASSET: {"config": {"mode": BATCH_AS_OF}}}},
        description=f"Recompute a day of {ASSET} with a batch as-of join (what the late-version "
        "backfill sensor launches).",
    )
    return dg.Definitions(
        assets=[transactions_enriched], asset_checks=[stream_equals_batch_join], jobs=[backfill]
    )


def late_days_so_far(instance: dg.DagsterInstance, snapshot_key: dg.AssetKey) -> set[str]:
    """Every day any snapshot materialization reported as touched by late versions."""
    days: set[str] = set()
    for record in instance.fetch_materializations(snapshot_key, limit=1000).records:
        materialization = record.asset_materialization
        if materialization is not None and "late_days" in materialization.metadata:
            days |= set(materialization.metadata["late_days"].value)
    return days


def rows_key(frame: Any) -> Counter[tuple[Any, ...]]:
    rows = frame.select("source_partition", "source_offset", "key", "value").collect()
    return Counter(
        (r.source_partition, r.source_offset, bytes(r.key), bytes(r.value)) for r in rows
    )
