"""End to end with the Delta root on object storage: the e2e dedup (Kafka -> dedup -> Delta) with
``platform.delta.root`` on the local S3 server against the same job on a local disk, same run,
same data.

e2e_bench's records (N, default 2M, 20% duplicates, 3% out of order) in a 3-partition topic on
the local broker; ``deduplicate_by_key_value(id, 10 min)`` into a Delta sink,
``processing.guarantee=exactly_once_v2``, everything in one micro-batch, on ``local[2]``. The
S3 root is ``s3://streamplatform/...`` on ``streamplatform.storage.local_s3.LocalS3`` (moto's S3
API on 127.0.0.1, one Python process), reached by delta-rs and pyarrow through the S3 API and
by Spark through S3A. Both run once on other data first (``--warmup-records``, default
``--records``), then ``--repeats`` times in alternating order.

Prints records/s of each (median, spread), the ratio local / S3, the execution path each took,
where the time of a run goes (the batch's phases from its metrics: planning, the tasks and
their spill files, fetching and reading those files in the driver, the Delta appends, the
commit; summed over batches, medians over runs; the rest of a run is outside the batch),
and the CPU seconds the S3 server spent per S3 run (its process, from psutil): on a machine
of 2 cores the server competes with the tasks, so the ratio is the price of this server
here, not of S3.

    .venv/bin/python bench/s3_bench.py [--records 2000000] [--repeats 3]

On a local master the tasks' side files stay on this host's disk whatever the root
(JobContext.staging_root). ``--cluster``: the same on the two-worker standalone cluster
(streamplatform.local_cluster), where the local-master shortcuts are off: the side files go to
the root too, so the S3 runs upload and fetch them through the S3 API.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import (  # noqa: E402
    PARTITIONS,
    PHASES,
    bench_master,
    dedup_topology,
    format_phases,
    job_config,
    paths_of,
    phases,
    produce,
)

from streamplatform import StreamingJob  # noqa: E402
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics  # noqa: E402
from streamplatform.spark import spark_session  # noqa: E402
from streamplatform.storage.local_s3 import LocalS3  # noqa: E402


def run(spark, settings, topic, tmp: Path, records: int, name: str, root: dict) -> dict:
    """One run of the job to the end: seconds, rows written, paths, phase totals."""
    config = job_config(settings, tmp, name, records) | root
    job = StreamingJob(dedup_topology(topic), config, spark=spark, delta_sinks=["deduplicated"])
    started = time.perf_counter()
    results = job.run_until_caught_up()
    seconds = time.perf_counter() - started
    job.close()
    table = f"{config['platform.delta.root']}/{name}/deduplicated"
    rows = spark.read.format("delta").load(table).count()
    return {"seconds": seconds, "rows": rows, "paths": paths_of(results),
            "phases": phases(results)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, alternating")
    parser.add_argument("--warmup-records", type=int, help="default: --records")
    parser.add_argument("--cluster", action="store_true",
                        help="a standalone master with two one-core workers instead of "
                             "local[2] (the local-master shortcuts off)")  # fmt: skip
    args = parser.parse_args()
    warmup = args.warmup_records or args.records
    runs: dict[str, list[dict]] = {"local": [], "s3": []}
    server_cpu: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with (
            LocalBroker(tmp / "broker") as broker, LocalS3(tmp / "s3") as s3,
            contextlib.ExitStack() as stack,
        ):  # fmt: skip
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            create_topics(settings, [TopicSpec(t, PARTITIONS) for t in ("bench", "warmup")])
            produce(settings, "bench", args.records)
            produce(settings, "warmup", warmup, seed=11)
            roots = {
                "local": {"platform.delta.root": str(tmp / "delta")},
                "s3": {"platform.delta.root": f"s3://{s3.bucket}/bench", **s3.settings},
            }
            server = psutil.Process(s3.state.pid)
            master = bench_master(stack, tmp, args.cluster)
            spark = spark_session(master=master, app_name="s3-bench")
            if args.cluster:  # this driver reads the S3 tables too (row counts)
                from streamplatform import storage

                storage.configure_spark(spark, roots["s3"])
            for where in ("local", "s3"):  # the JVM's and S3A's warm-up charged to neither
                run(spark, settings, "warmup", tmp, warmup, f"warmup-{where}", roots[where])
            for repeat in range(args.repeats):
                for where in ("local", "s3") if repeat % 2 == 0 else ("s3", "local"):
                    cpu = sum(server.cpu_times()[:2])
                    result = run(spark, settings, "bench", tmp, args.records,
                                 f"{where}-{repeat}", roots[where])  # fmt: skip
                    if where == "s3":
                        server_cpu.append(sum(server.cpu_times()[:2]) - cpu)
                    runs[where].append(result)
                    print(f"  run {repeat} {where:5s}: {args.records / result['seconds']:>9,.0f}"
                          f" records/s ({result['seconds']:.1f} s, {result['rows']:,} rows, "
                          f"path {', '.join(sorted(result['paths']))})", flush=True)  # fmt: skip
            spark.stop()
    n = args.records
    where_run = "a standalone master, 2 workers of 1 core" if args.cluster else "local[2]"
    print(f"{n:,} records, {PARTITIONS} partitions, {where_run}, one batch, median of "
          f"{args.repeats} runs each (alternating order, after a warm-up of both)")  # fmt: skip
    for where in ("local", "s3"):
        seconds = [r["seconds"] for r in runs[where]]
        median = statistics.median(seconds)
        paths = sorted(set().union(*(r["paths"] for r in runs[where])))
        counts = sorted({r["rows"] for r in runs[where]})
        print(f"{where:5s} root: {n / median:>9,.0f} records/s ({median:.1f} s, runs "
              f"{min(seconds):.1f}-{max(seconds):.1f} s; {counts} rows; path "
              f"{', '.join(paths)})")  # fmt: skip
        medians = {p: statistics.median(r["phases"][p] for r in runs[where])
                   for p in (*PHASES, "batch total")}  # fmt: skip
        print("        where the time goes: " + format_phases(medians))
    local = statistics.median(r["seconds"] for r in runs["local"])
    on_s3 = statistics.median(r["seconds"] for r in runs["s3"])
    print(f"ratio S3 / local disk (records/s): {local / on_s3:.2f}x")
    print(f"the S3 server's CPU per S3 run: {statistics.median(server_cpu):.1f} s (median)")
    if {r["rows"] for r in runs["local"]} != {r["rows"] for r in runs["s3"]}:
        print("WARNING: the S3 runs wrote other row counts than the local ones")
        sys.exit(1)


if __name__ == "__main__":
    main()
