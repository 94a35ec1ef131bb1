"""Kafka Streams itself is the reference for event time on Spark (docs/semantics.md, "Event
time across partitions and batches"): live traffic — records arriving in event-time order
across partitions and topics, a few out of order within the grace period and a few far too
late — through Kafka Streams' TopologyTestDriver in arrival order (EventTimeReference.java)
and through the same job on Spark with a real broker, under batch caps that cut every task
many times and with none, on the driver's and on Spark's executors' side. The outputs must be
the same records.

- ``pages``: a windowed count after ``group_by``: the repartitioned records of three source
  partitions reach the downstream tasks merged by timestamp, and what a cut upstream task
  holds back waits in the downstream task's repartition buffer.
- ``join``: a stream-stream join of a dense topic (clicks) with a sparse one (impressions):
  a task stops where one topic's planned range ends, so the other does not run ahead.
"""

from __future__ import annotations

import json
import random
import uuid

import pytest
from pyspark import cloudpickle
from runtime import event_time_jobs
from runtime.event_time_jobs import clicks_after_impressions, pages_per_minute
from runtime.support import job_config, read_topic

from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob

from .kafka_streams import run_reference

pytestmark = [pytest.mark.broker, pytest.mark.spark]
cloudpickle.register_pickle_by_value(event_time_jobs)  # Spark's workers get the jobs by value
NOON = 1_767_268_800_000  # 2026-01-01T12:00Z
MINUTE = 60_000


def live_traffic(seed: int, count: int, topics: dict[str, int], late: bool) -> list[tuple]:
    """``count`` records ``(topic, partition, key, payload, timestamp)`` in arrival order over
    ``topics`` (name -> partitions; a key's partition is its number modulo the count): event
    time rises by 0.5 to 40 s a record; one in ten is up to 30 s out of order (within the
    grace period); with ``late``, one in forty 10 minutes late (past every window's grace)."""
    rng = random.Random(seed)
    records, now = [], NOON
    for n in range(count):
        now += rng.choice([500, 3_000, 11_000, 40_000])
        timestamp = now
        if n > 30 and rng.random() < 0.1:
            timestamp -= rng.randrange(1, 30_000)
        elif late and n > 30 and rng.random() < 0.025:
            timestamp -= 10 * MINUTE
        topic = rng.choice(sorted(topics))
        user = rng.randrange(6)
        records.append((topic, user % topics[topic], f"u{user}", f"{topic[0]}{n}", timestamp))
    return records


def through_kafka_streams(mode: str, records: list[tuple], tmp_path) -> list[tuple]:
    lines = "".join(f"{topic}\t{key}\t{payload}\t{timestamp}\n"
                    for topic, _, key, payload, timestamp in records)  # fmt: skip
    out = run_reference("EventTimeReference.java", mode, lines, tmp_path / "ks")
    return sorted(tuple(line.split("\t")) for line in out)


def through_spark(spark, kafka_settings, tmp_path, mode, records, cap, where) -> list[tuple]:
    """``records`` produced in arrival order to topics of their own, and the job run on Spark
    until caught up: its output as ``(key, value, timestamp)`` text, as Kafka Streams'."""
    names = {topic: f"{topic}-{uuid.uuid4().hex[:8]}" for topic in {r[0] for r in records}}
    partitions = {r[0]: 0 for r in records}
    for topic, partition, *_ in records:
        partitions[topic] = max(partitions[topic], partition + 1)
    out = f"out-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_settings, [TopicSpec(names[t], partitions[t]) for t in names]
                  + [TopicSpec(out, 1), TopicSpec(f"{names['clicks']}-dlq", 1)])  # fmt: skip
    writer = producer(kafka_settings)
    field = "page" if mode == "pages" else "id"
    for topic, partition, key, payload, timestamp in records:
        value = json.dumps({field: payload}).encode()
        writer.produce(names[topic], key=key.encode(), value=value, partition=partition,
                       timestamp=timestamp)  # fmt: skip
    assert writer.flush(60) == 0
    if mode == "pages":
        topology = pages_per_minute(names["clicks"], out)
    else:
        topology = clicks_after_impressions(names["impressions"], names["clicks"], out)
    app = f"{mode}-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, names["clicks"],
                        **{"platform.max.records.per.batch": cap})  # fmt: skip
    if where == "spark":  # the tasks on Spark's executors, not in the driver
        config["platform.driver.tasks.max.records"] = 0
    job = StreamingJob(topology, config, spark=spark)
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert {r.path.rsplit("-", 1)[1] for r in results} == {where}
    if cap < 100:
        assert len(results) > 5, "the cap cut the input into many batches"
    got = []
    for record in read_topic(kafka_settings, out):
        if mode == "pages":
            value = str(int.from_bytes(record.value, "big", signed=True))
        else:
            pair = json.loads(record.value)
            value = f"{pair['click']}|{pair['impression']}"
        got.append((record.key.decode(), value, str(record.timestamp)))
    return sorted(got)


def pages_input() -> list[tuple]:
    """Clicks on three partitions, each on one of five pages (its payload), then a click on
    every page every 30 s for 4 minutes: every window before closes, on every downstream task.
    (Not one jump of the stream time: Kafka Streams' window store drops the windows past its
    retention as the record that jumps is put, before they are emitted, and emits nothing of
    them.)"""
    rng = random.Random(8)
    records = [(topic, partition, key, rng.choice("abcde"), timestamp)
               for topic, partition, key, _, timestamp in live_traffic(7, 160, {"clicks": 3},
                                                                     late=True)]  # fmt: skip
    last = max(r[4] for r in records)
    return records + [("clicks", n % 3, f"u{n}", page, last + step * 30_000)
                      for step in range(1, 9) for n, page in enumerate("abcde")]  # fmt: skip


@pytest.mark.parametrize(
    ("cap", "where"),
    # make test keeps one (~7 s); the capped ones (~13-35 s) are make test-all's, and the fast
    # tier cuts this count at random caps through the tasks (test_event_time_cuts.py)
    [(100_000, "spark"), pytest.param(12, "driver", marks=pytest.mark.slow),
     pytest.param(4, "driver", marks=pytest.mark.slow),
     pytest.param(9, "spark", marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_rekeyed_windowed_count_on_live_traffic_gives_what_kafka_streams_gives(
    spark, kafka_settings, tmp_path, cap, where
):
    records = pages_input()
    want = through_kafka_streams("pages", records, tmp_path)
    assert len(want) > 20, "Kafka Streams counted too few windows for the test to mean much"
    assert sum(int(count) for _, count, _ in want) < len(records), "nothing was late"
    assert through_spark(spark, kafka_settings, tmp_path, "pages", records, cap, where) == want


@pytest.mark.parametrize(
    ("cap", "where"),
    [(100_000, "spark"), pytest.param(8, "driver", marks=pytest.mark.slow),
     pytest.param(3, "driver", marks=pytest.mark.slow),
     pytest.param(5, "spark", marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_join_of_a_dense_and_a_sparse_topic_on_live_traffic_gives_what_kafka_streams_gives(
    spark, kafka_settings, tmp_path, cap, where
):
    rng = random.Random(11)
    records = [
        r for r in live_traffic(12, 200, {"clicks": 2, "impressions": 2}, late=False)
        if r[0] == "clicks" or rng.random() < 0.3  # impressions are sparse
    ]  # fmt: skip
    want = through_kafka_streams("join", records, tmp_path)
    assert len(want) > 20, "Kafka Streams joined too few pairs for the test to mean much"
    assert through_spark(spark, kafka_settings, tmp_path, "join", records, cap, where) == want
