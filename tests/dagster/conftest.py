"""The Dagster tests share the run's broker and SparkSession (tests/conftest.py); the slow
ones (dagster dev with a real run, several streaming runs) carry the `slow` marker."""
