"""KIP-708 rack-aware standby placement: the assignor and what it produces for Spark.

- :func:`assign_standbys` — Kafka Streams' rule (docs/semantics.md): ``{task: [standby clients]}``.
- :func:`plan_standbys` — the same run as a :class:`Placement`: standbys, the level each task
  reached (absolute / partial / least_preferred / unplaced) and the load per instance;
  ``strict=True`` leaves a standby unplaced rather than break a tag rule.
- :func:`assign` — actives spread by capacity first, then standbys.
- :func:`inputs_from_settings` — the inputs from each instance's own settings.
- :func:`fair_scheduler_xml`, :func:`executor_settings`, :func:`write_placements` — a pool per
  instance, per-instance Spark settings with Kubernetes node selectors, the placements Delta
  table (see ``spark_outputs`` for what Spark can and cannot pin).
- :func:`load_plan_file` — the instances file of ``streamplatform placement plan`` (YAML: tags
  and capacity per instance, ``num_standby_replicas``, ``awareness``, the tasks) read into a
  :class:`PlanFile`, whose ``plan()`` runs the assignor on it: a Dagster resource or a script
  plans from the same file as the command.

Modules: ``assignor`` (the rule), ``result`` (Placement and levels), ``validation`` (limits and
errors naming the setting), ``spark_outputs``, ``planfile`` (``streamplatform placement plan``).

>>> from streamplatform.placement import assign_standbys
>>> clients = {f"n{i}": {"zone": zone} for i, zone in enumerate("aabbcc")}
>>> assign_standbys(clients, {"0_0": "n0", "0_1": "n2"}, 2, ["zone"])
{'0_0': ['n3', 'n4'], '0_1': ['n1', 'n5']}
"""

from streamplatform.placement.assignor import assign, assign_standbys, plan_standbys
from streamplatform.placement.planfile import PlanFile, load_plan_file
from streamplatform.placement.result import LEVELS, Level, Placement
from streamplatform.placement.spark_outputs import (
    executor_settings,
    fair_scheduler_xml,
    write_placements,
)
from streamplatform.placement.validation import PlacementInputs, inputs_from_settings

__all__ = [
    "LEVELS",
    "Level",
    "Placement",
    "PlacementInputs",
    "PlanFile",
    "assign",
    "assign_standbys",
    "executor_settings",
    "fair_scheduler_xml",
    "inputs_from_settings",
    "load_plan_file",
    "plan_standbys",
    "write_placements",
]
