"""Late versions: versions of a versioned store whose validity starts before what an as-of
join with that store had already joined (KIP-889 temporal joins).

A stream-table join over a versioned store meets, for a record at time t, the version valid at
t *among the versions its task had received so far*. A version that arrives after the task
joined records at or past its ``valid_from`` changes what those records should have met: the
days they fall on need recomputing (what the late-version backfill sensor launches).

The join frontier of a task after batch N is the latest record timestamp in the join's Delta
sink of that task's partition in batches <= N. Within a batch the order of table updates and
stream records is not recorded, so a version of batch N is compared with the frontier
*including* batch N: a version counts as late when its ``valid_from`` is at or before that
frontier. This can flag a day that the stream had in fact joined right; recomputing it yields
the same rows.

The days a late version affects are those of ``[valid_from, min(valid_to, frontier + 1))``
(UTC), with ``valid_to`` the key's next version: only records joined before the version
arrived can be wrong.

    >>> HOUR = 3_600_000
    >>> puts = [Put("USD", 0, 0, "0_0", False), Put("USD", 12 * HOUR, 0, "0_0", False),
    ...         Put("USD", 6 * HOUR, 1, "0_0", False)]  # batch 1: a correction from 06:00
    >>> late = late_versions(puts, {(0, 0): 20 * HOUR}, since_batch=0)  # joined up to 20:00
    >>> [(v.key, v.valid_from // HOUR, v.frontier // HOUR) for v in late]
    [('USD', 6, 20)]
    >>> affected_days(late, puts)
    ['1970-01-01']
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

DAY_MS = 86_400_000


class Put(NamedTuple):
    """One row of a job's ``_versions`` log (key decoded)."""

    key: str
    valid_from: int
    batch_id: int
    task: str
    tombstone: bool


@dataclass(frozen=True)
class LateVersion:
    key: str
    valid_from: int
    batch_id: int
    task: str
    frontier: int  # latest record time the task had joined by the version's batch
    tombstone: bool


def task_partition(task: str) -> int:
    """``"0_2"`` -> 2."""
    return int(task.rsplit("_", 1)[1])


def late_versions(
    puts: Iterable[Put], joined_until: Mapping[tuple[int, int], int], since_batch: int
) -> list[LateVersion]:
    """Puts of batches after ``since_batch`` whose ``valid_from`` is at or before the frontier
    of their task; ``joined_until[(partition, batch)]`` is the latest joined timestamp there."""
    frontiers: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for (partition, batch), timestamp in sorted(joined_until.items(), key=lambda i: i[0][1]):
        running = max(timestamp, frontiers[partition][-1][1]) if frontiers[partition] else timestamp
        frontiers[partition].append((batch, running))
    late = []
    for put in puts:
        if put.batch_id <= since_batch:
            continue
        reached = [
            ts for batch, ts in frontiers.get(task_partition(put.task), []) if batch <= put.batch_id
        ]
        if reached and put.valid_from <= reached[-1]:
            late.append(LateVersion(put.key, put.valid_from, put.batch_id, put.task, reached[-1],
                                    put.tombstone))  # fmt: skip
    return sorted(late, key=lambda v: (v.key, v.valid_from, v.batch_id))


def day_of(timestamp_ms: int) -> str:
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).strftime("%Y-%m-%d")


def day_bounds(day: str) -> tuple[int, int]:
    """``[start, end)`` of a UTC day in epoch milliseconds."""
    start = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC)
    begin = int(start.timestamp() * 1000)
    return begin, begin + DAY_MS


def affected_days(late: Sequence[LateVersion], puts: Iterable[Put]) -> list[str]:
    """UTC days whose joined records the late versions may change (sorted)."""
    starts: dict[str, list[int]] = defaultdict(list)
    for put in puts:
        starts[put.key].append(put.valid_from)
    days: set[str] = set()
    for version in late:
        later = [v for v in starts.get(version.key, []) if v > version.valid_from]
        end = min([*later, version.frontier + 1])
        day = datetime.fromtimestamp(version.valid_from / 1000, UTC).date()
        last = datetime.fromtimestamp((end - 1) / 1000, UTC).date()
        while day <= last:
            days.add(day.isoformat())
            day += timedelta(days=1)
    return sorted(days)


def find_late_versions(
    spark: Any, versions_path: str, sink_path: str, store: str, since_batch: int
) -> tuple[list[LateVersion], list[str]]:
    """Late versions of ``store`` in batches after ``since_batch`` and the days they affect,
    from the job's ``_versions`` log and the Delta sink its as-of join writes."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if not DeltaTable.isDeltaTable(spark, versions_path):
        return [], []
    versions = spark.read.format("delta").load(versions_path).where(F.col("store") == store)
    new = versions.where(F.col("batch_id") > since_batch)
    new_keys = [row.key for row in new.select("key").distinct().collect()]
    if not new_keys or not DeltaTable.isDeltaTable(spark, sink_path):
        return [], []
    rows = (
        versions.where(F.col("key").isin(new_keys))
        .select(
            F.col("key").cast("string").alias("key"),
            "valid_from",
            "batch_id",
            "task",
            F.col("value").isNull().alias("tombstone"),
        )  # fmt: skip
        .collect()
    )
    puts = [Put(r.key, int(r.valid_from), int(r.batch_id), r.task, bool(r.tombstone)) for r in rows]
    joined = (
        spark.read.format("delta")
        .load(sink_path)
        .groupBy("source_partition", "batch_id")
        .agg(F.max("timestamp").alias("until"))
        .collect()
    )
    until = {(int(r.source_partition), int(r.batch_id)): int(r.until) for r in joined}
    late = late_versions(puts, until, since_batch)
    return late, affected_days(late, puts)
