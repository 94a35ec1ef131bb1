"""The stages path: a topology with repartitions. Its sub-topologies run one after another in
the batch, each reading its Kafka records and the records earlier ones wrote to its
repartition topics, then the batch's outputs are written as on the cached path. A stage that
reads Kafka topics only (the first) has its tasks read their ranges themselves, as on the
direct path; a stage reading repartitioned records gets them through a Spark shuffle, grouped
by task (``applyInArrow``).

Repartitioned records never leave Spark: they are shuffled to the task of their partition (the
one the writing task chose with murmur2, as Kafka Streams would) and numbered per upstream task
in the order it wrote them (repartition_buffer.py), so a re-run of the batch sees them in the
same order at the same offsets. The downstream task merges its upstream tasks' records by
timestamp, taking none later than what a bounded upstream task reached (its reported bound);
the rest waits in its repartition buffer. The batch stays one atomic unit: nothing of it is
visible before its commit, and no repartition topic has to be created or kept. A crash leaves
what the cached path's leaves.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from streamplatform.dsl.graph import SinkNode
from streamplatform.runtime.batch_outputs import Progress
from streamplatform.runtime.job_context import BatchPlan
from streamplatform.runtime.paths.cached import CachedPath
from streamplatform.runtime.paths.direct import task_ranges
from streamplatform.runtime.paths.spark_frames import (
    headers_as_json,
    kafka_records,
    run_grouped,
    union,
)
from streamplatform.runtime.repartition_buffer import (
    UPSTREAM_BITS,
    repartition_offset_base,
    written_bounds,
)
from streamplatform.runtime.rows import INPUT_COLUMNS, OUTPUT_SCHEMA


class StagesPath(CachedPath):
    def __init__(self, context: Any) -> None:
        super().__init__(context, grouped=True)
        self.name = "stages"  # grouped tasks, stage after stage

    def outputs(self, plan: BatchPlan, changelog_files: Any) -> Any:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        context = self.context
        records = None  # Spark's Kafka source, for stages that read Kafka and repartitions
        internal = sorted(context.internal_topics)
        base = repartition_offset_base(plan.batch_id)
        outputs, repartitioned = [], None
        bounds: dict[str, dict[int, int]] = {}  # repartition topic -> upstream task -> bound
        for subtopology in context.topology.subtopologies:
            topics = subtopology.source_topics(context.topology, context.app)
            external = [t for t in topics if t in context.sources]
            runner = context.runner(plan, changelog_files, subtopology=subtopology.id,
                                    repartition_bounds=bounds)  # fmt: skip
            if external and len(external) == len(topics):
                # Kafka topics only (the first stage): its tasks read their ranges
                # themselves, as on the direct path: no Spark Kafka source, no grouping.
                tasks = task_ranges(plan, external)
                run = runner.read_and_run(tasks, context.consumer_settings)
                reads = context.spark().range(len(tasks), numPartitions=max(1, len(tasks)))
                stage = self.cache(reads.mapInArrow(run, OUTPUT_SCHEMA))
            else:
                # Only a sub-topology with Kafka sources reads Kafka (the source pushes no
                # filter down: a stage reading none would fetch every range again).
                inputs = []
                if external:
                    if records is None:
                        records = kafka_records(context, plan.wanted())
                    inputs.append(records.where(F.col("topic").isin(external)))
                if repartitioned is not None:
                    inputs.append(repartitioned.where(F.col("topic").isin(topics)))
                if plan.repartition_buffered or any(bounds.values()):
                    # A task may hold repartitioned records in its buffer: every task of the
                    # stage runs, with or without new records (a row that only wakes it).
                    inputs.append(self._wake_rows(subtopology, topics))
                stage = self.cache(run_grouped(reduce(union, inputs), runner))
            outputs.append(stage)
            if any(
                isinstance(node, SinkNode) and node.internal
                for node in map(context.topology.nodes.__getitem__, subtopology.nodes)
            ):
                # What each upstream task reached, for the stages that read what it wrote.
                progress = Progress.of(
                    stage.where(F.col("kind") == "progress").select("task", "value").collect()
                )
                bounds |= written_bounds(context.topology, subtopology, context.app,
                                         progress.bounds)  # fmt: skip
            # Each upstream task's records for a partition, numbered in the order it wrote
            # them, under its own range of offsets (repartition_buffer.py).
            order = Window.partitionBy("topic", "partition", "task").orderBy("row")
            upstream_partition = F.split(F.col("task"), "_").getItem(1).cast("long")
            written = (
                stage.where((F.col("kind") == "sink") & F.col("topic").isin(internal))
                .withColumn("row", F.monotonically_increasing_id())  # order within a task
                .withColumn(
                    "offset",
                    F.lit(base)
                    + F.shiftleft(upstream_partition, UPSTREAM_BITS)
                    + F.row_number().over(order)
                    - 1,
                )
                .withColumn("task_partition", F.col("partition"))
                .withColumn("headers", headers_as_json("headers"))
                .select(*INPUT_COLUMNS)
            )
            repartitioned = written if repartitioned is None else union(repartitioned, written)
        every = reduce(union, outputs)
        return every.where(~((F.col("kind") == "sink") & F.col("topic").isin(internal)))

    def _wake_rows(self, subtopology: Any, topics: list[str]) -> Any:
        """One row per task of ``subtopology`` with no record in it (topic null)."""
        from pyspark.sql import functions as F

        width = max(self.context.partitions[t] for t in topics)
        frame = (
            self.context.spark()
            .range(width)
            .select(F.col("id").cast("int").alias("task_partition"))
        )
        for name in INPUT_COLUMNS[1:]:
            kind = {"topic": "string", "partition": "int", "offset": "long",
                    "timestamp": "long", "key": "binary", "value": "binary",
                    "headers": "string"}[name]  # fmt: skip
            frame = frame.withColumn(name, F.lit(None).cast(kind))
        return frame
