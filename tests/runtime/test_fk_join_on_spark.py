"""A foreign-key table join on Spark ends where the test driver ends: orders (three partitions)
joined with their customers (two partitions) through the join's subscription and answer topics,
small batches, tasks in this process and in Spark's workers, exactly once across a batch that
fails after its outputs and runs again, and updates on both sides (a customer renamed, an order
moved to another customer, a deleted order and customer) between runs. The answers go through a
Kafka topic of the job's own and are joined the next batch (runtime/feedback_topics.py): the
updates on the way may be fewer than the driver's, the last result of every order is the same."""

from __future__ import annotations

import sys
import uuid

import pytest
from pyspark import cloudpickle

from streamplatform import StreamingJob, StreamsBuilder, TopologyTestDriver
from streamplatform.kafka import TopicSpec, create_topics, describe_topics, producer
from streamplatform.serdes import Serdes

from .support import read_topic

pytestmark = [pytest.mark.spark, pytest.mark.broker]
cloudpickle.register_pickle_by_value(sys.modules[__name__])
S = Serdes.string()


def topology(orders: str, customers: str, out: str, left: bool):
    b = StreamsBuilder()
    order_table = b.table(orders, S, S)
    customer_table = b.table(customers, S, S)
    join = order_table.left_join if left else order_table.join
    join(customer_table, lambda order: order.split(":")[0],
         lambda order, customer: f"{order}@{customer}", name="orders-customers"
         ).to_stream().to(out, S, S)  # fmt: skip
    return b.build()


def rounds(orders: str, customers: str) -> list[list[tuple[str, str, str | None, int]]]:
    first = [(customers, f"c{n}", f"customer {n}", 1_000 + n) for n in range(4)]
    first += [(orders, f"o{n}", f"c{n % 5}:item {n}", 2_000 + n) for n in range(12)]
    second = [
        (customers, "c1", "customer one", 3_000),  # renamed: its orders join again
        (orders, "o2", "c3:item 2", 3_001),  # moved to another customer
        (orders, "o5", None, 3_002),  # deleted
        (customers, "c3", None, 3_003),  # deleted: its orders lose their result
        (customers, "c4", "customer 4", 3_004),  # c4's orders find one
    ]
    return [first, second]


def produce(settings, records) -> None:
    """Partitioned by murmur2 of the key, as Java's producers and Kafka Streams partition: the
    join's subscriptions meet the customers' partitions (co-partitioned)."""
    writer = producer(settings, **{"enable.idempotence": True})
    for topic, key, value, timestamp in records:
        writer.produce(topic, key=key, value=None if value is None else value.encode(),
                       timestamp=timestamp)  # fmt: skip
    assert writer.flush(30) == 0


def last_results(records) -> dict[str, str | None]:
    """The table the updates make: each key's last value (None: deleted)."""
    return {key: value for key, value in records}


@pytest.mark.slow  # ~40 s: two runs of several batches, one run again
@pytest.mark.parametrize(("where", "left"), [("driver", False), ("spark", True)])
def test_a_foreign_key_join_on_spark_ends_as_the_test_driver(
    spark, kafka_settings, tmp_path, monkeypatch, where, left
):
    tag = uuid.uuid4().hex[:6]
    orders, customers, out = f"orders-{tag}", f"customers-{tag}", f"out-{tag}"
    create_topics(kafka_settings,
                  [TopicSpec(orders, 3), TopicSpec(customers, 2), TopicSpec(out, 2)])  # fmt: skip
    arrived = rounds(orders, customers)
    with TopologyTestDriver(topology(orders, customers, out, left),
                            {"application.id": "r"}) as driver:  # fmt: skip
        topics = {t: driver.create_input_topic(t, S, S) for t in (orders, customers)}
        for batch in arrived:
            for topic, key, value, timestamp in batch:
                topics[topic].pipe_input(key, value, timestamp=timestamp)
        expected = last_results(driver.create_output_topic(out, S, S).read_key_values_to_list())
    assert sum(value is not None for value in expected.values()) >= 6

    app = f"fk-{tag}"
    config = {
        "application.id": app,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(tmp_path / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        "platform.max.records.per.batch": 5,
        "platform.driver.tasks.max.records": 10**6 if where == "driver" else 0,
    }
    monkeypatch.setenv("STREAMPLATFORM_FAIL_ONCE", "after_outputs:1")
    monkeypatch.setenv("STREAMPLATFORM_FAIL_ONCE_FILE", str(tmp_path / "failed-once"))
    for number, batch in enumerate(arrived):
        produce(kafka_settings, batch)
        job = StreamingJob(topology(orders, customers, out, left), config, spark=spark)
        try:
            if number == 0:
                with pytest.raises(Exception, match="injected failure"):
                    job.run_until_caught_up()
            assert job.run_until_caught_up()
        finally:
            job.close()
    # The answers' topic: the job's own, as wide as the orders' (their sub-topology reads it).
    answers = f"{app}-orders-customers-subscription-response-topic"
    assert describe_topics(kafka_settings, [answers]) == {answers: 3}
    got = last_results((r.key.decode(), None if r.value is None else r.value.decode())
                       for r in read_topic(kafka_settings, out))  # fmt: skip
    assert got == expected
