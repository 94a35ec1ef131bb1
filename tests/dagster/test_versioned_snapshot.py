"""``streamplatform.versioned_snapshot`` on small Delta tables: validity windows, KIP-889
replacement, tombstones, time travel, and a batch as-of join equal to the streaming join."""

from __future__ import annotations

import json

import pytest

import pipelines
from streamplatform import TopologyTestDriver
from streamplatform.serdes import Serdes
from streamplatform.versioned_snapshot import (
    batch_as_of_join,
    read_versioned_snapshot,
    versions_table_version,
)

pytestmark = pytest.mark.spark

VERSIONS_SCHEMA = "store STRING, key BINARY, value BINARY, valid_from LONG, task STRING, " \
    "seq LONG, batch_id LONG"  # fmt: skip
STORE = pipelines.RATES_STORE
TOPICS = pipelines.Topics()


def rate(value: float, valid_from: int) -> bytes:
    return json.dumps({"rate": value, "valid_from": valid_from}).encode()


def write_versions(spark, path, rows):
    spark.createDataFrame(rows, VERSIONS_SCHEMA).write.format("delta").mode("append").save(path)


def snapshot_rows(frame):
    rows = [(r.key.decode(), json.loads(r.value)["rate"], r.valid_from, r.valid_to)
            for r in frame.collect()]  # fmt: skip
    return sorted(rows, key=lambda row: (row[0], row[2]))


def test_validity_replacement_tombstones_and_time_travel(spark, tmp_path):
    path = str(tmp_path / "_versions")
    write_versions(spark, path, [
        (STORE, b"USD", rate(1.0, 0), 0, "0_0", 0, 0),
        (STORE, b"USD", rate(1.1, 100), 100, "0_0", 1, 0),
        (STORE, b"GBP", rate(2.0, 0), 0, "0_1", 0, 0),
        ("other", b"USD", rate(7.0, 0), 0, "0_0", 0, 0),
    ])  # fmt: skip
    write_versions(spark, path, [
        (STORE, b"USD", rate(1.05, 100), 100, "0_0", 0, 1),  # replaces USD@100 (KIP-889)
        (STORE, b"USD", rate(0.9, 50), 50, "0_0", 1, 1),  # a late version in between
        (STORE, b"GBP", None, 70, "0_1", 0, 1),  # tombstone: GBP ends at 70
        (STORE, b"GBP", rate(2.2, 90), 90, "0_1", 1, 1),
    ])  # fmt: skip

    assert snapshot_rows(read_versioned_snapshot(spark, path, STORE)) == [
        ("GBP", 2.0, 0, 70),
        ("GBP", 2.2, 90, None),
        ("USD", 1.0, 0, 50),
        ("USD", 0.9, 50, 100),
        ("USD", 1.05, 100, None),
    ]
    assert snapshot_rows(read_versioned_snapshot(spark, path, STORE, as_of_version=0)) == [
        ("GBP", 2.0, 0, None),
        ("USD", 1.0, 0, 100),
        ("USD", 1.1, 100, None),
    ]
    every_store = read_versioned_snapshot(spark, path)
    assert every_store.columns == ["store", "key", "value", "valid_from", "valid_to"]
    assert every_store.where("store = 'other'").count() == 1
    assert versions_table_version(spark, path) == 1
    assert versions_table_version(spark, str(tmp_path / "none")) is None


def test_a_missing_versions_log_names_the_path(spark, tmp_path):
    with pytest.raises(FileNotFoundError, match="_versions"):
        read_versioned_snapshot(spark, str(tmp_path / "app" / "_versions"))


@pytest.mark.slow  # ~15 s: a streaming join, then the batch one
def test_batch_as_of_join_equals_the_streaming_join(spark, tmp_path):
    """The enrichment topology in the test driver (the task code the Spark runtime runs), rates
    first, then transactions out of order; the batch join over the snapshot must match."""
    rates = [("USD", 0.9, 0), ("USD", 0.95, 3_600_000), ("GBP", 1.2, 0),
             ("USD", 0.92, 1_800_000), ("GBP", 1.25, 7_200_000)]  # fmt: skip
    transactions = [("USD", "a", 10.0, 60_000), ("GBP", "b", 20.0, 7_200_000),
                    ("USD", "c", 30.0, 4_000_000), ("USD", "d", 40.0, 1_800_000),
                    ("GBP", "e", 50.0, 7_199_999), ("USD", "f", 60.0, 1_000)]  # fmt: skip
    versions = []
    with TopologyTestDriver(pipelines.enrichment_topology(), {"application.id": "t"}) as driver:
        table = driver.create_input_topic(TOPICS.fx_rates, Serdes.string(), Serdes.json())
        for seq, (currency, value, valid_from) in enumerate(rates):
            table.pipe_input(currency, {"rate": value, "valid_from": valid_from},
                             timestamp=valid_from)  # fmt: skip
            versions.append((STORE, currency.encode(), rate(value, valid_from), valid_from,
                             "0_0", seq, 0))  # fmt: skip
        stream = driver.create_input_topic(TOPICS.deduplicated, Serdes.string(), Serdes.json())
        for currency, tx_id, amount, timestamp in transactions:
            stream.pipe_input(currency, {"id": tx_id, "amount": amount}, timestamp=timestamp)
        out = driver.create_output_topic(TOPICS.enriched, Serdes.bytes(), Serdes.bytes())
        streamed = sorted((r.key, r.value, r.timestamp) for r in out.read_records_to_list())

    path = str(tmp_path / "_versions")
    write_versions(spark, path, versions)
    frame = spark.createDataFrame(
        [(c.encode(), json.dumps({"id": i, "amount": a}).encode(), t, TOPICS.deduplicated,
          0, n) for n, (c, i, a, t) in enumerate(transactions)],
        "key BINARY, value BINARY, timestamp LONG, topic STRING, partition INT, offset LONG",
    )  # fmt: skip
    joined = batch_as_of_join(frame, read_versioned_snapshot(spark, path, STORE), pipelines.convert)
    assert joined.columns == ["key", "value", "timestamp", "headers", "source_topic",
                              "source_partition", "source_offset"]  # fmt: skip
    batch = sorted((bytes(r.key), bytes(r.value), r.timestamp) for r in joined.collect())
    assert batch == streamed
    assert len(batch) == len(transactions)
    by_id = {json.loads(value)["id"]: json.loads(value) for _, value, _ in batch}
    assert by_id["d"]["rate"] == 0.92  # exactly at a version's start: that version
    assert by_id["e"]["rate"] == 1.2 and by_id["b"]["rate"] == 1.25  # just before / at 02:00
