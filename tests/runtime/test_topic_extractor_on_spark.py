"""``KStream.to(extractor)`` on Spark: each record goes to the topic its extractor chooses,
exactly once (a batch that fails after its Kafka outputs and runs again doubles nothing), as
the test driver routes them; a topic the extractor chooses that does not exist fails the task
with one message naming it, and nothing is committed."""

from __future__ import annotations

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


def topology(source: str, prefix: str):
    """Each order to the topic of its region: ``<prefix>-<region>``."""
    b = StreamsBuilder()
    (b.stream(source, Serdes.string(), Serdes.json())
     .filter(lambda key, order: order["amount"] > 0)
     .to(lambda key, order, context: f"{prefix}-{order['region']}"))  # fmt: skip
    return b.build()


def produce(settings, source: str, regions: list[str]) -> list[tuple[str, bytes, int]]:
    producer = Producer({"bootstrap.servers": settings["bootstrap.servers"],
                         "enable.idempotence": True})  # fmt: skip
    sent = []
    for n in range(24):
        value = f'{{"region": "{regions[n % len(regions)]}", "amount": {n % 5}}}'.encode()
        sent.append((f"c{n % 4}", value, 1_000 + n))
        producer.produce(source, key=sent[-1][0], value=value, timestamp=sent[-1][2])
    assert producer.flush(30) == 0
    return sent


def routed_by_the_test_driver(source, prefix, sent, regions) -> dict[str, list]:
    with TopologyTestDriver(topology(source, prefix), {"application.id": "ref"}) as driver:
        given = driver.create_input_topic(source, Serdes.string(), Serdes.bytes())
        for key, value, timestamp in sent:
            given.pipe_input(key, value, timestamp=timestamp)
        routed = {}
        for region in regions:
            out = driver.create_output_topic(f"{prefix}-{region}", Serdes.bytes(), Serdes.bytes())
            routed[region] = sorted(
                (r.key, r.value, r.timestamp) for r in out.read_records_to_list()
            )
        return routed


def job_config(kafka_settings, tmp_path, where: str) -> dict:
    return {
        "application.id": f"routed-{uuid.uuid4().hex[:6]}",
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(tmp_path / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        "platform.max.records.per.batch": 5,
        # The tasks in this process, or in Spark's Python workers.
        "platform.driver.tasks.max.records": 10**6 if where == "driver" else 0,
    }


@pytest.mark.slow  # ~25 s: several batches and one run again
@pytest.mark.parametrize("where", ["driver", "spark"])
def test_records_reach_the_topics_their_extractor_chooses_exactly_once(
    spark, kafka_settings, tmp_path, monkeypatch, where
):
    source, prefix = f"orders-{uuid.uuid4().hex[:6]}", f"region-{uuid.uuid4().hex[:6]}"
    regions = ["eu", "us", "apac"]
    create_topics(kafka_settings, [TopicSpec(source, 2)]
                  + [TopicSpec(f"{prefix}-{r}", 2) for r in regions])  # fmt: skip
    sent = produce(kafka_settings, source, regions)
    expected = routed_by_the_test_driver(source, prefix, sent, regions)

    # Batch 1 fails once after its Kafka transactions committed, then runs again whole.
    monkeypatch.setenv("STREAMPLATFORM_FAIL_ONCE", "after_outputs:1")
    monkeypatch.setenv("STREAMPLATFORM_FAIL_ONCE_FILE", str(tmp_path / "failed-once"))
    job = StreamingJob(topology(source, prefix), job_config(kafka_settings, tmp_path, where),
                       spark=spark)  # fmt: skip
    try:
        with pytest.raises(Exception, match="injected failure"):
            job.run_until_caught_up()
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert (tmp_path / "failed-once").exists()
    assert results and results[0].batch_id == 1  # the failed batch, run again
    for region in regions:
        got = sorted((r.key, r.value, r.timestamp)
                     for r in read_topic(kafka_settings, f"{prefix}-{region}"))  # fmt: skip
        assert got == expected[region], region
    assert sum(map(len, expected.values())) == sum(1 for _, v, _ in sent if b'"amount": 0' not in v)


@pytest.mark.slow  # ~10 s
def test_a_topic_the_extractor_chooses_that_does_not_exist_fails_the_batch_naming_it(
    spark, kafka_settings, tmp_path
):
    source, prefix = f"orders-{uuid.uuid4().hex[:6]}", f"region-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(source, 1), TopicSpec(f"{prefix}-eu", 1)])
    produce(kafka_settings, source, ["eu", "mars"])
    job = StreamingJob(topology(source, prefix), job_config(kafka_settings, tmp_path, "driver"),
                       spark=spark)  # fmt: skip
    try:
        with pytest.raises(Exception, match=f"chose topic '{prefix}-mars', which does not exist"):
            job.run_batch()
    finally:
        job.close()
    assert read_topic(kafka_settings, f"{prefix}-eu") == []  # its transaction was not committed
