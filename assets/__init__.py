"""Dagster assets of the streaming jobs, and their checks.

Modules: ``topics`` (the Kafka topics, external), ``streaming`` (the two jobs:
``transactions_deduplicated``, ``fx_rate_versions``), ``enriched`` (``transactions_enriched``,
daily), ``operations`` (``dlq_records``, ``stream_offsets``, ``standby_placements``),
``checks``; helpers in ``streams`` (running a job), ``lateness`` (late rate versions) and
``dedup_audit`` (KIP-655's rule over the input).
"""

from assets.checks import all_asset_checks
from assets.enriched import DAILY, transactions_enriched
from assets.operations import dlq_records, standby_placements, stream_offsets
from assets.streaming import fx_rate_versions, transactions_deduplicated
from assets.topics import fx_rates_topic, topic_specs, transactions_topic

all_assets = [
    *topic_specs,
    transactions_deduplicated,
    fx_rate_versions,
    transactions_enriched,
    dlq_records,
    stream_offsets,
    standby_placements,
]

__all__ = [
    "DAILY",
    "all_asset_checks",
    "all_assets",
    "dlq_records",
    "fx_rate_versions",
    "fx_rates_topic",
    "standby_placements",
    "stream_offsets",
    "transactions_deduplicated",
    "transactions_enriched",
    "transactions_topic",
]
