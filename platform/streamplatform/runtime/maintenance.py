"""Table maintenance of a job's runtime tables: changelog snapshots, compaction, checkpoints,
vacuum. Between batches, after a crash, or while the job runs: each change is one Delta commit,
and one that conflicts with the job's appends fails without effect (run it again).

Without it every batch adds a file per task to ``_changelog`` (and a file to each other
table it writes), so restores and table reads grow with the job's age. :func:`maintain`:

1. **Changelog snapshots.** Per task, the changelog of the committed batches up to the last
   committed one, S, is replaced by one snapshot: the last write of every key (by batch and
   write order) that is not a delete, as batch S, with negative ``seq`` (which marks a
   snapshot file in the Delta log's statistics). One Delta commit per task removes the files
   it replaces and adds the snapshot (``predicate``: the task, ``batch_id <= S``), so a
   reader sees either the old files or the snapshot, never both. A restore then reads the
   snapshot and the tail; a copy that holds a batch before S is replaced by the snapshot
   (changelog.replay). Rows of a batch after S (written, maybe not yet committed) are left
   alone, so a re-run of that batch still finds them and skips its append.
2. **Compaction** of the small files of ``_offsets``, ``_dlq`` and ``_versions``
   (``optimize.compact``: rows unchanged, ``dataChange = false``).
3. **Checkpoints** of every runtime table, ``_commits`` included. ``_commits`` gets nothing
   else: it is the claim's table (claim.py), where any new version would fence the running
   driver.
4. **Vacuum** of the files those steps removed, older than ``retention_hours`` (default a
   week, at least an hour): a restore that listed the files before a snapshot still reads
   them.

Re-runs stay exactly once: every runtime append is made under a Delta transaction id
(``txnAppId``/``txnVersion``) that Spark and delta-rs carry in every checkpoint, and nothing
here expires them. A table property ``delta.setTransactionRetentionDuration`` would: maintain
refuses a table that has one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform import storage
from streamplatform.exceptions import StreamPlatformError
from streamplatform.runtime import delta_direct
from streamplatform.runtime.changelog import ChangelogFile, files_by_task
from streamplatform.runtime.delta_direct import table_or_none

log = logging.getLogger(__name__)

COMPACTED_TABLES = ("_offsets", "_dlq", "_versions")
RUNTIME_TABLES = ("_changelog", "_offsets", "_commits", "_dlq", "_versions")
TRANSACTION_RETENTION = "delta.setTransactionRetentionDuration"
MIN_RETENTION_HOURS = 1.0
# The one row of a snapshot without live keys (no store has this name: replay skips it).
SNAPSHOT_MARKER = "__streamplatform.snapshot__"


class MaintenanceError(StreamPlatformError, RuntimeError):
    """A table cannot be maintained safely (the message names it and why)."""


@dataclass
class MaintenanceReport:
    """What one :func:`maintain` did."""

    snapshot_batch: int | None = None  # the last committed batch the snapshots hold
    tasks_snapshotted: int = 0
    changelog_files_replaced: int = 0
    changelog_rows_before: int = 0
    changelog_rows_after: int = 0
    files_compacted: dict[str, int] = field(default_factory=dict)  # table -> files removed
    files_vacuumed: dict[str, int] = field(default_factory=dict)  # table -> files deleted
    duration_ms: int = 0

    def metadata(self) -> dict[str, int]:
        """The numbers, flat (for logs and Dagster metadata)."""
        return {
            "snapshot_batch": -1 if self.snapshot_batch is None else self.snapshot_batch,
            "tasks_snapshotted": self.tasks_snapshotted,
            "changelog_files_replaced": self.changelog_files_replaced,
            "changelog_rows_before": self.changelog_rows_before,
            "changelog_rows_after": self.changelog_rows_after,
            "files_compacted": sum(self.files_compacted.values()),
            "files_vacuumed": sum(self.files_vacuumed.values()),
            "duration_ms": self.duration_ms,
        }


def maintain(
    app_root: str,
    application_id: str,
    *,
    min_changelog_files: int = 10,
    retention_hours: float = 168.0,
    settings: Mapping[str, Any] | None = None,
) -> MaintenanceReport:
    """Maintain the runtime tables under ``app_root`` (``<delta root>/<application.id>``).

    ``settings``: the job's, for the storage settings of a root on object storage
    (``platform.storage.s3.*``; without them, the standard AWS environment).

    ``min_changelog_files``: a task's changelog is snapshotted once it has at least this many
    files up to the last committed batch (a snapshot counts as one).
    """
    if min_changelog_files < 2:
        raise ValueError(f"min_changelog_files must be at least 2, got {min_changelog_files}")
    if retention_hours < MIN_RETENTION_HOURS:
        raise ValueError(
            f"retention_hours must be at least {MIN_RETENTION_HOURS:g}: a restore that listed "
            f"the changelog's files before a snapshot may still read them; got {retention_hours}"
        )
    from streamplatform.runtime.logs import CommitLog

    storage.configure({**(settings or {}), "platform.delta.root": app_root})
    started = time.monotonic()
    report = MaintenanceReport()
    for name in RUNTIME_TABLES:
        _check_transaction_retention(f"{app_root}/{name}")
    last = CommitLog(f"{app_root}/_commits", application_id).last()
    if last is not None:
        report.snapshot_batch = last.batch_id
        snapshot_changelog(f"{app_root}/_changelog", last.batch_id, min_changelog_files, report)
    for name in COMPACTED_TABLES:
        table = table_or_none(f"{app_root}/{name}")
        if table is not None:
            metrics = table.optimize.compact()
            report.files_compacted[name] = int(metrics.get("numFilesRemoved", 0))
    for name in RUNTIME_TABLES:  # loaded after the steps above: their newest version
        table = table_or_none(f"{app_root}/{name}")
        if table is None:
            continue
        table.create_checkpoint()
        if name != "_commits":
            deleted = table.vacuum(
                retention_hours=int(retention_hours), dry_run=False,
                enforce_retention_duration=False,
            )  # fmt: skip
            report.files_vacuumed[name] = len(deleted)
    report.duration_ms = int((time.monotonic() - started) * 1000)
    log.info("%s maintenance: %s", application_id, report.metadata())
    return report


def snapshot_changelog(
    path: str, up_to_batch: int, min_files: int, report: MaintenanceReport | None = None
) -> MaintenanceReport:
    """Replace each task's changelog up to ``up_to_batch`` by a snapshot (see the module
    docstring), for the tasks with at least ``min_files`` such files."""
    report = report or MaintenanceReport(snapshot_batch=up_to_batch)
    for task, files in sorted(files_by_task(path).items()):
        done = [f for f in files if f.last_batch <= up_to_batch]
        if len(done) < min_files:
            continue
        rows_before, rows_after = _snapshot_task(path, task, done)
        report.tasks_snapshotted += 1
        report.changelog_files_replaced += len(done)
        report.changelog_rows_before += rows_before
        report.changelog_rows_after += rows_after
    return report


def _snapshot_task(path: str, task: str, files: list[ChangelogFile]) -> tuple[int, int]:
    columns = ["store", "batch_id", "seq", "column_family", "key", "value"]
    rows = pa.concat_tables([storage.read_parquet(f.path, columns=columns) for f in files])
    batch = max(f.last_batch for f in files)
    # The last write of each key: rows in (batch, seq) order, the highest position per key.
    ordered = rows.take(pc.sort_indices(rows, [("batch_id", "ascending"), ("seq", "ascending")]))
    ordered = ordered.append_column("position", pa.array(range(ordered.num_rows), pa.int64()))
    last = ordered.group_by(["store", "column_family", "key"]).aggregate([("position", "max")])
    latest = ordered.take(last.column("position_max"))
    live = latest.filter(pc.is_valid(latest.column("value")))
    live = live.take(pc.sort_indices(live, [("store", "ascending"), ("key", "ascending")]))
    if live.num_rows == 0:  # a snapshot must still be there to say "nothing as of batch S"
        live = pa.table({"store": [SNAPSHOT_MARKER], "column_family": [""], "key": [b""],
                         "value": [b""]})  # fmt: skip
    n = live.num_rows
    table = table_or_none(path)
    schema = pa.schema(table.schema().to_arrow())
    snapshot = pa.table({
        "task": pa.repeat(pa.scalar(task, pa.string()), n),
        "store": live.column("store"),
        "seq": pa.array(range(-n, 0), pa.int64()),  # < 0: a snapshot (ChangelogFile.snapshot)
        "column_family": live.column("column_family"),
        "key": live.column("key"),
        "value": live.column("value"),
        "batch_id": pa.repeat(pa.scalar(batch, pa.int64()), n),
    }).select(schema.names).cast(schema)  # fmt: skip
    delta_direct.write(
        table, snapshot, mode="overwrite",
        predicate=f"task = '{_quoted(task)}' AND batch_id <= {int(batch)}",
    )  # fmt: skip
    return rows.num_rows, n


def _quoted(value: str) -> str:
    return value.replace("'", "''")


def _check_transaction_retention(path: str) -> None:
    table: Any = table_or_none(path)
    if table is None:
        return
    retention = table.metadata().configuration.get(TRANSACTION_RETENTION)
    if retention:
        raise MaintenanceError(
            f"{path} sets {TRANSACTION_RETENTION}={retention}: Delta would forget the "
            "transaction ids that make a re-run batch skip what it already wrote. Unset it "
            f"(ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES ('{TRANSACTION_RETENTION}'))."
        )
