"""Peak RSS of a windowed count's task with 1M and 4M live windows and a 64 MB record cache.

Issue 31's memory figure: what an executor runs for one task (``TaskBatchRunner``,
exactly_once_v2, the task kept between batches, as ``bench/task_cache_bench.py`` drives it), in
one process per size. The job counts views per key per 1-hour window with 24 hours of grace,
final results only (``on_window_close``): no window closes during the run, so every window
stays live, in the record cache (``statestore.cache.max.bytes``, ``--cache-mb``) or the store
(RocksDB). N live windows: N records, N/4 keys, spread over 4 hours of event time (one record
per key and window), loaded in 50k-record batches, then ``--batches`` batches of 10k new
records (new keys). Prints per size the process's peak RSS over the whole run, the median
time of a 10k-record batch and the entries the record cache holds at the end; then the ratio
of the largest size's peak RSS to the smallest's (flat: ~1.0).

    .venv/bin/python bench/window_memory_bench.py [--sizes 1000000,4000000] [--batches 10]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dedup_memory_bench import sizes_in_children  # noqa: E402
from task_cache_bench import Driver, peak_rss_mb  # noqa: E402

from streamplatform import EmitStrategy, StreamsBuilder, TimeWindows  # noqa: E402
from streamplatform.runtime import task_cache  # noqa: E402
from streamplatform.runtime.rows import STREAM_COLUMNS  # noqa: E402
from streamplatform.serdes import Serdes  # noqa: E402

HOUR_MS = 3_600_000
SPAN_MS = 4 * HOUR_MS
LOAD_BATCH = 50_000


def topology():
    b = StreamsBuilder()
    (b.stream("bench", Serdes.string(), Serdes.bytes()).group_by_key()
     .windowed_by(TimeWindows.of_size_and_grace(HOUR_MS, 24 * HOUR_MS))
     .emit_strategy(EmitStrategy.on_window_close()).count()
     .to_stream().to("counts"))  # fmt: skip
    return b.build()


def arrow(first: int, count: int, keys: int, spacing_ms: float) -> list[pa.RecordBatch]:
    """Records ``first`` .. ``first + count - 1``: record i is key i mod ``keys`` at i x
    ``spacing_ms``, so each key has one record per window."""
    batches = []
    for start in range(first, first + count, 10_000):
        n = min(10_000, first + count - start)
        offsets = range(start, start + n)
        batches.append(pa.RecordBatch.from_arrays([
            pa.array([0] * n, pa.int32()), pa.array(offsets, pa.int64()),
            pa.array([int(i * spacing_ms) for i in offsets], pa.int64()),
            pa.array([b"user-%08d" % (i % keys) for i in offsets], pa.binary()),
            pa.array([b"v"] * n, pa.binary()), pa.nulls(n, pa.string()),
        ], names=list(STREAM_COLUMNS)))  # fmt: skip
    return batches


def measure_one(windows: int, batches: int, cache_mb: int) -> dict:
    keys, spacing_ms = windows // 4, SPAN_MS / windows
    with tempfile.TemporaryDirectory() as directory:
        driver = Driver(0, directory, job=topology(), sink="counts")
        extra = {"statestore.cache.max.bytes": cache_mb * 1024 * 1024}
        started = time.perf_counter()
        for first in range(0, windows, LOAD_BATCH):
            count = min(LOAD_BATCH, windows - first)
            driver.batch(arrow(first, count, keys, spacing_ms), 600_000, extra)
        load_s = time.perf_counter() - started
        times, next_record = [], windows
        for _ in range(batches):  # new keys, in the last hour's window
            records = arrow(next_record, 10_000, 2**40, spacing_ms)
            times.append(driver.batch(records, 600_000, extra) * 1000)
            next_record += 10_000
        cached = None
        for kept in task_cache._kept.values():
            (aggregation,) = [p for p in kept.task.processors.values() if hasattr(p, "cache")]
            cached = len(aggregation.cache.entries)
        task_cache.close_all()
        return {"windows": windows, "load_s": load_s, "batch_ms": statistics.median(times),
                "peak_rss_mb": peak_rss_mb(), "cached": cached}  # fmt: skip


def main() -> None:
    figures = sizes_in_children(__file__, __doc__.split("\n")[0], "1000000,4000000")
    if figures is None:
        return
    for result in figures:
        print(f"{result['windows']:>11,} live windows: peak RSS {result['peak_rss_mb']:7,.0f} MB,"
              f" median {result['batch_ms']:7.1f} ms per 10k-record batch, loading "
              f"{result['load_s']:6.1f} s, record cache entries at the end {result['cached']}"
              " (path: the runtime's task, TaskBatchRunner)")  # fmt: skip
    ratio = figures[-1]["peak_rss_mb"] / figures[0]["peak_rss_mb"]
    print(f"peak RSS {figures[-1]['windows']:,} / {figures[0]['windows']:,} live windows: "
          f"{ratio:.2f}x (flat: ~1.0)")  # fmt: skip


if __name__ == "__main__":
    main()
