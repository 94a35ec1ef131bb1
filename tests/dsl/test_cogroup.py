"""cogroup (KIP-150) through the test driver. Kafka Streams' own CogroupedKStreamImplTest
(apache/kafka streams/src/test/java/org/apache/kafka/streams/kstream/internals/) is ported with
its inputs and expected outputs unchanged: shouldCoGroupStreamsWithDifferentInputTypes and
testCogroupKeyMixedAggregators (MockAggregator's TOSTRING_ADDER/REMOVER, MockInitializer's
STRING_INIT "0", the test's STRSUM/SUM aggregators)."""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder, TimeWindows, TopologyTestDriver
from streamplatform.serdes import Serdes

CONFIG = {"application.id": "cogroup"}


def _records(out) -> list[tuple]:
    return [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]


def test_cogroup_streams_with_different_input_types():
    b = StreamsBuilder()
    one = b.stream("one", Serdes.string(), Serdes.string()).group_by_key()
    two = b.stream("two", Serdes.string(), Serdes.long()).group_by_key()
    customers = (
        one.cogroup(lambda key, value, aggregate: aggregate + int(value))  # STRSUM_AGGREGATOR
        .cogroup(two, lambda key, value, aggregate: aggregate + value)  # SUM_AGGREGATOR
        .aggregate(lambda: 0, value_serde=Serdes.long(), name="store1")
    )
    customers.to_stream().to("output", value_serde=Serdes.long())
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        first = driver.create_input_topic("one", Serdes.string(), Serdes.string())
        second = driver.create_input_topic("two", Serdes.string(), Serdes.long())
        for key, value, timestamp in [("k1", "1", 0), ("k2", "1", 1), ("k1", "1", 10),
                                      ("k2", "1", 100)]:  # fmt: skip
            first.pipe_input(key, value, timestamp=timestamp)
        for key, value, timestamp in [("k2", 2, 100), ("k2", 2, 200), ("k1", 2, 1), ("k2", 2, 500),
                                      ("k1", 2, 500), ("k2", 3, 500), ("k3", 2, 500),
                                      ("k2", 2, 100)]:  # fmt: skip
            second.pipe_input(key, value, timestamp=timestamp)
        out = driver.create_output_topic("output", Serdes.string(), Serdes.long())
        assert _records(out)[:10] == [
            ("k1", 1, 0), ("k2", 1, 1), ("k1", 2, 10), ("k2", 2, 100), ("k2", 4, 100),
            ("k2", 6, 200), ("k1", 4, 10), ("k2", 8, 500), ("k1", 6, 500), ("k2", 11, 500),
        ]  # fmt: skip


def test_cogroup_key_mixed_aggregators():
    b = StreamsBuilder()
    one = b.stream("one", Serdes.string(), Serdes.string()).group_by_key()
    two = b.stream("two", Serdes.string(), Serdes.string()).group_by_key()
    customers = (
        one.cogroup(lambda key, value, aggregate: f"{aggregate}-{value}")  # TOSTRING_REMOVER
        .cogroup(two, lambda key, value, aggregate: f"{aggregate}+{value}")  # TOSTRING_ADDER
        .aggregate(lambda: "0", value_serde=Serdes.string(), name="store1")  # STRING_INIT
    )
    customers.to_stream().to("output")
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        first = driver.create_input_topic("one", Serdes.string(), Serdes.string())
        second = driver.create_input_topic("two", Serdes.string(), Serdes.string())
        for key, value, timestamp in [("k1", "1", 0), ("k2", "1", 1), ("k1", "1", 10),
                                      ("k2", "1", 100)]:  # fmt: skip
            first.pipe_input(key, value, timestamp=timestamp)
        for key, value, timestamp in [("k1", "2", 500), ("k2", "2", 500), ("k1", "2", 500),
                                      ("k2", "2", 100)]:  # fmt: skip
            second.pipe_input(key, value, timestamp=timestamp)
        out = driver.create_output_topic("output", Serdes.string(), Serdes.string())
        assert _records(out) == [
            ("k1", "0-1", 0), ("k2", "0-1", 1), ("k1", "0-1-1", 10), ("k2", "0-1-1", 100),
            ("k1", "0-1-1+2", 500), ("k2", "0-1-1+2", 500), ("k1", "0-1-1+2+2", 500),
            ("k2", "0-1-1+2+2", 500),
        ]  # fmt: skip
        assert driver.get_state_store("store1-STATE-STORE") is not None


def test_a_rekeyed_stream_is_repartitioned_before_the_shared_aggregate():
    b = StreamsBuilder()
    orders = b.stream("orders", Serdes.string(), Serdes.json())
    by_customer = orders.group_by(lambda order_id, order: order["customer"],
                                  key_serde=Serdes.string())  # fmt: skip
    refunds = b.stream("refunds", Serdes.string(), Serdes.long()).group_by_key()
    totals = (
        by_customer.cogroup(lambda key, order, total: total + order["amount"])
        .cogroup(refunds, lambda key, refund, total: total - refund)
        .aggregate(lambda: 0, value_serde=Serdes.long(), name="totals")
    )
    totals.to_stream().to("totals", value_serde=Serdes.long())
    topology = b.build()
    assert topology.repartition_topics("cogroup") == ["cogroup-totals-0-repartition"]
    with TopologyTestDriver(topology, CONFIG) as driver:
        orders_in = driver.create_input_topic("orders", Serdes.string(), Serdes.json())
        refunds_in = driver.create_input_topic("refunds", Serdes.string(), Serdes.long())
        orders_in.pipe_input("o1", {"customer": "c1", "amount": 30}, timestamp=1)
        orders_in.pipe_input("o2", {"customer": "c1", "amount": 12}, timestamp=2)
        refunds_in.pipe_input("c1", 5, timestamp=3)
        refunds_in.pipe_input("c1", None, timestamp=4)  # dropped, as aggregate drops it
        out = driver.create_output_topic("totals", Serdes.string(), Serdes.long())
        assert out.read_key_values_to_list() == [("c1", 30), ("c1", 42), ("c1", 37)]
        assert driver.metrics()["dropped_records"] == 1


def test_a_cogrouped_windowed_aggregate_keeps_each_window_apart():
    b = StreamsBuilder()
    one = b.stream("one", Serdes.string(), Serdes.long()).group_by_key()
    two = b.stream("two", Serdes.string(), Serdes.long()).group_by_key()
    windows = TimeWindows.of_size_and_grace(10, 100)
    per_window = (
        one.cogroup(lambda key, value, aggregate: aggregate + value)
        .cogroup(two, lambda key, value, aggregate: aggregate - value)
        .windowed_by(windows)
        .aggregate(lambda: 0, value_serde=Serdes.long(), name="per-window")
    )
    per_window.to_stream().map(lambda windowed, total: (
        f"{windowed.key}@{windowed.window.start}", total)).to(
        "out", key_serde=Serdes.string(), value_serde=Serdes.long())  # fmt: skip
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        first = driver.create_input_topic("one", Serdes.string(), Serdes.long())
        second = driver.create_input_topic("two", Serdes.string(), Serdes.long())
        first.pipe_input("a", 5, timestamp=1)
        second.pipe_input("a", 2, timestamp=3)
        first.pipe_input("a", 7, timestamp=12)
        out = driver.create_output_topic("out", Serdes.string(), Serdes.long())
        assert out.read_key_values_to_list() == [("a@0", 5), ("a@0", 3), ("a@10", 7)]


def test_a_cogrouped_session_aggregate_needs_a_merger():
    from streamplatform import SessionWindows

    b = StreamsBuilder()
    one = b.stream("one", Serdes.string(), Serdes.long()).group_by_key()
    cogrouped = one.cogroup(lambda key, value, aggregate: aggregate + value)
    with pytest.raises(ValueError, match="needs a merger"):
        cogrouped.windowed_by(SessionWindows.of_inactivity_gap_and_grace(10, 0)).aggregate(
            lambda: 0
        )
