"""One task's batch inside an executor (executor.py runs it): the task kept open or opened and
restored, its inputs merged and cut (partition_group.py), its records processed, its output
rows built, its Kafka outputs produced and committed, its store writes prepared as the batch."""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import socket
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform import storage
from streamplatform.config import StreamsConfig
from streamplatform.errors.exceptions import TaskFailedError
from streamplatform.home import default_state_dir
from streamplatform.records import ConsumedRecord, ProducerRecord
from streamplatform.runtime import (
    global_tables,
    incarnation,
    kafka_output,
    repartition_buffer,
    task_cache,
)
from streamplatform.runtime.changelog import task_offset_rows
from streamplatform.runtime.faults import crash_point
from streamplatform.runtime.partition_group import InputQueue, MergeResult, merge
from streamplatform.runtime.rows import (
    OUTPUT_ARROW,
    SINK_ARROW,
    binary_column,
    column,
    encode_headers,
    header_structs,
    int64_column,
    output_batch,
)
from streamplatform.runtime.task import Task
from streamplatform.state import IsolationLevel

# The commit offsets of every store also record the batch it holds, under this pseudo-partition.
BATCH_MARKER = ("__streamplatform.batch__", 0)

# A task's sink and DLQ rows leave in Arrow batches of at least this many rows (the last one
# smaller): the task reads in small chunks (kafka_input.CHUNK_RECORDS), its output need not.
OUTPUT_BATCH_ROWS = 10_000


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _store_metrics(task: Task) -> dict[str, dict[str, int]]:
    """Each RocksDB store's metrics (StateDB.rocksdb_metrics) and, at the DEBUG recording
    level, its operations this batch (``put_calls``, ``put_latency_total_ns``,
    ``put_latency_max_ns`` and the others'; store_metrics.py), for the job's metrics."""
    found: dict[str, dict[str, int]] = {}
    for name, store in task.stores.items():
        measure = getattr(store, "rocksdb_metrics", None)
        if measure is not None:
            found[name] = measure()
    for name, facade in task.store_facades().items():
        timings = getattr(facade, "timings", None)
        if timings is None:
            continue
        numbers = found.setdefault(name, {})
        for operation, (calls, total_ns, max_ns) in timings.take().items():
            name = operation.replace("-", "_")
            numbers[f"{name}_calls"] = calls
            numbers[f"{name}_latency_total_ns"] = total_ns
            numbers[f"{name}_latency_max_ns"] = max_ns
    return found


def batch_held(store: Any) -> int:
    """The last batch a store's committed data holds; -1 for none (batch 0 is a batch)."""
    held = store.committed_offset(BATCH_MARKER)
    return -1 if held is None else int(held)


# Topics an extractor chose that exist, per cluster: each is asked of the broker once per
# process, not once per task and batch.
_CHOSEN_TOPICS: dict[str, set[str]] = {}


@dataclass(frozen=True)
class ReadRanges:
    """What a task that reads its own Kafka ranges (the direct path) needs to know of them:
    the ranges of its partition, (topic, start, end) each, and, when it produces its own
    Kafka outputs, how (their transaction commits the range's ends, or where it stopped)."""

    ranges: tuple[tuple[str, int, int], ...]
    kafka: kafka_output.InTaskOutputs | None = None


class TaskRun:
    """One task's batch: its Task, what it processed, what it sent out."""

    def __init__(
        self,
        runner: Any,  # executor.TaskBatchRunner (which imports this module)
        partition: int,
        planned: int | None,
        read: ReadRanges | None = None,
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

        task_dir = Path(state_dir) / self.config["application.id"] / task_id
        if incarnation.is_stale(task_dir, runner.incarnation):
            task_cache.close_under(task_dir)  # kept open from before a reset: closed first
        incarnation.ensure(task_dir, runner.incarnation)
        kept = task_cache.take(
            task_dir, runner.fingerprint, lambda batch: runner.is_current(task_id, batch)
        )
        self.reused = kept is not None
        if kept is not None:
            runner.settle_and_restore(kept)  # applies the last batch's prepared writes
            kept.start_batch()
            kept.wall_clock = clock
            self.task = kept
        else:

            def settle_and_restore(task: Task) -> None:
                self.restored = runner.settle_and_restore(task)

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
        if runner.global_ends and self.task.global_stores:
            global_tables.catch_up(self.task, runner.global_ends,
                                   self.config.kafka_settings("consumer"))  # fmt: skip
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
                limit = runner.queue_limit(topic, partition)
                queues.append(InputQueue(iter([records]), key, limit))
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
        metrics = task.metrics() | task.e2e_latency(int(time.time() * 1000))
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
                  "bound": self.bound, "stores": _store_metrics(task)}  # fmt: skip
        if self.restored:  # where: the executor's host and the state dir it restored into
            report["restored_on"] = f"{socket.gethostname()}:{self.state_dir}"
        progress = json.dumps(report).encode()
        batches.append(output_batch(1, kind="progress", value=[progress], task=self.task_name))
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
        topics, headers, partitions = (list(map(itemgetter(i), records)) for i in (0, 4, 5))
        source_topics, source_partitions = (list(map(itemgetter(i), sources)) for i in (0, 1))
        topic_counts = Counter(topics)
        dlq = task.dlq_topic
        for topic, count in topic_counts.items():
            self.rows[("dlq" if topic == dlq else "sink", topic)] += count
        topic_array = column(topics, pa.string())
        if dlq is None or dlq not in topic_counts:
            kind: Any = pa.repeat(pa.scalar("sink"), n)
        elif len(topic_counts) == 1:
            kind = pa.repeat(pa.scalar("dlq"), n)
        else:
            kind = pc.if_else(pc.equal(topic_array, dlq), "dlq", "sink")
        header_array = header_structs(headers)
        rows = output_batch(
            n, kind=kind, topic=topic_array, key=binary_column(records, 1),
            value=binary_column(records, 2), timestamp=int64_column(records, 3),
            headers=header_array, partition=partitions, source_topic=source_topics,
            source_partition=source_partitions, source_offset=int64_column(sources, 2),
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
        if self.kafka.any_topic_but is not None:  # extractors choose topics: told apart here
            topics = frozenset(t for t in present if t != dlq and self.kafka.is_sink(t))
            known = _CHOSEN_TOPICS.setdefault(self.config["bootstrap.servers"], set())
            for topic in topics - known - self._kafka_topics:
                self._kafka_out.check_chosen_topic(topic)
                known.add(topic)
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
            [binary_column(records, 1), binary_column(records, 2), int64_column(records, 3),
             header_array, pa.repeat(pa.scalar(partition, pa.int32()), n),
             int64_column(sources, 2)],
            schema=SINK_ARROW,
        )  # fmt: skip

    def _version_rows(self) -> list[pa.RecordBatch]:
        versions = self.task.take_versions()
        if not versions:
            return []
        stores, keys, values, timestamps = zip(*versions, strict=True)
        self.rows[("version", None)] += len(versions)
        return [output_batch(len(versions), kind="version", store=stores, key=keys, value=values,
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
            if getattr(store, "KIND", None) == "key_value":
                # Replaying the changelog rebuilds the committed data batch by batch, so a
                # delete of a key it does not hold is a no-op there too: it leaves the
                # changelog, and the prepared batch (nearly all of a dedup's deletes).
                store.transaction.drop_blind_deletes()
            writes = store.staged_writes()
            if store is first and changed:
                writes = writes + task_offset_rows(changed)
            if writes:
                self.rows[("changelog", None)] += len(writes)
                batches.append(output_batch(
                    len(writes), kind="changelog", task=self.task_name, store=name,
                    column_family=column(list(map(itemgetter(0), writes)), pa.string()),
                    key=binary_column(writes, 1), value=binary_column(writes, 2),
                ))  # fmt: skip
            store.prepare(self.runner.batch_id, offsets)
        return batches
