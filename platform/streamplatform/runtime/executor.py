"""What runs inside a Spark executor: one task over its records of one micro-batch.

This module hands each task its inputs (``TaskBatchRunner``); one task's batch is
``task_run.TaskRun``, the rows it takes and gives are laid out in ``rows.py``, and its inputs
are merged and cut by ``partition_group.py``.

``TaskBatchRunner`` is pickled to the executors (a plain object: the topology, the settings,
the batch's numbers) and called once per task with that task's rows (``mapInArrow``, or
``applyInArrow`` when a task reads several topics; ``read_and_run`` when a small batch's
tasks read their ranges themselves, kafka_input.py):

1. take the task kept open in this Python worker since its last batch, when it is proven
   current (task_cache.py), or open the task's stores under
   ``state.dir/<application.id>/<task id>/``;
2. settle the previous batch's prepared writes — apply them when that batch is in the commit
   log, discard them when it is not (under both guarantees);
3. restore from the Delta changelog when the local state is behind the commit log (a new
   executor, a wiped state dir), inside this attempt: when the driver did not send the
   changelog's files, the task reads them from the Delta log itself. It reports how many
   changelog rows it replayed, and where (``restores`` in its progress row);
4. process the records, per partition in offset order, across partitions by timestamp (as
   Kafka Streams picks records); stop early when a store passes its uncommitted limits; fire
   the wall-clock punctuations due when the batch begins and when it ends;
5. persist the store writes: *prepare* them as batch N, under both guarantees, so that a
   batch that never commits leaves no state behind; they also leave as changelog rows;
6. return the output rows: sink, DLQ, changelog and version rows, and one progress row that
   also counts the rows of each kind, so the driver needs no pass over the output for that.
   With a side-output directory (a job whose one sink is a Delta table) only the sink rows are
   returned, into the Delta write; the others go to the task's side file (SINK_COLUMNS);
7. keep the task open in the worker for its next batch when the whole batch went through;
   a failed or stopped attempt closes it.

Under ``mapInArrow`` a Spark partition is one Kafka partition, read in offset order: the task
processes each Arrow batch as it arrives and sends its sink and DLQ rows on at once, so the
JVM reads Kafka and takes the output while Python works, and Python never holds the whole
partition. The cyclic garbage collector is paused while a task runs: a task allocates
millions of short-lived, acyclic objects, and the collector's passes over them cost a
quarter of its time.

The store writes of a batch always go through a transaction (READ_COMMITTED) here, under both
guarantees: it is what lets them leave as the batch's changelog, and what makes the state after
a failed attempt the state of the last commit. The guarantees differ only in the Kafka outputs
(transactional or acknowledged sends), never in the state.

A task that fails (a handler answered fail) loses its whole output with its Spark task, so it
produces its DLQ records to the DLQ topic itself before it fails, as Kafka Streams would have
sent them (``TaskRun.send_dlq_before_failing``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform import storage
from streamplatform.dsl.topology import Topology
from streamplatform.errors.exceptions import TaskFailedError
from streamplatform.records import ConsumedRecord
from streamplatform.runtime import kafka_output, repartition_buffer
from streamplatform.runtime.partition_group import FROM_LAST, InputQueue
from streamplatform.runtime.rows import OUTPUT_ARROW, arrow_records, first_offsets, table_queues
from streamplatform.runtime.task import Task
from streamplatform.runtime.task_run import (
    BATCH_MARKER,
    ReadRanges,
    TaskRun,
    batch_held,
    collector_paused,
)

if TYPE_CHECKING:
    from streamplatform.runtime.changelog import ChangelogFile


@dataclass(frozen=True)
class ChangelogWrites:
    """What the driver knows of the batches committed since ``known_from`` without reading
    any table: per task, the last of them that wrote changelog rows (``last_write``) and the
    last of them that ran the task at all (``last_run``)."""

    known_from: int
    last_write: dict[str, int]
    last_run: dict[str, int] = field(default_factory=dict)

    def none_after(self, task: str, held: int) -> bool:
        """True when the changelog surely has no rows for ``task`` after batch ``held``."""
        return held >= self.known_from - 1 and self.last_write.get(task, -1) <= held

    def not_run_after(self, task: str, batch: int) -> bool:
        """True when surely no committed batch after ``batch`` ran ``task``."""
        return batch >= self.known_from - 1 and self.last_run.get(task, -1) <= batch


class TaskBatchRunner:
    """Runs one micro-batch of one task; see the module docstring.

    ``planned_records``: task partition -> records planned for it in this batch (the crash
    test's ``during_tasks`` step fires half-way through them).
    """

    def __init__(
        self,
        topology: Topology,
        settings: dict[str, Any],
        batch_id: int,
        last_committed: int | None,
        changelog_files: dict[str, list[ChangelogFile]] | None,
        partitions: dict[str, int],
        state_dirs: dict[str, str] | None = None,
        planned_records: Mapping[int, int] | None = None,
        changelog_writes: ChangelogWrites | None = None,
        subtopology: int = 0,
        internal_topics: Iterable[str] = (),
        side_output_dir: str | None = None,
        stream_topic: str | None = None,
        fingerprint: str = "",
        task_runs: ChangelogWrites | None = None,
        changelog_table: str | None = None,
        wall_clock_ms: int | None = None,
        task_cap: int | None = None,
        capped: frozenset[tuple[str, int]] = frozenset(),
        repartition_bounds: Mapping[str, Mapping[int, int]] | None = None,
        incarnation: str = "",
        global_ends: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        self.topology = topology
        # Where every task's copies of the global tables are caught up to before its records
        # (global_tables.py): the batch's logged plan.
        self.global_ends = dict(global_ends or {})
        # The job's incarnation (incarnation.py): a task directory of another one, left from
        # before a reset, is removed before the task opens it.
        self.incarnation = incarnation
        # Event time across a task's inputs (partition_group.py): at most ``task_cap`` records
        # per task (platform.max.records.per.batch; tasks reading repartitioned records take
        # what their inputs allow), the Kafka partitions whose planned range stops short of
        # their end (``capped``: they hold the task's other inputs back), and the bound each
        # upstream task of a repartition topic reported (absent: it read everything).
        self.task_cap = task_cap
        self.capped = capped
        self.repartition_bounds = {t: dict(b) for t, b in (repartition_bounds or {}).items()}
        # The batch's wall-clock time, logged with its plan: every task of the batch, and
        # every attempt of it, fires its wall-clock punctuations and answers
        # current_system_time_ms() with it (a replay sees what the first attempt saw).
        self.wall_clock_ms = wall_clock_ms if wall_clock_ms is not None else _now_ms()
        # The Delta changelog's URI: a task behind the commit log that was not sent the
        # changelog's files reads them from the Delta log itself (_settle_and_restore).
        self.changelog_table = changelog_table
        # A task kept open in this worker since an earlier batch is used again only under the
        # same fingerprint, when ``task_runs`` proves it current (task_cache.py).
        self.fingerprint = fingerprint
        self.task_runs = task_runs
        # The topic of the STREAM_COLUMNS rows given to run_partition.
        self.stream_topic = stream_topic
        # Set: run_partition yields sink rows only (SINK_ARROW) and writes every other row to
        # ``<side_output_dir>/<task id>.parquet`` (see SINK_COLUMNS).
        self.side_output_dir = side_output_dir
        self.state_dirs = state_dirs or {}  # task id -> its instance's state root (placement)
        self.settings = settings
        self.batch_id = batch_id
        self.last_committed = last_committed
        # Task id -> parquet files of its changelog; None: not resolved for this batch.
        self.changelog_files = changelog_files
        self.changelog_writes = changelog_writes
        # Which sub-topology's tasks this runs, and the job's internal (repartition) topics.
        # Their records exist only inside the batch: a task reading them never stops early
        # (see TaskRun.process), and they are not counted as records in or out.
        self.subtopology = subtopology
        self.internal_topics = frozenset(internal_topics)
        self.reads_internal = any(
            topic in self.internal_topics
            for topic in topology.subtopologies[subtopology].source_topics(
                topology, settings["application.id"]
            )
        )
        self.partitions = partitions
        self.planned_records = dict(planned_records or {})

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled where its tasks run (a Spark worker): the Delta root's storage settings
        # are registered there before a task reads the changelog or writes a side file.
        self.__dict__.update(state)
        storage.configure(self.settings)

    def run(self, table: pa.Table) -> pa.Table:
        """One task's rows of the batch (all of one ``task_partition``) in, its output out.
        Its Kafka partitions and its upstream tasks' repartitioned records (and what its
        repartition buffer held) are merged by timestamp (partition_group.py)."""
        with collector_paused():
            partition = int(table["task_partition"][0].as_py())
            by_queue = table_queues(table, self.internal_topics)
            run = TaskRun(self, partition, planned=table.num_rows)
            run.first_offsets = first_offsets(table.filter(pc.is_valid(table["topic"])))
            if self.reads_internal:
                run.internal_in = sum(
                    len(records) for (topic, _, _), records in by_queue.items()
                    if topic in self.internal_topics
                )  # fmt: skip
            try:
                queues = run.input_queues(by_queue)
                tables = [run.process(run.merged(queues)), run.end_punctuation()]
                run.after_merge(queues)
                tables += run.finish()
                run.completed = True
            except TaskFailedError as failure:
                run.send_dlq_before_failing(failure)
                raise
            finally:
                run.close()
            return pa.Table.from_batches([t for t in tables if t is not None], OUTPUT_ARROW)

    def run_partition(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow`` entry point: a Spark partition is one Kafka partition, its records in
        offset order (STREAM_COLUMNS). Each Arrow batch is processed as it arrives, its output
        sent on."""
        assert self.stream_topic is not None
        return self.run_records(arrow_records(self.stream_topic, self.subtopology, batches))

    def run_records(
        self,
        chunks: Iterable[list[ConsumedRecord]] | Callable[[TaskRun], Iterable[list[Any]]],
        read: ReadRanges | None = None,
        partition: int | None = None,
        queues: list[InputQueue] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """One task's batch: ``chunks`` of records of its Kafka partition in the order the
        task takes them (tuples in ConsumedRecord's layout), each processed as it arrives, its
        output sent on (OUTPUT_ARROW; sink rows only, SINK_ARROW, with ``side_output_dir``).
        ``read``: the ranges the task read itself; with its ``kafka`` the task produces its
        Kafka sink and DLQ records itself (``TaskRun.kafka``). ``chunks`` may also be a
        function of the task's run giving them (``run_queues``: the run of ``partition`` is
        opened first, and its ``queues`` merged)."""
        with collector_paused():
            run: TaskRun | None = None
            try:
                if callable(chunks):
                    run = TaskRun(self, partition or 0, self.planned_records.get(partition or 0),
                                   read)  # fmt: skip
                    chunks = chunks(run)
                for records in chunks:
                    if not records:
                        continue
                    if run is None:
                        partition = records[0][1]
                        run = TaskRun(self, partition, self.planned_records.get(partition),
                                       read)  # fmt: skip
                    if run.cut:
                        break  # stopped early: the rest waits for the next batch
                    output = run.process(records)
                    if output is not None:
                        yield output
                if run is not None:
                    output = run.end_punctuation()
                    if output is not None:
                        yield output
                    if queues is not None:
                        run.after_merge(queues)
                    finished = run.finish()
                    if self.side_output_dir is None:
                        yield from finished
                    else:
                        run.write_side_output(self.side_output_dir, finished)
                    run.completed = True
            except TaskFailedError as failure:
                if run is not None:
                    run.send_dlq_before_failing(failure)
                raise
            finally:
                if run is not None:
                    run.close()

    def run_queues(
        self,
        partition: int,
        queues: list[InputQueue],
        read: ReadRanges | None = None,
        repartitioned: Mapping[tuple, list] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """``run_records`` over a task's input queues merged in pick order and cut as
        partition_group.py says: its Kafka ranges (read as they are taken) and, for a task
        reading repartition topics, the records its upstream tasks wrote to its partition
        (``repartitioned``, by queue) behind what its repartition buffer holds. A task
        reading no repartition topic is not opened when no queue holds a record."""
        if not self.reads_internal:
            for queue in queues:
                first = next((chunk for chunk in queue.chunks if chunk), None)
                if first is not None:
                    queue.chunks = itertools.chain([first], queue.chunks)
                    break
            else:
                for queue in queues:
                    _close(queue.chunks)
                return iter(())
        given = list(queues)

        def merged(run: TaskRun) -> Iterator[list[ConsumedRecord]]:
            if self.reads_internal:
                run.internal_in = sum(len(records) for records in (repartitioned or {}).values())
                given.extend(run.input_queues(repartitioned or {}))
            return run.merged(given, chunks=True)

        return self.run_records(merged, read, partition=partition, queues=given)

    def queue_limit(self, topic: str, partition: int) -> Any:
        """A Kafka partition's queue limit (partition_group.py): bounded when its planned
        range stops short of its end."""
        return FROM_LAST if (topic, partition) in self.capped else None

    def read_and_run(
        self,
        tasks: Sequence[tuple],
        consumer_settings: Mapping[str, Any],
        spill_dir: str | None = None,
        kafka: kafka_output.InTaskOutputs | None = None,
    ) -> Any:
        """A ``mapInArrow`` function over ``spark.range(len(tasks))``: row i runs the task of
        ``tasks[i]`` = (partition, its ranges: (topic, start, end) each[, its repartitioned
        rows: paths/direct_stages.py]), reading its records
        itself (kafka_input.read_range per range; several merged in the order a task takes
        them), through ``run_records`` (every row in OUTPUT_ARROW).

        With ``spill_dir`` the rows go to ``<spill_dir>/<task id>.arrow`` (Arrow IPC, written
        as they come, renamed into place when the task is done) and nothing is returned to
        Spark: a big batch's rows then never sit in memory, on the executor or the driver
        (batch_outputs.spilled_sink_rows streams them into the sink).

        With ``kafka`` each task produces its Kafka sink and DLQ records itself as it makes
        them (``TaskRun.kafka``): its Kafka sink rows are not returned, its DLQ rows are (for
        the DLQ's Delta mirror)."""
        from streamplatform.runtime.kafka_input import read_range

        assert self.side_output_dir is None

        def run(ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in ids:
                for index in batch.column(0).to_pylist():
                    partition, ranges, *rest = tasks[index]
                    queues = [
                        InputQueue(read_range(consumer_settings, topic, partition, start, end),
                                   (topic, partition, -1), self.queue_limit(topic, partition))
                        for topic, start, end in ranges if end > start
                    ]  # fmt: skip
                    task = f"{self.subtopology}_{partition}"
                    repartitioned = repartition_buffer.queues_of(rest[0]) if rest else None
                    rows = self.run_queues(partition, queues, ReadRanges(ranges, kafka),
                                           repartitioned)  # fmt: skip
                    if spill_dir is None:
                        yield from rows
                    else:
                        _spill(rows, spill_dir, task)

        return run

    def is_current(self, task_id: str, batch: int) -> bool:
        """True when a task that finished ``batch`` here holds the task's state as of the
        last committed batch: ``batch`` is committed and no batch after it ran the task."""
        runs, last = self.task_runs, self.last_committed
        return (
            runs is not None and last is not None and batch <= last < self.batch_id
            and runs.not_run_after(task_id, batch)
        )  # fmt: skip

    def settle_and_restore(self, task: Task) -> int:
        last = -1 if self.last_committed is None else self.last_committed
        for store in task.stores.values():
            prepared = store.prepared_batch_id
            if prepared is not None:
                store.settle(prepared, committed=prepared <= last)
        behind = [
            (name, store) for name, store in task.stores.items()
            if batch_held(store) < last
        ]  # fmt: skip
        if not behind:
            return 0
        files = self.changelog_files
        if files is None:
            writes = self.changelog_writes
            if writes is not None and all(
                writes.none_after(str(task.task_id), batch_held(store))
                and not store.changelog_part_applied
                for _, store in behind
            ):
                # Behind only because the task had no records in the batches since: nothing
                # to replay, the stores just move on to the last committed batch. (A store
                # holding part of a snapshot, from a restore cut short, must replay it whole.)
                for _, store in behind:
                    store.apply_changelog([], {BATCH_MARKER: last})
                return 0
            # A task Spark placed on an executor without its state (or behind on it): it
            # restores here, in this attempt, from the changelog's files in the Delta log.
            if self.changelog_table is None:
                raise RuntimeError(f"Task {task.task_id} must restore, and no changelog is set")
            from streamplatform.runtime.changelog import files_by_task

            files = files_by_task(self.changelog_table)
            self.changelog_files = files
        from streamplatform.runtime.changelog import replay

        return replay(files.get(str(task.task_id), []), dict(behind), last, BATCH_MARKER)


def _close(chunks: Any) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


def _spill(rows: Iterable[pa.RecordBatch], directory: str, task: str) -> None:
    """Write a task's rows to ``<directory>/<task>.arrow`` as they come. The file is there
    only once the task is done: a failed or killed attempt leaves none (storage.write_file: on
    a local disk under a temporary name of its own, as a speculative copy of the task may
    write beside it; on object storage as one upload)."""

    # Over the network (object storage) the bytes cost more than LZ4's CPU; on a local disk
    # the file is read back from the page cache, and uncompressed is faster.
    options = None if storage.is_local(directory) else pa.ipc.IpcWriteOptions(compression="lz4")

    def write(sink: Any) -> None:
        with pa.ipc.new_file(sink, OUTPUT_ARROW, options=options) as writer:
            for batch in rows:
                writer.write_batch(batch)

    storage.write_file(storage.join(directory, f"{task}.arrow"), write)


def _now_ms() -> int:
    return int(time.time() * 1000)
