"""The two streaming jobs as the assets run them: settings, a run until caught up, its numbers.

- :func:`dedup_job`: ``pipelines.deduplication_topology`` — ``transactions`` ->
  ``transactions-deduplicated`` (Kafka), poison records -> ``transactions-dlq`` and its mirror;
- :func:`enrichment_job`: ``enrichment_topology`` — the deduplicated transactions joined with
  the FX rate valid at their time -> the Delta sink ``transactions-enriched``; the rates' versioned
  store writes every version to ``_versions`` (the source of the versioned snapshot).

Topic names are read from ``pipelines`` when a job is built, not at import.
Every helper here is shared by assets, checks and jobs; Dagster-free where it can be.

``DEDUP_POOL`` and ``ENRICHMENT_POOL`` are the jobs' Dagster pools (:func:`resources.job_pool`)
for the application ids of the code location's own ``streams`` resource: a pool is part of an
asset's or op's definition, so it is fixed when the code location loads, like the resources.
Definitions built on other resources (:func:`definitions.build_definitions`: `make demo`'s
application ids, the tests') keep these names: a shared pool can only make runs wait longer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

import pipelines
from resources import (
    DeltaRootResource,
    KafkaResource,
    StateDirResource,
    StreamsResource,
    all_resources,
    job_pool,
)
from streamplatform.dagster.checks import lag_by_partition as partition_lag
from streamplatform.dsl.topology import Topology
from streamplatform.runtime.logs import CommitLog
from streamplatform.runtime.microbatch import BatchResult, StreamingJob

LOCATION_STREAMS: StreamsResource = all_resources["streams"]
DEDUP_POOL = job_pool(LOCATION_STREAMS.dedup_application_id)
ENRICHMENT_POOL = job_pool(LOCATION_STREAMS.enrichment_application_id)


@dataclass(frozen=True)
class JobSpec:
    """One streaming job: what to run and where its tables live."""

    application_id: str
    topology: Topology
    settings: dict[str, Any]
    delta_root: str
    delta_sinks: tuple[str, ...] = field(default=())

    @property
    def app_root(self) -> str:
        return f"{self.delta_root}/{self.application_id}"

    def table(self, name: str) -> str:
        """A table of the job: ``_offsets``, ``_commits``, ``_dlq``, ``_versions``, a sink."""
        return f"{self.app_root}/{name}"

    @property
    def sources(self) -> list[str]:
        return self.topology.source_topics(self.application_id)

    @property
    def versioned_store(self) -> str:
        """The job's versioned store (the enrichment's FX rates)."""
        names = [n for n, spec in self.topology.stores.items() if spec.kind == "versioned"]
        if len(names) != 1:
            raise LookupError(f"{self.application_id}: expected one versioned store, got {names}")
        return names[0]


def _spec(
    app: str,
    topology: Topology,
    dlq: str,
    streams: StreamsResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    delta_sinks: Sequence[str] = (),
) -> JobSpec:
    settings = streams.job_settings(
        app, dlq, kafka=kafka.settings(), delta_root=delta_root.root(),
        state_dir=state_dir.directory(),
    )  # fmt: skip
    return JobSpec(app, topology, settings, delta_root.root(), tuple(delta_sinks))


def dedup_job(
    streams: StreamsResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
) -> JobSpec:
    return _spec(streams.dedup_application_id, pipelines.deduplication_topology(),
                 pipelines.TRANSACTIONS_DLQ, streams, kafka, delta_root, state_dir)  # fmt: skip


def enrichment_job(
    streams: StreamsResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
) -> JobSpec:
    return _spec(streams.enrichment_application_id, pipelines.enrichment_topology(),
                 pipelines.ENRICHMENT_DLQ, streams, kafka, delta_root, state_dir,
                 delta_sinks=[pipelines.ENRICHED])  # fmt: skip


def run_until_caught_up(spec: JobSpec, spark: Any, log: Any = None) -> list[BatchResult]:
    """Run micro-batches until every source partition is read to its end."""
    job = StreamingJob(spec.topology, spec.settings, spark=spark, delta_sinks=spec.delta_sinks)
    try:
        results = []
        while (result := job.run_batch()) is not None:
            results.append(result)
            if log is not None:
                log.info(
                    f"{spec.application_id} batch {result.batch_id}: {result.records_in} in, "
                    f"{result.records_out} out, {result.duplicates_dropped} duplicates dropped, "
                    f"{result.dlq_records} to the DLQ, lag {result.lag}"
                )
        return results
    finally:
        close = getattr(job, "close", None)
        if close is not None:
            close()


def committed(spec: JobSpec) -> tuple[int | None, dict[tuple[str, int], int]]:
    """The last committed batch id and the offsets consumed up to, from the commit log."""
    last = CommitLog(spec.table("_commits"), spec.application_id).last()
    return (None, {}) if last is None else (last.batch_id, dict(last.consumed))


def lag_by_partition(
    kafka: KafkaResource, topics: Sequence[str], consumed: Mapping[tuple[str, int], int]
) -> dict[str, int]:
    """``{"topic/partition": records not consumed yet}`` from the brokers' end offsets."""
    return partition_lag(kafka.end_offsets, topics, consumed)


def delta_version(spark: Any, path: str) -> int | None:
    """The table's current Delta version, or None when there is no table."""
    from streamplatform.versioned_snapshot import versions_table_version

    return versions_table_version(spark, path)


def run_metadata(
    spec: JobSpec,
    results: Sequence[BatchResult],
    consumed: Mapping[tuple[str, int], int],
    lag: Mapping[str, int],
) -> dict[str, Any]:
    """What a run of a streaming job did, as Dagster metadata (numbers plot over time)."""
    batch_ids = [r.batch_id for r in results]
    return {
        "application_id": spec.application_id,
        "rows_in": sum(r.records_in for r in results),
        "rows_out": sum(r.records_out for r in results),
        "duplicates_dropped": sum(r.duplicates_dropped for r in results),
        "dlq_records": sum(r.dlq_records for r in results),
        "restored_records": sum(r.restored_records for r in results),
        "replayed_batches": sum(r.replayed for r in results),
        # Offsets that held no committed record (transaction markers, aborted or compacted
        # records), and offsets gone from Kafka before they were read (retention).
        "offset_gaps": sum(r.metrics.get("offset_gaps", 0) for r in results),
        "offsets_skipped": sum(r.metrics.get("offsets_skipped", 0) for r in results),
        "batches": len(results),
        "batch_ids": dg.MetadataValue.json(batch_ids),
        "first_batch_id": batch_ids[0] if batch_ids else -1,
        "last_batch_id": batch_ids[-1] if batch_ids else -1,
        "duration_ms": sum(r.duration_ms for r in results),
        "lag": sum(lag.values()),
        "lag_by_partition": dg.MetadataValue.json(dict(lag)),
        "consumed_offsets": dg.MetadataValue.json(
            {f"{t}/{p}": offset for (t, p), offset in sorted(consumed.items())}
        ),
        "commit_log": dg.MetadataValue.path(spec.table("_commits")),
    }


def previous_metadata(context: dg.AssetExecutionContext, name: str, default: Any = None) -> Any:
    """A metadata value of this asset's latest materialization (before this run)."""
    event = context.instance.get_latest_materialization_event(context.asset_key)
    materialization = None if event is None else event.asset_materialization
    if materialization is None or name not in materialization.metadata:
        return default
    return materialization.metadata[name].value


def parse_offsets(value: Any) -> dict[tuple[str, int], int]:
    """``consumed_offsets`` metadata back to ``{(topic, partition): offset}``."""
    data = json.loads(value) if isinstance(value, str) else dict(value or {})
    parsed = {}
    for name, offset in data.items():
        topic, partition = name.rsplit("/", 1)
        parsed[(topic, int(partition))] = int(offset)
    return parsed
