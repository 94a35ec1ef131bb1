"""The cached paths: Spark reads the batch's Kafka ranges, runs the tasks and caches their
output, and every table is written from that cache. Taken by every shape the direct path does
not cover: Kafka sinks, several Delta sinks, several source topics, a replayed batch of the
Delta-write path's shape when ``platform.sink.driver.max.records = 0``; stages.py adds the
topologies with repartitions.

- **Where the tasks run.** In Spark: one task per Kafka partition of the one source topic
  (``cached``: ``mapInArrow``), or each task's records of several topics grouped by task
  partition (``grouped``: ``applyInArrow``, a task's input in memory).
- **Where the rows go.** Into Spark's cache (``persist``): every table below reads it, the
  tasks run once.
- **When the sinks are written.** The Delta sinks and the changelog start while the tasks
  still run (Spark starts a write task as soon as a slot is free; a partition still being
  computed is waited for, never computed twice); the DLQ mirror, versions and Kafka outputs
  once the progress rows say they exist. Kafka sinks and the DLQ topic are produced from the
  executors, each record with its own timestamp; under exactly_once_v2 one transaction per
  task that also commits its offsets to the consumer group (kafka_output.py).
- **What a crash leaves.** Each Delta table holds the batch once its append committed
  (transaction id ``<app>-<name>``, version = the batch): a replay's append of it is skipped.
  A task's committed Kafka transaction moved the group past the plan's start: the replay's
  task finds it and produces nothing again.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial
from typing import Any

from streamplatform.runtime import kafka_output
from streamplatform.runtime.batch_outputs import DELTA_OUTPUTS, Progress
from streamplatform.runtime.job_context import BatchPlan, JobContext
from streamplatform.runtime.paths.base import ExecutionPath
from streamplatform.runtime.paths.spark_frames import append_once, kafka_records, run_grouped
from streamplatform.runtime.planning import consumed_offsets
from streamplatform.runtime.rows import OUTPUT_SCHEMA, SINK_COLUMNS, STREAM_COLUMNS


class CachedPath(ExecutionPath):
    """``grouped``: the tasks read several topics (applyInArrow by task partition)."""

    def __init__(self, context: JobContext, grouped: bool) -> None:
        super().__init__(context)
        self.grouped = grouped
        self.name = "grouped" if grouped else "cached"
        self._cached: list[Any] = []

    def run(self, plan: BatchPlan, changelog_files: Any) -> Progress:
        outputs = self.outputs(plan, changelog_files)
        return write_cached_outputs(self.context, plan, outputs)

    def outputs(self, plan: BatchPlan, changelog_files: Any) -> Any:
        """The tasks' output, cached (released by ``release``)."""
        records = kafka_records(self.context, plan.wanted())
        runner = self.context.runner(plan, changelog_files)
        if self.grouped:
            outputs = run_grouped(records, runner)
        else:  # Spark's Kafka source makes one partition per Kafka partition: one task each
            outputs = records.select(*STREAM_COLUMNS).mapInArrow(
                runner.run_partition, OUTPUT_SCHEMA
            )
        return self.cache(outputs)

    def cache(self, frame: Any) -> Any:
        self._cached.append(frame.persist())
        return self._cached[-1]

    def release(self) -> None:
        for frame in self._cached:
            frame.unpersist()
        self._cached = []


def write_cached_outputs(context: JobContext, plan: BatchPlan, outputs: Any) -> Progress:
    """Write the batch's outputs from the cached ``outputs`` (all idempotent by the batch's
    transaction id) and return the tasks' numbers and consumed offsets (see the module
    docstring for the order)."""
    from pyspark.sql import functions as F

    batch_id = plan.batch_id
    append = partial(append_once, context.app, batch_id)

    def append_kind(kind: str) -> None:
        output = DELTA_OUTPUTS[kind]
        rows = outputs.where(F.col("kind") == kind).select(
            *(F.col(source).alias(target) for source, target in output.sources())
        )
        append(rows, f"{context.root}/{output.table}", output.txn_name, output.partition_by)

    started = time.monotonic()
    # The Delta commits are mostly waiting: the tables' writes overlap.
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"{context.app}-write") as pool:
        futures = []
        for topic in context.delta_sink_topics():
            rows = outputs.where((F.col("kind") == "sink") & (F.col("topic") == topic))
            rows = rows.select(*SINK_COLUMNS)
            typed = context.value_fields.get(topic)
            if typed is not None:  # the value decoded by its schema (value_fields.py)
                rows = typed.add_to_frame(rows)
            path, merge = f"{context.root}/{topic}", typed is not None
            futures.append(pool.submit(append, rows, path, f"sink-{topic}", merge_schema=merge))
        if any(subtopology.stores for subtopology in context.topology.subtopologies):
            futures.append(pool.submit(append_kind, "changelog"))
        try:
            # The progress rows: the tasks' numbers and how many rows of each kind they sent.
            # Asking for them computes and caches the whole output, in one pass.
            progress = Progress.of(
                outputs.where(F.col("kind") == "progress").select("task", "value").collect()
            )
            summary_ms = int((time.monotonic() - started) * 1000)
            futures += [
                pool.submit(append_kind, kind) for kind in ("dlq", "version")
                if kind in progress.kinds
            ]  # fmt: skip
            kafka_sinks = [
                t for kind, t in progress.present
                if kind == "sink" and t not in context.delta_sinks
                and t not in context.internal_topics
            ]  # fmt: skip
            if "dlq" in progress.kinds or kafka_sinks:
                consumed = consumed_offsets(plan.ranges, progress)
                transactions = context.transactions(batch_id, consumed)
                futures.append(
                    pool.submit(_produce_to_kafka, context, outputs, transactions, progress)
                )
        except BaseException:
            wait(futures)  # the writes already started end (or fail) before this raises
            raise
        for future in futures:
            future.result()
    progress.metrics["summary_ms"] = summary_ms
    progress.metrics["writes_ms"] = int((time.monotonic() - started) * 1000) - summary_ms
    return progress


def _produce_to_kafka(
    context: JobContext,
    outputs: Any,
    transactions: kafka_output.Transactions | None,
    progress: Progress,
) -> None:
    """The DLQ records and the Kafka sinks' records of ``outputs``, produced from the
    executors, each with its own timestamp (Spark's Kafka writer would stamp them with the
    time of the write); under exactly_once_v2 one transaction per task (kafka_output.py).
    A Spark partition of ``outputs`` holds whole tasks (one, or several grouped)."""
    from pyspark.sql import functions as F

    to_kafka = outputs.where(
        (F.col("kind") == "dlq")
        | ((F.col("kind") == "sink") & ~F.col("topic").isin(list(context.delta_sinks)))
    )
    counts = (
        to_kafka.select(*kafka_output.COLUMNS)
        .mapInArrow(
            kafka_output.producing(context.producer_settings, transactions),
            kafka_output.PRODUCED_SCHEMA,
        )
        .collect()
    )
    progress.metrics["kafka_records_produced"] = sum(row.produced for row in counts)
    progress.metrics["kafka_tasks_already_committed"] = sum(row.already_committed for row in counts)
