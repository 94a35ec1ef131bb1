"""Spark DataFrame pieces shared by the Spark-side paths: headers across the Python boundary,
the idempotent Delta append, tasks grouped by task partition."""

from __future__ import annotations

from typing import Any

from streamplatform.runtime.executor import TaskBatchRunner
from streamplatform.runtime.faults import crash_point
from streamplatform.runtime.rows import OUTPUT_SCHEMA


def headers_as_json(column: str) -> Any:
    """Headers cross to Python as JSON, values in base64, null when a record has none (see
    rows.INPUT_COLUMNS): far cheaper to convert than Arrow lists of structs."""
    from pyspark.sql import functions as F

    return F.when(
        F.size(column) > 0,
        F.to_json(
            F.transform(
                column, lambda h: F.struct(h["key"].alias("k"), F.base64(h["value"]).alias("v"))
            ),
            {"ignoreNullFields": "true"},
        ),
    )


def headers_from_json(column: str) -> Any:
    """The inverse of headers_as_json: the ARRAY<STRUCT<key, value>> of the output tables."""
    from pyspark.sql import functions as F

    return F.when(
        F.col(column).isNull(), F.array().cast("array<struct<key: string, value: binary>>")
    ).otherwise(
        F.transform(
            F.from_json(column, "array<struct<k: string, v: string>>"),
            lambda h: F.struct(h["k"].alias("key"), F.unbase64(h["v"]).alias("value")),
        )
    )


def append_once(
    app: str,
    batch_id: int,
    frame: Any,
    path: str,
    name: str,
    partition_by: str | None = None,
    merge_schema: bool = False,
) -> None:
    """Append ``frame`` with its ``batch_id`` column, once per batch: Delta's ``txnAppId`` =
    ``<app>-<name>``, ``txnVersion`` = the batch (a second append of it is skipped).
    ``merge_schema``: columns the table lacks are added."""
    from pyspark.sql import functions as F

    writer = (
        frame.withColumn("batch_id", F.lit(batch_id).cast("long"))
        .write.format("delta")
        .mode("append")
        .option("txnAppId", f"{app}-{name}")
        .option("txnVersion", str(batch_id))
    )
    if partition_by:
        writer = writer.partitionBy(partition_by)
    if merge_schema:
        writer = writer.option("mergeSchema", "true")
    writer.save(path)
    if name.startswith("sink-"):
        crash_point("during_outputs", batch_id)  # a Delta sink written, maybe not the rest


def run_grouped(records: Any, runner: TaskBatchRunner) -> Any:
    """Each task's records grouped by task partition (a task reading several topics, or
    repartitioned records), one ``applyInArrow`` call per task."""

    def run_task(table: Any) -> Any:  # a plain function: what applyInArrow accepts
        return runner.run(table)

    return records.groupBy("task_partition").applyInArrow(run_task, OUTPUT_SCHEMA)


def union(first: Any, second: Any) -> Any:
    return first.unionByName(second)


def kafka_records(context: Any, wanted: dict[str, dict[int, tuple[int, int]]]) -> Any:
    """Spark's Kafka source over exactly ``wanted``, in the executors' INPUT_COLUMNS."""
    from pyspark.sql import functions as F

    from streamplatform.runtime.rows import INPUT_COLUMNS
    from streamplatform.spark import read_kafka_ranges

    return (
        read_kafka_ranges(context.spark(), context.kafka, wanted)
        .withColumn("task_partition", F.col("partition"))
        .withColumn("timestamp", F.unix_millis("timestamp"))
        .withColumn("headers", headers_as_json("headers"))
        .select(*INPUT_COLUMNS)
    )
