"""Stream-global table joins, ported from Kafka Streams' own KStreamGlobalKTableJoinTest and
KStreamGlobalKTableLeftJoinTest (apache/kafka
streams/src/test/java/org/apache/kafka/streams/kstream/internals/) with their inputs and
expected outputs unchanged.

The inner join's tests are those of its newest version (with ValueJoinerWithStreamAndMappedKey
and the dropped-records metric); the left join's those of its JUnit 5 version. Kafka Streams
4.x's join processor (KStreamGlobalKTableJoinProcessor) lets a left join's record with a None
mapped key through, joined with None (``leftJoin && mappedKey == null && value != null``): the
left join's ``shouldJoinOnNullKeyMapperValues`` is the Java test of the versions that had this
behaviour, where the JUnit 5 version expects nothing. The last left join test (a None stream
value is dropped) follows the processor's code, not a Java test.

Kafka Streams' MockApiProcessor captures (key, value, timestamp): here the join is written to a
topic and read back. The stream topic's timestamps advance by 1 ms per record from 0, as the
Java test's ``createInputTopic(..., Instant.ofEpochMilli(0L), Duration.ofMillis(1L))``.
Integer keys go through ``Serdes.long()`` (no Integer serde here). ``TOSTRING_JOINER`` writes
Java's ``null`` for a missing table value. Kafka Streams' ``dropped-records-total`` is the
task metric ``dropped_records``.
"""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.serdes import Serdes

STREAM_TOPIC = "streamTopic"
GLOBAL_TABLE_TOPIC = "globalTableTopic"
EXPECTED_KEYS = [0, 1, 2, 3]
EMPTY: list[tuple] = []


def tostring_joiner(value1, value2) -> str:
    """MockValueJoiner.TOSTRING_JOINER: ``value1 + "+" + value2``, Java's null as "null"."""
    return f"{value1}+{'null' if value2 is None else value2}"


def key_mapper(key, value):
    # Value is comma delimited. If second token is present, it's the key to the global ktable.
    # If not present, use null to indicate no match.
    if value is None:
        return None  # (the mapper of initWithStreamAndMappedKeyJoiner)
    tokens = value.split(",")
    return tokens[1] if len(tokens) > 1 else None


class Harness:
    """The Java test's fixture: the topology, the driver, its input topics and the captured
    join results."""

    def __init__(self, left: bool, joiner=tostring_joiner, name: str | None = None) -> None:
        self.builder = StreamsBuilder()
        stream = self.builder.stream(STREAM_TOPIC, Serdes.long(), Serdes.string())
        table = self.builder.global_table(GLOBAL_TABLE_TOPIC, Serdes.string(), Serdes.string())
        join = stream.left_join if left else stream.join
        join(table, key_mapper, joiner, name=name).to("output", Serdes.long(), Serdes.string())
        self.topology = self.builder.build()
        self.driver = TopologyTestDriver(self.topology, {"application.id": "global-join"})
        self.stream = self.driver.create_input_topic(STREAM_TOPIC, Serdes.long(), Serdes.string())
        self.table = self.driver.create_input_topic(GLOBAL_TABLE_TOPIC, Serdes.string(),
                                                    Serdes.string())  # fmt: skip
        self.output = self.driver.create_output_topic("output", Serdes.long(), Serdes.string())
        self.stream_time = 0  # auto-advanced: 0, then +1 ms per stream record

    def pipe_stream(self, key, value) -> None:
        self.stream.pipe_input(key, value, timestamp=self.stream_time)
        self.stream_time += 1

    def push_to_stream(self, count: int, prefix: str, foreign_key: bool, null_key: bool) -> None:
        for i in range(count):
            value = prefix + str(EXPECTED_KEYS[i])
            if foreign_key:
                value = value + ",FKey" + str(EXPECTED_KEYS[i])
            key = None if null_key and i == 0 else EXPECTED_KEYS[i]
            self.pipe_stream(key, value)

    def push_to_global_table(self, count: int, prefix: str) -> None:
        for i in range(count):
            self.table.pipe_input(f"FKey{EXPECTED_KEYS[i]}", prefix + str(EXPECTED_KEYS[i]),
                                  timestamp=0)  # fmt: skip

    def push_null_value_to_global_table(self, count: int) -> None:
        for i in range(count):
            self.table.pipe_input(f"FKey{EXPECTED_KEYS[i]}", None, timestamp=0)

    def check_and_clear_process_result(self, *expected: tuple) -> None:
        got = [(r.key, r.value, r.timestamp) for r in self.output.read_records_to_list()]
        assert got == list(expected)

    def dropped_records(self) -> int:
        return self.driver.metrics().get("dropped_records", 0)


@pytest.fixture
def inner():
    harness = Harness(left=False)
    yield harness
    harness.driver.close()


@pytest.fixture
def left():
    harness = Harness(left=True)
    yield harness
    harness.driver.close()


def _assert_not_copartitioned(topology) -> None:
    """Kafka Streams: ``copartitionGroups()`` is empty. Here: the join reads no repartition
    topic, and the global table's topic is no sub-topology's source (it makes no tasks)."""
    assert topology.repartition_topics("global-join") == []
    assert topology.source_topics("global-join") == [STREAM_TOPIC]
    assert topology.subtopology_of_topic(GLOBAL_TABLE_TOPIC, "global-join") is None


# KStreamGlobalKTableJoinTest ------------------------------------------------------------------


def test_join_should_not_require_copartitioning(inner):
    _assert_not_copartitioned(inner.topology)


def test_join_should_not_join_with_empty_global_table_on_stream_updates(inner):
    # push two items to the primary stream. the globalTable is empty
    inner.push_to_stream(2, "X", True, False)
    inner.check_and_clear_process_result(*EMPTY)


def test_join_should_not_join_on_global_table_updates(inner):
    # push two items to the primary stream. the globalTable is empty
    inner.push_to_stream(2, "X", True, False)
    inner.check_and_clear_process_result(*EMPTY)
    # push two items to the globalTable. this should not produce any item.
    inner.push_to_global_table(2, "Y")
    inner.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce two items.
    inner.push_to_stream(4, "X", True, False)
    inner.check_and_clear_process_result((0, "X0,FKey0+Y0", 2), (1, "X1,FKey1+Y1", 3))
    # push all items to the globalTable. this should not produce any item
    inner.push_to_global_table(4, "YY")
    inner.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce four items.
    inner.push_to_stream(4, "X", True, False)
    inner.check_and_clear_process_result(
        (0, "X0,FKey0+YY0", 6), (1, "X1,FKey1+YY1", 7), (2, "X2,FKey2+YY2", 8),
        (3, "X3,FKey3+YY3", 9),
    )  # fmt: skip
    # push all items to the globalTable. this should not produce any item
    inner.push_to_global_table(4, "YYY")
    inner.check_and_clear_process_result(*EMPTY)


def test_join_should_join_only_if_match_found_on_stream_updates(inner):
    # push two items to the globalTable. this should not produce any item.
    inner.push_to_global_table(2, "Y")
    inner.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce two items.
    inner.push_to_stream(4, "X", True, False)
    inner.check_and_clear_process_result((0, "X0,FKey0+Y0", 0), (1, "X1,FKey1+Y1", 1))


def test_join_should_clear_global_table_entry_on_null_value_updates(inner):
    # push all four items to the globalTable. this should not produce any item.
    inner.push_to_global_table(4, "Y")
    inner.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce four items.
    inner.push_to_stream(4, "X", True, False)
    inner.check_and_clear_process_result(
        (0, "X0,FKey0+Y0", 0), (1, "X1,FKey1+Y1", 1), (2, "X2,FKey2+Y2", 2),
        (3, "X3,FKey3+Y3", 3),
    )  # fmt: skip
    # push two items with null to the globalTable as deletes. this should not produce any item.
    inner.push_null_value_to_global_table(2)
    inner.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce two items.
    inner.push_to_stream(4, "XX", True, False)
    inner.check_and_clear_process_result((2, "XX2,FKey2+Y2", 6), (3, "XX3,FKey3+Y3", 7))


def test_join_should_not_join_on_null_key_mapper_values(inner):
    # push all items to the globalTable. this should not produce any item
    inner.push_to_global_table(4, "Y")
    inner.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream with no foreign key, resulting in null
    # keyMapper values. this should not produce any item.
    inner.push_to_stream(4, "XXX", False, False)
    inner.check_and_clear_process_result(*EMPTY)
    assert inner.dropped_records() == 4


def test_join_should_not_join_on_null_key_mapper_values_with_null_keys(inner):
    inner.push_to_global_table(4, "Y")
    inner.check_and_clear_process_result(*EMPTY)
    inner.push_to_stream(4, "XXX", False, True)
    inner.check_and_clear_process_result(*EMPTY)
    assert inner.dropped_records() == 4


def test_join_should_join_on_null_key(inner):
    # push two items to the globalTable. this should not produce any item.
    inner.push_to_global_table(2, "Y")
    inner.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce two items.
    inner.push_to_stream(4, "X", True, True)
    inner.check_and_clear_process_result((None, "X0,FKey0+Y0", 0), (1, "X1,FKey1+Y1", 1))
    assert inner.dropped_records() == 0


def _stream_and_mapped_key_joiner(stream_key, mapped_key, stream_value, table_value) -> str:
    return f"{mapped_key}|{stream_key}|{stream_value}|{table_value}"


def test_join_should_pass_mapped_key_and_stream_key_to_joiner():
    harness = Harness(left=False, joiner=_stream_and_mapped_key_joiner)
    with harness.driver:
        harness.push_to_global_table(2, "Y")
        harness.push_to_stream(2, "X", True, False)
        harness.check_and_clear_process_result(
            (0, "FKey0|0|X0,FKey0|Y0", 0), (1, "FKey1|1|X1,FKey1|Y1", 1)
        )


def test_join_should_drop_record_and_record_dropped_sensor_when_stream_value_is_null():
    harness = Harness(left=False, joiner=_stream_and_mapped_key_joiner)
    with harness.driver:
        harness.push_to_global_table(2, "Y")
        harness.pipe_stream(0, None)
        harness.pipe_stream(1, "X1,FKey1")
        harness.check_and_clear_process_result((1, "FKey1|1|X1,FKey1|Y1", 1))
        assert harness.dropped_records() == 1


def test_join_should_name_processor_based_on_named_parameter():
    b = StreamsBuilder()
    stream = b.stream(STREAM_TOPIC, Serdes.long(), Serdes.string())
    table = b.global_table(GLOBAL_TABLE_TOPIC, Serdes.string(), Serdes.string())
    stream.join(table, lambda k, v: v, lambda stream_key, mapped_key, v1, v2: v1 + v2,
                name="join-table")  # fmt: skip
    assert "Processor: join-table" in b.build().describe()


def test_join_should_pass_stream_key_as_read_only_key_to_deprecated_joiner():
    """The ValueJoinerWithKey overload: the joiner gets the stream record's key."""
    harness = Harness(left=False, joiner=lambda key, value, table_value: f"{key}|{value}|"
                      f"{table_value}")  # fmt: skip
    with harness.driver:
        harness.push_to_global_table(2, "Y")
        harness.push_to_stream(2, "X", True, False)
        harness.check_and_clear_process_result((0, "0|X0,FKey0|Y0", 0), (1, "1|X1,FKey1|Y1", 1))


# KStreamGlobalKTableLeftJoinTest --------------------------------------------------------------


def test_left_join_should_not_require_copartitioning(left):
    _assert_not_copartitioned(left.topology)


def test_left_join_should_not_join_with_empty_global_table_on_stream_updates(left):
    # push two items to the primary stream. the globalTable is empty
    left.push_to_stream(2, "X", True, False)
    left.check_and_clear_process_result((0, "X0,FKey0+null", 0), (1, "X1,FKey1+null", 1))


def test_left_join_should_not_join_on_global_table_updates(left):
    # push two items to the primary stream. the globalTable is empty
    left.push_to_stream(2, "X", True, False)
    left.check_and_clear_process_result((0, "X0,FKey0+null", 0), (1, "X1,FKey1+null", 1))
    # push two items to the globalTable. this should not produce any item.
    left.push_to_global_table(2, "Y")
    left.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce four items.
    left.push_to_stream(4, "X", True, False)
    left.check_and_clear_process_result(
        (0, "X0,FKey0+Y0", 2), (1, "X1,FKey1+Y1", 3), (2, "X2,FKey2+null", 4),
        (3, "X3,FKey3+null", 5),
    )  # fmt: skip
    # push all items to the globalTable. this should not produce any item
    left.push_to_global_table(4, "YY")
    left.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce four items.
    left.push_to_stream(4, "X", True, False)
    left.check_and_clear_process_result(
        (0, "X0,FKey0+YY0", 6), (1, "X1,FKey1+YY1", 7), (2, "X2,FKey2+YY2", 8),
        (3, "X3,FKey3+YY3", 9),
    )  # fmt: skip
    # push all items to the globalTable. this should not produce any item
    left.push_to_global_table(4, "YYY")
    left.check_and_clear_process_result(*EMPTY)


def test_left_join_should_join_regardless_if_match_found_on_stream_updates(left):
    # push two items to the globalTable. this should not produce any item.
    left.push_to_global_table(2, "Y")
    left.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce four items.
    left.push_to_stream(4, "X", True, False)
    left.check_and_clear_process_result(
        (0, "X0,FKey0+Y0", 0), (1, "X1,FKey1+Y1", 1), (2, "X2,FKey2+null", 2),
        (3, "X3,FKey3+null", 3),
    )  # fmt: skip


def test_left_join_should_clear_global_table_entry_on_null_value_updates(left):
    # push all four items to the globalTable. this should not produce any item.
    left.push_to_global_table(4, "Y")
    left.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce four items.
    left.push_to_stream(4, "X", True, False)
    left.check_and_clear_process_result(
        (0, "X0,FKey0+Y0", 0), (1, "X1,FKey1+Y1", 1), (2, "X2,FKey2+Y2", 2),
        (3, "X3,FKey3+Y3", 3),
    )  # fmt: skip
    # push two items with null to the globalTable as deletes. this should not produce any item.
    left.push_null_value_to_global_table(2)
    left.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce four items.
    left.push_to_stream(4, "XX", True, False)
    left.check_and_clear_process_result(
        (0, "XX0,FKey0+null", 4), (1, "XX1,FKey1+null", 5), (2, "XX2,FKey2+Y2", 6),
        (3, "XX3,FKey3+Y3", 7),
    )  # fmt: skip


def test_left_join_should_join_on_null_key_mapper_values(left):
    """Kafka Streams 4.x: a None mapped key joins None (the JUnit 5 version of the Java
    test, shouldNotJoinOnNullKeyMapperValues, expected nothing)."""
    # push all items to the globalTable. this should not produce any item
    left.push_to_global_table(4, "Y")
    left.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream with no foreign key, resulting in null
    # keyMapper values. this should produce four items.
    left.push_to_stream(4, "XXX", False, False)
    left.check_and_clear_process_result(
        (0, "XXX0+null", 0), (1, "XXX1+null", 1), (2, "XXX2+null", 2), (3, "XXX3+null", 3)
    )
    assert left.dropped_records() == 0


def test_left_join_should_join_on_null_key_with_non_null_key_mapper_values(left):
    # push four items to the globalTable. this should not produce any item.
    left.push_to_global_table(4, "Y")
    left.check_and_clear_process_result(*EMPTY)
    # push all four items to the primary stream. this should produce four items.
    left.push_to_stream(4, "X", True, True)
    left.check_and_clear_process_result(
        (None, "X0,FKey0+Y0", 0), (1, "X1,FKey1+Y1", 1), (2, "X2,FKey2+Y2", 2),
        (3, "X3,FKey3+Y3", 3),
    )  # fmt: skip


def test_left_join_drops_a_null_stream_value(left):
    """Not a Java test: the processor's ``value == null`` drop, for the left join too."""
    left.push_to_global_table(2, "Y")
    left.pipe_stream(0, None)
    left.pipe_stream(1, "X1,FKey1")
    left.check_and_clear_process_result((1, "X1,FKey1+Y1", 1))
    assert left.dropped_records() == 1
