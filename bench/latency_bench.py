"""Batch latency in continuous mode at ~10k-record batches: ours against Spark's own
Structured Streaming micro-batches, same data, same run.

- ours: ``StreamingJob.run_forever`` (continuous mode, trigger 0: the next batch starts when
  the previous one committed) running the e2e bench's dedup job (``deduplicate_by_key_value``,
  10 minutes) into a Delta sink under ``exactly_once_v2``, ``platform.max.records.per.batch``
  = 10k / 3 partitions; stopped once caught up;
- native: Structured Streaming's Kafka source with ``maxOffsetsPerTrigger`` = 10k ->
  ``withWatermark`` -> ``dropDuplicatesWithinWatermark([key, id])`` -> Delta sink, default
  trigger (the next micro-batch as soon as the previous one ended), ``triggerExecution``
  durations from its progress reports.

Ours four ways (``CONFIGURATIONS``: as before, kept tasks only, the small-batch path as a
Spark job, the defaults), all on ``local[2]`` after one warm-up run of each on other data.
Prints p50/p99 of each, the ratios to native, our per-step medians (``BatchResult.metrics``),
how many task batches found their task kept open, and the peak RSS of the Python workers and
of the driver process during each of our runs.

    .venv/bin/python bench/latency_bench.py [--records 200000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from e2e_bench import (
    INTERVAL_MS,
    PARTITIONS,
    WorkerMemory,
    kafka_stream,
    ours_job,
    produce,
)

from streamplatform.kafka import LocalBroker, TopicSpec, create_topics
from streamplatform.spark import spark_session

BATCH = 10_000
STEPS = (
    "plan_ms",
    "tasks_and_sink_ms",
    "writes_ms",
    "commit_ms",
    "task_ms",
    "task_settle_ms",
    "tasks_in_driver",
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# Our configurations: as before long-lived tasks (tasks opened every batch, Spark's Kafka
# source and Delta writer), tasks kept only, the small-batch path as a Spark job (the defaults
# before the driver ran small batches' tasks), and the defaults (a small batch's tasks in the
# driver process on a local master).
CONFIGURATIONS = {
    "before": {"platform.task.cache.idle.ms": 0, "platform.sink.driver.max.records": 0,
               "platform.driver.tasks.max.records": 0},
    "kept tasks": {"platform.task.cache.idle.ms": 60_000, "platform.sink.driver.max.records": 0,
                   "platform.driver.tasks.max.records": 0},
    "spark job": {"platform.driver.tasks.max.records": 0,
                  "platform.driver.tasks.beside.spark": 0},
    "defaults": {},
}  # fmt: skip


def run_ours(spark, settings, topic: str, tmp: Path, name: str, overrides: dict):
    job = ours_job(spark, settings, topic, tmp, BATCH // PARTITIONS, name, **overrides)
    results = []
    stop = threading.Event()

    def on_batch(result) -> None:
        results.append(result)
        if result.lag == 0:
            stop.set()

    job.run_forever(trigger_interval_ms=0, idle_interval_ms=100, on_batch=on_batch, stop=stop)
    job.close()
    return results


def run_native(spark, settings, topic: str, tmp: Path, name: str, records: int) -> list[int]:
    from pyspark.sql import functions as F

    stream = (
        kafka_stream(spark, settings, topic, max_offsets_per_trigger=BATCH)
        .withColumn("id", F.get_json_object(F.col("value").cast("string"), "$.id"))
        .withWatermark("timestamp", f"{INTERVAL_MS // 1000} seconds")
        .dropDuplicatesWithinWatermark(["key", "id"])
        .drop("id")
    )
    query = (
        stream.writeStream.format("delta")
        .option("checkpointLocation", str(tmp / name / "checkpoint"))
        .start(str(tmp / name / "table"))
    )
    durations: list[int] = []
    seen = 0
    try:
        while seen < records:  # recentProgress keeps the last 100 reports: enough here
            if query.exception() is not None:
                raise RuntimeError(f"native query failed: {query.exception()}")
            time.sleep(0.2)
            seen = sum(p["numInputRows"] for p in query.recentProgress)
        for progress in query.recentProgress:
            if progress["numInputRows"]:
                durations.append(progress["durationMs"]["triggerExecution"])
    finally:
        query.stop()
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    ours: dict[str, list] = {}
    peaks: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            create_topics(settings, [TopicSpec(t, PARTITIONS) for t in ("latency", "warmup")])
            produce(settings, "latency", args.records, seed=9)
            produce(settings, "warmup", 50_000, seed=11)
            spark = spark_session(master="local[2]", app_name="latency-bench")
            for name, overrides in CONFIGURATIONS.items():
                run_ours(spark, settings, "warmup", tmp, f"warmup-{len(ours)}", overrides)
                ours[name] = []
            run_native(spark, settings, "warmup", tmp, "warmup-native", 50_000)
            for index, (name, overrides) in enumerate(CONFIGURATIONS.items()):
                with WorkerMemory() as memory:
                    ours[name] = run_ours(spark, settings, "latency", tmp, f"ours-{index}",
                                          overrides)  # fmt: skip
                peaks[name] = (memory.peak_mb, memory.peak_driver_mb)
            native = run_native(spark, settings, "latency", tmp, "native", args.records)
            spark.stop()
    print(f"{args.records:,} records, {PARTITIONS} partitions, local[2], ~{BATCH:,}-record "
          "batches, continuous")  # fmt: skip
    print(f"native    : {len(native)} batches, p50 {statistics.median(native):.0f} ms, "
          f"p99 {percentile(native, 0.99):.0f} ms")  # fmt: skip
    for name, results in ours.items():
        ms = [r.duration_ms for r in results]
        steps = {s: statistics.median(r.metrics.get(s, 0) for r in results) for s in STEPS}
        reused = sum(r.metrics.get("tasks_reused", 0) for r in results)
        opened = sum(r.metrics.get("tasks_opened", 0) for r in results)
        print(f"ours {name:>10}: {len(ms)} batches, p50 {statistics.median(ms):.0f} ms, "
              f"p99 {percentile(ms, 0.99):.0f} ms; native/ours p50 "
              f"{statistics.median(native) / statistics.median(ms):.2f}x, p99 "
              f"{percentile(native, 0.99) / percentile(ms, 0.99):.2f}x; tasks kept "
              f"{reused}/{reused + opened}; peak RSS: Python workers {peaks[name][0]:.0f} MB, "
              f"driver {peaks[name][1]:.0f} MB")  # fmt: skip
        print("    median per step (ms): " + ", ".join(f"{s} {v:.0f}" for s, v in steps.items()))
        slowest = sorted(results, key=lambda r: r.duration_ms)[-3:][::-1]
        print("    slowest: " + "; ".join(
            f"batch {r.batch_id} {r.duration_ms} ms ("
            + ", ".join(f"{s} {r.metrics.get(s, 0)}" for s in STEPS[:5]) + ")"
            for r in slowest
        ))  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
