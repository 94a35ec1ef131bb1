"""The Spark runtime on a real broker, real Spark and real Delta: output equals the test
driver's, poison records reach the DLQ once, and a job killed at any step resumes to exactly
the output of a clean run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.config import ConfigError
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

pytestmark = [pytest.mark.broker, pytest.mark.spark]

PARTITIONS = 3
RECORDS = 240


def dedup_topology(source: str, sink: str):
    b = StreamsBuilder()
    stream = b.stream(source, Serdes.string(), Serdes.json())
    stream.deduplicate_by_key_value(lambda k, v: v["id"], 60_000).to(sink)
    return b.build()


def make_input(kafka_settings, source: str) -> list[tuple[int, str, bytes, int]]:
    """RECORDS records over 3 partitions: 20% duplicates, 3 poison values."""
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    sent = []
    for index in range(RECORDS):
        partition = index % PARTITIONS
        tx_id = f"tx-{index - 6 if index % 5 == 0 and index >= 6 else index}"
        value = json.dumps({"id": tx_id, "n": index}).encode()
        if index in (17, 101, 202):
            value = b"{poison"
        timestamp = 1_000_000 + index * 1_000
        writer.produce(source, key=f"k{partition}", value=value, partition=partition,
                       timestamp=timestamp, headers=[("i", str(index).encode())])  # fmt: skip
        sent.append((partition, f"k{partition}", value, timestamp))
    assert writer.flush(30) == 0
    return sent


@pytest.fixture(scope="module")
def source_topic(kafka_settings):
    name = f"rt-source-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(name, PARTITIONS), TopicSpec(f"{name}-dlq", 1)])
    return name, make_input(kafka_settings, name)


def job_config(kafka_settings, tmp_path, app, source, **overrides):
    return {
        "application.id": app,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(tmp_path / app / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        "platform.max.records.per.batch": 30,  # 80 records per partition: batches 0, 1, 2
        "errors.dead.letter.queue.topic.name": f"{source}-dlq",
        "default.deserialization.exception.handler": "log_and_continue",
    } | overrides


def delta_rows(spark, path):
    rows = spark.read.format("delta").load(path).collect()
    return sorted((r.source_partition, r.source_offset, r.key, r.value) for r in rows)


def expected_with_the_test_driver(source, sent):
    """The same records through the TopologyTestDriver: what the Spark run must produce."""
    topology = dedup_topology(source, "out")
    config = {
        "application.id": "expected",
        "default.deserialization.exception.handler": "log_and_continue",
    }
    expected = []
    with TopologyTestDriver(topology, config) as driver:
        for partition in range(PARTITIONS):
            records = [s for s in sent if s[0] == partition]
            topic = driver.create_input_topic(source, Serdes.string(), Serdes.bytes())
            for _, key, value, timestamp in records:
                topic.pipe_raw(key.encode(), value, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic("out", Serdes.bytes(), Serdes.bytes())
        expected = out.read_records_to_list()
    return sorted((r.key, r.value) for r in expected)


def test_dedup_job_equals_the_test_driver_and_dlq_gets_each_poison_once(
    spark, kafka_settings, source_topic, tmp_path
):
    source, sent = source_topic
    app = f"rt-{uuid.uuid4().hex[:6]}"
    job = StreamingJob(dedup_topology(source, "deduplicated"),
                       job_config(kafka_settings, tmp_path, app, source), spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    results = job.run_until_caught_up()

    assert len(results) == 3
    assert [r.batch_id for r in results] == list(range(len(results)))
    assert sum(r.records_in for r in results) == RECORDS
    assert results[-1].lag == 0
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)  # no source record twice
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3
    assert sum(r.dlq_records for r in results) == 3
    assert sum(r.duplicates_dropped for r in results) > 0
    assert job.run_until_caught_up() == []  # caught up: nothing more to do


def test_a_missing_dlq_topic_stops_start_up_naming_it(
    spark, kafka_settings, source_topic, tmp_path
):
    source, _ = source_topic
    config = job_config(kafka_settings, tmp_path, "no-dlq", source) | {
        "errors.dead.letter.queue.topic.name": "no-such-dlq"
    }
    with pytest.raises(ConfigError, match="no-such-dlq"):
        StreamingJob(dedup_topology(source, "x"), config, spark=spark, delta_sinks=["x"])


def test_a_broker_that_is_down_is_a_clear_error(tmp_path):
    config = {
        "application.id": "down",
        "bootstrap.servers": "127.0.0.1:9",
        "state.dir": str(tmp_path),
    }
    with pytest.raises(ConnectionError, match="bootstrap.servers=127.0.0.1:9"):
        StreamingJob(dedup_topology("a", "b"), config, delta_sinks=["b"])


CRASHING_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from runtime.test_streaming_job import dedup_topology
    from streamplatform.runtime.microbatch import StreamingJob
    config = {config!r}
    StreamingJob(dedup_topology({source!r}, "deduplicated"), config,
                 delta_sinks=["deduplicated"]).run_until_caught_up()
    print("finished without crashing")
""")


@pytest.mark.parametrize("step", ["after_plan", "during_tasks", "after_outputs", "after_commit"])
def test_a_job_killed_at_any_step_resumes_to_the_clean_output(
    spark, kafka_settings, source_topic, tmp_path, step
):
    source, sent = source_topic
    app = f"crash-{step.replace('_', '-')}-{uuid.uuid4().hex[:4]}"
    config = job_config(kafka_settings, tmp_path, app, source)
    script = CRASHING_RUN.format(
        tests=os.path.dirname(os.path.dirname(__file__)), config=config, source=source
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        env=os.environ | {"STREAMPLATFORM_FAULT": f"{step}:1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = child.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the Spark JVM the killed driver left behind
    assert child.returncode == -signal.SIGKILL, output[-3000:]

    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    results = job.run_until_caught_up()
    assert results[0].batch_id == (2 if step == "after_commit" else 1)
    assert results[0].replayed == (step != "after_commit")

    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3


def test_a_wiped_state_dir_is_restored_from_the_changelog(
    spark, kafka_settings, source_topic, tmp_path
):
    source, sent = source_topic
    app = f"wipe-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source)
    job = StreamingJob(
        dedup_topology(source, "deduplicated"), config, spark=spark, delta_sinks=["deduplicated"]
    )
    first = job.run(max_batches=2)
    assert sum(r.restored_records for r in first) == 0

    shutil.rmtree(tmp_path / app / "state")  # the executor's disk is gone
    job = StreamingJob(
        dedup_topology(source, "deduplicated"), config, spark=spark, delta_sinks=["deduplicated"]
    )
    rest = job.run_until_caught_up()
    assert rest[0].restored_records > 0  # replayed from the Delta changelog
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
