"""Exactly once in ordinary operation (real broker, Spark, Delta): two drivers of one job, a
retry in the same process, an early stop in a task that reads two topics, transactional and
truncated input, and a crashed batch met by changed code."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from streamplatform import ReplayRefused, StreamingJob
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime import microbatch
from streamplatform.runtime.logs import OffsetLog

from .support import (
    CRASHING_RUN,
    DRIVER,
    JOIN_CRASHING_RUN,
    PARTITIONS,
    RECORDS,
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    fixed_topology,
    job_config,
    join_input,
    join_tables,
    join_topology,
    make_input,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]
TESTS = os.path.dirname(os.path.dirname(__file__))


def _dedup_job(spark, config, source):
    return StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                        delta_sinks=["deduplicated"])  # fmt: skip


def _everything(spark, root: Path, app: str) -> dict:
    """What a job leaves in Delta, comparable across runs."""

    def table(name, *order):
        frame = spark.read.format("delta").load(str(root / app / name))
        return [tuple(r) for r in frame.orderBy(*order).collect()]

    coordinates = ("batch_id", "source_partition", "source_offset")
    commits = spark.read.format("delta").load(str(root / app / "_commits"))
    return {
        "output": table("deduplicated", *coordinates),
        "dlq": table("_dlq", *coordinates),
        "changelog": table("_changelog", "batch_id", "task", "store", "seq"),
        "commits": sorted((r.batch_id, r.consumed) for r in commits.collect()),
    }


def _driver(config, source, env=None) -> subprocess.Popen:
    script = DRIVER.format(tests=TESTS, config=config, source=source)
    return subprocess.Popen(
        [sys.executable, "-c", script], env=os.environ | (env or {}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def _wait_for(path: Path, child: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if child.poll() is not None:
            raise AssertionError(f"the driver ended before {path.name}: {child.stdout.read()}")
        assert time.monotonic() < deadline, f"no {path} after {timeout_s}s"
        time.sleep(0.05)


def _finish(child: subprocess.Popen, timeout_s: float = 300) -> tuple[int, str]:
    try:
        output, _ = child.communicate(timeout=timeout_s)
        return child.returncode, output
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # Spark's JVM, if anything is left


@pytest.mark.slow  # three driver processes, each with its own Spark: ~60 s
@pytest.mark.child_process
def test_a_second_driver_is_refused_or_waits_and_the_result_equals_one_clean_run(
    spark, kafka_settings, source_topic, tmp_path
):
    source, _ = source_topic
    clean = job_config(kafka_settings, tmp_path / "clean", "app", source)
    job = _dedup_job(spark, clean, source)
    job.run_until_caught_up()
    job.close()

    config = job_config(kafka_settings, tmp_path / "two", "app", source)
    pause = tmp_path / "pause"
    pause.mkdir()
    first = _driver(config, source, {"STREAMPLATFORM_PAUSE": "after_outputs:1",
                                     "STREAMPLATFORM_PAUSE_DIR": str(pause)})  # fmt: skip
    children = [first]
    try:
        _wait_for(pause / "paused", first)  # batch 1's outputs are written, not committed
        refused = _driver(config, source)
        code, output = _finish(refused, 120)
        assert code == 3, output
        assert "REFUSED" in output and "held by run" in output and "pid" in output
        waiting = _driver(config | {"platform.claim.wait.ms": 300_000}, source)
        children.append(waiting)
        time.sleep(3)
        assert waiting.poll() is None  # neither refused nor done: waiting for the first
        (pause / "resume").touch()
        code, output = _finish(first)
        assert code == 0 and "FINISHED" in output, output
        code, output = _finish(waiting)
        assert code == 0 and "FINISHED" in output, output
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

    assert _everything(spark, tmp_path / "two" / "delta", "app") == _everything(
        spark, tmp_path / "clean" / "delta", "app"
    )


def test_run_batch_again_after_a_failure_replays_the_logged_plan(
    spark, kafka_settings, topic_name, tmp_path, monkeypatch
):
    source = topic_name
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS), TopicSpec(f"{source}-dlq")])
    sent = make_input(kafka_settings, source, range(0, 150))
    config = job_config(kafka_settings, tmp_path, "retry", source)
    job = _dedup_job(spark, config, source)
    failed = []

    def fail_once_after_the_outputs(step, batch_id):
        if (step, batch_id) == ("after_outputs", 1) and not failed:
            failed.append(batch_id)
            raise RuntimeError("injected: the batch fails after its sink write")

    monkeypatch.setattr(microbatch, "crash_point", fail_once_after_the_outputs)
    assert job.run_batch().batch_id == 0
    with pytest.raises(RuntimeError, match="injected"):
        job.run_batch()
    sent += make_input(kafka_settings, source, range(150, RECORDS))  # more records arrive
    results = job.run_until_caught_up()
    job.close()

    assert (results[0].batch_id, results[0].replayed) == (1, True)
    rows = delta_rows(spark, f"{tmp_path}/delta/retry/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    assert sum(r.records_in for r in results) + 90 == RECORDS  # batch 0 read 30 x 3


def test_a_two_topic_task_stopped_early_loses_no_record_of_the_topic_it_did_not_reach(
    spark, kafka_settings, topic_name, tmp_path
):
    transactions, rates = f"{topic_name}-tx", f"{topic_name}-rates"
    create_topics(kafka_settings, [TopicSpec(transactions, 2), TopicSpec(rates, 2)])
    writer = producer(kafka_settings)
    for partition in range(2):
        for n in range(8):  # rates first in event time: a task picks them before any tx
            writer.produce(rates, key=f"c{partition}", value=json.dumps({"rate": n}),
                           partition=partition, timestamp=1_000 + n)  # fmt: skip
        for n in range(5):
            writer.produce(transactions, key=f"c{partition}",
                           value=json.dumps({"id": f"{partition}-{n}"}), partition=partition,
                           timestamp=100_000 + n)  # fmt: skip
    assert writer.flush(60) == 0
    config = job_config(kafka_settings, tmp_path, "cut", transactions) | {
        "statestore.uncommitted.max.records": 4,  # the rates alone pass it: the task stops early
        "platform.max.records.per.batch": 1_000,
        "errors.dead.letter.queue.topic.name": None,
    }
    job = StreamingJob(join_topology(transactions, rates, "enriched"), config, spark=spark,
                       delta_sinks=["enriched"])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()

    # The limit must cut batch 0 among the rates, before any transaction, for this to mean
    # anything (4 rates per task, the 5th passes the limit).
    assert results[0].records_in == 10 and results[0].records_out == 0
    rows = spark.read.format("delta").load(f"{tmp_path}/delta/cut/enriched").collect()
    ids = sorted(json.loads(r.value)["id"] for r in rows)
    assert ids == sorted(f"{p}-{n}" for p in range(2) for n in range(5))
    assert {json.loads(r.value)["rate"] for r in rows} == {7}
    assert sum(r.records_in for r in results) == 26


def _transactional(kafka_settings, topic, values, commit=True):
    writer = Producer({"bootstrap.servers": kafka_settings["bootstrap.servers"],
                       "transactional.id": f"{topic}-{uuid.uuid4().hex[:6]}"})  # fmt: skip
    writer.init_transactions(30)
    writer.begin_transaction()
    for value in values:
        writer.produce(topic, key="k", value=json.dumps(value), partition=0, timestamp=1_000)
    writer.flush(30)
    if commit:
        writer.commit_transaction(30)
    return writer


def test_aborted_and_open_transactions_are_never_read_and_lost_offsets_are_reported(
    spark, kafka_settings, topic_name, tmp_path, caplog
):
    source = topic_name
    create_topics(kafka_settings, [TopicSpec(source, 1)])
    _transactional(kafka_settings, source, [{"id": f"a{n}"} for n in range(5)])
    _transactional(kafka_settings, source, [{"id": f"x{n}"} for n in range(3)], False
                   ).abort_transaction(30)  # fmt: skip
    _transactional(kafka_settings, source, [{"id": f"b{n}"} for n in range(5)])
    still_open = _transactional(kafka_settings, source, [{"id": "o0"}], commit=False)
    config = job_config(kafka_settings, tmp_path, "txn", source) | {
        "errors.dead.letter.queue.topic.name": None
    }
    job = _dedup_job(spark, config, source)

    def ids():
        rows = spark.read.format("delta").load(f"{tmp_path}/delta/txn/deduplicated").collect()
        return sorted(json.loads(r.value)["id"] for r in rows)

    first = job.run_until_caught_up()  # ends: the open transaction is past the stable offset
    assert ids() == [f"a{n}" for n in range(5)] + [f"b{n}" for n in range(5)]
    # 3 aborted records and 3 transaction markers sit between the committed records.
    assert sum(r.metrics["offset_gaps"] for r in first) == 6
    still_open.commit_transaction(30)
    job.run_until_caught_up()
    assert "o0" in ids()

    plain = producer(kafka_settings)
    for n in range(5):
        plain.produce(source, key="k", value=json.dumps({"id": f"r{n}"}), partition=0)
    assert plain.flush(30) == 0
    end = job.commit_log.last().consumed[(source, 0)] + 5  # past o0's marker: the 5 records
    admin = AdminClient({"bootstrap.servers": kafka_settings["bootstrap.servers"]})
    for future in admin.delete_records([KafkaTopicPartition(source, 0, end - 2)]).values():
        future.result(30)  # retention: all but the last two records are gone
    with caplog.at_level("WARNING"):
        (last,) = job.run_until_caught_up()
    job.close()
    assert last.metrics["offsets_skipped"] == 3  # r0..r2
    assert "are gone from Kafka" in caplog.text
    assert ids()[-2:] == ["r3", "r4"] and "r2" not in ids()


@pytest.mark.slow  # a killed driver process, then the job: ~40 s
@pytest.mark.child_process
def test_a_crashed_batch_is_not_replayed_under_changed_code_until_discarded(
    spark, kafka_settings, source_topic, tmp_path
):
    source, _ = source_topic
    config = job_config(kafka_settings, tmp_path, "fix", source)
    script = CRASHING_RUN.format(tests=TESTS, config=config, source=source)
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=os.environ | {"STREAMPLATFORM_FAULT": "after_outputs:1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    code, output = _finish(child)
    assert code == -signal.SIGKILL, output[-3000:]
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/fix/_dlq")
    assert dlq.where("batch_id = 1").count() == 1  # the first attempt parked poison 101

    job = StreamingJob(fixed_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    with pytest.raises(ReplayRefused, match="batch 1 was planned") as refused:
        job.run_batch()
    assert "discard_uncommitted_batch" in str(refused.value)
    assert job.discard_uncommitted_batch() == 1
    results = job.run_until_caught_up()
    job.close()

    assert (results[0].batch_id, results[0].replayed) == (1, False)
    sink = {(r.source_partition, r.source_offset)
            for r in spark.read.format("delta").load(f"{tmp_path}/delta/fix/deduplicated")
            .select("source_partition", "source_offset").collect()}  # fmt: skip
    parked = {
        (r.source_partition, r.source_offset)
        for r in spark.read.format("delta").load(f"{tmp_path}/delta/fix/_dlq").collect()
    }
    assert (2, 33) in sink and (2, 33) not in parked  # poison 101, processed by the fix
    assert (2, 5) in parked  # poison 17, parked in batch 0 under the old code
    assert not sink & parked, "a record both processed and left in the DLQ mirror"


@pytest.mark.slow  # a killed driver process, then the job: ~40 s
@pytest.mark.child_process
def test_a_crashed_batch_that_wrote_nothing_is_planned_anew_under_changed_code(
    spark, kafka_settings, source_topic, tmp_path
):
    """Killed right after planning batch 1: no table holds a write of it and no task committed
    Kafka outputs, so the changed job drops the old plan and plans the batch itself, without
    ReplayRefused and without discard-batch."""
    source, _ = source_topic
    # An application id of its own: its consumer group must not hold another test's offsets.
    config = job_config(kafka_settings, tmp_path, "fix-anew", source)
    script = CRASHING_RUN.format(tests=TESTS, config=config, source=source)
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=os.environ | {"STREAMPLATFORM_FAULT": "after_plan:1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    code, output = _finish(child)
    assert code == -signal.SIGKILL, output[-3000:]
    assert OffsetLog(f"{tmp_path}/delta/fix-anew/_offsets", "fix-anew").planned(1) is not None

    job = StreamingJob(fixed_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()
    assert (results[0].batch_id, results[0].replayed) == (1, False)
    sink = {(r.source_partition, r.source_offset)
            for r in spark.read.format("delta").load(f"{tmp_path}/delta/fix-anew/deduplicated")
            .select("source_partition", "source_offset").collect()}  # fmt: skip
    assert (2, 33) in sink  # poison 101 (batch 1), processed by the fix


JOIN_SETTINGS = {"platform.max.records.per.batch": 6}  # two batches: 6 + 6, then 2 + 4


def _run_join(spark, config, transactions, rates):
    job = StreamingJob(join_topology(transactions, rates, "enriched"), config, spark=spark,
                       delta_sinks=["enriched"])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()
    return results


@pytest.fixture(scope="module")
def join_clean(spark, kafka_settings, tmp_path_factory):
    """The join job's input, and what one clean run of it leaves in Delta."""
    directory = tmp_path_factory.mktemp("join-clean")
    transactions, rates = join_input(kafka_settings, f"join-{uuid.uuid4().hex[:8]}")
    config = job_config(kafka_settings, directory, "join", transactions) | JOIN_SETTINGS
    _run_join(spark, config, transactions, rates)
    clean = join_tables(spark, directory / "delta" / "join")
    assert all(clean.values()), {name: len(rows) for name, rows in clean.items()}
    return transactions, rates, clean


@pytest.mark.slow  # a killed driver process each, then the job: ~30-40 s each
@pytest.mark.parametrize("fault", ["after_plan:0", "during_tasks:1", "after_outputs:0",
                                   "after_commit:0"])  # fmt: skip
@pytest.mark.child_process
def test_the_join_job_killed_at_any_step_resumes_to_the_clean_output(
    spark, kafka_settings, join_clean, tmp_path, fault
):
    transactions, rates, clean = join_clean
    config = job_config(kafka_settings, tmp_path, "join", transactions) | JOIN_SETTINGS
    script = JOIN_CRASHING_RUN.format(tests=TESTS, config=config, transactions=transactions,
                                      rates=rates)  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=os.environ | {"STREAMPLATFORM_FAULT": fault},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    code, output = _finish(child)
    assert code == -signal.SIGKILL, output[-3000:]
    step, batch = fault.split(":")
    results = _run_join(spark, config, transactions, rates)
    assert results[0].batch_id == int(batch) + (step == "after_commit")
    assert results[0].replayed == (step != "after_commit")
    assert join_tables(spark, tmp_path / "delta" / "join") == clean
