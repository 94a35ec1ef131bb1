"""The Delta-write path: the direct path's shape (one sub-topology, one Kafka topic, one Delta
sink) with ``platform.sink.driver.max.records = 0``: the tasks run inside Spark's Delta write
of the sink.

- **Where the tasks run.** In Spark, one per Kafka partition (Spark's Kafka source), inside
  the sink's write job (``mapInArrow``).
- **Where the rows go.** Sink rows straight into the write; every other row of a task
  (changelog, DLQ, versions, progress) to a side file per task in this run's staging
  directory, read by the driver afterwards.
- **When the sink is written.** By Spark's Delta writer, under ``sink-<topic>`` / the batch:
  the moment the tasks end. Then the other tables from the side files, once every task that
  had records is known to have reported (direct.write_side_outputs).
- **What a crash leaves.** After the sink's commit, a replay's write would be skipped by
  Delta, and its tasks with it: a replayed batch therefore never takes this path (paths.choose
  sends it to the direct path, whose tasks run before its append is skipped).
"""

from __future__ import annotations

import time
from typing import Any

from streamplatform import storage
from streamplatform.runtime.batch_outputs import Progress, read_side_files
from streamplatform.runtime.job_context import BatchPlan
from streamplatform.runtime.paths.base import ExecutionPath
from streamplatform.runtime.paths.direct import write_side_outputs
from streamplatform.runtime.paths.spark_frames import append_once, headers_from_json, kafka_records
from streamplatform.runtime.rows import SINK_COLUMNS, SINK_SCHEMA, STREAM_COLUMNS


class DeltaWritePath(ExecutionPath):
    name = "delta-write"

    def __init__(self, context: Any, side_dir: str) -> None:
        super().__init__(context)
        self.side_dir = side_dir

    def run(self, plan: BatchPlan, changelog_files: Any) -> Progress:
        from pyspark.sql import functions as F

        context = self.context
        storage.remove_tree(self.side_dir)  # a crashed attempt's files
        started = time.monotonic()
        (sink,) = context.sink_topics()
        runner = context.runner(plan, changelog_files, side_output_dir=self.side_dir)
        streamed_rows = (
            kafka_records(context, plan.wanted())
            .select(*STREAM_COLUMNS)
            .mapInArrow(runner.run_partition, SINK_SCHEMA)
        )
        sink_frame = (
            streamed_rows.withColumn("headers", headers_from_json("headers"))
            .withColumn("source_topic", F.lit(context.sources[0]))
            .select(*SINK_COLUMNS)
        )
        append_once(context.app, plan.batch_id, sink_frame, f"{context.root}/{sink}",
                    f"sink-{sink}")  # fmt: skip
        tasks_ms = int((time.monotonic() - started) * 1000)
        rows = read_side_files(self.side_dir)
        progress = write_side_outputs(context, plan, rows, self.side_dir)
        progress.metrics["tasks_and_sink_ms"] = tasks_ms
        progress.metrics["tasks_in_driver"] = 0
        return progress

    def after_commit(self) -> None:
        storage.remove_tree(self.side_dir.rsplit("/", 1)[0])
