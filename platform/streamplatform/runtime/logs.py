"""The offset log and the commit log: two small Delta tables that make a micro-batch replayable.

Like the ``offsets/`` and ``commits/`` folders of a Spark checkpoint, but queryable:

- offset log (``<root>/<application.id>/_offsets``): one row per source partition of batch N,
  ``(batch_id, topic, partition, start_offset, end_offset)``, appended *before* the batch
  runs (write-ahead). A batch that was planned but never committed is re-run with exactly the
  same ranges.
- commit log (``<root>/<application.id>/_commits``): one row per committed batch with the
  offsets each partition was actually consumed up to (a task may stop early to keep its
  uncommitted state bounded) and the batch's numbers. Appending it is the commit point.

Both appends are idempotent (Delta ``txnAppId``/``txnVersion`` = batch id), so a crash
between writing and recording can never log a batch twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

OFFSETS_SCHEMA = "batch_id LONG, topic STRING, partition INT, start_offset LONG, end_offset LONG"
COMMITS_SCHEMA = (
    "batch_id LONG, committed_at TIMESTAMP, consumed STRING, records_in LONG, records_out LONG, "
    "dlq_records LONG, duplicates_dropped LONG, duration_ms LONG, metrics STRING"
)

Ranges = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> [start, end)


@dataclass(frozen=True)
class CommittedBatch:
    batch_id: int
    consumed: dict[tuple[str, int], int]  # next offset to read per source partition
    metrics: dict[str, Any]


def _exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def _append(spark: SparkSession, path: str, rows: list[tuple], schema: str, app: str, batch: int):
    (
        spark.createDataFrame(rows, schema)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app)
        .option("txnVersion", str(batch))
        .save(path)
    )


class OffsetLog:
    def __init__(self, spark: SparkSession, path: str, application_id: str) -> None:
        self.spark, self.path, self.app = spark, path, application_id

    def append(self, batch_id: int, ranges: Ranges) -> None:
        rows = [(batch_id, t, p, start, end) for (t, p), (start, end) in sorted(ranges.items())]
        _append(self.spark, self.path, rows, OFFSETS_SCHEMA, f"{self.app}-offsets", batch_id)

    def planned(self, batch_id: int) -> Ranges | None:
        """The ranges batch ``batch_id`` was planned with, or None when it never was."""
        if not _exists(self.spark, self.path):
            return None
        rows = (
            self.spark.read.format("delta")
            .load(self.path)
            .where(f"batch_id = {batch_id}")
            .collect()
        )
        if not rows:
            return None
        return {(r.topic, r.partition): (r.start_offset, r.end_offset) for r in rows}

    def last_batch(self) -> int | None:
        if not _exists(self.spark, self.path):
            return None
        value = self.spark.read.format("delta").load(self.path).agg({"batch_id": "max"}).first()
        return None if value is None or value[0] is None else int(value[0])


class CommitLog:
    def __init__(self, spark: SparkSession, path: str, application_id: str) -> None:
        self.spark, self.path, self.app = spark, path, application_id

    def append(
        self,
        batch_id: int,
        consumed: Mapping[tuple[str, int], int],
        metrics: Mapping[str, Any],
    ) -> None:
        from datetime import datetime

        row = (
            batch_id,
            datetime.now(UTC),
            json.dumps([[t, p, o] for (t, p), o in sorted(consumed.items())]),
            int(metrics.get("records_in", 0)),
            int(metrics.get("records_out", 0)),
            int(metrics.get("dlq_records", 0)),
            int(metrics.get("dedup_dropped", 0)),
            int(metrics.get("duration_ms", 0)),
            json.dumps(dict(metrics), default=str),
        )
        _append(self.spark, self.path, [row], COMMITS_SCHEMA, f"{self.app}-commits", batch_id)

    def last(self) -> CommittedBatch | None:
        """The newest committed batch, or None before the first commit."""
        if not _exists(self.spark, self.path):
            return None
        row = (
            self.spark.read.format("delta")
            .load(self.path)
            .orderBy("batch_id", ascending=False)
            .limit(1)
            .first()
        )
        if row is None:
            return None
        consumed = {(t, int(p)): int(o) for t, p, o in json.loads(row.consumed)}
        return CommittedBatch(int(row.batch_id), consumed, json.loads(row.metrics))

    def batches(self) -> list[int]:
        if not _exists(self.spark, self.path):
            return []
        rows = self.spark.read.format("delta").load(self.path).select("batch_id").collect()
        return sorted(int(r.batch_id) for r in rows)
