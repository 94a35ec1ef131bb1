"""flat_map, process_values, print, to_table and cogroup on Spark (two partitions, batches of a few
records, tasks in Spark's Python workers) equal the test driver: the stores, as queried from the
changelog, the Delta sink's rows and the printed lines."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
from confluent_kafka import Producer
from pyspark import cloudpickle

from streamplatform import Printed, Processor, StreamingJob, StreamsBuilder, TopologyTestDriver
from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.serdes import Serdes
from streamplatform.state_query import StateQuery
from streamplatform.state_query.views import view_for

pytestmark = [pytest.mark.spark, pytest.mark.broker]
# Spark's workers get this module's processor by value (they cannot import the test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

LINES = ["a b a", "c", "b b", "", "a c d", "d d d", "e", "a"]


class Upper(Processor):
    def process(self, record):
        self.context.forward(record._replace(value=record.value.upper()))


def topology(lines: str, prices: str, printed: str):
    b = StreamsBuilder()
    text = b.stream(lines, Serdes.string(), Serdes.string())
    words = text.flat_map(lambda key, line: [(word, word) for word in line.split()])
    words.group_by_key().count("words")
    text.process_values(Upper).to("upper")
    text.print(Printed.to_file(printed).with_label("lines"))
    priced = b.stream(prices, Serdes.string(), Serdes.json())
    priced.map_values(lambda key, value: {"product": key, **value}).to_table("latest")
    # One aggregate of two grouped streams, one of them re-keyed (repartitioned first).
    words.group_by_key().cogroup(lambda key, word, total: total + 1).cogroup(
        priced.group_by_key(), lambda key, price, total: total + price["price"]
    ).aggregate(lambda: 0, value_serde=Serdes.long(), name="mixed")
    return b.build()


def produce(settings, lines: str, prices: str) -> list[tuple[str, str, str, int]]:
    producer = Producer({"bootstrap.servers": settings["bootstrap.servers"],
                         "enable.idempotence": True})  # fmt: skip
    sent = []
    for n, line in enumerate(LINES):
        sent.append((lines, f"k{n % 3}", line, 1_000 * n))
        sent.append((prices, f"p{n % 2}", json.dumps({"price": n}), 1_000 * n))
    for topic, key, value, timestamp in sent:
        producer.produce(topic, key=key, value=value.encode(), timestamp=timestamp)
    assert producer.flush(30) == 0
    return sent


@pytest.mark.slow  # ~20 s: a job of a few batches
def test_new_stream_operators_on_spark_equal_the_test_driver(spark, kafka_settings, tmp_path):
    lines, prices = f"lines-{uuid.uuid4().hex[:6]}", f"prices-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(lines, 2), TopicSpec(prices, 2)])
    sent = produce(kafka_settings, lines, prices)

    printed_reference = tmp_path / "reference.txt"
    reference = topology(lines, prices, str(printed_reference))
    with TopologyTestDriver(reference, {"application.id": "reference"}) as driver:
        inputs = {
            lines: driver.create_input_topic(lines, Serdes.string(), Serdes.string()),
            prices: driver.create_input_topic(prices, Serdes.string(), Serdes.string()),
        }
        for topic, key, value, timestamp in sent:
            inputs[topic].pipe_input(key, value, timestamp=timestamp)
        upper = driver.create_output_topic("upper", Serdes.string(), Serdes.string())
        expected_upper = sorted(upper.read_key_values_to_list())
        expected_stores = {
            name: sorted(view_for(reference, name, engine).all(), key=repr)
            for task in driver._tasks.values()
            for name, engine in task.stores.items() if name in ("words-STATE-STORE",
                                                                "latest-STATE-STORE",
                                                                "mixed-STATE-STORE")
        }  # fmt: skip

    printed = tmp_path / "printed.txt"
    top = topology(lines, prices, str(printed))
    config = {"application.id": f"operators-{uuid.uuid4().hex[:6]}",
              "bootstrap.servers": kafka_settings["bootstrap.servers"],
              "state.dir": str(tmp_path / "state"), "platform.delta.root": str(tmp_path / "delta"),
              "platform.max.records.per.batch": 3,
              "platform.driver.tasks.max.records": 0}  # the tasks in Spark's workers  # fmt: skip
    job = StreamingJob(top, config, spark=spark, delta_sinks=["upper"])
    try:
        results = job.run_until_caught_up()
        assert len(results) >= 3
        rows = spark.read.format("delta").load(f"{job.root}/upper").collect()
    finally:
        job.close()
    assert sorted((r.key.decode(), r.value.decode()) for r in rows) == expected_upper
    with StateQuery(top, config) as state:
        for name, expected in expected_stores.items():
            query = state.store(name)
            got = sorted((row for view in query.partitions.values() for row in view.all()),
                         key=repr)  # fmt: skip
            assert got == expected, name
    assert expected_stores["words-STATE-STORE"] and expected_stores["mixed-STATE-STORE"]
    # Printed by the tasks where they ran: each line once (no batch was replayed).
    assert sorted(printed.read_text().splitlines()) == sorted(
        printed_reference.read_text().splitlines())  # fmt: skip
    assert len(printed.read_text().splitlines()) == len(LINES)
