"""The offset log and the commit log: two small Delta tables that make a micro-batch replayable.

Like the ``offsets/`` and ``commits/`` folders of a Spark checkpoint, but queryable:

- offset log (``<root>/<application.id>/_offsets``): one row per source partition of batch N,
  ``(batch_id, topic, partition, start_offset, end_offset)``, appended *before* the batch
  runs (write-ahead). A batch that was planned but never committed is re-run with exactly the
  same ranges.
- commit log (``<root>/<application.id>/_commits``): one row per committed batch with the
  offsets each partition was actually consumed up to (a task may stop early to keep its
  uncommitted state bounded), the batch's numbers and the job's store layout (upgrade.py:
  the next start compares its own with it). Appending it is the commit point.

Both appends are idempotent (a Delta transaction id, ``<application.id>-offsets`` /
``-commits``, with the batch id as its version), so a crash between writing and recording can
never log a batch twice; the commit log's transaction version is also how the newest committed
batch is found without reading the table. The driver writes them with delta-rs
(delta_direct.py): a few rows per batch, appended in milliseconds instead of a Spark job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from streamplatform.runtime import delta_direct
from streamplatform.runtime.claim import JobClaim

OFFSETS_SCHEMA = pa.schema([
    ("batch_id", pa.int64()), ("topic", pa.string()), ("partition", pa.int32()),
    ("start_offset", pa.int64()), ("end_offset", pa.int64()), ("fingerprint", pa.string()),
    ("wall_clock_ms", pa.int64()),
])  # fmt: skip
COMMITS_SCHEMA = pa.schema([
    ("batch_id", pa.int64()), ("committed_at", pa.timestamp("us", tz="UTC")),
    ("consumed", pa.string()), ("records_in", pa.int64()), ("records_out", pa.int64()),
    ("dlq_records", pa.int64()), ("duplicates_dropped", pa.int64()),
    ("duration_ms", pa.int64()), ("metrics", pa.string()), ("guarantee", pa.string()),
    ("layout", pa.string()),
])  # fmt: skip

Ranges = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> [start, end)
# A global table's topic in the offset log: the offset its tasks catch up to before the batch,
# as a row ``(GLOBAL_PREFIX + topic, partition, end, end)`` (no Kafka topic holds a ":").
GLOBAL_PREFIX = "global:"


@dataclass(frozen=True)
class CommittedBatch:
    batch_id: int
    consumed: dict[tuple[str, int], int]  # next offset to read per source partition
    metrics: dict[str, Any]
    guarantee: str | None = None  # processing.guarantee; None in rows older than the column
    layout: str | None = None  # the store layout (upgrade.py, JSON); None: older rows


@dataclass(frozen=True)
class PlannedBatch:
    ranges: Ranges
    fingerprint: str | None  # of the job that planned it (fingerprint.py); None: not logged
    # The batch's wall-clock time (ms since the epoch), fixed when it was planned: its
    # wall-clock punctuations and context.current_system_time_ms() use it, so that a replay
    # of the batch sees the time its first attempt saw. None: planned before it was logged.
    wall_clock_ms: int | None = None
    # Each global table partition's offset the batch's tasks catch up to (global_tables.py).
    global_ends: dict[tuple[str, int], int] = field(default_factory=dict)


class OffsetLog:
    def __init__(self, path: str, application_id: str) -> None:
        self.path, self.txn_app_id = path, f"{application_id}-offsets"

    def append(
        self,
        batch_id: int,
        ranges: Ranges,
        fingerprint: str,
        wall_clock_ms: int | None = None,
        global_ends: Mapping[tuple[str, int], int] | None = None,
    ) -> bool:
        """Log the plan of ``batch_id`` with its wall-clock time and its global tables' ends;
        False when a plan of it was logged before (then that plan holds, and this one was not
        written)."""
        rows = [
            (batch_id, t, p, start, end, fingerprint, wall_clock_ms)
            for (t, p), (start, end) in sorted(ranges.items())
        ] + [
            (batch_id, GLOBAL_PREFIX + t, p, end, end, fingerprint, wall_clock_ms)
            for (t, p), end in sorted((global_ends or {}).items())
        ]
        table = pa.Table.from_pylist(
            [dict(zip(OFFSETS_SCHEMA.names, row, strict=True)) for row in rows], OFFSETS_SCHEMA
        )
        # An offset log written before plans carried a fingerprint (a wall-clock time) gains
        # the column.
        return delta_direct.append(self.path, table, self.txn_app_id, batch_id, merge_schema=True)

    def planned(self, batch_id: int) -> PlannedBatch | None:
        """How batch ``batch_id`` was planned, or None when it never was."""
        rows = delta_direct.read(self.path, [("batch_id", "=", batch_id)]).to_pylist()
        if not rows:
            return None
        ranges = {
            (r["topic"], r["partition"]): (r["start_offset"], r["end_offset"])
            for r in rows if not r["topic"].startswith(GLOBAL_PREFIX)
        }  # fmt: skip
        global_ends = {
            (r["topic"][len(GLOBAL_PREFIX) :], r["partition"]): r["end_offset"]
            for r in rows if r["topic"].startswith(GLOBAL_PREFIX)
        }  # fmt: skip
        return PlannedBatch(ranges, rows[0].get("fingerprint"), rows[0].get("wall_clock_ms"),
                            global_ends)  # fmt: skip


class CommitLog:
    """``claim``: the driver's claim on the job (claim.py). With one, every append is made as
    the claim holder's next commit, so a driver that lost its claim cannot commit a batch."""

    def __init__(self, path: str, application_id: str, claim: JobClaim | None = None) -> None:
        self.path, self.txn_app_id = path, f"{application_id}-commits"
        self.claim = claim

    def append(
        self,
        batch_id: int,
        consumed: Mapping[tuple[str, int], int],
        metrics: Mapping[str, Any],
        guarantee: str,
        layout: str | None = None,
    ) -> None:
        """Commit ``batch_id``: its consumed offsets, numbers, the processing.guarantee it
        ran under and the job's store layout (upgrade.py)."""
        row = {
            "batch_id": batch_id,
            "committed_at": datetime.now(UTC),
            "consumed": json.dumps([[t, p, o] for (t, p), o in sorted(consumed.items())]),
            "records_in": int(metrics.get("records_in", 0)),
            "records_out": int(metrics.get("records_out", 0)),
            "dlq_records": int(metrics.get("dlq_records", 0)),
            "duplicates_dropped": int(metrics.get("dedup_dropped", 0)),
            "duration_ms": int(metrics.get("duration_ms", 0)),
            "metrics": json.dumps(dict(metrics), default=str),
            "guarantee": guarantee,
            "layout": layout,
        }
        table = pa.Table.from_pylist([row], COMMITS_SCHEMA)
        if self.claim is not None:
            self.claim.append(table, self.txn_app_id, batch_id)
        elif not delta_direct.append(
            self.path, table, self.txn_app_id, batch_id, merge_schema=True
        ):
            raise RuntimeError(f"commit log {self.path}: batch {batch_id} was committed before")

    def last(self) -> CommittedBatch | None:
        """The newest committed batch, or None before the first commit."""
        batch_id = delta_direct.transaction_version(self.path, self.txn_app_id)
        if batch_id is None:
            return None
        rows = delta_direct.read(self.path, [("batch_id", "=", batch_id)]).to_pylist()
        if not rows:
            raise RuntimeError(
                f"commit log {self.path}: batch {batch_id} is recorded as committed "
                "(transaction version) but has no row"
            )
        row = rows[0]
        consumed = {(t, int(p)): int(o) for t, p, o in json.loads(row["consumed"])}
        return CommittedBatch(int(row["batch_id"]), consumed, json.loads(row["metrics"]),
                              row.get("guarantee"), row.get("layout"))  # fmt: skip
