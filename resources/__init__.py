"""Dagster resources: Kafka, Spark, Delta root, state dir, the jobs' settings, standby placement.

:func:`build_resources` chooses them from the environment, never from edits: with nothing set
everything is local (the broker of `streamplatform broker start`, Spark ``local[*]``, Delta and
state under ``.data/``); ``KAFKA_*``, ``SPARK_MASTER``, ``STREAMPLATFORM_DELTA_ROOT``,
``STREAMPLATFORM_STATE_DIR``, ``STREAMPLATFORM_INSTANCES_FILE`` point them at a real cluster.
"""

from __future__ import annotations

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
from resources.streams import StreamsResource, streams_from_env


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
]
