"""Windowed count into Delta, ours against Spark's native windowed aggregation, same run.

Views per key per 5-minute tumbling window (1-minute grace), final counts only: ours is
``group_by_key().windowed_by(TimeWindows.of_size_and_grace(5 min, 1 min))
.emit_strategy(EmitStrategy.on_window_close()).count()`` into a Delta sink (exactly_once_v2);
native is ``groupBy(window(timestamp, "5 minutes"), key).count()`` with a 1-minute watermark,
append mode (a window's row once the watermark passes it), into Delta, ``availableNow``. The
records are e2e_bench's (1,000 keys by default here 10,000, 10 ms apart, 3% out of order), one
batch each. Median of ``--repeats`` runs, alternating which goes first, after a warm-up of
both; the execution path of ours is printed.

    .venv/bin/python bench/window_bench.py --records 2000000 --keys 10000 --repeats 3

``--cluster``: the same on the two-worker standalone cluster (local-master shortcuts off).

``--kind`` picks the window kind (default ``time``, the tumbling windows above):

- ``session``: ours ``windowed_by(SessionWindows.of_inactivity_gap_and_grace(5 min, 1 min))``
  counted on window close; native ``groupBy(session_window(timestamp, "5 minutes"), key)
  .count()`` with the same watermark, append mode. The same sessions (a key's views with gaps
  under 5 minutes; both ends inclusive in ours, Spark's end is the last view + the gap).
- ``sliding``: ours ``SlidingWindows.of_time_difference_and_grace(5 min, 1 min)`` counted on
  window close; native a sliding ``window(timestamp, "5 minutes", "1 minute")``. Not the same
  windows: Kafka Streams' sliding windows are the (up to two) windows a record starts or ends,
  Spark's are hopping windows of 5 minutes every minute (five per record). Each is what a team
  reaches for to count "the last 5 minutes" in its engine; the row counts differ, and are
  printed.

    .venv/bin/python bench/window_bench.py --kind session --records 2000000 --keys 10000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
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
    SessionWindows,
    SlidingWindows,
    StreamingJob,
    StreamsBuilder,
    TimeWindows,
)
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics  # noqa: E402
from streamplatform.serdes import Serdes  # noqa: E402
from streamplatform.spark import spark_session  # noqa: E402

WINDOW_MS = 5 * 60 * 1000
GRACE_MS = 60 * 1000


def window_records(records: int, keys: int, seed: int):
    """The bench's records as (key, value, timestamp): ``keys`` keys, 10 ms apart, 3% out of
    order within the grace."""
    import random

    rng = random.Random(seed)
    start = 1_767_225_600_000
    for index in range(records):
        timestamp = start + index * 10
        if rng.random() < 0.03:
            timestamp -= rng.randrange(GRACE_MS // 2)  # out of order, within the grace
        yield f"user-{rng.randrange(keys):05d}", b'{"page": "/home"}', timestamp


def produce(settings: dict, topic: str, records: int, keys: int, seed: int) -> None:
    produce_all(settings, ((topic, *record) for record in window_records(records, keys, seed)))


def windows_of(kind: str):
    """The bench's windows of ``kind`` (time, session, sliding): 5 minutes, 1 minute of grace."""
    if kind == "session":
        return SessionWindows.of_inactivity_gap_and_grace(WINDOW_MS, GRACE_MS)
    if kind == "sliding":
        return SlidingWindows.of_time_difference_and_grace(WINDOW_MS, GRACE_MS)
    return TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS)


def topology(topic: str, kind: str = "time"):
    b = StreamsBuilder()
    (b.stream(topic, Serdes.string(), Serdes.bytes()).group_by_key()
     .windowed_by(windows_of(kind))
     .emit_strategy(EmitStrategy.on_window_close()).count()
     .to_stream().to("counts"))  # fmt: skip
    return b.build()


def run_ours(spark, settings, topic: str, tmp: Path, name: str, kind: str = "time"
             ) -> tuple[float, int, list]:  # fmt: skip
    config = job_config(settings, tmp, name, 10_000_000)  # one batch
    job = StreamingJob(topology(topic, kind), config, spark=spark, delta_sinks=["counts"])
    elapsed, results = run_to_the_end(job)
    rows = spark.read.format("delta").load(str(tmp / "delta" / name / "counts")).count()
    return elapsed, rows, results


def run_native(spark, settings, topic: str, tmp: Path, name: str, kind: str = "time"
               ) -> tuple[float, int]:  # fmt: skip
    from pyspark.sql import functions as F

    minutes = f"{WINDOW_MS // 60_000} minutes"
    window = {
        "time": lambda: F.window("timestamp", minutes),
        "session": lambda: F.session_window("timestamp", minutes),
        "sliding": lambda: F.window("timestamp", minutes, "1 minute"),
    }[kind]()
    counts = (
        kafka_stream(spark, settings, topic)
        .select(F.col("key").cast("string").alias("key"), "timestamp")
        .withWatermark("timestamp", f"{GRACE_MS // 1000} seconds")
        .groupBy(window, "key")
        .count()
    )
    return native_to_delta(spark, counts, tmp, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cluster", action="store_true",
                        help="a standalone master with two one-core workers "
                             "(streamplatform.local_cluster) instead of local[2]: the "
                             "local-master shortcuts are off")  # fmt: skip
    parser.add_argument("--kind", choices=("time", "session", "sliding"), default="time")
    args = parser.parse_args()
    ours: list[float] = []
    native: list[float] = []
    rows: dict[str, set[int]] = {"ours": set(), "native": set()}
    paths: set[str] = set()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker, contextlib.ExitStack() as stack:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            create_topics(settings, [TopicSpec(t, PARTITIONS) for t in ("views", "warmup")])
            produce(settings, "views", args.records, args.keys, seed=5)
            produce(settings, "warmup", args.records // 4, args.keys, seed=11)
            master = bench_master(stack, tmp, args.cluster)
            spark = spark_session(master=master, app_name="window-bench")
            run_ours(spark, settings, "warmup", tmp, "warmup-ours", args.kind)
            run_native(spark, settings, "warmup", tmp, "warmup-native", args.kind)
            for repeat, which in alternating(args.repeats):
                if which == "ours":
                    seconds, written, results = run_ours(spark, settings, "views", tmp,
                                                         f"ours-{repeat}", args.kind)  # fmt: skip
                    ours.append(seconds)
                    paths |= {r.path for r in results}
                    print(f"    where ours' time goes: {format_phases(phases(results))}")
                else:
                    seconds, written = run_native(spark, settings, "views", tmp,
                                                  f"native-{repeat}", args.kind)  # fmt: skip
                    native.append(seconds)
                rows[which].add(written)
                print(f"  run {repeat} {which:6s}: {args.records / seconds:>9,.0f} records/s "
                      f"({seconds:.1f} s, {written:,} windows)", flush=True)  # fmt: skip
            spark.stop()
    where = "a standalone master, 2 workers of 1 core" if args.cluster else "local[2]"
    print(f"{args.records:,} records, {args.keys:,} keys, {PARTITIONS} partitions, {where}, "
          f"5-minute {args.kind} windows, median of {args.repeats} runs each")  # fmt: skip
    for name, runs, written, path in (
        (f"ours   {args.kind} windowed count on window close -> Delta", ours, rows["ours"],
         ", ".join(sorted(paths))),
        (f"native groupBy({args.kind} window, key).count(), append  -> Delta", native,
         rows["native"],
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
