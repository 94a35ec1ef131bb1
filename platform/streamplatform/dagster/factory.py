"""streaming_definitions: the Dagster definitions of declared streaming jobs, in one call.

For each :class:`StreamingJobSpec` it yields:

- the **streaming asset** ``<name>``: a materialization runs the job's micro-batches until every
  source partition is read to its end; it depends on its source topics as external assets
  (``kafka/<topic>``), runs in the job's pool ``streamplatform/<application.id>`` (the instance
  limits each pool to one run, so a second launch waits in the queue), and reports what it did
  as metadata (the ``processing.guarantee`` it ran under, rows in and out, duplicates dropped,
  late records, join misses, DLQ records, throughput, the event-time watermark, lag, consumed
  offsets, every runtime metric). A run that read nothing (no batch) does not materialize it:
  its latest materialization keeps the numbers of the last run that did something, and the
  run's metadata (lag, offsets) is an observation of it; assets downstream of it in that run
  are skipped (Dagster's rule for an output not yielded). The Kafka topics it writes are assets
  it materializes too (``kafka/<topic>``, also in a run that read nothing: a job reading one
  may have new records on its other sources), so a job reading one of them is downstream of
  it; a topic two jobs write is the asset of one of them (the other lists it in its
  ``shared_sinks``). The asset, each topic and each check can be selected alone;
- its **asset checks**, evaluated with each run: ``caught_up`` (no lag left),
  ``dlq_ratio`` (DLQ records / records read under ``max_dlq_ratio``) and ``offsets_contiguous``
  (the offset and commit logs have no gap and no overlap);
- a **versioned snapshot asset** ``<name>_<store>_versions`` per versioned store (KIP-889): the
  store's versions ``(key, value, valid_from, valid_to)`` as a Delta table under
  ``<delta root>/<application.id>/_snapshots/<store>``; for a store with a declared as-of join
  (:class:`AsOfJoin`) it also reports the versions that arrived late for the join and the UTC
  days they make stale;
- for such a join with a ``backfill_job``, the **late-version backfill sensor**
  ``<snapshot asset>_late_backfill``: one run of that day-partitioned job per stale day, each
  day once per report (on by default);
- with a DLQ topic, the **DLQ replay** job ``<name>_dlq_replay`` and its schedule
  ``<name>_dlq_replay_schedule``: records that pass the current topology are re-published to
  their source topic, those that fail again are parked, each DLQ record once
  (:class:`streamplatform.dlq.DlqReplayer`); its op is in the job's pool too;
- the **maintenance** job ``<name>_maintenance`` and its schedule
  ``<name>_maintenance_schedule`` (daily by default, on): snapshots of each task's changelog,
  compaction, checkpoints and vacuum of the job's runtime tables
  (:func:`streamplatform.runtime.maintenance.maintain`); its op is in the job's pool too;
- the **lag sensor** ``<name>_lag``: a run of the asset when the records not yet consumed pass
  ``lag_threshold`` (off by default; a sensor that starts Spark runs unasked surprises).

Everything is named after the job, so two declarations (two component files) never collide,
except on the Kafka topics they write: two jobs whose assets would both be ``kafka/<topic>``
(or two jobs of one name) stop the definitions when they load, saying what to do.
The resource is the one under the key ``streamplatform`` (:class:`StreamplatformResource`).
"""

# No `from __future__ import annotations`: Dagster reads the decorated functions' annotations.

import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from pydantic import Field

from streamplatform.config import ConfigError
from streamplatform.dagster.checks import dlq_ratio, lag_by_partition, offset_log_problems
from streamplatform.dagster.resource import StreamplatformResource
from streamplatform.dagster.spec import AsOfJoin, StreamingJobSpec
from streamplatform.dlq import DlqReplayer
from streamplatform.runtime import delta_direct
from streamplatform.runtime.logs import CommitLog
from streamplatform.runtime.maintenance import maintain
from streamplatform.runtime.microbatch import BatchResult, StreamingJob
from streamplatform.runtime.state_tables import STATE_SUFFIX, state_table_path
from streamplatform.runtime.task import add_metrics

RESOURCE_KEY = "streamplatform"
POOL_PREFIX = "streamplatform/"
BACKFILL_TAG = "streamplatform/backfill"
CHECKS = {
    "caught_up": "Every source partition was read to its end by the run (no lag left).",
    "dlq_ratio": "DLQ records / records read by the run stay under the declared maximum.",
    "offsets_contiguous": "The offset and commit logs have no gap and no overlap: each batch "
    "starts where the previous one was consumed up to.",
}


# What a streaming asset's description says of its job's processing.guarantee.
GUARANTEES = {
    "exactly_once_v2": "Guarantee (processing.guarantee=exactly_once_v2): each record read is "
    "in the Delta sinks and the state once, and a read_committed reader sees each Kafka output "
    "once (one Kafka transaction per task and batch, committing its offsets to the consumer "
    "group of the application.id), whatever crashes, retries or second runs happen.",
    "at_least_once": "Guarantee (processing.guarantee=at_least_once): every record read is "
    "processed at least once; the Delta sinks are written once per batch, but after a crash or "
    "a retry the Kafka outputs may hold repeats (each carries the header "
    "__streamplatform.source to drop them by).",
}


def job_pool(application_id: str) -> str:
    """The Dagster pool of the streaming job ``application_id``: ``streamplatform/<id>``.

    Every op that runs the job or writes its runtime tables (its asset, its DLQ replay) is in
    it; an instance whose ``concurrency.pools.default_limit`` is 1 runs one at a time."""
    return f"{POOL_PREFIX}{application_id}"


def topic_key(topic: str) -> dg.AssetKey:
    """The asset key of a Kafka topic: ``kafka/<topic>``."""
    return dg.AssetKey(["kafka", topic])


def streaming_definitions(
    jobs: Sequence[StreamingJobSpec],
    *,
    resource: StreamplatformResource | None = None,
    lag_threshold: int = 1000,
    max_dlq_ratio: float = 0.01,
    dlq_replay_cron: str = "*/15 * * * *",
    dlq_replay_running: bool = False,
    maintenance_cron: str = "0 3 * * *",
    maintenance_running: bool = True,
) -> dg.Definitions:
    """The definitions of ``jobs`` (module docstring). ``resource``: the
    :class:`StreamplatformResource` to bind under ``streamplatform``; leave it out when the
    project binds one itself (once for every job)."""
    check_declarations(jobs)
    assets: list[Any] = []
    job_defs, schedules, sensors = [], [], []
    for job in jobs:
        streaming = streaming_asset(job, max_dlq_ratio)
        assets.append(streaming)
        assets += [snapshot_asset(job, store) for store in job.versioned_stores()]
        if job.dlq_topic:
            replay = dlq_replay_job(job)
            job_defs.append(replay)
            schedules.append(
                dg.ScheduleDefinition(
                    name=f"{job.name}_dlq_replay_schedule",
                    job=replay,
                    cron_schedule=dlq_replay_cron,
                    default_status=dg.DefaultScheduleStatus.RUNNING
                    if dlq_replay_running
                    else dg.DefaultScheduleStatus.STOPPED,
                    description=f"Replays {job.name}'s DLQ; a DLQ record is replayed at most once.",
                )
            )
        maintenance = maintenance_job(job)
        job_defs.append(maintenance)
        schedules.append(
            dg.ScheduleDefinition(
                name=f"{job.name}_maintenance_schedule",
                job=maintenance,
                cron_schedule=maintenance_cron,
                default_status=dg.DefaultScheduleStatus.RUNNING
                if maintenance_running
                else dg.DefaultScheduleStatus.STOPPED,
                description=f"Maintains {job.name}'s runtime tables (changelog snapshots, "
                "compaction, checkpoints, vacuum): restores stay as fast as the job ages.",
            )
        )
        sensors.append(lag_sensor(job, streaming, lag_threshold))
        sensors += [late_version_backfill_sensor(job, join) for join in job.as_of_joins
                    if join.backfill_job]  # fmt: skip
    return dg.Definitions(
        assets=assets,
        jobs=job_defs,
        schedules=schedules,
        sensors=sensors,
        resources={RESOURCE_KEY: resource} if resource is not None else {},
    )


def check_declarations(jobs: Sequence[StreamingJobSpec]) -> None:
    """Jobs that would give Dagster one asset twice, refused with what to do: two jobs of one
    name, or two jobs that materialize the asset of one Kafka topic they write."""
    names = [job.name for job in jobs]
    for name in sorted({name for name in names if names.count(name) > 1}):
        raise ConfigError(
            f"job names must be unique: two streaming jobs are named {name!r}, and a job's "
            "name is its asset's name; give one of them another name (its application_id "
            "can stay)"
        )
    writers: dict[str, str] = {}
    for job in jobs:
        for topic in job.topic_assets():
            first = writers.setdefault(topic, job.name)
            if first != job.name:
                raise ConfigError(
                    f"Kafka topic {topic!r} is written by the streaming jobs {first!r} and "
                    f"{job.name!r}, and its asset {topic_key(topic).to_user_string()} can "
                    f"have one writer in Dagster. Keep one writer's asset: list {topic!r} in "
                    "the other job's shared_sinks (it still writes the topic, without "
                    "materializing the asset), or give one of them a topic of its own."
                )


# The streaming asset ----------------------------------------------------------------------


def streaming_asset(job: StreamingJobSpec, max_dlq_ratio: float = 0.01) -> dg.AssetsDefinition:
    """The job's asset, and the Kafka topics it writes as assets it materializes too."""
    key = dg.AssetKey(job.name)
    sinks = ", ".join(
        [f"Kafka topic `{t}`" for t in job.kafka_sink_topics()]
        + [f"Delta table `{t}`" for t in job.delta_sinks]
        + [f"Delta table `{t}_state` (its current state)" for t in job.delta_state_tables]
    )  # fmt: skip
    description = job.description or (
        f"Runs the streaming job `{job.app_id}` until caught up: "
        f"{', '.join(job.source_topics())} -> {sinks or 'its stores'}"
        + (f"; failing records to the DLQ topic `{job.dlq_topic}`" if job.dlq_topic else "")
        + ". "
        + GUARANTEES[job.processing_guarantee]
    )

    specs = [
        dg.AssetSpec(
            key,
            deps=[topic_key(topic) for topic in job.source_topics()],
            group_name=job.group_name,
            kinds={"spark", "kafka", "delta"},
            description=description,
            freshness_policy=None
            if job.freshness is None
            else dg.FreshnessPolicy.time_window(fail_window=job.freshness),
            metadata={"application_id": job.app_id, "topology": job.load_topology().describe()},
            # A run that read nothing does not materialize it (an observation instead).
            skippable=True,
        ),
        # The Kafka topics it writes, so that a job reading one depends on this one.
        *[
            dg.AssetSpec(
                topic_key(topic),
                deps=[key],
                group_name=job.group_name,
                kinds={"kafka"},
                description=f"Kafka topic `{topic}`, written by `{job.name}`.",
            )
            for topic in job.topic_assets()
        ],  # fmt: skip
    ]

    @dg.multi_asset(
        name=job.name,
        specs=specs,
        pool=job_pool(job.app_id),
        check_specs=[
            dg.AssetCheckSpec(name, asset=key, description=text) for name, text in CHECKS.items()
        ],  # fmt: skip
        # Any of its assets and checks can be selected alone (the job runs for any of them).
        can_subset=True,
    )
    def _streaming(context: dg.AssetExecutionContext, streamplatform: StreamplatformResource):
        metadata, checks = run_until_caught_up(context, job, streamplatform, max_dlq_ratio)
        selected_checks = context.selected_asset_check_keys
        checks = [c for c in checks if dg.AssetCheckKey(key, str(c.check_name)) in selected_checks]
        if key in context.selected_asset_keys and metadata["batches"]:
            yield dg.MaterializeResult(asset_key=key, metadata=metadata, check_results=checks)
        else:
            # Nothing read: the asset's latest materialization keeps saying what the job last
            # did; this run's lag and offsets are an observation (Dagster skips the steps
            # downstream of the asset in this run: nothing changed for them).
            if key in context.selected_asset_keys:
                yield dg.AssetObservation(asset_key=key, metadata=metadata)
            yield from checks
        for topic in job.topic_assets():
            # Materialized even by a run that read nothing, so that a job downstream, which
            # may have new records on its other sources, still runs in the same run.
            if topic_key(topic) in context.selected_asset_keys:
                yield dg.MaterializeResult(asset_key=topic_key(topic), metadata={
                    "writer": job.app_id,
                    "processing.guarantee": metadata["processing.guarantee"],
                })  # fmt: skip

    return _streaming


def run_until_caught_up(
    context: Any, job: StreamingJobSpec, resource: StreamplatformResource, max_dlq_ratio: float
) -> tuple[dict[str, Any], list[dg.AssetCheckResult]]:
    """Run ``job`` until caught up: its metadata and check results."""
    settings = resource.job_settings(job)
    spark = resource.spark_session
    started = time.monotonic()
    streaming = StreamingJob(job.load_topology(), settings, spark=spark,
                             delta_sinks=job.delta_sinks,
                             delta_state_tables=job.delta_state_tables)  # fmt: skip
    results: list[BatchResult] = []
    try:
        while (result := streaming.run_batch()) is not None:
            results.append(result)
            context.log.info(
                f"{job.app_id} batch {result.batch_id}: {result.records_in} in, "
                f"{result.records_out} out, {result.duplicates_dropped} duplicates dropped, "
                f"{result.dlq_records} to the DLQ, lag {result.lag}"
            )
    finally:
        streaming.close()
    seconds = time.monotonic() - started
    app_root = resource.app_root(job)
    last = CommitLog(f"{app_root}/_commits", job.app_id).last()
    consumed = {} if last is None else dict(last.consumed)
    lag = lag_by_partition(resource.end_offsets, job.source_topics(), consumed)
    metadata = (
        run_metadata(results, seconds, consumed, lag)
        | {
            "application_id": job.app_id,
            "processing.guarantee": streaming.config["processing.guarantee"],
            "committed_batch_id": -1 if last is None else last.batch_id,
            "commit_log": dg.MetadataValue.path(f"{app_root}/_commits"),
        }
        | state_table_rows(app_root, job.delta_state_tables)
    )
    records_in = int(metadata["rows_in"])
    ratio = dlq_ratio(records_in, int(metadata["dlq_records"]))
    batches, problems = offset_log_problems(spark, app_root)
    key = dg.AssetKey(job.name)
    checks = [
        dg.AssetCheckResult(asset_key=key, check_name="caught_up", passed=sum(lag.values()) == 0,
                            severity=dg.AssetCheckSeverity.WARN,
                            metadata={"lag": sum(lag.values())}),
        dg.AssetCheckResult(asset_key=key, check_name="dlq_ratio", passed=ratio <= max_dlq_ratio,
                            severity=dg.AssetCheckSeverity.WARN,
                            metadata={"ratio": ratio, "max_ratio": max_dlq_ratio}),
        dg.AssetCheckResult(asset_key=key, check_name="offsets_contiguous", passed=not problems,
                            metadata={"batches": batches,
                                      "problems": dg.MetadataValue.json(problems[:20])}),
    ]  # fmt: skip
    return metadata, checks


def state_table_rows(app_root: str, topics: Sequence[str]) -> dict[str, int]:
    """The rows (keys, or keys and windows) of each state table: ``<topic>_state_rows``."""
    rows = {}
    for topic in topics:
        table = delta_direct.table_or_none(state_table_path(app_root, topic))
        count = 0 if table is None else table.to_pyarrow_dataset().count_rows()
        rows[f"{topic}{STATE_SUFFIX}_rows"] = count
    return rows


def run_metadata(
    results: Sequence[BatchResult],
    seconds: float,
    consumed: Mapping[tuple[str, int], int],
    lag: Mapping[str, int],
) -> dict[str, Any]:
    """What a run did, as Dagster metadata (numbers plot over time in the UI)."""
    rows_in = sum(r.records_in for r in results)
    metrics: dict[str, int] = {}
    for result in results:
        add_metrics(metrics, result.metrics)
    batch_ids = [r.batch_id for r in results]
    stream_time = metrics.get("stream_time_max")
    return {
        "rows_in": rows_in,
        "rows_out": sum(r.records_out for r in results),
        "duplicates_dropped": sum(r.duplicates_dropped for r in results),
        # Records older than stream time - the dedup interval: forwarded, no window (KIP-655).
        "late_records": metrics.get("dedup_late", 0),
        # Times a deduplication's ids of the current commit outgrew its memory budget and
        # went to the store's transaction (statestore.cache.max.bytes; docs/memory.md).
        "dedup_spills": metrics.get("dedup_spills", 0),
        "join_misses": metrics.get("join_misses", 0),
        # Records aggregations dropped (late for their window, a None key or value), as Kafka
        # Streams' dropped-records metric.
        "dropped_records": metrics.get("dropped_records", 0),
        "dlq_records": sum(r.dlq_records for r in results),
        "restored_records": sum(r.restored_records for r in results),
        # Task batches that found their task kept open since its last one (in a Python
        # worker, or in the driver), and task batches run in the driver (small batches on a
        # local master: platform.driver.tasks.max.records).
        "tasks_reused": metrics.get("tasks_reused", 0),
        "tasks_in_driver": metrics.get("tasks_in_driver", 0),
        "replayed_batches": sum(r.replayed for r in results),
        # How the batches ran (runtime/paths/, docs/architecture.md): batches per path.
        "execution_paths": dg.MetadataValue.json(
            dict(sorted(Counter(r.path for r in results).items()))
        ),
        # Offsets that held no committed record (transaction markers, aborted or compacted
        # records), and offsets gone from Kafka before they were read (retention).
        "offset_gaps": metrics.get("offset_gaps", 0),
        "offsets_skipped": metrics.get("offsets_skipped", 0),
        "batches": len(results),
        "batch_ids": dg.MetadataValue.json(batch_ids),
        "first_batch_id": batch_ids[0] if batch_ids else -1,
        "last_batch_id": batch_ids[-1] if batch_ids else -1,
        "duration_s": round(seconds, 3),
        "records_per_second": round(rows_in / seconds, 1) if seconds > 0 else 0.0,
        # Kafka Streams' stream time: the largest event time the run's tasks have read, which
        # dedup intervals and versioned-store retention count back from.
        "event_time_watermark": "none read"
        if stream_time is None
        else datetime.fromtimestamp(stream_time / 1000, UTC).isoformat(timespec="milliseconds"),
        "event_time_watermark_ms": -1 if stream_time is None else stream_time,
        "lag": sum(lag.values()),
        "lag_by_partition": dg.MetadataValue.json(dict(lag)),
        "consumed_offsets": dg.MetadataValue.json(
            {f"{t}/{p}": offset for (t, p), offset in sorted(consumed.items())}
        ),
        "runtime_metrics": dg.MetadataValue.json(metrics),
    }


# The versioned snapshot asset -------------------------------------------------------------


def snapshot_asset_name(job: StreamingJobSpec, store: str) -> str:
    """The versioned snapshot asset of ``store``: ``<job name>_<store>_versions``."""
    return f"{job.name}_{re.sub(r'[^A-Za-z0-9_]', '_', store)}_versions"


def snapshot_path(delta_root: str, job: StreamingJobSpec, store: str) -> str:
    """Where the snapshot asset writes ``store``'s versions: a Delta table."""
    return f"{delta_root}/{job.app_id}/_snapshots/{store}"


def snapshot_asset(job: StreamingJobSpec, store: str) -> dg.AssetsDefinition:
    join = job.as_of_join(store)
    late = (
        f" Reports the versions that arrived after the join into `{join.sink}` had passed "
        "their start (late versions) and the UTC days they make stale"
        + (f", which `{join.backfill_job}` recomputes." if join.backfill_job else ".")
        if join is not None
        else ""
    )

    @dg.asset(
        name=snapshot_asset_name(job, store),
        deps=[dg.AssetKey(job.name)],
        group_name=job.group_name,
        pool=job_pool(job.app_id),
        kinds={"spark", "delta"},
        description=f"The versioned store `{store}` of `{job.app_id}` (KIP-889): every version "
        "(key, value, valid_from, valid_to) as a Delta table, rewritten from the job's "
        f"versions log as of its latest commit.{late}",
    )
    def _snapshot(
        context: dg.AssetExecutionContext, streamplatform: StreamplatformResource
    ) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata=snapshot(context, job, store, streamplatform))

    return _snapshot


def snapshot(
    context: Any, job: StreamingJobSpec, store: str, resource: StreamplatformResource
) -> dict[str, Any]:
    """Write the snapshot of ``store`` (unless its versions log is unchanged since the previous
    materialization) and report late versions since the previous one; its metadata."""
    from pyspark.sql import functions as F

    from streamplatform.dagster.lateness import find_late_versions
    from streamplatform.versioned_snapshot import read_versioned_snapshot, versions_table_version

    spark = resource.spark_session
    app_root = resource.app_root(job)
    versions_path, path = (
        f"{app_root}/_versions",
        snapshot_path(resource.delta_root_path(), job, store),
    )
    # The previous materialization counts only if it read these tables: one on another Delta
    # root or application id says nothing about what was reported here.
    previous = _latest_metadata(context)
    if previous.get("versions_log") != versions_path:
        previous = {}
    log_version = versions_table_version(spark, versions_path)
    versions, keys = int(previous.get("versions", 0)), int(previous.get("keys", 0))
    unchanged = (
        log_version == previous.get("versions_log_version")
        and versions_table_version(spark, path) is not None
    )
    if log_version is not None and not unchanged:
        rows = read_versioned_snapshot(spark, versions_path, store, log_version).select(
            F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"),
            "valid_from", "valid_to",
        )  # fmt: skip
        rows.write.format("delta").mode("overwrite").save(path)
        counts = spark.read.format("delta").load(path).agg(
            F.count("*").alias("versions"), F.countDistinct("key").alias("keys")
        ).first()  # fmt: skip
        versions, keys = int(counts.versions), int(counts.keys)
    metadata: dict[str, Any] = {
        "versions": versions,
        "keys": keys,
        "versions_log": dg.MetadataValue.path(versions_path),
        "versions_log_version": -1 if log_version is None else log_version,
        "table": dg.MetadataValue.path(path),
        "table_version": versions_table_version(spark, path) or 0,
        "processing.guarantee": job.processing_guarantee,
    }
    join = job.as_of_join(store)
    if join is None:
        return metadata
    since = int(previous.get("last_reported_batch_id", -1))
    last = CommitLog(f"{app_root}/_commits", job.app_id).last()
    late: list[Any] = []
    days: list[str] = []
    if last is not None and last.batch_id > since:
        late, days = find_late_versions(spark, versions_path, f"{app_root}/{join.sink}", store,
                                        since)  # fmt: skip
    if late:
        context.log.warning(
            f"{len(late)} late version(s) of {store} make {len(days)} day(s) of "
            f"{join.sink} stale: {', '.join(days)}"
        )
    return metadata | {
        "late_versions": len(late),
        "late_days": dg.MetadataValue.json(days),
        "late_version_list": dg.MetadataValue.json(
            [
                {
                    "key": v.key,
                    "valid_from": v.valid_from,
                    "batch_id": v.batch_id,
                    "frontier": v.frontier,
                    "tombstone": v.tombstone,
                }
                for v in late[:100]
            ]
        ),  # fmt: skip
        "reported_since_batch_id": since,
        "last_reported_batch_id": since if last is None else max(since, last.batch_id),
    }


def _latest_metadata(context: Any) -> dict[str, Any]:
    """The metadata values of this asset's latest materialization before this run."""
    event = context.instance.get_latest_materialization_event(context.asset_key)
    materialization = None if event is None else event.asset_materialization
    if materialization is None:
        return {}
    return {name: value.value for name, value in materialization.metadata.items()}


# The late-version backfill sensor ---------------------------------------------------------


def late_version_backfill_sensor(job: StreamingJobSpec, join: AsOfJoin) -> dg.SensorDefinition:
    """Launches ``join.backfill_job`` for each UTC day that late versions made stale.

    It reads the snapshot asset's materializations after its cursor (their storage ids) and
    requests one run per day named in their ``late_days``, with the run key
    ``late-versions:<storage id>:<day>``: re-evaluating the same materialization yields the same
    run keys, which Dagster launches once. Days that are not partitions of the job (before its
    start, after its end) are skipped and named in the log."""
    if join.backfill_job is None:
        raise ValueError(f"{job.name}: the as-of join over {join.store} has no backfill_job")
    snapshot_key = dg.AssetKey(snapshot_asset_name(job, join.store))
    target = join.backfill_job

    @dg.sensor(
        name=f"{snapshot_key.path[-1]}_late_backfill",
        job_name=target,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Launches {target} for every day of {join.sink} that late versions of "
        f"{join.store} made stale (reported by {snapshot_key.to_user_string()}).",
    )
    def _backfill(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        after = int(context.cursor) if context.cursor else None
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=snapshot_key, after_storage_id=after),
            limit=100, ascending=True,
        ).records  # fmt: skip
        if not records:
            return dg.SensorResult(skip_reason=f"no new {snapshot_key.to_user_string()}")
        partitions = _partitions_of(context, target)
        latest: dict[str, int] = {}  # day -> newest materialization naming it in this tick
        outside: set[str] = set()
        for record in records:
            materialization = record.asset_materialization
            metadata = {} if materialization is None else materialization.metadata
            days: Any = metadata["late_days"].value if "late_days" in metadata else []
            for day in days:
                if partitions is None or partitions.has_partition_key(day):
                    latest[day] = record.storage_id
                else:
                    outside.add(day)
        if outside:
            context.log.info(f"late versions make days stale that are not partitions of "
                             f"{target}: {sorted(outside)}")  # fmt: skip
        requests = [
            dg.RunRequest(
                run_key=f"late-versions:{storage_id}:{day}",
                partition_key=day,
                tags={
                    BACKFILL_TAG: snapshot_key.to_user_string(),
                    "streamplatform/snapshot_storage_id": str(storage_id),
                },
            )  # fmt: skip
            for day, storage_id in sorted(latest.items())
        ]
        cursor = str(records[-1].storage_id)
        if not requests:
            return dg.SensorResult(cursor=cursor, skip_reason="no day needs recomputing")
        context.log.info(f"backfilling {[r.partition_key for r in requests]}")
        return dg.SensorResult(run_requests=requests, cursor=cursor)

    return _backfill


def _partitions_of(context: dg.SensorEvaluationContext, job_name: str) -> Any:
    """The partitions of the job the sensor launches, when the sensor knows its definitions."""
    repository = context.repository_def
    if repository is None or not repository.has_job(job_name):
        return None
    return repository.get_job(job_name).partitions_def


# The DLQ replay ---------------------------------------------------------------------------


class DlqReplayConfig(dg.Config):
    max_attempts: int = Field(
        default=3, description="Replays a record may have before it stays parked."
    )
    retry_parked: bool = Field(
        default=False,
        description="Also retry parked records (after a fix), whatever their attempts.",
    )


def _observe(
    context: dg.OpExecutionContext, job: StreamingJobSpec, prefix: str, metadata: Mapping[str, Any]
) -> None:
    """``metadata`` of an op that works on ``job``'s tables, on the job's asset (prefixed)."""
    context.log_event(dg.AssetObservation(
        asset_key=dg.AssetKey(job.name), metadata={f"{prefix}{k}": v for k, v in metadata.items()}
    ))  # fmt: skip


def dlq_replay_job(job: StreamingJobSpec) -> dg.JobDefinition:
    @dg.op(
        name=f"replay_{job.name}_dead_letters",
        pool=job_pool(job.app_id),
        description=f"Replay {job.name}'s DLQ records through its current topology "
        "(re-publish what passes, park what fails again), each exactly once.",
    )
    def replay(
        context: dg.OpExecutionContext,
        config: DlqReplayConfig,
        streamplatform: StreamplatformResource,
    ) -> None:
        replayer = DlqReplayer(
            job.load_topology(), streamplatform.job_settings(job),
            streamplatform.spark_session, max_attempts=config.max_attempts,
        )  # fmt: skip
        report = replayer.replay(retry_parked=config.retry_parked)
        context.log.info(
            f"{job.app_id}: {report.candidates} DLQ records to replay, {report.republished} "
            f"re-published, {report.parked} parked (replay batch {report.replay_batch})"
        )
        metadata: dict[str, Any] = {
            "candidates": report.candidates,
            "republished": report.republished,
            "parked": report.parked,
            "exhausted": report.exhausted,
            "replay_batch": -1 if report.replay_batch is None else report.replay_batch,
            "recovered_batch": -1 if report.recovered_batch is None else report.recovered_batch,
            "parked_by_exception": dg.MetadataValue.json(report.parked_by_exception),
        }
        _observe(context, job, "dlq_replay_", metadata)

    @dg.job(
        name=f"{job.name}_dlq_replay",
        executor_def=dg.in_process_executor,
        description=f"Replay {job.name}'s dead-lettered records through its current topology.",
        tags={"streamplatform/kind": "dlq-replay", "streamplatform/application-id": job.app_id},
    )
    def _replay_job() -> None:
        replay()

    return _replay_job


# Maintenance ------------------------------------------------------------------------------


class MaintenanceConfig(dg.Config):
    min_changelog_files: int = Field(
        default=10, description="Snapshot a task's changelog once it has this many files."
    )
    retention_hours: float = Field(
        default=168.0, description="Vacuum only files removed longer ago than this (>= 1)."
    )


def maintenance_job(job: StreamingJobSpec) -> dg.JobDefinition:
    @dg.op(
        name=f"maintain_{job.name}_tables",
        pool=job_pool(job.app_id),
        description=f"Snapshot {job.name}'s changelog per task, compact, checkpoint and vacuum "
        "its runtime tables, keeping every replay and restore possible.",
    )
    def maintain_tables(
        context: dg.OpExecutionContext,
        config: MaintenanceConfig,
        streamplatform: StreamplatformResource,
    ) -> None:
        report = maintain(
            streamplatform.app_root(job), job.app_id,
            min_changelog_files=config.min_changelog_files,
            retention_hours=config.retention_hours,
            settings=streamplatform.job_settings(job),
        )  # fmt: skip
        metadata = report.metadata()
        context.log.info(f"{job.app_id} maintenance: {metadata}")
        _observe(context, job, "maintenance_", metadata)

    @dg.job(
        name=f"{job.name}_maintenance",
        executor_def=dg.in_process_executor,
        description=f"Maintain {job.name}'s runtime tables.",
        tags={"streamplatform/kind": "maintenance", "streamplatform/application-id": job.app_id},
    )
    def _maintenance_job() -> None:
        maintain_tables()

    return _maintenance_job


# The lag sensor ---------------------------------------------------------------------------


def lag_sensor(
    job: StreamingJobSpec, asset: dg.AssetsDefinition, threshold: int
) -> dg.SensorDefinition:
    key = dg.AssetKey(job.name)

    @dg.sensor(
        name=f"{job.name}_lag",
        target=[asset],
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Launches a run of {job.name} when its lag passes {threshold} records.",
    )
    def _lag(context: dg.SensorEvaluationContext, streamplatform: StreamplatformResource):
        records = context.instance.fetch_materializations(key, limit=1).records
        record = records[0] if records else None
        materialization = None if record is None else record.asset_materialization
        consumed: dict[tuple[str, int], int] = {}
        if materialization is not None and "consumed_offsets" in materialization.metadata:
            offsets: Any = materialization.metadata["consumed_offsets"].value
            for name, offset in dict(offsets).items():
                topic, partition = name.rsplit("/", 1)
                consumed[(topic, int(partition))] = int(offset)
        try:
            lag = sum(lag_by_partition(streamplatform.end_offsets, job.source_topics(),
                                       consumed).values())  # fmt: skip
        except (LookupError, ConnectionError) as error:
            return dg.SkipReason(f"cannot measure the lag of {job.name}: {error}")
        if lag <= threshold:
            return dg.SkipReason(f"{job.name}: lag {lag} within {threshold} records")
        storage_id = 0 if record is None else int(record.storage_id)
        return dg.RunRequest(
            run_key=f"catch-up:{job.name}:{storage_id}", asset_selection=list(asset.keys),
            tags={"streamplatform/catch-up-lag": str(lag)},
        )  # fmt: skip

    return _lag
