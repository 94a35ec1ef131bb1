"""Exactly-once Kafka outputs (processing.guarantee=exactly_once_v2): a read_committed reader
sees every sink and DLQ record once, whatever kills the driver or retries a task; zombies are
fenced; the consumer group application.id shows the job's progress (docs/guarantees.md)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from streamplatform import TimeWindowedSerde
from streamplatform.config import ConfigError
from streamplatform.kafka import TopicSpec, consumer, create_topics, group_offsets, producer
from streamplatform.runtime import kafka_output
from streamplatform.runtime.kafka_output import KafkaOutputError, TaskOutput, Transactions
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import (
    JOB_RUN,
    PARTITIONS,
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    fixed_topology,
    job_config,
    join_topology,
    left_join_dedup_topology,
    make_input,
    make_views,
    read_topic,
    through_the_test_driver,
    views_per_window_topology,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]
TESTS = os.path.dirname(os.path.dirname(__file__))


def _child(config, builder, args, delta_sinks=(), env=None) -> subprocess.Popen:
    script = JOB_RUN.format(tests=TESTS, builder=builder, args=tuple(args), config=config,
                            delta_sinks=list(delta_sinks))  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-c", script], env=os.environ | (env or {}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def _finish(child: subprocess.Popen, timeout_s: float = 300) -> tuple[int, str]:
    try:
        output, _ = child.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the Spark JVM a killed driver left behind
        child.wait(60)
    return child.returncode, output


def _values(records) -> list[tuple[bytes, bytes]]:
    return sorted((record.key, record.value) for record in records)


def _topics(kafka_settings, app: str) -> tuple[str, str]:
    sink, dlq = f"{app}-out", f"{app}-dlq"
    create_topics(kafka_settings, [TopicSpec(sink, PARTITIONS), TopicSpec(dlq, 1)])
    return sink, dlq


POISON = [b"{poison"] * 3  # support.make_input's poison records, one DLQ record each


@pytest.mark.slow  # ~50 s: a child driver killed, then the rest in this process
@pytest.mark.child_process
def test_a_discarded_batch_whose_kafka_outputs_were_committed_is_not_produced_twice(
    spark, kafka_settings, tmp_path
):
    """Batch 1 is killed after every task committed its Kafka transaction; more records come;
    the code changes, so the replay is refused and the batch discarded. The new plan would read
    past what the old attempt produced: it stops where the consumer group says the outputs are
    committed, so a read_committed reader sees every input's output once."""
    app = f"eosk-discard-{uuid.uuid4().hex[:4]}"
    source = f"{app}-in"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS)])
    sent = make_input(kafka_settings, source, range(120))  # 40 a partition: batches 0 and 1
    sink, dlq = _topics(kafka_settings, app)
    config = job_config(kafka_settings, tmp_path, app, source) | {
        "errors.dead.letter.queue.topic.name": dlq
    }
    child = _child(config, "dedup_topology", (source, sink),
                   env={"STREAMPLATFORM_FAULT": "after_outputs:1"})  # fmt: skip
    code, output = _finish(child)
    assert code == -signal.SIGKILL, output[-3000:]
    sent += make_input(kafka_settings, source, range(120, 240))  # the new plan would reach 60

    job = StreamingJob(fixed_topology(source, sink), config, spark=spark)
    assert job.discard_uncommitted_batch() == 1
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == 1 and not results[0].replayed
    assert results[0].metrics["kafka_tasks_already_committed"] == PARTITIONS
    assert results[0].records_in == 30  # [30, 40) of each partition: what batch 1 had read

    records = read_topic(kafka_settings, sink)
    sources = [dict(r.headers)["i"] for r in records]  # make_input's index of the source record
    repeated = {s for s in sources if sources.count(s) > 1}
    assert not repeated, f"outputs produced twice for the inputs {sorted(repeated)[:5]}"
    # The clean run's outputs, and poison 202 (after batch 1) as a record under the fixed code.
    assert len(records) == len(expected_with_the_test_driver(source, sent)) + 1


@pytest.mark.slow  # ~60 s each: a child driver killed, then the rest in this process
@pytest.mark.parametrize(
    ("step", "delta_sink"),
    [
        ("after_plan", False),  # the plan logged, nothing run
        ("during_tasks", False),  # no transaction of the batch committed
        ("after_kafka_commit", False),  # one task's transaction committed, the others open
        ("after_outputs", False),  # every transaction committed, the batch not
        ("after_kafka_commit", True),  # the DLQ records of a Delta-sink job, from the driver
        ("after_commit", False),  # the batch committed, the driver's group commit not made
    ],
)
@pytest.mark.child_process
def test_a_job_killed_at_any_step_leaves_each_kafka_record_once_for_read_committed(
    spark, kafka_settings, source_topic, tmp_path, step, delta_sink
):
    source, sent = source_topic
    app = f"eosk-{step.replace('_', '-')}-{uuid.uuid4().hex[:4]}"
    sink, dlq = _topics(kafka_settings, app)
    config = job_config(kafka_settings, tmp_path, app, source) | {
        "errors.dead.letter.queue.topic.name": dlq
    }
    delta_sinks = [sink] if delta_sink else []
    child = _child(config, "dedup_topology", (source, sink), delta_sinks,
                   env={"STREAMPLATFORM_FAULT": f"{step}:1"})  # fmt: skip
    code, output = _finish(child)
    assert code == -signal.SIGKILL, output[-3000:]  # the poison record 101 is in batch 1

    job = StreamingJob(dedup_topology(source, sink), config, spark=spark, delta_sinks=delta_sinks)
    results = job.run_until_caught_up()
    job.close()
    if step == "after_commit":  # batch 1 is done: the restart goes on with batch 2
        assert results[0].batch_id == 2 and not results[0].replayed
    else:
        assert results[0].batch_id == 1 and results[0].replayed
    if step in ("after_kafka_commit", "after_outputs"):
        # The re-run found what the killed driver's tasks had committed, and skipped it.
        assert results[0].metrics["kafka_tasks_already_committed"] >= 1
    expected = expected_with_the_test_driver(source, sent)
    if delta_sink:
        rows = delta_rows(spark, f"{tmp_path}/delta/{app}/{sink}")
        assert sorted((k, v) for _, _, k, v in rows) == expected
    else:
        assert _values(read_topic(kafka_settings, sink)) == expected
    assert [record.value for record in read_topic(kafka_settings, dlq)] == POISON


@pytest.mark.slow  # ~40 s: a child driver killed, then the rest in this process
@pytest.mark.child_process
def test_a_task_of_two_topics_that_stopped_before_one_is_not_produced_twice_by_its_replay(
    spark, kafka_settings, tmp_path
):
    """A task reading transactions and rates stops early (its store's uncommitted limit)
    among the transactions, before any rate: its transaction commits the transactions'
    position and the rates' unmoved start. Killed before the batch commits, the re-run must
    take the task's outputs as committed by that one moved position; asking for both would
    produce them again."""
    app = f"eosk-two-{uuid.uuid4().hex[:4]}"
    transactions, rates, sink = f"{app}-tx", f"{app}-rates", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(transactions, 1), TopicSpec(rates, 1),
                                   TopicSpec(sink, 1)])  # fmt: skip
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    for n in range(10):  # every transaction before every rate, in event time
        writer.produce(transactions, key="c", value=json.dumps({"id": f"tx-{n}"}),
                       partition=0, timestamp=1_000 + n)  # fmt: skip
    for n in range(3):
        writer.produce(rates, key="c", value=json.dumps({"rate": n}), partition=0,
                       timestamp=100_000 + n)  # fmt: skip
    assert writer.flush(60) == 0
    config = job_config(kafka_settings, tmp_path, app, transactions) | {
        "statestore.uncommitted.max.records": 4,  # the 5th transaction passes it
        "platform.max.records.per.batch": 1_000,
        "errors.dead.letter.queue.topic.name": None,
    }
    child = _child(config, "left_join_dedup_topology", (transactions, rates, sink),
                   env={"STREAMPLATFORM_FAULT": "after_outputs:0"})  # fmt: skip
    code, output = _finish(child)
    assert code == -signal.SIGKILL, output[-3000:]

    job = StreamingJob(left_join_dedup_topology(transactions, rates, sink), config, spark=spark)
    results = job.run_until_caught_up()
    job.close()
    first = results[0]
    assert first.batch_id == 0 and first.replayed and first.path.startswith("direct")
    assert first.metrics["kafka_tasks_already_committed"] == 1
    assert 0 < first.records_in < 13  # the task stopped early, as the killed attempt did
    ids = [json.loads(record.value)["id"] for record in read_topic(kafka_settings, sink)]
    assert sorted(ids) == sorted(f"tx-{n}" for n in range(10))  # each once


@pytest.mark.slow  # ~40 s: a child driver killed, then the rest in this process
@pytest.mark.parametrize("step", ["during_tasks", "after_outputs"])
@pytest.mark.child_process
def test_a_windowed_count_killed_mid_job_gives_each_windows_final_count_once(
    spark, kafka_settings, tmp_path, step
):
    """Views per user per window, final counts only (on_window_close), killed in batch 1
    while its tasks run or after they committed their transactions: the re-run restores the
    windows' state of batch 0 and forwards each window's final count once."""
    app = f"eosk-win-{step.replace('_', '-')}-{uuid.uuid4().hex[:4]}"
    source, sink = f"{app}-views", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS), TopicSpec(sink, PARTITIONS)])
    sent = make_views(kafka_settings, source, 450)
    config = job_config(kafka_settings, tmp_path, app, source) | {
        "platform.max.records.per.batch": 50,  # per partition: 3 batches
        "errors.dead.letter.queue.topic.name": None,
    }
    child = _child(config, "views_per_window_topology", (source, sink),
                   env={"STREAMPLATFORM_FAULT": f"{step}:1"})  # fmt: skip
    code, output = _finish(child)
    assert code == -signal.SIGKILL, output[-3000:]

    job = StreamingJob(views_per_window_topology(source, sink), config, spark=spark)
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == 1 and results[0].replayed
    windowed = TimeWindowedSerde(Serdes.string(), 10_000)
    got = [(windowed.deserialize(r.key), Serdes.long().deserialize(r.value), r.timestamp)
           for r in read_topic(kafka_settings, sink)]  # fmt: skip
    expected = through_the_test_driver(views_per_window_topology(source, sink), source, sink,
                                       sent, windowed, Serdes.long())  # fmt: skip
    assert sorted(got, key=repr) == sorted(expected, key=repr)


def test_a_zombie_attempt_of_a_task_is_fenced_and_its_records_never_seen(
    kafka_settings, topic_name
):
    """Two attempts of task 0_0 of one batch: the newer one's init_transactions fences the
    older one, whose records are aborted; a third attempt finds the batch committed."""
    create_topics(kafka_settings, [TopicSpec(topic_name, 1)])
    app = f"zombie-{uuid.uuid4().hex[:6]}"
    transactions = Transactions(app, 7, {"0_0": ((topic_name, 0, 3),)}, (topic_name, 0))
    settings = {"bootstrap.servers": kafka_settings["bootstrap.servers"]}

    def attempt(value: bytes) -> TaskOutput:
        output = TaskOutput(settings, "task 0_0", transactions.transactional_id("0_0"),
                            transactions.group_and_positions("0_0"), 7)  # fmt: skip
        output.produce(("sink", topic_name, b"k", value, 1_000, [], 0, "in", 0, 0))
        return output

    older = attempt(b"from the zombie")
    older.out.flush(10)  # in the log, in an open transaction
    newer = attempt(b"from the new attempt")  # fences the older one, aborting its records
    assert newer.commit() == 1
    with pytest.raises(KafkaOutputError, match="fenced by a newer attempt"):
        older.commit()
    older.close()
    newer.close()
    third = TaskOutput(settings, "task 0_0", transactions.transactional_id("0_0"),
                       transactions.group_and_positions("0_0"), 7)  # fmt: skip
    assert third.already_committed  # the group's offsets say so: it produces nothing
    third.close()

    assert [r.value for r in read_topic(kafka_settings, topic_name)] == [b"from the new attempt"]
    uncommitted = [r.value for r in read_topic(kafka_settings, topic_name, "read_uncommitted")]
    assert sorted(uncommitted) == [b"from the new attempt", b"from the zombie"]


def test_the_consumer_group_shows_the_commit_logs_offsets_and_the_jobs_lag(
    spark, kafka_settings, source_topic, tmp_path
):
    from confluent_kafka import TopicPartition

    source, _ = source_topic
    app = f"group-{uuid.uuid4().hex[:6]}"
    sink, dlq = _topics(kafka_settings, app)
    config = job_config(kafka_settings, tmp_path, app, source) | {
        "errors.dead.letter.queue.topic.name": dlq
    }
    job = StreamingJob(dedup_topology(source, sink), config, spark=spark)
    try:
        (result,) = job.run(max_batches=1)
        committed = job.commit_log.last()
    finally:
        job.close()
    assert committed is not None and result.lag > 0
    group = group_offsets(kafka_settings, app)
    assert group == committed.consumed
    # Lag as Kafka tools compute it: each partition's end offset minus the group's offset.
    reader = consumer(kafka_settings, f"lag-{app}", **{"isolation.level": "read_uncommitted"})
    try:
        lag = 0
        for (topic, partition), offset in group.items():
            _, high = reader.get_watermark_offsets(TopicPartition(topic, partition), 10)
            lag += high - offset
    finally:
        reader.close()
    assert lag == result.lag


def test_wrong_producer_settings_stop_the_job_at_start_naming_the_setting(
    kafka_settings, source_topic, tmp_path
):
    source, _ = source_topic
    app = f"badprod-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source)
    for setting, message in [
        ("producer.transactional.id", "producer.transactional.id: set by the runtime"),
        ("producer.enable.idempotence", "producer.enable.idempotence=false"),
        ("producer.linger.millis", "producer.*: librdkafka refused"),
    ]:
        value = "false" if "idempotence" in setting else "x"
        with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("*", r"\*")):
            StreamingJob(dedup_topology(source, "out"), config | {setting: value},
                         delta_sinks=["out"])  # fmt: skip
    # Above the broker's transaction.max.timeout.ms (15 min): refused when the job starts.
    job = StreamingJob(dedup_topology(source, "out"), config | {
        "producer.transaction.timeout.ms": 3_600_000}, delta_sinks=["out"])  # fmt: skip
    try:
        with pytest.raises(KafkaOutputError, match=r"producer\.transaction\.timeout\.ms=3600000"):
            job.run_batch()
        assert job.offset_log.planned(0) is None  # nothing ran
    finally:
        job.close()


@pytest.mark.slow  # ~25 s: a broker of its own
def test_a_broker_without_transactions_stops_an_exactly_once_job_at_start(tmp_path, monkeypatch):
    from streamplatform.kafka import LocalBroker

    # Its transaction log needs 3 replicas and there is one broker: no coordinator, ever.
    broker = LocalBroker(tmp_path / "broker", properties={
        "transaction.state.log.replication.factor": "3"})  # fmt: skip
    settings = {"bootstrap.servers": broker.start()}
    try:
        create_topics(settings, [TopicSpec("in", 1)])
        monkeypatch.setattr(kafka_output, "_TRANSACTION_CALL_TIMEOUT_S", 5.0)
        config = job_config(settings, tmp_path, "no-txn", "in")
        config.pop("errors.dead.letter.queue.topic.name")
        job = StreamingJob(dedup_topology("in", "out"), config, delta_sinks=["out"])
        try:
            with pytest.raises(KafkaOutputError, match="needs a broker that allows transactions"):
                job.run_batch()
        finally:
            job.close()
        at_least_once = config | {"processing.guarantee": "at_least_once"}
        job = StreamingJob(dedup_topology("in", "out"), at_least_once, delta_sinks=["out"])
        try:
            assert job.run_batch() is None  # nothing to read, and no transaction needed
        finally:
            job.close()
    finally:
        broker.stop()


# The mission's chain ---------------------------------------------------------------------


def _chain_input(kafka_settings, name: str) -> tuple[str, str, list]:
    """Transactions with 20% duplicates and 3 poison records (support.make_input), keyed
    k0..k2, and a versioned table of rates for those keys, all earlier in event time."""
    raw, rates = f"{name}-raw", f"{name}-rates"
    create_topics(kafka_settings, [TopicSpec(raw, PARTITIONS), TopicSpec(rates, PARTITIONS)])
    writer = producer(kafka_settings)
    for version in range(4):
        for key in ("k0", "k1", "k2"):  # partitioned by murmur2, as the dedup job's output
            writer.produce(rates, key=key, value=json.dumps({"rate": version + 0.5}).encode(),
                           timestamp=500_000 + version * 1_000)  # fmt: skip
    assert writer.flush(60) == 0
    return raw, rates, make_input(kafka_settings, raw)


def _run_chain(spark, kafka_settings, tmp_path: Path, name: str, raw: str, rates: str, kill: bool):
    """The dedup job (raw -> Kafka topic <name>-deduped, exactly once) and the enrichment job
    (that topic joined with the rates -> Delta table enriched), each run to its end in this
    process. With ``kill``, each first runs in a child driver that is SIGKILLed at a random
    moment; in the dedup job's child the first task to commit its Kafka transaction fails once
    after that commit, and Spark retries it (``local[2,2]``), before the kill."""
    deduped, dlq = f"{name}-deduped", f"{name}-dlq"
    create_topics(kafka_settings, [TopicSpec(deduped, PARTITIONS), TopicSpec(dlq, 1)])
    dedup = job_config(kafka_settings, tmp_path, f"{name}-dedup", raw) | {
        "errors.dead.letter.queue.topic.name": dlq
    }
    enrich = job_config(kafka_settings, tmp_path, f"{name}-enrich", deduped) | {
        "errors.dead.letter.queue.topic.name": dlq
    }
    jobs = [
        (dedup, dedup_topology, (raw, deduped), []),
        (enrich, join_topology, (deduped, rates, "enriched"), ["enriched"]),
    ]
    chosen = random.Random(name)
    for config, builder, args, delta_sinks in jobs:
        if kill:
            # The moment to wait for before the random delay: the retried task (dedup), or
            # the first planned batch (enrichment).
            started = tmp_path / "delta" / config["application.id"] / "_offsets" / "_delta_log"
            env = {}
            if builder is dedup_topology:
                started = tmp_path / "dedup-task-failed"
                env = {"STREAMPLATFORM_FAIL_ONCE": "after_kafka_commit:*",
                       "STREAMPLATFORM_FAIL_ONCE_FILE": str(started)}  # fmt: skip
                config = config | {"platform.spark.master": "local[2,2]"}  # tasks retried once
            child = _child(config, builder.__name__, args, delta_sinks, env)
            deadline = time.monotonic() + 240
            while not started.exists() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert started.exists(), f"{builder.__name__}: {started} never appeared"
            time.sleep(chosen.uniform(0.0, 4.0))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            _finish(child)
        job = StreamingJob(builder(*args), config, spark=spark, delta_sinks=delta_sinks)
        job.run_until_caught_up()
        job.close()
    return deduped, f"{tmp_path}/delta/{name}-enrich/enriched"


@pytest.mark.slow  # ~2 min: two child drivers, then four jobs in this process
@pytest.mark.child_process
def test_the_dedup_to_kafka_to_enrichment_chain_equals_a_clean_run_row_for_row(
    spark, kafka_settings, tmp_path
):
    name = f"chain-{uuid.uuid4().hex[:6]}"
    raw, rates, sent = _chain_input(kafka_settings, name)
    clean_topic, clean_table = _run_chain(spark, kafka_settings, tmp_path / "clean", f"{name}-c",
                                          raw, rates, kill=False)  # fmt: skip
    killed_topic, killed_table = _run_chain(spark, kafka_settings, tmp_path / "killed",
                                            f"{name}-k", raw, rates, kill=True)  # fmt: skip

    clean = _values(read_topic(kafka_settings, clean_topic))
    assert clean == expected_with_the_test_driver(raw, sent)
    assert _values(read_topic(kafka_settings, killed_topic)) == clean

    def enriched(path):
        rows = spark.read.format("delta").load(path).collect()
        return sorted((r.key, r.value) for r in rows)

    want = enriched(clean_table)
    assert len(want) == len(clean) > 0
    assert all(json.loads(value)["rate"] == 3.5 for _, value in want)
    assert enriched(killed_table) == want  # row for row: no duplicate, no loss


def test_explain_names_what_to_change():
    from confluent_kafka import KafkaError

    settings = {"transaction.timeout.ms": "3600000"}
    timeout = kafka_output.explain(
        KafkaError(KafkaError.INVALID_TRANSACTION_TIMEOUT), "x", settings
    )
    assert "producer.transaction.timeout.ms=3600000" in timeout
    denied = kafka_output.explain(
        KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), "x", settings
    )
    assert "TransactionalId prefix <application.id>-" in denied
    assert "allows transactions" in kafka_output.explain(
        KafkaError(KafkaError._TIMED_OUT), "x", settings
    )


def test_rows_of_a_task_must_come_together(monkeypatch):
    """A Spark partition holds whole tasks; if one did not, two producers of one task would
    fence each other: this is refused before anything is produced."""
    rows = pa.RecordBatch.from_pydict({
        "kind": ["sink"] * 3, "topic": ["t"] * 3, "key": [b"k"] * 3, "value": [b"v"] * 3,
        "timestamp": [1, 2, 3], "headers": [[], [], []], "partition": [0, 0, 0],
        "source_topic": ["s"] * 3, "source_partition": [0, 0, 0], "source_offset": [1, 2, 3],
        "task": ["0_0", "0_1", "0_0"],
    })  # fmt: skip

    class Recorder:  # stands in for TaskOutput: what send() opened and committed, in order
        opened: list = []

        def __init__(self, task):
            self.task, self.already_committed = task, False
            Recorder.opened.append(task)

        def produce(self, row):
            pass

        def commit(self):
            return 1

        def abort(self):
            pass

        def close(self):
            pass

    transactions = Transactions("app", 0, {}, ("s", 0))
    monkeypatch.setattr(kafka_output, "_open", lambda settings, task, txns, what: Recorder(task))
    with pytest.raises(RuntimeError, match="task 0_0's rows are not together"):
        kafka_output.send({}, [rows], transactions, "the batch's Kafka output")
    assert Recorder.opened == ["0_0", "0_1"]
