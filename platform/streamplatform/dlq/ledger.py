"""The replay's Delta tables, next to the job's own (``<platform.delta.root>/<application.id>/``).

- ``_dlq_replay_log``: one ``planned`` row per replay batch, written *before* anything is
  published (which DLQ records, what to do with each, where the target partitions ended), and one
  ``done`` row after. A batch planned but not done is finished by the next replay, from its plan.
- ``_dlq_replayed``: one row per DLQ record re-published to its source topic.
- ``_dlq_parked``: one row per DLQ record that failed again, with the attempt count, the error
  and the raw record (so it can be fixed and retried by hand, or with ``retry_parked``).

A DLQ record is identified by its source coordinates (topic, partition, offset); it is handled
once it is in ``_dlq_replayed`` or ``_dlq_parked``. Every append carries ``txnAppId`` /
``txnVersion = replay batch``, so finishing a batch twice writes its rows once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from streamplatform.dlq.records import DlqRecord, SourceCoordinates

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LOG_TABLE, REPLAYED_TABLE, PARKED_TABLE = "_dlq_replay_log", "_dlq_replayed", "_dlq_parked"
LOG_SCHEMA = (
    "replay_batch LONG, state STRING, position LONG, plan STRING, start_offsets STRING, "
    "logged_at TIMESTAMP"
)
REPLAYED_SCHEMA = (
    "source_topic STRING, source_partition INT, source_offset LONG, original STRING, "
    "attempt INT, dlq_batch_id LONG, replay_batch LONG, replayed_at TIMESTAMP"
)
PARKED_SCHEMA = (
    "source_topic STRING, source_partition INT, source_offset LONG, original STRING, "
    "attempts INT, exception STRING, message STRING, key BINARY, value BINARY, timestamp LONG, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, dlq_batch_id LONG, replay_batch LONG, "
    "parked_at TIMESTAMP"
)
REPUBLISH, PARK = "republish", "park"


@dataclass(frozen=True)
class Decision:
    """What one replay batch does with one DLQ record."""

    source: str  # SourceCoordinates as text: the DLQ record's identity
    original: str  # the first failure's coordinates
    attempt: int  # the attempt this is (1 = first replay)
    action: str  # REPUBLISH or PARK
    dlq_batch_id: int
    exception: str | None = None
    message: str | None = None

    @property
    def coordinates(self) -> SourceCoordinates:
        return SourceCoordinates.parse(self.source)


@dataclass(frozen=True)
class Plan:
    """A replay batch as written to the log before it runs."""

    replay_batch: int
    position: int  # the largest mirror batch_id this batch has looked at
    decisions: tuple[Decision, ...]
    start_offsets: dict[str, int]  # "topic/partition" -> high watermark before publishing

    def to_row(self, state: str) -> tuple[Any, ...]:
        plan = json.dumps([asdict(d) for d in self.decisions])
        return (self.replay_batch, state, self.position, plan, json.dumps(self.start_offsets),
                datetime.now(UTC))  # fmt: skip

    @classmethod
    def from_row(cls, row: Any) -> Plan:
        return cls(
            replay_batch=int(row.replay_batch),
            position=int(row.position),
            decisions=tuple(Decision(**d) for d in json.loads(row.plan)),
            start_offsets={k: int(v) for k, v in json.loads(row.start_offsets).items()},
        )


class ReplayLedger:
    """Reads and appends the three tables of one application (see the module docstring)."""

    def __init__(self, spark: SparkSession, app_root: str, application_id: str) -> None:
        self.spark, self.app = spark, application_id
        root = app_root.rstrip("/")
        self.log_path = f"{root}/{LOG_TABLE}"
        self.replayed_path = f"{root}/{REPLAYED_TABLE}"
        self.parked_path = f"{root}/{PARKED_TABLE}"

    def _exists(self, path: str) -> bool:
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self.spark, path))

    def _read(self, path: str) -> DataFrame | None:
        return self.spark.read.format("delta").load(path) if self._exists(path) else None

    def _append(
        self, path: str, rows: Sequence[tuple[Any, ...]], schema: str, name: str, batch: int
    ):
        if not rows:
            return
        (
            self.spark.createDataFrame(list(rows), schema)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", f"{self.app}-{name}")
            .option("txnVersion", str(batch))
            .save(path)
        )

    # The log -----------------------------------------------------------------------------

    def last_batch(self) -> tuple[Plan, bool, int] | None:
        """The newest replay batch's plan, whether it is done, and the log's position (the
        largest mirror batch_id any replay batch looked at); None before the first batch."""
        from pyspark.sql import functions as F

        log = self._read(self.log_path)
        if log is None:
            return None
        newest = log.agg(F.max("replay_batch"), F.max("position")).first()
        if newest is None or newest[0] is None:
            return None
        rows = log.where(log["replay_batch"] == newest[0]).collect()
        done = any(row.state == "done" for row in rows)
        return Plan.from_row(rows[0]), done, int(newest[1])

    def log_planned(self, plan: Plan) -> None:
        self._append(self.log_path, [plan.to_row("planned")], LOG_SCHEMA, "replay-planned",
                     plan.replay_batch)  # fmt: skip

    def log_done(self, plan: Plan) -> None:
        self._append(self.log_path, [plan.to_row("done")], LOG_SCHEMA, "replay-done",
                     plan.replay_batch)  # fmt: skip

    # Outcomes ----------------------------------------------------------------------------

    def handled(self) -> DataFrame | None:
        """Source coordinates already replayed or parked (``source_topic, source_partition,
        source_offset``), or None when there are none yet."""
        frames = [
            frame.select("source_topic", "source_partition", "source_offset")
            for frame in (self._read(self.replayed_path), self._read(self.parked_path))
            if frame is not None
        ]
        if not frames:
            return None
        return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])

    def parked(self) -> DataFrame | None:
        """Parked records not replayed since: the newest parking of each source record."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        parked = self._read(self.parked_path)
        if parked is None:
            return None
        coords = ["source_topic", "source_partition", "source_offset"]
        newest = Window.partitionBy(*coords).orderBy(F.col("replay_batch").desc())
        current = parked.withColumn("_n", F.row_number().over(newest)).where("_n = 1").drop("_n")
        replayed = self._read(self.replayed_path)
        if replayed is not None:
            current = current.join(replayed.select(*coords), coords, "left_anti")
        return current

    def record(self, plan: Plan, records: dict[str, DlqRecord]) -> None:
        """Append the plan's outcomes: re-published records and parked records."""
        now = datetime.now(UTC)
        replayed, parked = [], []
        for decision in plan.decisions:
            coords = decision.coordinates
            if decision.action == REPUBLISH:
                replayed.append((*coords, decision.original, decision.attempt,
                                 decision.dlq_batch_id, plan.replay_batch, now))  # fmt: skip
                continue
            record = records[decision.source]
            headers = [{"key": k, "value": v} for k, v in record.headers]
            parked.append((*coords, decision.original, decision.attempt, decision.exception,
                           decision.message, record.key, record.value, record.timestamp, headers,
                           decision.dlq_batch_id, plan.replay_batch, now))  # fmt: skip
        self._append(self.replayed_path, replayed, REPLAYED_SCHEMA, "replayed", plan.replay_batch)
        self._append(self.parked_path, parked, PARKED_SCHEMA, "parked", plan.replay_batch)

    def counts(self) -> dict[str, int]:
        """Rows in the replayed and parked tables (parked: records still parked)."""
        replayed = self._read(self.replayed_path)
        parked = self.parked()
        return {
            "replayed": 0 if replayed is None else int(replayed.count()),
            "parked": 0 if parked is None else int(parked.count()),
        }
