"""A table's current state as a Delta table (state_tables.py): one row per key (per key and
window), kept by one MERGE per batch, exactly once across crashes; equal to the test driver's
final state of the table."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pyarrow as pa
import pytest

from streamplatform import EmitStrategy, StreamsBuilder, TimeWindows, TopologyTestDriver
from streamplatform.config import ConfigError
from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime import delta_direct, state_tables
from streamplatform.runtime.state_tables import StateTable, merge_batch
from streamplatform.serdes import Serdes

from .support import PARTITIONS, job_config, make_views, read_topic, through_the_test_driver

TESTS = os.path.dirname(os.path.dirname(__file__))


def views_and_spend_topology(source: str, counts: str, spend: str):
    """Views per user per 10 s window (final counts, on window close) into ``counts``; each
    user's total spend when it is not a multiple of 3 (a filtered table: a tombstone when it
    is) into ``spend``."""
    b = StreamsBuilder()
    views = b.stream(source, Serdes.string(), Serdes.json())
    by_user = views.group_by_key()
    by_user.windowed_by(TimeWindows.of_size_and_grace(10_000, 5_000)).emit_strategy(
        EmitStrategy.on_window_close()).count().to_stream().to(counts)  # fmt: skip
    by_user.aggregate(lambda: 0, lambda user, view, total: total + view["spend"],
                      Serdes.long()).filter(lambda user, total: total % 3 != 0
                                            ).to_stream().to(spend)  # fmt: skip
    return b.build()


def final_state(topology, source, sink, sent) -> dict:
    """The sink's table after every record through the test driver: key -> (value, time)."""
    table = StateTable.of(topology, sink)
    with TopologyTestDriver(topology, {"application.id": "expected"}) as driver:
        topic = driver.create_input_topic(source, Serdes.string(), Serdes.bytes())
        for partition, key, value, timestamp in sent:
            topic.pipe_raw(key.encode(), value, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic(sink, Serdes.bytes(), Serdes.bytes())
        state: dict = {}
        for record in out.read_records_to_list():
            state[record.key] = (record.value, record.timestamp)
    rows = {}
    for raw_key, (raw_value, timestamp) in state.items():
        if raw_value is None:
            continue
        key = table.key_serde.deserialize(raw_key)
        value = table.value_serde.deserialize(raw_value)
        if table.windowed:
            rows[(key.key, key.window.start, key.window.end)] = (value, timestamp)
        else:
            rows[(key,)] = (value, timestamp)
    return rows


def state_rows(root: str, topic: str) -> dict:
    rows = delta_direct.read(state_tables.state_table_path(root, topic)).to_pylist()
    out = {}
    for row in rows:
        if "window_start" in row:
            key = (row["key"], round(row["window_start"].timestamp() * 1000),
                   round(row["window_end"].timestamp() * 1000))  # fmt: skip
        else:
            key = (row["key"],)
        assert key not in out, f"{key} twice in the state table"
        out[key] = (row["value"], round(row["timestamp"].timestamp() * 1000))
    return out


# Pure logic: the rows a batch's updates make, and a MERGE made once per batch. ---------------


def _updates(rows) -> pa.Table:
    keys, values, offsets = zip(*rows, strict=True)
    return pa.table({
        "key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
        "timestamp": pa.array([1_000 + o for o in offsets], pa.int64()),
        "headers": pa.array([None] * len(rows), pa.string()),
        "source_topic": pa.array(["in"] * len(rows)),
        "source_partition": pa.array([0] * len(rows), pa.int32()),
        "source_offset": pa.array(offsets, pa.int64()),
    })  # fmt: skip


def test_a_batch_sets_each_keys_last_update_and_a_tombstone_deletes_it_once(tmp_path):
    root = str(tmp_path / "app")
    table = StateTable("totals", Serdes.string(), Serdes.long())
    long = Serdes.long().serialize
    batch0 = _updates([(b"a", long(1), 0), (b"b", long(5), 1), (b"a", long(3), 2)])
    delta_direct.append(f"{root}/totals", batch0.append_column("batch_id", pa.array([0] * 3)),
                        "app-sink-totals", 0)  # fmt: skip
    assert merge_batch(root, "app", table, 0) == 2
    assert state_rows(root, "totals") == {("a",): (3, 1_002), ("b",): (5, 1_001)}
    # Batch 1: b deleted (a tombstone), then c; a's later offset wins over its earlier one
    # although it comes first in the table.
    batch1 = _updates([(b"a", long(9), 7), (b"b", None, 4), (b"c", long(2), 5), (b"a", long(4), 6)])
    delta_direct.append(f"{root}/totals", batch1.append_column("batch_id", pa.array([1] * 4)),
                        "app-sink-totals", 1)  # fmt: skip
    assert merge_batch(root, "app", table, 1) == 3
    assert merge_batch(root, "app", table, 1) == 0  # the batch run again: merged before
    assert merge_batch(root, "app", table, 0) == 0
    assert state_rows(root, "totals") == {("a",): (9, 1_007), ("c",): (2, 1_005)}


def test_a_state_table_of_a_topic_the_job_does_not_write_is_refused_at_start():
    topology = views_and_spend_topology("views", "counts", "spend")
    with pytest.raises(ConfigError, match="delta_state_tables: 'nope' is not a sink topic"):
        StateTable.of(topology, "nope")
    assert StateTable.of(topology, "counts").windowed
    assert StateTable.of(topology, "counts").schema.names == [
        "key", "window_start", "window_end", "value", "timestamp", "batch_id"]  # fmt: skip


# On Spark ------------------------------------------------------------------------------------


def _topics(kafka_settings, app):
    source, counts, spend = f"{app}-views", f"{app}-counts", f"{app}-spend"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS)])
    sent = make_views(kafka_settings, source, 450)
    return source, counts, spend, sent


def _config(kafka_settings, tmp_path, app, source):
    return job_config(kafka_settings, tmp_path, app, source) | {
        "platform.max.records.per.batch": 50,  # per partition: 3 batches
        "errors.dead.letter.queue.topic.name": None,
    }


def _check(tmp_path, app, source, counts, spend, sent):
    root = str(tmp_path / "delta" / app)
    for sink in (counts, spend):
        topology = views_and_spend_topology(source, counts, spend)
        expected = final_state(topology, source, sink, sent)
        assert len(expected) > (5 if sink == counts else 0)
        assert state_rows(root, sink) == expected


@pytest.mark.broker
@pytest.mark.spark
def test_a_windowed_count_and_a_filtered_total_are_delta_tables_of_their_state(
    spark, kafka_settings, tmp_path
):
    from streamplatform.runtime.microbatch import StreamingJob

    app = f"state-{uuid.uuid4().hex[:6]}"
    source, counts, spend, sent = _topics(kafka_settings, app)
    job = StreamingJob(views_and_spend_topology(source, counts, spend),
                       _config(kafka_settings, tmp_path, app, source), spark=spark,
                       delta_state_tables=[counts, spend])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()
    assert len(results) >= 3
    assert all(r.metrics["state_table_rows_merged"] > 0 for r in results)
    _check(tmp_path, app, source, counts, spend, sent)
    # Every update is in the sink's own table too (a Delta sink): more rows than keys.
    updates = delta_direct.read(str(tmp_path / "delta" / app / spend))
    assert updates.num_rows > len(state_rows(str(tmp_path / "delta" / app), spend))
    assert updates["value"].null_count > 0  # the tombstones
    # Forwarded at the commit by the record cache, each update still names the view that
    # made it (Kafka Streams' cache keeps each entry's record context).
    assert min(updates["source_offset"].to_pylist()) >= 0


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from runtime.test_state_tables import views_and_spend_topology
    from streamplatform.runtime.microbatch import StreamingJob
    StreamingJob(views_and_spend_topology(*{args!r}), {config!r},
                 delta_state_tables={tables!r}).run_until_caught_up()
    print("finished without crashing")
""")


@pytest.mark.slow  # ~40 s: a child driver killed, then the rest in this process
@pytest.mark.parametrize("step", ["after_outputs", "after_state_merge"])
@pytest.mark.child_process
@pytest.mark.broker
@pytest.mark.spark
def test_a_job_killed_before_or_after_its_merge_keeps_each_update_once(
    spark, kafka_settings, tmp_path, step
):
    """Killed in batch 1 with its updates appended but not merged, or merged but the batch
    not committed: the batch runs again, merges once, and the state tables end as the
    test driver's."""
    from streamplatform.runtime.microbatch import StreamingJob

    app = f"state-{step.replace('_', '-')}-{uuid.uuid4().hex[:4]}"
    source, counts, spend, sent = _topics(kafka_settings, app)
    config = _config(kafka_settings, tmp_path, app, source)
    script = CHILD.format(tests=TESTS, args=(source, counts, spend), config=config,
                          tables=[counts, spend])  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=os.environ | {"STREAMPLATFORM_FAULT": f"{step}:1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = child.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the Spark JVM a killed driver left behind
        child.wait(60)
    assert child.returncode == -signal.SIGKILL, output[-3000:]
    root = str(tmp_path / "delta" / app)
    merged_before = delta_direct.transaction_version(
        state_tables.state_table_path(root, spend), f"{app}-state-{spend}"
    )
    assert merged_before == (1 if step == "after_state_merge" else 0)

    job = StreamingJob(views_and_spend_topology(source, counts, spend), config, spark=spark,
                       delta_state_tables=[counts, spend])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == 1 and results[0].replayed
    merged_again = results[0].metrics["state_table_rows_merged"]
    assert (merged_again == 0) == (step == "after_state_merge")
    _check(tmp_path, app, source, counts, spend, sent)
    # And the sink tables hold each batch's updates once: a key's one update per batch (the
    # record cache forwards each key once at the commit), in every batch.
    updates = delta_direct.read(str(tmp_path / "delta" / app / spend)).to_pylist()
    assert {u["batch_id"] for u in updates} == {r.batch_id for r in results} | {0}
    assert len({(u["batch_id"], u["key"]) for u in updates}) == len(updates)


@pytest.mark.slow  # ~1 min a seed: a clean run, a killed child, its restart
@pytest.mark.parametrize("seed", [3, 8])
@pytest.mark.child_process
@pytest.mark.broker
@pytest.mark.spark
def test_a_job_killed_at_a_random_moment_keeps_windows_and_state_exactly_once(
    spark, kafka_settings, tmp_path, seed
):
    """The windowed count on window close into Kafka and the filtered total as a Delta state
    table, SIGKILLed at a random moment of its run, then restarted: each window's final count
    once for read_committed readers, the state table equal to the test driver's."""
    import random
    import time

    from streamplatform.runtime.microbatch import StreamingJob

    app = f"state-random-{seed}-{uuid.uuid4().hex[:4]}"
    source, counts, spend, sent = _topics(kafka_settings, app)
    create_topics(kafka_settings, [TopicSpec(t, PARTITIONS) for t in (counts, f"{counts}-clean")])
    config = _config(kafka_settings, tmp_path, app, source)
    # A clean run first, of its own (application, topics), to time it: the kill lands in it.
    clean = StreamingJob(views_and_spend_topology(source, f"{counts}-clean", f"{spend}-clean"),
                         config | {"application.id": f"{app}-clean",
                                   "state.dir": str(tmp_path / "clean-state")},
                         spark=spark, delta_state_tables=[f"{spend}-clean"])  # fmt: skip
    started = time.monotonic()
    clean.run_until_caught_up()
    clean.close()
    run_s = time.monotonic() - started

    script = CHILD.format(tests=TESTS, args=(source, counts, spend), config=config,
                          tables=[spend])  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    delay = random.Random(seed).uniform(0.05, 0.95) * run_s
    try:
        planned = tmp_path / "delta" / app / "_offsets" / "_delta_log"
        deadline = time.monotonic() + 240
        while not planned.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(delay)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(60)

    job = StreamingJob(views_and_spend_topology(source, counts, spend), config, spark=spark,
                       delta_state_tables=[spend])  # fmt: skip
    job.run_until_caught_up()
    job.close()
    topology = views_and_spend_topology(source, counts, spend)
    windowed = StateTable.of(topology, counts).key_serde
    got = [(windowed.deserialize(r.key), Serdes.long().deserialize(r.value), r.timestamp)
           for r in read_topic(kafka_settings, counts)]  # fmt: skip
    expected = through_the_test_driver(topology, source, counts, sent, windowed, Serdes.long())
    what = f"killed {delay:.1f} s after the first plan"
    assert len({key for key, _, _ in got}) == len(got), what  # each window once
    assert sorted(got, key=repr) == sorted(expected, key=repr), what
    root = str(tmp_path / "delta" / app)
    assert state_rows(root, spend) == final_state(topology, source, spend, sent), what
