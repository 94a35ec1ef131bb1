"""The streaming assets: each materialization runs a streaming job until caught up.

- ``transactions_deduplicated``: the dedup job (KIP-655) over ``transactions``;
- ``fx_rate_versions``: the enrichment job, which owns the versioned FX-rate store (KIP-889) and
  joins the deduplicated transactions with it into its Delta sink; the asset is the store's
  versioned snapshot, written to ``<delta root>/tables/fx_rate_versions``, with the versions
  that arrived late (see ``lateness.py``) and the days they affect, which the backfill sensor
  reads. The join's daily output is the ``transactions_enriched`` asset.

Each is in its job's pool (``streamplatform/<application.id>``, limit 1): a second run of the
same job (a UI materialization during the lag sensor's catch-up run) waits in the queue until
the first one ends, instead of driving the same application id at the same time.
"""

from typing import Any

import dagster as dg

import pipelines
from assets.lateness import find_late_versions
from assets.streams import (
    DEDUP_POOL,
    ENRICHMENT_POOL,
    committed,
    dedup_job,
    delta_version,
    enrichment_job,
    lag_by_partition,
    previous_metadata,
    run_metadata,
    run_until_caught_up,
)
from assets.topics import fx_rates_topic, transactions_topic
from resources import (
    DeltaRootResource,
    KafkaResource,
    SparkResource,
    StateDirResource,
    StreamsResource,
)
from streamplatform.versioned_snapshot import read_versioned_snapshot

SNAPSHOT_TABLE = ("tables", "fx_rate_versions")


@dg.asset(
    deps=[transactions_topic],
    group_name="streaming",
    pool=DEDUP_POOL,
    kinds={"spark", "kafka", "delta"},
    description=(
        "Transactions deduplicated by (currency, id) within 10 minutes (KIP-655), written to "
        "the Kafka topic `transactions-deduplicated`; poison records go to the DLQ topic and "
        "its Delta mirror. Runs the dedup job's micro-batches until caught up. Guarantee "
        "(processing.guarantee=exactly_once_v2, the default): a read_committed reader of "
        "either topic sees each record once, whatever crashes or retries happen (one Kafka "
        "transaction per task and batch, committing the task's offsets to the consumer group "
        "`transactions-dedup`); the DLQ mirror holds each committed DLQ record once. Under "
        "at_least_once the topics may hold repeats (header `__streamplatform.source`)."
    ),
)
def transactions_deduplicated(
    context: dg.AssetExecutionContext,
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dg.MaterializeResult:
    spec = dedup_job(streams, kafka, delta_root, state_dir)
    session = spark.spark_session
    results = run_until_caught_up(spec, session, context.log)
    last_batch, consumed = committed(spec)
    lag = lag_by_partition(kafka, spec.sources, consumed)
    metadata = run_metadata(spec, results, consumed, lag) | {
        "output_topic": pipelines.DEDUPLICATED,
        "dlq_topic": pipelines.TRANSACTIONS_DLQ,
        "dlq_mirror": dg.MetadataValue.path(spec.table("_dlq")),
        "committed_batch_id": -1 if last_batch is None else last_batch,
        "commit_log_version": delta_version(session, spec.table("_commits")) or 0,
    }
    return dg.MaterializeResult(metadata=metadata)


def write_snapshot(
    spark: Any,
    versions_path: str,
    store: str,
    log_version: int | None,
    snapshot_path: str,
    previous: tuple[int, int, int],
) -> tuple[int, int]:
    """Rewrite the snapshot table from the versions log at ``log_version``; returns its
    ``(versions, keys)``. Unchanged log since the previous materialization: nothing to do."""
    from pyspark.sql import functions as F

    if log_version is None:
        return 0, 0
    previous_log, previous_versions, previous_keys = previous
    if log_version == previous_log and delta_version(spark, snapshot_path) is not None:
        return int(previous_versions), int(previous_keys)
    snapshot = read_versioned_snapshot(spark, versions_path, store, log_version).select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        "valid_from",
        "valid_to",
    )
    snapshot.write.format("delta").mode("overwrite").save(snapshot_path)
    counts = (
        spark.read.format("delta")
        .load(snapshot_path)
        .agg(F.count("*").alias("versions"), F.countDistinct("key").alias("keys"))
        .first()
    )
    return int(counts.versions), int(counts.keys)


@dg.asset(
    deps=[fx_rates_topic, transactions_deduplicated],
    group_name="streaming",
    pool=ENRICHMENT_POOL,
    kinds={"spark", "kafka", "delta"},
    description=(
        "The versioned snapshot of the FX rates (key, value, valid_from, valid_to) as the "
        "enrichment job's versioned store holds them (KIP-889). Materializing runs the "
        "enrichment job until caught up: it keeps the store and joins every deduplicated "
        "transaction with the rate valid at its time into its Delta sink. Reports the versions "
        "that arrived after the join had passed their start (late corrections) and the days "
        "they affect, for the backfill sensor. Guarantee (exactly_once_v2): it reads "
        "`transactions-deduplicated` read_committed, and each read record's join row, store "
        "writes and versions are in the Delta tables once, whatever crashes or retries happen."
    ),
)
def fx_rate_versions(
    context: dg.AssetExecutionContext,
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dg.MaterializeResult:
    spec = enrichment_job(streams, kafka, delta_root, state_dir)
    session = spark.spark_session
    results = run_until_caught_up(spec, session, context.log)
    last_batch, consumed = committed(spec)
    lag = lag_by_partition(kafka, spec.sources, consumed)
    versions_path, sink_path = spec.table("_versions"), spec.table(pipelines.ENRICHED)
    # The previous materialization counts only if it ran this job on these tables: one of
    # another application id or Delta root (`make demo` shares the instance with `make ui`)
    # says nothing about what this job has reported.
    ours = previous_metadata(context, "versions_log") == versions_path

    def previous(name: str, default: int) -> int:
        return int(previous_metadata(context, name, default)) if ours else default

    since = previous("last_reported_batch_id", -1)
    store = spec.versioned_store
    late, days = [], []
    if last_batch is not None and last_batch > since:
        late, days = find_late_versions(session, versions_path, sink_path, store, since)
    snapshot_path = delta_root.table(*SNAPSHOT_TABLE)
    log_version = delta_version(session, versions_path)
    versions, keys = write_snapshot(
        session, versions_path, store, log_version, snapshot_path,
        previous=(previous("versions_log_version", -1), previous("versions", 0),
                  previous("keys", 0)),
    )  # fmt: skip
    if late:
        context.log.warning(
            f"{len(late)} late FX-rate version(s) affect {len(days)} day(s) of joined "
            f"transactions: {', '.join(days)}"
        )
    metadata = run_metadata(spec, results, consumed, lag) | {
        "versions": versions,
        "keys": keys,
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
        "last_reported_batch_id": -1 if last_batch is None else last_batch,
        "versions_log_version": -1 if log_version is None else log_version,
        "versions_log": dg.MetadataValue.path(versions_path),
        "snapshot_table": dg.MetadataValue.path(snapshot_path),
        "snapshot_version": delta_version(session, snapshot_path) or 0,
        "enriched_stream_sink": dg.MetadataValue.path(sink_path),
    }
    return dg.MaterializeResult(metadata=metadata)
