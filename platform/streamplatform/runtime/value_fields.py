"""Typed columns in Delta sinks: ``value_fields``, the value decoded by its schema.

With ``platform.delta.value.fields=true``, a Delta sink whose value serde has a schema (the
registry serdes: Avro, Protobuf, JSON Schema; registry/columns.py) gets a column
``value_fields`` beside ``value``: the record as the schema's struct, so Spark SQL and BI tools
read its fields (``value_fields.amount``). ``value`` keeps the bytes as written to Kafka, which
the runtime's own readers of the table use (state tables, ``batch_as_of_join``).

The column is added where the sink's rows are appended, on every path: to the Arrow rows that
delta-rs appends from the driver (``add_to``, ``add_to_stream``) and to the Spark frame that
Spark's Delta writer appends (``add_to_frame``: the decoding runs in Spark's Python workers).
The batch's one-Delta-sink shortcut that streams sink rows straight into the writer
(paths/delta_write.py) is not taken for such a job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from streamplatform.dsl.graph import SinkNode
from streamplatform.dsl.topology import Topology
from streamplatform.serdes import SerdeContext, uses_context

COLUMN = "value_fields"


class ValueFields:
    """The ``value_fields`` column of one Delta sink topic."""

    def __init__(self, topic: str, serde: Any) -> None:
        self.topic = topic
        self.serde = serde
        self.type: pa.DataType = serde.column_type()

    def values(self, values: list[bytes | None], headers: list[Any]) -> pa.Array:
        """``values`` decoded (with their records' headers: the schema id may be there)."""
        contextual = uses_context(self.serde)
        decoded: list[Any] = []
        for value, header_list in zip(values, headers, strict=True):
            if value is None:
                decoded.append(None)
                continue
            pairs = [(h["key"], h["value"]) for h in header_list or ()]
            record = (self.serde.deserialize(value, SerdeContext(self.topic, False, pairs))
                      if contextual else self.serde.deserialize(value))  # fmt: skip
            decoded.append(self.serde.column_value(record))
        return pa.array(decoded, self.type)

    def add_to(self, rows: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
        """Sink rows (with ``value`` and ``headers`` as a list of key/value structs) with the
        column added."""
        column = self.values(rows.column("value").to_pylist(), rows.column("headers").to_pylist())
        return rows.append_column(pa.field(COLUMN, self.type), column)

    def add_to_stream(self, reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
        schema = reader.schema.append(pa.field(COLUMN, self.type))

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in reader:
                yield self.add_to(batch)

        return pa.RecordBatchReader.from_batches(schema, batches())

    def add_to_frame(self, frame: Any) -> Any:
        """A Spark frame of sink rows with the column added, by Spark's Python workers."""
        from pyspark.sql.pandas.types import from_arrow_type
        from pyspark.sql.types import StructField, StructType

        schema = StructType(
            [*frame.schema.fields, StructField(COLUMN, from_arrow_type(self.type), True)]
        )
        add = self.add_to

        def add_to_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                yield add(batch)

        return frame.mapInArrow(add_to_batches, schema)


def value_fields(
    topology: Topology, settings: Mapping[str, Any], delta_sinks: frozenset[str]
) -> dict[str, ValueFields]:
    """The Delta sinks that get ``value_fields`` (none unless the setting is on): those whose
    value serde has a schema to decode by."""
    if not settings.get("platform.delta.value.fields"):
        return {}
    found: dict[str, ValueFields] = {}
    for node in topology.nodes.values():
        if isinstance(node, SinkNode) and not node.internal and node.topic in delta_sinks:
            column_type = getattr(node.value_serde, "column_type", None)
            if column_type is not None and column_type() is not None:
                found[node.topic] = ValueFields(node.topic, node.value_serde)
    return found
