"""Dagster resources: Kafka, Spark, Delta root, state dir, the jobs' settings, standby placement.

:func:`build_resources` chooses them from the environment, never from edits: with nothing set
everything is local (the broker of `streamplatform broker start`, Spark ``local[*]``, Delta and
state under ``.data/``); ``KAFKA_*``, ``SPARK_MASTER``, ``STREAMPLATFORM_DELTA_ROOT``,
``STREAMPLATFORM_STATE_DIR``, ``STREAMPLATFORM_INSTANCES_FILE`` point them at a real cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resources.kafka import KafkaResource, kafka_from_env
from resources.placement import StandbyPlacementResource, placement_from_env
from resources.spark import SparkResource, spark_from_env
from resources.storage import (
    DeltaRootResource,
    StateDirResource,
    delta_root_from_env,
    state_dir_from_env,
)
from resources.streams import StreamsResource, job_pool, streams_from_env


def build_resources() -> dict[str, Any]:
    """The resource keys every asset, check, job and sensor of the code location uses."""
    return {
        "kafka": kafka_from_env(),
        "spark": spark_from_env(),
        "delta_root": delta_root_from_env(),
        "state_dir": state_dir_from_env(),
        "streams": streams_from_env(),
        "placement": placement_from_env(),
    }


def local_resources(
    bootstrap_servers: str,
    *,
    data_dir: str | Path | None = None,
    dedup_application_id: str = "transactions-dedup",
    enrichment_application_id: str = "transactions-enrichment",
    max_records_per_batch: int = 20_000,
    spark_master: str | None = None,
) -> dict[str, Any]:
    """The same resource keys on one given broker with everything else local: Spark
    ``spark_master`` (default ``SPARK_MASTER`` or ``local[*]``), Delta, state and the placement
    files under ``data_dir`` (default: ``.data``, resolved when a run starts). What
    `make demo` and the tests run the code location with."""
    root = None if data_dir is None else Path(data_dir)
    return {
        "kafka": KafkaResource(bootstrap_servers=bootstrap_servers),
        "spark": spark_from_env(spark_master),
        "delta_root": DeltaRootResource(path="" if root is None else str(root / "delta")),
        "state_dir": StateDirResource(path="" if root is None else str(root / "state")),
        "streams": StreamsResource(
            dedup_application_id=dedup_application_id,
            enrichment_application_id=enrichment_application_id,
            max_records_per_batch=max_records_per_batch,
        ),
        "placement": StandbyPlacementResource(
            output_dir="" if root is None else str(root / "placement")
        ),
    }


all_resources: dict[str, Any] = build_resources()

__all__ = [
    "DeltaRootResource",
    "KafkaResource",
    "SparkResource",
    "StandbyPlacementResource",
    "StateDirResource",
    "StreamsResource",
    "all_resources",
    "build_resources",
    "job_pool",
    "local_resources",
]
