"""Peak RSS and per-batch task time of a 24-hour deduplication with 1M, 4M and 10M live ids.

What an executor runs for one task of the e2e bench's job (``TaskBatchRunner.run_partition``,
exactly_once_v2, the task kept in its Python worker between batches), in one process per size,
as ``bench/task_cache_bench.py`` builds it: first the live ids, distinct, spread evenly over
20 hours of event time (so all of them stay within the 24-hour interval: 7.2 ms apart for 10M),
in 50k-record batches, then ``--batches`` batches of 10k new records. The task's memory budget is
``statestore.cache.max.bytes`` (``--cache-mb``, 64 by default); RocksDB's block cache and
memtables are bounded by their own settings (defaults).

Prints, per size: the process's peak RSS over the whole run (loading included), the median
time of a 10k-record batch, the share of the ids memory holds at the end, and the ratio of
the batch time at the largest size to that at the smallest (target <= 2x). The code path is
the runtime's task path (the C core where it is built; ``path`` says which).

    .venv/bin/python bench/dedup_memory_bench.py [--sizes 1000000,4000000,10000000] [--batches 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from task_cache_bench import ARROW_BATCH, Driver, arrow, peak_rss_mb  # noqa: E402

from streamplatform.runtime import task_cache  # noqa: E402

DAY_MS = 86_400_000
LIVE_SPAN_MS = 20 * 3_600_000
LOAD_BATCH = 50_000


def measure_one(live_ids: int, batches: int, cache_mb: int) -> dict:
    """One size, in this process: loads ``live_ids`` ids, then times ``batches`` batches."""
    with tempfile.TemporaryDirectory() as directory:
        driver = Driver(DAY_MS, directory)
        spacing_ms = LIVE_SPAN_MS // live_ids
        extra = {"statestore.cache.max.bytes": cache_mb * 1024 * 1024}
        started = time.perf_counter()
        for first in range(0, live_ids, LOAD_BATCH):
            count = min(LOAD_BATCH, live_ids - first)
            driver.batch(arrow(first, count, spacing_ms), 600_000, extra)
        load_s = time.perf_counter() - started
        times, next_record = [], live_ids
        for _ in range(batches):
            records = arrow(next_record, ARROW_BATCH, spacing_ms)
            times.append(driver.batch(records, 600_000, extra) * 1000)
            next_record += ARROW_BATCH
        held, path, forwarded = None, "?", None
        for kept in task_cache._kept.values():  # the one task, kept between batches
            (processor,) = kept.task.processors.values()
            held = len(processor._core.entries)
            path = type(processor._core).__module__.rsplit(".", 1)[-1]
            forwarded = processor.metrics()["forwarded"]
        task_cache.close_all()
        return {
            "live_ids": live_ids, "load_s": load_s, "batch_ms": statistics.median(times),
            "peak_rss_mb": peak_rss_mb(), "held_ids": held, "core": path,
            "forwarded_last_batches": forwarded,
        }  # fmt: skip


def sizes_in_children(script: str, description: str, default_sizes: str) -> list[dict] | None:
    """The command line of a memory bench: with ``--one N`` (a child) print ``measure_one``'s
    figures for N as JSON and return None; else run one child process per size (its own peak
    RSS) and return their figures. ``script``: the bench's file, whose ``measure_one`` the
    child runs."""
    cache_mb = {"type": int, "default": 64}
    return sizes_in_children_with(script, description, default_sizes, {"--cache-mb": cache_mb})


def sizes_in_children_with(
    script: str, description: str, default_sizes: str, options: dict[str, dict]
) -> list[dict] | None:
    """``sizes_in_children`` with the bench's own options besides ``--sizes`` and
    ``--batches``: ``options`` maps each (``--cache-mb``) to its ``add_argument`` keywords.
    Their values go to every child (one left None is not passed on) and from there to
    ``measure_one(size, batches, ...)`` as keyword arguments (``cache_mb=``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--sizes", default=default_sizes)
    parser.add_argument("--batches", type=int, default=10)
    for name, keywords in options.items():
        parser.add_argument(name, **keywords)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one size
    args = parser.parse_args()
    values = {name: getattr(args, name[2:].replace("-", "_")) for name in options}
    if args.one is not None:
        measure = sys.modules["__main__"].measure_one
        keywords = {name[2:].replace("-", "_"): value for name, value in values.items()}
        print(json.dumps(measure(args.one, args.batches, **keywords)))
        return None
    passed = [part for name, value in values.items() if value is not None
              for part in (name, str(value))]  # fmt: skip
    figures = []
    for size in (int(s) for s in args.sizes.split(",")):
        child = subprocess.run(
            [sys.executable, script, "--one", str(size), "--batches", str(args.batches), *passed],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        figures.append(json.loads(child.stdout.strip().splitlines()[-1]))
    return figures


def main() -> None:
    figures = sizes_in_children(__file__, __doc__.split("\n")[0], "1000000,4000000,10000000")
    if figures is None:
        return
    for result in figures:
        print(f"{result['live_ids']:>11,} live ids: peak RSS {result['peak_rss_mb']:7,.0f} MB, "
              f"median {result['batch_ms']:7.1f} ms per 10k-record batch, loading "
              f"{result['load_s']:6.1f} s, ids held in memory at the end {result['held_ids']}, "
              f"core {result['core']}")  # fmt: skip
    ratio = figures[-1]["batch_ms"] / figures[0]["batch_ms"]
    print(f"batch time {figures[-1]['live_ids']:,} / {figures[0]['live_ids']:,} ids: "
          f"{ratio:.2f}x (target <= 2x); peak RSS max "
          f"{max(f['peak_rss_mb'] for f in figures):,.0f} MB (target <= 600 MB)")  # fmt: skip


if __name__ == "__main__":
    main()
