"""What runs inside a Spark executor: one task over its records of one micro-batch.

``TaskBatchRunner`` is pickled to the executors (a plain object: the topology, the settings,
the batch's numbers) and called once per task with that task's rows (``applyInPandas``):

1. open the task's stores under ``state.dir/<application.id>/<task id>/``;
2. exactly_once_v2: settle the previous batch's prepared writes — apply them when that batch
   is in the commit log, discard them when it is not;
3. restore from the Delta changelog when the local state is behind the commit log (a new
   executor, a wiped state dir) and report how many changelog rows it replayed;
4. process the records, per partition in offset order, across partitions by timestamp (as
   Kafka Streams picks records); stop early when a store passes its uncommitted limits;
5. persist the store writes: *prepare* them as batch N (exactly_once_v2), or commit them
   (at_least_once); either way they also leave as changelog rows;
6. return the output rows: sink, DLQ, changelog and version rows, and one progress row.

The store writes of a batch always go through a transaction (READ_COMMITTED) here, in both
modes: it is what lets them leave as the batch's changelog. Under at_least_once they are
committed by the task at the end of its batch, before the driver's commit point.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamplatform.config import StreamsConfig
from streamplatform.dsl.topology import Topology
from streamplatform.records import ConsumedRecord
from streamplatform.runtime.faults import crash_point
from streamplatform.runtime.task import Task
from streamplatform.state import IsolationLevel

_NO_HEADERS: list = []  # shared by records without headers; never modified

# The commit offsets of every store also record the batch it holds, under this pseudo-partition.
BATCH_MARKER = ("__streamplatform.batch__", 0)

OUTPUT_SCHEMA = (
    "kind STRING, topic STRING, key BINARY, value BINARY, timestamp LONG, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, partition INT, "
    "source_topic STRING, source_partition INT, source_offset LONG, "
    "task STRING, store STRING, column_family STRING, seq LONG"
)
OUTPUT_ARROW = pa.schema([
    ("kind", pa.string()), ("topic", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
    ("timestamp", pa.int64()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("partition", pa.int32()), ("source_topic", pa.string()), ("source_partition", pa.int32()),
    ("source_offset", pa.int64()), ("task", pa.string()), ("store", pa.string()),
    ("column_family", pa.string()), ("seq", pa.int64()),
])  # fmt: skip


def records_in_pick_order(table: pa.Table) -> Iterator[ConsumedRecord]:
    """Per partition in offset order; across partitions the head with the lowest timestamp
    first (ties: topic, partition), as Kafka Streams' partition group does."""
    columns = table.select(["topic", "partition", "offset", "timestamp", "key", "value", "headers"])
    queues: dict[tuple[str, int], list[ConsumedRecord]] = {}
    for topic, partition, offset, timestamp, key, value, headers in zip(
        *(column.to_pylist() for column in columns.columns), strict=True
    ):
        queues.setdefault((topic, partition), []).append(
            ConsumedRecord(topic, partition, offset, timestamp, key, value,
                           [(h["key"], h["value"]) for h in headers] if headers else _NO_HEADERS)
        )  # fmt: skip
    for queue in queues.values():
        queue.sort(key=lambda record: record.offset)
    if len(queues) == 1:
        yield from next(iter(queues.values()))
        return
    positions = {tp: 0 for tp in queues}
    heads = [(q[0].timestamp, tp) for tp, q in queues.items()]
    heapq.heapify(heads)
    while heads:
        _, tp = heapq.heappop(heads)
        queue, position = queues[tp], positions[tp]
        yield queue[position]
        positions[tp] = position + 1
        if position + 1 < len(queue):
            heapq.heappush(heads, (queue[position + 1].timestamp, tp))


class TaskBatchRunner:
    """Runs one micro-batch of one task; see the module docstring."""

    def __init__(
        self,
        topology: Topology,
        settings: dict[str, Any],
        batch_id: int,
        last_committed: int | None,
        changelog_files: dict[str, list[str]],
        partitions: dict[str, int],
        state_dirs: dict[str, str] | None = None,
    ) -> None:
        self.topology = topology
        self.state_dirs = state_dirs or {}  # task id -> its instance's state root (placement)
        self.settings = settings
        self.batch_id = batch_id
        self.last_committed = last_committed
        self.changelog_files = changelog_files  # task id -> parquet files of its changelog
        self.partitions = partitions

    def run(self, table: pa.Table) -> pa.Table:
        """One task's rows of the batch (all of one ``task_partition``) in, its output out."""
        started = time.monotonic()
        config = StreamsConfig(self.settings)
        partition = int(table["task_partition"][0].as_py())
        state_dir = self.state_dirs.get(f"0_{partition}", config["state.dir"])
        task = Task(
            self.topology, self.topology.subtopologies[0], partition, config,
            Path(state_dir), lambda topic: self.partitions.get(topic, 1),
            isolation_level=IsolationLevel.READ_COMMITTED,
        )  # fmt: skip
        tables: list[pa.Table] = []
        try:
            restored = self._settle_and_restore(task)
            half = table.num_rows // 2
            for index, record in enumerate(records_in_pick_order(table)):
                if index == half:
                    crash_point("during_tasks", self.batch_id)
                task.process(record)
                if task.needs_early_commit():
                    break  # the rest of the batch waits for the next one
            tables += self._output_tables(task)
            tables += self._persist(task, config.exactly_once)
            metrics = task.metrics() | {
                "restored_records": restored,
                "task_ms": int((time.monotonic() - started) * 1000),
            }
            consumed = [[t, p, o] for (t, p), o in task.consumed.items()]
            progress = json.dumps({"metrics": metrics, "consumed": consumed}).encode()
            tables.append(_table(1, kind="progress", value=[progress], task=str(task.task_id)))
        finally:
            task.close()
        return pa.concat_tables(tables)

    def run_partition(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow`` entry point: a Spark partition is one Kafka partition, one task."""
        table = pa.Table.from_batches(list(batches))
        if table.num_rows:
            yield from self.run(table).to_batches()

    def _settle_and_restore(self, task: Task) -> int:
        last = -1 if self.last_committed is None else self.last_committed
        for store in task.stores.values():
            prepared = store.prepared_batch_id
            if prepared is not None:
                store.settle(prepared, committed=prepared <= last)
        behind = [
            (name, store) for name, store in task.stores.items()
            if (store.committed_offset(BATCH_MARKER) or -1) < last
        ]  # fmt: skip
        if not behind:
            return 0
        from streamplatform.runtime.changelog import replay

        return replay(
            self.changelog_files.get(str(task.task_id), []), dict(behind), last, BATCH_MARKER
        )

    def _output_tables(self, task: Task) -> list[pa.Table]:
        """Sink and DLQ records, then versions: built column by column, not row by row."""
        tables = []
        sources = task.take_output_sources()
        records = task.take_output()
        if records:
            dlq = task.dlq_topic
            tables.append(_table(
                len(records),
                kind=["dlq" if r.topic == dlq else "sink" for r in records],
                topic=[r.topic for r in records],
                key=[r.key for r in records],
                value=[r.value for r in records],
                timestamp=[r.timestamp for r in records],
                headers=[_header_structs(r.headers) for r in records],
                partition=[r.partition for r in records],
                source_topic=[s[0] for s in sources],
                source_partition=[s[1] for s in sources],
                source_offset=[s[2] for s in sources],
                task=str(task.task_id),
            ))  # fmt: skip
        versions = task.take_versions()
        if versions:
            tables.append(_table(
                len(versions), kind="version", store=[v[0] for v in versions],
                key=[v[1] for v in versions], value=[v[2] for v in versions],
                timestamp=[v[3] for v in versions], task=str(task.task_id),
            ))  # fmt: skip
        return tables

    def _persist(self, task: Task, exactly_once: bool) -> list[pa.Table]:
        """Prepare (exactly once) or commit the stores' writes; they also leave as changelog."""
        tables = []
        offsets = task.offsets() | {BATCH_MARKER: self.batch_id}
        for name, store in task.stores.items():
            writes = store.staged_writes()
            if writes:
                tables.append(_table(
                    len(writes), kind="changelog", task=str(task.task_id), store=name,
                    column_family=[w[0] for w in writes], key=[w[1] for w in writes],
                    value=[w[2] for w in writes],
                ))  # fmt: skip
            if exactly_once:
                store.prepare(self.batch_id, offsets)
            else:
                store.commit(offsets)
        return tables


def _header_structs(headers: list[tuple[str, bytes | None]]) -> list[dict[str, Any]]:
    return [{"key": key, "value": value} for key, value in headers] if headers else []


def _table(rows: int, **columns: Any) -> pa.Table:
    """An output table of ``rows`` rows; a column given as a list is taken as is, a scalar is
    repeated, a missing column is null. ``seq`` numbers the rows when not given."""
    columns.setdefault("seq", list(range(rows)))
    arrays = []
    for field in OUTPUT_ARROW:
        value = columns.get(field.name)
        if isinstance(value, list):
            arrays.append(pa.array(value, type=field.type))
        else:
            arrays.append(pa.array([value] * rows, type=field.type))
    return pa.Table.from_arrays(arrays, schema=OUTPUT_ARROW)
