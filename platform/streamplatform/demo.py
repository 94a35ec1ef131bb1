"""`make demo`: the mission's two streaming jobs end to end, on embedded defaults.

Starts a local Kafka broker (unless ``--bootstrap-servers`` points at one), creates the demo
topics, produces demo data (transactions with duplicates, out-of-order and poison records; FX
rates with late corrections), then runs on local Spark, exactly once into Delta under
``.data/delta``:

1. ``demo-dedup``: transactions deduplicated by id within 10 minutes (KIP-655) -> Kafka,
   poison records -> the DLQ topic and its Delta mirror (KIP-1034);
2. ``demo-enrich``: deduplicated transactions joined with the FX rate valid at their time
   (KIP-889) -> the Delta table ``transactions-enriched``.

Prints a summary and stops the broker. Each run starts from fresh job state, since a
local broker starts empty.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from streamplatform import pipelines
from streamplatform.home import data_dir
from streamplatform.kafka import LocalBroker
from streamplatform.runtime.microbatch import BatchResult, StreamingJob

DEDUP_APP = "demo-dedup"
ENRICH_APP = "demo-enrich"


def job_settings(app: str, bootstrap_servers: str, dlq: str) -> dict[str, Any]:
    return {
        "application.id": app,
        "bootstrap.servers": bootstrap_servers,
        "processing.guarantee": "exactly_once_v2",
        "errors.dead.letter.queue.topic.name": dlq,
        "default.deserialization.exception.handler": "log_and_continue",
        "platform.max.records.per.batch": 2_000,
    }


def _summary_line(name: str, results: list[BatchResult]) -> str:
    keys = ("records_in", "records_out", "duplicates_dropped", "dlq_records")
    total = {key: sum(getattr(r, key) for r in results) for key in keys}
    lag = results[-1].lag if results else 0
    return (f"{name:<12} {len(results):>7} {total['records_in']:>10} {total['records_out']:>11} "
            f"{total['duplicates_dropped']:>11} {total['dlq_records']:>5} {lag:>5}")  # fmt: skip


def run(count: int = 5_000, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """Run the demo; returns the numbers it prints."""
    started = time.monotonic()
    for app in (DEDUP_APP, ENRICH_APP):  # a fresh broker: previous job state would not match
        shutil.rmtree(data_dir() / "delta" / app, ignore_errors=True)
        shutil.rmtree(data_dir() / "state" / app, ignore_errors=True)
    broker = None
    if bootstrap_servers is None:
        print("Starting a local Kafka broker (KRaft) ...", flush=True)
        broker = LocalBroker(data_dir() / "demo-broker")
        bootstrap_servers = broker.start()
    try:
        settings = {"bootstrap.servers": bootstrap_servers}
        print(f"Broker at {bootstrap_servers}; creating the demo topics ...", flush=True)
        pipelines.create_demo_topics(settings)
        print(f"Producing {count} transactions and the FX rates ...", flush=True)
        data = pipelines.generate(settings, transactions=count)
        print(f"  {data}", flush=True)

        print("Job 1: deduplicating transactions (Spark, exactly once) ...", flush=True)
        dedup = StreamingJob(
            pipelines.deduplication_topology(),
            job_settings(DEDUP_APP, bootstrap_servers, pipelines.TRANSACTIONS_DLQ),
        )
        dedup_results = dedup.run_until_caught_up()
        dedup.close()
        print("Job 2: joining with the FX rate valid at each transaction's time ...", flush=True)
        enrich = StreamingJob(
            pipelines.enrichment_topology(),
            job_settings(ENRICH_APP, bootstrap_servers, pipelines.ENRICHMENT_DLQ),
            spark=dedup.spark,
            delta_sinks=[pipelines.ENRICHED],
        )
        enrich_results = enrich.run_until_caught_up()
        enrich.close()
        spark = enrich.spark
        enriched_path = data_dir() / "delta" / ENRICH_APP / pipelines.ENRICHED
        enriched_rows = spark.read.format("delta").load(str(enriched_path)).count()
        dlq_path = data_dir() / "delta" / DEDUP_APP / "_dlq"
        dlq_rows = (
            spark.read.format("delta").load(str(dlq_path)).count() if dlq_path.exists() else 0
        )
        versions_path = data_dir() / "delta" / ENRICH_APP / "_versions"
        versions = spark.read.format("delta").load(str(versions_path)).count()
    finally:
        if broker is not None:
            print("Stopping the local broker ...", flush=True)
            broker.stop()

    print("\njob          batches  records in  records out  duplicates   DLQ   lag")
    print(_summary_line(DEDUP_APP, dedup_results))
    print(_summary_line(ENRICH_APP, enrich_results))
    print(f"\nDelta table {enriched_path}: {enriched_rows} enriched transactions")
    print(f"DLQ mirror  {dlq_path}: {dlq_rows} poison records (generated: {data.poison})")
    print(f"FX rate versions kept for as-of joins: {versions} "
          f"({data.late_corrections} of them late corrections)")  # fmt: skip
    print(f"Took {time.monotonic() - started:.1f} s")
    return {
        "data": data,
        "dedup": dedup_results,
        "enrich": enrich_results,
        "enriched_rows": enriched_rows,
        "dlq_rows": dlq_rows,
        "enriched_path": enriched_path,
    }
