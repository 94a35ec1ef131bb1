"""StandbyPlacementResource: instance tags in; a KIP-708 plan, Spark pools and settings out.

The instances (name, tags, capacity), ``num.standby.replicas`` and the awareness tags come from
an instances file (the YAML of ``streamplatform placement plan --help``) named by
``STREAMPLATFORM_INSTANCES_FILE``, or from this resource's fields. Locally the default is three
instances in three zones with one standby each, which is enough to see every output:

- :meth:`plan`: :func:`streamplatform.placement.assign` over the jobs' tasks;
- :meth:`write_pools`: Spark's fair-scheduler allocation file, a pool per instance;
- :meth:`executor_settings`: per instance, the pool and Kubernetes node selectors from the tags;
- :meth:`write_table`: the plan appended to the placements Delta table as a new generation.

Spark cannot pin a task to an executor: locally the plan steers scheduler pools, on Kubernetes
node selectors; state follows a task by restore from the Delta changelog.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from streamplatform import data_dir
from streamplatform.placement import (
    Placement,
    assign,
    executor_settings,
    fair_scheduler_xml,
    load_plan_file,
    write_placements,
)

DEFAULT_INSTANCES = {
    "instance-a": {"zone": "zone-1"},
    "instance-b": {"zone": "zone-2"},
    "instance-c": {"zone": "zone-3"},
}


class StandbyPlacementResource(dg.ConfigurableResource):
    """See the module docstring."""

    instances_file: str | None = Field(
        default=None, description="YAML instances file (see `streamplatform placement plan -h`)."
    )
    instances: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {name: dict(tags) for name, tags in DEFAULT_INSTANCES.items()},
        description="Instance -> tags (client.tag.<key>), when no instances file is given.",
    )
    capacity: dict[str, int] = Field(default_factory=dict, description="Instance -> threads.")
    num_standby_replicas: int = Field(default=1, description="num.standby.replicas")
    awareness: list[str] = Field(
        default_factory=lambda: ["zone"], description="rack.aware.assignment.tags"
    )
    node_labels: dict[str, str] = Field(
        default_factory=lambda: {"zone": "topology.kubernetes.io/zone"},
        description="Tag key -> Kubernetes node label used in node selectors.",
    )
    output_dir: str = Field(
        default="", description="Where the pools file goes. Empty: .data/placement."
    )

    def inputs(self) -> tuple[dict[str, dict[str, str]], dict[str, int], int, tuple[str, ...]]:
        """``(clients, capacity, num_standby_replicas, awareness)`` from the file or fields."""
        if self.instances_file:
            plan_file = load_plan_file(self.instances_file, tasks=0)
            return (plan_file.clients, plan_file.capacity, plan_file.num_standby_replicas,
                    plan_file.awareness)  # fmt: skip
        capacity = {name: self.capacity.get(name, 1) for name in self.instances}
        return dict(self.instances), capacity, self.num_standby_replicas, tuple(self.awareness)

    def plan(self, tasks: Iterable[str]) -> Placement:
        """Actives spread by capacity, then standbys apart on the awareness tags (KIP-708)."""
        clients, capacity, standbys, awareness = self.inputs()
        return assign(clients, list(tasks), standbys, awareness, capacity=capacity)

    def pools_file(self) -> Path:
        return Path(self.output_dir or data_dir() / "placement") / "fairscheduler.xml"

    def write_pools(self, placement: Placement) -> Path:
        """Write the fair-scheduler allocation file (a pool per instance); returns its path."""
        path = self.pools_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fair_scheduler_xml(placement.capacity), encoding="utf-8")
        return path

    def executor_settings(self) -> dict[str, dict[str, str]]:
        clients, _, _, _ = self.inputs()
        return executor_settings(
            clients, allocation_file=self.pools_file(), node_labels=self.node_labels
        )

    def write_table(self, spark: Any, placement: Placement, path: str) -> int:
        """Append the plan to the placements Delta table; returns its generation."""
        return write_placements(spark, placement, path)


def placement_from_env() -> StandbyPlacementResource:
    if os.environ.get("STREAMPLATFORM_INSTANCES_FILE"):
        return StandbyPlacementResource(instances_file=dg.EnvVar("STREAMPLATFORM_INSTANCES_FILE"))
    return StandbyPlacementResource()
