"""Dagster resources: Kafka, Spark, Delta root, state dir, standby placement."""

all_resources: dict = {}
