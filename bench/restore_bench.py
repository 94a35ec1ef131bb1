"""Restore and standby replay against the job's age: 20 batches and 200 batches.

One task's changelog as the dedup job writes it (delta-rs appends, one file per batch): each
batch puts 2,000 new ids and deletes the ids of 10 batches before (about 20,000 live ids at
any age). Measured, in one run:

- **restore**: an empty store replayed to the last batch (a task landing on an executor
  without its state). Before: every file of the task's history. Now: after
  ``maintenance.maintain`` snapshotted the changelog, the snapshot and the tail.
- **standby replay**: a warm copy one batch behind replays the last batch. Before: the file
  list without the Delta log's batch statistics, so every file is opened and filtered. Now:
  only the files whose batches are after the copy's.

- **list files**: the task's changelog files from the Delta log (what every restore and
  standby replay does first), before and after maintenance (its snapshot and checkpoint).

Prints each time at 20 and 200 batches and the ratio 200/20 (1.0 = does not grow with age).

    .venv/bin/python bench/restore_bench.py [--ids-per-batch 2000]
"""

from __future__ import annotations

import argparse
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamplatform.runtime import changelog, delta_direct
from streamplatform.runtime.executor import BATCH_MARKER
from streamplatform.runtime.maintenance import snapshot_changelog
from streamplatform.state import IsolationLevel, TransactionalKeyValueStore

SCHEMA = pa.schema([
    ("task", pa.string()), ("store", pa.string()), ("seq", pa.int64()),
    ("column_family", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
    ("batch_id", pa.int64()),
])  # fmt: skip
LIVE_BATCHES = 10


def write_changelog(path: str, batches: int, ids: int) -> None:
    for batch in range(batches):
        keys = [b"id-%d-%d" % (batch, i) for i in range(ids)]
        values: list[bytes | None] = [b"%d" % batch] * ids
        if batch >= LIVE_BATCHES:  # the ids of 10 batches before expire
            keys += [b"id-%d-%d" % (batch - LIVE_BATCHES, i) for i in range(ids)]
            values += [None] * ids
        n = len(keys)
        rows = pa.table({
            "task": ["0_0"] * n, "store": ["dedup"] * n, "seq": list(range(n)),
            "column_family": ["data"] * n, "key": keys, "value": values,
            "batch_id": [batch] * n,
        }, schema=SCHEMA)  # fmt: skip
        delta_direct.append(path, rows, "bench-changelog", batch, ["task"])


def timed_replay(directory: Path, files: list, up_to: int, start_at: int | None = None) -> float:
    """Seconds to replay ``files`` into a new store up to ``up_to`` (the best of 3, each in
    a directory of its own); the store first brought to ``start_at`` (not timed) when given."""
    best = float("inf")
    for attempt in range(3):
        store = TransactionalKeyValueStore(directory / str(attempt), IsolationLevel.READ_COMMITTED)
        try:
            if start_at is not None:
                changelog.replay(files, {"dedup": store}, start_at, BATCH_MARKER)
            started = time.perf_counter()
            changelog.replay(files, {"dedup": store}, up_to, BATCH_MARKER)
            best = min(best, time.perf_counter() - started)
        finally:
            store.close()
    return best


def measure(work: Path, batches: int, ids: int) -> dict[str, float]:
    path = str(work / f"age-{batches}" / "_changelog")
    write_changelog(path, batches, ids)
    last = batches - 1
    files = changelog.files_by_task(path)["0_0"]
    no_stats = [changelog.ChangelogFile(f.path, -1, 2**62) for f in files]  # the old listing
    results = {
        "restore before": timed_replay(work / f"r-before-{batches}", no_stats, last),
        "standby before": timed_replay(work / f"s-before-{batches}", no_stats, last, last - 1),
        "standby now": timed_replay(work / f"s-now-{batches}", files, last, last - 1),
    }
    results["list files before"] = timed(lambda: changelog.files_by_task(path))
    snapshot_changelog(path, last - 1, min_files=2)  # the last batch is the tail
    delta_direct.table_or_none(path).create_checkpoint()  # as maintain() does
    results["list files now"] = timed(lambda: changelog.files_by_task(path))
    results["restore now"] = timed_replay(
        work / f"r-now-{batches}", changelog.files_by_task(path)["0_0"], last
    )
    return results


def timed(action: Any, repeats: int = 5) -> float:
    """The best of ``repeats`` runs of ``action``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids-per-batch", type=int, default=2000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="restore-bench-"))
    try:
        young = measure(work, 20, args.ids_per_batch)
        old = measure(work, 200, args.ids_per_batch)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print(f"{'':16} {'20 batches':>12} {'200 batches':>12} {'200/20':>8}")
    for name in (
        "restore before",
        "restore now",
        "standby before",
        "standby now",
        "list files before",
        "list files now",
    ):
        print(f"{name:16} {young[name] * 1000:>10.0f}ms {old[name] * 1000:>10.0f}ms "
              f"{old[name] / young[name]:>8.2f}")  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    main()
