"""Exception handlers and the dead letter queue (KIP-1033 / KIP-1034), through the test driver."""

from __future__ import annotations

import pytest

from streamplatform import (
    Processor,
    ProducerRecord,
    PunctuationType,
    StreamsBuilder,
    TopologyTestDriver,
)
from streamplatform.config import ConfigError
from streamplatform.errors import HandlerError, Response, TaskFailedError
from streamplatform.serdes import Serdes

DLQ = "app-dlq"
SOURCE_HEADERS = [("trace", b"t-1"), ("trace", b"t-2")]
ERROR_HEADER_NAMES = [
    "__streams.errors.exception",
    "__streams.errors.message",
    "__streams.errors.stacktrace",
    "__streams.errors.topic",
    "__streams.errors.partition",
    "__streams.errors.offset",
]


def _amounts_topology():
    """Parses JSON values and divides by the amount: bad JSON and amount 0 both fail."""
    b = StreamsBuilder()
    stream = b.stream("in", Serdes.string(), Serdes.json())
    stream.map_values(lambda v: 100 // v["amount"]).to("out", value_serde=Serdes.long())
    return b.build()


def _driver(handler_settings, topology=None):
    config = {"application.id": "errors", "errors.dead.letter.queue.topic.name": DLQ}
    return TopologyTestDriver(topology or _amounts_topology(), config | handler_settings)


def _dlq(driver):
    return driver.create_output_topic(DLQ, Serdes.bytes(), Serdes.bytes()).read_records_to_list()


def _out(driver):
    return driver.create_output_topic("out", Serdes.string(), Serdes.long()).read_values_to_list()


def _assert_error_headers(headers, exception, message, topic, partition, offset):
    assert headers[: len(SOURCE_HEADERS)] == SOURCE_HEADERS  # source headers first, in order
    error = headers[len(SOURCE_HEADERS) :]
    assert [name for name, _ in error] == ERROR_HEADER_NAMES
    values = dict(error)
    assert values["__streams.errors.exception"] == exception.encode()
    assert values["__streams.errors.message"] == (message.encode() if message else None)
    assert b"Traceback" in values["__streams.errors.stacktrace"]
    assert values["__streams.errors.topic"] == (topic.encode() if topic else None)
    assert values["__streams.errors.partition"] == str(partition).encode()
    assert values["__streams.errors.offset"] == str(offset).encode()


def test_processing_error_with_log_and_continue_goes_to_the_dlq_and_processing_goes_on():
    with _driver({"processing.exception.handler": "log_and_continue"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        source.pipe_input("a", {"amount": 4}, timestamp=10)
        source.pipe_input("b", {"amount": 0}, timestamp=11, headers=SOURCE_HEADERS)
        source.pipe_input("c", {"amount": 5}, timestamp=12)
        assert _out(driver) == [25, 20]
        [dead] = _dlq(driver)
        assert driver.metrics()["skipped"] == 1
    assert (dead.key, dead.value, dead.timestamp) == (b"b", b'{"amount":0}', 11)
    _assert_error_headers(
        dead.headers, "ZeroDivisionError", "integer division or modulo by zero", "in", 0, 1
    )


def test_deserialization_error_with_log_and_fail_writes_the_dlq_then_fails():
    with _driver({"default.deserialization.exception.handler": "log_and_fail"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        source.pipe_input("a", {"amount": 4}, timestamp=10)
        with pytest.raises(
            TaskFailedError, match="default.deserialization.exception.handler"
        ) as failure:
            source.pipe_raw(b"bad", b"{not json", timestamp=11, headers=SOURCE_HEADERS)
        assert failure.value.task_id == "0_0"
        assert _out(driver) == [25]  # what was output before stays readable
        [dead] = _dlq(driver)
        assert (dead.key, dead.value) == (b"bad", b"{not json")  # the raw source bytes
        message = dict(dead.headers)["__streams.errors.message"].decode()
        assert message.startswith("not JSON")
        _assert_error_headers(dead.headers, "SerializationError", message, "in", 0, 1)
        # The task restarts from its last commit and carries on with the next record.
        source.pipe_input("c", {"amount": 5}, timestamp=12)
        assert _out(driver) == [20]


def test_deserialization_error_with_log_and_continue_skips_the_record():
    with _driver({"default.deserialization.exception.handler": "log_and_continue"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        source.pipe_raw(b"bad", b"\xff", timestamp=5, headers=SOURCE_HEADERS)
        source.pipe_input("a", {"amount": 50}, timestamp=6)
        assert _out(driver) == [2]
        [dead] = _dlq(driver)
        assert dead.value == b"\xff"
        _assert_error_headers(
            dead.headers,
            "SerializationError",
            dict(dead.headers)["__streams.errors.message"].decode(),
            "in",
            0,
            0,
        )


@pytest.mark.parametrize("dlq", [None, DLQ])
def test_the_handlers_default_to_continue_with_a_dlq_topic_and_to_fail_without(dlq):
    """One rule, in StreamsConfig: the Python API, the CLI and Dagster all meet it."""
    config = {"application.id": "defaults"} | ({"errors.dead.letter.queue.topic.name": dlq}
                                               if dlq else {})  # fmt: skip
    with TopologyTestDriver(_amounts_topology(), config) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        if dlq is None:
            with pytest.raises(TaskFailedError, match="processing.exception.handler"):
                source.pipe_input("b", {"amount": 0}, timestamp=1)
            with pytest.raises(TaskFailedError, match="deserialization.exception.handler"):
                source.pipe_raw(b"c", b"{not json", timestamp=2)
        else:
            source.pipe_input("b", {"amount": 0}, timestamp=1)
            source.pipe_raw(b"c", b"{not json", timestamp=2)
            source.pipe_input("d", {"amount": 4}, timestamp=3)
            assert _out(driver) == [25]
            assert [record.key for record in _dlq(driver)] == [b"b", b"c"]


def test_no_dlq_topic_means_no_dlq_records():
    topology = _amounts_topology()
    config = {"application.id": "no-dlq", "processing.exception.handler": "log_and_continue"}
    with TopologyTestDriver(topology, config) as driver:
        driver.create_input_topic("in", Serdes.string(), Serdes.json()).pipe_input(
            "b", {"amount": 0}
        )
        assert driver.metrics()["dlq_records"] == 0
        assert driver.metrics()["skipped"] == 1


def test_raw_bytes_after_a_repartition_are_the_repartitioned_record():
    b = StreamsBuilder()
    stream = b.stream("in", Serdes.string(), Serdes.json())
    (
        stream.select_key(lambda k, v: v["account"])
        .deduplicate_by_key(1_000)
        .map_values(lambda v: 100 // v["amount"])
        .to("out", value_serde=Serdes.long())
    )
    with _driver({"processing.exception.handler": "log_and_continue"}, b.build()) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        source.pipe_input("original-key", {"account": "acc-9", "amount": 0}, headers=SOURCE_HEADERS)
        [dead] = _dlq(driver)
    assert dead.key == b"acc-9"  # the repartitioned record's key, not "original-key"
    assert (
        dict(dead.headers)["__streams.errors.topic"]
        == b"errors-KSTREAM-DEDUPLICATE-0000000002-repartition"
    )


class RoutingHandler:
    """A custom handler: its own DLQ topic, its own record, resumes."""

    def handle(self, context, record, exception):
        return Response.resume(
            [ProducerRecord("my-errors", context.source_raw_key, b"custom", context.timestamp, [])]
        )


class RaisingHandler:
    def handle(self, context, record, exception):
        raise RuntimeError("the handler itself broke")


class SilentHandler:
    def handle(self, context, record, exception):
        return None


def test_custom_handler_writes_its_own_records_and_ignores_the_dlq_setting():
    with _driver({"processing.exception.handler": f"{__name__}.RoutingHandler"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        source.pipe_input("b", {"amount": 0}, timestamp=3)
        source.pipe_input("c", {"amount": 1}, timestamp=4)
        assert _dlq(driver) == []
        mine = driver.create_output_topic("my-errors", Serdes.string(), Serdes.bytes())
        assert mine.read_key_values_to_list() == [("b", b"custom")]
        assert _out(driver) == [100]


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("RaisingHandler", "raised RuntimeError: the handler itself broke"),
        ("SilentHandler", "returned None"),
    ],
)
def test_a_broken_handler_fails_the_task_naming_it(handler, message):
    with _driver({"processing.exception.handler": f"{__name__}.{handler}"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        with pytest.raises(HandlerError) as failure:
            source.pipe_input("b", {"amount": 0})
    assert "processing.exception.handler" in str(failure.value)
    assert handler in str(failure.value)
    assert message in str(failure.value)


def test_an_unknown_handler_stops_start_up():
    with pytest.raises(ConfigError, match="processing.exception.handler='nope.Handler'"):
        _driver({"processing.exception.handler": "nope.Handler"})


class Ticker(Processor):
    """Fails in its wall-clock punctuation."""

    def init(self, context):
        super().init(context)
        context.schedule(1_000, PunctuationType.WALL_CLOCK_TIME, self.tick)

    def tick(self, now):
        raise ValueError(f"tick at {now}")

    def process(self, record):
        self.context.forward(record)


def test_punctuation_errors_reach_the_handler_with_no_source_record():
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.string()).process(Ticker).to("out")
    config = {"processing.exception.handler": "log_and_continue"}
    with _driver(config, b.build()) as driver:
        driver.create_input_topic("in", Serdes.string(), Serdes.string()).pipe_input("k", "v")
        driver.advance_wall_clock_time(999)
        assert _dlq(driver) == []
        driver.advance_wall_clock_time(1)
        [dead] = _dlq(driver)
    assert (dead.key, dead.value) == (None, None)
    headers = dict(dead.headers)
    assert headers["__streams.errors.message"] == b"tick at 1000"
    assert headers["__streams.errors.topic"] is None
    assert (headers["__streams.errors.partition"], headers["__streams.errors.offset"]) == (
        b"-1",
        b"-1",
    )


def test_production_serialization_error_carries_no_source_bytes():
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.json()).to("out", value_serde=Serdes.long())
    config = {"default.production.exception.handler": "log_and_continue"}
    with _driver(config, b.build()) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        source.pipe_input("k", "not a long", headers=SOURCE_HEADERS)
        source.pipe_input("k", 7)
        assert _out(driver) == [7]
        [dead] = _dlq(driver)
    assert (dead.key, dead.value) == (None, None)  # production errors: only metadata
    assert dict(dead.headers)["__streams.errors.exception"] == b"SerializationError"


def test_processing_error_with_log_and_fail_writes_the_dlq_then_fails():
    with _driver({"processing.exception.handler": "log_and_fail"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        with pytest.raises(TaskFailedError, match="processing.exception.handler failed the task"):
            source.pipe_input("b", {"amount": 0}, timestamp=11, headers=SOURCE_HEADERS)
        [dead] = _dlq(driver)
        assert (dead.key, dead.value) == (b"b", b'{"amount":0}')
        _assert_error_headers(
            dead.headers, "ZeroDivisionError", "integer division or modulo by zero", "in", 0, 0
        )
        assert _out(driver) == []


def _failing_operators_topology():
    """An aggregator that fails on amount 0 and a stream-stream joiner that fails on "bad"."""
    from streamplatform import JoinWindows

    b = StreamsBuilder()
    amounts = b.stream("in", Serdes.string(), Serdes.json())
    amounts.group_by_key().aggregate(lambda: 0, lambda key, v, total: total + 100 // v["amount"],
                                     Serdes.long()).to_stream().to("out")  # fmt: skip
    left = b.stream("left", Serdes.string(), Serdes.string())
    right = b.stream("right", Serdes.string(), Serdes.string())
    left.join(right, lambda x, y: x + y if y != "bad" else 1 // 0,
              JoinWindows.of_time_difference_with_no_grace(10)).to("joined")  # fmt: skip
    return b.build()


def test_a_failing_aggregator_or_joiner_goes_to_the_dlq_and_leaves_no_partial_result():
    """As Kafka Streams routes them (KIP-1033): the failing record to the DLQ, the aggregate
    as it was before it, the next records aggregated and joined as usual."""
    settings = {"processing.exception.handler": "log_and_continue"}
    with _driver(settings, _failing_operators_topology()) as driver:
        amounts = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        amounts.pipe_input("a", {"amount": 4}, timestamp=1)
        amounts.pipe_input("a", {"amount": 0}, timestamp=2)
        amounts.pipe_input("a", {"amount": 5}, timestamp=3)
        left = driver.create_input_topic("left", Serdes.string(), Serdes.string())
        right = driver.create_input_topic("right", Serdes.string(), Serdes.string())
        left.pipe_input("k", "x", timestamp=5)
        right.pipe_input("k", "bad", timestamp=6)
        right.pipe_input("k", "y", timestamp=7)
        totals = driver.create_output_topic("out", Serdes.string(), Serdes.long())
        assert totals.read_values_to_list() == [25, 45]
        joined = driver.create_output_topic("joined", Serdes.string(), Serdes.string())
        assert joined.read_values_to_list() == ["xy"]
        dead = _dlq(driver)
        assert driver.metrics()["skipped"] == 2
    assert [(d.key, d.value) for d in dead] == [(b"a", b'{"amount":0}'), (b"k", b"bad")]
