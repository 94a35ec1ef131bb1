"""The compiled Avro reader (registry/_avro_core.c, its program from registry/avro_program.py)
against its reference, fastavro's ``schemaless_reader``, and the Avro serde's bulk read
(``deserialize_all``) against its record-by-record ``deserialize``."""

from __future__ import annotations

import io
import itertools
import json
import math
import struct
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform.registry.avro_program import MAX_DEPTH, program
from streamplatform.registry.serdes import AvroSerde
from streamplatform.runtime.source_records import UNDECODED, decode_slice
from streamplatform.serdes import SerdeContext, SerializationError, deserialize_all

_avro_core = pytest.importorskip("streamplatform.registry._avro_core")
Reader = _avro_core.Reader
PREFIX = b"\x00\x00\x00\x00\x07"  # magic byte, schema id 7: what read_all skips


def _parsed(schema: Any) -> Any:
    return fastavro.parse_schema(schema)


def _encoded(parsed: Any, value: Any) -> bytes:
    out = io.BytesIO()
    out.write(PREFIX)
    fastavro.schemaless_writer(out, parsed, value)
    return out.getvalue()


def _fastavro(parsed: Any, data: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(data[5:]), parsed, None)


def _reader(parsed: Any) -> Any:
    compiled = program(parsed)
    assert compiled is not None
    return Reader(compiled)


def _same(a: Any, b: Any) -> bool:
    """Equal, of the same types, dicts in the same order; NaN is NaN and -0.0 is not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def _long(value: int) -> bytes:
    """Avro's zigzag varint."""
    bits = ((value << 1) ^ (value >> 63)) & (2**64 - 1)
    out = bytearray()
    while True:
        byte, bits = bits & 0x7F, bits >> 7
        out.append(byte | (0x80 if bits else 0))
        if not bits:
            return bytes(out)


# Random schemas and values ---------------------------------------------------------------

PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
_names = itertools.count()


@st.composite
def schemas(draw: Any, depth: int = 0) -> Any:
    """A random writer schema: every kind the reader reads, nested up to 3 levels."""
    kinds = PRIMITIVES + ["enum", "fixed"]
    if depth < 3:
        kinds += ["record", "array", "map", "union"] * 2
    kind = draw(st.sampled_from(kinds))
    name = f"T{next(_names)}"
    if kind in PRIMITIVES:
        return kind if draw(st.booleans()) else {"type": kind}
    if kind == "enum":
        count = draw(st.integers(1, 5))
        return {"type": "enum", "name": name, "symbols": [f"S{i}" for i in range(count)]}
    if kind == "fixed":
        return {"type": "fixed", "name": name, "size": draw(st.integers(0, 6))}
    if kind == "record":
        fields = draw(st.lists(schemas(depth + 1), max_size=4))
        return {"type": "record", "name": name,
                "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(fields)]}  # fmt: skip
    if kind == "array":
        return {"type": "array", "items": draw(schemas(depth + 1))}
    if kind == "map":
        return {"type": "map", "values": draw(schemas(depth + 1))}
    # A union: distinct primitives, maybe a named type and an array (no union in a union).
    branches: list[Any] = draw(st.lists(st.sampled_from(PRIMITIVES), min_size=1, max_size=4,
                                        unique=True))  # fmt: skip
    if draw(st.booleans()):
        inner = draw(schemas(depth + 1))
        if isinstance(inner, dict) and inner["type"] in ("record", "enum", "fixed", "array"):
            branches.append(inner)
    return branches


def values(schema: Any) -> st.SearchStrategy[Any]:
    """Random values of ``schema``."""
    kind = schema if isinstance(schema, str) else "union" if isinstance(schema, list) else (
        schema["type"])  # fmt: skip
    simple: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, -1, 2**63 - 1, -(2**63)]),
        "float": st.floats(width=32) | st.sampled_from([-0.0, math.nan, math.inf]),
        "double": st.floats() | st.sampled_from([-0.0, math.nan, -math.inf]),
        "bytes": st.binary(max_size=12),
        "string": st.text(max_size=12),
    }
    if kind in simple:
        return simple[kind]
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "fixed":
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: values(f["type"]) for f in schema["fields"]})
    if kind == "array":
        return st.lists(values(schema["items"]), max_size=4)
    if kind == "map":
        return st.dictionaries(st.text(max_size=6), values(schema["values"]), max_size=4)
    return st.one_of([values(branch) for branch in schema])


@st.composite
def schemas_and_values(draw: Any) -> tuple[Any, list[Any]]:
    schema = draw(schemas())
    return schema, draw(st.lists(values(schema), min_size=1, max_size=4))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas_and_values())
def test_the_reader_reads_what_fastavro_reads(case: tuple[Any, list[Any]]) -> None:
    schema, written = case
    parsed = _parsed({"type": "record", "name": "Top", "fields": [{"name": "v", "type": schema}]})
    _check(parsed, [_encoded(parsed, {"v": value}) for value in written])
    bare = _parsed(schema)  # not a record at the top: the schema as it is
    _check(bare, [_encoded(bare, value) for value in written])


def _check(parsed: Any, datas: list[bytes]) -> None:
    """The reader gives fastavro's values, and None for None; it refuses a body of no bytes
    (as the serde's fast path does: confluent's deserializer reads such a value)."""
    reader = _reader(parsed)
    bodies = [data for data in datas if len(data) > 5]
    expected = [_fastavro(parsed, data) for data in bodies]
    assert _same(reader.read_all([*bodies, None], 5), [*expected, None])
    for data in datas:
        if len(data) == 5:
            with pytest.raises(ValueError, match="no body"):
                reader.read_all([data])


@pytest.mark.slow  # a property test of hundreds of examples: make test-all
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas_and_values(), st.data())
def test_malformed_values_raise_and_never_crash(case: tuple[Any, list[Any]], data: Any) -> None:
    schema, written = case
    parsed = _parsed(schema)
    reader = _reader(parsed)
    encoded = _encoded(parsed, written[0])
    # Truncated anywhere in the body (a body is self-delimiting: no prefix of one is another).
    for end in range(5, len(encoded)):
        with pytest.raises(ValueError):
            reader.read_all([encoded[:end]])
    # Bytes after the body: fastavro ignores them; the reader refuses (the serde then reads
    # the chunk record by record, with fastavro).
    with pytest.raises(ValueError, match="after its body"):
        reader.read_all([encoded + b"\x00"])
    # Random bytes: a value the reader gives is fastavro's.
    garbage = PREFIX + data.draw(st.binary(min_size=1, max_size=24))
    try:
        got = reader.read_all([garbage])
    except ValueError:
        return
    source = io.BytesIO(garbage[5:])
    assert _same(got, [fastavro.schemaless_reader(source, parsed, None)])
    assert source.tell() == len(garbage) - 5


def test_hand_written_blocks_varints_and_edges() -> None:
    longs = _parsed({"type": "array", "items": "long"})
    # Blocks with negative counts (then the block's size in bytes), several blocks, empty.
    body = (_long(-2) + _long(2) + _long(1) + _long(-1) + _long(-1) + _long(1)
            + _long(2**63 - 1) + _long(0))  # fmt: skip
    cases = [PREFIX + body, PREFIX + _long(0)]
    reader = _reader(longs)
    expected = [[1, -1, 2**63 - 1], []]
    assert reader.read_all(cases) == expected == [_fastavro(longs, d) for d in cases]
    maps = _parsed({"type": "map", "values": "int"})
    body = _long(-2) + _long(6) + b"\x02a" + _long(1) + b"\x02b" + _long(2) + _long(1) + b"\x02a" + _long(3) + _long(0)  # fmt: skip
    got = _reader(maps).read_all([PREFIX + body])
    assert got == [{"a": 3, "b": 2}] == [_fastavro(maps, PREFIX + body)]  # the last "a" wins
    # An int beyond 32 bits, a boolean byte other than 0 and 1: as fastavro reads them.
    for schema, body in (("int", _long(2**40)), ("boolean", b"\x02"), ("long", b"\x80\x00")):
        parsed = _parsed(schema)
        assert _reader(parsed).read_all([PREFIX + body]) == [_fastavro(parsed, PREFIX + body)]
    # Refused (fastavro reads them, differently or not at all): a varint beyond 64 bits,
    # indexes out of range (fastavro takes a negative one from the list's end), bad UTF-8,
    # a negative length, a body of no bytes, a count no value could hold.
    union = _parsed(["null", "long"])
    enum = _parsed({"type": "enum", "name": "E", "symbols": ["A", "B"]})
    for parsed, body in (
        (_parsed("long"), b"\xff" * 10 + b"\x01"),
        (_parsed("long"), b"\xff" * 9 + b"\x02"),
        (union, _long(2)),
        (union, _long(-1) + _long(5)),
        (enum, _long(2)),
        (enum, _long(-1)),
        (_parsed("string"), _long(2) + b"\xc3\x28"),
        (_parsed("string"), _long(3) + b"\xed\xa0\x80"),  # a surrogate
        (_parsed("bytes"), _long(-1)),
        (_parsed("null"), b""),
        (longs, _long(1000) + _long(1)),
        (longs, _long(-(2**63))),
        (_parsed({"type": "array", "items": "null"}), _long(2**40)),
    ):
        with pytest.raises(ValueError):
            _reader(parsed).read_all([PREFIX + body])
    with pytest.raises(UnicodeDecodeError):
        _reader(_parsed("string")).read_all([PREFIX + _long(2) + b"\xc3\x28"])
    # A value that does not start with the prefix asked for: None (another schema's value).
    assert _reader(_parsed("long")).read_all([PREFIX + b"\x02"], 5, b"\x00\x00\x00\x00\x08") is None
    with pytest.raises(TypeError):
        _reader(_parsed("long")).read_all([bytearray(PREFIX + b"\x02")])


def test_floats_as_fastavro_reads_them() -> None:
    for schema, fmt in (("float", "<f"), ("double", "<d")):
        parsed = _parsed(schema)
        bits = [b"\x00\x00\xc0\x7f", b"\x01\x00\x80\x7f", b"\x00\x00\x00\x80"]  # NaN, sNaN, -0.0
        datas = [PREFIX + struct.pack(fmt, x) for x in (-0.0, math.nan, math.inf, 1e-40, 3.5)]
        if schema == "float":
            datas += [PREFIX + b for b in bits]
        assert _same(_reader(parsed).read_all(datas), [_fastavro(parsed, d) for d in datas])


_TIMES = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-62135596800000000 - 10, 253402300799999999 + 10),
    st.integers(-62135596800000 - 10, 253402300799999 + 10),
    st.integers(-719162 - 3, 2932896 + 3),
    st.integers(-(10**6), 10**6),
)
LOGICAL = [
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
]


@pytest.mark.slow  # a property test of hundreds of examples: make test-all
@settings(max_examples=300, deadline=None)
@given(st.sampled_from(LOGICAL), _TIMES)
def test_dates_and_times_as_fastavro_converts_them(schema: dict, amount: int) -> None:
    parsed = _parsed(schema)
    data = PREFIX + _long(amount)
    try:
        expected = _fastavro(parsed, data)
    except (OverflowError, ValueError):
        with pytest.raises((OverflowError, ValueError)):
            _reader(parsed).read_all([data])
        return
    got = _reader(parsed).read_all([data])
    assert got == [expected]
    assert type(got[0]) is type(expected)
    assert getattr(got[0], "tzinfo", None) is getattr(expected, "tzinfo", None)


def test_logical_types_read_by_fastavros_conversions() -> None:
    assert program(_parsed(LOGICAL[0])) == ("timestamp-millis",)
    assert program(_parsed(LOGICAL[4])) == ("date",)
    schema = _parsed({"type": "record", "name": "L", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "f", "type": {"type": "fixed", "name": "D", "size": 4, "logicalType": "decimal", "precision": 8, "scale": 3}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "t", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
        {"name": "x", "type": {"type": "string", "logicalType": "not-known"}},
    ]})  # fmt: skip
    value = {"d": Decimal("-12.34"), "f": Decimal("1.500"),
             "u": UUID("12345678-1234-5678-1234-567812345678"),
             "t": datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC), "x": "plain"}  # fmt: skip
    data = _encoded(schema, value)
    assert _reader(schema).read_all([data]) == [_fastavro(schema, data)] == [value]
    # A conversion registered in place of fastavro's is called, not the C one.
    from fastavro.read import LOGICAL_READERS

    original = LOGICAL_READERS["long-timestamp-millis"]
    LOGICAL_READERS["long-timestamp-millis"] = lambda data, writer, reader: ("ms", data)
    try:
        parsed = _parsed(LOGICAL[0])
        assert program(parsed)[0] == "logical"  # type: ignore[index]
        assert _reader(parsed).read_all([PREFIX + _long(5)]) == [("ms", 5)]
    finally:
        LOGICAL_READERS["long-timestamp-millis"] = original


def test_named_types_and_what_is_refused() -> None:
    named = _parsed({"type": "record", "name": "R", "namespace": "ns", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
        {"name": "again", "type": "E"},
        {"name": "inner", "type": {"type": "record", "name": "I", "fields": [{"name": "x", "type": "int"}]}},
        {"name": "more", "type": {"type": "array", "items": "ns.I"}},
    ]})  # fmt: skip
    value = {"e": "B", "again": "A", "inner": {"x": 1}, "more": [{"x": 2}, {"x": 3}]}
    data = _encoded(named, value)
    assert _reader(named).read_all([data]) == [value] == [_fastavro(named, data)]
    # Recursive: refused (fastavro reads it).
    linked = _parsed({"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "long"}, {"name": "next", "type": ["null", "Node"]}]})  # fmt: skip
    assert program(linked) is None
    deep: Any = "long"
    for _ in range(MAX_DEPTH + 2):
        deep = {"type": "array", "items": deep}
    assert program(_parsed(deep)) is None
    with pytest.raises(ValueError):
        Reader(("unknown",))
    with pytest.raises(ValueError):
        Reader(("record", ("a",), ()))


# The Avro serde's bulk read --------------------------------------------------------------

V1 = json.dumps({"type": "record", "name": "Tx", "namespace": "t", "fields": [
    {"name": "id", "type": "string"}, {"name": "amount", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tags", "type": {"type": "map", "values": "string"}},
    {"name": "note", "type": ["null", "string"]}]})  # fmt: skip
V2 = json.dumps({"type": "record", "name": "Tx", "namespace": "t", "fields": [
    *json.loads(V1)["fields"], {"name": "currency", "type": "string", "default": "EUR"}]})  # fmt: skip
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _tx(i: int, v2: bool = False) -> dict:
    value = {"id": f"tx-{i}", "amount": i * 10**12, "at": EPOCH + timedelta(milliseconds=i),
             "tags": {"k": str(i)} if i % 2 else {}, "note": None if i % 3 else "n"}  # fmt: skip
    return value | {"currency": "USD"} if v2 else value


def _serde(scope: str, schema: str | None = V1, **options: Any) -> AvroSerde:
    return AvroSerde(schema, registry={"schema.registry.url": f"mock://avro-core-{scope}"},
                     **options)  # fmt: skip


CTX = SerdeContext("txs", False, [])


def _written(serde: AvroSerde, value: dict) -> bytes:
    data = serde.serialize(value, CTX)
    assert data is not None
    return data


def _one_by_one(serde: AvroSerde, datas: list, headers: list | None = None) -> list:
    return [serde.deserialize(d, SerdeContext("txs", False, h)) for d, h in
            zip(datas, headers or [[]] * len(datas), strict=True)]  # fmt: skip


def test_deserialize_all_reads_a_chunk_as_deserialize_does() -> None:
    writer = _serde("bulk")
    datas: list[bytes | None] = [_written(writer, _tx(i)) for i in range(300)] + [None]
    for reader in (_serde("bulk"), _serde("bulk", None)):  # the same schema, or the writer's
        assert deserialize_all(reader, datas, [[]] * len(datas)) == _one_by_one(reader, datas)
        assert deserialize_all(reader, datas) == _one_by_one(reader, datas)  # no headers
        assert reader._plans().compiled(_written(writer, _tx(0))[:5]) is not None  # C read them
    assert deserialize_all(writer, [None, None]) == [None, None]


def test_deserialize_all_falls_back_where_the_fast_path_would_not_run() -> None:
    writer = _serde("fallback")
    good = [_written(writer, _tx(i)) for i in range(10)]
    reader = _serde("fallback")
    # Trailing bytes: fastavro ignores them, the C reader refuses: record by record.
    datas = [*good, good[0] + b"\x00"]
    assert deserialize_all(reader, datas) is None
    assert _one_by_one(reader, datas)[-1] == _tx(0)
    # Truncated, an unknown schema id, no magic byte: record by record, which raises.
    for bad in (good[1][:-1], b"\x00\x00\x00\x7f\x00" + good[1][5:], b"\x01" + good[1][1:]):
        assert deserialize_all(reader, [*good, bad]) is None
        with pytest.raises(SerializationError):
            reader.deserialize(bad, CTX)
    # A schema id in a header of the value (not of the key): the header wins, record by record.
    headers: list[list] = [[]] * 9 + [[("__value_schema_id", b"\x01" + bytes(16))]]
    assert deserialize_all(reader, good, headers) is None
    expected = [_tx(i) for i in range(10)]
    assert deserialize_all(reader, good, [[("__key_schema_id", b"x")]] * 10) == expected
    assert deserialize_all(reader, good, [[("__value_schema_id", b"x")]] * 10, True) == expected
    # A reader schema other than the writer's (resolution), from_dict: fastavro reads them.
    newer = _serde("fallback", V2)
    assert deserialize_all(newer, good) is None
    assert _one_by_one(newer, good)[0] == _tx(0) | {"currency": "EUR"}
    assert deserialize_all(_serde("fallback", from_dict=lambda d, ctx: d), good) is None


def test_deserialize_all_reads_a_chunk_of_several_schemas_by_schema_id() -> None:
    v1 = _serde("mixed")
    v2 = _serde("mixed", V2)
    datas = [_written(v2 if i % 3 == 0 else v1, _tx(i, v2=i % 3 == 0)) for i in range(30)]
    assert len({d[:5] for d in datas}) == 2
    reader = _serde("mixed", None)  # with the writers' schemas
    assert deserialize_all(reader, datas) == _one_by_one(reader, datas)
    assert deserialize_all(reader, datas) == [_tx(i, v2=i % 3 == 0) for i in range(30)]


def test_a_tasks_slices_carry_the_headers_to_the_serde() -> None:
    writer = _serde("slices")
    records: list[tuple] = [("txs", 0, i, 0, None, _written(writer, _tx(i)), []) for i in range(5)]
    source = SimpleNamespace(key_serde=_serde("slices"), value_serde=_serde("slices"))
    assert [value for _, _, value in decode_slice(source, records, 0)] == [_tx(i) for i in range(5)]
    records[2] = (*records[2][:6], [("__value_schema_id", b"\x01" + bytes(16))])
    assert all(value is UNDECODED for _, _, value in decode_slice(source, records, 0))
