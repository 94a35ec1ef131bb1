"""`make demo`: Kafka -> Spark -> Delta on embedded defaults, end to end.

Starts a local broker (unless ``--bootstrap-servers`` points at one), produces sample
transactions with headers to a 3-partition topic, reads exactly the produced offset ranges with
Spark's Kafka batch source, appends them to a Delta table under ``.data/delta`` idempotently
(``txnAppId``/``txnVersion``), prints the table's path and row count, and stops the broker.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from pathlib import Path

from streamplatform.home import data_dir
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics, end_offsets, producer

TOPIC = "demo-transactions"
PARTITIONS = 3
TABLE = "demo_transactions"


def produce_transactions(settings: Mapping[str, str], count: int, seed: int = 7) -> None:
    """Sample transactions keyed by account, each with a ``source`` header."""
    rng = random.Random(seed)
    out = producer(settings, **{"linger.ms": 20, "enable.idempotence": True})
    for index in range(count):
        account = f"acct-{rng.randrange(50):03d}"
        value = {
            "id": f"tx-{index:06d}",
            "account": account,
            "amount": round(rng.uniform(1, 500), 2),
            "currency": rng.choice(["USD", "GBP", "JPY"]),
        }
        out.produce(TOPIC, key=account, value=json.dumps(value), headers=[("source", b"demo")])
        if index % 1000 == 0:
            out.poll(0)
    remaining = out.flush(30)
    if remaining:
        raise RuntimeError(f"{remaining} demo records were not acknowledged by the broker.")


def load_into_delta(settings: Mapping[str, str], table: Path) -> int:
    """Read everything in the topic with Spark and append it to Delta once; returns row count."""
    from pyspark.sql import functions as F

    from streamplatform.spark import read_kafka_ranges, spark_session

    watermarks = end_offsets(settings, TOPIC)
    ranges = {TOPIC: {p: (low, high) for p, (low, high) in watermarks.items()}}
    spark = spark_session(app_name="streamplatform-demo")
    schema = "id STRING, account STRING, amount DOUBLE, currency STRING"
    rows = read_kafka_ranges(spark, settings, ranges).select(
        F.col("key").cast("string").alias("key"),
        F.from_json(F.col("value").cast("string"), schema).alias("tx"),
        "topic",
        "partition",
        "offset",
        "timestamp",
        "headers",
    )
    # The version is the batch id: writing the same batch again is skipped by Delta.
    version = sum(high for _, high in watermarks.values())
    (
        rows.select("key", "tx.*", "topic", "partition", "offset", "timestamp", "headers")
        .write.format("delta")
        .mode("append")
        .option("txnAppId", "streamplatform-demo")
        .option("txnVersion", str(version))
        .save(str(table))
    )
    return int(spark.read.format("delta").load(str(table)).count())


def run(count: int = 5_000, bootstrap_servers: str | None = None) -> None:
    table = data_dir() / "delta" / TABLE
    started = time.monotonic()
    broker = None
    if bootstrap_servers is None:
        print("Starting a local Kafka broker (KRaft) ...", flush=True)
        broker = LocalBroker(data_dir() / "demo-broker")
        bootstrap_servers = broker.start()
    try:
        settings = {"bootstrap.servers": bootstrap_servers}
        print(f"Broker at {bootstrap_servers}; creating topic {TOPIC} ...", flush=True)
        create_topics(settings, [TopicSpec(TOPIC, PARTITIONS)])
        print(f"Producing {count} transactions ...", flush=True)
        produce_transactions(settings, count)
        print("Reading them with Spark and writing Delta ...", flush=True)
        rows = load_into_delta(settings, table)
    finally:
        if broker is not None:
            print("Stopping the local broker ...", flush=True)
            broker.stop()
    print(f"\nDelta table: {table}\nRows:        {rows}")
    print(f"Took {time.monotonic() - started:.1f} s")
