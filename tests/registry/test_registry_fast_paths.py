"""The Protobuf and JSON Schema serdes' fast paths (registry/serdes.py), against the mock
registry: what they read and write is what confluent-kafka's serializers read and write,
byte for byte, and a value confluent's would refuse is refused with confluent's error.

- Protobuf: the framing (magic byte, schema id, message indexes) learnt from the first message
  confluent's serializer writes to a topic, then the message's own bytes; read past the
  framing by the generated class.
- JSON Schema: confluent's verdict on a value's shape kept for every value of that shape
  (``_ValueShapes``) when the schema constrains nothing else; encoded and decoded with orjson,
  as confluent-kafka does."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.registry import serdes as registry_serdes
from streamplatform.registry.serdes import _shape_only, registry_client
from streamplatform.serdes import SerdeContext, Serdes, SerializationError
from tests.registry.formats import JSON_TX
from tests.registry.payments_pb2 import Payment, Rate

MINUTE = 60_000


def _context(topic: str = "tx") -> SerdeContext:
    return SerdeContext(topic, False, [])


def _serde(kind: str, scope: str, what: Any) -> Any:
    registry = {"schema.registry.url": f"mock://{scope}"}
    if kind == "protobuf":
        return Serdes.protobuf(what, registry=registry)
    return Serdes.json_schema(what, registry=registry)


def _confluent_protobuf(scope: str, message_type: Any) -> tuple[Any, Any]:
    client = registry_client({"schema.registry.url": f"mock://{scope}"})
    return (ProtobufSerializer(message_type, client, {"use.deprecated.format": False}),
            ProtobufDeserializer(message_type, {"use.deprecated.format": False}))  # fmt: skip


# Protobuf -------------------------------------------------------------------------------


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1),
                          st.floats(allow_nan=False)), min_size=1, max_size=20))  # fmt: skip
def test_protobuf_writes_and_reads_what_confluent_writes_and_reads(values) -> None:
    scope = f"pb-{len(values)}-{values[0][0]}"
    serde = _serde("protobuf", scope, Payment)
    rates = _serde("protobuf", scope, Rate)  # not the first message in the file: indexes [2]
    confluent, confluent_reader = _confluent_protobuf(scope, Payment)
    rate_writer, rate_reader = _confluent_protobuf(scope, Rate)
    ctx = SerializationContext("tx", MessageField.VALUE, [])
    rate_ctx = SerializationContext("rates", MessageField.VALUE, [])
    for tx_id, amount in values:
        message, rate = Payment(id=tx_id, amount=amount), Rate(rate=amount)
        data = serde.serialize(message, _context())
        assert data == confluent(message, ctx)
        assert serde.deserialize(data, _context()) == confluent_reader(data, ctx) == message
        rate_data = rates.serialize(rate, _context("rates"))
        assert rate_data == rate_writer(rate, rate_ctx)
        assert rates.deserialize(rate_data, _context("rates")) == rate_reader(rate_data, rate_ctx)
    # After the first message to each topic, the fast paths did the rest.
    assert serde.written_prefix("tx", False) == data[:6]
    assert rates.written_prefix("rates", False) == rate_data[:7]  # indexes: count 1, then 2
    assert serde._deserializer is None and rates._deserializer is None


def test_protobuf_refuses_what_confluent_refuses() -> None:
    serde = _serde("protobuf", "pb-refuse", Payment)
    good = serde.serialize(Payment(id=1, amount=2.0), _context())
    with pytest.raises(SerializationError, match="protobuf: cannot deserialize"):
        serde.deserialize(good[:6] + b"\xff\xff", _context())  # not a message
    unknown = b"\x00\x00\x00\x03\xe7" + good[5:]  # schema id 999
    with pytest.raises(SerializationError, match="999|not found|404"):
        serde.deserialize(unknown, _context())
    with pytest.raises(SerializationError):
        serde.deserialize(good[:5] + b"\x80", _context())  # indexes cut short
    with pytest.raises(SerializationError, match="expected a Payment, got Rate"):
        serde.serialize(Rate(rate=1.0), _context())


# JSON Schema ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=3),
    max_leaves=8,
)  # fmt: skip
transactions = st.fixed_dictionaries(
    {"id": st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False),
     "amount": st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 10**6)},
    optional={"note": json_values},
) | json_values  # fmt: skip


def _confluent_json(scope: str, schema: str) -> tuple[Any, Any]:
    client = registry_client({"schema.registry.url": f"mock://{scope}"})
    return JSONSerializer(schema, client), JSONDeserializer(schema, schema_registry_client=client)


def _outcome(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception as error:  # noqa: BLE001 - compared as (type, message)
        cause = error.__cause__ or error
        return type(error).__name__, str(cause).split(": ", 2)[-1]


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(transactions, min_size=1, max_size=25))
def test_json_schema_writes_and_reads_what_confluent_does(values) -> None:
    """Valid and invalid values, many of the same shape: every outcome is confluent's, the
    verdicts kept per shape agree with its validation, and the bytes are its bytes."""
    scope = f"js-{len(values)}"
    serde = _serde("json_schema", scope, JSON_TX)
    writer, reader = _confluent_json(scope, JSON_TX)
    ctx = SerializationContext("tx", MessageField.VALUE, [])
    for value in values:
        ours = _outcome(serde.serialize, value, _context())
        theirs = _outcome(writer, value, ctx)
        if isinstance(theirs, bytes):
            assert ours == theirs
            assert _outcome(serde.deserialize, theirs, _context()) == reader(theirs, ctx)
        else:
            assert not isinstance(ours, bytes), (value, ours)
    # Bytes written by someone else (no check on the way in), valid or not, read as
    # confluent reads them.
    prefix = serde.written_prefix("tx", False)
    if prefix is not None:
        for value in values:
            data = prefix + orjson.dumps(value)
            theirs = _outcome(reader, data, ctx)
            ours = _outcome(serde.deserialize, data, _context())
            assert ours == theirs if not isinstance(theirs, tuple) else isinstance(ours, tuple)


def test_json_schema_validates_each_shape_once_and_refuses_invalid_values(monkeypatch) -> None:
    calls = {"validations": 0}
    original = JSONSerializer.__call__

    def counted(self: Any, value: Any, ctx: Any = None) -> Any:
        calls["validations"] += 1
        return original(self, value, ctx)

    monkeypatch.setattr(JSONSerializer, "__call__", counted)
    serde = _serde("json_schema", "js-once", JSON_TX)
    for n in range(50):
        serde.serialize({"id": n, "amount": n + 0.5}, _context())
    assert calls["validations"] == 1  # one shape: {id: int, amount: float}
    serde.serialize({"id": 1, "amount": 2}, _context())  # another shape: amount an int
    assert calls["validations"] == 2
    for bad in ({"id": "x", "amount": 1.0}, {"amount": 1.0}):
        for _ in range(3):
            with pytest.raises(SerializationError, match="json_schema: cannot serialize"):
                serde.serialize(bad, _context())
    # Reading: bytes of an invalid shape are refused each time, by confluent's validation.
    data = serde.written_prefix("tx", False) + b'{"id": "x", "amount": 1.0}'
    for _ in range(2):
        with pytest.raises(SerializationError, match="json_schema: cannot deserialize"):
            serde.deserialize(data, _context())


def test_schemas_that_look_at_values_get_no_shape_verdicts() -> None:
    assert _shape_only({"type": "object", "properties": {"id": {"type": "integer"}},
                        "required": ["id"], "additionalProperties": False})  # fmt: skip
    assert _shape_only({"anyOf": [{"type": "string"}, {"type": "array", "items": True}]})
    assert _shape_only({"type": "object", "properties": {"enum": {"type": "string"}}})  # a name
    for looks in ({"type": "string", "maxLength": 3}, {"enum": [1, 2]}, {"const": 1},
                  {"type": "integer", "minimum": 0}, {"type": "string", "format": "email"},
                  {"$ref": "#/definitions/x"}, {"type": "array", "uniqueItems": True},
                  {"properties": {"a": {"pattern": "^x"}}}, {"items": [{"minimum": 1}]}):  # fmt: skip
        assert not _shape_only(looks), looks
    serde = Serdes.json_schema('{"type": "object", "properties": {"id": {"minimum": 0}}}')
    assert serde._shapes() is None  # every value goes through confluent's validation


# Values written as read through a deduplication -------------------------------------------


@pytest.mark.parametrize("kind", ["protobuf", "json_schema"])
def test_unchanged_values_are_written_as_read(kind: str, monkeypatch) -> None:
    encoded = {"calls": 0}
    cls = registry_serdes.ProtobufSerde if kind == "protobuf" else registry_serdes.JsonSchemaSerde
    original = cls._fast_write

    def counted(serde: Any, value: Any, is_key: Any, topic: Any) -> Any:
        encoded["calls"] += topic == "out"
        return original(serde, value, is_key, topic)

    monkeypatch.setattr(cls, "_fast_write", counted)
    what = Payment if kind == "protobuf" else JSON_TX
    value_of = (lambda n: Payment(id=n % 4, amount=float(n))) if kind == "protobuf" else (
        lambda n: {"id": n % 4, "amount": float(n)})  # fmt: skip
    settings = {"application.id": "as-read", "schema.registry.url": f"mock://as-read-{kind}",
                "value.subject.name.strategy": "RecordNameStrategy"}  # fmt: skip
    b = StreamsBuilder()
    (b.stream("tx", Serdes.string(), _serde(kind, f"as-read-{kind}", what))
     .deduplicate_by_key_value(lambda k, v: v.id if kind == "protobuf" else v["id"], MINUTE)
     .to("out"))  # fmt: skip
    writer = Serdes.protobuf(Payment, subject_name_strategy="RecordNameStrategy",
                             registry={"schema.registry.url": f"mock://as-read-{kind}"}) \
        if kind == "protobuf" else Serdes.json_schema(
            JSON_TX, subject_name_strategy="RecordNameStrategy",
            registry={"schema.registry.url": f"mock://as-read-{kind}"})  # fmt: skip
    raw = [writer.serialize(value_of(n), _context()) for n in range(10)]
    with TopologyTestDriver(b.build(), settings) as driver:
        topic = driver.create_input_topic("tx", Serdes.bytes(), Serdes.bytes())
        for n, data in enumerate(raw):
            topic.pipe_raw(b"k", data, timestamp=n)
        out = driver.create_output_topic("out", Serdes.string(), Serdes.bytes())
        written = [record.value for record in out.read_records_to_list()]
    assert written == raw[:4]  # ids 0-3 once each, the bytes read
    assert encoded["calls"] == 1  # only the first was encoded (it learns the framing)


# What a review found: each case goes the way confluent-kafka's serializers go -----------


def test_json_schema_refuses_an_invalid_mapping_of_a_subclass_after_a_valid_one() -> None:
    """Only plain dicts and lists have shapes: an OrderedDict's verdict is never kept."""
    from collections import OrderedDict

    required = '{"type": "object", "required": ["a"]}'
    serde = _serde("json_schema", "js-subclass", required)
    serde.serialize(OrderedDict(a=1), _context())
    serde.serialize(OrderedDict(a=2), _context())
    with pytest.raises(SerializationError, match="json_schema: cannot serialize"):
        serde.serialize(OrderedDict(b="x"), _context())


def test_json_schema_reads_deep_and_big_values_as_confluent_does() -> None:
    scope = "js-deep"
    serde = _serde("json_schema", scope, '{"type": "array"}')
    _, reader = _confluent_json(scope, '{"type": "array"}')
    prefix = serde.serialize([1], _context())[:5]
    ctx = SerializationContext("tx", MessageField.VALUE, [])
    for value in (b"[" * 900 + b"]" * 900, orjson.dumps(list(range(5000)))):
        for _ in range(2):  # the second time, a verdict would be known
            assert serde.deserialize(prefix + value, _context()) == reader(prefix + value, ctx)


def test_schemas_of_odd_keyword_values_get_no_shape_verdicts() -> None:
    assert not _shape_only({"dependencies": []})
    assert not _shape_only({"$schema": "http://json-schema.org/draft-03/schema#",
                            "type": [{"enum": [1]}]})  # fmt: skip
    assert _shape_only({"type": ["string", "null"]})


def test_protobuf_refuses_a_message_index_count_confluent_refuses() -> None:
    serde = _serde("protobuf", "pb-count", Payment)
    good = serde.serialize(Payment(id=1, amount=2.0), _context())
    bad = good[:5] + b"\x01" + good[6:]  # a count of -1 (zigzag)
    _, reader = _confluent_protobuf("pb-count", Payment)
    with pytest.raises(Exception, match="msgidx"):
        reader(bad, SerializationContext("tx", MessageField.VALUE, []))
    with pytest.raises(SerializationError, match="msgidx"):
        serde.deserialize(bad, _context())


def test_no_bytes_written_as_read_from_another_registry_or_a_branching_path() -> None:
    """A schema id of another registry may name another schema; a decoded message another
    branch may change in place."""
    one = Serdes.protobuf(Payment, registry={"schema.registry.url": "mock://one"})
    other = Serdes.protobuf(Payment, registry={"schema.registry.url": "mock://other"})
    assert one.writes_back_reads_of(Serdes.protobuf(Payment, registry={
        "schema.registry.url": "mock://one"}))  # fmt: skip
    assert not one.writes_back_reads_of(other)

    b = StreamsBuilder()
    values = b.stream("tx", Serdes.string(), _serde("protobuf", "branch", Payment))
    values.foreach(lambda key, message: setattr(message, "amount", -1.0))  # in place
    values.to("out")
    raw = _serde("protobuf", "branch", Payment).serialize(Payment(id=1, amount=2.0), _context())
    with TopologyTestDriver(
        b.build(), {"application.id": "branch", "schema.registry.url": "mock://branch"}
    ) as driver:
        topic = driver.create_input_topic("tx", Serdes.bytes(), Serdes.bytes())
        for n in range(3):
            topic.pipe_raw(b"k", raw, timestamp=n)
        out = driver.create_output_topic("out", Serdes.string(), _serde("protobuf", "branch",
                                                                          Payment))  # fmt: skip
        assert [m.amount for m in out.read_values_to_list()] == [-1.0] * 3  # serialized
