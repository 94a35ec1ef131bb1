"""ensure.explicit.internal.resource.naming (KIP-1111): stores, changelog topics and repartition
topics with generated names make the topology an error; processor names do not (pure logic)."""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder, Suppressed, TimeWindows, TopologyTestDriver
from streamplatform.dsl import JoinWindows
from streamplatform.dsl.naming import TopologyNamingError, internal_resources
from streamplatform.serdes import Serdes

STRICT = {"application.id": "app", "ensure.explicit.internal.resource.naming": True}


def grouped_count(*, name=None, filtered=False):
    """Views per page: re-keyed by group_by (a repartition), counted."""
    b = StreamsBuilder()
    views = b.stream("views", Serdes.string(), Serdes.json())
    if filtered:
        views = views.filter(lambda k, v: True)
    views.group_by(lambda k, v: v["page"], Serdes.string()).count(name=name).to_stream().to(
        "counts", value_serde=Serdes.long()
    )
    return b.build()


def counts_through_the_driver(topology, config):
    with TopologyTestDriver(topology, config) as driver:
        views = driver.create_input_topic("views", Serdes.string(), Serdes.json())
        for user, page in (("u1", "a"), ("u2", "a"), ("u1", "b")):
            views.pipe_input(user, {"page": page}, timestamp=1)
        out = driver.create_output_topic("counts", Serdes.string(), Serdes.long())
        return dict(out.read_key_values_to_list())


def test_a_count_after_group_by_without_names_fails_listing_each_resource_and_its_operator():
    with pytest.raises(TopologyNamingError) as refused:
        TopologyTestDriver(grouped_count(), STRICT)
    message = str(refused.value)
    for line in (
        "app-KSTREAM-COUNT-0000000002-STATE-STORE-changelog (operator KSTREAM-COUNT-0000000002)"
        ": count(name=...)",
        "  KSTREAM-COUNT-0000000002-STATE-STORE (operator KSTREAM-COUNT-0000000002)",
        "  app-KSTREAM-COUNT-0000000002-repartition (operator KSTREAM-COUNT-0000000002)",
    ):
        assert line in message
    # Kafka Streams' grouping and order: changelog topics, state stores, repartition topics.
    headings = [line for line in message.splitlines() if line.startswith("Following")]
    assert headings == [
        "Following changelog topic(s) have not been named:",
        "Following state store(s) have not been named:",
        "Following repartition topic(s) have not been named:",
    ]
    # The processors (source, key selector, sink) have generated names too: not listed.
    assert "KEY-SELECT" not in message and "SINK" not in message and "SOURCE" not in message


def test_the_same_count_named_passes_and_counts():
    topology = grouped_count(name="views-per-page")
    assert counts_through_the_driver(topology, STRICT) == {"a": 2, "b": 1}
    names = {r.name for r in internal_resources(topology, "app")}
    assert names == {"views-per-page-STATE-STORE", "app-views-per-page-STATE-STORE-changelog",
                     "app-views-per-page-repartition"}  # fmt: skip


def test_the_setting_is_off_by_default():
    assert counts_through_the_driver(grouped_count(), {"application.id": "app"}) == {
        "a": 2,
        "b": 1,
    }


def test_processor_names_alone_do_not_matter():
    """Stateless operators, branches, a merge, a table's default store (named after its
    topic) and a stream-table join that needs no repartition: all generated processor names,
    no generated store or internal topic."""
    b = StreamsBuilder()
    rates = b.table("rates", Serdes.string(), Serdes.json())
    stream = b.stream("in", Serdes.string(), Serdes.json()).filter(lambda k, v: v is not None)
    branches = stream.split().branch(lambda k, v: v["n"] > 0).default_branch()
    merged = branches["1"].map_values(lambda v: v).merge(branches["0"])
    merged.join(rates, lambda v, rate: {**v, "rate": rate}).peek(lambda k, v: None).to("out")
    with TopologyTestDriver(b.build(), STRICT) as driver:
        driver.create_input_topic("rates", Serdes.string(), Serdes.json()).pipe_input("k", 2)
        driver.create_input_topic("in", Serdes.string(), Serdes.json()).pipe_input("k", {"n": 1})
        out = driver.create_output_topic("out", Serdes.string(), Serdes.json())
        assert out.read_values_to_list() == [{"n": 1, "rate": 2}]


def _dedup(b, stream):
    stream.deduplicate(lambda k, v: v["id"], 60_000).to("out")


def _suppress(b, stream):
    windowed = stream.group_by_key().windowed_by(TimeWindows.of_size_and_grace(10, 5))
    windowed.count(name="c").suppress(Suppressed.until_window_closes()).to_stream().to("out")


def _stream_join(b, stream):
    other = b.stream("other", Serdes.string(), Serdes.json())
    stream.left_join(other, lambda a, o: a, JoinWindows.of_time_difference_and_grace(10, 0)).to(
        "out"
    )


def _table_grouping(b, stream):
    table = b.table("tab", Serdes.string(), Serdes.json())
    table.group_by(lambda k, v: (v["g"], v)).count(name="c").to_stream().to("out")


def _rekeyed_table_join(b, stream):
    table = b.table("tab", Serdes.string(), Serdes.json())
    stream.select_key(lambda k, v: v["id"]).join(table, lambda v, t: v).to("out")


def _repartition(b, stream):
    stream.repartition().to("out")


@pytest.mark.parametrize(
    ("build", "unnamed", "how"),
    [
        (_dedup, {"KSTREAM-DEDUPLICATE-0000000001-store",
                  "app-KSTREAM-DEDUPLICATE-0000000001-repartition"}, "deduplicate"),
        (_suppress, {"KSTREAM-KTABLE-SUPPRESS-0000000001-STATE-STORE"}, "with_name(...)"),
        (_stream_join, {"KSTREAM-LEFTJOINTHIS-0000000002-store",
                        "KSTREAM-LEFTJOINOTHER-0000000003-store",
                        "KSTREAM-OUTERSHARED-0000000004-store"},
         "join(stream, joiner, windows, name=...)"),
        (_table_grouping, {"KSTREAM-KTABLE-SELECT-0000000003-STATE-STORE"},
         "KTable.group_by(selector, name=...)"),
        (_rekeyed_table_join, {"app-KSTREAM-JOIN-0000000004-repartition"},
         "join(table, joiner, name=...)"),
        (_repartition, {"app-KSTREAM-REPARTITION-0000000001-repartition"}, "repartition(name="),
    ],
    ids=["dedup", "suppress", "stream-join", "table-grouping", "rekeyed-table-join",
         "repartition"],
)  # fmt: skip
def test_each_stateful_operator_is_listed_with_the_call_that_names_it(build, unnamed, how):
    b = StreamsBuilder()
    build(b, b.stream("in", Serdes.string(), Serdes.json()))
    topology = b.build()
    listed = {r.name for r in internal_resources(topology, "app") if r.generated}
    stores = {name for name in unnamed if not name.startswith("app-")}
    changelogs = {f"app-{store}-changelog" for store in stores}
    assert listed == unnamed | changelogs
    with pytest.raises(TopologyNamingError) as refused:
        TopologyTestDriver(topology, STRICT)
    assert all(name in str(refused.value) for name in listed)
    assert how in str(refused.value)


def test_every_stateful_operator_can_be_named():
    """The names each operator takes: nothing generated is left, and the names are Kafka
    Streams' where it has them (a stream join's ``<name>-this-join-store``)."""
    b = StreamsBuilder()
    stream = b.stream("in", Serdes.string(), Serdes.json())
    other = b.stream("other", Serdes.string(), Serdes.json())
    table = b.table("tab", Serdes.string(), Serdes.json())
    stream.deduplicate(lambda k, v: v["id"], 60_000, name="dedup").to("o1")
    windowed = stream.group_by_key().windowed_by(TimeWindows.of_size_and_grace(10, 5))
    windowed.count(name="c").suppress(
        Suppressed.until_window_closes().with_name("final")
    ).to_stream().to("o2")
    windows = JoinWindows.of_time_difference_and_grace(10, 0)
    stream.outer_join(other, lambda a, o: a, windows, name="sj").to("o3")
    table.group_by(lambda k, v: (v["g"], v), name="by-g").count(name="per-g").to_stream().to("o4")
    stream.select_key(lambda k, v: v["id"]).join(table, lambda v, t: v, name="tj").to("o5")
    stream.repartition(name="again").to("o6")
    topology = b.build()
    assert not [r for r in internal_resources(topology, "app") if r.generated]
    assert set(topology.stores) == {
        "dedup-store", "c-STATE-STORE", "final-STATE-STORE", "sj-this-join-store",
        "sj-other-join-store", "sj-outer-shared-join-store", "tab-STATE-STORE",
        "by-g-STATE-STORE", "per-g-STATE-STORE",
    }  # fmt: skip
    assert set(topology.repartition_topics("app")) == {
        "app-dedup-repartition", "app-per-g-repartition", "app-tj-repartition",
        "app-again-repartition",
    }  # fmt: skip
    TopologyTestDriver(topology, STRICT).close()  # accepted


def test_an_operator_given_its_old_generated_name_counts_as_named():
    """The way to keep the state of an operator that was unnamed: its old generated name,
    given explicitly, is a name a person chose (it no longer moves)."""
    topology = grouped_count(name="KSTREAM-COUNT-0000000002", filtered=True)
    assert counts_through_the_driver(topology, STRICT) == {"a": 2, "b": 1}
    assert "KSTREAM-COUNT-0000000002-STATE-STORE" in topology.stores


def test_the_streaming_job_refuses_the_topology_before_it_touches_kafka(tmp_path):
    from streamplatform.runtime.microbatch import StreamingJob

    config = STRICT | {"bootstrap.servers": "127.0.0.1:9", "state.dir": str(tmp_path)}
    with pytest.raises(TopologyNamingError, match="KSTREAM-COUNT-0000000002-STATE-STORE"):
        StreamingJob(grouped_count(), config, delta_sinks=["counts"])
