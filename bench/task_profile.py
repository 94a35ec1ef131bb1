"""The Python cost per record of one task of the e2e bench, outside Spark: a diagnostic.

Runs what a Spark executor runs for ``bench/e2e_bench.py``'s dedup job, ``TaskBatchRunner.
run_partition`` with a side-output directory, over the bench's records of one partition as
Arrow batches of 10,000 rows (Spark's ``maxRecordsPerBatch``): decoding, the KIP-655 rule, the
store's prepare, the sink rows, the side file. No Kafka, no JVM: the time is all ours, so a
change to the per-record path shows here without the e2e bench's noise. Not a comparison (there
is no peer for it); the e2e bench is the one with a target.

``--kind time|session|sliding`` runs window_bench's windowed count of that kind over its records
(10,000 keys) instead; ``--kind join`` runs stream_join_bench's join over its orders and
payments, the two topics' records in their produced order, as chunks of 10,000. ``--profile``
prints cProfile's top functions of the last run (and the callers of ``$PROFILE_CALLERS``, a
function name); ``--cache-bytes`` sets ``statestore.cache.max.bytes``.

    .venv/bin/python bench/task_profile.py [--records 600000] [--repeats 3] [--kind session|join]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time

import pyarrow as pa
from e2e_bench import bench_records, dedup_topology
from stream_join_bench import events as join_events
from stream_join_bench import topology as join_topology
from window_bench import topology as window_topology
from window_bench import window_records

from streamplatform.runtime.executor import TaskBatchRunner
from streamplatform.runtime.rows import STREAM_COLUMNS

ARROW_BATCH = 10_000


def arrow_batches(rows: list[tuple[str, str | bytes, int]]) -> list[pa.RecordBatch]:
    records = len(rows)
    batches = []
    for start in range(0, records, ARROW_BATCH):
        part = rows[start : start + ARROW_BATCH]
        n = len(part)
        batches.append(pa.RecordBatch.from_arrays([
            pa.array([0] * n, pa.int32()), pa.array(range(start, start + n), pa.int64()),
            pa.array([r[2] for r in part], pa.int64()),
            pa.array([r[0].encode() for r in part], pa.binary()),
            pa.array([_bytes(r[1]) for r in part], pa.binary()), pa.nulls(n, pa.string()),
        ], names=list(STREAM_COLUMNS)))  # fmt: skip
    return batches


def join_chunks(records: int) -> list[list[tuple]]:
    """stream_join_bench's records in their produced order, as ConsumedRecord tuples of
    partition 0 of each topic, in chunks of ARROW_BATCH."""
    offsets = {"orders": 0, "payments": 0}
    out = []
    for _, timestamp, topic, key, value in join_events(records, seed=5):
        out.append((topic, 0, offsets[topic], timestamp, key.encode(), value, []))
        offsets[topic] += 1
    return [out[start : start + ARROW_BATCH] for start in range(0, len(out), ARROW_BATCH)]


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kind", choices=("dedup", "time", "session", "sliding", "join"),
                        default="dedup")  # fmt: skip
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--cache-bytes", type=int, help="statestore.cache.max.bytes")
    args = parser.parse_args()
    chunks = None
    if args.kind == "join":
        rows, topology, sink = [], join_topology(""), "joined"
        chunks = join_chunks(args.records)
    elif args.kind == "dedup":
        rows, topology, sink = (
            list(bench_records(args.records)),
            dedup_topology("bench"),
            "deduplicated",
        )
    else:
        rows = list(window_records(args.records, 10_000, seed=5))
        topology, sink = window_topology("bench", args.kind), "counts"
    batches = arrow_batches(rows)
    times = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as directory:
            settings = {
                "application.id": "task-profile", "bootstrap.servers": "unused:9092",
                "processing.guarantee": "exactly_once_v2", "state.dir": f"{directory}/state",
                "platform.task.cache.idle.ms": 0,  # no task kept past the directory
            }  # fmt: skip
            if args.cache_bytes is not None:
                settings["statestore.cache.max.bytes"] = args.cache_bytes
            runner = TaskBatchRunner(
                topology, settings, batch_id=0, last_committed=None, changelog_files={},
                partitions={"bench": 1, "orders": 1, "payments": 1, sink: 1},
                side_output_dir=f"{directory}/side", stream_topic="bench",
            )  # fmt: skip
            profiler = (
                cProfile.Profile() if args.profile and len(times) == args.repeats - 1 else None
            )
            started = time.perf_counter()
            if profiler:
                profiler.enable()
            output = (runner.run_records(iter(chunks)) if chunks is not None
                      else runner.run_partition(iter(batches)))  # fmt: skip
            written = sum(batch.num_rows for batch in output)
            if profiler:
                profiler.disable()
            times.append(time.perf_counter() - started)
    if profiler:
        stats = pstats.Stats(profiler).sort_stats("tottime")
        stats.print_stats(25)
        if os.environ.get("PROFILE_CALLERS"):
            stats.print_callers(os.environ["PROFILE_CALLERS"])
    best = min(times)
    print(f"{args.kind}: {args.records:,} records -> {written:,} rows; best of {args.repeats}: "
          f"{best:.2f} s, {best / args.records * 1e6:.2f} us/record")  # fmt: skip


if __name__ == "__main__":
    main()
