"""What the standard asset checks of a streaming asset compute, Dagster-free.

- :func:`offset_log_problems`: in a job's offset and commit logs every batch starts where the
  previous one was consumed up to, batch ids have no gaps, consumed offsets stay within the
  planned ranges, and at most the next batch is planned but not committed;
- :func:`dlq_ratio`: DLQ records / records read by a run;
- :func:`lag_by_partition`: records not consumed yet, per partition.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def offset_log_problems(spark: Any, app_root: str) -> tuple[int, list[str]]:
    """``(committed batches, every break of contiguity found, described)`` for the job whose
    tables are under ``app_root`` (``<delta root>/<application.id>``)."""
    from streamplatform.runtime.logs import GLOBAL_PREFIX
    from streamplatform.versioned_snapshot import versions_table_version

    offsets_path, commits_path = f"{app_root}/_offsets", f"{app_root}/_commits"
    if versions_table_version(spark, commits_path) is None:
        return 0, []
    commits = spark.read.format("delta").load(commits_path).select("batch_id", "consumed").collect()
    planned = spark.read.format("delta").load(offsets_path).collect()
    consumed_by_batch = {
        int(r.batch_id): {(t, int(p)): int(o) for t, p, o in json.loads(r.consumed)}
        for r in commits
    }
    plans: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
    for row in planned:
        if row.topic.startswith(GLOBAL_PREFIX):  # a global table's catch-up point, no range
            continue
        plans.setdefault(int(row.batch_id), {})[(row.topic, int(row.partition))] = (
            int(row.start_offset), int(row.end_offset))  # fmt: skip
    problems = []
    batches = sorted(consumed_by_batch)
    if batches != list(range(len(batches))):
        problems.append(f"commit log batch ids are not 0..{len(batches) - 1}: {batches[:10]}")
    previous: dict[tuple[str, int], int] = {}
    for batch in batches:
        plan = plans.get(batch)
        if plan is None:
            problems.append(f"batch {batch} is committed but was never planned")
            continue
        for tp, (start, end) in sorted(plan.items()):
            if tp in previous and start != previous[tp]:
                problems.append(f"batch {batch} {tp[0]}/{tp[1]} starts at {start}, previous "
                                f"batch consumed up to {previous[tp]}")  # fmt: skip
            done = consumed_by_batch[batch].get(tp, end)
            if not start <= done <= end:
                problems.append(f"batch {batch} {tp[0]}/{tp[1]} consumed up to {done}, outside "
                                f"its planned [{start}, {end})")  # fmt: skip
            previous[tp] = done
    uncommitted = sorted(set(plans) - set(batches))
    if uncommitted and uncommitted != [len(batches)]:
        problems.append(f"planned batches {uncommitted} are not committed and not the next one")
    return len(batches), problems


def dlq_ratio(records_in: int, dlq_records: int) -> float:
    """The share of a run's records that went to the DLQ (0 when it read none)."""
    return dlq_records / records_in if records_in else 0.0


def lag_by_partition(
    end_offsets: Callable[[str], Mapping[int, tuple[int, int]]],
    topics: Iterable[str],
    consumed: Mapping[tuple[str, int], int],
) -> dict[str, int]:
    """``{"topic/partition": records not consumed yet}``; ``end_offsets(topic)`` gives the
    brokers' ``{partition: (low, high)}``."""
    lag = {}
    for topic in topics:
        for partition, (low, high) in end_offsets(topic).items():
            done = max(consumed.get((topic, partition), low), low)
            lag[f"{topic}/{partition}"] = max(0, high - done)
    return lag
