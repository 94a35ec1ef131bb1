"""Peak RSS of a task holding 1M and 4M live windows (or join records), against docs/memory.md.

Issue 31's memory figure: what an executor runs for one task (``TaskBatchRunner``,
exactly_once_v2, the task kept between batches, as ``bench/task_cache_bench.py`` drives it), in
one process per size. ``--kind`` picks the job; nothing closes or expires during the run, so
every window (record) stays live, in memory within the task's share of
``statestore.cache.max.bytes`` or in the store (RocksDB):

- ``time``: a count per key per 1-hour window (``TimeWindows``, 24 h grace), final results
  only (``on_window_close``). N records, N/4 keys, spread over 4 hours of event time: each
  key has one record per hour, so N records make N windows.
- ``session``: the same records counted per session (30-minute inactivity gap, 24 h grace,
  on window close): a key's records are an hour apart, so each makes its own session.
- ``sliding``: the same records counted per sliding window (30-minute time difference, 24 h
  grace, on window close): no later record of its key within 30 minutes, so each record makes
  its left window only (no right window).
- ``join``: a stream-stream inner join (``JoinWindows`` 24 h, 24 h grace) of topics "left" and
  "right", records alternating between them, every record its own key ("left-i", "right-i"):
  nothing ever matches, so the N records all stay buffered in the two sides' stores. A task
  reading two topics takes them as Spark's ``applyInArrow`` gives them
  (``TaskBatchRunner.run``, the rows of ``rows.INPUT_COLUMNS``).

N records load in 50k-record batches, then ``--batches`` batches of 10k new records (new keys,
each one more window or buffered record). The record cache (``--cache-mb``) defaults to the
platform's default of ``statestore.cache.max.bytes`` (10 MiB; it was 64 MB before ``--kind``).
Prints per size: the live windows (buffered records) counted in the stores at the end, the
process's peak RSS over the whole run, what docs/memory.md's formula (B + R + A + T) predicts and
measured / formula, B (the process's RSS after its imports), the median time of a 10k-record
batch and the load time; then the ratio of the largest size's peak RSS to the smallest's.
Under each size, what the memory held at the end of the batch that reached the peak (and how
far that batch's own peak was above it): the RocksDB block cache's usage (memtables charged
to it), the table readers beside it, glibc malloc's bytes in use and freed but kept (all
arenas: RocksDB's compaction threads keep theirs), and the RSS of Arrow's memory pool (what
mimalloc kept of a batch's Arrow rows): the formula's A bounds those two and a compaction.
Counting the stores takes a few seconds per million keys, after the peak RSS is read.

    .venv/bin/python bench/window_memory_bench.py [--kind time|session|sliding|join]
        [--sizes 1000000,4000000] [--batches 10] [--cache-mb MB]
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dedup_memory_bench import sizes_in_children_with  # noqa: E402
from task_cache_bench import Driver, peak_rss_mb, reset_peak_rss  # noqa: E402

from streamplatform import (  # noqa: E402
    EmitStrategy,
    JoinWindows,
    SessionWindows,
    SlidingWindows,
    StreamsBuilder,
    StreamsConfig,
    TimeWindows,
    Topology,
)
from streamplatform.runtime import task_cache  # noqa: E402
from streamplatform.runtime.rows import INPUT_COLUMNS, STREAM_COLUMNS  # noqa: E402
from streamplatform.serdes import Serdes  # noqa: E402
from streamplatform.state import StoreOptions  # noqa: E402

KINDS = ("time", "session", "sliding", "join")
MiB = 1024 * 1024
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
SPAN_MS = 4 * HOUR_MS  # the loaded records' event time: a key's 4 records are 1 hour apart
GAP_MS = HOUR_MS // 2  # session gap, sliding time difference: less than a key's 1 hour
LOAD_BATCH = 50_000
TIMED_BATCH = 10_000
# docs/memory.md, "Uncommitted writes": the Python objects of one staged write beyond the
# key and value bytes the limits count.
STAGED_OBJECTS_BYTES = 120
INDEX_BYTES_PER_KEY = 1.9  # docs/memory.md, R: RocksDB's index and filter blocks per stored key
# docs/memory.md, A: a compaction's working memory per SST target file size, glibc's freed but
# kept memory, Arrow's pool per record of the largest batch.
COMPACTION_PER_FILE_SIZE = 1.5
MALLOC_KEPT_BYTES = 60 * 1024 * 1024
ARROW_POOL_BYTES_PER_RECORD = 900
# The live windows' keys in the stores (the rest are time-index or metadata keys): b"w" +
# window start + key for time windows (window_aggregate.py), b"k" + key + suffix for session
# and sliding windows (aggregate.py's keyed layout, beside their b"t" time index), b"w" +
# segment + key for each join side (stream_join.py; one key per record here: keys differ).
LIVE_PREFIX = {"time": b"w", "session": b"k", "sliding": b"k", "join": b"w"}


def topology(kind: str) -> Topology:
    b = StreamsBuilder()
    if kind == "join":
        left = b.stream("left", Serdes.string(), Serdes.bytes())
        right = b.stream("right", Serdes.string(), Serdes.bytes())
        within = JoinWindows.of_time_difference_and_grace(DAY_MS, DAY_MS)
        left.join(right, lambda x, y: x + y, within).to("joined")
        return b.build()
    windows = {
        "time": TimeWindows.of_size_and_grace(HOUR_MS, DAY_MS),
        "session": SessionWindows.of_inactivity_gap_and_grace(GAP_MS, DAY_MS),
        "sliding": SlidingWindows.of_time_difference_and_grace(GAP_MS, DAY_MS),
    }[kind]
    (b.stream("bench", Serdes.string(), Serdes.bytes()).group_by_key().windowed_by(windows)
     .emit_strategy(EmitStrategy.on_window_close()).count()
     .to_stream().to("counts"))  # fmt: skip
    return b.build()


def arrow(first: int, count: int, keys: int, spacing_ms: float) -> list[pa.RecordBatch]:
    """Records ``first`` .. ``first + count - 1`` of topic "bench": record i is key i mod
    ``keys`` at i x ``spacing_ms``, so each key has one record per ``keys`` x ``spacing_ms``."""
    batches = []
    for start in range(first, first + count, TIMED_BATCH):
        n = min(TIMED_BATCH, first + count - start)
        offsets = range(start, start + n)
        batches.append(pa.RecordBatch.from_arrays([
            pa.array([0] * n, pa.int32()), pa.array(offsets, pa.int64()),
            pa.array([int(i * spacing_ms) for i in offsets], pa.int64()),
            pa.array([b"user-%08d" % (i % keys) for i in offsets], pa.binary()),
            pa.array([b"v"] * n, pa.binary()), pa.nulls(n, pa.string()),
        ], names=list(STREAM_COLUMNS)))  # fmt: skip
    return batches


def join_arrow(first: int, count: int, spacing_ms: float) -> list[pa.RecordBatch]:
    """Records ``first`` .. ``first + count - 1`` of the join, in INPUT_COLUMNS: even i to
    "left", odd i to "right" (offset i // 2 in its topic), at i x ``spacing_ms``, each its own
    key, so no record ever finds a partner."""
    batches = []
    for start in range(first, first + count, TIMED_BATCH):
        n = min(TIMED_BATCH, first + count - start)
        numbers = range(start, start + n)
        topics = ["left" if i % 2 == 0 else "right" for i in numbers]
        batches.append(pa.RecordBatch.from_arrays([
            pa.array([0] * n, pa.int32()), pa.array(topics, pa.string()),
            pa.array([0] * n, pa.int32()), pa.array([i // 2 for i in numbers], pa.int64()),
            pa.array([int(i * spacing_ms) for i in numbers], pa.int64()),
            pa.array([b"%s-%08d" % (t.encode(), i) for t, i in zip(topics, numbers, strict=True)],
                     pa.binary()),
            pa.array([b"v"] * n, pa.binary()), pa.nulls(n, pa.string()),
        ], names=list(INPUT_COLUMNS)))  # fmt: skip
    return batches


class JoinDriver(Driver):
    """``Driver`` for a task reading two topics: the grouped path's ``TaskBatchRunner.run``
    over the task's rows of both (``applyInArrow``), its output returned, not side-written."""

    def batch(
        self, batches: list[pa.RecordBatch], idle_ms: int, extra: dict | None = None
    ) -> float:
        runner = self.runner(idle_ms, extra, partitions={"left": 1, "right": 1, self.sink: 1})
        started = time.perf_counter()
        runner.run(pa.Table.from_batches(batches))
        elapsed = time.perf_counter() - started
        self.runs.last_run["0_0"] = self.batch_id  # committed
        self.batch_id += 1
        return elapsed


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (glibc >= 2.33)
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


_LIBC = ctypes.CDLL(None)
_MALLINFO2 = getattr(_LIBC, "mallinfo2", None)  # None: not glibc, or an older one
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2


def malloc_mb() -> tuple[float, float]:
    """glibc malloc, all its arenas: (in use, freed but kept by malloc) in MiB; what RocksDB
    (block cache, memtables, table readers, compactions) and CPython's objects over 512 bytes
    allocate. Both count in RSS: malloc keeps what it freed. nan, nan without mallinfo2."""
    if _MALLINFO2 is None:
        return float("nan"), float("nan")
    info = _MALLINFO2()
    return (info.uordblks + info.hblkhd) / MiB, info.fordblks / MiB


def arrow_pool_mb() -> float:
    """RSS of Arrow's memory pool when it is mimalloc (pyarrow's default here): mimalloc
    reserves its memory as one anonymous mapping of 1 GiB, and keeps what it freed there
    resident. (glibc's thread heaps are at most 64 MiB, CPython's arenas 1 MiB.)"""
    if pa.default_memory_pool().backend_name != "mimalloc":
        return float("nan")
    resident, in_pool = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields[0].endswith(":"):
                if in_pool and fields[0] == "Rss:":
                    resident += int(fields[1])
            else:  # a mapping: "start-end perms offset dev inode [path]"
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                in_pool = len(fields) == 5 and end - start >= 512 * MiB
    return resident / 1024


def rocksdb_mb() -> dict[str, float]:
    """The kept task's RocksDB, in MiB: the process's block cache (memtables charged to it),
    its stores' memtables and table readers (index and filter blocks, outside the cache),
    over all their column families."""
    found = {"block_cache": 0.0, "memtables": 0.0, "table_readers": 0.0}
    for kept in task_cache._kept.values():
        for store in kept.task.stores.values():
            for column in store._db.columns.values():  # every column family, "prepared" too
                value = column.property_int_value
                found["block_cache"] = (value("rocksdb.block-cache-usage") or 0) / MiB  # shared
                found["memtables"] += (value("rocksdb.cur-size-all-mem-tables") or 0) / MiB
                found["table_readers"] += (value("rocksdb.estimate-table-readers-mem") or 0) / MiB
    return found


class PeakParts:
    """The peak RSS over the batches, and what the memory holds at the end of the batch that
    reached it (sampled between batches, when the task is kept: a batch's own peak, its
    uncommitted writes and Arrow rows, is gone by then, see ``in_batch_mb``)."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self.parts: dict[str, float] = {}

    def batch(self, driver: Driver, batches: list[pa.RecordBatch], extra: dict) -> float:
        """``driver.batch`` (the task kept between batches); returns its time in s."""
        reset_peak_rss()
        elapsed = driver.batch(batches, 600_000, extra)
        peak = peak_rss_mb()
        if peak > self.peak_mb:
            self.peak_mb = peak
            in_batch = peak - rss_mb()
            in_use, kept_free = malloc_mb()
            self.parts = {
                "in_batch_mb": in_batch, "malloc_in_use_mb": in_use,
                "malloc_free_mb": kept_free, "arrow_pool_mb": arrow_pool_mb(), **rocksdb_mb(),
            }  # fmt: skip
        return elapsed


def count_stores(kind: str) -> tuple[int, int, int]:
    """The kept task's live windows (buffered records), stored keys, and stored key + value
    bytes, read from its stores' committed contents."""
    live = stored = stored_bytes = 0
    for kept in task_cache._kept.values():  # the one task, kept between batches
        for store in kept.task.stores.values():
            # The last batch's writes are prepared, applied when the next batch settles them
            # (the driver committed it): apply them now, as that would.
            if store.prepared_batch_id is not None:
                store.settle(store.prepared_batch_id, committed=True)
            for key, value in store.range():
                stored += 1
                stored_bytes += len(key) + len(value)
                live += key.startswith(LIVE_PREFIX[kind])
    return live, stored, stored_bytes


def formula_mb(kind: str, settings: StreamsConfig, b_mb: float, records: int, stored: int,
               stored_bytes: int) -> dict:  # fmt: skip
    """docs/memory.md's B + R + A + T for this run, in MiB, with its parts."""
    r = settings["platform.rocksdb.block.cache.bytes"] + INDEX_BYTES_PER_KEY * stored
    a = (COMPACTION_PER_FILE_SIZE * StoreOptions().target_file_size_bytes + MALLOC_KEPT_BYTES
         + ARROW_POOL_BYTES_PER_RECORD * LOAD_BATCH)  # fmt: skip
    # The task's one record cache (time windows) or its windows kept in memory (session and
    # sliding on window close) hold at most the task's statestore.cache.max.bytes; a
    # stream-stream join has neither.
    share = 0 if kind == "join" else settings["statestore.cache.max.bytes"]
    # Uncommitted writes of the largest batch (a 50k-record load batch): its writes are
    # stored keys / records per record (1, or 2 with a time index), each counted as its key +
    # value bytes (their average in the store: the bench's sizes), up to the store's limit,
    # and costing STAGED_OBJECTS_BYTES more in Python objects (docs/memory.md's f).
    writes = LOAD_BATCH * stored / records
    per_write = stored_bytes / stored
    counted = min(writes * per_write, settings["statestore.uncommitted.max.bytes"] or 1e18)
    uncommitted = counted * (per_write + STAGED_OBJECTS_BYTES) / per_write
    t = share + uncommitted
    return {"b_mb": b_mb, "r_mb": r / MiB, "a_mb": a / MiB, "t_mb": t / MiB,
            "formula_mb": b_mb + (r + a + t) / MiB}  # fmt: skip


def measure_one(size: int, batches: int, kind: str, cache_mb: int | None) -> dict:
    b_mb = rss_mb()  # B: the interpreter and the libraries, before the first batch
    b_malloc_mb = malloc_mb()
    extra = {} if cache_mb is None else {"statestore.cache.max.bytes": cache_mb * MiB}
    settings = StreamsConfig({"application.id": "unused", **extra})  # the defaults, for R, T
    spacing_ms = SPAN_MS / size
    with tempfile.TemporaryDirectory() as directory:
        if kind == "join":
            driver: Driver = JoinDriver(0, directory, job=topology(kind), sink="joined")
        else:
            driver = Driver(0, directory, job=topology(kind), sink="counts")

        def records(first: int, count: int, keys: int) -> list[pa.RecordBatch]:
            if kind == "join":
                return join_arrow(first, count, spacing_ms)
            return arrow(first, count, keys, spacing_ms)

        peak = PeakParts()  # read before counting the stores, which reads all of RocksDB
        started = time.perf_counter()
        for first in range(0, size, LOAD_BATCH):
            peak.batch(driver, records(first, min(LOAD_BATCH, size - first), size // 4), extra)
        load_s = time.perf_counter() - started
        times, next_record = [], size
        for _ in range(batches):  # new keys, after the loaded records in event time
            batch = records(next_record, TIMED_BATCH, 2**40)
            times.append(peak.batch(driver, batch, extra) * 1000)
            next_record += TIMED_BATCH
        live, stored, stored_bytes = count_stores(kind)
        task_cache.close_all()
    return {
        "kind": kind, "size": size, "records": next_record, "live": live, "stored_keys": stored,
        "load_s": load_s, "batch_ms": statistics.median(times), "peak_rss_mb": peak.peak_mb,
        "cache_bytes": settings["statestore.cache.max.bytes"],
        "block_cache_capacity_mb": settings["platform.rocksdb.block.cache.bytes"] / MiB,
        **peak.parts, "b_malloc_in_use_mb": b_malloc_mb[0], "b_malloc_free_mb": b_malloc_mb[1],
        **formula_mb(kind, settings, b_mb, next_record, stored, stored_bytes),
    }  # fmt: skip


def main() -> None:
    figures = sizes_in_children_with(__file__, __doc__.split("\n")[0], "1000000,4000000", {
        "--kind": {"choices": KINDS, "default": "time"},
        "--cache-mb": {"type": int, "default": None},  # None: the platform's default
    })  # fmt: skip
    if figures is None:
        return
    what = "buffered join records" if figures[0]["kind"] == "join" else "live windows"
    for result in figures:
        print(f"{result['kind']:>7}: {result['live']:>11,} {what} ({result['records']:,} "
              f"records): peak RSS {result['peak_rss_mb']:7,.0f} MiB, formula "
              f"{result['formula_mb']:7,.0f} MiB (B {result['b_mb']:.0f} + R "
              f"{result['r_mb']:.0f} + A {result['a_mb']:.0f} + T {result['t_mb']:.0f}), "
              f"measured / formula "
              f"{result['peak_rss_mb'] / result['formula_mb']:.2f}, median "
              f"{result['batch_ms']:7.1f} ms per 10k-record batch, loading "
              f"{result['load_s']:6.1f} s, cache {result['cache_bytes'] / MiB:g} MiB"
              " (path: the runtime's task, TaskBatchRunner)")  # fmt: skip
        print(
            f"{'':>9}at the peak: {result['in_batch_mb']:.0f} MiB above its batch's end, "
            f"where: block cache {result['block_cache']:.0f} of "
            f"{result['block_cache_capacity_mb']:.0f} MiB (memtables "
            f"{result['memtables']:.0f}), table readers {result['table_readers']:.0f} MiB; "
            f"malloc in use {result['malloc_in_use_mb']:.0f} MiB, freed but kept "
            f"{result['malloc_free_mb']:.0f} MiB ({result['b_malloc_in_use_mb']:.0f} and "
            f"{result['b_malloc_free_mb']:.0f} in B); Arrow pool {result['arrow_pool_mb']:.0f} MiB"
        )
        if result["live"] != result["records"]:  # every record should have stayed live
            print(f"  {result['records'] - result['live']:,} records' windows closed or expired")
    ratio = figures[-1]["peak_rss_mb"] / figures[0]["peak_rss_mb"]
    print(f"peak RSS {figures[-1]['live']:,} / {figures[0]['live']:,} {what}: "
          f"{ratio:.2f}x (flat: ~1.0)")  # fmt: skip


if __name__ == "__main__":
    main()
