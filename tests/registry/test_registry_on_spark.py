"""Avro, Protobuf and JSON Schema topics through the dedup + temporal join job on Spark, against
the real local registry (Apicurio, started by the ``schema_registry`` fixture): the output
equals the test driver's, the sink's records decode with the registry, and poison records of
each kind reach the DLQ once with their raw bytes, under exactly_once_v2. The job runs its tasks
in Spark's Python workers (the driver-side shortcuts off), where each worker creates its
registry client at its first record."""

from __future__ import annotations

import uuid
import zipfile
from pathlib import Path

import pytest
from pyspark import cloudpickle

from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import SerdeContext
from tests.registry import formats as formats_module
from tests.registry.formats import (
    AVRO,
    FORMATS,
    START,
    Format,
    enrich_topology,
    expected_enriched,
    inputs,
    poison_values,
)
from tests.runtime.support import read_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.registry]
PARTITIONS = 3
# The session's Spark workers started before this folder was on any path they know: the job's
# module travels by value; its Protobuf classes (which cannot) come as a zip on the workers' path.
cloudpickle.register_pickle_by_value(formats_module)


@pytest.fixture(scope="module")
def workers_import_the_messages(spark, tmp_path_factory) -> None:
    """``tests.registry.payments_pb2`` importable in Spark's Python workers, as a team's
    generated ``_pb2`` package installed on its cluster would be."""
    archive = tmp_path_factory.mktemp("pyfiles") / "registry_messages.zip"
    here = Path(__file__).parent
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("tests/__init__.py", "")
        zipped.writestr("tests/registry/__init__.py", "")
        zipped.write(here / "payments_pb2.py", "tests/registry/payments_pb2.py")
    spark.sparkContext.addPyFile(str(archive))


def _produce(kafka_settings, registry_url: str, fmt: Format, rates_topic: str, tx_topic: str,
             poison: list[bytes]) -> None:  # fmt: skip
    """The formats' inputs, written by the registry serdes as a producer would, keyed so
    that a key's records share a partition; then the poison records."""
    settings = {"schema.registry.url": registry_url}
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    rates, txs = inputs(fmt)
    for topic, serde, records in ((rates_topic, fmt.rate_serde(), rates),
                                  (tx_topic, fmt.tx_serde(), txs)):  # fmt: skip
        serde.configure(settings)
        for key, value, timestamp in records:
            headers: list = []
            data = serde.serialize(value, SerdeContext(topic, False, headers))
            writer.produce(topic, key=key.encode(), value=data, headers=headers,
                           timestamp=timestamp, partition=_partition(key))  # fmt: skip
        assert writer.flush(60) == 0
    for data in poison:
        writer.produce(tx_topic, key=b"alice", value=data, timestamp=START + 60_000,
                       partition=_partition("alice"))  # fmt: skip
    assert writer.flush(60) == 0


def _by_key_and_time(record: tuple) -> tuple:
    return record[0], record[2]


def _partition(key: str) -> int:
    return ["alice", "bob", "carol"].index(key) % PARTITIONS


# Avro in `make test`; the other two formats (same path, ~20 s each) in `make test-all`.
SPARK_FORMATS = [pytest.param(fmt, marks=[] if fmt.name == "avro" else [pytest.mark.slow],
                              id=fmt.name) for fmt in FORMATS]  # fmt: skip


@pytest.mark.parametrize("fmt", SPARK_FORMATS)
def test_registry_formats_through_the_job_on_spark(
    spark, kafka_settings, schema_registry, workers_import_the_messages, tmp_path, fmt
):
    suffix = uuid.uuid4().hex[:6]
    rates_topic, tx_topic = f"fx-rates-{suffix}", f"transactions-{suffix}"
    out_topic, dlq_topic = f"enriched-{suffix}", f"dlq-{suffix}"
    create_topics(kafka_settings, [
        TopicSpec(rates_topic, PARTITIONS), TopicSpec(tx_topic, PARTITIONS),
        TopicSpec(out_topic, PARTITIONS), TopicSpec(dlq_topic, 1),
    ])  # fmt: skip
    poison = poison_values(fmt, schema_registry.url, tx_topic)
    _produce(kafka_settings, schema_registry.url, fmt, rates_topic, tx_topic, poison)
    topology = enrich_topology(fmt, rates_topic, tx_topic, out_topic)
    config = {
        "application.id": f"registry-{fmt.name}-{suffix}",
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "schema.registry.url": schema_registry.url,
        "errors.dead.letter.queue.topic.name": dlq_topic,
        "state.dir": str(tmp_path / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        # The tasks run in Spark's Python workers, not in the driver (the local shortcuts).
        "platform.driver.tasks.max.records": 0,
        "platform.sink.driver.max.records": 0,
    }
    job = StreamingJob(topology, config, spark=spark)
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    # Two source topics, the shortcuts off: the tasks ran in Spark's Python workers.
    assert {result.path for result in results} == {"grouped"}

    # The sink's records decode with the registry (their schema registered under the sink's
    # subject), and equal the test driver's, per key in order.
    reader = fmt.enriched_serde()
    reader.configure({"schema.registry.url": schema_registry.url})
    records = read_topic(kafka_settings, out_topic)
    on_spark = sorted(
        [(r.key.decode(), fmt.plain(reader.deserialize(r.value, SerdeContext(out_topic, False,
                                                                             r.headers))),
          r.timestamp) for r in records],
        key=_by_key_and_time,
    )  # fmt: skip
    assert on_spark == sorted(expected_enriched(fmt), key=_by_key_and_time)
    from streamplatform.registry.serdes import registry_client

    subjects = registry_client({"schema.registry.url": schema_registry.url}).get_subjects()
    assert f"{out_topic}-value" in subjects
    # Each poison record once in the DLQ, its bytes untouched (read_committed: what a
    # downstream reader sees).
    assert [r.value for r in read_topic(kafka_settings, dlq_topic)] == poison


@pytest.mark.parametrize(
    "shortcuts", [pytest.param(False, id="grouped"),
                  pytest.param(True, id="direct-driver", marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_delta_sink_of_registry_values_has_their_fields_as_columns(
    spark, kafka_settings, schema_registry, tmp_path, shortcuts
):
    """``platform.delta.value.fields``: the Delta sink of Avro values gets ``value_fields``,
    the record as a struct, beside the bytes: Spark SQL reads ``value_fields.eur``. On the
    Spark path (the decoding in Spark's workers) and the driver's (delta-rs)."""
    suffix = uuid.uuid4().hex[:6]
    rates_topic, tx_topic, out_topic = (f"fx-rates-{suffix}", f"transactions-{suffix}",
                                        f"enriched-{suffix}")  # fmt: skip
    create_topics(kafka_settings, [TopicSpec(rates_topic, PARTITIONS),
                                   TopicSpec(tx_topic, PARTITIONS)])  # fmt: skip
    _produce(kafka_settings, schema_registry.url, AVRO, rates_topic, tx_topic, poison=[])
    app = f"registry-fields-{suffix}"
    config = {
        "application.id": app,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "schema.registry.url": schema_registry.url,
        "state.dir": str(tmp_path / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        "platform.delta.value.fields": "true",
    } | ({} if shortcuts else {"platform.sink.driver.max.records": 0})
    job = StreamingJob(enrich_topology(AVRO, rates_topic, tx_topic, out_topic), config,
                       spark=spark, delta_sinks=[out_topic])  # fmt: skip
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert {r.path for r in results} == {"direct-driver" if shortcuts else "grouped"}
    spark.read.format("delta").load(f"{tmp_path}/delta/{app}/{out_topic}").createOrReplaceTempView(
        f"enriched_{suffix}"
    )
    rows = spark.sql(
        f"SELECT key, value_fields.id AS id, value_fields.amount AS amount, "
        f"value_fields.eur AS eur, value FROM enriched_{suffix}"
    ).collect()
    expected = sorted(expected_enriched(AVRO), key=_by_key_and_time)
    got = sorted(((r.key.decode(), {"id": r.id, "amount": r.amount, "eur": r.eur})
                  for r in rows), key=lambda row: (row[0], row[1]["id"]))  # fmt: skip
    assert got == sorted(((key, value) for key, value, _ in expected),
                         key=lambda row: (row[0], row[1]["id"]))  # fmt: skip
    assert all(r.value[:1] == b"\x00" for r in rows)  # the bytes as written, too
