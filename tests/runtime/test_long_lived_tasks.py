"""Tasks that live across micro-batches on real Spark, a real broker and Delta: punctuations
follow the test driver's schedule, a wall-clock punctuator fires, and a task kept open in a
Python worker gives the same outputs and state as one opened anew every batch, also when a
worker dies between batches or in the middle of one."""

from __future__ import annotations

import os
import shutil
import signal
import uuid

import pytest

from streamplatform import TopologyTestDriver
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes
from streamplatform.state import IsolationLevel, Stores

from .support import ticking_topology

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

PARTITIONS, PER_PARTITION = 3, 40
KEYS = ("a", "b", "c", "d")


@pytest.fixture(scope="module")
def ticks_topic(kafka_settings):
    """40 records per partition, one a second of event time, over four keys."""
    name = f"ticks-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(name, PARTITIONS)])
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    sent = []
    for partition in range(PARTITIONS):
        for i in range(PER_PARTITION):
            key, timestamp = KEYS[(i * (partition + 1)) % len(KEYS)], 1_000_000 + i * 1_000
            writer.produce(name, key=key, value=b"{}", partition=partition, timestamp=timestamp)
            sent.append((partition, key, timestamp))
    assert writer.flush(60) == 0
    return name, sent


def _expected(source: str, sent, interval_ms: int = 10_000) -> list[str]:
    """The stream-time punctuations' records through the TopologyTestDriver."""
    topology = ticking_topology(source, "out", interval_ms)
    with TopologyTestDriver(topology, {"application.id": "e"}) as driver:
        topic = driver.create_input_topic(source, Serdes.string(), Serdes.json())
        for partition, key, timestamp in sent:
            topic.pipe_input(key, {}, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic("out", Serdes.string(), Serdes.string())
        return sorted(value for key, value in out.read_key_values_to_list() if key == "stream")


def _run(spark, kafka_settings, tmp_path, source, app, topology=None, **settings):
    config = {
        "application.id": app,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(tmp_path / app / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        "platform.max.records.per.batch": 10,  # four batches per partition
        # Tasks kept in Spark's Python workers are the subject: never in the driver.
        "platform.driver.tasks.max.records": 0,
        "platform.driver.tasks.beside.spark": 0,
    } | settings
    return StreamingJob(topology or ticking_topology(source, "ticks"), config, spark=spark,
                        delta_sinks=["ticks"])  # fmt: skip


def _outputs(spark, tmp_path, app) -> tuple[list[str], int]:
    """The stream punctuations' values and the number of wall-clock records in the sink."""
    rows = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/ticks").collect()
    stream = sorted(r.value.decode() for r in rows if r.key == b"stream")
    return stream, sum(1 for r in rows if r.key == b"wall")


def _state(tmp_path, app) -> dict[int, dict[str, int]]:
    """Each task's counts after the job's last batch (the workers keeping the tasks open let
    go of them). That batch is committed: its prepared writes are settled as such."""
    counts = {}
    for partition in range(PARTITIONS):
        directory = tmp_path / app / "state" / app / f"0_{partition}"
        with Stores.persistent_key_value_store("counts").open(
            directory, IsolationLevel.READ_COMMITTED
        ) as store:
            if store.prepared_batch_id is not None:
                store.settle(store.prepared_batch_id, committed=True)
            counts[partition] = {k.decode(): int(v) for k, v in store.range()}
    return counts


def _counts(sent) -> dict[int, dict[str, int]]:
    counts: dict[int, dict[str, int]] = {p: {} for p in range(PARTITIONS)}
    for partition, key, _ in sent:
        counts[partition][key] = counts[partition].get(key, 0) + 1
    return counts


def test_kept_and_reopened_tasks_punctuate_as_the_test_driver(
    spark, kafka_settings, ticks_topic, tmp_path
):
    """The stream-time punctuations on Spark, over four batches per task, are the test
    driver's, with tasks kept open between batches, with tasks opened anew each batch, and
    with tasks run and kept in the driver; the wall-clock punctuator fires on Spark and in
    the driver. (Whether Spark gives a task's next batch to the
    worker keeping it is Spark's choice; test_task_cache.py compares kept and reopened tasks
    where it is certain.)"""
    source, sent = ticks_topic
    expected = _expected(source, sent)
    assert len(expected) == PARTITIONS * 4  # at the first record, then at each 10 s mark
    for app, idle_ms, driver_tasks in ((f"kept-{uuid.uuid4().hex[:6]}", 60_000, 0),
                                       (f"fresh-{uuid.uuid4().hex[:6]}", 0, 0),
                                       (f"driver-{uuid.uuid4().hex[:6]}", 60_000, 1_000)):  # fmt: skip
        job = _run(spark, kafka_settings, tmp_path, source, app, **{
            "platform.task.cache.idle.ms": idle_ms,
            "platform.driver.tasks.max.records": driver_tasks,  # 1,000: tasks in the driver
        })  # fmt: skip
        results = job.run_until_caught_up()
        job.close()  # the driver's kept tasks let go of their stores (_state opens them)
        assert len(results) == 4
        if idle_ms == 0:
            assert sum(r.metrics.get("tasks_reused", 0) for r in results) == 0
        assert all(r.metrics["tasks_in_driver"] == (3 if driver_tasks else 0) for r in results)
        if driver_tasks:  # kept for certain: every batch after the first
            assert sum(r.metrics.get("tasks_reused", 0) for r in results) == 3 * PARTITIONS
        stream, walls = _outputs(spark, tmp_path, app)
        assert stream == expected  # before: the first record of every batch fired it too
        # Once when each task's batch begins, at the batch's planned wall-clock time, but the
        # first: it is due one interval (1 ms) after the task opened, at that same time.
        assert walls == 3 * PARTITIONS
        assert _state(tmp_path, app) == _counts(sent)


def test_tasks_restored_from_the_changelog_keep_their_stream_time_and_schedule(
    spark, kafka_settings, ticks_topic, tmp_path
):
    """The job's state dir is wiped after each batch, so every later batch restores every
    task from the changelog, as an executor that never ran the task does: the stream-time
    punctuations are still the test driver's, and the wall-clock ones fire as a kept task's. (When a task's stream time and schedule were
    only in its local stores, a restored task fired again at its batch's first record.) The
    interval, 15 s, is not one of a batch's 10 s: a batch's first record is not due."""
    source, sent = ticks_topic
    app = f"restored-{uuid.uuid4().hex[:6]}"
    topology = ticking_topology(source, "ticks", 15_000)
    job = _run(spark, kafka_settings, tmp_path, source, app, topology,
               **{"platform.task.cache.idle.ms": 0})  # fmt: skip
    restored = 0
    for _ in range(4):
        (result,) = job.run(max_batches=1)
        restored += result.metrics.get("tasks_restored", 0)
        shutil.rmtree(tmp_path / app / "state")
    job.close()
    assert restored == 3 * PARTITIONS  # batches 1-3 each restored the three tasks
    stream, walls = _outputs(spark, tmp_path, app)
    expected = _expected(source, sent, 15_000)
    assert len(expected) == PARTITIONS * 4  # at the first record, then at 5, 20 and 35 s
    assert stream == expected
    # The wall-clock schedule came back from the changelog too: without it a restored task
    # would schedule anew, one interval after its batch's time, and never fire.
    assert walls == 3 * PARTITIONS


def test_a_worker_killed_between_batches_or_during_one_loses_nothing(
    spark, kafka_settings, ticks_topic, tmp_path
):
    """Batch by batch: after batch 1 the worker keeping task 0_0 is SIGKILLed; in batch 2 a
    worker dies half-way through task 0_2, the last one Spark starts, so the batch fails
    after other tasks finished it and were kept; the replay must not take those as current
    (it fails with the kept tasks taken: their state holds batch 2 twice). Outputs and state
    equal the test driver's."""
    source, sent = ticks_topic
    app = f"killed-{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "killed-once"
    dies = ticking_topology(source, "ticks", kill_marker=str(marker), kill_at=(2, 25))
    job = _run(spark, kafka_settings, tmp_path, source, app, topology=dies)
    job.run(max_batches=2)
    holder = tmp_path / app / "state" / app / "0_0" / "counts" / "streamplatform.pid"
    assert holder.exists(), "task 0_0 was not kept open after its batch"
    pid = int(holder.read_text().split()[0])
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Exception, match=r"(?i)python worker|crash|exited|EOF|lost"):
        job.run(max_batches=1)  # batch 2: the worker running 0_2 dies at offset 25
    assert marker.exists()
    results = job.run_until_caught_up()
    assert [r.batch_id for r in results] == [2, 3]
    assert results[0].replayed
    stream, walls = _outputs(spark, tmp_path, app)
    assert stream == _expected(source, sent)
    assert walls > 0
    assert _state(tmp_path, app) == _counts(sent)
