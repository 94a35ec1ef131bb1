"""A stream-stream join on Spark behaves as in the test driver: orders matched with their
payments within 10 minutes (a left join: an order with no payment by then goes on alone),
several orders and payments per task in each micro-batch, windows closing across batches, the
two topics read by one task and merged by timestamp, exactly once into Kafka."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from datetime import timedelta

import pytest

from streamplatform import JoinWindows, StreamsBuilder, TopologyTestDriver
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import PARTITIONS, job_config, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark]
MINUTE = 60_000


def orders_with_payments_topology(orders: str, payments: str, sink: str):
    """Each order with every payment of it within 10 minutes (5 minutes' grace), or alone."""
    b = StreamsBuilder()
    order_stream = b.stream(orders, Serdes.string(), Serdes.json())
    payment_stream = b.stream(payments, Serdes.string(), Serdes.json())
    windows = JoinWindows.of_time_difference_and_grace(timedelta(minutes=10),
                                                       timedelta(minutes=5))  # fmt: skip
    order_stream.left_join(
        payment_stream,
        lambda order, payment: {
            "order": order["n"],
            "paid": None if payment is None else payment["amount"],
        },  # fmt: skip
        windows,
    ).to(sink)
    return b.build()


def make_orders_and_payments(kafka_settings, orders: str, payments: str, count: int):
    """``count`` orders, a second to a minute apart; most paid 0-14 minutes later (some too
    late), some twice, some never; a last order per partition a day later closes every
    window. Key = order id; an order and its payments on one partition."""
    rng = random.Random(11)
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    events = []
    time = 1_700_000_000_000
    for n in range(count):
        time += rng.randint(1_000, MINUTE)
        key, partition = f"o{n}", n % PARTITIONS
        events.append((time, orders, partition, key, {"n": n}))
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            paid_at = time + rng.randint(0, 14 * MINUTE)
            events.append((paid_at, payments, partition, key, {"amount": rng.randint(1, 99)}))
    for partition in range(PARTITIONS):
        events.append((time + 24 * 60 * MINUTE, orders, partition, f"end{partition}", {"n": -1}))
    events.sort(key=lambda event: event[0])
    for timestamp, topic, partition, key, value in events:
        writer.produce(topic, key=key, value=json.dumps(value).encode(), partition=partition,
                       timestamp=timestamp)  # fmt: skip
    assert writer.flush(120) == 0
    return events


def through_the_test_driver(topology, sink, events):
    with TopologyTestDriver(topology, {"application.id": "expected"}) as driver:
        topics = {}
        for timestamp, topic, partition, key, value in events:
            if topic not in topics:
                topics[topic] = driver.create_input_topic(topic, Serdes.string(), Serdes.json())
            topics[topic].pipe_input(key, value, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic(sink, Serdes.string(), Serdes.json())
        return [(r.key, json.dumps(r.value), r.timestamp) for r in out.read_records_to_list()]


def test_orders_join_their_payments_on_spark_as_in_the_test_driver(spark, kafka_settings, tmp_path):
    app = f"sjoin-{uuid.uuid4().hex[:6]}"
    orders, payments, sink = f"{app}-orders", f"{app}-payments", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(t, PARTITIONS) for t in (orders, payments, sink)])
    events = make_orders_and_payments(kafka_settings, orders, payments, 300)
    config = job_config(kafka_settings, tmp_path, app, orders) | {
        "platform.max.records.per.batch": 40,  # per partition and topic: several batches
        "errors.dead.letter.queue.topic.name": None,
    }
    topology = orders_with_payments_topology(orders, payments, sink)
    job = StreamingJob(topology, config, spark=spark)
    results = job.run_until_caught_up()
    job.close()
    assert len(results) >= 3
    assert all(r.path.startswith("direct") for r in results)  # a task reads both topics
    assert sum(r.records_in for r in results) == len(events)

    got = Counter((r.key.decode(), json.dumps(json.loads(r.value)), r.timestamp)
                  for r in read_topic(kafka_settings, sink))  # fmt: skip
    expected = Counter(through_the_test_driver(topology, sink, events))
    assert got == expected
    values = [json.loads(value) for _, value, _ in expected]
    assert sum(v["paid"] is None for v in values) > 20  # orders never (or too late) paid
    assert sum(v["paid"] is not None for v in values) > 200
    assert Counter(v["order"] for v in values if v["paid"] is not None).most_common(1)[0][1] == 2
