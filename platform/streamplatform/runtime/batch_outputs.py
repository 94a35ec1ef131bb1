"""What a micro-batch's tasks report, and the Delta tables their non-sink rows go to.

Every task ends its batch with one progress row (executor.py): its numbers, the offsets it
consumed up to, and how many rows of each kind it sent. ``Progress.of`` sums those rows over
the tasks, so the driver learns what the batch produced without a pass over the output.

``DELTA_OUTPUTS`` names, per row kind, the runtime table it is appended to and its columns (in
the tables' order, ``batch_id`` last). The cached path appends them with Spark
(paths/cached.py). A batch on the direct or Delta-write path brings them to the driver
either with its sink rows, through Spark (a small batch), or in a side file per task (a big
one, or one whose tasks ran inside the sink's write): ``append_outputs`` appends them with
delta-rs, each once per batch (same transaction ids as Spark's appends, so a batch replayed on
the cached path skips what was already written).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform import storage
from streamplatform.runtime import delta_direct
from streamplatform.runtime.rows import OUTPUT_ARROW, SINK_COLUMNS
from streamplatform.runtime.task import add_metrics


class DeltaOutput(NamedTuple):
    table: str  # under <root>/<application.id>/
    txn_name: str  # the transaction id is "<application.id>-<txn_name>"
    columns: tuple[str, ...]  # the table's columns, batch_id added last
    partition_by: str | None = None
    renamed: dict[str, str] = {}  # table column -> output column, where they differ

    def sources(self) -> list[tuple[str, str]]:
        """``(output column, table column)`` for each of the table's columns."""
        return [(self.renamed.get(column, column), column) for column in self.columns]


DELTA_OUTPUTS = {
    "changelog": DeltaOutput(
        "_changelog", "changelog", ("task", "store", "seq", "column_family", "key", "value"),
        partition_by="task",
    ),
    "dlq": DeltaOutput(
        "_dlq", "dlq", ("topic", "key", "value", "timestamp", "headers", "source_topic",
                        "source_partition", "source_offset"),
    ),
    "version": DeltaOutput(
        "_versions", "versions", ("store", "key", "value", "valid_from", "task", "seq"),
        renamed={"valid_from": "timestamp"},
    ),
}  # fmt: skip


@dataclass
class Progress:
    """The batch's progress rows, summed over its tasks."""

    metrics: dict[str, int] = field(default_factory=dict)
    # Where the tasks that stopped early stopped, per partition they were given (the other
    # tasks read their ranges to the end).
    consumed: dict[tuple[str, int], int] = field(default_factory=dict)
    present: set[tuple[str, str | None]] = field(default_factory=set)  # (kind, topic) with rows
    changelog_writers: set[str] = field(default_factory=set)  # tasks that wrote changelog rows
    tasks_run: set[str] = field(default_factory=set)  # every task that ran (one row each)
    # (task, where, changelog rows replayed) of each task that restored its state in its run;
    # where: "<executor host>:<state dir>".
    restores: list[tuple[str, str, int]] = field(default_factory=list)
    # Per task, the bound it reported (partition_group.py): None when it read everything.
    bounds: dict[str, int | None] = field(default_factory=dict)
    # Per task, its own numbers (the metrics' task level: process, dropped, lateness, e2e).
    per_task: dict[str, dict[str, int]] = field(default_factory=dict)
    # Per (task, store), its RocksDB metrics at the end of the task's batch.
    per_store: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)

    @property
    def kinds(self) -> set[str]:
        return {kind for kind, _ in self.present}

    @classmethod
    def of(cls, rows: Iterable[tuple[str, bytes | str]]) -> Progress:
        """From ``(task, progress row value)`` pairs."""
        summed = cls()
        for task, value in rows:
            progress = json.loads(value)
            summed.tasks_run.add(task)
            summed.bounds[task] = progress.get("bound")
            add_metrics(summed.metrics, progress["metrics"])
            add_metrics(summed.per_task.setdefault(task, {}), progress["metrics"])
            for store, numbers in progress.get("stores", {}).items():
                summed.per_store[(task, store)] = numbers
            if progress.get("restored_on"):
                summed.restores.append(
                    (task, progress["restored_on"], progress["metrics"]["restored_records"])
                )
            if progress.get("cut"):  # stopped early: where, on each partition it was given
                for topic, partition, offset in progress["consumed"]:
                    summed.consumed[(topic, int(partition))] = int(offset)
            for kind, topic, count in progress["rows"]:
                if count:
                    summed.present.add((kind, topic))
                    if kind == "changelog":
                        summed.changelog_writers.add(task)
        return summed


def side_files(directory: str) -> list[str]:
    """The tasks' side files of a streamed batch: ``<task id>.parquet`` (every row but the
    sink rows, which went through Spark's Delta writer) or ``<task id>.arrow`` (every row,
    executor._spill). A file still being written ends in ``.tmp`` and is not one of them (on
    object storage it is not there until it is whole)."""
    return storage.list_files(directory, ".parquet") + spilled_files(directory)


def spilled_files(directory: str) -> list[str]:
    return storage.list_files(directory, ".arrow")


def _spilled_batches(file: str) -> Iterator[pa.RecordBatch]:
    """A spilled file's batches, one at a time (read, not mapped: a batch is dropped from
    memory once its caller is done with it)."""
    with storage.open_input(file) as source:
        reader = pa.ipc.open_file(source)
        for index in range(reader.num_record_batches):
            yield reader.get_batch(index)


def read_side_files(directory: str) -> pa.Table | None:
    """Every row but the sink rows of a streamed batch's side files (rows.OUTPUT_ARROW);
    None: no file. The sink rows of spilled files are streamed by ``spilled_sink_rows``."""
    files = side_files(directory)
    if not files:
        return None
    tables = [storage.read_parquet(file) for file in files if file.endswith(".parquet")]
    for file in spilled_files(directory):
        for batch in _spilled_batches(file):
            others = batch.filter(pc.not_equal(batch.column("kind"), "sink"))
            if others.num_rows:
                tables.append(pa.Table.from_batches([others]))
    return pa.concat_tables(tables) if tables else pa.table({}, schema=OUTPUT_ARROW)


# The sink table's columns (rows.SINK_COLUMNS, then batch_id).
SINK_TABLE_ARROW = pa.schema(
    [OUTPUT_ARROW.field(column) for column in SINK_COLUMNS] + [pa.field("batch_id", pa.int64())]
)


def sink_rows(
    rows: pa.Table | pa.RecordBatch, batch_id: int, topic: str | None = None
) -> pa.Table | pa.RecordBatch:
    """The sink rows among the tasks' ``rows`` (rows.OUTPUT_ARROW), of ``topic`` when
    given, as rows of the sink table (SINK_TABLE_ARROW)."""
    wanted = pc.equal(rows.column("kind"), "sink")
    if topic is not None:
        wanted = pc.and_(wanted, pc.equal(rows.column("topic"), topic))
    sink = rows.filter(wanted).select(list(SINK_COLUMNS))
    return sink.append_column("batch_id", pa.repeat(pa.scalar(batch_id, pa.int64()), sink.num_rows))


def spilled_sink_rows(
    directory: str, batch_id: int, topic: str | None = None
) -> pa.RecordBatchReader:
    """The sink rows (of ``topic`` when given) of a batch's spilled files as a stream of the
    sink table's rows, read a batch at a time: a delta-rs append of them holds about one
    batch in memory."""

    def batches() -> Iterator[pa.RecordBatch]:
        for file in spilled_files(directory):
            for batch in _spilled_batches(file):
                rows = sink_rows(batch, batch_id, topic)
                if rows.num_rows:
                    yield rows

    return pa.RecordBatchReader.from_batches(SINK_TABLE_ARROW, batches())


def progress_of(rows: pa.Table | None) -> Progress:
    """The batch's progress, from its tasks' rows (rows.OUTPUT_ARROW)."""
    if rows is None:
        return Progress()
    mine = rows.filter(pc.equal(rows.column("kind"), "progress"))
    return Progress.of(zip(*(mine.column(c).to_pylist() for c in ("task", "value")), strict=True))


def append_outputs(
    root: str, app: str, batch_id: int, rows: pa.Table | None, progress: Progress
) -> None:
    """Append the changelog, DLQ and version rows among the tasks' ``rows`` to their Delta
    tables with delta-rs, each once per batch (``progress`` says which kinds are there)."""
    if rows is None:
        return
    kinds = rows.column("kind")
    for kind, output in DELTA_OUTPUTS.items():
        if kind not in progress.kinds:
            continue
        of_kind = rows.filter(pc.equal(kinds, kind))
        pairs = output.sources()
        table = pa.table(
            [of_kind.column(source) for source, _ in pairs]
            + [pa.repeat(pa.scalar(batch_id, pa.int64()), of_kind.num_rows)],
            names=[target for _, target in pairs] + ["batch_id"],
        )
        delta_direct.append(
            f"{root}/{output.table}", table, f"{app}-{output.txn_name}", batch_id,
            [output.partition_by] if output.partition_by else None,
        )  # fmt: skip
