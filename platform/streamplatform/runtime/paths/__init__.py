"""The execution paths of a batch, and the one place that chooses among them (``choose``).

- ``direct-driver``: one sub-topology reading Kafka (one topic, or several co-partitioned
  ones: each task merges its own reads by timestamp), into any sinks; a small batch on a
  local master: the tasks run in this process, reading Kafka themselves and producing their
  Kafka sinks and DLQ records; the driver appends the Delta sinks with delta-rs.
- ``direct-spark``: the same shape, the tasks in Spark (still reading Kafka themselves), their
  rows back through Spark; the driver appends.
- ``direct-spilled``: the same, more rows than ``platform.sink.driver.max.records``: the tasks
  spill their sink rows to files, which the driver appends.
- ``delta-write``: one Delta sink and nothing else, ``platform.sink.driver.max.records = 0``:
  the tasks run inside Spark's Delta write of the sink.
- ``cached``: one sub-topology, one Kafka topic, with ``platform.sink.driver.max.records = 0``:
  Spark's Kafka source, the tasks in
  ``mapInArrow``, their output cached; Delta by Spark, Kafka from the executors.
- ``grouped``: the same for one sub-topology reading several Kafka topics: each task's
  records grouped (``applyInArrow``), then as ``cached``.
- ``direct-stages-driver`` / ``direct-stages-spark``: repartitions, sub-topology after
  sub-topology, each stage's tasks run as on the direct path, the repartitioned records
  handed from the upstream tasks to the downstream ones in the driver's memory.
- ``stages``: repartitions with ``platform.sink.driver.max.records = 0`` (or typed Delta
  columns): sub-topology after sub-topology, shuffled between by Spark, then as ``cached``.

Each module says where its tasks run, where rows go, when the sink is written and what a
crash leaves (docs/architecture.md has the overview).
"""

from __future__ import annotations

from streamplatform.runtime.job_context import BatchPlan, JobContext
from streamplatform.runtime.paths.base import ExecutionPath
from streamplatform.runtime.paths.cached import CachedPath
from streamplatform.runtime.paths.delta_write import DeltaWritePath
from streamplatform.runtime.paths.direct import DirectPath
from streamplatform.runtime.paths.direct_stages import DirectStagesPath
from streamplatform.runtime.paths.stages import StagesPath

__all__ = ["ExecutionPath", "choose"]


def choose(context: JobContext, plan: BatchPlan) -> ExecutionPath:
    """The path of ``plan``'s batch: the one place that decides (see the table above)."""
    topology = context.topology
    side_dir = context.side_dir()
    sinks = set(context.sink_topics())
    limit = context.config["platform.sink.driver.max.records"]
    if len(topology.subtopologies) > 1:
        if limit > 0 and not context.value_fields:
            return DirectStagesPath(context, side_dir, _where(context, plan))
        return StagesPath(context)
    if limit > 0:
        small = plan.records <= limit
        where = _where(context, plan) if small else "spark"
        return DirectPath(context, side_dir, where, not small)
    one_topic = len(context.sources) == 1  # Spark's Kafka source, one task per partition
    streamable = not context.value_fields  # typed columns are added outside the stream
    if (
        one_topic and len(sinks) == 1 and sinks <= context.delta_sinks
        and not plan.replayed and streamable and not topology.has_dynamic_sinks()
    ):  # fmt: skip
        # A replay's write of a sink its first attempt committed would be skipped by
        # Delta, and the tasks inside it with it: replayed on the cached path instead.
        return DeltaWritePath(context, side_dir)
    return CachedPath(context, grouped=len(context.sources) > 1)


def _where(context: JobContext, plan: BatchPlan) -> str:
    """Where a direct path's tasks run: in this process for a small batch on a local master
    (``platform.driver.tasks.max.records``), else in Spark."""
    in_driver = (
        plan.records <= context.config["platform.driver.tasks.max.records"]
        and context.local_slots() > 0
    )
    return "driver" if in_driver else "spark"
