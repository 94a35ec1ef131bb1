"""The program of the compiled Avro reader (``_avro_core.Reader``) for a writer schema.

The C reader does not parse Avro schemas: it is given this program, a nested tuple built here
once per schema from fastavro's parsed schema, and reads bodies into exactly what
``fastavro.schemaless_reader(body, writer_schema, None)`` returns for them. One node per
schema node, its first item the kind:

- ``("null",)``, ``("boolean",)``, ``("int",)``, ``("long",)``, ``("float",)``,
  ``("double",)``, ``("bytes",)``, ``("string",)``;
- ``("record", field_names, field_programs)``: a dict, the fields in the schema's order;
- ``("enum", symbols)``: the symbol (str); ``("fixed", size)``: bytes;
- ``("array", items)``: a list; ``("map", values)``: a dict with str keys;
- ``("union", branches)``: the value of the branch the index names;
- ``("logical", base, convert, schema)``: ``convert(value, schema, None)`` of the base
  type's value: fastavro's own conversion (its ``LOGICAL_READERS``), called as fastavro calls
  it, so a datetime, date, Decimal or UUID comes out as fastavro gives it;
- ``("timestamp-millis",)``, ``("timestamp-micros",)``, ``("local-timestamp-millis",)``,
  ``("local-timestamp-micros",)``, ``("date",)``: a long (an int for date) converted in C
  into what fastavro's own conversion gives (a call of it costs more than the rest of a
  small record's reading), where fastavro's own conversion is the one registered.

``program`` returns None for what the C reader does not read; the serde then reads with
fastavro, as before: a recursive type (a record that contains itself: the program is a finite
tree), a schema nested deeper than ``MAX_DEPTH`` (the C reader recurses once per level),
Avro protocol types (``error``, ``request``), and anything fastavro's parsed form would not
hold. Reader schemas (resolving a writer's schema to another) are not handled here: the serde
only uses the C reader when it reads with the writer's schema.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_DEPTH", "NATIVE_LOGICAL", "program"]

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# Deeper schemas are read by fastavro: the C reader's recursion stays far from the C stack's
# limits, whatever the schema.
MAX_DEPTH = 64
# The logical types the C reader converts itself, by fastavro's key ("<type>-<logicalType>"):
# the name of fastavro's conversion, and the program's node.
NATIVE_LOGICAL = {
    "long-timestamp-millis": ("read_timestamp_millis", "timestamp-millis"),
    "long-timestamp-micros": ("read_timestamp_micros", "timestamp-micros"),
    "long-local-timestamp-millis": ("read_local_timestamp_millis", "local-timestamp-millis"),
    "long-local-timestamp-micros": ("read_local_timestamp_micros", "local-timestamp-micros"),
    "int-date": ("read_date", "date"),
}


class _Refused(Exception):
    """The schema has something the C reader does not read."""


def program(schema: Any) -> tuple | None:
    """The program of ``schema`` (as ``fastavro.parse_schema`` returns it; its named types
    are in its ``__named_schemas``), or None when the C reader does not read it."""
    named = schema.get("__named_schemas", {}) if isinstance(schema, dict) else {}
    try:
        return _compiled(schema, named, frozenset(), 0)
    except _Refused:
        return None


def _compiled(node: Any, named: dict[str, Any], open_names: frozenset[str], depth: int) -> tuple:
    """``node``'s program. ``open_names``: the named types being compiled around it (a
    reference to one of them is recursion)."""
    if depth > MAX_DEPTH:
        raise _Refused
    if isinstance(node, str):
        if node in PRIMITIVES:
            return (node,)
        return _named(node, named, open_names, depth)
    if isinstance(node, list):  # a union
        return ("union", tuple(_compiled(branch, named, open_names, depth + 1)
                               for branch in node))  # fmt: skip
    if not isinstance(node, dict):
        raise _Refused
    kind = node.get("type")
    if not isinstance(kind, str):
        raise _Refused
    if kind in PRIMITIVES:
        base: tuple = (kind,)
    elif kind == "record":
        name = node.get("name")
        fields = node.get("fields")
        if not isinstance(name, str) or not isinstance(fields, list):
            raise _Refused
        inner = open_names | {name}
        names, programs = [], []
        for field in fields:
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                raise _Refused
            names.append(field["name"])
            programs.append(_compiled(field.get("type"), named, inner, depth + 1))
        base = ("record", tuple(names), tuple(programs))
    elif kind == "enum":
        symbols = node.get("symbols")
        if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
            raise _Refused
        base = ("enum", tuple(symbols))
    elif kind == "fixed":
        size = node.get("size")
        if type(size) is not int or size < 0:
            raise _Refused
        base = ("fixed", size)
    elif kind == "array":
        base = ("array", _compiled(node.get("items"), named, open_names, depth + 1))
    elif kind == "map":
        base = ("map", _compiled(node.get("values"), named, open_names, depth + 1))
    elif kind in named:
        # {"type": "ns.Name"}: fastavro reads the named type, and does not look at this
        # node's logicalType (read_data's branch for names).
        return _named(kind, named, open_names, depth)
    else:  # error, request, or a name fastavro does not know
        raise _Refused
    logical = node.get("logicalType")
    if logical:
        # As fastavro's read_data: the conversion registered for "<type>-<logicalType>",
        # if any; an unknown logical type reads as its base type.
        from fastavro import logical_readers

        key = f"{kind}-{logical}"
        convert = logical_readers.LOGICAL_READERS.get(key)
        if convert is None:
            return base
        native = NATIVE_LOGICAL.get(key)
        # Converted in C only where fastavro's own conversion is registered (not one a user
        # put in its place).
        if native is not None and convert is getattr(
            logical_readers._logical_readers, native[0], None
        ):
            return (native[1],)
        return ("logical", base, convert, node)
    return base


def _named(name: str, named: dict[str, Any], open_names: frozenset[str], depth: int) -> tuple:
    definition = named.get(name)
    if definition is None or name in open_names:  # unknown, or recursive
        raise _Refused
    return _compiled(definition, named, open_names, depth + 1)
