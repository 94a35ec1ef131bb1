"""``standby_placements``: KIP-708 rack-aware placement of the streaming jobs' tasks.

Each materialization plans the active and standby tasks of every declared job over the
instances of the ``placement`` resource (``resources/placement.py``), appends the plan to the
placements Delta table as a new generation, and writes the Spark fair-scheduler pools file and
per-instance Spark settings (pool, Kubernetes node selectors from the tags).
"""

# No `from __future__ import annotations`: Dagster reads the decorated functions' annotations.

from collections.abc import Sequence

import dagster as dg

from assets.enriched import delta_table_version
from resources.placement import StandbyPlacementResource
from streamplatform.dagster import StreamingJobSpec, StreamplatformResource


def task_ids(resource: StreamplatformResource, jobs: Sequence[StreamingJobSpec]) -> list[str]:
    """``"<application.id>/<task id>"`` for every task of the jobs (one per source partition)."""
    from streamplatform.kafka import describe_topics

    tasks = []
    for job in jobs:
        partitions = describe_topics(resource.kafka_settings(), job.source_topics())
        for task in job.load_topology().task_ids(partitions, job.app_id):
            tasks.append(f"{job.app_id}/{task}")
    return tasks


def placements_asset(jobs: Sequence[StreamingJobSpec]) -> dg.AssetsDefinition:
    """The placement asset over ``jobs`` (module docstring)."""

    @dg.asset(
        name="standby_placements",
        group_name="operations",
        kinds={"spark", "delta"},
        description=(
            "Rack-aware standby placement (KIP-708) of the streaming jobs' tasks over the "
            "instances: the plan (a new generation in the placements Delta table), the Spark "
            "fair-scheduler pools file and per-instance Spark settings (pool, Kubernetes node "
            "selectors from the tags)."
        ),
    )
    def standby_placements(
        context: dg.AssetExecutionContext,
        streamplatform: StreamplatformResource,
        placement: StandbyPlacementResource,
    ) -> dg.MaterializeResult:
        spark = streamplatform.spark_session
        try:
            tasks = task_ids(streamplatform, jobs)
        except (LookupError, ConnectionError) as error:
            context.log.warning(f"Placing the default 3 partitions per job: {error}")
            tasks = [f"{job.app_id}/0_{p}" for job in jobs for p in range(3)]
        plan = placement.plan(tasks)
        pools = placement.write_pools(plan)
        path = f"{streamplatform.delta_root_path()}/placements"
        generation = placement.write_table(spark, plan, path)
        levels = plan.level_counts()
        load = "| instance | active | standby | load |\n|---|---:|---:|---:|\n" + "".join(
            f"| {client} | {plan.active_counts()[client]} | {plan.standby_counts()[client]} | "
            f"{plan.load[client]:.2f} |\n"
            for client in plan.capacity
        )
        context.log.info(f"placement generation {generation}: {len(tasks)} tasks, {levels}")
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
                "placements_version": delta_table_version(spark, path) or 0,
            }
        )

    return standby_placements
