"""The state changelog in Delta, and restoring a task's stores from it.

Every micro-batch appends, per task and store, the batch's store writes as rows
``(task, store, batch_id, seq, column_family, key, value)`` (value None = delete) to
``<root>/<application.id>/_changelog``, partitioned by task. The writes are the store's own
column-family writes, so replaying them batch by batch rebuilds the store exactly, whatever its
kind. A task whose local state is missing or behind the commit log (a new executor, a wiped
state dir) replays the batches it lacks; a warm standby replays them continuously. Deletes of
keys that a key-value store's committed data did not hold are left out (they change nothing
on replay, and a deduplication store would otherwise log one for nearly every id it expires).

Executors have no SparkSession: the driver resolves the live files of each task's partition
from the Delta log (delta-rs, in milliseconds) and the executor reads them with pyarrow.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlparse

CHANGELOG_SCHEMA = (
    "task STRING, store STRING, batch_id LONG, seq LONG, column_family STRING, "
    "key BINARY, value BINARY"
)
_TASK_DIRECTORY = re.compile(r"/task=([^/]+)/")


def files_by_task(path: str) -> dict[str, list[str]]:
    """Live parquet files of the changelog per task id, from the Delta log (no data read)."""
    from streamplatform.runtime.delta_direct import live_files

    files: dict[str, list[str]] = defaultdict(list)
    for uri in live_files(path):
        match = _TASK_DIRECTORY.search(uri)
        if match:
            files[unquote(match.group(1))].append(_local(uri))
    return dict(files)


def _local(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def read_rows(files: Iterable[str], after_batch: int, up_to_batch: int) -> list[dict[str, Any]]:
    """Changelog rows of batches in (after_batch, up_to_batch], in batch and write order."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for file in files:
        table = pq.read_table(file)
        keep = pc.and_(
            pc.greater(table["batch_id"], after_batch),
            pc.less_equal(table["batch_id"], up_to_batch),
        )
        rows += table.filter(keep).to_pylist()
    rows.sort(key=lambda r: (r["batch_id"], r["store"], r["seq"]))
    return rows


def replay(
    files: list[str],
    stores: Mapping[str, Any],
    up_to_batch: int,
    batch_marker: tuple[str, int],
) -> int:
    """Bring ``stores`` up to ``up_to_batch`` from the changelog; returns rows replayed.

    Each batch is applied to a store in one atomic write, with the batch marker as its
    offset, so a restore interrupted half-way resumes where it stopped.
    """
    replayed = 0
    positions = {name: store.committed_offset(batch_marker) for name, store in stores.items()}
    oldest = min((-1 if p is None else p) for p in positions.values())
    by_batch: dict[tuple[str, int], list[tuple[str, bytes, bytes | None]]] = defaultdict(list)
    for row in read_rows(files, oldest, up_to_batch):
        name = row["store"]
        held = positions.get(name)
        if name in stores and row["batch_id"] > (-1 if held is None else held):
            by_batch[(name, row["batch_id"])].append(
                (row["column_family"], row["key"], row["value"])
            )
    for (name, batch_id), writes in sorted(by_batch.items(), key=lambda item: item[0][1]):
        stores[name].apply_changelog(writes, {batch_marker: batch_id})
        replayed += len(writes)
    for store in stores.values():  # batches that wrote nothing to a store move it on too
        held = store.committed_offset(batch_marker)
        if (-1 if held is None else held) < up_to_batch:
            store.apply_changelog([], {batch_marker: up_to_batch})
    return replayed
