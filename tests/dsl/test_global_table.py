"""GlobalKTable: the builder, the topology (no co-partitioning, no changelog), the store's feed
(apply_global_records) and the TopologyTestDriver's global route."""

from __future__ import annotations

import pytest

from streamplatform import GlobalKTable, StreamsBuilder, TopologyTestDriver
from streamplatform.dsl.global_table import GlobalTableSpec
from streamplatform.dsl.naming import CHANGELOG_TOPIC, internal_resources
from streamplatform.records import ConsumedRecord, TopicPartition
from streamplatform.runtime.global_tables import apply_global_records
from streamplatform.serdes import Serdes
from streamplatform.state import Stores

CONFIG = {"application.id": "global"}


def _rates_join(left: bool = False, name: str | None = None):
    """orders (key: order id, value: {"ccy", "amount"}) joined with the global table rates."""
    b = StreamsBuilder()
    orders = b.stream("orders", Serdes.string(), Serdes.json())
    rates = b.global_table("rates", Serdes.string(), Serdes.json(), name=name)
    join = orders.left_join if left else orders.join
    join(rates, lambda key, order: order["ccy"],
         lambda order, rate: {**order, "rate": None if rate is None else rate["rate"]},
         ).to("enriched", Serdes.string(), Serdes.json())  # fmt: skip
    return b, rates


def test_global_table_is_a_store_with_no_changelog_and_no_source():
    b, rates = _rates_join()
    topology = b.build()
    assert isinstance(rates, GlobalKTable)
    assert rates.store_name == rates.queryable_store_name() == "rates-STATE-STORE"
    assert topology.global_tables() == [
        GlobalTableSpec("rates", "rates-STATE-STORE", Serdes.string(), Serdes.json())
    ]
    spec = topology.stores["rates-STATE-STORE"]
    assert spec.global_topic == "rates"
    assert spec.key_serde is Serdes.string() and spec.value_serde is Serdes.json()
    assert topology.source_topics("global") == ["orders"]  # no task reads rates as a stream
    assert topology.subtopology_of_topic("rates", "global") is None
    kinds = {(r.kind, r.name) for r in internal_resources(topology, "global")}
    assert not any(kind == CHANGELOG_TOPIC for kind, _ in kinds)
    assert "Sub-topology: 1 for global store (will not generate tasks)" in topology.describe()


def test_named_store_and_topic_read_once():
    b, rates = _rates_join(name="fx")
    assert rates.store_name == "fx"
    with pytest.raises(ValueError, match="source only once"):
        b.stream("rates")
    with pytest.raises(ValueError, match="source only once"):
        b.global_table("orders")


def test_no_repartition_after_a_key_change_and_no_link_between_sub_topologies():
    """The table is whole in every task: a re-keyed stream joins it as is, and two
    sub-topologies that join one global table stay apart (each has a copy)."""
    b = StreamsBuilder()
    rates = b.global_table("rates", Serdes.string(), Serdes.string())
    a = b.stream("a", Serdes.string(), Serdes.string()).select_key(lambda k, v: v)
    a.join(rates, lambda k, v: k, lambda v, r: r).to("out-a")
    b.stream("b", Serdes.string(), Serdes.string()).left_join(
        rates, lambda k, v: v, lambda v, r: r
    ).to("out-b")
    topology = b.build()
    assert topology.repartition_topics("global") == []
    assert len(topology.subtopologies) == 2
    assert all(s.stores == ("rates-STATE-STORE",) for s in topology.subtopologies)


def test_apply_global_records_puts_deletes_and_skips_null_keys(tmp_path):
    with Stores.persistent_key_value_store("t-STATE-STORE").open(tmp_path) as store:
        records = [
            ConsumedRecord("t", 0, 0, 1, b"a", b"1"),
            ConsumedRecord("t", 0, 1, 2, None, b"x"),  # no key: skipped
            ("t", 0, 2, 3, b"b", b"2", []),  # a plain tuple in ConsumedRecord's layout
            ConsumedRecord("t", 0, 3, 4, b"a", None),  # a tombstone
        ]
        assert apply_global_records(store, records) == 3
        assert store.get(b"b") is None  # staged: the caller commits
        store.commit({TopicPartition("t", 0): 4})
        assert list(store.range()) == [(b"b", b"2")]
        assert store.committed_offset(TopicPartition("t", 0)) == 4


def test_driver_updates_every_task_and_a_task_created_later_catches_up():
    b, _ = _rates_join()
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        orders = driver.create_input_topic("orders", Serdes.string(), Serdes.json())
        rates = driver.create_input_topic("rates", Serdes.string(), Serdes.json())
        out = driver.create_output_topic("enriched", Serdes.string(), Serdes.json())
        rates.pipe_input("EUR", {"rate": 1.1}, timestamp=0, partition=0)
        orders.pipe_input("o1", {"ccy": "EUR", "amount": 1}, timestamp=1, partition=0)
        rates.pipe_input("GBP", {"rate": 1.3}, timestamp=2, partition=5)  # any partition
        orders.pipe_input("o2", {"ccy": "GBP", "amount": 2}, timestamp=3, partition=0)
        # Partition 1's task starts now: it sees every global record piped before.
        orders.pipe_input("o3", {"ccy": "EUR", "amount": 3}, timestamp=4, partition=1)
        rates.pipe_input("EUR", None, timestamp=5)  # both open tasks lose EUR at once
        orders.pipe_input("o4", {"ccy": "EUR", "amount": 4}, timestamp=6, partition=0)
        orders.pipe_input("o5", {"ccy": "EUR", "amount": 5}, timestamp=7, partition=1)
        assert out.read_key_values_to_list() == [
            ("o1", {"ccy": "EUR", "amount": 1, "rate": 1.1}),
            ("o2", {"ccy": "GBP", "amount": 2, "rate": 1.3}),
            ("o3", {"ccy": "EUR", "amount": 3, "rate": 1.1}),
        ]
        assert driver.metrics()["join_misses"] == 2
        store = driver.get_state_store("rates-STATE-STORE", partition=7)  # any task's copy
        assert store.get("GBP") == {"rate": 1.3} and store.get("EUR") is None


def test_global_copy_survives_a_task_restart_without_commits():
    """The driver commits a global store with each global record, whatever commit_every:
    a task that fails and restarts still has the table."""
    b = StreamsBuilder()
    rates = b.global_table("rates", Serdes.string(), Serdes.string())

    def joiner(value, rate):
        if value == "boom":
            raise RuntimeError("boom")
        return f"{value}@{rate}"

    orders = b.stream("orders", Serdes.string(), Serdes.string())
    orders.join(rates, lambda k, v: "EUR", joiner).to("out")
    config = {**CONFIG, "processing.exception.handler": "log_and_fail"}
    with TopologyTestDriver(b.build(), config, commit_every=None) as driver:
        orders = driver.create_input_topic("orders", Serdes.string(), Serdes.string())
        driver.create_input_topic("rates", Serdes.string(), Serdes.string()).pipe_input(
            "EUR", "1.1", timestamp=0
        )
        orders.pipe_input("o1", "a", timestamp=1)
        with pytest.raises(Exception, match="boom"):
            orders.pipe_input("o2", "boom", timestamp=2)
        orders.pipe_input("o3", "c", timestamp=3)
        out = driver.create_output_topic("out", Serdes.string(), Serdes.string())
        assert out.read_values_to_list() == ["a@1.1", "c@1.1"]


def test_a_global_table_with_nothing_joining_it_makes_no_task():
    b = StreamsBuilder()
    b.global_table("rates")
    b.stream("orders").to("out")
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        driver.create_input_topic("rates", Serdes.bytes(), Serdes.bytes()).pipe_input(b"k", b"v")
        assert driver._tasks == {}
