"""The Python cost per record of one task of the e2e bench, outside Spark: a diagnostic.

Runs what a Spark executor runs for ``bench/e2e_bench.py``'s dedup job, ``TaskBatchRunner.
run_partition`` with a side-output directory, over the bench's records of one partition as
Arrow batches of 10,000 rows (Spark's ``maxRecordsPerBatch``): decoding, the KIP-655 rule, the
store's prepare, the sink rows, the side file. No Kafka, no JVM: the time is all ours, so a
change to the per-record path shows here without the e2e bench's noise. Not a comparison (there
is no peer for it); the e2e bench is the one with a target.

    .venv/bin/python bench/task_profile.py [--records 600000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import pyarrow as pa
from e2e_bench import bench_records, dedup_topology

from streamplatform.runtime.executor import TaskBatchRunner
from streamplatform.runtime.rows import STREAM_COLUMNS

ARROW_BATCH = 10_000


def arrow_batches(records: int) -> list[pa.RecordBatch]:
    rows = list(bench_records(records))
    batches = []
    for start in range(0, records, ARROW_BATCH):
        part = rows[start : start + ARROW_BATCH]
        n = len(part)
        batches.append(pa.RecordBatch.from_arrays([
            pa.array([0] * n, pa.int32()), pa.array(range(start, start + n), pa.int64()),
            pa.array([r[2] for r in part], pa.int64()),
            pa.array([r[0].encode() for r in part], pa.binary()),
            pa.array([r[1].encode() for r in part], pa.binary()), pa.nulls(n, pa.string()),
        ], names=list(STREAM_COLUMNS)))  # fmt: skip
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    batches, topology = arrow_batches(args.records), dedup_topology("bench")
    times = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as directory:
            settings = {
                "application.id": "task-profile", "bootstrap.servers": "unused:9092",
                "processing.guarantee": "exactly_once_v2", "state.dir": f"{directory}/state",
            }  # fmt: skip
            runner = TaskBatchRunner(
                topology, settings, batch_id=0, last_committed=None, changelog_files={},
                partitions={"bench": 1, "deduplicated": 1},
                side_output_dir=f"{directory}/side", stream_topic="bench",
            )  # fmt: skip
            started = time.perf_counter()
            rows = sum(batch.num_rows for batch in runner.run_partition(iter(batches)))
            times.append(time.perf_counter() - started)
    best = min(times)
    print(f"{args.records:,} records -> {rows:,} rows; best of {args.repeats}: {best:.2f} s, "
          f"{best / args.records * 1e6:.2f} us/record")  # fmt: skip


if __name__ == "__main__":
    main()
