"""A table's current state as a Delta table: one row per key (per key and window), kept exactly
once by one MERGE per micro-batch.

A job names sink topics whose records are a table's updates (``table.to_stream().to(topic)``)
in ``delta_state_tables``. Each is also a Delta sink: ``<root>/<application.id>/<topic>``
keeps every update, as any Delta sink. Before the batch commits, its updates (that table's
rows of the batch) are merged into ``<root>/<application.id>/<topic>_state``: per key the
batch's last update sets the row, a tombstone deletes it. The rows are decoded with the sink's
serdes, so SQL and BI tools read them as they are:

- ``key``: the key (for a windowed table the record key, with ``window_start`` and
  ``window_end`` as UTC timestamps);
- ``value``: a string, long or bytes value as it is, a JSON value as its JSON text, a
  registry serde's value as its schema's struct (an Avro record, a Protobuf message, a JSON
  schema's object: ``value.amount`` in SQL; registry/columns.py);
- ``timestamp`` (UTC) and ``batch_id``: the update's record time and the batch that made it.

The MERGE records the batch in the commit as a Delta transaction (``<app>-state-<topic>``,
version = batch id), as the appends do: a batch that is run again after a crash skips a
MERGE it already made. A batch's last update of a key is the one of the highest source
offset; updates forwarded at a commit (the record cache's) have none, and keep the order the
task wrote them in (a key's updates are all made by one task).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform.config import ConfigError
from streamplatform.dsl.graph import SinkNode
from streamplatform.dsl.topology import Topology
from streamplatform.runtime import delta_direct
from streamplatform.serdes import Serde

STATE_SUFFIX = "_state"
_TIME = pa.timestamp("ms", tz="UTC")
_ARROW_TYPES = {"string": pa.string(), "long": pa.int64(), "bytes": pa.binary(),
                "json": pa.string()}  # fmt: skip


def state_table_path(root: str, topic: str) -> str:
    """Where the current state of ``topic``'s table is (``root``: the job's Delta root)."""
    return f"{root}/{topic}{STATE_SUFFIX}"


class StateTable:
    """How one sink topic's records become rows of its state table."""

    def __init__(self, topic: str, key_serde: Serde, value_serde: Serde) -> None:
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde
        # A windowed key's serde wraps the record key's (TimeWindowedSerde and the like).
        self.inner_key_serde: Serde | None = getattr(key_serde, "inner", None)
        self.windowed = self.inner_key_serde is not None
        key_type = _arrow_type(self.inner_key_serde if self.windowed else key_serde)
        fields = [pa.field("key", key_type)]
        if self.windowed:
            fields += [pa.field("window_start", _TIME), pa.field("window_end", _TIME)]
        fields += [pa.field("value", _arrow_type(value_serde)), pa.field("timestamp", _TIME),
                   pa.field("batch_id", pa.int64())]  # fmt: skip
        self.schema = pa.schema(fields)

    @classmethod
    def of(cls, topology: Topology, topic: str) -> StateTable:
        """The state table of sink ``topic`` of ``topology``, decoded with the sink's serdes."""
        sinks = [
            node
            for node in topology.nodes.values()
            if isinstance(node, SinkNode) and node.topic == topic and not node.internal
        ]
        if not sinks:
            raise ConfigError(f"delta_state_tables: {topic!r} is not a sink topic of the job")
        return cls(topic, sinks[0].key_serde, sinks[0].value_serde)

    def rows(self, updates: pa.Table, batch_id: int) -> tuple[pa.Table, pa.Table]:
        """The batch's ``updates`` (sink rows) as (rows to set, keys to delete): each key's
        last update only."""
        order = pc.sort_indices(updates, [("source_partition", "ascending"),
                                          ("source_offset", "ascending")]).to_pylist()  # fmt: skip
        keys, values = updates["key"].to_pylist(), updates["value"].to_pylist()
        timestamps = updates["timestamp"].to_pylist()
        last: dict[Any, int] = {}
        for i in order:
            last.pop(keys[i], None)
            last[keys[i]] = i
        columns: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        deleted: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        for raw_key, i in last.items():
            target = columns if values[i] is not None else deleted
            if self.windowed:
                windowed = self.key_serde.deserialize(raw_key)
                target["key"].append(_plain(self.inner_key_serde, windowed.key))
                target["window_start"].append(windowed.window.start)
                target["window_end"].append(windowed.window.end)
            else:
                target["key"].append(_plain(self.key_serde, self.key_serde.deserialize(raw_key)))
            value = values[i]
            target["value"].append(
                None if value is None else _plain(self.value_serde,
                                                  self.value_serde.deserialize(value)))  # fmt: skip
            target["timestamp"].append(timestamps[i])
            target["batch_id"].append(batch_id)
        return (pa.table(columns, schema=self.schema), pa.table(deleted, schema=self.schema))

    def key_columns(self) -> list[str]:
        return ["key", "window_start"] if self.windowed else ["key"]


def _arrow_type(serde: Serde | None) -> pa.DataType:
    typed = _column_type(serde)
    if typed is not None:
        return typed
    return _ARROW_TYPES.get(getattr(serde, "name", ""), pa.binary())


def _column_type(serde: Serde | None) -> pa.DataType | None:
    """The typed column of a serde that gives one (a registry serde: its schema's struct)."""
    column_type = getattr(serde, "column_type", None)
    return None if column_type is None else column_type()


def _plain(serde: Serde | None, value: Any) -> Any:
    """A deserialized value as its state-table column holds it."""
    if value is not None and _column_type(serde) is not None:
        return serde.column_value(value)  # type: ignore[union-attr]
    name = getattr(serde, "name", "")
    if name == "json":
        return None if value is None else json.dumps(value, sort_keys=True)
    if name in _ARROW_TYPES:
        return value
    return value if value is None or isinstance(value, bytes) else serde.serialize(value)  # type: ignore[union-attr]


def merge_batch(root: str, app: str, table: StateTable, batch_id: int) -> int:
    """Merge batch ``batch_id``'s updates of ``table`` (read from its sink's Delta table) into
    its state table, once: the number of keys set or deleted (0 when merged before)."""
    from deltalake import CommitProperties, Transaction

    path, app_id = state_table_path(root, table.topic), f"{app}-state-{table.topic}"
    recorded = delta_direct.transaction_version(path, app_id)
    if recorded is not None and batch_id <= recorded:
        return 0
    updates = delta_direct.read(
        f"{root}/{table.topic}",
        filters=[("batch_id", "=", batch_id)],
        columns=["key", "value", "timestamp", "source_partition", "source_offset"],
    )
    if updates.num_rows == 0:
        return 0  # nothing to merge (and a batch run again has nothing either)
    upserts, deletes = table.rows(updates, batch_id)
    existing = delta_direct.table_or_none(path)
    commit = CommitProperties(app_transactions=[Transaction(app_id=app_id, version=batch_id)])
    if existing is None:
        delta_direct.write(path, upserts, mode="append", commit_properties=commit)
        return upserts.num_rows
    source = pa.concat_tables([
        upserts.append_column("deleted", pa.array([False] * upserts.num_rows, pa.bool_())),
        deletes.append_column("deleted", pa.array([True] * deletes.num_rows, pa.bool_())),
    ])  # fmt: skip
    on = " AND ".join(f"t.{column} = s.{column}" for column in table.key_columns())
    columns = {name: f"s.{name}" for name in table.schema.names}
    (
        existing.merge(
            source, predicate=on, source_alias="s", target_alias="t", commit_properties=commit
        )  # fmt: skip
        .when_matched_delete(predicate="s.deleted")
        .when_matched_update(columns, predicate="NOT s.deleted")
        .when_not_matched_insert(columns, predicate="NOT s.deleted")
        .execute()
    )
    return source.num_rows


def merge_all(root: str, app: str, tables: Iterable[StateTable], batch_id: int) -> int:
    """``merge_batch`` for each state table: the keys set or deleted in all."""
    return sum(merge_batch(root, app, table, batch_id) for table in tables)
