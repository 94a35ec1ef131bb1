"""A clickstream job as a team writes it, ours against the same in Spark's native engine, same
run: the shape of issue 44's report, on generated traffic.

Clicks keyed by user (JSON ``{"id", "page"}``, 5% sent twice within a minute, 3% out of order
within the grace) and impressions of the same users (one for every four clicks), 3 partitions
each, event time the Kafka timestamp, 100 ms apart per topic.

Ours, one job (exactly_once_v2, the default batch cap, four Delta sinks):
- ``deduplicate_by_key_value(id, 10 minutes)`` of the clicks, then from the deduplicated clicks
- per-user sessions (5 minutes of inactivity, 1 minute of grace), counted, final results only;
- per-page counts in 1-minute windows (1 minute of grace) after ``group_by(page)``, final only;
- each click joined with its user's impressions of the 10 minutes before it;
- the deduplicated clicks themselves.

Native, as a Spark team writes it: one query per output (a query has one sink), each over
Spark's Kafka source with ``dropDuplicatesWithinWatermark(id)`` (10-minute watermark) first,
then ``session_window`` / ``window`` counts or an interval join with the impressions, append
mode into Delta, ``availableNow``; the four queries' times summed.

    .venv/bin/python bench/clickstream_bench.py --records 400000 --repeats 1

The counts differ where the semantics do: Spark's watermark is one per query, the lowest over
all partitions, advanced between micro-batches; ours is Kafka Streams' stream time per task.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
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

from streamplatform import (  # noqa: E402
    EmitStrategy,
    JoinWindows,
    SessionWindows,
    StreamingJob,
    StreamsBuilder,
    TimeWindows,
)
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics  # noqa: E402
from streamplatform.serdes import Serdes  # noqa: E402
from streamplatform.spark import spark_session  # noqa: E402

MINUTE = 60_000
SINKS = ("clicks-deduplicated", "sessions", "page-counts", "clicks-with-impressions")


def produce(settings: dict, prefix: str, clicks: int, users: int, seed: int) -> None:
    rng = random.Random(seed)
    start = 1_767_225_600_000

    def records():
        for n in range(clicks):
            timestamp = start + n * 100
            if rng.random() < 0.03:
                timestamp -= rng.randrange(30_000)  # out of order, within every grace
            user = f"user-{rng.randrange(users):05d}"
            click = json.dumps({"id": f"c{n}", "page": f"/p{rng.randrange(100):03d}"}).encode()
            yield f"{prefix}clicks", user, click, timestamp
            if rng.random() < 0.05:  # sent twice
                yield f"{prefix}clicks", user, click, timestamp + rng.randrange(MINUTE)
            if n % 4 == 0:
                shown = json.dumps({"id": f"i{n}"}).encode()
                yield f"{prefix}impressions", user, shown, timestamp - rng.randrange(MINUTE)

    produce_all(settings, records())


def topology(prefix: str):
    b = StreamsBuilder()
    clicks = b.stream(f"{prefix}clicks", Serdes.string(), Serdes.json())
    impressions = b.stream(f"{prefix}impressions", Serdes.string(), Serdes.json())
    deduplicated = clicks.deduplicate_by_key_value(lambda user, click: click["id"], 10 * MINUTE)
    deduplicated.to("clicks-deduplicated")
    (deduplicated.group_by_key()
     .windowed_by(SessionWindows.of_inactivity_gap_and_grace(5 * MINUTE, MINUTE))
     .emit_strategy(EmitStrategy.on_window_close()).count()
     .to_stream().map(lambda w, n: (f"{w.key}@{w.window.start}", n))
     .to("sessions", key_serde=Serdes.string(), value_serde=Serdes.long()))  # fmt: skip
    (deduplicated.group_by(lambda user, click: click["page"], key_serde=Serdes.string())
     .windowed_by(TimeWindows.of_size_and_grace(MINUTE, MINUTE))
     .emit_strategy(EmitStrategy.on_window_close()).count()
     .to_stream().map(lambda w, n: (f"{w.key}@{w.window.start}", n))
     .to("page-counts", key_serde=Serdes.string(), value_serde=Serdes.long()))  # fmt: skip
    deduplicated.join(
        impressions, lambda click, shown: {"click": click["id"], "impression": shown["id"]},
        JoinWindows.of_time_difference_with_no_grace(10 * MINUTE).after(0),
    ).to("clicks-with-impressions")  # fmt: skip
    return b.build()


def run_ours(spark, settings, prefix: str, tmp: Path, name: str):
    config = job_config(settings, tmp, name, 100_000)  # the default cap
    job = StreamingJob(topology(prefix), config, spark=spark, delta_sinks=list(SINKS))
    elapsed, results = run_to_the_end(job)
    rows = {sink: spark.read.format("delta").load(str(tmp / "delta" / name / sink)).count()
            for sink in SINKS}  # fmt: skip
    return elapsed, rows, results


def run_native(spark, settings, prefix: str, tmp: Path, name: str):
    from pyspark.sql import functions as F

    def deduplicated():
        return (
            kafka_stream(spark, settings, f"{prefix}clicks")
            .select(
                F.col("key").cast("string").alias("user"),
                F.from_json(F.col("value").cast("string"), "id STRING, page STRING").alias("v"),
                "timestamp",
            )  # fmt: skip
            .select("user", "v.id", "v.page", "timestamp")
            .withWatermark("timestamp", "10 minutes")
            .dropDuplicatesWithinWatermark(["user", "id"])
        )

    queries = {
        "clicks-deduplicated": lambda: deduplicated(),
        "sessions": lambda: deduplicated()
        .groupBy(F.session_window("timestamp", "5 minutes"), "user").count(),
        "page-counts": lambda: deduplicated()
        .groupBy(F.window("timestamp", "1 minute"), "page").count(),
        "clicks-with-impressions": lambda: deduplicated().alias("c").join(
            kafka_stream(spark, settings, f"{prefix}impressions")
            .select(F.col("key").cast("string").alias("user"),
                    F.from_json(F.col("value").cast("string"), "id STRING").alias("v"),
                    "timestamp")  # fmt: skip
            .select("user", F.col("v.id").alias("impression"), F.col("timestamp").alias("shown"))
            .withWatermark("shown", "10 minutes").alias("i"),
            F.expr("c.user = i.user AND i.shown BETWEEN c.timestamp - INTERVAL 10 MINUTES "
                   "AND c.timestamp"),
        ).select("c.user", "c.id", "impression"),
    }  # fmt: skip
    seconds, rows = 0.0, {}
    for sink, frame in queries.items():
        elapsed, rows[sink] = native_to_delta(spark, frame(), tmp, f"{name}-{sink}")
        seconds += elapsed
    return seconds, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=400_000, help="clicks")
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="a standalone master with two one-core workers instead of local[2]",
    )
    args = parser.parse_args()  # fmt: skip
    ours: list[float] = []
    native: list[float] = []
    rows: dict[str, list[dict]] = {"ours": [], "native": []}
    paths: set[str] = set()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker, contextlib.ExitStack() as stack:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            topics = [f"{p}{t}" for p in ("", "warmup-") for t in ("clicks", "impressions")]
            create_topics(settings, [TopicSpec(t, PARTITIONS) for t in topics])
            create_topics(settings, [TopicSpec(f"{p}clicks-dlq", 1) for p in ("", "warmup-")])
            produce(settings, "", args.records, args.users, seed=5)
            produce(settings, "warmup-", args.records // 10, args.users, seed=11)
            master = bench_master(stack, tmp, args.cluster)
            spark = spark_session(master=master, app_name="clickstream-bench")
            run_ours(spark, settings, "warmup-", tmp, "warmup-ours")
            run_native(spark, settings, "warmup-", tmp, "warmup-native")
            for repeat, which in alternating(args.repeats):
                if which == "ours":
                    seconds, written, results = run_ours(spark, settings, "", tmp,
                                                         f"ours-{repeat}")  # fmt: skip
                    ours.append(seconds)
                    paths |= {r.path for r in results}
                    print(f"    where ours' time goes: {format_phases(phases(results))}")
                else:
                    seconds, written = run_native(spark, settings, "", tmp, f"native-{repeat}")
                    native.append(seconds)
                rows[which].append(written)
                print(f"  run {repeat} {which:6s}: {args.records / seconds:>9,.0f} clicks/s "
                      f"({seconds:.1f} s; rows {written})", flush=True)  # fmt: skip
            spark.stop()
    where = "a standalone master, 2 workers of 1 core" if args.cluster else "local[2]"
    print(f"{args.records:,} clicks (+5% sent twice, +1 impression per 4), {args.users:,} users, "
          f"{PARTITIONS} partitions, {where}, median of {args.repeats} runs")  # fmt: skip
    for name, runs, path in (
        ("ours   one job, four Delta sinks", ours, ", ".join(sorted(paths))),
        ("native four queries, summed", native, "Structured Streaming, availableNow"),
    ):  # fmt: skip
        median = statistics.median(runs)
        print(f"{name}: {args.records / median:>9,.0f} clicks/s ({median:.1f} s; path {path})")
    for sink in SINKS:
        print(f"  {sink}: ours {sorted({r[sink] for r in rows['ours']})} rows, "
              f"native {sorted({r[sink] for r in rows['native']})}")  # fmt: skip
    print_ratio("native", ours, native)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s in all)")
