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
from the Delta log (delta-rs, in milliseconds) and the executor reads them with pyarrow. A
restore streams them into the stores a batch at a time, and a snapshot (maintenance.py) in
chunks of ``SNAPSHOT_CHUNK_ROWS`` rows: the Python objects it holds do not grow with the store.
"""

from __future__ import annotations

import re
import struct
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

from streamplatform import storage
from streamplatform.records import TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa

CHANGELOG_SCHEMA = (
    "task STRING, store STRING, batch_id LONG, seq LONG, column_family STRING, "
    "key BINARY, value BINARY"
)
_TASK_DIRECTORY = re.compile(r"/task=([^/]+)/")
# The column family of the rows that carry a task's own offsets (stream time, punctuation
# schedule) instead of store data. No store has a column family of this name.
TASK_OFFSETS = "__task_offsets__"
_OFFSET = struct.Struct(">q")
SNAPSHOT_CHUNK_ROWS = 50_000
"""Rows of a snapshot per write when a restore applies it, and rows per Arrow record batch
read: bounds the Python objects of a restore (a few hundred bytes a row) whatever the store's
size."""
_COLUMNS = ["store", "batch_id", "seq", "column_family", "key", "value"]
_ROW_ORDER = [("batch_id", "ascending"), ("store", "ascending"), ("seq", "ascending")]
_Writes = list[tuple[str, bytes, bytes | None]]


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
            storage.local_path(f"{root}/{action['path']}"), first, last,
            snapshot=min_seq is not None and min_seq < 0,
        ))  # fmt: skip
    return {task: sorted(found, key=lambda f: f.first_batch) for task, found in files.items()}


def read_batches(
    files: Iterable[ChangelogFile], after_batch: int, up_to_batch: int
) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
    """The changelog batches in (after_batch, up_to_batch], in batch order: each as its batch
    id and its rows, in (store, seq) order, as Arrow record batches of at most
    ``SNAPSHOT_CHUNK_ROWS`` rows read as they are asked for (take a batch's rows before the
    next batch). Only the files whose batches overlap that range are read: a copy that is a
    few batches behind reads the tail, not the task's whole history.

    A snapshot file (one batch, maybe millions of rows) is streamed from the file. Other files
    hold a batch or a few each: they are read whole, with the files their batches overlap, and
    sorted (in Arrow) as the order asks."""
    for group in _file_groups(files, after_batch, up_to_batch):
        first = group[0]
        if all(f.snapshot and f.first_batch == f.last_batch == first.last_batch for f in group):
            # A snapshot, in one file or in several (delta-rs splits a large one): its rows are
            # of one batch and each key's once, so neither their order nor the file they are in
            # matters. Streamed file after file: a store larger than memory restores in chunks.
            yield first.last_batch, _files_record_batches([f.path for f in group])
        else:
            yield from _sorted_batches(group, after_batch, up_to_batch)


def _file_groups(
    files: Iterable[ChangelogFile], after_batch: int, up_to_batch: int
) -> list[list[ChangelogFile]]:
    """The files to read, in batch order, grouped where their batch ranges overlap: the rows
    of one group are sorted together, and one group's batches all come before the next's."""
    wanted = sorted(
        (f for f in files if f.overlaps(after_batch, up_to_batch)),
        key=lambda f: (f.first_batch, f.last_batch),
    )
    groups: list[list[ChangelogFile]] = []
    end = -(2**63)
    for file in wanted:
        if groups and file.first_batch <= end:
            groups[-1].append(file)
        else:
            groups.append([file])
        end = max(end, file.last_batch)
    return groups


def _files_record_batches(paths: list[str]) -> Iterator[pa.RecordBatch]:
    for path in paths:
        yield from storage.parquet_batches(path, SNAPSHOT_CHUNK_ROWS, _COLUMNS)


def _sorted_batches(
    group: list[ChangelogFile], after_batch: int, up_to_batch: int
) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    in_range = [("batch_id", ">", after_batch), ("batch_id", "<=", up_to_batch)]
    tables = [storage.read_parquet(f.path, columns=_COLUMNS, filters=in_range) for f in group]
    rows = pa.concat_tables(tables, promote_options="permissive").sort_by(_ROW_ORDER)
    counts = pc.value_counts(rows.column("batch_id"))
    start = 0
    for batch_id, count in sorted(
        zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True)
    ):
        batch = rows.slice(start, count)
        yield batch_id, iter(batch.to_batches(max_chunksize=SNAPSHOT_CHUNK_ROWS))
        start += count


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
    delete: a store before S (an empty one too) is replaced by it, a store at S or later skips
    it. A snapshot may hold millions of rows: it is written in chunks, with the batch marker
    in the last write only (`_take_snapshot`). The rows are read a batch, or a chunk, at a
    time (`read_batches`), so the Python objects of a restore do not grow with the store.
    """
    positions = {name: _position(store, batch_marker) for name, store in stores.items()}
    snapshot = max(  # -1: no snapshot
        (f.last_batch for f in files if f.snapshot and f.last_batch <= up_to_batch), default=-1
    )
    _check_parts_can_be_redone(stores, snapshot)
    # A store before the snapshot starts from it: the batches before it are in it.
    start = min((max(held, snapshot - 1) for held in positions.values()), default=up_to_batch)
    replayed = 0
    for batch_id, chunks in read_batches(files, start, up_to_batch):
        if batch_id == snapshot:
            takers = [name for name, held in positions.items() if held < snapshot]
            replayed += _take_snapshot(stores, takers, chunks, snapshot, batch_marker)
        elif batch_id > snapshot:
            takers = [name for name, held in positions.items() if held < batch_id]
            replayed += _apply_batch(stores, takers, chunks, batch_id, batch_marker)
        # A batch before the snapshot (a file without batch statistics spans every batch):
        # every store either takes the snapshot, which holds it, or is past it.
    for store in stores.values():  # batches that wrote nothing to a store move it on too
        if _position(store, batch_marker) < up_to_batch:
            store.apply_changelog([], {batch_marker: up_to_batch})
    return replayed


def _position(store: Any, batch_marker: tuple[str, int]) -> int:
    held = store.committed_offset(batch_marker)
    return -1 if held is None else int(held)


def _check_parts_can_be_redone(stores: Mapping[str, Any], snapshot: int) -> None:
    """A store left holding part of a snapshot is made whole by taking a snapshot again (it
    is before every snapshot since, see `_take_snapshot`); files listed without one (a listing
    older than that snapshot's) cannot."""
    if snapshot >= 0:
        return
    for name, store in stores.items():
        if store.changelog_part_applied:
            raise RuntimeError(
                f"Store {name} at {store.path} holds part of a changelog snapshot from an "
                "interrupted restore, and the changelog files given have no snapshot to "
                "restore it from: list the changelog's files again (files_by_task)"
            )


def _apply_batch(
    stores: Mapping[str, Any],
    takers: Collection[str],
    chunks: Iterator[pa.RecordBatch],
    batch_id: int,
    batch_marker: tuple[str, int],
) -> int:
    """One batch (a few thousand rows at most: one micro-batch's writes of one task), each
    store's writes and task offsets in one atomic write with the batch marker."""
    writes: dict[str, _Writes] = defaultdict(list)
    offsets: dict[str, dict[TopicPartition, int]] = defaultdict(dict)
    for rows in chunks:
        _collect(rows, takers, writes, offsets)
    for name in sorted(writes.keys() | offsets.keys()):  # a batch of offsets only too
        stores[name].apply_changelog(writes[name], offsets[name] | {batch_marker: batch_id})
    return sum(len(found) for found in writes.values())


def _take_snapshot(
    stores: Mapping[str, Any],
    takers: Collection[str],
    chunks: Iterator[pa.RecordBatch],
    snapshot: int,
    batch_marker: tuple[str, int],
) -> int:
    """The snapshot (batch ``snapshot``) replaces the data of each store in ``takers``, a
    chunk of rows per write (`apply_changelog_chunk`, the first one deleting what the store
    held); the batch marker and task offsets come with a last write once every chunk is in.

    A crash between two chunks leaves a store with part of the snapshot, and its committed
    position unchanged (and `changelog_part_applied` set). Whatever it held before, that
    position is before this snapshot and before any later one (maintenance only replaces a
    snapshot by a later one), so the next restore replaces the store again, from its first
    chunk: an empty store (no position) takes the snapshot from scratch; a store older than
    the snapshot is wiped again, not left with keys of its older data or of the part applied;
    a store at the snapshot or after it never takes it, so it has no part to leave.
    """
    if not takers:
        return 0
    offsets: dict[str, dict[TopicPartition, int]] = {name: {} for name in takers}
    replayed, first = 0, True
    for rows in chunks:
        writes: dict[str, _Writes] = defaultdict(list)
        _collect(rows, takers, writes, offsets)
        for name in takers:
            if first or writes[name]:
                stores[name].apply_changelog_chunk(writes[name], replace=first)
            replayed += len(writes[name])
        first = False
    for name in takers:
        applied = offsets[name] | {batch_marker: snapshot}
        if first:  # not a row read: a snapshot of nothing still replaces
            stores[name].replace_with_changelog([], applied)
        else:
            stores[name].apply_changelog([], applied)
    return replayed


def _collect(
    rows: pa.RecordBatch,
    names: Collection[str],
    writes: dict[str, _Writes],
    offsets: Mapping[str, dict[TopicPartition, int]],
) -> None:
    """Add the rows of the stores ``names`` to ``writes`` (per store, in order) and their
    task offsets (``TASK_OFFSETS``, committed with the batch as offsets) to ``offsets``. Only
    these rows become Python objects: a record batch's, not a file's."""
    columns = [rows.column(name).to_pylist() for name in ("store", "column_family", "key",
                                                          "value")]  # fmt: skip
    for name, column_family, key, value in zip(*columns, strict=True):
        if name not in names:
            continue
        if column_family == TASK_OFFSETS:
            topic_partition, offset = _task_offset(key, value)
            offsets[name][topic_partition] = offset
        else:
            writes[name].append((column_family, key, value))
