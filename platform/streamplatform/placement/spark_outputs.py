"""What a placement becomes for Spark: scheduler pools, per-instance settings, a Delta table.

Spark cannot pin a partition (and so a task) to a chosen executor: it places a Kafka
topic-partition on ``executors[hash(tp) mod n]`` and fair-scheduler pools share cores, not
executors. So a placement *steers* rather than pins:

- locally, where every instance runs in one Spark application, each instance is a pool of the
  fair scheduler (:func:`fair_scheduler_xml`, weight = capacity) and the jobs of an instance's
  tasks are submitted with ``spark.scheduler.pool`` set to that pool;
- on Kubernetes each instance is its own Spark application, and
  ``spark.kubernetes.executor.node.selector.<label>`` (from the instance's tags, see
  :func:`executor_settings`) keeps its executors on nodes of its zone, cluster, ...; the
  standby's separation from the active comes from those node selectors.

In both cases a task's state follows the task by restore: whichever executor runs it opens the
task's stores from the instance's state directory and replays the Delta state changelog.

:func:`write_placements` appends a plan to the placements Delta table, one row per copy
``(generation, task, role, client, level)``, with a generation one above the table's largest.
One writer at a time (the driver that plans): two concurrent writers could pick the same
generation.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from streamplatform.home import data_dir
from streamplatform.placement.result import Placement

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PLACEMENTS_SCHEMA = "generation LONG, task STRING, role STRING, client STRING, level STRING"
NODE_SELECTOR_PREFIX = "spark.kubernetes.executor.node.selector."


def fair_scheduler_xml(capacity: Mapping[str, int]) -> str:
    """Spark's fair-scheduler allocation file: one FAIR pool per instance, named after it, with
    the instance's capacity as weight (Spark reads weights as integers).

    >>> print(fair_scheduler_xml({"node-1": 2}), end="")
    <?xml version="1.0" encoding="UTF-8"?>
    <allocations>
      <pool name="node-1">
        <schedulingMode>FAIR</schedulingMode>
        <weight>2</weight>
        <minShare>0</minShare>
      </pool>
    </allocations>
    """
    root = ET.Element("allocations")
    for client in sorted(capacity):
        pool = ET.SubElement(root, "pool", name=client)
        ET.SubElement(pool, "schedulingMode").text = "FAIR"
        ET.SubElement(pool, "weight").text = str(int(capacity[client]))
        ET.SubElement(pool, "minShare").text = "0"
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def executor_settings(
    clients: Mapping[str, Mapping[str, str]],
    *,
    allocation_file: str | Path | None = None,
    node_labels: Mapping[str, str] | None = None,
) -> dict[str, dict[str, str]]:
    """Spark settings per instance: the fair scheduler with the instance's pool, and a
    Kubernetes node selector per tag. ``node_labels`` renames tag keys to node label names
    (``{"zone": "topology.kubernetes.io/zone"}``); other keys are used as they are.

    ``spark.scheduler.pool`` is a local property: set it with
    ``spark.sparkContext.setLocalProperty`` in the thread that submits the instance's jobs.

    >>> executor_settings({"node-1": {"zone": "eu-1a"}},
    ...                   node_labels={"zone": "topology.kubernetes.io/zone"})["node-1"]
    ... # doctest: +NORMALIZE_WHITESPACE
    {'spark.scheduler.mode': 'FAIR', 'spark.scheduler.pool': 'node-1',
     'spark.kubernetes.executor.node.selector.topology.kubernetes.io/zone': 'eu-1a'}
    """
    labels = node_labels or {}
    settings: dict[str, dict[str, str]] = {}
    for client in sorted(clients):
        conf = {"spark.scheduler.mode": "FAIR", "spark.scheduler.pool": client}
        if allocation_file is not None:
            conf["spark.scheduler.allocation.file"] = str(allocation_file)
        for key, value in sorted(clients[client].items()):
            conf[NODE_SELECTOR_PREFIX + labels.get(key, key)] = value
        settings[client] = conf
    return settings


def placement_rows(
    placement: Placement, generation: int
) -> list[tuple[int, str, str, str, str | None]]:
    """One row per copy of every task: ``(generation, task, role, client, level)``; role is
    ``active`` or ``standby``, level is None for stateless tasks."""
    rows: list[tuple[int, str, str, str, str | None]] = []
    for task, client in placement.active.items():
        level = placement.levels.get(task)
        rows.append((generation, task, "active", client, level))
        rows += [
            (generation, task, "standby", standby, level) for standby in placement.standbys[task]
        ]
    return rows


def default_placements_path() -> Path:
    """``.data/delta/placements`` (see :func:`streamplatform.home.data_dir`)."""
    return data_dir() / "delta" / "placements"


def last_generation(spark: SparkSession, path: str | Path) -> int:
    """The largest generation in the placements table, 0 when there is no table yet."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, str(path)):
        return 0
    value = spark.read.format("delta").load(str(path)).agg({"generation": "max"}).first()
    return 0 if value is None or value[0] is None else int(value[0])


def write_placements(
    spark: SparkSession, placement: Placement, path: str | Path | None = None
) -> int:
    """Append ``placement`` to the placements Delta table as the next generation; return it."""
    if not placement.active:
        raise ValueError("write_placements: the placement has no tasks, nothing to record.")
    target = str(path if path is not None else default_placements_path())
    generation = last_generation(spark, target) + 1
    frame = spark.createDataFrame(placement_rows(placement, generation), PLACEMENTS_SCHEMA)
    frame.write.format("delta").mode("append").save(target)
    return generation
