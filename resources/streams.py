"""StreamsResource: the settings the two streaming jobs share, in one place.

Application ids name the jobs' Delta tables and state directories, so two deployments sharing a
Delta root need different ones; they name the jobs' Dagster pools too (:func:`job_pool`).
``STREAMPLATFORM_MAX_RECORDS_PER_BATCH`` and ``STREAMPLATFORM_PROCESSING_GUARANTEE`` override the
defaults from the environment.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg
from pydantic import Field

POOL_PREFIX = "streamplatform/"


def job_pool(application_id: str) -> str:
    """The Dagster pool of the streaming job ``application_id``: ``streamplatform/<id>``.

    Every op that runs the job or writes its runtime tables (its asset, its DLQ replay) is in
    this pool, and the instance limits each pool to one run at a time (``dagster.yaml``'s
    ``concurrency.pools``): a second run of the same job waits in the queue instead of driving
    the same application id side by side with the first.
    """
    return f"{POOL_PREFIX}{application_id}"


class StreamsResource(dg.ConfigurableResource):
    """Application ids, guarantee, batch size and error handlers of the streaming jobs."""

    dedup_application_id: str = Field(
        default="transactions-dedup", description="application.id of the deduplication job."
    )
    enrichment_application_id: str = Field(
        default="transactions-enrichment", description="application.id of the FX join job."
    )
    processing_guarantee: str = Field(
        default="exactly_once_v2", description="exactly_once_v2 | at_least_once"
    )
    max_records_per_batch: int = Field(
        default=20_000, description="platform.max.records.per.batch: records per task per batch."
    )
    deserialization_handler: str = Field(
        default="log_and_continue",
        description="default.deserialization.exception.handler (poison records -> DLQ).",
    )
    processing_handler: str = Field(
        default="log_and_continue", description="processing.exception.handler"
    )

    def job_settings(
        self,
        application_id: str,
        dlq_topic: str,
        *,
        kafka: dict[str, Any],
        delta_root: str,
        state_dir: str,
    ) -> dict[str, Any]:
        """A StreamsConfig's settings for one job (Kafka Streams' names)."""
        return kafka | {
            "application.id": application_id,
            "processing.guarantee": self.processing_guarantee,
            "state.dir": state_dir,
            "platform.delta.root": delta_root,
            "platform.max.records.per.batch": self.max_records_per_batch,
            "errors.dead.letter.queue.topic.name": dlq_topic,
            "default.deserialization.exception.handler": self.deserialization_handler,
            "processing.exception.handler": self.processing_handler,
        }


def streams_from_env() -> StreamsResource:
    overrides: dict[str, Any] = {}
    if os.environ.get("STREAMPLATFORM_MAX_RECORDS_PER_BATCH"):
        overrides["max_records_per_batch"] = int(os.environ["STREAMPLATFORM_MAX_RECORDS_PER_BATCH"])
    if os.environ.get("STREAMPLATFORM_PROCESSING_GUARANTEE"):
        overrides["processing_guarantee"] = os.environ["STREAMPLATFORM_PROCESSING_GUARANTEE"]
    return StreamsResource(**overrides)
