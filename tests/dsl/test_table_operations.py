"""Table-table joins and grouping a table, on small hand-checked inputs (the differential
tests against Kafka Streams are tests/reference/test_tables_vs_kafka_streams.py)."""

from __future__ import annotations

import pytest

from streamplatform import KGroupedTable, StreamsBuilder, TopologyTestDriver
from streamplatform.dsl.grouped_table import Change, ChangeSerde
from streamplatform.serdes import Serdes, SerializationError
from streamplatform.state import Stores

S = Serdes.string()


def _joined(left, right) -> str:
    return f"{left}+{right}"


def _join_topology(kind: str):
    b = StreamsBuilder()
    left = b.table("left", S, S)
    right = b.table("right", S, S)
    getattr(left, kind)(right, _joined).to_stream().to("out", S, S)
    return b.build()


def _run(topology, inputs, **driver_options) -> list[tuple]:
    """``inputs``: (topic, key, value, timestamp); the records of "out" as tuples."""
    with TopologyTestDriver(topology, {"application.id": "t"}, **driver_options) as driver:
        topics = {}
        for topic, key, value, timestamp in inputs:
            if topic not in topics:
                topics[topic] = driver.create_input_topic(topic, S, S)
            topics[topic].pipe_input(key, value, timestamp=timestamp)
        driver.commit()
        out = driver.create_output_topic("out", S, S).read_records_to_list()
    return [(r.key, r.value, r.timestamp) for r in out]


# left a=1 @10, right a=x @5, left a=2 @3 (out of order), right a deleted @8,
# left b deleted @9 (never had a value), left a deleted @11.
JOIN_INPUT = [("left", "a", "1", 10), ("right", "a", "x", 5), ("left", "a", "2", 3),
              ("right", "a", None, 8), ("left", "b", None, 9), ("left", "a", None, 11)]  # fmt: skip


def test_inner_join_forwards_only_keys_both_sides_have_with_the_larger_timestamp():
    assert _run(_join_topology("join"), JOIN_INPUT) == [
        ("a", "1+x", 10),  # the right side arrives: max(5, 10)
        ("a", "2+x", 5),  # the left side updates: max(3, 5)
        ("a", None, 8),  # the right side is deleted: a tombstone
    ]  # the left deletions find no right value: nothing


def test_left_join_forwards_every_left_key_and_a_tombstone_when_it_goes():
    assert _run(_join_topology("left_join"), JOIN_INPUT) == [
        ("a", "1+None", 10),
        ("a", "1+x", 10),
        ("a", "2+x", 5),
        ("a", "2+None", 8),  # a right tombstone updates the left key, never deletes it
        ("a", None, 11),  # b had no value: its tombstone forwards nothing
    ]


def test_outer_join_forwards_keys_of_either_side():
    assert _run(_join_topology("outer_join"), JOIN_INPUT) == [
        ("a", "1+None", 10),
        ("a", "1+x", 10),
        ("a", "2+x", 5),
        ("a", "2+None", 8),
        ("a", None, 11),
    ]
    only_right = [("right", "c", "y", 4), ("right", "c", None, 6)]
    assert _run(_join_topology("outer_join"), only_right) == [("c", "None+y", 4), ("c", None, 6)]


def test_a_derived_table_can_be_joined_and_the_result_has_no_store_of_its_own():
    b = StreamsBuilder()
    left = b.table("left", S, S).filter(lambda key, value: value != "skip")
    right = b.table("right", S, S).map_values(str.upper)
    joined = left.left_join(right, _joined, value_serde=S)
    assert not joined._materialized
    joined.to_stream().to("out", S, S)
    inputs = [("right", "a", "x", 1), ("left", "a", "skip", 2), ("left", "a", "1", 3),
              ("left", "a", "skip", 4)]  # fmt: skip
    # the filtered-out value of a key with no value forwards nothing (Kafka Streams' filter
    # sends old values for a left join); once a passed, filtering it out deletes it
    assert _run(b.build(), inputs) == [("a", "1+X", 3), ("a", None, 4)]


def _count_topology():
    b = StreamsBuilder()
    table = b.table("left", S, S)
    counts = table.group_by(lambda key, value: (value, key)).count()
    counts.to_stream().to("out", S, Serdes.long())
    return b.build()


def _counts(inputs, **driver_options) -> list[tuple]:
    with TopologyTestDriver(_count_topology(), {"application.id": "t"}, **driver_options) as d:
        source = d.create_input_topic("left", S, S)
        for key, value, timestamp in inputs:
            source.pipe_input(key, value, timestamp=timestamp)
        d.commit()
        out = d.create_output_topic("out", S, Serdes.long()).read_records_to_list()
    return [(r.key, r.value, r.timestamp) for r in out]


def test_a_key_moving_between_groups_is_subtracted_from_one_then_added_to_the_other():
    inputs = [("k1", "A", 1), ("k2", "A", 2), ("k1", "B", 5), ("k1", "B", 3), ("k1", None, 7)]
    assert _counts(inputs) == [
        ("A", 1, 1),
        ("A", 2, 2),
        ("A", 1, 5),  # k1 leaves A (timestamp: max of the update's and A's)...
        ("B", 1, 5),  # ... then joins B
        ("B", 1, 5),  # the same group again: one record, subtracted and added
        ("B", 0, 7),  # k1 deleted: B forwards 0, not a tombstone
    ]


def test_the_record_cache_forwards_each_groups_last_count_at_the_commit():
    inputs = [("k1", "A", 1), ("k2", "A", 2), ("k1", "B", 5)]
    assert _counts(inputs, commit_every=None) == [("A", 1, 5), ("B", 1, 5)]


def test_reduce_and_aggregate_subtract_then_add():
    b = StreamsBuilder()
    table = b.table("left", S, S)
    grouped = table.group_by(lambda key, value: (key[0], value))
    assert isinstance(grouped, KGroupedTable)
    sums = grouped.reduce(lambda agg, value: str(int(agg) + int(value)),
                          lambda agg, value: str(int(agg) - int(value)))  # fmt: skip
    log = grouped.aggregate(list, lambda key, value, agg: [*agg, f"+{value}"],
                            lambda key, value, agg: [*agg, f"-{value}"])  # fmt: skip
    sums.to_stream().to("out", S, S)
    log.to_stream().to("log", S, Serdes.json())
    with TopologyTestDriver(b.build(), {"application.id": "t"}) as driver:
        source = driver.create_input_topic("left", S, S)
        for key, value in [("x1", "3"), ("x2", "4"), ("x1", "10"), ("x2", None)]:
            source.pipe_input(key, value, timestamp=0)
        assert driver.create_output_topic("out", S, S).read_values_to_list() == [
            "3", "7", "14", "10"]  # fmt: skip
        assert driver.create_output_topic("log", S, Serdes.json()).read_values_to_list()[-1] == [
            "+3", "+4", "-3", "+10", "-4"]  # fmt: skip


def test_the_change_serde_keeps_both_values_and_empty_ones():
    serde = ChangeSerde(S)
    for change in (Change("a", None), Change(None, "b"), Change("", ""), Change("new", "old")):
        assert serde.deserialize(serde.serialize(change)) == change
    assert serde.serialize(None) is None
    with pytest.raises(SerializationError):
        serde.deserialize(b"\x07")


def test_invalid_joins_and_groupings_are_refused():
    b = StreamsBuilder()
    table = b.table("left", S, S)
    with pytest.raises(ValueError, match="itself"):
        table.join(table, _joined)
    with pytest.raises(ValueError, match="another StreamsBuilder"):
        table.join(StreamsBuilder().table("right", S, S), _joined)
    with pytest.raises(TypeError, match="KTable"):
        table.join(b.stream("s", S, S), _joined)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="joiner"):
        table.join(b.table("right", S, S), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="selector"):
        table.group_by("value")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="subtractor"):
        table.group_by(lambda key, value: (value, key)).reduce(lambda a, v: a, None)  # type: ignore[arg-type]
    versioned = b.table("rates", S, S,
                        store=Stores.persistent_versioned_key_value_store("rates", 1_000))  # fmt: skip
    # A versioned table joins (KIP-914: tests/reference/test_versioned_table_joins_ported.py);
    # grouping it is still refused.
    table.join(versioned.filter(lambda key, value: True), _joined)
    with pytest.raises(ValueError, match="versioned"):
        versioned.group_by(lambda key, value: (value, key))
