"""Dagster assets of the streaming jobs (deduplication, versioned FX rates, enrichment, DLQ)."""

all_assets: list = []
