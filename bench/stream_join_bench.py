"""Stream-stream join into Delta, ours against Spark's native stream-stream join, same run.

Orders joined with their payments within 10 minutes (1 minute of grace), an inner join. Ours:
``orders.join(payments, lambda o, p: o + b"|" + p,
JoinWindows.of_time_difference_and_grace(10 min, 1 min))`` into a Delta sink (exactly_once_v2,
one batch). Native: two Kafka ``readStream``s, each ``withWatermark(timestamp, "1 minute")``,
joined on ``key = key AND payment_ts BETWEEN order_ts - 10 minutes AND order_ts + 10
minutes`` (Spark's stream-stream inner join with watermarks and a time-range condition),
append mode into Delta, ``availableNow``. The records: two topics of e2e_bench's partition
count, key = order id (each order its own id, so ~555k orders for 1M records), an order's
payments on its order's partition (same key, default partitioner); ~80% of orders get one
payment 0-12 minutes after the order (a sixth of them outside the window); timestamps rise
~10 ms apart over both topics, 3% up to 30 s out of order (within the grace). ``--records``
counts the records in: orders + payments. Median of ``--repeats`` runs, alternating which goes
first, after a warm-up of both on other data; the execution path of ours and both outputs'
row counts are printed (they may differ a little: late data is dropped by different rules).

    .venv/bin/python bench/stream_join_bench.py --records 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import (  # noqa: E402
    PARTITIONS,
    job_config,
    kafka_stream,
    native_to_delta,
    print_median,
    print_ratio,
    produce_all,
    run_to_the_end,
)

from streamplatform import JoinWindows, StreamingJob, StreamsBuilder  # noqa: E402
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics  # noqa: E402
from streamplatform.serdes import Serdes  # noqa: E402
from streamplatform.spark import spark_session  # noqa: E402

MINUTE_MS = 60 * 1000
WINDOW_MS = 10 * MINUTE_MS  # the join's time difference, either way
GRACE_MS = MINUTE_MS
PAID = 0.80  # orders with a payment
PAY_DELAY_MS = 12 * MINUTE_MS  # a payment comes 0-12 minutes after its order
RECORD_SPACING_MS = 10  # between successive records over both topics


def events(records: int, seed: int) -> list[tuple[int, int, str, str, bytes]]:
    """``records`` records over both topics as (nominal time, timestamp, topic, key, value),
    in the order they are produced (nominal time)."""
    import random

    rng = random.Random(seed)
    order_spacing = round(RECORD_SPACING_MS * (1 + PAID))  # ~1.8 records per order
    start = 1_767_225_600_000
    out: list[tuple[int, int, str, str, bytes]] = []
    order = 0
    while len(out) < records:
        at = start + order * order_spacing
        key = f"order-{order:08d}"
        out.append((at, 0, "orders", key, b'{"order": %d, "amount": %d}' % (order, order % 997)))
        if len(out) < records and rng.random() < PAID:
            paid_at = at + rng.randrange(PAY_DELAY_MS)
            out.append((paid_at, 0, "payments", key, b'{"paid": %d}' % (order % 997)))
        order += 1
    out.sort(key=lambda event: event[0])
    for index, (at, _, topic, key, value) in enumerate(out):
        timestamp = at
        if rng.random() < 0.03:
            timestamp -= rng.randrange(GRACE_MS // 2)  # out of order, within the grace
        out[index] = (at, timestamp, topic, key, value)
    return out


def produce(settings: dict, prefix: str, records: int, seed: int) -> None:
    """``records`` records into ``{prefix}orders`` and ``{prefix}payments``."""
    records_out = events(records, seed)
    produce_all(settings, ((prefix + topic, key, value, timestamp)
                           for _, timestamp, topic, key, value in records_out))  # fmt: skip


def topology(prefix: str):
    b = StreamsBuilder()
    orders = b.stream(f"{prefix}orders", Serdes.string(), Serdes.bytes())
    payments = b.stream(f"{prefix}payments", Serdes.string(), Serdes.bytes())
    windows = JoinWindows.of_time_difference_and_grace(timedelta(minutes=10),
                                                       timedelta(minutes=1))  # fmt: skip
    orders.join(payments, lambda o, p: o + b"|" + p, windows).to(
        "joined", Serdes.string(), Serdes.bytes()
    )
    return b.build()


def run_ours(spark, settings, prefix: str, tmp: Path, name: str) -> tuple[float, int, set[str]]:
    config = job_config(settings, tmp, name, 10_000_000)  # one batch
    job = StreamingJob(topology(prefix), config, spark=spark, delta_sinks=["joined"])
    elapsed, results = run_to_the_end(job)
    rows = spark.read.format("delta").load(str(tmp / "delta" / name / "joined")).count()
    return elapsed, rows, {r.path for r in results}


def run_native(spark, settings, prefix: str, tmp: Path, name: str) -> tuple[float, int]:
    from pyspark.sql import functions as F

    grace = f"{GRACE_MS // 1000} seconds"
    orders = (
        kafka_stream(spark, settings, f"{prefix}orders")
        .select(F.col("key").cast("string").alias("order_key"),
                F.col("value").alias("order_value"), F.col("timestamp").alias("order_ts"))
        .withWatermark("order_ts", grace)
    )  # fmt: skip
    payments = (
        kafka_stream(spark, settings, f"{prefix}payments")
        .select(F.col("key").cast("string").alias("payment_key"),
                F.col("value").alias("payment_value"), F.col("timestamp").alias("payment_ts"))
        .withWatermark("payment_ts", grace)
    )  # fmt: skip
    minutes = WINDOW_MS // MINUTE_MS
    joined = orders.join(
        payments,
        F.expr(
            f"payment_key = order_key AND payment_ts BETWEEN order_ts - interval {minutes} "
            f"minutes AND order_ts + interval {minutes} minutes"
        ),
        "inner",
    ).select(
        F.col("order_key").alias("key"),
        F.concat("order_value", F.lit(b"|"), "payment_value").alias("value"),
        F.greatest("order_ts", "payment_ts").alias("timestamp"),
    )
    return native_to_delta(spark, joined, tmp, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records in: orders + payments")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ours: list[float] = []
    native: list[float] = []
    rows: dict[str, set[int]] = {"ours": set(), "native": set()}
    paths: set[str] = set()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            create_topics(settings, [TopicSpec(p + t, PARTITIONS) for p in ("", "warmup-")
                                     for t in ("orders", "payments")])  # fmt: skip
            produce(settings, "", args.records, seed=5)
            produce(settings, "warmup-", args.records // 4, seed=11)
            spark = spark_session(master="local[2]", app_name="stream-join-bench")
            try:
                run_ours(spark, settings, "warmup-", tmp, "warmup-ours")
                run_native(spark, settings, "warmup-", tmp, "warmup-native")
                for repeat in range(args.repeats):
                    for which in ("ours", "native") if repeat % 2 == 0 else ("native", "ours"):
                        if which == "ours":
                            seconds, written, used = run_ours(spark, settings, "", tmp,
                                                              f"ours-{repeat}")  # fmt: skip
                            ours.append(seconds)
                            paths |= used
                        else:
                            seconds, written = run_native(spark, settings, "", tmp,
                                                          f"native-{repeat}")  # fmt: skip
                            native.append(seconds)
                        rows[which].add(written)
                        print(f"  run {repeat} {which:6s}: {args.records / seconds:>9,.0f} "
                              f"records/s ({seconds:.1f} s, {written:,} joined rows)",
                              flush=True)  # fmt: skip
            finally:
                spark.stop()
    print(f"{args.records:,} records in (orders + payments), {PARTITIONS} partitions each, "
          f"local[2], inner join within 10 minutes (1 minute grace), median of {args.repeats} "
          "runs each (alternating order, after a warm-up of both)")  # fmt: skip
    for name, runs, written, path in (
        ("ours   KStream.join(KStream, JoinWindows) -> Delta", ours, rows["ours"],
         ", ".join(sorted(paths))),
        ("native stream-stream join, watermarks     -> Delta", native, rows["native"],
         "Structured Streaming, availableNow"),
    ):  # fmt: skip
        print_median(name, args.records, runs, written, "joined rows", path)
    if len(rows["ours"]) > 1:
        print("WARNING: our runs wrote different row counts from the same data")
    print_ratio("native", ours, native)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
