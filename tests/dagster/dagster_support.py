"""Small, exact demo data for the Dagster tests, and the code location's configuration and
resources for them.

The broker is shared by the whole test run and ``tests/test_demo.py`` owns the demo topic names,
so the Dagster tests give the code location topic names and application ids of their own
(:func:`mission`: its configuration, as a deployment would).

The data is produced with Kafka's default (murmur2) partitioner computed here, so the
transactions and the FX rates of a currency share a partition, as the co-partitioned join needs,
and every timestamp is known: rates every 6 hours from 2025-12-31, transactions over
2026-01-01 and 2026-01-02, a few exact duplicates and poison records.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pipelines
from pipelines import Topics
from resources import MissionConfig, local_resources
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.partitioner import partition_for

PARTITIONS = 3
CURRENCIES = ("USD", "GBP", "CHF")
HOUR = 3_600_000
JAN_1 = pipelines.START_MS  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class DemoData:
    transactions: int  # unique transactions
    duplicates: int  # exact repeats within a minute: all dropped
    poison: int
    rates: int

    @property
    def records(self) -> int:
        return self.transactions + self.duplicates + self.poison


def mission(prefix: str) -> MissionConfig:
    """The code location's configuration with topics and application ids of ``prefix``."""
    return MissionConfig(topics=Topics.prefixed(prefix), dedup_application_id=f"{prefix}-dedup",
                         enrichment_application_id=f"{prefix}-enrich",
                         max_records_per_batch=1_000)  # fmt: skip


def create_pipeline_topics(settings: dict[str, str], topics: Topics) -> None:
    create_topics(settings, [TopicSpec(name, PARTITIONS) for name in topics.names()])


def send(out: Any, topic: str, key: str, value: bytes, timestamp: int, **headers: str) -> None:
    out.produce(topic, key=key, value=value, timestamp=timestamp,
                partition=partition_for(key.encode(), PARTITIONS),
                headers=[(k, v.encode()) for k, v in headers.items()])  # fmt: skip


def produce_rates(settings: dict[str, str], topics: Topics) -> int:
    """A rate every 6 hours per currency, from 2025-12-31T00:00 to 2026-01-02T18:00."""
    out = producer(settings)
    count = 0
    for index, currency in enumerate(CURRENCIES):
        for step in range(12):
            valid_from = JAN_1 - 24 * HOUR + step * 6 * HOUR
            rate = round(0.8 + index * 0.3 + step * 0.001, 5)
            value = json.dumps({"rate": rate, "valid_from": valid_from}).encode()
            send(out, topics.fx_rates, currency, value, valid_from)
            count += 1
    assert out.flush(30) == 0
    return count


def produce_correction(
    settings: dict[str, str], topics: Topics, currency: str, valid_from: int
) -> None:
    """A late correction: a rate version older than versions the join has already used."""
    pipelines.produce_correction(settings, currency, 9.99, valid_from, topics)


def produce_transactions(
    settings: dict[str, str], topics: Topics, count: int = 120, seed: int = 11
) -> DemoData:
    """``count`` transactions over two days, every 10th repeated at once, 2 poison records."""
    rng = random.Random(seed)
    out = producer(settings)
    duplicates = poison = 0
    for index in range(count):
        timestamp = JAN_1 + index * 48 * HOUR // count + rng.randrange(60_000)
        currency = CURRENCIES[index % len(CURRENCIES)]
        value = json.dumps({"id": f"tx-{index:05d}", "account": f"acct-{index % 7}",
                            "amount": round(rng.uniform(1, 500), 2),
                            "currency": currency}).encode()  # fmt: skip
        send(out, topics.transactions, currency, value, timestamp, source="test")
        if index % 10 == 3:
            send(out, topics.transactions, currency, value, timestamp, source="test")
            duplicates += 1
        if index in (40, 90):
            send(out, topics.transactions, currency, b"{not json", timestamp + 1)
            poison += 1
    assert out.flush(30) == 0
    return DemoData(count, duplicates, poison, 0)


def make_resources(kafka_settings: dict[str, str], data_dir: Path) -> dict[str, Any]:
    """The code location's resources on the test broker, the run's Spark and ``data_dir``."""
    return local_resources(kafka_settings["bootstrap.servers"], data_dir=data_dir,
                           spark_master="local[2]")  # fmt: skip


def unique_prefix(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


# GraphQL: launch a run (the UI tests), answering with its id or why not.
LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
    ... on PipelineNotFoundError { message }
  }
}"""
