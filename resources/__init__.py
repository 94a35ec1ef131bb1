"""The example's configuration and resources, chosen from the environment, never from edits.

- :class:`MissionConfig`: what the code location declares — topic names (``Topics``, optionally
  all behind ``STREAMPLATFORM_TOPIC_PREFIX``), the two jobs' application ids, their batch size
  and guarantee;
- :func:`build_resources`: the library's :class:`StreamplatformResource` (Kafka, Spark, Delta
  root, state dir) under ``streamplatform`` and the example's standby placement under
  ``placement``. With nothing set everything is local (the broker of `streamplatform broker
  start`, Spark ``local[*]``, Delta and state under ``.data/``); ``KAFKA_*``, ``SPARK_MASTER``,
  ``STREAMPLATFORM_DELTA_ROOT``, ``STREAMPLATFORM_STATE_DIR`` and
  ``STREAMPLATFORM_INSTANCES_FILE`` point them at a real cluster.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import Topics
from resources.placement import StandbyPlacementResource, placement_from_env
from streamplatform.dagster import KafkaConnection, StreamplatformResource, platform_pyspark

# Kafka client settings from the environment, beside KAFKA_BOOTSTRAP_SERVERS.
KAFKA_ENVIRONMENT = {
    "KAFKA_SECURITY_PROTOCOL": "security.protocol",
    "KAFKA_SASL_MECHANISM": "sasl.mechanism",
    "KAFKA_SASL_USERNAME": "sasl.username",
    "KAFKA_SASL_PASSWORD": "sasl.password",
    "KAFKA_SSL_CA_LOCATION": "ssl.ca.location",
}


@dataclass(frozen=True)
class MissionConfig:
    """The example's two jobs as configuration: topics, application ids, batch size, guarantee."""

    topics: Topics = field(default_factory=Topics)
    dedup_application_id: str = "transactions-dedup"
    enrichment_application_id: str = "transactions-enrichment"
    max_records_per_batch: int = 20_000
    processing_guarantee: str = "exactly_once_v2"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> MissionConfig:
        """``STREAMPLATFORM_TOPIC_PREFIX``, ``STREAMPLATFORM_DEDUP_APPLICATION_ID``,
        ``STREAMPLATFORM_ENRICHMENT_APPLICATION_ID``, ``STREAMPLATFORM_MAX_RECORDS_PER_BATCH``
        and ``STREAMPLATFORM_PROCESSING_GUARANTEE`` over the defaults."""
        default = cls()
        return cls(
            topics=Topics.prefixed(environ.get("STREAMPLATFORM_TOPIC_PREFIX", "")),
            dedup_application_id=environ.get(
                "STREAMPLATFORM_DEDUP_APPLICATION_ID", default.dedup_application_id
            ),
            enrichment_application_id=environ.get(
                "STREAMPLATFORM_ENRICHMENT_APPLICATION_ID", default.enrichment_application_id
            ),
            max_records_per_batch=int(
                environ.get("STREAMPLATFORM_MAX_RECORDS_PER_BATCH", default.max_records_per_batch)
            ),
            processing_guarantee=environ.get(
                "STREAMPLATFORM_PROCESSING_GUARANTEE", default.processing_guarantee
            ),
        )


def streamplatform_from_env(environ: Mapping[str, str] = os.environ) -> StreamplatformResource:
    """The library's resource with what the environment sets (empty fields: local defaults)."""
    return StreamplatformResource(
        kafka=KafkaConnection(
            bootstrap_servers=environ.get("KAFKA_BOOTSTRAP_SERVERS", ""),
            settings={
                name: environ[var] for var, name in KAFKA_ENVIRONMENT.items() if environ.get(var)
            },  # fmt: skip
        ),
        spark=platform_pyspark(environ.get("SPARK_MASTER", "")),
        delta_root=environ.get("STREAMPLATFORM_DELTA_ROOT", ""),
        state_dir=environ.get("STREAMPLATFORM_STATE_DIR", ""),
    )


def build_resources() -> dict[str, Any]:
    """The resource keys every asset, check, job and sensor of the code location uses."""
    return {"streamplatform": streamplatform_from_env(), "placement": placement_from_env()}


def local_resources(
    bootstrap_servers: str, *, data_dir: str | Path | None = None, spark_master: str = ""
) -> dict[str, Any]:
    """The same resource keys on one given broker with everything else local: Spark
    ``spark_master`` (default ``SPARK_MASTER`` or ``local[*]``), Delta, state and the placement
    files under ``data_dir`` (default: ``.data``). What `make demo` and the tests use."""
    root = None if data_dir is None else Path(data_dir)
    return {
        "streamplatform": StreamplatformResource(
            kafka=KafkaConnection(bootstrap_servers=bootstrap_servers),
            spark=platform_pyspark(spark_master),
            delta_root="" if root is None else str(root / "delta"),
            state_dir="" if root is None else str(root / "state"),
        ),
        "placement": StandbyPlacementResource(
            output_dir="" if root is None else str(root / "placement")
        ),
    }


__all__ = [
    "MissionConfig",
    "StandbyPlacementResource",
    "build_resources",
    "local_resources",
    "streamplatform_from_env",
]
