"""What runs inside a Spark executor: one task over its records of one micro-batch.

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
sent them (``_TaskRun.send_dlq_before_failing``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gc
import itertools
import json
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamplatform import storage
from streamplatform.config import StreamsConfig
from streamplatform.dsl.topology import Topology
from streamplatform.errors.exceptions import TaskFailedError
from streamplatform.home import default_state_dir
from streamplatform.records import NO_HEADERS, ConsumedRecord, ProducerRecord
from streamplatform.runtime import kafka_output, repartition_buffer, task_cache
from streamplatform.runtime.changelog import task_offset_rows
from streamplatform.runtime.faults import crash_point
from streamplatform.runtime.partition_group import FROM_LAST, InputQueue, MergeResult, merge
from streamplatform.runtime.task import Task

if TYPE_CHECKING:
    from streamplatform.runtime.changelog import ChangelogFile
from streamplatform.state import IsolationLevel

_new_tuple = tuple.__new__  # builds a NamedTuple without the Python-level __new__

# The commit offsets of every store also record the batch it holds, under this pseudo-partition.
BATCH_MARKER = ("__streamplatform.batch__", 0)
# A task's sink and DLQ rows leave in Arrow batches of at least this many rows (the last one
# smaller): the task reads in small chunks (kafka_input.CHUNK_RECORDS), its output need not.
OUTPUT_BATCH_ROWS = 10_000


OUTPUT_SCHEMA = (
    "kind STRING, topic STRING, key BINARY, value BINARY, timestamp LONG, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, partition INT, "
    "source_topic STRING, source_partition INT, source_offset LONG, "
    "task STRING, store STRING, column_family STRING, seq LONG"
)
HEADERS_ARROW = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
OUTPUT_ARROW = pa.schema([
    ("kind", pa.string()), ("topic", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
    ("timestamp", pa.int64()), ("headers", HEADERS_ARROW),
    ("partition", pa.int32()), ("source_topic", pa.string()), ("source_partition", pa.int32()),
    ("source_offset", pa.int64()), ("task", pa.string()), ("store", pa.string()),
    ("column_family", pa.string()), ("seq", pa.int64()),
])  # fmt: skip
_NO_HEADER_VALUES = pa.array([], HEADERS_ARROW.value_type)

# A job whose only output is one Delta sink streams just the sink rows back to Spark, in the
# sink table's columns, and the Delta write consumes them as the tasks produce them: nothing
# is cached. Every other row (DLQ, changelog, versions, progress) goes to a side file per task
# (``TaskBatchRunner.side_output_dir``), which the driver reads after the write.
SINK_COLUMNS = ("key", "value", "timestamp", "headers", "source_topic", "source_partition",
                "source_offset")  # fmt: skip
# Streamed, the headers cross as JSON (see INPUT_COLUMNS; null: none) and Spark turns them
# back into the table's ARRAY<STRUCT<key, value>>: reading an Arrow list of structs costs the
# JVM more per row than the rest of the row. The job's one source topic is added by Spark.
SINK_ARROW = pa.schema([
    pa.field("key", pa.binary()), pa.field("value", pa.binary()),
    pa.field("timestamp", pa.int64()), pa.field("headers", pa.string()),
    pa.field("source_partition", pa.int32()), pa.field("source_offset", pa.int64()),
])  # fmt: skip
SINK_SCHEMA = (
    "key BINARY, value BINARY, timestamp LONG, headers STRING, source_partition INT, "
    "source_offset LONG"
)

# The input columns, in this order (paths/spark_frames.py selects them). ``headers`` arrives as
# JSON, ``[{"k": name, "v": base64 value}]`` (no "v": a None value), or null when a record has
# none:
# Spark's JVM-to-Arrow writer is several times slower on any array column than on all the
# other columns together, and nearly every record has no header.
INPUT_COLUMNS = ("task_partition", "topic", "partition", "offset", "timestamp", "key", "value",
                 "headers")  # fmt: skip
# Under mapInArrow (one Kafka topic, a Spark partition per Kafka partition) the task knows its
# topic and partition: these columns only (``TaskBatchRunner.stream_topic``).
STREAM_COLUMNS = ("partition", "offset", "timestamp", "key", "value", "headers")


def decode_headers(encoded: str | None) -> list[tuple[str, bytes | None]]:
    """Headers from their input encoding (see ``INPUT_COLUMNS``)."""
    if encoded is None:
        return NO_HEADERS
    return [
        (h["k"], None if h.get("v") is None else base64.b64decode(h["v"]))
        for h in json.loads(encoded)
    ]


def encode_headers(headers: list[tuple[str, bytes | None]]) -> str | None:
    """Headers in their JSON crossing form (see ``INPUT_COLUMNS``); None when there are none."""
    if not headers:
        return None
    return json.dumps([
        {"k": key} if value is None else {"k": key, "v": base64.b64encode(value).decode()}
        for key, value in headers
    ])  # fmt: skip


def table_queues(table: pa.Table, internal_topics: frozenset[str]) -> dict[tuple, list]:
    """A task's rows (INPUT_COLUMNS) as its input queues, each in offset order: one per Kafka
    partition, keyed ``(topic, partition, -1)``, and one per repartition topic and upstream
    task, keyed ``(topic, partition, upstream partition)`` (repartition_buffer.py)."""
    columns = table.select(["topic", "partition", "offset", "timestamp", "key", "value", "headers"])
    queues: dict[tuple, list] = {}
    for topic, partition, offset, timestamp, key, value, headers in zip(
        *(column.to_pylist() for column in columns.columns), strict=True
    ):
        if topic is None:
            continue  # a row that only wakes the task (its repartition buffer)
        upstream = repartition_buffer.upstream_of(offset) if topic in internal_topics else -1
        queues.setdefault((topic, partition, upstream), []).append(
            ConsumedRecord(topic, partition, offset, timestamp, key, value,
                           decode_headers(headers))
        )  # fmt: skip
    for queue in queues.values():
        queue.sort(key=lambda record: record.offset)
    return queues


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class ChangelogWrites:
    """What the driver knows of the batches committed since ``known_from`` without reading
    any table: per task, the last of them that wrote changelog rows (``last_write``) and the
    last of them that ran the task at all (``last_run``)."""

    known_from: int
    last_write: dict[str, int]
    last_run: dict[str, int] = dataclasses.field(default_factory=dict)

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
    ) -> None:
        self.topology = topology
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
        # (see _TaskRun.process), and they are not counted as records in or out.
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
        with _collector_paused():
            partition = int(table["task_partition"][0].as_py())
            by_queue = table_queues(table, self.internal_topics)
            run = _TaskRun(self, partition, planned=table.num_rows)
            run.first_offsets = _first_offsets(table.filter(pc.is_valid(table["topic"])))
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
        return self.run_records(_arrow_records(self.stream_topic, self.subtopology, batches))

    def run_records(
        self,
        chunks: Iterable[list[ConsumedRecord]] | Callable[[_TaskRun], Iterable[list[Any]]],
        read: _ReadRanges | None = None,
        partition: int | None = None,
        queues: list[InputQueue] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """One task's batch: ``chunks`` of records of its Kafka partition in the order the
        task takes them (tuples in ConsumedRecord's layout), each processed as it arrives, its
        output sent on (OUTPUT_ARROW; sink rows only, SINK_ARROW, with ``side_output_dir``).
        ``read``: the ranges the task read itself; with its ``kafka`` the task produces its
        Kafka sink and DLQ records itself (``_TaskRun.kafka``). ``chunks`` may also be a
        function of the task's run giving them (``run_queues``: the run of ``partition`` is
        opened first, and its ``queues`` merged)."""
        with _collector_paused():
            run: _TaskRun | None = None
            try:
                if callable(chunks):
                    run = _TaskRun(self, partition or 0, self.planned_records.get(partition or 0),
                                   read)  # fmt: skip
                    chunks = chunks(run)
                for records in chunks:
                    if not records:
                        continue
                    if run is None:
                        partition = records[0][1]
                        run = _TaskRun(self, partition, self.planned_records.get(partition),
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
        read: _ReadRanges | None = None,
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

        def merged(run: _TaskRun) -> Iterator[list[ConsumedRecord]]:
            if self.reads_internal:
                run.internal_in = sum(len(records) for records in (repartitioned or {}).values())
                given.extend(run.input_queues(repartitioned or {}))
            return run.merged(given, chunks=True)

        return self.run_records(merged, read, partition=partition, queues=given)

    def _limit(self, topic: str, partition: int) -> Any:
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
        records by queue: paths/direct_stages.py]), reading its records
        itself (kafka_input.read_ranges: several topics merged in the order a task takes
        them), through ``run_records`` (every row in OUTPUT_ARROW).

        With ``spill_dir`` the rows go to ``<spill_dir>/<task id>.arrow`` (Arrow IPC, written
        as they come, renamed into place when the task is done) and nothing is returned to
        Spark: a big batch's rows then never sit in memory, on the executor or the driver
        (batch_outputs.spilled_sink_rows streams them into the sink).

        With ``kafka`` each task produces its Kafka sink and DLQ records itself as it makes
        them (``_TaskRun.kafka``): its Kafka sink rows are not returned, its DLQ rows are (for
        the DLQ's Delta mirror)."""
        from streamplatform.runtime.kafka_input import read_range

        assert self.side_output_dir is None

        def run(ids: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in ids:
                for index in batch.column(0).to_pylist():
                    partition, ranges, *rest = tasks[index]
                    queues = [
                        InputQueue(read_range(consumer_settings, topic, partition, start, end),
                                   (topic, partition, -1), self._limit(topic, partition))
                        for topic, start, end in ranges if end > start
                    ]  # fmt: skip
                    task = f"{self.subtopology}_{partition}"
                    rows = self.run_queues(partition, queues, _ReadRanges(ranges, kafka),
                                           rest[0] if rest else None)  # fmt: skip
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

    def _settle_and_restore(self, task: Task) -> int:
        last = -1 if self.last_committed is None else self.last_committed
        for store in task.stores.values():
            prepared = store.prepared_batch_id
            if prepared is not None:
                store.settle(prepared, committed=prepared <= last)
        behind = [
            (name, store) for name, store in task.stores.items()
            if _batch_held(store) < last
        ]  # fmt: skip
        if not behind:
            return 0
        files = self.changelog_files
        if files is None:
            writes = self.changelog_writes
            if writes is not None and all(
                writes.none_after(str(task.task_id), _batch_held(store))
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


def _arrow_records(
    topic: str, subtopology: int, batches: Iterable[pa.RecordBatch]
) -> Iterator[list[ConsumedRecord]]:
    """The records of Arrow batches (STREAM_COLUMNS) that must all be of one Kafka partition
    of ``topic``, in offset order (Spark's Kafka source makes one Spark partition of each):
    a batch that breaks that fails the task."""
    source: tuple[str, int] | None = None
    last_offset = -1
    for batch in batches:
        if batch.num_rows == 0:
            continue
        partitions, offsets = batch.column(0), batch.column(1)
        this = (topic, partitions[0].as_py())
        source = this if source is None else source
        first, last = offsets[0].as_py(), offsets[len(offsets) - 1].as_py()
        if (
            this != source
            or first <= last_offset
            or pc.count_distinct(partitions).as_py() != 1
            or (len(offsets) > 1 and not pc.all(pc.less(offsets[:-1], offsets[1:])).as_py())
        ):
            raise RuntimeError(
                f"Task {subtopology}_{source[1]}: a Spark partition must hold one Kafka "
                f"partition in offset order; got {this} offsets {first}..{last} after "
                f"{source}@{last_offset}"
            )
        last_offset = last
        columns = (repeat(topic), repeat(this[1]), offsets.to_pylist(),
                   batch.column(2).to_pylist(), batch.column(3).to_pylist(),
                   batch.column(4).to_pylist())  # fmt: skip
        headers = batch.column(5)
        if headers.null_count == len(headers):  # nearly always: no record has headers
            # Plain tuples in ConsumedRecord's layout, built by zip (Task.process_all takes them).
            yield list(zip(*columns, repeat(NO_HEADERS), strict=False))  # type: ignore[arg-type]
        else:
            decoded = [NO_HEADERS if h is None else decode_headers(h) for h in headers.to_pylist()]
            yield list(zip(*columns, decoded, strict=False))  # type: ignore[arg-type]


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


def _first_offsets(table: pa.Table) -> dict[tuple[str, int], int]:
    """The first offset of each (topic, partition) in a task's rows."""
    firsts = table.group_by(["topic", "partition"]).aggregate([("offset", "min")])
    return {
        (topic, partition): offset
        for topic, partition, offset in zip(
            *(firsts.column(c).to_pylist() for c in ("topic", "partition", "offset_min")),
            strict=True,
        )
    }


def _batch_held(store: Any) -> int:
    """The last batch a store's committed data holds; -1 for none (batch 0 is a batch)."""
    held = store.committed_offset(BATCH_MARKER)
    return -1 if held is None else int(held)


@dataclass(frozen=True)
class _ReadRanges:
    """What a task that reads its own Kafka ranges (the direct path) needs to know of them:
    the ranges of its partition, (topic, start, end) each, and, when it produces its own
    Kafka outputs, how (their transaction commits the range's ends, or where it stopped)."""

    ranges: tuple[tuple[str, int, int], ...]
    kafka: kafka_output.InTaskOutputs | None = None


class _TaskRun:
    """One task's batch: its Task, what it processed, what it sent out."""

    def __init__(
        self,
        runner: TaskBatchRunner,
        partition: int,
        planned: int | None,
        read: _ReadRanges | None = None,
    ) -> None:
        self.started = time.monotonic()
        self.runner = runner
        self.config = StreamsConfig(runner.settings)
        task_id = f"{runner.subtopology}_{partition}"
        state_dir = runner.state_dirs.get(
            task_id, self.config["state.dir"] or str(default_state_dir())
        )
        self.state_dir = state_dir
        self.restored = 0
        self.completed = False  # set when the whole batch went through: the task may be kept
        batch_time = runner.wall_clock_ms

        def clock() -> int:
            return batch_time

        kept = task_cache.take(
            Path(state_dir) / self.config["application.id"] / task_id, runner.fingerprint,
            lambda batch: runner.is_current(task_id, batch),
        )  # fmt: skip
        self.reused = kept is not None
        if kept is not None:
            runner._settle_and_restore(kept)  # applies the last batch's prepared writes
            kept.start_batch()
            kept.wall_clock = clock
            self.task = kept
        else:

            def settle_and_restore(task: Task) -> None:
                self.restored = runner._settle_and_restore(task)

            self.task = Task(
                runner.topology, runner.topology.subtopologies[runner.subtopology], partition,
                self.config,
                Path(state_dir), lambda topic: runner.partitions.get(topic, 1), wall_clock=clock,
                isolation_level=IsolationLevel.READ_COMMITTED, stores_opened=settle_and_restore,
                runtime_stores=repartition_buffer.runtime_stores(
                    runner.topology, runner.topology.subtopologies[runner.subtopology],
                    self.config["application.id"],
                ),
            )  # fmt: skip
        self.task_name = str(self.task.task_id)
        self.punctuated = False  # the wall-clock punctuations at the start of the batch
        self.settled = time.monotonic()
        self.half = None if planned is None else planned // 2
        self.cut = False  # stopped early: the stores' uncommitted limits, or the merge's cut
        self.merge = MergeResult()  # how the merge of the task's inputs went
        self.bound: int | None = None  # reported to downstream tasks (partition_group.py)
        self.buffered: dict[tuple[str, int], list[tuple]] = {}  # the repartition buffer's
        self.held = 0  # repartitioned records left in the buffer for a later batch
        self.internal_in = 0  # records read from internal topics (TaskBatchRunner.run)
        self.first_offsets: dict[tuple[str, int], int] = {}  # per partition given (run())
        self.rows: Counter[tuple[str, str | None]] = Counter()  # (kind, topic) -> rows sent
        self.sink_ms = 0.0
        # The DLQ rows taken from the task so far: for the side file (side-output mode), and
        # for send_dlq_before_failing. DLQ records are few.
        self.dlq: list[pa.RecordBatch] = []
        self._dlq_split = 0  # side-output mode: DLQ records already split off
        # The direct path with Kafka sinks: the task produces its Kafka sink and DLQ records
        # straight from its output records (no Arrow rows for them), in one transaction of
        # its own under exactly_once_v2, committed in finish() with its consumed offset.
        self.read = read
        self.kafka = None if read is None else read.kafka
        self._kafka_out: kafka_output.TaskOutput | None = None
        self._kafka_topics = frozenset() if self.kafka is None else self.kafka.topics

    def input_queues(self, by_queue: Mapping[tuple, list]) -> list[InputQueue]:
        """The task's input queues from its rows (``table_queues``), each repartition
        topic's queues behind what the repartition buffer held for them, with their limits:
        a Kafka partition's from the plan, an upstream task's from its reported bound."""
        runner = self.runner
        internal = [t for t in runner.internal_topics if t in self.task._sources]
        store = self.task.stores.get(repartition_buffer.BUFFER_STORE)
        self.buffered = repartition_buffer.load(store, internal) if store is not None else {}
        queues = []
        # A bounded upstream task holds the task back even where it sent it nothing.
        partition = self.task.task_id.partition
        keys = set(by_queue) | {(topic, partition, upstream) for topic, upstream in self.buffered}
        keys |= {(topic, partition, upstream) for topic in internal
                 for upstream in runner.repartition_bounds.get(topic, {})}  # fmt: skip
        for key in sorted(keys):
            topic, partition, upstream = key
            records = by_queue.get(key, [])
            if upstream < 0:
                queues.append(InputQueue(iter([records]), key, runner._limit(topic, partition)))
                continue
            held = self.buffered.get((topic, upstream), [])
            limit = runner.repartition_bounds.get(topic, {}).get(upstream)
            queues.append(InputQueue(iter([held + records]), key, limit))
        return queues

    def merged(self, queues: list[InputQueue], chunks: bool = False) -> Iterator[Any]:
        """``queues`` in pick order, cut (partition_group.py): records, or chunks of them.
        Tasks reading repartitioned records take as many as their inputs allow; the others
        at most the task cap."""
        runner = self.runner
        time_of = self.task.ordering_time()  # one queue: asked for its last record only
        cap = None if runner.reads_internal else runner.task_cap
        merged = merge(queues, time_of, cap, self.merge)
        return merged if chunks else itertools.chain.from_iterable(merged)

    def after_merge(self, queues: list[InputQueue]) -> None:
        """What the merge decided: the task stopped early when it did (its consumed
        positions say where), the bound it reports, and its repartition buffer: the
        repartitioned records it did not take are kept for a later batch."""
        merge_result, task = self.merge, self.task
        if self.cut:  # the stores' limits stopped it: its last record is its bound
            self.bound = task.stream_time
        else:
            self.cut = merge_result.stopped
            self.bound = merge_result.bound
        store = task.stores.get(repartition_buffer.BUFFER_STORE)
        if store is None:
            return
        internal = [q for q in queues if q.key[2] >= 0]
        self.held = repartition_buffer.save(
            store, self.buffered,
            {(q.key[0], q.key[2]): q.taken for q in internal},
            {(q.key[0], q.key[2]): list(q.rest()) for q in internal},
        )  # fmt: skip
        if self.held and self.bound is None:
            self.bound = merge_result.bound if merge_result.bound is not None else -1

    def process(self, records: Iterable[ConsumedRecord]) -> pa.RecordBatch | None:
        """Run ``records`` through the task (until a store passes its limits); returns the
        sink and DLQ rows produced so far once there are OUTPUT_BATCH_ROWS of them (the rest
        leave with ``end_punctuation``)."""
        task, half = self.task, self.half
        if not self.punctuated:
            # Kafka Streams fires wall-clock punctuations when its thread polls; here when a
            # task's batch begins (and ends), at the batch's planned wall-clock time.
            self.punctuated = True
            task.punctuate_wall_clock(task.wall_clock())
        limited = task.has_uncommitted_limits() and not self.runner.reads_internal
        first: Iterable[ConsumedRecord]
        if half is not None and task.records_in <= half:
            split = half - task.records_in
            if type(records) is list:  # stays a list: the task decodes a list in bulk
                first, records = records[:split], records[split:]
            else:  # streamed (a whole task's table, TaskBatchRunner.run)
                records = iter(records)
                first = islice(records, split)
            self.cut = task.process_all(first, limited)
            if task.records_in == half and not self.cut:
                crash_point("during_tasks", self.runner.batch_id)
        if not self.cut:
            self.cut = task.process_all(records, limited)  # True: the rest waits a batch
        if len(task.output) < OUTPUT_BATCH_ROWS:
            return None  # taken with a later chunk, or at the end (end_punctuation)
        started = time.monotonic()
        output = self._sink_rows()
        self.sink_ms += time.monotonic() - started
        return output

    def end_punctuation(self) -> pa.RecordBatch | None:
        """Fire the wall-clock punctuations due at the end of the batch, and forward what the
        processors hold until the commit (flush); their sink and DLQ rows."""
        self.task.punctuate_wall_clock(self.task.wall_clock())
        self.task.flush()
        return self._sink_rows()

    def finish(self) -> list[pa.RecordBatch]:
        """Versions, changelog (after preparing or committing the stores) and progress."""
        task = self.task
        if not self.cut and self.half is not None and task.records_in < self.half:
            crash_point("during_tasks", self.runner.batch_id)  # fewer records than planned
        processed = time.monotonic()
        batches = self._version_rows()
        output = time.monotonic()
        batches += self._persist()
        persisted = time.monotonic()
        metrics = task.metrics()
        if self.runner.internal_topics:  # the job's numbers count its own topics only
            internal = self.runner.internal_topics
            internal_in = self.internal_in
            internal_out = sum(
                n for (kind, topic), n in self.rows.items() if kind == "sink" and topic in internal
            )
            metrics["records_in"] -= internal_in
            metrics["records_out"] -= internal_out
            metrics["repartition_records_in"] = internal_in
            metrics["repartition_records_out"] = internal_out
        metrics = metrics | {
            "restored_records": self.restored,
            "tasks_restored": int(self.restored > 0),
            "tasks_reused": int(self.reused),
            "tasks_opened": int(not self.reused),
            "task_ms": int((persisted - self.started) * 1000),
            "task_settle_ms": int((self.settled - self.started) * 1000),
            "task_process_ms": int((processed - self.settled - self.sink_ms) * 1000),
            "task_output_ms": int((output - processed + self.sink_ms) * 1000),
            "task_persist_ms": int((persisted - output) * 1000),
        }
        self._commit_kafka(metrics)
        # A partition given but not reached before an early stop is consumed up to its first
        # record: nothing of it was read.
        positions = self.first_offsets | task.consumed
        if self.cut and self.read is not None:  # the ranges it read itself, reached or not
            partition = task.task_id.partition
            positions = {(topic, partition): offset
                         for topic, offset in self._read_to().items()} | positions  # fmt: skip
        consumed = [[t, p, o] for (t, p), o in positions.items()]
        rows = [[kind, topic, n] for (kind, topic), n in sorted(self.rows.items(), key=str)]
        metrics["repartition_buffered"] = self.held
        report = {"metrics": metrics, "consumed": consumed, "rows": rows, "cut": self.cut,
                  "bound": self.bound}  # fmt: skip
        if self.restored:  # where: the executor's host and the state dir it restored into
            report["restored_on"] = f"{socket.gethostname()}:{self.state_dir}"
        progress = json.dumps(report).encode()
        batches.append(_batch(1, kind="progress", value=[progress], task=self.task_name))
        return batches

    def close(self) -> None:
        """Keep the task open for its next batch when this one went through (task_cache.py);
        otherwise close it: a failed or stopped attempt's task is never used again."""
        self._abort_kafka()  # still open only when the attempt did not finish
        if self.completed:
            task_cache.keep(self.task, self.runner.fingerprint, self.runner.batch_id,
                            self.config["platform.task.cache.idle.ms"])  # fmt: skip
        else:
            self.task.close()

    def send_dlq_before_failing(self, failure: TaskFailedError) -> None:
        """Produce this attempt's DLQ records to the DLQ topic, before the task fails with
        ``failure``.

        Kafka Streams sends a DLQ record as soon as the handler answers, so when one answers
        fail, the DLQ record of the failing record and those of the records resumed before it
        are already on their way. Here every row of the failing task is lost with its Spark
        task (the rows handed to Spark, those still in the task, the side file never written),
        and the batch is not committed. So they are sent here:

        - at least once: acknowledged, as when Kafka Streams restarts a failed task. Every run
          of the failing task sends them, and Spark may run it more than once per batch (a
          retried attempt on a cluster; on the cached path, once per job reading its output),
          and again at each re-run of the batch;
        - exactly_once_v2: in the task's transaction, which is aborted, as Kafka Streams
          aborts a failing task's transaction: read_uncommitted readers see them,
          read_committed ones never do (the task's error names the failing record).

        Raises KafkaOutputError, naming ``failure``, when the broker does not take them.
        """
        self._abort_kafka()  # its own transaction, if open, goes; the DLQ records go below
        self._sink_and_dlq_rows()  # what the task still holds: its DLQ rows join self.dlq
        if self.dlq:
            exactly_once = self.config.exactly_once
            kafka_output.send_before_failing(
                self.config.kafka_settings("producer"), self.task_name, self.dlq,
                self.config["application.id"] if exactly_once else None,
                f"the DLQ records of task {self.task_name} before it fails ({failure})",
            )  # fmt: skip

    def write_side_output(self, directory: str, batches: list[pa.RecordBatch]) -> None:
        """Every row but the sink rows, to one parquet file (atomically: a re-run of the task
        replaces it whole)."""
        import pyarrow.parquet as pq

        table = pa.Table.from_batches(self.dlq + batches, OUTPUT_ARROW)
        storage.write_file(
            storage.join(directory, f"{self.task_name}.parquet"),
            lambda sink: pq.write_table(table, sink, compression="none"),
        )

    def _sink_rows(self) -> pa.RecordBatch | None:
        """Sink and DLQ records produced so far. In side-output mode only the sink rows are
        returned, in SINK_ARROW; DLQ rows are kept for the side file (``self.dlq``)."""
        if self.runner.side_output_dir is not None:
            return self._sink_rows_only()
        return self._sink_and_dlq_rows()

    def _sink_and_dlq_rows(self) -> pa.RecordBatch | None:
        """Sink and DLQ records produced so far, in OUTPUT_ARROW: built column by column, not
        row by row. The DLQ rows among them are also kept in ``self.dlq``."""
        task = self.task
        sources = task.take_output_sources()
        records = task.take_output()
        if not records:
            return None
        if self.kafka is not None:
            records, sources = self._produce_to_kafka(records, sources)
            if not records:
                return None
        n = len(records)
        topics, keys, values, timestamps, headers, partitions = zip(*records, strict=True)
        source_topics, source_partitions, source_offsets = (
            list(map(itemgetter(i), sources)) for i in range(3)
        )
        topic_counts = Counter(topics)
        dlq = task.dlq_topic
        for topic, count in topic_counts.items():
            self.rows[("dlq" if topic == dlq else "sink", topic)] += count
        topic_array = _column(topics, pa.string())
        if dlq is None or dlq not in topic_counts:
            kind: Any = pa.repeat(pa.scalar("sink"), n)
        elif len(topic_counts) == 1:
            kind = pa.repeat(pa.scalar("dlq"), n)
        else:
            kind = pc.if_else(pc.equal(topic_array, dlq), "dlq", "sink")
        header_array = header_structs(headers)
        rows = _batch(
            n, kind=kind, topic=topic_array, key=keys, value=values, timestamp=timestamps,
            headers=header_array, partition=partitions, source_topic=source_topics,
            source_partition=source_partitions, source_offset=source_offsets,
            task=self.task_name,
        )  # fmt: skip
        if dlq in topic_counts:
            self.dlq.append(rows.filter(pc.equal(rows.column(0), "dlq")))
        return rows

    def _produce_to_kafka(
        self, records: list[ProducerRecord], sources: list[tuple]
    ) -> tuple[list[ProducerRecord], list[tuple]]:
        """Produce the Kafka sink and DLQ records among ``records`` (``sources``: the source
        record behind each); returns the others, DLQ records included (the DLQ's Delta mirror
        and the task's numbers take them as rows). The Kafka sink records are counted here."""
        assert self.kafka is not None
        topics, dlq = self._kafka_topics, self.task.dlq_topic
        if self._kafka_out is None:
            assert self.read is not None
            self._kafka_out = self.kafka.open(self.task_name, self.task.task_id.partition,
                                              self.read.ranges)  # fmt: skip
        present = Counter(map(itemgetter(0), records))
        if present.keys() <= topics:  # every record to a Kafka sink: the common case
            self._kafka_out.produce_sink_records(records, sources)
            for topic, count in present.items():
                self.rows[("sink", topic)] += count
            return [], []
        produce = self._kafka_out.produce_record
        kept: list[ProducerRecord] = []
        kept_sources: list[tuple] = []
        sinks: list[ProducerRecord] = []
        sink_sources: list[tuple] = []
        sent: Counter[str] = Counter()
        for record, source in zip(records, sources, strict=True):
            topic = record[0]
            if topic in topics:
                sinks.append(record)
                sink_sources.append(source)
                sent[topic] += 1
                continue
            if topic == dlq:
                produce("dlq", topic, record[1], record[2], record[3], record[4] or None,
                        record[5], source[:3])  # fmt: skip
            kept.append(record)
            kept_sources.append(source)
        self._kafka_out.produce_sink_records(sinks, sink_sources)
        for topic, count in sent.items():
            self.rows[("sink", topic)] += count
        return kept, kept_sources

    def _commit_kafka(self, metrics: dict[str, int]) -> None:
        """Commit the task's Kafka outputs with the offset the batch consumes on its
        partition: where the task stopped, when it stopped early; else its range's end."""
        if self.kafka is None:
            return
        if self._kafka_out is None:  # nothing to produce: no transaction of this task
            metrics |= {"kafka_records_produced": 0, "kafka_tasks_already_committed": 0}
            return
        partition = self.task.task_id.partition
        read_to = self._read_to().items()
        positions = [(topic, partition, offset) for topic, offset in read_to]
        # A task reading no Kafka range (after a repartition) commits its marker offset.
        produced = self._kafka_out.commit(positions or None)
        metrics["kafka_records_produced"] = produced
        metrics["kafka_tasks_already_committed"] = int(self._kafka_out.already_committed)
        self._kafka_out.close()
        self._kafka_out = None

    def _read_to(self) -> dict[str, int]:
        """Topic -> where the task's read of it ends, for a task that read its own ranges:
        where it stopped on each, when it stopped early (a range not reached: its start);
        else each range's end."""
        assert self.read is not None
        partition = self.task.task_id.partition
        if not self.cut:
            return {topic: end for topic, _, end in self.read.ranges}
        consumed = self.task.consumed
        return {topic: consumed.get((topic, partition), start)
                for topic, start, _ in self.read.ranges}  # fmt: skip

    def _abort_kafka(self) -> None:
        """Give up the task's open Kafka transaction (a failed attempt); produce no more."""
        self.kafka = None
        if self._kafka_out is not None:
            try:
                self._kafka_out.abort()
            finally:
                self._kafka_out.close()
                self._kafka_out = None

    def _sink_rows_only(self) -> pa.RecordBatch | None:
        task = self.task
        if task.dlq_records > self._dlq_split:
            # Rare: DLQ rows among them. The general path, then split by kind.
            self._dlq_split = task.dlq_records
            both = self._sink_and_dlq_rows()
            assert both is not None
            sink = both.filter(pc.equal(both.column(0), "sink"))
            encoded = [
                encode_headers([(h["key"], h["value"]) for h in structs])
                for structs in sink.column("headers").to_pylist()
            ]
            return pa.RecordBatch.from_arrays(
                [pa.array(encoded, pa.string()) if name == "headers" else sink.column(name)
                 for name in SINK_ARROW.names],
                schema=SINK_ARROW,
            )  # fmt: skip
        sources = task.take_output_sources()
        records = task.take_output()
        if not records:
            return None
        n = len(records)
        self.rows[("sink", records[0][0])] += n  # the job's one sink (see SINK_COLUMNS)
        # Every record comes from this task's one partition (the task's input is one).
        partition = self.task.task_id.partition
        headers = list(map(itemgetter(4), records))
        if any(headers):
            header_array = pa.array([encode_headers(h) for h in headers], pa.string())
        else:
            header_array = pa.nulls(n, pa.string())
        return pa.RecordBatch.from_arrays(
            [pa.array(list(map(itemgetter(1), records)), pa.binary()),
             pa.array(list(map(itemgetter(2), records)), pa.binary()),
             pa.array(list(map(itemgetter(3), records)), pa.int64()), header_array,
             pa.repeat(pa.scalar(partition, pa.int32()), n),
             pa.array(list(map(itemgetter(2), sources)), pa.int64())],
            schema=SINK_ARROW,
        )  # fmt: skip

    def _version_rows(self) -> list[pa.RecordBatch]:
        versions = self.task.take_versions()
        if not versions:
            return []
        stores, keys, values, timestamps = zip(*versions, strict=True)
        self.rows[("version", None)] += len(versions)
        return [_batch(len(versions), kind="version", store=stores, key=keys, value=values,
                       timestamp=timestamps, task=self.task_name)]  # fmt: skip

    def _persist(self) -> list[pa.RecordBatch]:
        """Prepare the stores' writes as this batch (applied when the driver commits it, under
        either guarantee); they also leave as changelog."""
        task = self.task
        task.before_commit()
        batches = []
        offsets = task.offsets() | {BATCH_MARKER: self.runner.batch_id}
        # The task's own offsets that changed, with its first store's writes (the store
        # Task._restore_schedule reads them from): a restore from the changelog keeps them.
        first = next(iter(task.stores.values()), None)
        changed = {
            tp: offset for tp, offset in task.time_offsets().items()
            if first is not None and first.committed_offset(tp) != offset
        }  # fmt: skip
        for name, store in task.stores.items():
            writes = store.staged_writes()
            if writes and getattr(store, "KIND", None) == "key_value":
                writes = _without_blind_deletes(store, writes)
            if store is first and changed:
                writes = writes + task_offset_rows(changed)
            if writes:
                column_families, keys, values = zip(*writes, strict=True)
                self.rows[("changelog", None)] += len(writes)
                batches.append(_batch(
                    len(writes), kind="changelog", task=self.task_name, store=name,
                    column_family=column_families, key=keys, value=values,
                ))  # fmt: skip
            store.prepare(self.runner.batch_id, offsets)
        return batches


def _without_blind_deletes(
    store: Any, writes: list[tuple[str, bytes, bytes | None]]
) -> list[tuple[str, bytes, bytes | None]]:
    """``writes`` less the deletes of keys the store's committed data does not hold.

    Replaying the changelog rebuilds the committed data batch by batch, so such a delete is a
    no-op there too; leaving it out changes nothing but the rows shipped and stored. A
    deduplication store puts and expires most of its ids within one batch: without this,
    nearly all of its changelog would be deletes of ids that were never committed.
    """
    committed = store.get  # a key-value store reads committed data only
    return [write for write in writes if write[2] is not None or committed(write[1]) is not None]


def header_structs(headers: Sequence[list[tuple[str, bytes | None]]]) -> pa.Array:
    """Each record's headers as the output tables' ARRAY<STRUCT<key, value>> (HEADERS_ARROW);
    built without a Python object per record when no record has any, as is nearly always."""
    if not any(headers):  # len(headers) empty lists
        return pa.ListArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), len(headers) + 1), _NO_HEADER_VALUES,
            HEADERS_ARROW,
        )  # fmt: skip
    return pa.array(
        [[{"key": key, "value": value} for key, value in h] for h in headers], HEADERS_ARROW
    )


_OFTEN_REPEATED = frozenset({"topic", "partition", "source_topic", "source_partition"})


def _column(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array; a single value repeated (a task's output nearly always
    has one topic, one source partition, no partition chosen) without a conversion per row."""
    if values and values.count(values[0]) == len(values):
        return pa.repeat(pa.scalar(values[0], arrow_type), len(values))
    return pa.array(values, type=arrow_type)


def _batch(rows: int, **columns: Any) -> pa.RecordBatch:
    """An output batch of ``rows`` rows; a column given as a sequence or an Arrow array is
    taken as is, a scalar is repeated, a missing column is null. ``seq`` numbers the rows
    when not given."""
    arrays = []
    for field in OUTPUT_ARROW:
        value = columns.get(field.name)
        if isinstance(value, pa.Array):
            arrays.append(value)
        elif isinstance(value, list | tuple):
            if field.name in _OFTEN_REPEATED:
                arrays.append(_column(value, field.type))
            else:
                arrays.append(pa.array(value, type=field.type))
        elif field.name == "seq":
            # From numpy: pa.array(range(rows)) converts row by row (2.8 ms per 10k rows).
            arrays.append(pa.array(np.arange(rows, dtype=np.int64)))
        elif value is None:
            arrays.append(pa.nulls(rows, field.type))
        else:
            arrays.append(pa.repeat(pa.scalar(value, field.type), rows))
    return pa.RecordBatch.from_arrays(arrays, schema=OUTPUT_ARROW)
