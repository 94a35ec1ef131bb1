"""Per-page windowed counts after a re-keying, into Delta: ours against Spark's native windowed
aggregation, same run.

Clicks keyed by user (10,000 users by default), each naming one of 100 pages, 10 ms apart with
3% out of order within the grace period. Ours is ``group_by(page).windowed_by(1-minute tumbling
windows, 1 minute of grace).emit_strategy(on_window_close()).count()`` into a Delta sink
(exactly_once_v2, the default batch cap): a repartition, so the path is ``direct-stages-*``
(``--stages``: Spark's shuffle between the stages instead). Native is
``groupBy(window(timestamp, "1 minute"), page).count()`` over ``from_json(value)`` with a
1-minute watermark, append mode, into Delta, ``availableNow``. Median of ``--repeats`` runs,
alternating which goes first, after a warm-up of both. Also the time of one batch of 4 clicks
through the re-keyed job (the path it took is printed).

    .venv/bin/python bench/rekey_bench.py --records 2000000 --repeats 3

``--cluster``: the same on the two-worker standalone cluster (local-master shortcuts off).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import (  # noqa: E402
    PARTITIONS,
    alternating,
    bench_master,
    format_phases,
    job_config,
    kafka_stream,
    native_to_delta,
    phases,
    print_ratio,
    produce_all,
    run_to_the_end,
)

from streamplatform import EmitStrategy, StreamingJob, StreamsBuilder, TimeWindows  # noqa: E402
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics  # noqa: E402
from streamplatform.serdes import Serdes  # noqa: E402
from streamplatform.spark import spark_session  # noqa: E402

WINDOW_MS = 60 * 1000
GRACE_MS = 60 * 1000
PAGES = 100


def produce(settings: dict, topic: str, records: int, users: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    start = 1_767_225_600_000
    values = [json.dumps({"page": f"/p{page:03d}"}).encode() for page in range(PAGES)]

    def clicks():
        for index in range(records):
            timestamp = start + index * 10
            if rng.random() < 0.03:
                timestamp -= rng.randrange(GRACE_MS // 2)  # out of order, within the grace
            yield topic, f"user-{rng.randrange(users):05d}", rng.choice(values), timestamp

    produce_all(settings, clicks())


def topology(topic: str):
    b = StreamsBuilder()
    (b.stream(topic, Serdes.string(), Serdes.json())
     .group_by(lambda user, click: click["page"], key_serde=Serdes.string())
     .windowed_by(TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS))
     .emit_strategy(EmitStrategy.on_window_close()).count()
     .to_stream().to("counts"))  # fmt: skip
    return b.build()


def run_ours(spark, settings, topic: str, tmp: Path, name: str, stages: bool):
    extra = {"platform.sink.driver.max.records": 0} if stages else {}
    config = job_config(settings, tmp, name, 100_000, **extra)  # the default cap
    job = StreamingJob(topology(topic), config, spark=spark, delta_sinks=["counts"])
    elapsed, results = run_to_the_end(job)
    rows = spark.read.format("delta").load(str(tmp / "delta" / name / "counts")).count()
    return elapsed, rows, results


def run_native(spark, settings, topic: str, tmp: Path, name: str) -> tuple[float, int]:
    from pyspark.sql import functions as F

    counts = (
        kafka_stream(spark, settings, topic)
        .select(
            F.from_json(F.col("value").cast("string"), "page STRING").alias("v"), "timestamp"
        )  # fmt: skip
        .select("v.page", "timestamp")
        .withWatermark("timestamp", f"{GRACE_MS // 1000} seconds")
        .groupBy(F.window("timestamp", f"{WINDOW_MS // 60_000} minute"), "page")
        .count()
    )
    return native_to_delta(spark, counts, tmp, name)


def four_clicks(spark, settings, tmp: Path, stages: bool) -> tuple[float, str]:
    """One batch of four clicks on two partitions through the re-keyed job (after a batch
    that warmed the job up): its seconds and path."""
    name = f"four-{'stages' if stages else 'direct'}"
    create_topics(settings, [TopicSpec(name, 2)])
    start = 1_767_268_800_000
    produce_all(settings, iter([(name, "u1", b'{"page": "a"}', start)]))
    extra = {"platform.sink.driver.max.records": 0} if stages else {}
    job = StreamingJob(topology(name), job_config(settings, tmp, name, 100_000, **extra),
                       spark=spark, delta_sinks=["counts"])  # fmt: skip
    job.run_until_caught_up()
    clicks = [(name, f"u{i}", json.dumps({"page": "ab"[i % 2]}).encode(),
               start + 60_000 * (i + 1)) for i in range(4)]  # fmt: skip
    produce_all(settings, iter(clicks))
    started = time.perf_counter()
    result = job.run_batch()
    elapsed = time.perf_counter() - started
    job.close()
    assert result is not None and result.records_in == 4, result
    return elapsed, result.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--stages",
        action="store_true",
        help="ours on the stages path (Spark's shuffle between the stages)",
    )
    parser.add_argument("--cluster", action="store_true",
                        help="a standalone master with two one-core workers "
                             "(streamplatform.local_cluster) instead of local[2]: the "
                             "local-master shortcuts are off")  # fmt: skip
    args = parser.parse_args()
    ours: list[float] = []
    native: list[float] = []
    rows: dict[str, set[int]] = {"ours": set(), "native": set()}
    paths: set[str] = set()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker, contextlib.ExitStack() as stack:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            create_topics(settings, [TopicSpec(t, PARTITIONS) for t in ("clicks", "warmup")])
            produce(settings, "clicks", args.records, args.users, seed=5)
            produce(settings, "warmup", args.records // 4, args.users, seed=11)
            master = bench_master(stack, tmp, args.cluster)
            spark = spark_session(master=master, app_name="rekey-bench")
            four_s, four_path = four_clicks(spark, settings, tmp, args.stages)
            run_ours(spark, settings, "warmup", tmp, "warmup-ours", args.stages)
            run_native(spark, settings, "warmup", tmp, "warmup-native")
            for repeat, which in alternating(args.repeats):
                if which == "ours":
                    seconds, written, results = run_ours(
                        spark, settings, "clicks", tmp, f"ours-{repeat}", args.stages
                    )
                    ours.append(seconds)
                    paths |= {r.path for r in results}
                    print(f"    where ours' time goes: {format_phases(phases(results))}")
                else:
                    seconds, written = run_native(spark, settings, "clicks", tmp,
                                                  f"native-{repeat}")  # fmt: skip
                    native.append(seconds)
                rows[which].add(written)
                print(f"  run {repeat} {which:6s}: {args.records / seconds:>9,.0f} records/s "
                      f"({seconds:.1f} s, {written:,} windows)", flush=True)  # fmt: skip
            spark.stop()
    where = "a standalone master, 2 workers of 1 core" if args.cluster else "local[2]"
    print(f"{args.records:,} records, {args.users:,} users, {PAGES} pages, {PARTITIONS} "
          f"partitions, {where}, 1-minute windows, median of {args.repeats} runs each")  # fmt: skip
    print(f"one batch of 4 clicks through the re-keyed job: {four_s:.2f} s (path {four_path})")
    for name, runs, written, path in (
        ("ours   group_by(page), windowed count on close -> Delta", ours, rows["ours"],
         ", ".join(sorted(paths))),
        ("native groupBy(window, page).count(), append   -> Delta", native, rows["native"],
         "Structured Streaming, availableNow"),
    ):  # fmt: skip
        median = statistics.median(runs)
        counts = " or ".join(f"{count:,}" for count in sorted(written))
        print(f"{name}: {args.records / median:>9,.0f} records/s ({median:.1f} s; {counts} "
              f"windows; path {path})")  # fmt: skip
    print_ratio("native", ours, native)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
