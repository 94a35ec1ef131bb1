"""The direct path for topologies with repartitions (``direct-stages``): the sub-topologies run
one after another in the batch, as on the stages path, but each stage's tasks run as the direct
path runs them, and the repartitioned records go from the upstream tasks to the downstream ones
in the driver's memory: no Spark shuffle, sort, window function or cache.

- **Where the tasks run.** A stage's tasks read their own Kafka ranges (kafka_input.py) and
  take their repartitioned records from the plan of the stage: in this process for a small
  batch on a local master (``platform.driver.tasks.max.records``), else in Spark (one Spark
  task per task, the last partial wave beside it here), as on the direct path.
- **Where the repartitioned records go.** Every task returns its rows; the driver takes the
  repartition topics' rows out of them, numbers them per upstream task in the order it wrote
  them (repartition_buffer.py: the same numbers on every attempt) and hands each downstream
  task the rows of its partition, with the bounds the upstream tasks reported. The downstream
  task merges them by timestamp and keeps what it may not take yet in its repartition buffer.
- **Where the other rows go, when, and what a crash leaves**: as on the direct path
  (direct.py). Kafka sinks and DLQ records are produced by the tasks, in one transaction per
  task under exactly_once_v2; a downstream task, which reads no Kafka partition, commits a
  marker offset of its own with it (kafka_output.py), so a replay finds it committed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamplatform import storage
from streamplatform.runtime.batch_outputs import Progress, progress_of, sink_rows
from streamplatform.runtime.job_context import BatchPlan, JobContext
from streamplatform.runtime.local_master import tasks_beside_spark
from streamplatform.runtime.paths.direct import (
    DirectPath,
    append_delta_sinks,
    write_side_outputs,
)
from streamplatform.runtime.repartition_buffer import (
    UPSTREAM_BITS,
    repartition_offset_base,
    written_bounds,
)
from streamplatform.runtime.rows import OUTPUT_ARROW

# A stage's task: (partition, its Kafka ranges, its repartitioned rows: number_repartitioned)
StageTask = tuple[int, tuple[tuple[str, int, int], ...], pa.Table | None]


class DirectStagesPath(DirectPath):
    """``where``: "driver" (every task in this process) or "spark"."""

    def __init__(self, context: JobContext, side_dir: str, where: str) -> None:
        super().__init__(context, side_dir, where, spill=False)
        self.name = f"direct-stages-{where}"

    def run(self, plan: BatchPlan, changelog_files: Any) -> Progress:
        context = self.context
        storage.remove_tree(self.side_dir)
        started = time.monotonic()
        internal = context.internal_topics
        # With Kafka sinks, the tasks produce them and their DLQ records themselves.
        kafka = context.in_task_outputs(plan.batch_id, (context.sources[0], 0))
        outputs: list[pa.Table] = []
        repartitioned: dict[str, dict[int, pa.Table]] = {}  # topic -> partition -> rows
        bounds: dict[str, dict[int, int]] = {}
        here = 0
        for subtopology in context.topology.subtopologies:
            topics = subtopology.source_topics(context.topology, context.app)
            tasks = self._tasks(plan, topics, repartitioned, bounds)
            if not tasks:
                continue
            runner = context.runner(plan, changelog_files, subtopology=subtopology.id,
                                    repartition_bounds=bounds)  # fmt: skip
            run = runner.read_and_run(tasks, context.consumer_settings, kafka=kafka)
            if self.where == "driver":
                ids = pa.record_batch([pa.array(range(len(tasks)), pa.int64())], ["id"])
                rows = pa.Table.from_batches(list(run([ids])), OUTPUT_ARROW)
                here += len(tasks)
            else:
                slots = context.local_slots()
                most = context.config["platform.driver.tasks.beside.spark"]
                beside = tasks_beside_spark(len(tasks), slots, most)
                rows = self._run_tasks(run, len(tasks), beside)
                here += beside
            # Typed: an empty set of topics (sub-topologies joined by no repartition) is a
            # null array to pyarrow, which is_in refuses against strings.
            topics = pa.array(sorted(internal), pa.string())
            is_internal = pc.and_(pc.equal(rows["kind"], "sink"), pc.is_in(rows["topic"], topics))
            written = rows.filter(is_internal)
            outputs.append(rows.filter(pc.invert(is_internal)))
            # A later stage may read what any stage before it wrote: kept for every stage.
            repartitioned |= number_repartitioned(written, plan.batch_id)
            bounds |= written_bounds(context.topology, subtopology, context.app,
                                     progress_of(rows).bounds)  # fmt: skip
        rows = pa.concat_tables(outputs) if outputs else OUTPUT_ARROW.empty_table()
        append_delta_sinks(context, plan.batch_id, lambda topic: sink_rows(
            rows, plan.batch_id, topic))  # fmt: skip
        tasks_ms = int((time.monotonic() - started) * 1000)
        progress = write_side_outputs(context, plan, rows, self.side_dir,
                                      dlq_sent_by_tasks=kafka is not None)  # fmt: skip
        progress.metrics["tasks_and_sink_ms"] = tasks_ms
        progress.metrics["tasks_in_driver"] = here
        return progress

    def _tasks(
        self,
        plan: BatchPlan,
        topics: list[str],
        repartitioned: Mapping[str, Mapping[int, pa.Table]],
        bounds: Mapping[str, Mapping[int, int]],
    ) -> list[StageTask]:
        """The stage's tasks: every partition with Kafka records planned or repartitioned
        records written to it; every partition of the stage when a task may hold records in
        its repartition buffer (the last batch left some, or an upstream task is bounded)."""
        context = self.context
        ranges: dict[int, list[tuple[str, int, int]]] = {}
        for (topic, partition), (start, end) in sorted(plan.ranges.items()):
            if topic in topics and end > start:
                ranges.setdefault(partition, []).append((topic, start, end))
        inputs: dict[int, list[pa.Table]] = {}
        for topic in sorted(topics):  # the rows sorted by topic too, as queues_of reads them
            for partition, table in repartitioned.get(topic, {}).items():
                inputs.setdefault(partition, []).append(table)
        partitions = set(ranges) | set(inputs)
        reads_internal = any(t in context.internal_topics for t in topics)
        if reads_internal and (plan.repartition_buffered or any(bounds.values())):
            partitions |= set(range(max(context.partitions[t] for t in topics)))
        return [
            (p, tuple(ranges.get(p, ())), pa.concat_tables(inputs[p]) if p in inputs else None)
            for p in sorted(partitions)
        ]  # fmt: skip


def number_repartitioned(rows: pa.Table, batch_id: int) -> dict[str, dict[int, pa.Table]]:
    """The repartition topics' rows of a stage for the downstream tasks: ``{topic: {partition:
    rows}}``, each partition's rows sorted by upstream task and, within it, in the order that
    task wrote them, with their ``upstream`` and ``offset``: ``batch_id * 2**40 + upstream *
    2**28 + n`` (repartition_buffer.py). Columns only: the records are built where the
    downstream task runs (repartition_buffer.queues_of)."""
    tables: dict[str, dict[int, pa.Table]] = {}
    if rows.num_rows == 0:
        return tables
    upstream = pc.cast(pc.list_element(pc.split_pattern(rows["task"], "_"), 1), pa.int64())
    rows = rows.select(["topic", "partition", "timestamp", "key", "value", "headers"]
                       ).append_column("upstream", upstream)  # fmt: skip
    # Sorted by partition and upstream task; a stable sort keeps each task's order.
    order = pc.sort_indices(rows, [("topic", "ascending"), ("partition", "ascending"),
                                   ("upstream", "ascending")]).to_numpy()  # fmt: skip
    topic_ids = rows["topic"].combine_chunks().dictionary_encode().indices.to_numpy()[order]
    partitions = rows["partition"].to_numpy()[order]
    upstreams = rows["upstream"].to_numpy()[order].astype(np.int64)
    count = rows.num_rows
    new_partition = np.ones(count, dtype=bool)
    new_partition[1:] = (topic_ids[1:] != topic_ids[:-1]) | (partitions[1:] != partitions[:-1])
    first = new_partition.copy()
    first[1:] |= upstreams[1:] != upstreams[:-1]
    # n: the row's place in its (topic, partition, upstream) run of the sorted rows.
    n = np.arange(count, dtype=np.int64) - np.flatnonzero(first)[np.cumsum(first) - 1]
    offsets = repartition_offset_base(batch_id) + (upstreams << UPSTREAM_BITS) + n
    bounds = np.append(np.flatnonzero(new_partition), count)
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        # A copy (take), not a slice: a slice would ship the whole stage's buffers.
        part = rows.take(order[start:end]).append_column("offset", pa.array(offsets[start:end]))
        topic, partition = part["topic"][0].as_py(), part["partition"][0].as_py()
        tables.setdefault(topic, {})[partition] = part
    return tables
