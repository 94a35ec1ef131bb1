"""Stream-table joins: temporal with a versioned table (KIP-889), latest value otherwise."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streamplatform import StreamsBuilder, TimeWindows, TopologyTestDriver
from streamplatform.serdes import Serdes
from streamplatform.state import Stores


def _topology(versioned: bool, left: bool = False):
    b = StreamsBuilder()
    store = (
        Stores.persistent_versioned_key_value_store("table", timedelta(minutes=1))
        if versioned
        else None
    )
    table = b.table("table", Serdes.string(), Serdes.string(), store=store)
    stream = b.stream("stream", Serdes.string(), Serdes.string())
    joined = (
        stream.left_join(table, lambda s, t: (s, t))
        if left
        else stream.join(table, lambda s, t: (s, t))
    )
    joined.to("out", value_serde=Serdes.json())
    return b.build()


def _run(topology, events):
    """events: ("A" | "B", value, timestamp), A on the stream, B on the table, all key "k"."""
    with TopologyTestDriver(topology, {"application.id": "join"}) as driver:
        topics = {
            "A": driver.create_input_topic("stream", Serdes.string(), Serdes.string()),
            "B": driver.create_input_topic("table", Serdes.string(), Serdes.string()),
        }
        for side, value, timestamp in events:
            topics[side].pipe_input("k", value, timestamp=timestamp)
        out = driver.create_output_topic("out", Serdes.string(), Serdes.json())
        return [tuple(value) for value in out.read_values_to_list()]


def test_kip_889_example_joins_each_record_with_the_version_valid_at_its_time():
    events = [("B", "b0", 0), ("A", "a1", 1), ("B", "b3", 3), ("A", "a4", 4), ("A", "a2", 2)]
    assert _run(_topology(versioned=True), events) == [("a1", "b0"), ("a4", "b3"), ("a2", "b0")]


def test_without_a_versioned_store_the_latest_value_is_joined():
    events = [("B", "b0", 0), ("A", "a1", 1), ("B", "b3", 3), ("A", "a4", 4), ("A", "a2", 2)]
    assert _run(_topology(versioned=False), events) == [("a1", "b0"), ("a4", "b3"), ("a2", "b3")]


def test_a_late_table_correction_applies_to_later_stream_records_at_its_time():
    events = [("B", "b0", 0), ("B", "b5", 5), ("B", "b2", 2), ("A", "a3", 3), ("A", "a1", 1)]
    assert _run(_topology(versioned=True), events) == [("a3", "b2"), ("a1", "b0")]


@pytest.mark.parametrize("versioned", [True, False])
def test_a_table_tombstone_ends_the_match(versioned):
    events = [("B", "b0", 0), ("A", "a1", 1), ("B", None, 2), ("A", "a3", 3)]
    assert _run(_topology(versioned), events) == [("a1", "b0")]
    left = _run(_topology(versioned, left=True), events)
    assert left == [("a1", "b0"), ("a3", None)]


def test_versioned_tombstone_does_not_hide_older_versions_for_older_records():
    events = [("B", "b0", 0), ("B", None, 5), ("A", "a6", 6), ("A", "a4", 4)]
    assert _run(_topology(versioned=True), events) == [("a4", "b0")]


def test_left_join_with_no_table_value_joins_none():
    assert _run(_topology(versioned=True, left=True), [("A", "a1", 1)]) == [("a1", None)]


def test_stream_and_table_share_one_subtopology():
    topology = _topology(versioned=True)
    assert len(topology.subtopologies) == 1
    assert topology.subtopologies[0].stores == ("table",)
    assert [str(t) for t in topology.task_ids({"stream": 3, "table": 3}, "app")] == [
        "0_0",
        "0_1",
        "0_2",
    ]


@pytest.mark.parametrize("left", [False, True])
def test_a_task_counts_joins_misses_and_its_stream_time(left):
    """The numbers the Dagster asset reports as join_misses and event_time_watermark."""
    events = [("A", "a1", 1_000), ("B", "b0", 500), ("A", "a2", 2_000), ("A", "a0", 400)]
    with TopologyTestDriver(_topology(versioned=True, left=left), {"application.id": "j"}) as d:
        topics = {
            "A": d.create_input_topic("stream", Serdes.string(), Serdes.string()),
            "B": d.create_input_topic("table", Serdes.string(), Serdes.string()),
        }
        for side, value, timestamp in events:
            topics[side].pipe_input("k", value, timestamp=timestamp)
        metrics = d.metrics()
    # a1 (before any version) and a0 (before b0's time) miss; a2 joins b0.
    assert (metrics["join_joined"], metrics["join_misses"]) == (1, 2)
    assert metrics["stream_time_max"] == 2_000  # the largest timestamp read, not the last
    assert metrics["records_out"] == (3 if left else 1)


@pytest.mark.parametrize("commit_every", [1, None])
def test_a_stream_joins_an_aggregations_table_through_its_record_cache(commit_every):
    """The table of an aggregation (spend per user): each purchase joins the user's total as
    it is at that moment, also while the total is only in the record cache (no commit yet),
    as Kafka Streams' join reads through the caching store."""
    b = StreamsBuilder()
    spend = b.stream("spend", Serdes.string(), Serdes.long())
    totals = spend.group_by_key().reduce(lambda total, amount: total + amount)
    purchases = b.stream("purchases", Serdes.string(), Serdes.string())
    purchases.left_join(totals, lambda item, total: f"{item}@{total}").to("out")
    with TopologyTestDriver(b.build(), {"application.id": "agg-join"},
                            commit_every=commit_every) as driver:  # fmt: skip
        spent = driver.create_input_topic("spend", Serdes.string(), Serdes.long())
        bought = driver.create_input_topic("purchases", Serdes.string(), Serdes.string())
        bought.pipe_input("u1", "hat", timestamp=1)
        spent.pipe_input("u1", 5, timestamp=2)
        spent.pipe_input("u1", 7, timestamp=3)
        bought.pipe_input("u1", "cap", timestamp=4)
        spent.pipe_input("u2", 1, timestamp=5)
        bought.pipe_input("u2", "pen", timestamp=6)
        out = driver.create_output_topic("out", Serdes.string(), Serdes.string())
        assert out.read_values_to_list() == ["hat@None", "cap@12", "pen@1"]


def test_a_windowed_table_cannot_be_joined_by_a_stream():
    b = StreamsBuilder()
    counts = b.stream("views").group_by_key().windowed_by(TimeWindows.of_size_with_no_grace(10))
    with pytest.raises(ValueError, match="a windowed table's keys are"):
        b.stream("clicks").join(counts.count(), lambda click, count: count)
