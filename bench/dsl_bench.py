"""Dedup throughput: our task path against Spark's dropDuplicatesWithinWatermark, same records.

Records: N transactions (default 1M) over 1,000 account keys, JSON values with an ``id``;
20% are duplicates of a recent transaction (same key and id, within the interval) and 3% arrive
out of order (timestamp moved back by up to half the interval). Interval: 10 minutes.

- ours: ``deduplicate_by_key_value(id)`` run by one Task (the code Spark executors run) on one
  core (CPU affinity), from raw bytes: JSON deserialization, the KIP-655 rule, RocksDB store,
  serialization of the output, a store commit every 10,000 records.
- Spark: the same rows as a streaming file source (10 files, one per micro-batch) ->
  ``from_json`` -> ``withWatermark`` -> ``dropDuplicatesWithinWatermark([key, id])`` -> noop
  sink, ``trigger(availableNow=True)``, ``local[1]``; session start not counted.

Prints records/s of both and the ratio ours / Spark.

    .venv/bin/python bench/dsl_bench.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INTERVAL_MS = 10 * 60 * 1000
STEP_MS = 10  # event time between two transactions
FILES = 10


def generate(records: int, directory: Path, seed: int = 11) -> dict[str, int]:
    """Write the records as FILES parquet files; returns counts of duplicates and late records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    keys, values, timestamps = [], [], []
    recent: list[tuple[str, str, int]] = []
    duplicates = late = 0
    for index in range(records):
        event_time = index * STEP_MS
        if recent and rng.random() < 0.20:
            key, tx_id, original = rng.choice(recent[-2_000:])  # seen < 20 s ago: within interval
            duplicates += 1
        else:
            key, tx_id, original = f"acct-{rng.randrange(1000):04d}", f"tx-{index:08d}", event_time
            recent.append((key, tx_id, event_time))
        timestamp = event_time
        if rng.random() < 0.03:
            timestamp -= rng.randrange(INTERVAL_MS // 2)
            late += 1
        keys.append(key)
        values.append(json.dumps({"id": tx_id, "amount": index % 997, "at": original}))
        timestamps.append(max(timestamp, 0))
    per_file = -(-records // FILES)
    for number in range(FILES):
        part = slice(number * per_file, (number + 1) * per_file)
        table = pa.table(
            {
                "key": keys[part],
                "value": values[part],
                "ts": pa.array(timestamps[part], pa.timestamp("ms")),
            }
        )
        pq.write_table(table, directory / f"part-{number:03d}.parquet")
    return {"duplicates": duplicates, "late": late}


OURS = r"""
import os, sys, time, tempfile
from pathlib import Path
import pyarrow.parquet as pq
os.sched_setaffinity(0, {0})
from streamplatform import StreamsBuilder
from streamplatform.config import StreamsConfig
from streamplatform.records import ConsumedRecord
from streamplatform.runtime.task import Task
from streamplatform.serdes import Serdes

directory = Path(sys.argv[1])
rows = []
for path in sorted(directory.glob("*.parquet")):
    table = pq.read_table(path)
    for key, value, ts in zip(table["key"].to_pylist(), table["value"].to_pylist(),
                              table["ts"].cast("int64").to_pylist()):
        rows.append((key.encode(), value.encode(), ts))
records = [ConsumedRecord("tx", 0, offset, ts, k, v, []) for offset, (k, v, ts) in enumerate(rows)]

b = StreamsBuilder()
(b.stream("tx", Serdes.string(), Serdes.json())
  .deduplicate_by_key_value(lambda k, v: v["id"], %(interval)d).to("out"))
topology = b.build()
config = StreamsConfig({"application.id": "bench", "processing.guarantee": "exactly_once_v2"})
with tempfile.TemporaryDirectory() as state:
    task = Task(topology, topology.subtopologies[0], 0, config, Path(state), lambda t: 1)
    started = time.perf_counter()
    out = 0
    for index, record in enumerate(records, 1):
        task.process(record)
        if index %% 10_000 == 0:
            task.commit()
            out += len(task.take_output())
    task.commit()
    out += len(task.take_output())
    elapsed = time.perf_counter() - started
    task.close()
print(elapsed, out)
"""


def run_ours(directory: Path) -> tuple[float, int]:
    result = subprocess.run(
        [sys.executable, "-c", OURS % {"interval": INTERVAL_MS}, str(directory)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    elapsed, out = result.stdout.split()
    return float(elapsed), int(out)


def run_spark(directory: Path) -> tuple[float, int]:
    from pyspark.sql import functions as F

    from streamplatform.spark import spark_session

    spark = spark_session(master="local[1]", app_name="dsl-bench")
    schema = "key STRING, value STRING, ts TIMESTAMP"
    with tempfile.TemporaryDirectory() as checkpoint:
        stream = (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(directory))
            .withColumn("id", F.get_json_object("value", "$.id"))
            .withWatermark("ts", f"{INTERVAL_MS // 1000} seconds")
            .dropDuplicatesWithinWatermark(["key", "id"])
        )
        started = time.perf_counter()
        query = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        out = sum(p["sink"]["numOutputRows"] for p in query.recentProgress if p["numInputRows"])
    spark.stop()
    return elapsed, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    records = parser.parse_args().records
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        counts = generate(records, directory)
        print(f"{records} records, {counts['duplicates']} duplicates, "
              f"{counts['late']} out of order")  # fmt: skip
        ours, ours_out = run_ours(directory)
        spark, spark_out = run_spark(directory)
    print(
        f"ours   (task path, 1 core):                {records / ours:>10,.0f} records/s "
        f"({ours:.1f} s, {ours_out} forwarded)"
    )
    print(
        f"Spark  (dropDuplicatesWithinWatermark, local[1]): {records / spark:>10,.0f} records/s "
        f"({spark:.1f} s, {spark_out} forwarded)"
    )
    print(f"ratio ours / Spark: {spark / ours:.2f}x")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
