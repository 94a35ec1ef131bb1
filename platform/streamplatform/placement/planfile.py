"""The instances file of ``streamplatform placement plan`` and the plan printed as a table.

:data:`PLAN_HELP` (the command's help) describes the file; :func:`load_plan_file` reads it,
:meth:`PlanFile.plan` runs the assignor on it and :func:`format_plan` prints the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from streamplatform.config import ConfigError
from streamplatform.placement.assignor import assign, plan_standbys
from streamplatform.placement.result import LEVELS, Placement
from streamplatform.placement.validation import awareness_keys

PLAN_HELP = """\
streamplatform placement plan: place the tasks' actives and standbys (KIP-708) over the
instances of FILE and print the plan (task, active, standbys, level reached), the load per
instance and a summary. FILE is YAML:

  instances:                      # required: name -> tags and capacity
    node-1: {tags: {zone: eu-1a, cluster: k8s-1}, capacity: 2}
    node-2: {tags: {zone: eu-1b, cluster: k8s-1}}        # capacity defaults to 1
  num_standby_replicas: 2         # num.standby.replicas, default 0
  awareness: [zone, cluster]      # rack.aware.assignment.tags, default none
  tasks: 12                       # a count (ids 0_0 .. 0_11) or a list of task ids
  active: {"0_0": node-1}         # instead of tasks: keep these actives, place standbys only

Quote task ids in YAML ("0_1"): unquoted, YAML reads 0_1 as a number.

Actives are spread over the instances by capacity unless `active` is given. --standbys,
--awareness and --tasks override the file's values; --strict leaves a standby unplaced rather
than break a tag rule. Levels: absolute (copies apart on every awareness key), partial (apart
on at least one), least_preferred (on none), unplaced (fewer standbys than asked).
"""
_TOP_LEVEL = ("instances", "num_standby_replicas", "awareness", "tasks", "active")


@dataclass(frozen=True)
class PlanFile:
    """An instances file, read: tags and capacity per instance, settings, and the tasks."""

    clients: dict[str, dict[str, str]]
    capacity: dict[str, int]
    num_standby_replicas: int
    awareness: tuple[str, ...]
    tasks: tuple[str, ...]
    active: dict[str, str] | None  # given actives, or None to place them by capacity

    def plan(self, *, strict: bool = False) -> Placement:
        """Run the assignor on this file."""
        if self.active is not None:
            return plan_standbys(
                self.clients,
                self.active,
                self.num_standby_replicas,
                self.awareness,
                capacity=self.capacity,
                strict=strict,
            )
        return assign(
            self.clients,
            self.tasks,
            self.num_standby_replicas,
            self.awareness,
            capacity=self.capacity,
            strict=strict,
        )


def _task_ids(tasks: Any, label: str) -> tuple[str, ...]:
    if isinstance(tasks, int) and not isinstance(tasks, bool) and tasks >= 0:
        return tuple(f"0_{partition}" for partition in range(tasks))
    if isinstance(tasks, list):
        return _quoted(tasks, label)
    raise ConfigError(f"{label}: expected a count >= 0 or a list of task ids, got {tasks!r}")


def _quoted(task_ids: Any, label: str) -> tuple[str, ...]:
    numbers = [task for task in task_ids if not isinstance(task, str)]
    if numbers:
        raise ConfigError(
            f"{label}: task ids must be quoted strings, got {numbers[:3]} (unquoted, YAML reads "
            "0_1 as the number 1)"
        )
    return tuple(task_ids)


def _tag_value(value: Any) -> Any:
    """YAML reads ``rack: 3`` as a number: numbers become text; anything else is left as it is
    for the assignor's validation to report under the setting's name."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _instance(name: str, spec: Any) -> tuple[dict[str, str], int]:
    spec = {} if spec is None else spec
    if not isinstance(spec, Mapping) or not set(spec) <= {"tags", "capacity"}:
        raise ConfigError(f"instance {name!r}: expected a mapping with tags and capacity")
    tags = spec.get("tags") or {}
    if not isinstance(tags, Mapping):
        raise ConfigError(f"instance {name!r}: tags must be a mapping of key: value")
    return {str(key): _tag_value(value) for key, value in tags.items()}, spec.get("capacity", 1)


def load_plan_file(
    path: str | Path,
    *,
    num_standby_replicas: int | None = None,
    awareness: str | None = None,
    tasks: int | None = None,
) -> PlanFile:
    """Read an instances file; the keyword arguments override the file's values. Problems
    raise ConfigError naming the file."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        return _plan_file(document, num_standby_replicas, awareness, tasks)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the instances file: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _plan_file(
    document: Any, num_standby_replicas: int | None, awareness: str | None, tasks: int | None
) -> PlanFile:
    if not isinstance(document, Mapping) or not isinstance(document.get("instances"), Mapping):
        raise ConfigError("expected a mapping with an 'instances' mapping")
    unknown = sorted(str(key) for key in document if key not in _TOP_LEVEL)
    if unknown:
        raise ConfigError(f"unknown keys {unknown}; expected some of {list(_TOP_LEVEL)}")
    clients, capacity = {}, {}
    for name, spec in document["instances"].items():
        clients[str(name)], capacity[str(name)] = _instance(str(name), spec)
    active = document.get("active")
    if active is not None and not isinstance(active, Mapping):
        raise ConfigError("active: expected a mapping of task: instance")
    if tasks is not None:
        task_ids, active = _task_ids(tasks, "--tasks"), None
    elif active is not None:
        task_ids = _quoted(active, "active")
    else:
        task_ids = _task_ids(document.get("tasks"), "tasks")
    if num_standby_replicas is None:
        num_standby_replicas = document.get("num_standby_replicas", 0)
    return PlanFile(
        clients=clients,
        capacity=capacity,
        num_standby_replicas=num_standby_replicas,
        awareness=awareness_keys(awareness or document.get("awareness") or ()),
        tasks=task_ids,
        active=None if active is None else {task: str(active[task]) for task in task_ids},
    )


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Rows as text, each column padded to its widest cell."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def format_plan(placement: Placement, clients: Mapping[str, Mapping[str, str]]) -> str:
    """The plan as aligned text: one row per task, then the load per instance and a summary."""
    task_rows = [
        (task, client, ", ".join(placement.standbys[task]) or "-", placement.levels.get(task, "-"))
        for task, client in placement.active.items()
    ]
    actives, standbys = placement.active_counts(), placement.standby_counts()
    instance_rows = [
        (
            client,
            ",".join(f"{key}={value}" for key, value in sorted(clients[client].items())) or "-",
            str(placement.capacity[client]),
            str(actives[client]),
            str(standbys[client]),
            f"{placement.load[client]:.2f}",
        )
        for client in placement.capacity
    ]
    levels = placement.level_counts()
    counts = standbys.values()
    lines = [
        *_table(("task", "active", "standbys", "level"), task_rows),
        "",
        *_table(("instance", "tags", "capacity", "active", "standby", "load"), instance_rows),
        "",
        "levels: " + ", ".join(f"{level} {levels[level]}" for level in LEVELS),
        f"standbys per instance: min {min(counts, default=0)}, max {max(counts, default=0)}, "
        f"spread {placement.standby_spread()}",
    ]
    return "\n".join(lines) + "\n"
