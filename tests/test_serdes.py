"""Serdes: round trips, None passes through, failures carry the raw bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamplatform.serdes import Serde, Serdes, SerializationError, deserialize_all

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=10,
)


@given(st.text())
def test_string_round_trip(value):
    assert Serdes.string().deserialize(Serdes.string().serialize(value)) == value


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_long_round_trip_is_kafkas_big_endian_format(value):
    data = Serdes.long().serialize(value)
    assert data == value.to_bytes(8, "big", signed=True)
    assert Serdes.long().deserialize(data) == value


@given(json_values.filter(lambda v: v is not None))
def test_json_round_trip(value):
    assert Serdes.json().deserialize(Serdes.json().serialize(value)) == value


@pytest.mark.parametrize("serde", [Serdes.string(), Serdes.bytes(), Serdes.long(), Serdes.json()])
def test_none_passes_through(serde):
    assert isinstance(serde, Serde)
    assert serde.serialize(None) is None
    assert serde.deserialize(None) is None


@pytest.mark.parametrize(
    ("serde", "raw"),
    [(Serdes.json(), b"{not json"), (Serdes.string(), b"\xff\xfe"), (Serdes.long(), b"\x01\x02")],
)
def test_deserialization_error_carries_raw_bytes(serde, raw):
    with pytest.raises(SerializationError) as error:
        serde.deserialize(raw)
    assert error.value.raw == raw


@pytest.mark.parametrize(
    ("serde", "value"),
    [(Serdes.string(), 5), (Serdes.long(), "5"), (Serdes.long(), 2**64), (Serdes.bytes(), "x"),
     (Serdes.json(), {1, 2})],
)  # fmt: skip
def test_serialization_error_names_the_problem(serde, value):
    with pytest.raises(SerializationError):
        serde.serialize(value)


@pytest.mark.parametrize("number", [2**64, -(2**63) - 1, 10**30])
def test_json_keeps_integers_beyond_64_bits_exact(number):
    value = {"id": number, "nested": [number]}
    assert Serdes.json().deserialize(Serdes.json().serialize(value)) == value


@pytest.mark.parametrize("value", [float("inf"), {"a": [float("-inf")]}, float("nan")])
def test_json_refuses_what_json_cannot_hold_instead_of_writing_null(value):
    with pytest.raises(SerializationError, match="not JSON-serializable"):
        Serdes.json().serialize(value)


# deserialize_all: what a task uses to decode a slice of source records at once ------------------

raw_values = st.one_of(
    st.none(),
    st.builds(lambda value: Serdes.json().serialize(value), json_values),
    st.binary(max_size=12),  # mostly not JSON, sometimes not UTF-8
    st.integers(min_value=2**64, max_value=2**80).map(lambda n: str(n).encode()),
)


def _one_by_one(serde: Serde, datas: list) -> list | None:
    try:
        return [serde.deserialize(data) for data in datas]
    except SerializationError:
        return None


@given(st.lists(raw_values, max_size=8))
def test_deserialize_all_equals_record_by_record_or_declines(datas):
    """The bulk decode never differs from the per-record one: it gives the same values, or
    None (the caller decodes record by record) when any value fails or needs the standard
    library's JSON (integers beyond 64 bits)."""
    for serde in (Serdes.string(), Serdes.json(), Serdes.bytes()):
        bulk = deserialize_all(serde, datas)
        if bulk is not None:
            assert bulk == _one_by_one(serde, datas)
            assert [type(v) for v in bulk] == [type(v) for v in _one_by_one(serde, datas)]


def test_deserialize_all_declines_what_only_the_record_path_does_right():
    json = Serdes.json()
    assert deserialize_all(json, [b'{"a":1}', None]) == [{"a": 1}, None]
    assert deserialize_all(json, [b'{"a":1}', b"not json"]) is None  # the handler sees it
    assert deserialize_all(json, [b"1", b"123456789012345678901234"]) is None  # exact ints
    assert deserialize_all(json, [bytearray(b"1")]) is None  # not bytes: record by record
    assert deserialize_all(Serdes.string(), [b"ok", b"\xff"]) is None  # not UTF-8
    assert deserialize_all(Serdes.string(), [b"ok", None]) == ["ok", None]
    assert deserialize_all(Serdes.long(), [b"\x00" * 8]) is None  # no bulk form
    assert deserialize_all(Serdes.bytes(), [b"a", None, bytearray(b"b")]) == [b"a", None, b"b"]


@pytest.mark.parametrize("serde", [Serdes.string(), Serdes.bytes(), Serdes.long(), Serdes.json()])
def test_a_built_in_serde_unpickles_as_the_shared_instance(serde):
    """A job's topology reaches Spark's executors pickled (cloudpickle); the C cores take
    their fast paths (a count's int64 results, string keys) where ``serde is Serdes.long()``
    and the like, so those serdes must come back as the instances the library shares."""
    import pickle

    from pyspark import cloudpickle

    from streamplatform import StreamsBuilder

    assert pickle.loads(pickle.dumps(serde)) is serde
    assert cloudpickle.loads(cloudpickle.dumps(serde)) is serde
    builder = StreamsBuilder()
    builder.stream("in", serde, serde).to("out")
    topology = cloudpickle.loads(cloudpickle.dumps(builder.build()))
    (source,) = [node for node in topology.nodes.values() if getattr(node, "topic", "") == "in"]
    assert source.key_serde is serde and source.value_serde is serde
