"""Dynamic routing: ``KStream.to(extractor)``, Kafka Streams' ``to(TopicNameExtractor,
Produced)``, through the test driver. The behaviour of Kafka Streams' KStreamImplTest
(shouldSendDataToDynamicTopics: records routed to the topic their value names, read back per
topic) plus the record context the extractor sees and an extractor's failure."""

from __future__ import annotations

import pytest

from streamplatform import RecordContext, StreamsBuilder, TopologyTestDriver
from streamplatform.errors import TaskFailedError
from streamplatform.serdes import Serdes

CONFIG = {"application.id": "topic-extractor"}


def _records(driver, topic: str) -> list[tuple]:
    out = driver.create_output_topic(topic, Serdes.string(), Serdes.string())
    return [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]


def test_records_go_to_the_topic_the_extractor_returns():
    b = StreamsBuilder()
    b.stream("input", Serdes.string(), Serdes.string()).to(
        lambda key, value, record_context: value + "-topic"
    )
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        topic = driver.create_input_topic("input", Serdes.string(), Serdes.string())
        topic.pipe_input("a", "v1", timestamp=1)
        topic.pipe_input("b", "v2", timestamp=2)
        topic.pipe_input("c", "v1", timestamp=3)
        assert _records(driver, "v1-topic") == [("a", "v1", 1), ("c", "v1", 3)]
        assert _records(driver, "v2-topic") == [("b", "v2", 2)]


class ByParity:
    """An extractor as Kafka Streams' interface: an object with extract()."""

    def extract(self, key, value, record_context) -> str:
        return "even" if value % 2 == 0 else "odd"


def test_an_extractor_object_and_the_given_serdes():
    b = StreamsBuilder()
    b.stream("input", Serdes.string(), Serdes.long()).map_values(lambda v: v * 10).to(
        ByParity(), Serdes.string(), Serdes.long()
    )
    topology = b.build()
    assert "topic extractor" in topology.describe()
    with TopologyTestDriver(topology, CONFIG) as driver:
        topic = driver.create_input_topic("input", Serdes.string(), Serdes.long())
        for key, value in (("a", 1), ("b", 2), ("c", 3)):
            topic.pipe_input(key, value, timestamp=0)
        even = driver.create_output_topic("even", Serdes.string(), Serdes.long())
        odd = driver.create_output_topic("odd", Serdes.string(), Serdes.long())
        assert even.read_key_values_to_list() == [("a", 10), ("b", 20), ("c", 30)]
        assert odd.read_key_values_to_list() == []


def test_the_extractor_sees_the_source_records_context():
    seen: list[RecordContext] = []

    def extractor(key, value, record_context: RecordContext) -> str:
        seen.append(record_context)
        return "out"

    b = StreamsBuilder()
    b.stream("input", Serdes.string(), Serdes.string()).map_values(str.upper).to(extractor)
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        topic = driver.create_input_topic("input", Serdes.string(), Serdes.string())
        topic.pipe_input("a", "x", timestamp=7, headers=[("h", b"1")])
        topic.pipe_input("b", "y", timestamp=9)
        assert _records(driver, "out") == [("a", "X", 7), ("b", "Y", 9)]
    assert [(c.topic, c.partition, c.offset, c.timestamp) for c in seen] == [
        ("input", 0, 0, 7), ("input", 0, 1, 9)
    ]  # fmt: skip
    assert seen[0].headers == [("h", b"1")]


def _failing(key, value, record_context) -> str:
    if value == "bad":
        raise ValueError("no topic for bad")
    return "out"


def test_an_extractors_error_goes_to_the_processing_exception_handler():
    b = StreamsBuilder()
    b.stream("input", Serdes.string(), Serdes.string()).to(_failing)
    config = {**CONFIG, "processing.exception.handler": "log_and_continue"}
    with TopologyTestDriver(b.build(), config) as driver:
        topic = driver.create_input_topic("input", Serdes.string(), Serdes.string())
        for key, value in (("a", "ok"), ("b", "bad"), ("c", "ok")):
            topic.pipe_input(key, value, timestamp=0)
        assert _records(driver, "out") == [("a", "ok", 0), ("c", "ok", 0)]


def test_an_extractors_error_fails_the_task_by_default():
    b = StreamsBuilder()
    b.stream("input", Serdes.string(), Serdes.string()).to(_failing)
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        topic = driver.create_input_topic("input", Serdes.string(), Serdes.string())
        with pytest.raises(TaskFailedError, match="no topic for bad"):
            topic.pipe_input("b", "bad", timestamp=0)


def test_an_extractor_must_return_a_topic_name():
    b = StreamsBuilder()
    b.stream("input", Serdes.string(), Serdes.string()).to(lambda key, value, context: None)
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        topic = driver.create_input_topic("input", Serdes.string(), Serdes.string())
        with pytest.raises(TaskFailedError, match="not a topic name"):
            topic.pipe_input("a", "v", timestamp=0)


def test_to_refuses_what_is_neither_a_topic_nor_an_extractor():
    b = StreamsBuilder()
    with pytest.raises(TypeError, match="topic name extractor"):
        b.stream("input").to(42)  # type: ignore[arg-type]
