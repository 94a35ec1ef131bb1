"""A KTable's state as a Delta table with typed columns from its registry serde's schema
(registry/columns.py): ``value`` is the record as a struct, so SQL reads its fields."""

from __future__ import annotations

import pyarrow as pa

from streamplatform.registry.columns import avro_type, json_schema_type, protobuf_type
from streamplatform.runtime import delta_direct, state_tables
from streamplatform.runtime.state_tables import StateTable, merge_batch
from streamplatform.serdes import SerdeContext, Serdes
from tests.registry.formats import AVRO_ENRICHED, JSON_ENRICHED
from tests.registry.payments_pb2 import Enriched
from tests.runtime.test_state_tables import _updates

REGISTRY = {"schema.registry.url": "mock://columns"}
ENRICHED_STRUCT = pa.struct([("id", pa.int64()), ("amount", pa.float64()), ("eur", pa.float64())])


def test_schemas_become_arrow_types() -> None:
    assert avro_type({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": ["null", "string"]},
        {"name": "b", "type": {"type": "array", "items": "int"}},
        {"name": "c", "type": {"type": "map", "values": "double"}},
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
        {"name": "u", "type": ["int", "string"]},  # no Arrow type: JSON text
        {"name": "self", "type": ["null", "R"]},  # a recursive record: JSON text
    ]}) == pa.struct([
        ("a", pa.string()), ("b", pa.list_(pa.int32())), ("c", pa.map_(pa.string(), pa.float64())),
        ("t", pa.timestamp("ms", tz="UTC")), ("e", pa.string()), ("u", pa.string()),
        ("self", pa.string()),
    ])  # fmt: skip
    assert json_schema_type({"type": "object", "properties": {
        "n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
        "x": {}}}) == pa.struct([("n", pa.int64()), ("tags", pa.list_(pa.string())),
                                 ("x", pa.string())])  # fmt: skip
    assert protobuf_type(Enriched.DESCRIPTOR) == ENRICHED_STRUCT


def test_a_state_table_of_registry_values_has_the_schemas_struct(tmp_path) -> None:
    root = str(tmp_path / "app")
    for name, serde, value in [
        ("avro", Serdes.avro(AVRO_ENRICHED, registry=REGISTRY), {"id": 1, "amount": 2.0,
                                                                   "eur": 1.0}),
        ("protobuf", Serdes.protobuf(Enriched, registry=REGISTRY),
         Enriched(id=1, amount=2.0, eur=1.0)),
        ("json", Serdes.json_schema(JSON_ENRICHED, registry=REGISTRY), {"id": 1, "amount": 2.0,
                                                                          "eur": 1.0}),
    ]:  # fmt: skip
        table = StateTable(name, Serdes.string(), serde)
        assert table.schema.field("value").type == ENRICHED_STRUCT
        data = serde.serialize(value, SerdeContext(name, False, []))
        updates = _updates([(b"k", data, 0)])
        delta_direct.append(f"{root}/{name}", updates.append_column("batch_id", pa.array([0])),
                            f"app-sink-{name}", 0)  # fmt: skip
        assert merge_batch(root, "app", table, 0) == 1
        [row] = delta_direct.read(state_tables.state_table_path(root, name)).to_pylist()
        assert row["value"] == {"id": 1, "amount": 2.0, "eur": 1.0}, name


def test_value_fields_decode_with_the_headers_and_a_table_gains_the_column(tmp_path) -> None:
    """A Delta sink's ``value_fields`` (runtime/value_fields.py): values whose schema id is in
    a header decode too, and a sink table written before the setting was on gains the column
    (its older rows read it as null)."""
    from streamplatform.runtime.value_fields import ValueFields

    serde = Serdes.avro(AVRO_ENRICHED, schema_id_format="header", registry=REGISTRY)
    headers: list = []
    data = serde.serialize({"id": 1, "amount": 2.0, "eur": 1.0}, SerdeContext("s", False, headers))
    rows = _updates([(b"k", data, 0)])
    rows = rows.set_column(rows.schema.get_field_index("headers"), "headers", pa.array(
        [[{"key": name, "value": value} for name, value in headers]],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))))  # fmt: skip
    typed = ValueFields("s", serde).add_to(rows)
    assert typed.column("value_fields").to_pylist() == [{"id": 1, "amount": 2.0, "eur": 1.0}]

    path = str(tmp_path / "sink")
    before = rows.append_column("batch_id", pa.array([0]))
    delta_direct.append(path, before, "app-sink-s", 0, conform=True)
    after = typed.append_column("batch_id", pa.array([1]))
    delta_direct.append(path, after, "app-sink-s", 1, conform=True, merge_schema=True)
    read = delta_direct.read(path).sort_by("batch_id").to_pylist()
    assert [row["value_fields"] for row in read] == [None, {"id": 1, "amount": 2.0, "eur": 1.0}]
