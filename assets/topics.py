"""The Kafka topics the jobs read, as external assets (``AssetSpec``): produced outside Dagster.

Their keys are fixed (``kafka/transactions``, ``kafka/fx_rates``); the topic names the jobs use
come from ``pipelines``.
"""

from __future__ import annotations

import dagster as dg

import pipelines

transactions_topic = dg.AssetSpec(
    key=["kafka", "transactions"],
    description=(
        f"Kafka topic `{pipelines.TRANSACTIONS}`: payment transactions keyed by currency, "
        "with duplicates, out-of-order and poison records. Produced by the payment systems "
        "(locally: `pipelines.generate`)."
    ),
    group_name="kafka",
    kinds={"kafka"},
)

fx_rates_topic = dg.AssetSpec(
    key=["kafka", "fx_rates"],
    description=(
        f"Kafka topic `{pipelines.FX_RATES}`: FX rate updates keyed by currency, record time = "
        "start of validity; late corrections arrive after newer rates."
    ),
    group_name="kafka",
    kinds={"kafka"},
)

topic_specs = [transactions_topic, fx_rates_topic]
