"""A record that reaches a sink unchanged (through deduplications only, with the source's own
built-in serdes) is written with the bytes it was read with; any other path serializes."""

from __future__ import annotations

import json

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.serdes import Serdes

S = 1_000
# Not the form the JSON serde writes (that is compact and UTF-8): spaces and an escape.
READ = b'{"id": 1,  "name": "caf\\u00e9"}'
WRITTEN = '{"id":1,"name":"café"}'.encode()


def _outputs(topology, piped):
    """The raw (key, value) bytes written to ``out`` after piping raw ``(key, value)`` to ``in``."""
    with TopologyTestDriver(topology, {"application.id": "as-read"}) as driver:
        source = driver.create_input_topic("in", Serdes.bytes(), Serdes.bytes())
        for number, (key, value) in enumerate(piped):
            source.pipe_raw(key, value, timestamp=number * S)
        out = driver.create_output_topic("out", Serdes.bytes(), Serdes.bytes())
        return out.read_key_values_to_list()


def _dedup(then=lambda stream: stream, sink_value_serde=None, id_of=lambda k, v: v["id"]):
    b = StreamsBuilder()
    stream = b.stream("in", Serdes.string(), Serdes.json())
    then(stream.deduplicate_by_key_value(id_of, 10 * S)).to("out", value_serde=sink_value_serde)
    return b.build()


def test_a_record_deduplicated_into_a_sink_is_written_as_read():
    assert _outputs(_dedup(), [(b"k", READ), (b"k", READ)]) == [(b"k", READ)]


def test_a_changed_or_differently_serialized_record_is_serialized():
    class CompactJson:
        def serialize(self, value):
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

        def deserialize(self, data):
            return json.loads(data)

    mapped = _dedup(then=lambda stream: stream.map_values(lambda value: value))
    assert _outputs(mapped, [(b"k", READ)]) == [(b"k", WRITTEN)]
    assert _outputs(_dedup(sink_value_serde=CompactJson()), [(b"k", READ)]) == [(b"k", WRITTEN)]


def test_a_json_null_is_still_written_as_a_null():
    """b"null" decodes to None, which the serde writes as no value (a tombstone), not as the
    four bytes it was read as."""
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.json()).deduplicate_by_key(10 * S).to("out")
    assert _outputs(b.build(), [(b"k", b"null")]) == [(b"k", None)]


def test_records_deduplicated_across_a_repartition_are_written_as_read():
    b = StreamsBuilder()
    stream = b.stream("in", Serdes.string(), Serdes.json())
    stream.deduplicate(lambda k, v: v["id"], 10 * S).to("out")
    assert _outputs(b.build(), [(b"k1", READ), (b"k2", READ)]) == [(b"k1", READ)]


def test_a_topology_pickled_as_spark_sends_it_still_writes_as_read():
    """Spark's workers get the topology by cloudpickle, with copies of the built-in serdes."""
    from pyspark import cloudpickle

    pickled = cloudpickle.loads(cloudpickle.dumps(_dedup()))
    assert _outputs(pickled, [(b"k", READ)]) == [(b"k", READ)]
