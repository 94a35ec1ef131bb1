"""Per-batch task time of a deduplication task with millions of live ids: a task kept open in
its Python worker between batches against one opened anew every batch, at a 10-minute and a
24-hour interval.

Runs what a Spark executor runs for one task of the e2e bench's job (``TaskBatchRunner.
run_partition`` with a side-output directory, exactly_once_v2: settle, process, prepare), in
this process, batch after batch, the way the driver numbers and commits them. No Kafka, no
JVM: the Spark part of a batch is the same with or without a kept task, so only the task's own
time is measured here (``bench/e2e_bench.py`` measures whole batches).

First ``--live-ids`` records (default 2M) with distinct ids, one every 36 ms of event time
(20 hours), go in through 100k-record batches: at a 24-hour interval every id stays live, at
10 minutes about 17k do. Then ``--batches`` batches of 10k new records each, first with
``platform.task.cache.idle.ms=0`` (opened anew: the stores reopened, every live id reloaded),
then with the task kept. Prints the median per-batch task time of each, the ratio 24 h / 10 min
with kept tasks (target <= 1.2), and the peak RSS of each phase.

    .venv/bin/python bench/task_cache_bench.py [--live-ids 2000000] [--batches 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from streamplatform import StreamsBuilder, Topology
from streamplatform.runtime import task_cache
from streamplatform.runtime.executor import ChangelogWrites, TaskBatchRunner
from streamplatform.runtime.rows import STREAM_COLUMNS
from streamplatform.serdes import Serdes

SPACING_MS = 36
ARROW_BATCH = 10_000
LOAD_BATCH = 100_000
TASK = "0_0"


def topology(interval_ms: int) -> Topology:
    b = StreamsBuilder()
    b.stream("bench", Serdes.string(), Serdes.json()).deduplicate_by_key_value(
        lambda k, v: v["id"], interval_ms
    ).to("deduplicated")
    return b.build()


def arrow(first: int, count: int, spacing_ms: int = SPACING_MS) -> list[pa.RecordBatch]:
    """Records ``first`` .. ``first + count - 1``: distinct ids, one every ``spacing_ms``."""
    batches = []
    for start in range(first, first + count, ARROW_BATCH):
        n = min(ARROW_BATCH, first + count - start)
        offsets = range(start, start + n)
        batches.append(pa.RecordBatch.from_arrays([
            pa.array([0] * n, pa.int32()), pa.array(offsets, pa.int64()),
            pa.array([i * spacing_ms for i in offsets], pa.int64()),
            pa.array([b"k%d" % (i % 1000) for i in offsets], pa.binary()),
            pa.array([json.dumps({"id": f"id-{i}"}).encode() for i in offsets], pa.binary()),
            pa.nulls(n, pa.string()),
        ], names=list(STREAM_COLUMNS)))  # fmt: skip
    return batches


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts over from the current RSS


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Driver:
    """Numbers the batches and records which batches ran the task, as StreamingJob does."""

    def __init__(
        self, interval_ms: int, directory: str, job: Topology | None = None, sink: str = ""
    ) -> None:
        """``job``: another topology reading "bench" and writing ``sink`` (default: the
        dedup into "deduplicated")."""
        self.topology = job or topology(interval_ms)
        self.sink = sink or "deduplicated"
        self.directory = directory
        self.batch_id = 0
        self.runs = ChangelogWrites(0, {})

    def runner(self, idle_ms: int, extra: dict | None, **keywords) -> TaskBatchRunner:
        """This batch's runner: exactly_once_v2, the state under the directory, ``extra``
        settings, the last batch committed; ``keywords``: the rest of TaskBatchRunner's."""
        settings = {
            "application.id": "task-cache-bench", "bootstrap.servers": "unused:9092",
            "processing.guarantee": "exactly_once_v2", "state.dir": f"{self.directory}/state",
            "platform.task.cache.idle.ms": idle_ms, **(extra or {}),
        }  # fmt: skip
        return TaskBatchRunner(
            self.topology, settings, batch_id=self.batch_id,
            last_committed=self.batch_id - 1 if self.batch_id else None, changelog_files={},
            fingerprint="bench", task_runs=self.runs, **keywords,
        )  # fmt: skip

    def batch(
        self, batches: list[pa.RecordBatch], idle_ms: int, extra: dict | None = None
    ) -> float:
        """One batch of the task (``extra``: more settings); returns its task time in s."""
        runner = self.runner(
            idle_ms, extra, partitions={"bench": 1, self.sink: 1},
            side_output_dir=f"{self.directory}/side", stream_topic="bench",
        )  # fmt: skip
        started = time.perf_counter()
        for _ in runner.run_partition(iter(batches)):
            pass
        elapsed = time.perf_counter() - started
        self.runs.last_run[TASK] = self.batch_id  # committed
        self.batch_id += 1
        return elapsed


def measure(interval_ms: int, live_ids: int, batches: int) -> dict[str, tuple[float, float]]:
    """Median task time (ms) and peak RSS (MB) per phase: opened anew, kept."""
    with tempfile.TemporaryDirectory() as directory:
        driver = Driver(interval_ms, directory)
        for first in range(0, live_ids, LOAD_BATCH):
            driver.batch(arrow(first, min(LOAD_BATCH, live_ids - first)), idle_ms=0)
        results = {}
        next_record = live_ids
        for phase, idle_ms in (("opened anew", 0), ("kept", 600_000)):
            reset_peak_rss()
            times = []
            for _ in range(batches + 1):  # the first batch of "kept" opens the task
                times.append(driver.batch(arrow(next_record, ARROW_BATCH), idle_ms) * 1000)
                next_record += ARROW_BATCH
            results[phase] = (statistics.median(times[1:]), peak_rss_mb())
        task_cache.close_all()
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--live-ids", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    figures = {}
    for name, interval_ms in (("10 min", 600_000), ("24 h", 86_400_000)):
        figures[name] = measure(interval_ms, args.live_ids, args.batches)
        for phase, (ms, rss) in figures[name].items():
            print(f"interval {name:>6}, task {phase:>11}: median {ms:8.1f} ms per 10k-record "
                  f"batch, peak RSS {rss:,.0f} MB", flush=True)  # fmt: skip
    kept = figures["24 h"]["kept"][0] / figures["10 min"]["kept"][0]
    anew = figures["24 h"]["opened anew"][0] / figures["10 min"]["opened anew"][0]
    print(f"24 h / 10 min, kept tasks: {kept:.2f}x (target <= 1.2); opened anew: {anew:.2f}x")
    print(f"kept / opened anew at 24 h: "
          f"{figures['24 h']['kept'][0] / figures['24 h']['opened anew'][0]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
