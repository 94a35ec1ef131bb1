"""The state changelog in Delta, and restoring a task's stores from it.

Every micro-batch appends, per task and store, the batch's store writes as rows
``(task, store, batch_id, seq, column_family, key, value)`` (value None = delete) to
``<root>/<application.id>/_changelog``, partitioned by task. The writes are the store's own
column-family writes, so replaying them batch by batch rebuilds the store exactly, whatever its
kind. A task whose local state is missing or behind the commit log (a new executor, a wiped
state dir) replays the batches it lacks; a warm standby replays them continuously. Deletes of
keys that a key-value store's committed data did not hold are left out (they change nothing
on replay, and a deduplication store would otherwise log one for nearly every id it expires).

A task's stream time and stream-time punctuation schedule, which it commits with its stores'
offsets (task.py), travel in the changelog too, as rows of the column family
``TASK_OFFSETS`` in the task's first store: a task restored on another executor goes on with
them, as one reopened from its local state does, instead of starting its stream time and
schedules over.

Executors have no SparkSession: the driver resolves the live files of each task's partition
from the Delta log (delta-rs, in milliseconds) and the executor reads them with pyarrow.
"""

from __future__ import annotations

import re
import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import unquote, urlparse

from streamplatform.records import TopicPartition

CHANGELOG_SCHEMA = (
    "task STRING, store STRING, batch_id LONG, seq LONG, column_family STRING, "
    "key BINARY, value BINARY"
)
_TASK_DIRECTORY = re.compile(r"/task=([^/]+)/")
# The column family of the rows that carry a task's own offsets (stream time, punctuation
# schedule) instead of store data. No store has a column family of this name.
TASK_OFFSETS = "__task_offsets__"
_OFFSET = struct.Struct(">q")


def task_offset_rows(offsets: Mapping[Any, int]) -> list[tuple[str, bytes, bytes]]:
    """``offsets`` (TopicPartition -> offset) as changelog writes of ``TASK_OFFSETS``."""
    return [
        (TASK_OFFSETS, f"{tp[0]}\x00{tp[1]}".encode(), _OFFSET.pack(offset))
        for tp, offset in sorted(offsets.items())
    ]


def _task_offset(key: bytes, value: bytes) -> tuple[TopicPartition, int]:
    topic, _, partition = key.decode().rpartition("\x00")
    return TopicPartition(topic, int(partition)), _OFFSET.unpack(value)[0]


class ChangelogFile(NamedTuple):
    """One data file of a task's changelog, with the batches its rows span (from the Delta
    log's file statistics; a file without them spans every batch)."""

    path: str
    first_batch: int
    last_batch: int
    snapshot: bool = False  # a compacted snapshot (maintenance.py): its rows' seq are < 0

    def overlaps(self, after_batch: int, up_to_batch: int) -> bool:
        return self.last_batch > after_batch and self.first_batch <= up_to_batch


_ANY_BATCH = (-1, 2**62)


def files_by_task(path: str) -> dict[str, list[ChangelogFile]]:
    """Live parquet files of the changelog per task id, from the Delta log (no data read)."""
    import pyarrow as pa

    from streamplatform.runtime.delta_direct import table_or_none

    table = table_or_none(path)
    if table is None:
        return {}
    actions = pa.table(table.get_add_actions(flatten=True))
    names = set(actions.column_names)
    root = table.table_uri.rstrip("/")
    files: dict[str, list[ChangelogFile]] = defaultdict(list)
    for action in actions.to_pylist():
        match = _TASK_DIRECTORY.search(f"/{action['path']}")
        if not match:
            continue
        first, last = (
            (action["min.batch_id"], action["max.batch_id"])
            if "min.batch_id" in names and action["min.batch_id"] is not None
            else _ANY_BATCH
        )
        min_seq = action.get("min.seq") if "min.seq" in names else None
        files[unquote(match.group(1))].append(ChangelogFile(
            _local(f"{root}/{action['path']}"), first, last,
            snapshot=min_seq is not None and min_seq < 0,
        ))  # fmt: skip
    return {task: sorted(found, key=lambda f: f.first_batch) for task, found in files.items()}


def _local(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def read_rows(
    files: Iterable[ChangelogFile], after_batch: int, up_to_batch: int
) -> list[dict[str, Any]]:
    """Changelog rows of batches in (after_batch, up_to_batch], in batch and write order. Only
    the files whose batches overlap that range are read: a copy that is a few batches behind
    reads the tail, not the task's whole history."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for file in files:
        if not file.overlaps(after_batch, up_to_batch):
            continue
        table = pq.read_table(file.path)
        keep = pc.and_(
            pc.greater(table["batch_id"], after_batch),
            pc.less_equal(table["batch_id"], up_to_batch),
        )
        rows += table.filter(keep).to_pylist()
    rows.sort(key=lambda r: (r["batch_id"], r["store"], r["seq"]))
    return rows


def replay(
    files: list[ChangelogFile],
    stores: Mapping[str, Any],
    up_to_batch: int,
    batch_marker: tuple[str, int],
) -> int:
    """Bring ``stores`` up to ``up_to_batch`` from the changelog; returns rows replayed.

    Each batch is applied to a store in one atomic write, with the batch marker as its
    offset, so a restore interrupted half-way resumes where it stopped. A snapshot (the
    changelog compacted up to batch S, maintenance.py) holds every live key as of S and no
    delete: an empty store takes it like any batch, a store that holds a batch before S is
    replaced by it (``replace_with_changelog``), a store at S or later skips it.
    """
    replayed = 0
    positions = {name: store.committed_offset(batch_marker) for name, store in stores.items()}
    positions = {name: -1 if held is None else held for name, held in positions.items()}
    oldest = min(positions.values())
    snapshot = max(  # -1: no snapshot
        (f.last_batch for f in files if f.snapshot and f.last_batch <= up_to_batch), default=-1
    )
    by_batch: dict[tuple[str, int], list[tuple[str, bytes, bytes | None]]] = defaultdict(list)
    offsets: dict[tuple[str, int], dict[TopicPartition, int]] = defaultdict(dict)
    # Stores older than the snapshot: its batch replaces their data, even without a row.
    replaced = {name for name, held in positions.items() if 0 <= held < snapshot}
    for name in replaced:
        by_batch[(name, snapshot)] = []
    for row in read_rows(files, oldest, up_to_batch):
        name = row["store"]
        if name in stores and row["batch_id"] > positions[name]:
            batch = (name, row["batch_id"])
            if row["column_family"] == TASK_OFFSETS:  # committed with the batch, as offsets
                topic_partition, offset = _task_offset(row["key"], row["value"])
                offsets[batch][topic_partition] = offset
                by_batch.setdefault(batch, [])  # a batch of offsets only is applied too
            else:
                by_batch[batch].append((row["column_family"], row["key"], row["value"]))
    for (name, batch_id), writes in sorted(by_batch.items(), key=lambda item: item[0][1]):
        if name in replaced and batch_id < snapshot:
            continue  # superseded by the snapshot
        applied = offsets.get((name, batch_id), {}) | {batch_marker: batch_id}
        if name in replaced and batch_id == snapshot:
            stores[name].replace_with_changelog(writes, applied)
        else:
            stores[name].apply_changelog(writes, applied)
        replayed += len(writes)
    for store in stores.values():  # batches that wrote nothing to a store move it on too
        held = store.committed_offset(batch_marker)
        if (-1 if held is None else held) < up_to_batch:
            store.apply_changelog([], {batch_marker: up_to_batch})
    return replayed
