"""Foreign-key table-table joins (dsl/fk_join.py): what the ported Kafka Streams tests
(tests/reference/test_fk_join_ported.py) do not cover: the call's overloads, a (key, value)
extractor, a stale response dropped by its hash, a join of a table with itself, the topology's
layout (its two sub-topologies read each other's topics) and the topic the Spark runtime keeps
in Kafka to close that cycle."""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.dsl.fk_join import Response, ResponseSerde, value_hash
from streamplatform.serdes import Serdes

S = Serdes.string()
APP = "fk-join"


def _joiner(order, customer) -> str:
    return f"{order}+{customer}"


def _orders_customers(name: str | None = "orders-customers", extractor=None, left=False):
    b = StreamsBuilder()
    orders = b.table("orders", S, S)
    customers = b.table("customers", S, S)
    join = orders.left_join if left else orders.join
    joined = join(customers, extractor or (lambda v: v.split(":")[0]), _joiner, name=name)
    joined.to_stream().to("out", S, S)
    return b


def test_the_overloads_tell_key_and_foreign_key_joins_apart():
    b = StreamsBuilder()
    one, two = b.table("one", S, S), b.table("two", S, S)
    one.join(two, _joiner, Serdes.string(), "by-key").to_stream().to("out", S, S)
    one.join(two, joiner=_joiner, name="by-key-2").to_stream().to("out2", S, S)
    one.left_join(two, len, joiner=_joiner, name="fk").to_stream().to("out3", S, S)
    topology = b.build()
    assert {"by-key", "by-key-2"} <= set(topology.nodes)  # the key joins' merge nodes
    assert len(topology.repartition_topics(APP)) == 2  # the foreign-key join's only


def test_wrong_arguments_say_both_forms():
    b = StreamsBuilder()
    one, two = b.table("one", S, S), b.table("two", S, S)
    with pytest.raises(TypeError, match="foreign_key_extractor, joiner"):
        one.join(two, len, _joiner, S, "name", None, "extra")
    with pytest.raises(TypeError, match="joiner must be callable"):
        one.join(two, foreign_key_extractor=len, joiner="not a function")


def test_a_key_value_extractor_gets_the_key():
    b = StreamsBuilder()
    orders, customers = b.table("orders", S, S), b.table("customers", S, S)
    # The customer is the order key's prefix (Kafka Streams 4's BiFunction extractor).
    orders.join(customers, lambda key, value: key.split("-")[0], _joiner,
                name="by-key-prefix").to_stream().to("out", S, S)  # fmt: skip
    with TopologyTestDriver(b.build(), {"application.id": APP}) as driver:
        driver.create_input_topic("customers", S, S).pipe_input("alice", "Alice", timestamp=1)
        driver.create_input_topic("orders", S, S).pipe_input("alice-1", "book", timestamp=2)
        out = driver.create_output_topic("out", S, S)
        assert [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()] == [
            ("alice-1", "book+Alice", 2)
        ]


def test_a_stale_response_is_dropped():
    """A response carries the hash of the left value that subscribed: once the left key has
    another value, the response is not joined (Kafka Streams' ResponseJoinProcessor)."""
    b = _orders_customers()
    with TopologyTestDriver(b.build(), {"application.id": APP}) as driver:
        customers = driver.create_input_topic("customers", S, S)
        orders = driver.create_input_topic("orders", S, S)
        out = driver.create_output_topic("out", S, S)
        customers.pipe_input("alice", "Alice", timestamp=1)
        orders.pipe_input("o1", "alice:book", timestamp=2)
        assert out.read_key_values_to_list() == [("o1", "alice:book+Alice")]
        # Responses as the right side writes them, straight into the response topic.
        topic = f"{APP}-orders-customers-subscription-response-topic"
        responses = driver.create_input_topic(topic, S, ResponseSerde(S))
        stale = Response(value_hash(b"alice:pen"), "Alice (stale)")
        responses.pipe_input("o1", stale, timestamp=3)
        assert out.read_key_values_to_list() == []
        current = Response(value_hash(b"alice:book"), "Alice (again)")
        responses.pipe_input("o1", current, timestamp=4)
        assert out.read_key_values_to_list() == [("o1", "alice:book+Alice (again)")]
        assert driver.metrics()["dropped_records"] >= 1


def test_a_table_joins_itself_on_a_foreign_key():
    """Employees and their managers, from one table: the left and right sides are one
    sub-topology, which reads the topics it writes."""
    b = StreamsBuilder()
    employees = b.table("employees", S, S)  # name:manager

    def reports(employee, manager):
        return f"{employee.split(':')[0]} reports to {manager.split(':')[0] if manager else '-'}"

    employees.left_join(employees, lambda v: v.split(":")[1] or None, reports,
                        name="reports-to").to_stream().to("out", S, S)  # fmt: skip
    topology = b.build()
    assert len(topology.subtopologies) == 1
    with TopologyTestDriver(topology, {"application.id": APP}) as driver:
        topic = driver.create_input_topic("employees", S, S)
        out = driver.create_output_topic("out", S, S)
        topic.pipe_input("ann", "Ann:", timestamp=1)
        topic.pipe_input("bob", "Bob:ann", timestamp=2)
        assert dict(out.read_key_values_to_list()) == {
            "ann": "Ann reports to -",
            "bob": "Bob reports to Ann",
        }
        topic.pipe_input("ann", "Annie:", timestamp=3)  # bob's manager changes her name
        assert dict(out.read_key_values_to_list()) == {
            "ann": "Annie reports to -",
            "bob": "Bob reports to Annie",
        }


def test_the_topology_has_two_sub_topologies_reading_each_others_topics():
    topology = _orders_customers().build()
    left, right = topology.subtopologies
    registration = f"{APP}-orders-customers-subscription-registration-topic"
    response = f"{APP}-orders-customers-subscription-response-topic"
    assert left.source_topics(topology, APP) == ["orders", response]
    assert right.source_topics(topology, APP) == ["customers", registration]
    assert sorted(topology.repartition_topics(APP)) == [registration, response]
    assert set(topology.stores) == {
        "orders-STATE-STORE", "customers-STATE-STORE",
        "orders-customers-LEFT-STATE-STORE", "orders-customers-RIGHT-STATE-STORE",
        "orders-customers-SUBSCRIPTION-STATE-STORE",
    }  # fmt: skip
    assert set(left.stores) >= {"orders-customers-LEFT-STATE-STORE"}
    assert set(right.stores) >= {
        "orders-customers-RIGHT-STATE-STORE",
        "orders-customers-SUBSCRIPTION-STATE-STORE",
    }


def test_the_driver_runs_records_around_the_cycle():
    """A right update reaches the left side through both internal topics, at once. With 3
    partitions, each table's records in the partition of their key's bytes (as Kafka's
    default partitioner puts them, and the internal topics' records): the response topic is
    co-partitioned with the left table only then (Kafka Streams sends each response to the
    partition its subscription came from; we partition it by the left key)."""
    from streamplatform.runtime._kafka_rows import partition_for

    b = _orders_customers(left=True)
    with TopologyTestDriver(b.build(), {"application.id": APP}, repartition_partitions=3) as d:
        orders = d.create_input_topic("orders", S, S)
        customers = d.create_input_topic("customers", S, S)
        out = d.create_output_topic("out", S, S)
        orders.pipe_input("o1", "alice:book", timestamp=5, partition=partition_for(b"o1", 3))
        assert out.read_key_values_to_list() == [("o1", "alice:book+None")]
        customers.pipe_input("alice", "Alice", timestamp=7, partition=partition_for(b"alice", 3))
        assert [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()] == [
            ("o1", "alice:book+Alice", 7)
        ]


def test_generated_names_are_flagged_with_the_call_that_names_them():
    from streamplatform.dsl.naming import unnamed_resources

    unnamed = unnamed_resources(_orders_customers(name=None).build(), APP)
    assert unnamed and {r.how_to_name for r in unnamed} == {
        "KTable.join(other, foreign_key_extractor, joiner, name=...) (left_join)"
    }
    assert not unnamed_resources(_orders_customers().build(), APP)


def test_a_versioned_side_is_refused():
    from streamplatform.state import Stores

    b = StreamsBuilder()
    orders = b.table("orders", S, S, store=Stores.persistent_versioned_key_value_store("o", 1000))
    customers = b.table("customers", S, S)
    with pytest.raises(ValueError, match="versioned"):
        orders.join(customers, lambda v: v, _joiner)


def test_the_topic_closing_the_cycle_is_a_kafka_topic_of_the_reading_tables_width():
    """The Spark runtime runs sub-topologies in order: the internal topic read before it is
    written (the answers, or the subscriptions when the right table comes first) is kept in
    Kafka, with as many partitions as the table whose sub-topology reads it
    (runtime/feedback_topics.py)."""
    from streamplatform.runtime import feedback_topics

    widths = {"orders": 3, "customers": 2}
    for b, name, table in ((_orders_customers(), "orders-customers", "orders"),
                           (_right_first(), "oc", "customers")):  # fmt: skip
        topology = b.build()
        feedback = feedback_topics.feedback_topics(topology, APP)
        part = "response" if table == "orders" else "registration"
        assert list(feedback) == [f"{APP}-{name}-subscription-{part}-topic"]
        sizes = feedback_topics.partitions_of_feedback(topology, APP, feedback, widths)
        assert sizes == {next(iter(feedback)): widths[table]}


def _right_first() -> StreamsBuilder:
    b = StreamsBuilder()
    customers = b.table("customers", S, S)
    orders = b.table("orders", S, S)
    orders.join(customers, lambda v: v.split(":")[0], _joiner, name="oc").to_stream().to("out")
    return b
