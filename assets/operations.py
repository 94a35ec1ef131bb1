"""Operational assets: what the jobs' logs say, read from their Delta tables.

- ``dlq_records``: the DLQ mirrors of both jobs — records, new since last time, by exception,
  replayed and parked by the DLQ replay job, DLQ ratio;
- ``stream_offsets``: the offset and commit logs — batches, consumed offsets and lag per
  partition; each materialization appends the lag per partition to
  ``<delta root>/tables/stream_offsets`` (a history to query);
- ``standby_placements``: the KIP-708 plan of both jobs' tasks over the instances, the Spark
  fair-scheduler pools file and the placements Delta table.
"""

from datetime import UTC, datetime
from typing import Any

import dagster as dg

from assets.streaming import fx_rate_versions, transactions_deduplicated
from assets.streams import (
    JobSpec,
    committed,
    dedup_job,
    delta_version,
    enrichment_job,
    lag_by_partition,
    previous_metadata,
)
from resources import (
    DeltaRootResource,
    KafkaResource,
    SparkResource,
    StandbyPlacementResource,
    StateDirResource,
    StreamsResource,
)
from streamplatform.dlq.ledger import ReplayLedger
from streamplatform.errors.dlq import EXCEPTION_HEADER
from streamplatform.versioned_snapshot import versions_table_version

OFFSETS_HISTORY_TABLE = ("tables", "stream_offsets")
PLACEMENTS_TABLE = ("placements",)
OFFSETS_HISTORY_SCHEMA = (
    "measured_at TIMESTAMP, application_id STRING, topic STRING, partition INT, "
    "consumed LONG, end_offset LONG, lag LONG, last_batch_id LONG"
)
AUTOMATION = dg.AutomationCondition.eager()


def _jobs(
    streams: StreamsResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
) -> list[JobSpec]:
    return [
        dedup_job(streams, kafka, delta_root, state_dir),
        enrichment_job(streams, kafka, delta_root, state_dir),
    ]


def _exists(spark: Any, path: str) -> bool:
    return versions_table_version(spark, path) is not None


def dlq_stats(spark: Any, spec: JobSpec) -> dict[str, Any]:
    """Rows of one job's DLQ mirror, the newest batch id, counts by exception class."""
    from pyspark.sql import functions as F

    path = spec.table("_dlq")
    if not _exists(spark, path):
        return {"rows": 0, "last_batch_id": -1, "by_exception": {}, "version": -1}
    mirror = spark.read.format("delta").load(path)
    totals = mirror.agg(F.count("*").alias("rows"), F.max("batch_id").alias("last")).first()
    exceptions = (
        mirror.select(F.explode("headers").alias("h"))
        .where(F.col("h.key") == EXCEPTION_HEADER)
        .groupBy(F.col("h.value").cast("string").alias("exception"))
        .count()
        .collect()
    )
    return {
        "rows": int(totals.rows),
        "last_batch_id": -1 if totals.last is None else int(totals.last),
        "by_exception": {row.exception or "unknown": int(row["count"]) for row in exceptions},
        "version": delta_version(spark, path),
    }


def records_in(spark: Any, spec: JobSpec) -> int:
    """Records the job has read, summed over its commit log."""
    from pyspark.sql import functions as F

    path = spec.table("_commits")
    if not _exists(spark, path):
        return 0
    total = spark.read.format("delta").load(path).agg(F.sum("records_in")).first()[0]
    return int(total or 0)


@dg.asset(
    deps=[transactions_deduplicated, fx_rate_versions],
    group_name="operations",
    kinds={"spark", "delta"},
    automation_condition=AUTOMATION,
    description=(
        "Dead letter queue records of both jobs, from their Delta mirrors (KIP-1034): totals, "
        "new since the last materialization, by exception, and what the scheduled DLQ replay "
        "re-published or parked."
    ),
)
def dlq_records(
    context: dg.AssetExecutionContext,
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dg.MaterializeResult:
    session = spark.spark_session
    metadata: dict[str, Any] = {}
    total = new = read = replayed = parked = 0
    by_exception: dict[str, int] = {}
    for spec in _jobs(streams, kafka, delta_root, state_dir):
        app = spec.application_id
        stats = dlq_stats(session, spec)
        seen = int(previous_metadata(context, f"{app}.last_dlq_batch_id", -1))
        fresh = 0
        if stats["rows"] and stats["last_batch_id"] > seen:
            mirror = session.read.format("delta").load(spec.table("_dlq"))
            fresh = int(mirror.where(mirror["batch_id"] > seen).count())
        ledger = ReplayLedger(session, spec.app_root, app).counts()
        total, new, read = total + stats["rows"], new + fresh, read + records_in(session, spec)
        replayed, parked = replayed + ledger["replayed"], parked + ledger["parked"]
        for name, count in stats["by_exception"].items():
            by_exception[name] = by_exception.get(name, 0) + count
        metadata |= {
            f"{app}.dlq_records": stats["rows"],
            f"{app}.new_dlq_records": fresh,
            f"{app}.last_dlq_batch_id": stats["last_batch_id"],
            f"{app}.replayed": ledger["replayed"],
            f"{app}.parked": ledger["parked"],
            f"{app}.mirror": dg.MetadataValue.path(spec.table("_dlq")),
            f"{app}.mirror_version": -1 if stats["version"] is None else stats["version"],
        }
    context.log.info(f"{total} DLQ records ({new} new), {replayed} replayed, {parked} parked")
    return dg.MaterializeResult(
        metadata={
            "dlq_records": total,
            "new_dlq_records": new,
            "records_read": read,
            "dlq_ratio": round(total / read, 6) if read else 0.0,
            "replayed": replayed,
            "parked": parked,
            "by_exception": dg.MetadataValue.json(by_exception),
        }
        | metadata
    )


def offsets_report(
    spark: Any, kafka: KafkaResource, spec: JobSpec
) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """Per source partition ``(app, topic, partition, consumed, end, lag, last batch)`` rows
    and the job's numbers (batches, last batch id, lag)."""
    last_batch, consumed = committed(spec)
    lag = lag_by_partition(kafka, spec.sources, consumed)
    rows = []
    for name, partition_lag in sorted(lag.items()):
        topic, partition = name.rsplit("/", 1)
        offset = consumed.get((topic, int(partition)), 0)
        rows.append((spec.application_id, topic, int(partition), offset, offset + partition_lag,
                     partition_lag, -1 if last_batch is None else last_batch))  # fmt: skip
    numbers = {
        "last_batch_id": -1 if last_batch is None else last_batch,
        "batches": 0 if last_batch is None else last_batch + 1,
        "lag": sum(lag.values()),
    }
    return rows, numbers


@dg.asset(
    deps=[transactions_deduplicated, fx_rate_versions],
    group_name="operations",
    kinds={"spark", "delta", "kafka"},
    automation_condition=AUTOMATION,
    description=(
        "Offsets and lag of both jobs from their offset and commit logs (Delta) and the "
        "brokers' end offsets; a history of the lag per partition in "
        "<delta root>/tables/stream_offsets."
    ),
)
def stream_offsets(
    context: dg.AssetExecutionContext,
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dg.MaterializeResult:
    session = spark.spark_session
    now = datetime.now(UTC)
    history: list[tuple[Any, ...]] = []
    metadata: dict[str, Any] = {}
    table_rows = []
    for spec in _jobs(streams, kafka, delta_root, state_dir):
        rows, numbers = offsets_report(session, kafka, spec)
        history += [(now, *row) for row in rows]
        table_rows += rows
        app = spec.application_id
        metadata |= {f"{app}.{name}": value for name, value in numbers.items()}
        metadata[f"{app}.commit_log"] = dg.MetadataValue.path(spec.table("_commits"))
        metadata[f"{app}.offset_log"] = dg.MetadataValue.path(spec.table("_offsets"))
    path = delta_root.table(*OFFSETS_HISTORY_TABLE)
    if history:
        session.createDataFrame(history, OFFSETS_HISTORY_SCHEMA).write.format("delta").mode(
            "append"
        ).save(path)
    table = "| job | topic | partition | consumed | end | lag |\n|---|---|---:|---:|---:|---:|\n"
    table += "".join(
        f"| {a} | {t} | {p} | {c} | {e} | {lag} |\n" for a, t, p, c, e, lag, _ in table_rows
    )
    total_lag = sum(row[5] for row in table_rows)
    context.log.info(f"total lag {total_lag} records over {len(table_rows)} partitions")
    return dg.MaterializeResult(
        metadata={
            "lag": total_lag,
            "partitions": len(table_rows),
            "offsets": dg.MetadataValue.md(table),
            "history_table": dg.MetadataValue.path(path),
            "history_version": delta_version(session, path) or 0,
        }
        | metadata
    )


def task_ids(kafka: KafkaResource, specs: list[JobSpec]) -> list[str]:
    """``"<application.id>/<task id>"`` for every task of the jobs (one per source partition)."""
    from streamplatform.kafka import describe_topics

    tasks = []
    for spec in specs:
        partitions = describe_topics(kafka.settings(), spec.sources)
        for task in spec.topology.task_ids(partitions, spec.application_id):
            tasks.append(f"{spec.application_id}/{task}")
    return tasks


@dg.asset(
    group_name="operations",
    kinds={"spark", "delta"},
    description=(
        "Rack-aware standby placement (KIP-708) of both jobs' tasks over the instances: the plan "
        "(a new generation in the placements Delta table), the Spark fair-scheduler pools file "
        "and per-instance Spark settings (pool, Kubernetes node selectors from the tags)."
    ),
)
def standby_placements(
    context: dg.AssetExecutionContext,
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
    placement: StandbyPlacementResource,
) -> dg.MaterializeResult:
    session = spark.spark_session
    specs = _jobs(streams, kafka, delta_root, state_dir)
    try:
        tasks = task_ids(kafka, specs)
    except (LookupError, ConnectionError) as error:
        context.log.warning(f"Placing the default 3 partitions per job: {error}")
        tasks = [f"{spec.application_id}/0_{p}" for spec in specs for p in range(3)]
    plan = placement.plan(tasks)
    pools = placement.write_pools(plan)
    path = delta_root.table(*PLACEMENTS_TABLE)
    generation = placement.write_table(session, plan, path)
    levels = plan.level_counts()
    load = "| instance | active | standby | load |\n|---|---:|---:|---:|\n" + "".join(
        f"| {client} | {plan.active_counts()[client]} | {plan.standby_counts()[client]} | "
        f"{plan.load[client]:.2f} |\n"
        for client in plan.capacity
    )
    context.log.info(f"placement generation {generation}: {len(tasks)} tasks, levels {levels}")
    return dg.MaterializeResult(
        metadata={
            "generation": generation,
            "tasks": len(tasks),
            "instances": len(plan.capacity),
            "standbys": sum(len(s) for s in plan.standbys.values()),
            "standby_spread": plan.standby_spread(),
            **{f"level_{level}": count for level, count in levels.items()},
            "load": dg.MetadataValue.md(load),
            "executor_settings": dg.MetadataValue.json(placement.executor_settings()),
            "pools_file": dg.MetadataValue.path(str(pools)),
            "placements_table": dg.MetadataValue.path(path),
            "placements_version": delta_version(session, path) or 0,
        }
    )
