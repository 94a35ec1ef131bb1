"""End to end: Kafka -> dedup -> Delta, ours (exactly once) against Spark's native streaming.

Same run, same data: N records (default 2M) in a 3-partition topic on the local broker, 20%
duplicates (same key and id within the interval), 3% out of order. Both on ``local[2]``:

- ours: ``StreamingJob`` running ``deduplicate_by_key_value(id, 10 min)`` with a Delta sink,
  ``processing.guarantee=exactly_once_v2``, everything in one micro-batch, as ``availableNow``
  does;
- native: Structured Streaming Kafka source -> ``withWatermark`` ->
  ``dropDuplicatesWithinWatermark([key, id])`` -> Delta sink, ``trigger(availableNow=True)``.

Both run once on other data of the same size first (``--warmup-records``, default
``--records``): the JVM's class loading and JIT are then charged to neither. After a 500k
warm-up the first timed run, whichever path it was, still spent several seconds more JVM CPU
than the later ones and warmed the code both paths share (the Kafka reader, the parquet and
Delta writers) for the next. Then ``--repeats`` times each in alternating order on
the same data. Prints records/s of both
(median, spread) and the ratio; then our batch latency p50/p99 with 10k-record batches
(``--latency-records`` records), and the peak RSS of the Python workers during our runs (summed
over Spark's Python worker processes, sampled every 0.2 s).

    .venv/bin/python bench/e2e_bench.py [--records 2000000] [--repeats 5] [--latency-records 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from streamplatform import StreamsBuilder, Topology
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes
from streamplatform.spark import spark_session

INTERVAL_MS = 10 * 60 * 1000
PARTITIONS = 3


def bench_records(records: int, seed: int = 5) -> Iterator[tuple[str, str, int]]:
    """The bench's records as (key, JSON value, timestamp): 20% repeat a (key, id) of the last
    500 new ones, 3% are up to half an interval out of order."""
    rng = random.Random(seed)
    recent: list[tuple[str, str]] = []
    start = 1_767_225_600_000
    for index in range(records):
        if recent and rng.random() < 0.20:
            key, tx_id = rng.choice(recent[-500:])
        else:
            key, tx_id = f"acct-{rng.randrange(1000):04d}", f"tx-{index:08d}"
            recent.append((key, tx_id))
        timestamp = start + index * 10
        if rng.random() < 0.03:
            timestamp -= rng.randrange(INTERVAL_MS // 2)
        yield key, json.dumps({"id": tx_id, "amount": index % 997}), timestamp


def produce(settings: dict, topic: str, records: int, seed: int = 5) -> None:
    out = producer(settings, **{"linger.ms": 50, "batch.size": 1_000_000})
    for index, (key, value, timestamp) in enumerate(bench_records(records, seed)):
        out.produce(topic, key=key, value=value, timestamp=timestamp)
        if index % 20_000 == 0:
            out.poll(0)
    assert out.flush(120) == 0


def dedup_topology(topic: str) -> Topology:
    """The bench's job: deduplicate_by_key_value(id, 10 min) into the Delta sink."""
    b = StreamsBuilder()
    stream = b.stream(topic, Serdes.string(), Serdes.json())
    stream.deduplicate_by_key_value(lambda k, v: v["id"], INTERVAL_MS).to("deduplicated")
    return b.build()


class WorkerMemory:
    """Samples the summed RSS of Spark's Python worker processes; keeps the peak."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            total = 0
            for status in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    if (
                        b"pyspark.daemon" in status.read_bytes()
                        or b"pyspark/worker" in status.read_bytes()
                    ):
                        for line in (status.parent / "status").read_text().splitlines():
                            if line.startswith("VmRSS:"):
                                total += int(line.split()[1])
                except OSError:
                    continue
            self.peak_mb = max(self.peak_mb, total / 1024)
            time.sleep(0.2)

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_ours(spark, settings, topic, tmp: Path, per_partition_cap: int, name: str):
    config = {
        "application.id": name,
        "bootstrap.servers": settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(tmp / name / "state"),
        "platform.delta.root": str(tmp / "delta"),
        "platform.max.records.per.batch": per_partition_cap,
    }
    job = StreamingJob(dedup_topology(topic), config, spark=spark, delta_sinks=["deduplicated"])
    started = time.perf_counter()
    results = job.run_until_caught_up()
    elapsed = time.perf_counter() - started
    job.close()
    rows = spark.read.format("delta").load(str(tmp / "delta" / name / "deduplicated")).count()
    return elapsed, rows, results


def run_native(spark, settings, topic, tmp: Path, name: str = "native"):
    from pyspark.sql import functions as F

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings["bootstrap.servers"])
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select(
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
            "timestamp",
            "partition",
            "offset",
        )  # fmt: skip
        .withColumn("id", F.get_json_object("value", "$.id"))
        .withWatermark("timestamp", f"{INTERVAL_MS // 1000} seconds")
        .dropDuplicatesWithinWatermark(["key", "id"])
    )
    path = str(tmp / name)
    started = time.perf_counter()
    query = (
        stream.writeStream.format("delta")
        .option("checkpointLocation", str(tmp / f"{name}-checkpoint"))
        .trigger(availableNow=True)
        .start(path)
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed, spark.read.format("delta").load(path).count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--latency-records", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each, alternating")
    parser.add_argument("--warmup-records", type=int, help="default: --records")
    args = parser.parse_args()
    if args.warmup_records is None:
        args.warmup_records = args.records
    ours: list[float] = []
    native: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            topics = [TopicSpec(t, PARTITIONS) for t in ("bench", "latency", "warmup")]
            create_topics(settings, topics)
            produce(settings, "bench", args.records)
            produce(settings, "latency", args.latency_records, seed=9)
            produce(settings, "warmup", args.warmup_records, seed=11)
            spark = spark_session(master="local[2]", app_name="e2e-bench")
            # Both paths once on other data first: the JVM's class loading and JIT would
            # otherwise be charged to whichever runs first.
            run_ours(spark, settings, "warmup", tmp, args.warmup_records, "warmup-ours")
            run_native(spark, settings, "warmup", tmp, "warmup-native")
            rows: dict[str, set[int]] = {"ours": set(), "native": set()}
            with WorkerMemory() as memory:
                for repeat in range(args.repeats):
                    # Alternate which goes first: load from other processes drifts.
                    for which in ("ours", "native") if repeat % 2 == 0 else ("native", "ours"):
                        if which == "ours":
                            seconds, written, _ = run_ours(
                                spark, settings, "bench", tmp, args.records, f"ours-{repeat}"
                            )
                            ours.append(seconds)
                        else:
                            seconds, written = run_native(
                                spark, settings, "bench", tmp, f"native-{repeat}"
                            )
                            native.append(seconds)
                        rows[which].add(written)
                        rate = args.records / seconds
                        print(f"  run {repeat} {which:6s}: {rate:>9,.0f} records/s "
                              f"({seconds:.1f} s, {written:,} rows)", flush=True)  # fmt: skip
            _, _, batches = run_ours(
                spark, settings, "latency", tmp, 10_000 // PARTITIONS, "latency"
            )
            spark.stop()
    n = args.records
    print(f"{n:,} records, {PARTITIONS} partitions, local[2], median of {args.repeats} runs each "
          "(alternating order, after a warm-up of both)")  # fmt: skip
    for name, runs, written in (
        ("ours   StreamingJob exactly_once_v2 -> Delta ", ours, rows["ours"]),
        ("native dropDuplicatesWithinWatermark -> Delta", native, rows["native"]),
    ):
        median = statistics.median(runs)
        counts = " or ".join(f"{count:,}" for count in sorted(written))
        print(f"{name}: {n / median:>9,.0f} records/s ({median:.1f} s, runs "
              f"{min(runs):.1f}-{max(runs):.1f} s; {counts} rows)")  # fmt: skip
    if len(rows["ours"]) > 1:
        print("WARNING: our runs wrote different row counts from the same data")
    ratios = sorted(b / a for a, b in zip(ours, native, strict=True))
    print(f"ratio ours / native: {statistics.median(native) / statistics.median(ours):.2f}x "
          f"(per pair: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    latencies = sorted(b.duration_ms for b in batches)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(
        f"batch latency, ~10k-record batches ({len(latencies)} batches): "
        f"p50 {statistics.median(latencies):.0f} ms, p99 {p99} ms"
    )
    print(f"peak RSS of the Python workers during our runs: {memory.peak_mb:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
