"""The versioned snapshot of a versioned store (KIP-889), read from Delta, and batch as-of joins.

A streaming job writes every version its table sources put into a versioned store to the Delta
table ``<platform.delta.root>/<application.id>/_versions``, one row per put:
``(store, key, value, valid_from, task, seq, batch_id)``. Reading that log back as a snapshot
gives each version its end of validity, which is what a batch as-of join needs:

- ``valid_to`` is the ``valid_from`` of the key's next version (a window ``lead``); the newest
  version of a key has ``valid_to`` null (still valid);
- two puts of one key with the same ``valid_from`` are one version: the later put replaces the
  earlier (KIP-889), later meaning the larger ``(batch_id, task, seq)``;
- a tombstone (value null) ends the validity of the version before it and is *not* a row of its
  own: "no value from ``valid_from`` on" needs no row in an inner as-of join;
- ``as_of_version`` reads the log as it was at that Delta table version (time travel), so a
  backfill can be reproduced exactly and compared with what the stream saw.

Versions older than the store's history retention are kept here (the store drops them); a
batch as-of join over the snapshot can therefore find a version for a record the streaming join,
past retention, no longer could.

:func:`batch_as_of_join` joins records (e.g. the deduplicated transactions read from Kafka) with
a snapshot on the key, picking for a record at time ``t`` the version with
``valid_from <= t < valid_to``, and applies the topology's joiner with the same serdes, so its rows
have the shape of the streaming job's Delta sink (key, value, timestamp, headers and the source
coordinates) and compare with it row for row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from streamplatform.serdes import Serde, Serdes

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

SNAPSHOT_COLUMNS = ("key", "value", "valid_from", "valid_to")
JOINED_SCHEMA = (
    "key BINARY, value BINARY, timestamp LONG, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, "
    "source_topic STRING, source_partition INT, source_offset LONG"
)


def read_versioned_snapshot(
    spark: SparkSession,
    versions_path: str,
    store: str | None = None,
    as_of_version: int | None = None,
) -> DataFrame:
    """The snapshot ``(key, value, valid_from, valid_to)`` of the versions log at ``versions_path``.

    ``store`` keeps one store's versions; with None every store is read and a ``store`` column
    comes first (keys of different stores never meet). ``as_of_version`` is a Delta table version
    of the log (time travel). Keys and values stay the store's bytes.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    reader = spark.read.format("delta")
    if as_of_version is not None:
        reader = reader.option("versionAsOf", int(as_of_version))
    try:
        puts = reader.load(versions_path)
    except Exception as error:
        raise FileNotFoundError(
            f"No versions log at {versions_path}: run the streaming job that owns the versioned "
            f"store first (it writes <platform.delta.root>/<application.id>/_versions). ({error})"
        ) from error
    if store is not None:
        puts = puts.where(F.col("store") == store)
    newest_first = Window.partitionBy("store", "key", "valid_from").orderBy(
        F.col("batch_id").desc(), F.col("task").desc(), F.col("seq").desc()
    )
    by_time = Window.partitionBy("store", "key").orderBy("valid_from")
    snapshot = (
        puts.withColumn("_put", F.row_number().over(newest_first))
        .where(F.col("_put") == 1)
        .withColumn("valid_to", F.lead("valid_from").over(by_time))
        .where(F.col("value").isNotNull())
    )
    columns = list(SNAPSHOT_COLUMNS) if store is not None else ["store", *SNAPSHOT_COLUMNS]
    return snapshot.select(*columns)


def versions_table_version(spark: SparkSession, path: str) -> int | None:
    """The current Delta version of a table, or None when there is no table at ``path``."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    row = DeltaTable.forPath(spark, path).history(1).select("version").first()
    return None if row is None else int(row[0])


def batch_as_of_join(
    transactions_df: DataFrame,
    snapshot_df: DataFrame,
    joiner: Callable[[Any, Any], Any],
    *,
    key_column: str = "key",
    value_serde: Serde | None = None,
    table_value_serde: Serde | None = None,
) -> DataFrame:
    """Join records with the version of their key valid at their time, as the streaming join does.

    ``transactions_df`` has the columns of a Kafka read (``key``, ``value``, ``timestamp`` in ms
    or as a Spark timestamp, ``headers``, ``topic``, ``partition``, ``offset``) or of a Delta
    sink (``source_topic``, ``source_partition``, ``source_offset`` instead of the last three).
    ``snapshot_df`` is :func:`read_versioned_snapshot` of one store. Inner join: a record with
    no valid version is dropped, as by ``KStream.join``. ``joiner(record_value, table_value)``
    is the streaming join's joiner; values are read and written with ``value_serde`` /
    ``table_value_serde`` (JSON by default). A registry serde here is not a job's: give it its
    registry (``Serdes.avro(schema, registry={"schema.registry.url": ...})``, or call its
    ``configure(settings)`` with the job's settings) before the call.

    Returns rows shaped like the streaming job's Delta sink: ``key, value, timestamp, headers,
    source_topic, source_partition, source_offset``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    join_values = joiner
    stream_serde = value_serde or Serdes.json()
    table_serde = table_value_serde or Serdes.json()

    records = transactions_df
    if isinstance(records.schema["timestamp"].dataType, TimestampType):
        records = records.withColumn(
            "timestamp", (F.col("timestamp").cast("double") * 1000).cast("long")
        )
    if "source_topic" not in records.columns:
        records = (
            records.withColumnRenamed("topic", "source_topic")
            .withColumnRenamed("partition", "source_partition")
            .withColumnRenamed("offset", "source_offset")
        )
    if "headers" not in records.columns:
        records = records.withColumn(
            "headers", F.lit(None).cast("array<struct<key:string,value:binary>>")
        )
    tx = records.select(
        F.col(key_column).alias("key"), "value", "timestamp", "headers",
        "source_topic", "source_partition", "source_offset",
    )  # fmt: skip
    versions = snapshot_df.select(
        F.col("key").alias("_rate_key"),
        F.col("value").alias("_rate_value"),
        "valid_from",
        "valid_to",
    )
    matched = tx.join(
        versions,
        (tx["key"] == versions["_rate_key"])
        & (tx["timestamp"] >= versions["valid_from"])
        & (versions["valid_to"].isNull() | (tx["timestamp"] < versions["valid_to"])),
        "inner",
    )

    def apply_joiner(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            frame = frame.copy()
            frame["value"] = [
                stream_serde.serialize(
                    join_values(stream_serde.deserialize(value), table_serde.deserialize(rate))
                )
                for value, rate in zip(frame["value"], frame["_rate_value"], strict=True)
            ]
            yield frame[
                ["key", "value", "timestamp", "headers", "source_topic", "source_partition",
                 "source_offset"]
            ]  # fmt: skip

    return matched.mapInPandas(apply_joiner, JOINED_SCHEMA)
