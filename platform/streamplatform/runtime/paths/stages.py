"""The stages path: a topology with repartitions. Its sub-topologies run one after another in
the batch, each reading its Kafka records and the records earlier ones wrote to its
repartition topics, then the batch's outputs are written as on the cached path. A stage that
reads Kafka topics only (the first) has its tasks read their ranges themselves, as on the
direct path; a stage reading repartitioned records gets them through a Spark shuffle, grouped
by task (``applyInArrow``).

Repartitioned records never leave Spark: they are shuffled to the task of their partition (the
one the writing task chose with murmur2, as Kafka Streams would) and get offsets
``batch_id * 2**40 + n`` (``repartition_offset``), numbered in the order of the records they
came from (source partition, offset), so a re-run of the batch sees them in the same order at
the same offsets. The batch stays one atomic unit: nothing of it is visible before its commit,
and no repartition topic has to be created or kept. A crash leaves what the cached path's
leaves.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from streamplatform.runtime.executor import INPUT_COLUMNS, OUTPUT_SCHEMA
from streamplatform.runtime.job_context import BatchPlan
from streamplatform.runtime.paths.cached import CachedPath
from streamplatform.runtime.paths.direct import task_ranges
from streamplatform.runtime.paths.spark_frames import (
    headers_as_json,
    kafka_records,
    run_grouped,
    union,
)

# A repartitioned record's offset: the batch in the high bits, its number in the batch in the
# low ones. 2**40 records per batch; batch ids up to 2**23 - 1 keep it a positive long.
OFFSET_BITS = 40
MAX_BATCH_ID = (1 << (63 - OFFSET_BITS)) - 1


def repartition_offset_base(batch_id: int) -> int:
    """The offset of batch ``batch_id``'s first repartitioned record. Raises past
    ``MAX_BATCH_ID``, where it would overflow a long (and so collide with another batch's)."""
    if not 0 <= batch_id <= MAX_BATCH_ID:
        raise OverflowError(
            f"batch {batch_id}: repartitioned records are numbered batch_id * 2**{OFFSET_BITS} "
            f"+ n, which fits a long up to batch {MAX_BATCH_ID}; start the application anew "
            "(another application.id) to go on"
        )
    return batch_id << OFFSET_BITS


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
        for subtopology in context.topology.subtopologies:
            topics = subtopology.source_topics(context.topology, context.app)
            external = [t for t in topics if t in context.sources]
            runner = context.runner(plan, changelog_files, subtopology=subtopology.id)
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
                stage = self.cache(run_grouped(reduce(union, inputs), runner))
            outputs.append(stage)
            order = Window.partitionBy("topic", "partition").orderBy(
                "source_topic", "source_partition", "source_offset", "row"
            )
            written = (
                stage.where((F.col("kind") == "sink") & F.col("topic").isin(internal))
                .withColumn("row", F.monotonically_increasing_id())  # order within a task
                .withColumn("offset", F.lit(base) + F.row_number().over(order) - 1)
                .withColumn("task_partition", F.col("partition"))
                .withColumn("headers", headers_as_json("headers"))
                .select(*INPUT_COLUMNS)
            )
            repartitioned = written if repartitioned is None else union(repartitioned, written)
        every = reduce(union, outputs)
        return every.where(~((F.col("kind") == "sink") & F.col("topic").isin(internal)))
