"""streamplatform: Kafka Streams' newest stateful features for PySpark pipelines run from Dagster.

The public API is re-exported here; everything not listed in ``__all__`` is internal.
"""

__all__: list[str] = []
__version__ = "0.1.0"
