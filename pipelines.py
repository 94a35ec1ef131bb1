"""The mission's two streaming pipelines and their demo data.

- ``deduplication_topology``: transactions keyed by currency; duplicates (same currency and
  transaction id within 10 minutes) dropped (KIP-655 ``deduplicate_by_key_value``); out to
  ``transactions-deduplicated`` (Kafka), poison records to ``transactions-dlq``.
- ``enrichment_topology``: the deduplicated transactions joined with the FX rate valid at
  each transaction's time (KIP-889 versioned table) into ``transactions-enriched`` (Delta).

Topic names are configuration (:class:`Topics`: the defaults above, or all of them with a
prefix), given to every function that builds a topology or produces data.

Both topics are keyed by currency with the same partition count, so the stream and the table
are co-partitioned and each job is one sub-topology.

``generate`` writes demo data: transactions with ~10% duplicates, ~5% out-of-order timestamps
and ~0.1% poison records (not JSON; at least one), and FX rate updates including late
corrections; ``produce_correction`` one more late correction.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from datetime import timedelta
from typing import Any

from streamplatform.dsl import StreamsBuilder, Topology
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.serdes import Serdes
from streamplatform.state import Stores

PARTITIONS = 3
DEDUP_INTERVAL = timedelta(minutes=10)
RATE_HISTORY = timedelta(days=2)
CURRENCIES = ("USD", "GBP", "JPY", "CHF", "SEK", "NOK")
DAY_MS = 86_400_000
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: demo event time starts here
RATES_STORE = "fx-rates"  # the enrichment's versioned store


@dataclass(frozen=True)
class Topics:
    """The pipelines' topic names."""

    transactions: str = "transactions"
    fx_rates: str = "fx-rates"
    deduplicated: str = "transactions-deduplicated"
    enriched: str = "transactions-enriched"
    transactions_dlq: str = "transactions-dlq"
    enrichment_dlq: str = "enrichment-dlq"

    @classmethod
    def prefixed(cls, prefix: str) -> Topics:
        """Every default name behind ``<prefix>-`` (none for an empty prefix)."""
        if not prefix:
            return cls()
        return cls(*(f"{prefix}-{name}" for name in astuple(cls())))

    def names(self) -> tuple[str, ...]:
        return astuple(self)


def deduplication_topology(
    topics: Topics = Topics(), interval: timedelta = DEDUP_INTERVAL
) -> Topology:
    b = StreamsBuilder()
    transactions = b.stream(topics.transactions, Serdes.string(), Serdes.json())
    transactions.deduplicate_by_key_value(
        lambda currency, tx: tx.get("id"), interval, name="tx-dedup"
    ).to(topics.deduplicated)
    return b.build()


def convert(tx: dict[str, Any], rate: dict[str, Any]) -> dict[str, Any]:
    """The join: the amount in EUR at the rate valid when the transaction happened."""
    return {**tx, "rate": rate["rate"], "rate_valid_from": rate["valid_from"],
            "amount_eur": round(tx["amount"] / rate["rate"], 2)}  # fmt: skip


def enrichment_topology(topics: Topics = Topics(), history: timedelta = RATE_HISTORY) -> Topology:
    b = StreamsBuilder()
    rates = b.table(
        topics.fx_rates, Serdes.string(), Serdes.json(),
        store=Stores.persistent_versioned_key_value_store(RATES_STORE, history),
    )  # fmt: skip
    transactions = b.stream(topics.deduplicated, Serdes.string(), Serdes.json())
    transactions.join(rates, convert).to(topics.enriched)
    return b.build()


def create_demo_topics(settings: Mapping[str, Any], topics: Topics = Topics()) -> None:
    create_topics(settings, [TopicSpec(name, PARTITIONS) for name in topics.names()])


@dataclass(frozen=True)
class DemoData:
    """What ``generate`` sent: unique transactions, then the extra records of each kind."""

    transactions: int
    duplicates: int
    out_of_order: int
    poison: int
    rate_updates: int
    late_corrections: int


def generate(
    settings: Mapping[str, Any],
    transactions: int = 5_000,
    days: int = 2,
    seed: int = 7,
    topics: Topics = Topics(),
) -> DemoData:
    """Produce FX rates first, then transactions over ``days`` days of event time."""
    rng = random.Random(seed)
    # log_level 3: errors only; on a broker just started, librdkafka warns that the idempotence
    # coordinator is still loading and retries, which is expected there.
    out = producer(settings, **{"linger.ms": 20, "enable.idempotence": True, "log_level": 3})
    span = days * DAY_MS
    rate_updates = late = 0
    for currency in CURRENCIES:
        rate = rng.uniform(0.5, 150)
        for hour in range(-24, days * 24, 3):  # a rate every 3 hours, from a day before
            valid_from = START_MS + hour * 3_600_000
            rate = round(rate * rng.uniform(0.98, 1.02), 5)
            _send(out, topics.fx_rates, currency, {"rate": rate, "valid_from": valid_from},
                  valid_from)  # fmt: skip
            rate_updates += 1
        for _ in range(2):  # late corrections: versions that start before what was sent last
            valid_from = START_MS + rng.randrange(span)
            _send(out, topics.fx_rates, currency, {"rate": round(rate * 1.01, 5),
                  "valid_from": valid_from, "correction": True}, valid_from)  # fmt: skip
            late += 1
    duplicates = out_of_order = poison = 0
    sent: list[tuple[str, dict[str, Any], int]] = []
    # Duplicates repeat a transaction sent at most ~4 minutes of event time earlier, so that
    # with up to 5 minutes of disorder they stay within the 10-minute interval.
    recent = max(1, 4 * 60_000 * transactions // span)
    for index in range(transactions):
        event_time = START_MS + index * span // transactions
        if sent and rng.random() < 0.10:
            currency, tx, timestamp = sent[-rng.randrange(1, min(len(sent), recent) + 1)]
            duplicates += 1
        else:
            currency = rng.choice(CURRENCIES)
            tx = {"id": f"tx-{index:07d}", "account": f"acct-{rng.randrange(200):03d}",
                  "amount": round(rng.uniform(1, 2_000), 2), "currency": currency}  # fmt: skip
            timestamp = event_time
            if rng.random() < 0.05:
                timestamp -= rng.randrange(5 * 60_000)  # up to 5 minutes late
                out_of_order += 1
            sent.append((currency, tx, timestamp))
        if rng.random() < 0.001:
            out.produce(topics.transactions, key=currency, value=b"{not json",
                        timestamp=timestamp)  # fmt: skip
            poison += 1
        _send(out, topics.transactions, currency, tx, timestamp)
        if index % 1_000 == 0:
            out.poll(0)
    if transactions and not poison:  # small runs show the DLQ at work too
        out.produce(topics.transactions, key=currency, value=b"{not json", timestamp=timestamp)
        poison += 1
    remaining = out.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} demo records were not acknowledged by the broker")
    return DemoData(transactions - duplicates, duplicates, out_of_order, poison, rate_updates, late)


def produce_correction(
    settings: Mapping[str, Any],
    currency: str,
    rate: float,
    valid_from: int,
    topics: Topics = Topics(),
) -> None:
    """One late FX-rate correction: a version of ``currency`` valid from ``valid_from``, sent
    after the newer versions (and after the transactions it applies to)."""
    out = producer(settings, **{"enable.idempotence": True, "log_level": 3})
    correction = {"rate": rate, "valid_from": valid_from, "correction": True}
    _send(out, topics.fx_rates, currency, correction, valid_from)
    if out.flush(30):
        raise RuntimeError(f"the {currency} rate correction was not acknowledged by the broker")


def _send(out: Any, topic: str, key: str, value: dict[str, Any], timestamp: int) -> None:
    out.produce(topic, key=key, value=json.dumps(value), timestamp=timestamp,
                headers=[("source", b"streamplatform-demo")])  # fmt: skip
