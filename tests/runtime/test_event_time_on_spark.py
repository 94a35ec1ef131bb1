"""Event time on Spark is Kafka Streams' event time (docs/semantics.md, "Event time across
partitions and batches"): the two reproductions of what Spark used to get wrong, each on a
real broker, against the test driver fed the records in the order they arrived.

1. A windowed count after ``group_by``: the repartitioned records of two source partitions
   reach the downstream task merged by timestamp, not one upstream task after another.
2. A stream-stream join of two topics under a batch cap: a task stops where one topic's
   planned range ends, so the other topic does not run ahead of it in event time.
"""

from __future__ import annotations

import json
import random
import uuid

import pytest
from pyspark import cloudpickle

from streamplatform import TopologyTestDriver
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from . import event_time_jobs
from .event_time_jobs import (
    clicks_after_impressions,
    cogrouped_balances,
    orders_at_their_rate,
    orders_with_customers,
    orders_with_product_names,
    pages_per_minute,
    rate_limited_views,
    views_joined_with_buys,
    views_per_sliding_window,
)
from .support import job_config, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark]
cloudpickle.register_pickle_by_value(event_time_jobs)  # see test_users_own_job.py
MINUTE = 60_000
NOON = 1_767_268_800_000  # 2026-01-01T12:00Z


def _topics(kafka_settings, **partitions):
    names = {name: f"{name}-{uuid.uuid4().hex[:8]}" for name in partitions}
    specs = [TopicSpec(names[n], p) for n, p in partitions.items()]
    create_topics(kafka_settings, specs + [TopicSpec(f"{t}-dlq", 1) for t in names.values()])
    return names


def _produce(kafka_settings, records):
    """``records``: (topic, partition, key, value, timestamp), produced in this order."""
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    for topic, partition, key, value, timestamp in records:
        writer.produce(topic, key=key.encode(), value=json.dumps(value).encode(),
                       partition=partition, timestamp=timestamp)  # fmt: skip
    assert writer.flush(60) == 0


def _through_the_test_driver(topology, records, sink, value_serde, **config):
    """The records piped in arrival order: the reference (``config``: more settings)."""
    with TopologyTestDriver(topology, {"application.id": "reference", **config},
                            repartition_partitions=2) as driver:  # fmt: skip
        inputs = {}
        for topic, partition, key, value, timestamp in records:
            if topic not in inputs:
                inputs[topic] = driver.create_input_topic(topic, Serdes.string(), Serdes.json())
            inputs[topic].pipe_input(key, value, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic(sink, Serdes.bytes(), value_serde)
        return out.read_records_to_list()


def _run_to_the_end(job) -> list:
    """``job`` run until caught up, then closed, however the run ends: its batches' results."""
    try:
        return job.run_until_caught_up()
    finally:
        job.close()


def _assert_counts_as_the_test_driver(kafka_settings, topic: str, want) -> None:
    """The counts in ``topic`` (8-byte big-endian longs) are the test driver's ``want``."""
    got = read_topic(kafka_settings, topic)
    assert sorted((r.key, r.value) for r in got) == sorted(
        (r.key, r.value.to_bytes(8, "big", signed=True)) for r in want
    )


@pytest.mark.parametrize(
    ("cap", "path"),
    [(100_000, "direct-stages-driver"), (1, "direct-stages-driver"), (100_000, "stages"),
     pytest.param(1, "stages", marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_rekeyed_windowed_count_counts_what_the_test_driver_counts(
    spark, kafka_settings, tmp_path, cap, path
):
    """``a@12:00`` (p0), ``b@12:01`` (p1), ``a@12:05`` (p0), ``b@12:06`` (p1), then a record
    per partition at 12:30 that closes every window: four windows of one click each, and
    nothing dropped as late. Before, the downstream task took partition 0's records first and
    dropped 12:01. With a cap of one record per task the upstream tasks' cuts hold the merge
    back, and what they hold waits in the repartition buffer."""
    topics = _topics(kafka_settings, clicks=2, out=1)
    records = [
        (topics["clicks"], 0, "u1", {"page": "a"}, NOON),
        (topics["clicks"], 1, "u2", {"page": "b"}, NOON + 1 * MINUTE),
        (topics["clicks"], 0, "u1", {"page": "a"}, NOON + 5 * MINUTE),
        (topics["clicks"], 1, "u2", {"page": "b"}, NOON + 6 * MINUTE),
        (topics["clicks"], 0, "u1", {"page": "z"}, NOON + 30 * MINUTE),
        (topics["clicks"], 1, "u2", {"page": "z"}, NOON + 30 * MINUTE),
    ]
    _produce(kafka_settings, records)
    topology = pages_per_minute(topics["clicks"], topics["out"])
    want = _through_the_test_driver(topology, records, topics["out"], Serdes.long())
    assert len(want) == 4  # the reference itself: four windows

    app = f"pages-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["clicks"],
                        **{"platform.max.records.per.batch": cap})  # fmt: skip
    if path == "stages":  # Spark's shuffle between the stages, not the driver's hand-off
        config["platform.sink.driver.max.records"] = 0
    job = StreamingJob(pages_per_minute(topics["clicks"], topics["out"]), config, spark=spark)
    results = _run_to_the_end(job)
    _assert_counts_as_the_test_driver(kafka_settings, topics["out"], want)
    assert sum(r.metrics.get("dropped_records", 0) for r in results) == 0
    assert {r.path for r in results} == {path}
    if cap == 1:
        assert len(results) >= 3  # cut batch after batch
        assert results[-1].metrics.get("repartition_buffered", 0) == 0


@pytest.mark.parametrize("cap", [7, pytest.param(100_000, marks=pytest.mark.slow)])
def test_a_sliding_count_on_window_close_counts_what_the_test_driver_counts(
    spark, kafka_settings, tmp_path, cap
):
    """A user's sliding count on window close, run by Spark's workers (its topology pickled,
    its count's windows kept in memory until each commit): three users' views, several per
    user in every batch, 40 s to 4 min apart across two partitions in time order, then a view
    per partition that closes every window. With a cap of 7 records a partition each batch
    commits windows still open, which the next batch updates, emits and expires."""
    topics = _topics(kafka_settings, views=2, out=1)
    rng = random.Random(7)
    records, time = [], NOON
    for _ in range(60):
        time += rng.choice([40_000, 90_000, 150_000, 240_000])
        user = rng.choice(["u1", "u2", "u3"])
        records.append((topics["views"], {"u1": 0, "u2": 1, "u3": 1}[user], user,
                        {"page": "p"}, time))  # fmt: skip
    for partition, user in ((0, "u1"), (1, "u2")):
        records.append((topics["views"], partition, user, {"page": "p"}, time + 30 * MINUTE))
    _produce(kafka_settings, records)
    topology = views_per_sliding_window(topics["views"], topics["out"])
    want = _through_the_test_driver(topology, records, topics["out"], Serdes.long())
    assert len(want) > 40  # the reference itself: a window or two per view

    app = f"sliding-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["views"],
                        **{"platform.max.records.per.batch": cap})  # fmt: skip
    job = StreamingJob(views_per_sliding_window(topics["views"], topics["out"]), config,
                       spark=spark)  # fmt: skip
    results = _run_to_the_end(job)
    _assert_counts_as_the_test_driver(kafka_settings, topics["out"], want)
    if cap == 7:
        assert len(results) >= 4  # windows committed open, batch after batch


# make test keeps a cap of 1 (cut after every record) and no cap; 2 is make test-all's
@pytest.mark.parametrize("cap", [pytest.param(2, marks=pytest.mark.slow), 1, 100_000])
def test_a_join_of_a_dense_and_a_sparse_topic_pairs_what_the_test_driver_pairs(
    spark, kafka_settings, tmp_path, cap
):
    """``i1@12:00, c1@12:00:30, c2@12:00:40, c3@12:00:50, i2@12:19, c4@12:20``, clicks joined
    with the impressions of the 10 minutes before them: ``c1``, ``c2`` and ``c3`` pair with
    ``i1``. Before, a cap of 2 took ``c1, c2`` and both impressions in batch 0, and ``c3``
    came after ``i2`` had moved the join's time past ``i1``'s window."""
    topics = _topics(kafka_settings, impressions=1, clicks=1, out=1)
    i, c = topics["impressions"], topics["clicks"]
    records = [
        (i, 0, "u", {"id": "i1"}, NOON),
        (c, 0, "u", {"id": "c1"}, NOON + 30_000),
        (c, 0, "u", {"id": "c2"}, NOON + 40_000),
        (c, 0, "u", {"id": "c3"}, NOON + 50_000),
        (i, 0, "u", {"id": "i2"}, NOON + 19 * MINUTE),
        (c, 0, "u", {"id": "c4"}, NOON + 20 * MINUTE),
    ]
    _produce(kafka_settings, records)
    want = _through_the_test_driver(clicks_after_impressions(i, c, topics["out"]), records,
                                    topics["out"], Serdes.json())  # fmt: skip
    pairs = sorted((r.value["click"], r.value["impression"]) for r in want)
    assert pairs == [("c1", "i1"), ("c2", "i1"), ("c3", "i1"), ("c4", "i2")]

    app = f"clicks-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, c,
                        **{"platform.max.records.per.batch": cap})  # fmt: skip
    job = StreamingJob(clicks_after_impressions(i, c, topics["out"]), config, spark=spark)
    results = _run_to_the_end(job)
    got = sorted(
        (json.loads(r.value)["click"], json.loads(r.value)["impression"])
        for r in read_topic(kafka_settings, topics["out"])
    )
    assert got == pairs
    assert all(r.records_in <= cap for r in results)  # the cap is per task: one task here


# A cap of 2 (~14 s) in the full run only; the fast tier cuts this join at random caps, one
# record included, through the runtime's task code without Spark (test_event_time_cuts.py).
@pytest.mark.parametrize("cap", [pytest.param(2, marks=pytest.mark.slow), 100_000])
def test_a_join_of_two_rekeyed_streams_pairs_what_the_test_driver_pairs(
    spark, kafka_settings, tmp_path, cap
):
    """Views and buys keyed by user on two partitions each, both re-keyed by page and joined:
    three sub-topologies, the last reading what the first two wrote, merged by timestamp."""
    import random

    topics = _topics(kafka_settings, views=2, buys=2, out=1)
    rng = random.Random(3)
    records, time = [], NOON
    for n in range(40):
        time += rng.choice([1_000, 4_000, 9_000])
        topic = rng.choice(["views", "buys"])
        user = rng.randrange(4)
        records.append((topics[topic], user % 2, f"u{user}", {"page": rng.choice("ab"), "n": n},
                        time))  # fmt: skip
    _produce(kafka_settings, records)
    make = lambda: views_joined_with_buys(topics["views"], topics["buys"], topics["out"])  # noqa: E731
    want = _through_the_test_driver(make(), records, topics["out"], Serdes.json())
    pairs = sorted((r.value["view"], r.value["buy"]) for r in want)
    assert pairs, "nothing joined: the test would prove nothing"

    app = f"viewbuy-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["views"],
                        **{"platform.max.records.per.batch": cap})  # fmt: skip
    job = StreamingJob(make(), config, spark=spark)
    results = _run_to_the_end(job)
    assert {r.path for r in results} == {"direct-stages-driver"}
    got = sorted((json.loads(r.value)["view"], json.loads(r.value)["buy"])
                 for r in read_topic(kafka_settings, topics["out"]))  # fmt: skip
    assert got == pairs


CHILD_RUN = """
import sys
sys.path.insert(0, {tests!r})
from runtime import event_time_jobs
from streamplatform import StreamingJob
topology = getattr(event_time_jobs, {job!r})(*{topics!r})
StreamingJob(topology, {config!r}).run_until_caught_up()
print("finished without crashing")
"""


def _killed_then_run_again(spark, job: str, topics: list[str], config: dict, step: str):
    """Run ``job`` (an event_time_jobs function of ``topics``) in a child driver SIGKILLed at
    ``step`` of batch 3, then again here to the end; the results of the run here."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[1])
    script = CHILD_RUN.format(tests=tests, job=job, topics=topics, config=config)
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        env=os.environ | {"STREAMPLATFORM_FAULT": f"{step}:3", "PYTHONPATH": tests},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = child.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the Spark JVM the killed driver left behind
    assert child.returncode == -signal.SIGKILL, output[-3000:]
    rerun = StreamingJob(getattr(event_time_jobs, job)(*topics), config, spark=spark)
    try:
        results = rerun.run_until_caught_up()
    finally:
        rerun.close()
    assert results[0].batch_id == 3 and results[0].replayed
    return results


@pytest.mark.child_process
@pytest.mark.parametrize("step", ["during_tasks", "after_outputs"])
def test_a_rekeyed_count_killed_mid_batch_with_records_in_its_buffer_replays_exactly(
    spark, kafka_settings, tmp_path, step
):
    """Live clicks on two partitions, a cap of 3 records per task: the downstream tasks hold
    repartitioned records in their buffers from batch to batch. The driver is SIGKILLed in
    batch 3 (inside a task half-way through its records, or after every output before the
    commit); run again, the job's windowed counts in Kafka are the test driver's, once each."""
    import random

    topics = _topics(kafka_settings, clicks=2, out=1)
    rng = random.Random(5)
    records, time = [], NOON
    for n in range(60):
        time += rng.choice([0, 5_000, 20_000, 40_000])
        partition = rng.randrange(2)
        page = rng.choice("abc")
        records.append((topics["clicks"], partition, f"u{partition}", {"page": page, "n": n}, time))
    records.append((topics["clicks"], 0, "u0", {"page": "z", "n": 60}, time + 30 * MINUTE))
    records.append((topics["clicks"], 1, "u1", {"page": "z", "n": 61}, time + 30 * MINUTE))
    _produce(kafka_settings, records)
    want = _through_the_test_driver(pages_per_minute(topics["clicks"], topics["out"]), records,
                                    topics["out"], Serdes.long())  # fmt: skip
    app = f"pages-kill-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["clicks"],
                        **{"platform.max.records.per.batch": 3})  # fmt: skip
    results = _killed_then_run_again(spark, "pages_per_minute", [topics["clicks"], topics["out"]],
                                     config, step)  # fmt: skip
    assert any(r.metrics.get("repartition_buffered", 0) for r in results), (
        "no record ever waited in a buffer: the test would prove nothing"
    )
    _assert_counts_as_the_test_driver(kafka_settings, topics["out"], want)


@pytest.mark.child_process
@pytest.mark.parametrize("step", ["during_tasks", "after_outputs"])
def test_a_join_of_a_dense_and_a_sparse_topic_killed_mid_batch_replays_exactly(
    spark, kafka_settings, tmp_path, step
):
    """Clicks (dense) and impressions (sparse) of three users on two partitions, a cap of 2
    records per task, so each batch stops where a topic's range ends; SIGKILLed in batch 3
    and run again, the pairs in Kafka are the test driver's, once each."""
    import random

    topics = _topics(kafka_settings, impressions=2, clicks=2, out=1)
    i, c = topics["impressions"], topics["clicks"]
    rng = random.Random(9)
    records, time = [], NOON
    for n in range(50):
        time += rng.choice([2_000, 10_000, 30_000])
        user = rng.randrange(3)
        topic = i if rng.random() < 0.25 else c
        records.append((topic, user % 2, f"u{user}", {"id": f"{topic[0]}{n}"}, time))
    _produce(kafka_settings, records)
    want = _through_the_test_driver(clicks_after_impressions(i, c, topics["out"]), records,
                                    topics["out"], Serdes.json())  # fmt: skip
    pairs = sorted((r.value["click"], r.value["impression"]) for r in want)
    assert pairs, "nothing joined: the test would prove nothing"
    app = f"clicks-kill-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, c,
                        **{"platform.max.records.per.batch": 2})  # fmt: skip
    _killed_then_run_again(spark, "clicks_after_impressions", [i, c, topics["out"]], config,
                           step)  # fmt: skip
    got = sorted(
        (json.loads(r.value)["click"], json.loads(r.value)["impression"])
        for r in read_topic(kafka_settings, topics["out"])
    )
    assert got == pairs


@pytest.mark.child_process
@pytest.mark.parametrize("step", ["during_tasks", "after_outputs"])
def test_a_cogrouped_aggregate_killed_mid_batch_replays_exactly(
    spark, kafka_settings, tmp_path, step
):
    """Orders re-keyed to their customer and refunds by customer, cogrouped into balances on
    two partitions, a cap of 3 records per task; SIGKILLed in batch 3 and run again, each
    customer's last balance in Kafka is the test driver's: no order or refund counted twice
    or lost."""
    import random

    topics = _topics(kafka_settings, orders=2, refunds=2, out=1)
    rng = random.Random(13)
    records, time = [], NOON
    for n in range(60):
        time += rng.choice([1_000, 5_000])
        customer = f"c{rng.randrange(4)}"
        if rng.random() < 0.7:
            records.append(
                (
                    topics["orders"],
                    rng.randrange(2),
                    f"o{n}",
                    {"customer": customer, "amount": rng.randrange(1, 50)},
                    time,
                )
            )
        else:
            records.append((topics["refunds"], rng.randrange(2), customer,
                            {"amount": rng.randrange(1, 10)}, time))  # fmt: skip
    _produce(kafka_settings, records)
    want = _through_the_test_driver(
        cogrouped_balances(topics["orders"], topics["refunds"], topics["out"]), records,
        topics["out"], Serdes.long(),
    )  # fmt: skip
    app = f"balances-kill-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["orders"],
                        **{"platform.max.records.per.batch": 3})  # fmt: skip
    _killed_then_run_again(
        spark,
        "cogrouped_balances",
        [topics["orders"], topics["refunds"], topics["out"]],
        config,
        step,
    )
    last = {r.key: r.value for r in want}
    got = {r.key: int.from_bytes(r.value, "big", signed=True)
           for r in read_topic(kafka_settings, topics["out"])}  # fmt: skip
    assert got == last and len(last) == 4


@pytest.mark.child_process
def test_a_global_table_join_killed_mid_batch_replays_exactly(spark, kafka_settings, tmp_path):
    """Orders on two partitions joined with a products global table of three partitions, a
    cap of 3 records per task; SIGKILLed in batch 3 in a task and run again (every task's copy
    of the table caught up again to the batch's logged ends): each order joined once."""
    topics = _topics(kafka_settings, orders=2, products=3, out=1)
    records = [(topics["products"], n % 3, f"p{n}", {"name": f"product {n}"}, NOON + n)
               for n in range(6)]  # fmt: skip
    records += [(topics["orders"], n % 2, f"c{n % 5}", {"id": n, "product": f"p{n % 7}"},
                 NOON + 1_000 * n) for n in range(30)]  # fmt: skip
    _produce(kafka_settings, records)
    want = _through_the_test_driver(
        orders_with_product_names(topics["orders"], topics["products"], topics["out"]),
        records, topics["out"], Serdes.json(),
    )  # fmt: skip
    app = f"catalog-kill-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["orders"],
                        **{"platform.max.records.per.batch": 3})  # fmt: skip
    _killed_then_run_again(spark, "orders_with_product_names",
                           [topics["orders"], topics["products"], topics["out"]], config,
                           "during_tasks")  # fmt: skip
    got = sorted(json.loads(r.value)["order"] for r in read_topic(kafka_settings, topics["out"]))
    assert got == sorted(r.value["order"] for r in want)
    assert len(got) == 26  # the 4 orders of p6, which is not in the catalog, drop


@pytest.mark.child_process
def test_a_foreign_key_join_killed_mid_batch_ends_as_the_test_driver(
    spark, kafka_settings, tmp_path
):
    """Orders (two partitions) joined with their customers (three) on a foreign key, a cap of
    3 records per task, customers renamed on the way; SIGKILLed in a task of batch 3 and run
    again: every order's last result is the test driver's (its answers, in a Kafka topic of
    the job's own, produced once)."""
    topics = _topics(kafka_settings, orders=2, customers=3, out=1)
    records = [(topics["customers"], 0, f"c{n}", {"name": f"customer {n}"}, NOON + n)
               for n in range(4)]  # fmt: skip
    for n in range(24):
        records.append((topics["orders"], n % 2, f"o{n % 16}",
                        {"id": n, "customer": f"c{n % 5}"}, NOON + 1_000 * n))  # fmt: skip
        if n % 6 == 5:
            records.append((topics["customers"], 0, f"c{n % 4}", {"name": f"renamed {n}"},
                            NOON + 1_000 * n + 1))  # fmt: skip
    # Kafka Streams' co-partitioning: each customer in the partition murmur2 of its key
    # chooses, as the join's subscriptions are.
    from streamplatform.runtime.partitioner import partition_for

    records = [(t, partition_for(k.encode(), 3) if t == topics["customers"] else p, k, v, ts)
               for t, p, k, v, ts in records]  # fmt: skip
    _produce(kafka_settings, records)
    # The reference in one partition per topic, as Kafka Streams' driver has them (the end
    # state of a table join does not depend on the partitions).
    reference = orders_with_customers(topics["orders"], topics["customers"], topics["out"])
    with TopologyTestDriver(reference, {"application.id": "reference"}) as driver:
        inputs = {t: driver.create_input_topic(t, Serdes.string(), Serdes.json())
                  for t in (topics["orders"], topics["customers"])}  # fmt: skip
        for topic, _, key, value, timestamp in records:
            inputs[topic].pipe_input(key, value, timestamp=timestamp)
        want = driver.create_output_topic(topics["out"], Serdes.bytes(),
                                          Serdes.json()).read_records_to_list()  # fmt: skip
    app = f"fk-kill-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["orders"],
                        **{"platform.max.records.per.batch": 3})  # fmt: skip
    _killed_then_run_again(spark, "orders_with_customers",
                           [topics["orders"], topics["customers"], topics["out"]], config,
                           "during_tasks")  # fmt: skip
    last = {r.key.decode(): r.value for r in want}
    got = {r.key.decode(): None if r.value is None else json.loads(r.value)
           for r in read_topic(kafka_settings, topics["out"])}  # fmt: skip
    assert got == last and sum(v is not None for v in last.values()) >= 10


@pytest.mark.slow  # ~30 s for the three caps
@pytest.mark.parametrize("cap", [1, 4, 100_000])
def test_rate_limited_updates_are_the_test_drivers_at_any_batch_cap(
    spark, kafka_settings, tmp_path, cap
):
    """A count per page suppressed until a 10-second time limit (at most one update per page
    per 10 s of stream time, the latest), views on two partitions interleaved in time: the
    same updates, values and timestamps as the test driver's, whatever the batch cap. The
    record cache off: with it, which updates reach the suppression depends on when the task
    commits, in Kafka Streams as here (a batch is a commit)."""
    no_cache = {"statestore.cache.max.bytes": 0}
    import random

    topics = _topics(kafka_settings, views=2, out=1)
    rng = random.Random(3)
    records = [(topics["views"], n % 2, f"page-{rng.randrange(3)}", {"n": n},
                NOON + 1_500 * n + rng.randrange(1_000)) for n in range(40)]  # fmt: skip
    _produce(kafka_settings, records)
    want = _through_the_test_driver(rate_limited_views(topics["views"], topics["out"]),
                                    records, topics["out"], Serdes.long(), **no_cache)  # fmt: skip
    assert 6 <= len(want) < 40  # some updates held back and replaced
    app = f"rate-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["views"],
                        **{"platform.max.records.per.batch": cap}, **no_cache)  # fmt: skip
    job = StreamingJob(rate_limited_views(topics["views"], topics["out"]), config, spark=spark)
    _run_to_the_end(job)
    got = read_topic(kafka_settings, topics["out"])
    assert sorted((r.key, r.value, r.timestamp) for r in got) == sorted(
        (r.key, r.value.to_bytes(8, "big", signed=True), r.timestamp) for r in want
    )


@pytest.mark.slow  # ~40 s for the three caps; make test keeps the suppressions' fast tests
@pytest.mark.parametrize("cap", [1, 3, 100_000])
def test_a_stream_table_join_with_grace_sees_late_table_updates_as_the_test_driver(
    spark, kafka_settings, tmp_path, cap
):
    """KIP-923 on Spark: orders wait 30 s for late rate updates of the versioned table; with
    any batch cap the pairs in Kafka are the test driver's (one partition each: the grace runs
    on the task's stream time, which the test driver has one of)."""
    import random

    topics = _topics(kafka_settings, orders=1, rates=1, out=1)
    rng = random.Random(21)
    records, time = [], NOON
    for n in range(40):
        time += rng.choice([2_000, 5_000, 10_000])
        if rng.random() < 0.3:  # a rate update, sometimes late by up to 20 s (within grace)
            late = rng.choice([0, 0, 15_000, 20_000])
            records.append((topics["rates"], 0, "eur", {"rate": n}, time - late))
        else:
            records.append((topics["orders"], 0, "eur", {"id": f"o{n}"}, time))
    records.append((topics["orders"], 0, "eur", {"id": "last"}, time + 120_000))  # flushes
    _produce(kafka_settings, records)
    want = _through_the_test_driver(
        orders_at_their_rate(topics["orders"], topics["rates"], topics["out"]), records,
        topics["out"], Serdes.json(),
    )  # fmt: skip
    pairs = [(r.value["order"], r.value["rate"]) for r in want]
    assert len(pairs) > 10
    app = f"grace-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, topics["orders"],
                        **{"platform.max.records.per.batch": cap})  # fmt: skip
    job = StreamingJob(orders_at_their_rate(topics["orders"], topics["rates"], topics["out"]),
                       config, spark=spark)  # fmt: skip
    _run_to_the_end(job)
    got = [(json.loads(r.value)["order"], json.loads(r.value)["rate"])
           for r in read_topic(kafka_settings, topics["out"])]  # fmt: skip
    assert got == pairs
