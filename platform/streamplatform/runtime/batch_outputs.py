"""What a micro-batch's tasks report, and the Delta tables their non-sink rows go to.

Every task ends its batch with one progress row (executor.py): its numbers, the offsets it
consumed up to, and how many rows of each kind it sent. ``Progress.of`` sums those rows over
the tasks, so the driver learns what the batch produced without a pass over the output.

``DELTA_OUTPUTS`` names, per row kind, the runtime table it is appended to and its columns (in
the tables' order, ``batch_id`` last). The cached path appends them with Spark
(``StreamingJob._write_outputs``). A streamed batch (one Delta sink) brings them to the driver
either with its sink rows, through Spark (a small batch), or in a parquet side file per task
(a big one, whose tasks ran inside the sink's write): ``append_outputs`` appends them with
delta-rs, each once per batch (same transaction ids as Spark's appends, so a batch replayed on
the cached path skips what was already written).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform.runtime import delta_direct
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
            add_metrics(summed.metrics, progress["metrics"])
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


def side_files(directory: str) -> list[Path]:
    """The tasks' side files of a streamed batch (``<task id>.parquet``; a file still being
    written ends in ``.tmp`` and is not one of them)."""
    return sorted(Path(directory).glob("*.parquet"))


def read_side_files(directory: str) -> pa.Table | None:
    """Every row of a streamed batch's side files (executor.OUTPUT_ARROW); None: no file."""
    import pyarrow.parquet as pq

    files = side_files(directory)
    return pa.concat_tables([pq.read_table(file) for file in files]) if files else None


def progress_of(rows: pa.Table | None) -> Progress:
    """The batch's progress, from its tasks' rows (executor.OUTPUT_ARROW)."""
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
