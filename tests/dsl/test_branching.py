"""merge, split/branch and repartition(), through the test driver."""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.serdes import Serdes


def test_split_sends_each_record_to_its_first_matching_branch_and_merge_joins_streams():
    b = StreamsBuilder()
    orders = b.stream("orders", Serdes.string(), Serdes.long())
    refunds = b.stream("refunds", Serdes.string(), Serdes.long())
    branches = (
        orders.split("order-")
        .branch(lambda key, amount: amount >= 100, "big")
        .branch(lambda key, amount: amount >= 10)  # named by its position: "order-2"
        .default_branch()  # "order-0"
    )
    assert sorted(branches) == ["order-0", "order-2", "order-big"]
    branches["order-big"].merge(refunds.map_values(lambda amount: -amount)).to("review")
    branches["order-2"].to("normal")
    branches["order-0"].to("small")
    with TopologyTestDriver(b.build(), {"application.id": "split"}) as driver:
        orders_in = driver.create_input_topic("orders", Serdes.string(), Serdes.long())
        refunds_in = driver.create_input_topic("refunds", Serdes.string(), Serdes.long())
        for key, amount in [("a", 500), ("b", 50), ("c", 5), ("d", 100)]:
            orders_in.pipe_input(key, amount)
        refunds_in.pipe_input("a", 20)

        def out(topic):
            return driver.create_output_topic(topic, Serdes.string(), Serdes.long()) \
                .read_key_values_to_list()  # fmt: skip

        assert out("review") == [("a", 500), ("d", 100), ("a", -20)]
        assert out("normal") == [("b", 50)]
        assert out("small") == [("c", 5)]


def test_without_a_default_branch_unmatched_records_go_nowhere():
    b = StreamsBuilder()
    branches = (
        b.stream("in", Serdes.string(), Serdes.long())
        .split()
        .branch(lambda key, value: value > 0, "positive")
        .no_default_branch()
    )
    branches["positive"].to("out")
    with TopologyTestDriver(b.build(), {"application.id": "split"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.long())
        source.pipe_input("a", -1)
        source.pipe_input("b", 2)
        assert driver.create_output_topic("out", Serdes.string(), Serdes.long()) \
            .read_key_values_to_list() == [("b", 2)]  # fmt: skip


def test_repartition_goes_through_a_topic_of_the_application_by_key():
    b = StreamsBuilder()
    (b.stream("in", Serdes.string(), Serdes.long()).select_key(lambda key, value: f"k{value % 2}")
     .repartition("by-parity").group_by_key().count().to_stream().to("counts"))  # fmt: skip
    topology = b.build()
    assert "<application.id>-by-parity-repartition" in topology.describe()
    assert len(topology.subtopologies) == 2  # group_by_key after it: no second repartition
    with TopologyTestDriver(topology, {"application.id": "rep"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.long())
        for value in [1, 2, 3]:
            source.pipe_input("x", value)
        assert driver.create_output_topic("counts", Serdes.string(), Serdes.long()) \
            .read_key_values_to_list() == [("k1", 1), ("k0", 1), ("k1", 2)]  # fmt: skip


def test_merging_streams_of_two_builders_is_refused():
    one, other = StreamsBuilder(), StreamsBuilder()
    with pytest.raises(ValueError, match="another StreamsBuilder"):
        one.stream("a").merge(other.stream("b"))
