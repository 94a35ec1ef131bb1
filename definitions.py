"""The example code location: the mission's two streaming jobs, declared with
``streamplatform.dagster``, and the example's own assets on top.

- ``transactions_deduplicated``: the dedup job (KIP-655) over ``transactions``, poison records
  to its DLQ topic; its output topic is an asset it materializes;
- ``transactions_enrichment``: the temporal join (KIP-889) of the deduplicated transactions with
  the FX rates' versioned store into its Delta sink; the store's snapshot asset
  ``transactions_enrichment_fx_rates_versions`` reports late rate versions, and its sensor
  launches ``enriched_backfill`` for each day they make stale;
- from the integration, for each: the asset checks, the DLQ replay job and its schedule (on), the
  lag sensor (off), a pool per application id;
- the example's own (``assets/``): ``transactions_enriched`` (daily), ``standby_placements``,
  the checks ``no_duplicates_within_interval`` and ``stream_equals_batch_join``.

Topic names, application ids, batch size and guarantee are configuration
(:class:`resources.MissionConfig`, from the environment by default); resources come from the
environment too (:func:`resources.build_resources`). Every job runs with the in-process
executor: a run is one process with one SparkSession. ``workspace.yaml`` points `dagster dev`
here; :func:`build_definitions` gives the same definitions on other configuration and resources
(`make demo`, the tests).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import dagster as dg

import pipelines
from assets import BACKFILL_JOB, enriched_definitions, no_duplicates_check, placements_asset
from resources import MissionConfig, build_resources
from streamplatform.dagster import AsOfJoin, StreamingJobSpec, pools, streaming_definitions

DEDUP = "transactions_deduplicated"
ENRICHMENT = "transactions_enrichment"


def mission_jobs(mission: MissionConfig) -> list[StreamingJobSpec]:
    """The two streaming jobs, declared once."""
    topics = mission.topics
    settings = {
        "processing.guarantee": mission.processing_guarantee,
        "platform.max.records.per.batch": mission.max_records_per_batch,
    }
    dedup = StreamingJobSpec(
        name=DEDUP,
        topology=functools.partial(pipelines.deduplication_topology, topics),
        application_id=mission.dedup_application_id,
        dlq_topic=topics.transactions_dlq,
        settings=settings,
    )
    enrichment = StreamingJobSpec(
        name=ENRICHMENT,
        topology=functools.partial(pipelines.enrichment_topology, topics),
        application_id=mission.enrichment_application_id,
        delta_sinks=[topics.enriched],
        dlq_topic=topics.enrichment_dlq,
        settings=settings,
        as_of_joins=[
            AsOfJoin(store=pipelines.RATES_STORE, sink=topics.enriched, backfill_job=BACKFILL_JOB)
        ],  # fmt: skip
    )
    return [dedup, enrichment]


def build_definitions(
    mission: MissionConfig | None = None, resources: Mapping[str, Any] | None = None
) -> dg.Definitions:
    """The code location on ``mission`` and ``resources`` (default: from the environment)."""
    mission = mission or MissionConfig.from_env()
    dedup, enrichment = jobs = mission_jobs(mission)
    streaming = streaming_definitions(
        jobs,
        lag_threshold=int(os.environ.get("STREAMPLATFORM_LAG_THRESHOLD", "1000")),
        max_dlq_ratio=float(os.environ.get("STREAMPLATFORM_DLQ_MAX_RATIO", "0.01")),
        dlq_replay_running=True,
    )
    example = dg.Definitions(
        assets=[placements_asset(jobs)],
        asset_checks=[no_duplicates_check(dedup, mission.topics)],
        resources=dict(build_resources() if resources is None else resources),
        executor=dg.in_process_executor,
    )
    return dg.Definitions.merge(
        streaming, enriched_definitions(enrichment, mission.topics), example
    )


defs = build_definitions()

__all__ = ["DEDUP", "ENRICHMENT", "build_definitions", "defs", "mission_jobs", "pools"]
