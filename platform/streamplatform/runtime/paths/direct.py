"""The direct path: one sub-topology reading Kafka topics (one, or several co-partitioned: a
stream-table join), into any sinks (Delta tables, Kafka topics, both). Nothing is cached in
Spark, and no row goes through Spark's Kafka source.

- **Where the tasks run.** Each task reads its Kafka ranges itself (kafka_input.py: a C
  consumer per range, no JVM rows turned into Arrow; several topics' records merged in the
  order Kafka Streams' partition group takes them, the lowest timestamp first). A small
  batch (at most ``platform.driver.tasks.max.records``) on a local master runs its tasks in
  this process (``direct-driver``: Spark's local executors share this host, state dir and
  environment, and the tasks stay open here); otherwise Spark runs them (``direct-spark``),
  with the tasks of its last, partial wave run here beside it (local_master.py).
- **Where the rows go.** Kafka sink and DLQ records are produced by the task itself as it
  makes them, in its own transaction under exactly_once_v2 (task_run.TaskRun.kafka; committed
  with the task's consumed offset when the task is done). The other rows of a small batch (at
  most ``platform.sink.driver.max.records``) come back to the driver with the tasks' results;
  a bigger one's go to a file per task in this run's staging directory (``direct-spilled``).
- **When the sinks are written.** Kafka: when each task ends (its transaction's commit).
  Delta: by the driver, with delta-rs, under the transaction id Spark's append of the same sink
  uses (``sink-<topic>``, version = the batch): a small batch's as soon as the tasks are back;
  a spilled one's only once every task that had records is known to have reported
  (``MissingTaskOutputs`` otherwise: a lost file fails the batch, it does not shorten it).
  Then the changelog, DLQ mirror and versions (batch_outputs.py), and, for a job without
  Kafka sinks, the DLQ topic from the driver (in the tasks' transactions under
  exactly_once_v2).
- **What a crash leaves.** Before the first write: nothing but open transactions (aborted by
  the next attempt's ``init_transactions``) and files in the staging directory (removed by the
  next attempt). After a task's Kafka commit: its records, and the consumer group past its
  range's start; the replay's task finds that and produces nothing again. After a Delta
  append: the table holds the batch under its transaction id, and the replay's append is
  skipped. The replay runs the tasks again on restored state; with the batch's logged
  wall-clock time, they make the same rows (docs/guarantees.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from contextlib import nullcontext
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform import storage
from streamplatform.runtime import delta_direct, kafka_input, kafka_output
from streamplatform.runtime.batch_outputs import (
    Progress,
    append_outputs,
    progress_of,
    read_side_files,
    sink_rows,
    spilled_files,
    spilled_sink_rows,
)
from streamplatform.runtime.errors import MissingTaskOutputs
from streamplatform.runtime.faults import crash_point
from streamplatform.runtime.job_context import BatchPlan, JobContext
from streamplatform.runtime.local_master import tasks_beside_spark
from streamplatform.runtime.paths.base import ExecutionPath
from streamplatform.runtime.planning import consumed_offsets
from streamplatform.runtime.rows import OUTPUT_ARROW, OUTPUT_SCHEMA


class DirectPath(ExecutionPath):
    """``where``: "driver" (every task in this process) or "spark"; ``spill``: the sink rows
    go to files instead of back through Spark."""

    def __init__(self, context: JobContext, side_dir: str, where: str, spill: bool) -> None:
        super().__init__(context)
        self.side_dir, self.where, self.spill = side_dir, where, spill
        self.name = "direct-spilled" if spill else f"direct-{where}"

    def run(self, plan: BatchPlan, changelog_files: Any) -> Progress:
        context = self.context
        storage.remove_tree(self.side_dir)  # a crashed attempt's files
        started = time.monotonic()
        tasks = task_ranges(plan)
        runner = context.runner(plan, changelog_files)  # every row back in OUTPUT_ARROW
        # With Kafka sinks, the tasks produce them and their DLQ records themselves.
        kafka = context.in_task_outputs(plan.batch_id)
        run = runner.read_and_run(tasks, context.consumer_settings,
                                  spill_dir=self.side_dir if self.spill else None,
                                  kafka=kafka)  # fmt: skip
        here = 0
        if self.where == "driver":
            ids = pa.record_batch([pa.array(range(len(tasks)), pa.int64())], ["id"])
            rows = pa.Table.from_batches(list(run([ids])), OUTPUT_ARROW)
            here = len(tasks)
        else:
            slots = context.local_slots()
            most = context.config["platform.driver.tasks.beside.spark"]
            here = tasks_beside_spark(len(tasks), slots, most)
            rows = self._run_tasks(run, len(tasks), here)
        if not self.spill:
            append_delta_sinks(context, plan.batch_id, lambda topic: sink_rows(
                rows, plan.batch_id, topic))  # fmt: skip
        tasks_ms = int((time.monotonic() - started) * 1000)
        # On object storage the spill files are read twice (the reports, then the sinks):
        # downloaded once instead.
        side = storage.local_copy(self.side_dir) if self.spill else nullcontext(self.side_dir)
        fetched = time.monotonic()
        with side as side_dir:
            if self.spill:  # the tasks' other rows are in their side files
                rows = read_side_files(side_dir)
            side_files_ms = int((time.monotonic() - fetched) * 1000)
            progress = write_side_outputs(context, plan, rows, side_dir,
                                          dlq_sent_by_tasks=kafka is not None)  # fmt: skip
        progress.metrics["side_files_ms"] = side_files_ms
        progress.metrics["tasks_and_sink_ms"] = tasks_ms
        progress.metrics["tasks_in_driver"] = here
        return progress

    def after_commit(self) -> None:
        storage.remove_tree(self.side_dir.rsplit("/", 1)[0])

    def _run_tasks(self, run: Callable[[Any], Any], tasks: int, here: int) -> pa.Table:
        """Run ``read_and_run``'s tasks 0 .. ``tasks`` - 1: the last ``here`` of them in this
        process, in a thread, while a Spark job runs the others. Returns their rows. Waits for
        both sides whatever happens, so that no task of this attempt still writes its side
        file once the batch has failed; then raises the first failure (the batch is not
        committed, and its next run re-runs it whole)."""
        in_spark = tasks - here
        lane: list[pa.Table] = []
        failures: list[BaseException] = []

        def run_here() -> None:
            try:
                ids = pa.record_batch([pa.array(range(in_spark, tasks), pa.int64())], ["id"])
                lane.append(pa.Table.from_batches(list(run([ids])), OUTPUT_ARROW))
            except BaseException as failure:  # raised in the caller's thread below
                failures.append(failure)

        thread = threading.Thread(target=run_here, name=f"{self.context.app}-driver-tasks")
        if here:
            thread.start()
        try:
            rows = (
                self.context.spark()
                .range(in_spark, numPartitions=in_spark)
                .mapInArrow(run, OUTPUT_SCHEMA)
                .toArrow()
            )
        finally:
            if here:
                thread.join()
        if failures:
            raise failures[0]
        return pa.concat_tables([rows.cast(OUTPUT_ARROW), *lane]) if lane else rows


def task_ranges(
    plan: BatchPlan, topics: Collection[str] | None = None
) -> list[tuple[int, tuple[tuple[str, int, int], ...]]]:
    """The batch's tasks, by partition: each with its ranges to read, (topic, start, end) for
    each source topic (of ``topics``, when given) with records on that partition
    (co-partitioned topics, one task per partition, as Kafka Streams groups them)."""
    by_partition: dict[int, list[tuple[str, int, int]]] = {}
    for topic, ranges in sorted(plan.wanted().items()):
        if topics is not None and topic not in topics:
            continue
        for partition, (start, end) in ranges.items():
            by_partition.setdefault(partition, []).append((topic, start, end))
    return [(partition, tuple(ranges)) for partition, ranges in sorted(by_partition.items())]


def append_delta_sinks(
    context: JobContext, batch_id: int, rows_of: Callable[[str | None], Any]
) -> None:
    """Append the batch's rows of each Delta sink (``rows_of(topic)``: a table or a stream of
    them; ``topic`` None when the job has one Delta sink, whose rows need no telling apart)
    with delta-rs, under the transaction id Spark's append of the same sink uses
    (spark_frames.append_once): a re-run of the batch through Spark skips it."""
    sinks = context.delta_sink_topics()
    for topic in sinks:
        rows = rows_of(topic if len(sinks) > 1 else None)
        typed = context.value_fields.get(topic)
        if typed is not None:  # the value decoded by its schema (value_fields.py)
            is_stream = isinstance(rows, pa.RecordBatchReader)
            rows = typed.add_to_stream(rows) if is_stream else typed.add_to(rows)
        delta_direct.append(f"{context.root}/{topic}", rows, f"{context.app}-sink-{topic}",
                            batch_id, conform=True, merge_schema=typed is not None)  # fmt: skip


def write_side_outputs(
    context: JobContext,
    plan: BatchPlan,
    rows: pa.Table | None,
    directory: str,
    dlq_sent_by_tasks: bool = False,
) -> Progress:
    """A batch's rows other than the sinks' that came to the driver (changelog, DLQ, versions;
    batch_outputs.py): to their Delta tables, and its DLQ records to Kafka, from the driver
    (they are few), unless the tasks produced them. First, every task that had records must
    have reported: a side file that never reached the driver fails the batch, which is then
    not committed. Spilled sink rows are appended once that is known."""
    started = time.monotonic()
    batch_id = plan.batch_id
    progress = progress_of(rows)
    check_every_task_reported(context, plan, progress, directory)
    if spilled_files(directory):  # the sink rows of a big batch whose tasks read Kafka
        append_delta_sinks(context, batch_id, lambda topic: spilled_sink_rows(
            directory, batch_id, topic))  # fmt: skip
    crash_point("during_outputs", batch_id)  # the sinks written, the other tables not
    append_outputs(context.root, context.app, batch_id, rows, progress)
    if "dlq" in progress.kinds and rows is not None and not dlq_sent_by_tasks:
        consumed = consumed_offsets(plan.ranges, progress)
        transactions = context.transactions(batch_id, consumed)
        dlq = rows.filter(pc.equal(rows["kind"], "dlq")).select(list(kafka_output.COLUMNS))
        produced, already = kafka_output.send(
            context.producer_settings, dlq.to_batches(), transactions,
            "the batch's DLQ records",
        )  # fmt: skip
        progress.metrics["kafka_records_produced"] = produced
        progress.metrics["kafka_tasks_already_committed"] = already
    progress.metrics["writes_ms"] = int((time.monotonic() - started) * 1000)
    return progress


def check_every_task_reported(
    context: JobContext, plan: BatchPlan, progress: Progress, directory: str
) -> None:
    """Raise MissingTaskOutputs when a task that had records in the batch sent no progress
    row (its side file is missing: not written, or written where the driver cannot read it).
    A task sends none only when its range held no committed record (markers or aborted
    records only), which the driver checks with a read of it."""
    consumer = context.consumer_settings
    subtopology_of = {
        topic: subtopology.id for subtopology in context.topology.subtopologies
        for topic in subtopology.source_topics(context.topology, context.app)
    }  # fmt: skip
    for (topic, partition), (start, end) in sorted(plan.ranges.items()):
        task = f"{subtopology_of.get(topic, 0)}_{partition}"
        if end <= start or task in progress.tasks_run:
            continue
        if kafka_input.has_records(consumer, topic, partition, start, end):
            raise MissingTaskOutputs(
                f"{context.app} batch {plan.batch_id}: task {task} had records of {topic}-"
                f"{partition} [{start}, {end}), and its outputs never reached the driver "
                f"(no side file in {directory} that the driver can read; on a cluster "
                "the Delta root must be storage that every executor and the driver reach "
                "at the same URI). The batch is not committed; its next run re-runs it."
            )
