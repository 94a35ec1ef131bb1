"""A task failed by its exception handler (``log_and_fail``) still sends its DLQ records to the
DLQ topic before it fails, on Spark as in the test driver (KIP-1034), and its batch is neither
committed nor written."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.config import StreamsConfig
from streamplatform.errors import TaskFailedError
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime import kafka_output
from streamplatform.runtime.executor import TaskBatchRunner
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.runtime.rows import INPUT_COLUMNS
from streamplatform.serdes import Serdes

from .support import job_config, read_topic

STACKTRACE = "__streams.errors.stacktrace"
HANDLERS = {
    "default.deserialization.exception.handler": "log_and_fail",
    "processing.exception.handler": "log_and_continue",
}
# (partition, key, value, timestamp): on partition 1 a record divided by zero (its processing
# error is resumed: a DLQ record) before the poison (its deserialization error fails task 0_1),
# then a record the failed task never reaches.
INPUT = [
    (0, b"z", b'{"amount": 2}', 1_000_000),
    (1, b"a", b'{"amount": 4}', 1_001_000),
    (1, b"b", b'{"amount": 0}', 1_002_000),
    (1, b"bad", b"{poison", 1_003_000),
    (1, b"c", b'{"amount": 5}', 1_004_000),
]
POISON_OFFSET = 2  # on partition 1


def amounts_topology(source: str, sinks: list[str], repartitioned: bool = False):
    """100 // the amount of each JSON value, to every sink (via a repartition: two
    sub-topologies, whose tasks run grouped with ``TaskBatchRunner.run``)."""
    b = StreamsBuilder()
    amounts = b.stream(source, Serdes.string(), Serdes.json()).map_values(
        lambda v: 100 // v["amount"]
    )
    if repartitioned:
        amounts = amounts.select_key(lambda k, v: k).deduplicate_by_key(60_000)
    for sink in sinks:
        amounts.to(sink, value_serde=Serdes.long())
    return b.build()


def produce_input(kafka_settings, source: str) -> None:
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    for n, (partition, key, value, timestamp) in enumerate(INPUT):
        writer.produce(source, key=key, value=value, partition=partition, timestamp=timestamp,
                       headers=[("trace", f"t-{n}".encode())])  # fmt: skip
    assert writer.flush(60) == 0, "the broker did not acknowledge every test record"


def what_the_test_driver_writes(topology, source: str, dlq: str) -> list[tuple]:
    """The DLQ records of the same input through the TopologyTestDriver."""
    config = {"application.id": "expected", "errors.dead.letter.queue.topic.name": dlq}
    with TopologyTestDriver(topology, config | HANDLERS, repartition_partitions=2) as driver:
        topic = driver.create_input_topic(source, Serdes.string(), Serdes.bytes())
        for n, (partition, key, value, timestamp) in enumerate(INPUT):
            headers = [("trace", f"t-{n}".encode())]
            if value == b"{poison":
                with pytest.raises(TaskFailedError, match="Task 0_1"):
                    topic.pipe_raw(key, value, timestamp, headers, partition)
            else:
                topic.pipe_raw(key, value, timestamp, headers, partition)
        out = driver.create_output_topic(dlq, Serdes.bytes(), Serdes.bytes())
        return [(r.key, r.value, r.timestamp, r.headers) for r in out.read_records_to_list()]


def without_stacktrace(records: list[tuple]) -> list[tuple]:
    """The records with their stacktrace header left out (its frames differ between the two
    runtimes), after checking that each has one."""
    for *_, headers in records:
        assert dict(headers)[STACKTRACE].startswith(b"Traceback"), headers
    return [(*r[:3], tuple(h for h in r[3] if h[0] != STACKTRACE)) for r in records]


def dlq_records(kafka_settings, dlq: str, isolation: str = "read_uncommitted") -> list[tuple]:
    """The DLQ topic's records as ``(key, value, timestamp, headers)``."""
    return [(r.key, r.value, r.timestamp, r.headers)
            for r in read_topic(kafka_settings, dlq, isolation)]  # fmt: skip


def copies_of(expected: list[tuple], sent: list[tuple]) -> int:
    """How many times ``sent`` holds all of ``expected``, and nothing else (stacktraces left
    out): each run of the failing task sends them all, and Spark may run it more than once."""
    counts = Counter(without_stacktrace(sent))
    assert set(counts) == set(without_stacktrace(expected))
    return min(counts.values())


def delta_rows(spark, path: str) -> list:
    """A Delta table's rows; none when it has no commit (a failed first write leaves only an
    empty ``_delta_log``)."""
    if not any(Path(path, "_delta_log").glob("*.json")):
        return []
    return spark.read.format("delta").load(path).collect()


@pytest.fixture
def small_arrow_batches(spark):
    """Two records per Arrow batch: a task hands the first DLQ record's row to Spark before
    it reaches the poison, and that row fails with the Spark task too."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "2")
    yield
    spark.conf.set(key, before)


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.parametrize(
    ("path", "guarantee"),
    [
        ("streamed", "at_least_once"),
        # ~15-20 s each: make test-all only (the streamed path covers the guarantee in make test)
        pytest.param("cached", "at_least_once", marks=pytest.mark.slow),
        pytest.param("grouped", "at_least_once", marks=pytest.mark.slow),
        ("streamed", "exactly_once_v2"),
    ],
)
def test_a_failing_task_sends_its_dlq_records_before_failing_and_its_batch_is_not_committed(
    spark, kafka_settings, tmp_path, small_arrow_batches, path, guarantee
):
    app = f"dlqfail-{path}-{uuid.uuid4().hex[:6]}"
    source, dlq = f"{app}-in", f"{app}-dlq"
    create_topics(kafka_settings, [TopicSpec(source, 2), TopicSpec(dlq, 1)])
    produce_input(kafka_settings, source)
    # streamed: one Delta sink (the tasks run inside its write, side files); cached: two
    # (mapInArrow, output cached); grouped: a repartition (applyInArrow per task).
    sinks = ["out", "out-2"] if path == "cached" else ["out"]
    topology = amounts_topology(source, sinks, repartitioned=path == "grouped")
    config = job_config(kafka_settings, tmp_path, app, source, **HANDLERS) | {
        "errors.dead.letter.queue.topic.name": dlq,
        "processing.guarantee": guarantee,
    }
    job = StreamingJob(topology, config, spark=spark, delta_sinks=sinks)
    failed = f"Task 0_1: .* \\(source {source}-1@{POISON_OFFSET}\\)"  # the task and the record
    try:
        with pytest.raises(Exception, match=failed):
            job.run_batch()
        assert job.offset_log.planned(0) is not None
        assert job.commit_log.last() is None
        for table in [*sinks, "_dlq"]:  # not written: the DLQ mirror holds committed batches
            assert delta_rows(spark, f"{tmp_path}/delta/{app}/{table}") == [], table

        expected = what_the_test_driver_writes(
            amounts_topology(source, sinks, repartitioned=path == "grouped"), source, dlq
        )
        assert [(key, value, dict(headers)["__streams.errors.offset"])
                for key, value, _, headers in expected] == [
            (b"b", b'{"amount": 0}', b"1"), (b"bad", b"{poison", str(POISON_OFFSET).encode())
        ]  # fmt: skip
        poison = dict(expected[1][3])
        assert poison["__streams.errors.exception"] == b"SerializationError"
        assert (poison["__streams.errors.topic"], poison["__streams.errors.partition"]) == (
            source.encode(), b"1"
        )  # fmt: skip
        if guarantee == "exactly_once_v2":
            # In the failing task's transaction, aborted as it fails (as Kafka Streams does):
            # in the log, never seen by read_committed readers.
            assert copies_of(expected, dlq_records(kafka_settings, dlq)) >= 1
            assert dlq_records(kafka_settings, dlq, "read_committed") == []
            return
        # At least once: each Spark job reading the failed task's cached output runs it again.
        sent = copies_of(expected, dlq_records(kafka_settings, dlq))
        assert sent >= 1

        # The failed batch runs again, and fails again: its DLQ records are sent again.
        with pytest.raises(Exception, match=failed):
            job.run_batch()
        assert job.commit_log.last() is None
        assert copies_of(expected, dlq_records(kafka_settings, dlq)) > sent
    finally:
        job.close()


def test_dlq_records_the_broker_does_not_acknowledge_are_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(kafka_output, "_FLUSH_TIMEOUT_S", 1.0)
    topology = amounts_topology("in", ["out"])
    config = StreamsConfig({
        "application.id": "unacknowledged", "bootstrap.servers": "127.0.0.1:9",
        "state.dir": str(tmp_path), "errors.dead.letter.queue.topic.name": "dlq",
        "processing.guarantee": "at_least_once",  # acknowledged sends (no transaction)
    } | HANDLERS)  # fmt: skip
    runner = TaskBatchRunner(topology, config.to_dict(), 0, None, {}, {"in": 1, "out": 1})
    rows = [(0, "in", 0, 1, 1, b"k", b"{poison", None)]
    table = pa.table(dict(zip(INPUT_COLUMNS, zip(*rows, strict=True), strict=True)))
    with pytest.raises(kafka_output.KafkaOutputError) as failure:
        runner.run(table)
    message = str(failure.value)
    assert "1 were not acknowledged within 1s" in message
    assert "the DLQ records of task 0_0 before it fails (Task 0_0: " in message
    assert isinstance(failure.value.__context__, TaskFailedError)


def test_a_failing_task_without_dlq_records_fails_with_its_own_error(tmp_path):
    topology = amounts_topology("in", ["out"])
    config = StreamsConfig({
        "application.id": "no-dlq", "bootstrap.servers": "127.0.0.1:9", "state.dir": str(tmp_path),
    } | HANDLERS)  # fmt: skip
    runner = TaskBatchRunner(topology, config.to_dict(), 0, None, {}, {"in": 1, "out": 1})
    value = json.dumps({"amount": 1}).encode()
    rows = [(0, "in", 0, 1, 1, b"k", value, None), (0, "in", 1, 2, 2, b"k", b"{poison", None)]
    table = pa.table(dict(zip(INPUT_COLUMNS, zip(*rows, strict=True), strict=True)))
    with pytest.raises(TaskFailedError, match="Task 0_0: default.deserialization"):
        runner.run(table)
