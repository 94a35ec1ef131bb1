"""Arrow types from registry schemas: a table's state as typed Delta columns.

A KTable kept as a Delta table of its current state (``delta_state_tables``) decodes its values
with the sink's serde. For a registry serde the ``value`` column is then the schema's record as
an Arrow struct (Spark SQL reads ``value.amount``) instead of the wire bytes. What no Arrow type
fits (an Avro union of several non-null types, a JSON schema without types) is kept as JSON
text, so no value is lost.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import pyarrow as pa

_AVRO_PRIMITIVES = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
}  # fmt: skip
_AVRO_LOGICAL = {
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "uuid": pa.string(),
}
JSON_TEXT = pa.string()  # what no Arrow type fits: the value as JSON text


@lru_cache(maxsize=64)
def avro_type_of(text: str) -> pa.DataType:
    """``avro_type`` of a schema's text, once per schema (a state table asks per row)."""
    return avro_type(json.loads(text))


@lru_cache(maxsize=64)
def json_schema_type_of(text: str) -> pa.DataType:
    return json_schema_type(json.loads(text))


@lru_cache(maxsize=64)
def protobuf_type_of(message_type: type) -> pa.DataType:
    return protobuf_type(message_type.DESCRIPTOR)  # type: ignore[attr-defined]


def avro_type(schema: Any, named: dict[str, pa.DataType] | None = None) -> pa.DataType:
    """The Arrow type of Avro ``schema`` (parsed JSON); fastavro gives values that fit it."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[schema]
        return named.get(schema, JSON_TEXT)
    if isinstance(schema, list):  # a union: ["null", T] is a nullable T
        others = [branch for branch in schema if branch != "null"]
        return avro_type(others[0], named) if len(others) == 1 else JSON_TEXT
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[logical]
    if logical == "decimal":
        return pa.decimal128(schema.get("precision", 38), schema.get("scale", 0))
    if kind == "record":
        struct = pa.struct([
            pa.field(field["name"], avro_type(field["type"], named)) for field in schema["fields"]
        ])  # fmt: skip
        name = schema["name"]
        named[name] = struct
        if schema.get("namespace") and "." not in name:
            named[f"{schema['namespace']}.{name}"] = struct
        return struct
    if kind == "array":
        return pa.list_(avro_type(schema["items"], named))
    if kind == "map":
        return pa.map_(pa.string(), avro_type(schema["values"], named))
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    return avro_type(kind, named)


_JSON_TYPES = {"integer": pa.int64(), "number": pa.float64(), "string": pa.string(),
               "boolean": pa.bool_()}  # fmt: skip


def json_schema_type(schema: Any) -> pa.DataType:
    """The Arrow type of a JSON schema: objects with properties as structs, arrays with items
    as lists, the scalar types; anything else as JSON text."""
    if not isinstance(schema, dict):
        return JSON_TEXT
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: a nullable string
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind == "object" and isinstance(schema.get("properties"), dict):
        return pa.struct([pa.field(name, json_schema_type(sub))
                          for name, sub in schema["properties"].items()])  # fmt: skip
    if kind == "array" and isinstance(schema.get("items"), dict):
        return pa.list_(json_schema_type(schema["items"]))
    return _JSON_TYPES.get(kind, JSON_TEXT)  # type: ignore[arg-type]


def protobuf_type(descriptor: Any) -> pa.DataType:
    """The Arrow type of a Protobuf message descriptor (enums as their names)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    scalars = {
        F.TYPE_DOUBLE: pa.float64(), F.TYPE_FLOAT: pa.float32(), F.TYPE_INT64: pa.int64(),
        F.TYPE_UINT64: pa.uint64(), F.TYPE_INT32: pa.int32(), F.TYPE_FIXED64: pa.uint64(),
        F.TYPE_FIXED32: pa.uint32(), F.TYPE_BOOL: pa.bool_(), F.TYPE_STRING: pa.string(),
        F.TYPE_BYTES: pa.binary(), F.TYPE_UINT32: pa.uint32(), F.TYPE_SFIXED32: pa.int32(),
        F.TYPE_SFIXED64: pa.int64(), F.TYPE_SINT32: pa.int32(), F.TYPE_SINT64: pa.int64(),
        F.TYPE_ENUM: pa.string(),
    }  # fmt: skip
    fields = []
    for field in descriptor.fields:
        if field.type == F.TYPE_MESSAGE:
            kind = protobuf_type(field.message_type)
        else:
            kind = scalars.get(field.type, JSON_TEXT)
        if _is_repeated(field):
            kind = pa.list_(kind)
        fields.append(pa.field(field.name, kind))
    return pa.struct(fields)


def _is_repeated(field: Any) -> bool:
    from google.protobuf.descriptor import FieldDescriptor

    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def protobuf_values(message: Any) -> dict[str, Any]:
    """A message as the dict its ``protobuf_type`` struct holds."""
    from google.protobuf.descriptor import FieldDescriptor as F

    values: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)

        def one(item: Any, field: Any = field) -> Any:
            if field.type == F.TYPE_MESSAGE:
                return protobuf_values(item)
            if field.type == F.TYPE_ENUM:
                return field.enum_type.values_by_number[item].name
            return item

        values[field.name] = [one(item) for item in value] if _is_repeated(field) else one(value)
    return values


def fitted(kind: pa.DataType, value: Any) -> Any:
    """``value`` as a column of ``kind`` takes it: JSON text where ``kind`` is that fallback
    and the value is not a string already."""
    if kind == JSON_TEXT and not isinstance(value, str) and value is not None:
        return json.dumps(value, sort_keys=True, default=str)
    if pa.types.is_struct(kind) and isinstance(value, dict):
        return {f.name: fitted(f.type, value.get(f.name)) for f in kind}
    if pa.types.is_list(kind) and isinstance(value, list):
        return [fitted(kind.value_type, item) for item in value]
    return value
