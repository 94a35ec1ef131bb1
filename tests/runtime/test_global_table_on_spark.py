"""A stream-global table join on Spark equals the test driver's: orders (two partitions) joined
with a products global table (three partitions: no co-partitioning), several small batches,
tasks in this process and in Spark's workers, exactly once across a batch that fails after its
outputs and runs again, a product update between runs, and every task's copy of the global
table rebuilt from its topic when the state directory is gone."""

from __future__ import annotations

import json
import shutil
import sys
import uuid

import pytest
from confluent_kafka import Producer
from pyspark import cloudpickle

from streamplatform import StreamingJob, StreamsBuilder, TopologyTestDriver
from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.serdes import Serdes

from .support import read_topic

pytestmark = [pytest.mark.spark, pytest.mark.broker]
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def topology(orders: str, products: str, enriched: str):
    b = StreamsBuilder()
    catalog = b.global_table(products, Serdes.string(), Serdes.json())
    stream = b.stream(orders, Serdes.string(), Serdes.json())
    stream.join(
        catalog,
        lambda key, order: order["product"],
        lambda order, product: {**order, "name": product["name"]},
    ).to(enriched)
    stream.left_join(
        catalog,
        lambda key, order: order["product"],
        lambda order, product: product and product["name"],
    ).to(f"{enriched}-left")
    return b.build()


def produce(settings, records: list[tuple[str, str, dict | None, int]]) -> None:
    producer = Producer({"bootstrap.servers": settings["bootstrap.servers"],
                         "enable.idempotence": True})  # fmt: skip
    for topic, key, value, timestamp in records:
        data = None if value is None else json.dumps(value).encode()
        producer.produce(topic, key=key, value=data, timestamp=timestamp)
    assert producer.flush(30) == 0


def rounds(orders: str, products: str) -> list[list[tuple[str, str, dict | None, int]]]:
    """What arrives before each run of the job: the catalog, then orders; then a renamed
    product, a deleted one and more orders."""
    first = [(products, f"p{n}", {"name": f"product {n}"}, 1_000 + n) for n in range(5)]
    first += [
        (orders, f"c{n % 3}", {"product": f"p{n % 6}", "n": n}, 2_000 + n) for n in range(14)
    ]  # fmt: skip  (p5 is not in the catalog)
    second = [(products, "p1", {"name": "product one"}, 3_000), (products, "p2", None, 3_001)]
    second += [(orders, f"c{n % 3}", {"product": f"p{n % 6}", "n": n}, 4_000 + n)
               for n in range(14, 24)]  # fmt: skip
    return [first, second]


def expected(orders, products, enriched, arrived) -> dict[str, list]:
    with TopologyTestDriver(topology(orders, products, enriched), {"application.id": "r"}) as d:
        topics = {t: d.create_input_topic(t, Serdes.string(), Serdes.bytes())
                  for t in (orders, products)}  # fmt: skip
        for batch in arrived:
            for topic, key, value, timestamp in batch:
                data = None if value is None else json.dumps(value).encode()
                topics[topic].pipe_input(key, data, timestamp=timestamp)
        return {
            sink: sorted(((r.key, r.value, r.timestamp) for r in d.create_output_topic(
                sink, Serdes.bytes(), Serdes.bytes()).read_records_to_list()), key=repr)
            for sink in (enriched, f"{enriched}-left")
        }  # fmt: skip


@pytest.mark.slow  # ~40 s: two runs of several batches, one run again
@pytest.mark.parametrize("where", ["driver", "spark"])
def test_a_stream_global_table_join_on_spark_equals_the_test_driver(
    spark, kafka_settings, tmp_path, monkeypatch, where
):
    tag = uuid.uuid4().hex[:6]
    orders, products, enriched = f"orders-{tag}", f"products-{tag}", f"enriched-{tag}"
    create_topics(
        kafka_settings,
        [
            TopicSpec(orders, 2),
            TopicSpec(products, 3),
            TopicSpec(enriched, 2),
            TopicSpec(f"{enriched}-left", 2),
        ],
    )
    arrived = rounds(orders, products)
    want = expected(orders, products, enriched, arrived)
    assert want[enriched] and len(want[f"{enriched}-left"]) == 24

    config = {
        "application.id": f"global-{tag}",
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(tmp_path / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        "platform.max.records.per.batch": 4,
        "platform.driver.tasks.max.records": 10**6 if where == "driver" else 0,
        # No task kept open between batches: the state directory is deleted between the runs
        # below, as a new executor would come without one; under a process that still held
        # its stores open, RocksDB would write into the directory made anew.
        "platform.task.cache.idle.ms": 0,
    }
    # The first run's batch 1 fails once after its Kafka outputs, and runs again.
    monkeypatch.setenv("STREAMPLATFORM_FAIL_ONCE", "after_outputs:1")
    monkeypatch.setenv("STREAMPLATFORM_FAIL_ONCE_FILE", str(tmp_path / "failed-once"))
    for number, batch in enumerate(arrived):
        produce(kafka_settings, batch)
        if number == 1:  # every task's copy of the table is rebuilt from its topic
            shutil.rmtree(tmp_path / "state")
        job = StreamingJob(topology(orders, products, enriched), config, spark=spark)
        try:
            if number == 0:
                with pytest.raises(Exception, match="injected failure"):
                    job.run_until_caught_up()
            assert job.run_until_caught_up()
        finally:
            job.close()
    for sink, records in want.items():
        got = sorted(((r.key, r.value, r.timestamp) for r in read_topic(kafka_settings, sink)),
                     key=repr)  # fmt: skip
        assert got == records, sink
