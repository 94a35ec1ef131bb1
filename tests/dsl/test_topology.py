"""Building topologies: operators, sub-topologies, task ids, describe(), user processors."""

from __future__ import annotations

import pytest

from streamplatform import Processor, StreamsBuilder, TopologyTestDriver
from streamplatform.dsl import TaskId
from streamplatform.serdes import Serdes
from streamplatform.state import Stores


def test_stateless_operators_in_order():
    b = StreamsBuilder()
    seen = []
    (
        b.stream("in", Serdes.string(), Serdes.long())
        .filter(lambda k, v: v > 0)
        .filter_not(lambda k, v: v == 13)
        .map_values(lambda v: v * 10)
        .flat_map_values(lambda v: [v, v + 1])
        .peek(lambda k, v: seen.append(v))
        .map(lambda k, v: (k.upper(), v))
        .select_key(lambda k, v: f"{k}!")
        .to("out")
    )
    with TopologyTestDriver(b.build(), {"application.id": "ops"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.long())
        for value in (1, -1, 13, 2):
            source.pipe_input("a", value, timestamp=value, headers=[("h", b"1")])
        out = driver.create_output_topic("out", Serdes.string(), Serdes.long())
        records = out.read_records_to_list()
    assert [(r.key, r.value) for r in records] == [("A!", 10), ("A!", 11), ("A!", 20), ("A!", 21)]
    assert seen == [10, 11, 20, 21]
    assert all(r.headers == [("h", b"1")] for r in records)  # headers travel with the record
    assert [r.timestamp for r in records] == [1, 1, 2, 2]


def test_to_defaults_to_the_streams_serdes_and_can_override_them():
    b = StreamsBuilder()
    stream = b.stream("in", Serdes.string(), Serdes.json())
    stream.to("same")
    stream.map_values(lambda v: len(v)).to("other", value_serde=Serdes.long())
    with TopologyTestDriver(b.build(), {"application.id": "serdes"}) as driver:
        driver.create_input_topic("in", Serdes.string(), Serdes.json()).pipe_input("k", [1, 2])
        same = driver.create_output_topic("same", Serdes.bytes(), Serdes.bytes())
        other = driver.create_output_topic("other", Serdes.string(), Serdes.long())
        assert same.read_key_values_to_list() == [(b"k", b"[1,2]")]
        assert other.read_key_values_to_list() == [("k", 2)]


class Counter(Processor):
    """Counts records per key in a store of its own and forwards the running count."""

    def init(self, context):
        super().init(context)
        self.store = context.get_state_store("counts")

    def process(self, record):
        key = record.key.encode()
        count = int(self.store.get(key) or b"0") + 1
        self.store.put(key, str(count).encode())
        self.context.forward(record._replace(value=count))


def test_user_processor_with_a_store_keeps_state_across_a_restart(tmp_path):
    def build():
        b = StreamsBuilder()
        b.add_state_store(Stores.persistent_key_value_store("counts"))
        b.stream("in", Serdes.string(), Serdes.string()).process(Counter, "counts").to(
            "out", value_serde=Serdes.long()
        )
        return b.build()

    config = {"application.id": "count", "state.dir": str(tmp_path)}
    for expected in ([1, 2], [3, 4]):  # the second driver reopens the committed store
        with TopologyTestDriver(build(), config) as driver:
            source = driver.create_input_topic("in", Serdes.string(), Serdes.string())
            source.pipe_input("a", "x")
            source.pipe_input("a", "y")
            out = driver.create_output_topic("out", Serdes.string(), Serdes.long())
            assert out.read_values_to_list() == expected


def test_describe_and_task_ids_with_a_repartition():
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.json()).deduplicate(
        lambda k, v: v["id"], 1_000, name="d"
    ).to("out")
    topology = b.build()
    text = topology.describe()
    assert "Sub-topology: 0" in text and "Sub-topology: 1" in text
    assert "Sink: d-repartition-sink (topic: <application.id>-d-repartition)" in text
    assert "Source: d-repartition-source (topics: [<application.id>-d-repartition])" in text
    assert "Processor: d (stores: [d-store])" in text
    assert topology.repartition_topics("app") == ["app-d-repartition"]
    assert topology.source_topics("app") == ["in", "app-d-repartition"]
    ids = topology.task_ids({"in": 2, "app-d-repartition": 3}, "app")
    assert [str(i) for i in ids] == ["0_0", "0_1", "1_0", "1_1", "1_2"]
    assert TaskId.parse("1_2") == ids[-1] == (1, 2)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda b: (b.stream("t"), b.stream("t")), "already read"),
        (lambda b: b.stream("t").process(Counter, "missing"), "No store named 'missing'"),
        (lambda b: b.build(), "empty"),
    ],
)
def test_topology_mistakes_are_clear_errors(build, message):
    with pytest.raises(ValueError, match=message):
        build(StreamsBuilder())


def test_input_topic_the_topology_does_not_read_is_an_error():
    b = StreamsBuilder()
    b.stream("in").to("out")
    with (
        TopologyTestDriver(b.build(), {"application.id": "x"}) as driver,
        pytest.raises(ValueError, match="does not read topic 'nope'"),
    ):
        driver.create_input_topic("nope", Serdes.bytes(), Serdes.bytes())
