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

- **one large snapshot** (``--snapshot-ids N``, instead of the above): a changelog of N ids
  (a million a batch, at least two batches), snapshotted by ``maintenance.snapshot_changelog``
  into one file of N rows, restored into an empty store in a fresh process. Prints the
  restore's seconds and that process's peak RSS during the restore (and its RSS before), so
  the peak is the restore's alone: it should not grow with N the way the Python objects of N
  rows would (RocksDB's memtables and block cache are bounded by ``StoreOptions``).

    .venv/bin/python bench/restore_bench.py [--ids-per-batch 2000]
    .venv/bin/python bench/restore_bench.py --snapshot-ids 10000000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamplatform.runtime import changelog, delta_direct
from streamplatform.runtime.maintenance import snapshot_changelog
from streamplatform.runtime.task_run import BATCH_MARKER
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


SNAPSHOT_IDS_PER_BATCH = 1_000_000


def write_ids(path: str, ids: int) -> int:
    """A changelog of ``ids`` puts, ``SNAPSHOT_IDS_PER_BATCH`` a batch and at least two
    batches (a snapshot replaces two files or more); returns the last batch."""
    batches = max(2, -(-ids // SNAPSHOT_IDS_PER_BATCH))
    for batch in range(batches):
        first, end = ids * batch // batches, ids * (batch + 1) // batches
        n = end - first
        rows = pa.table({
            "task": pa.repeat(pa.scalar("0_0"), n), "store": pa.repeat(pa.scalar("dedup"), n),
            "seq": pa.array(range(n), pa.int64()), "column_family": pa.repeat(pa.scalar("data"), n),
            "key": pa.array([b"id-%d" % i for i in range(first, end)], pa.binary()),
            "value": pa.repeat(pa.scalar(b"%d" % batch, pa.binary()), n),
            "batch_id": pa.repeat(pa.scalar(batch, pa.int64()), n),
        }).cast(SCHEMA)  # fmt: skip
        delta_direct.append(path, rows, "bench-changelog", batch, ["task"])
    return batches - 1


def measure_snapshot_restore(work: Path, ids: int) -> dict[str, float]:
    """Restore an empty store from one snapshot of ``ids`` ids, in a fresh process."""
    path = str(work / "snapshot" / "_changelog")
    last = write_ids(path, ids)
    snapshot_changelog(path, last, min_files=2)
    files = changelog.files_by_task(path)["0_0"]
    assert len(files) == 1 and files[0].snapshot, files
    restore = [sys.executable, __file__, "--restore-child", path, str(work / "store"), str(last)]
    done = subprocess.run(restore, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    result["snapshot file MB"] = Path(files[0].path).stat().st_size / 2**20
    return result


def restore_child(path: str, directory: str, last: int) -> None:
    """The restore of ``measure_snapshot_restore``, in its own process: prints its figures."""
    files = changelog.files_by_task(path)["0_0"]
    rss_before = reset_peak_rss()
    store = TransactionalKeyValueStore(Path(directory), IsolationLevel.READ_COMMITTED)
    try:
        started = time.perf_counter()
        rows = changelog.replay(files, {"dedup": store}, last, BATCH_MARKER)
        seconds = time.perf_counter() - started
        assert store.committed_offset(BATCH_MARKER) == last
    finally:
        store.close()
    figures = {"rows": rows, "seconds": seconds, "RSS before MB": rss_before,
               "peak RSS MB": peak_rss_mb()}  # fmt: skip
    print(json.dumps(figures))


def peak_rss_mb() -> float:
    """This process's peak RSS. On Linux from /proc (``VmHWM``), not ``ru_maxrss``: a child
    inherits its parent's ru_maxrss across fork and exec, so that would show the peak of the
    process that wrote the changelog."""
    peak = _proc_status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> float:
    """Start the peak RSS over from the current RSS (Linux; elsewhere the peak keeps what came
    before, imports included); returns the current RSS."""
    with contextlib.suppress(OSError):  # "5": reset the peak RSS (Linux 4.0 and later)
        Path("/proc/self/clear_refs").write_text("5")
    current = _proc_status_mb("VmRSS")
    return current if current is not None else peak_rss_mb()


def _proc_status_mb(field: str) -> float | None:
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    return None


def print_snapshot_restore(ids: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="restore-bench-"))
    try:
        result = measure_snapshot_restore(work, ids)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print(f"restore of one snapshot of {ids:,} ids ({result['snapshot file MB']:.0f} MB file): "
          f"{result['rows']:,.0f} rows in {result['seconds']:.1f} s, "
          f"{ids / result['seconds']:,.0f} ids/s; peak RSS of the restoring process "
          f"{result['peak RSS MB']:.0f} MB ({result['RSS before MB']:.0f} MB before the "
          "restore)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids-per-batch", type=int, default=2000)
    parser.add_argument(
        "--snapshot-ids", type=int, default=None,
        help="measure only the restore of one snapshot of this many ids",
    )  # fmt: skip
    parser.add_argument("--restore-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restore_child:
        path, directory, last = args.restore_child
        restore_child(path, directory, int(last))
        return
    if args.snapshot_ids is not None:
        print_snapshot_restore(args.snapshot_ids)
        return
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
