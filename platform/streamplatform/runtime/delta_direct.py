"""Small Delta tables read and appended from the driver's Python, without Spark (delta-rs).

A micro-batch writes a handful of rows to the runtime's own tables (the offset log, the commit
log, the state changelog of a streamed batch). Through Spark each such append is a job and a
Delta transaction of its own, ~0.5 s of mostly idle driver time on every batch; delta-rs
(the ``deltalake`` package) appends the same rows in ~10 ms. The tables stay ordinary Delta
tables: Spark reads them, and a table may be appended by both (bench/RESULTS.md).

Appends are idempotent the way Spark's ``txnAppId``/``txnVersion`` writer options make them:
the transaction is recorded in the commit (a Delta ``txn`` action, which Spark honours too),
and an append whose version is not above the recorded one is skipped. The check and the
append are not one atomic step, which is sound because the driver is these tables' only writer.

Paths are local paths or URIs: an S3 root's tables are opened with the storage options of
its bucket (streamplatform.storage), and their commits are conditional puts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from streamplatform import storage

Filters = Sequence[tuple[str, str, Any]]


def open_table(path: str, version: int | None = None) -> Any:
    """The Delta table at ``path`` (a ``deltalake.DeltaTable``), at ``version`` or its latest."""
    from deltalake import DeltaTable

    return DeltaTable(path, version=version, storage_options=storage.delta_options(path))


def is_table(path: str) -> bool:
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(path, storage_options=storage.delta_options(path)))


def create_table(path: str, schema: Any) -> None:
    """An empty table at ``path`` unless there is one."""
    from deltalake import DeltaTable

    DeltaTable.create(path, schema, mode="ignore", storage_options=storage.delta_options(path))


def write(target: Any, rows: Any, **options: Any) -> None:
    """``deltalake.write_deltalake`` into a table or to a path (with its storage options)."""
    from deltalake import write_deltalake

    if isinstance(target, str):
        options["storage_options"] = storage.delta_options(target)
    write_deltalake(target, rows, **options)


def table_or_none(path: str) -> Any:
    """The Delta table at ``path`` (a ``deltalake.DeltaTable``); None when there is none."""
    return open_table(path) if is_table(path) else None


def append(
    path: str,
    rows: pa.Table | pa.RecordBatchReader,
    app_id: str,
    version: int,
    partition_by: Sequence[str] | None = None,
    merge_schema: bool = False,
    conform: bool = False,
) -> bool:
    """Append ``rows`` once per ``(app_id, version)``; False when it was appended before.
    ``merge_schema``: columns the table lacks are added (older rows read them as null).
    ``conform``: ``rows`` take the table's own Arrow schema first (a table Spark created has
    columns that may not be null, which Arrow arrays built in Python do not say). A
    ``RecordBatchReader`` is written as it is read (delta-rs holds about a batch at once)."""
    from deltalake import CommitProperties, Transaction

    table = table_or_none(path)
    if table is not None:
        recorded = table.transaction_version(app_id)
        if recorded is not None and version <= recorded:
            return False
        if conform:
            schema = pa.schema(table.schema().to_arrow())
            if merge_schema:  # the columns the table lacks go on, to be added
                schema = pa.schema([*schema, *(f for f in rows.schema if f.name not in
                                               schema.names)])  # fmt: skip
            if isinstance(rows, pa.RecordBatchReader):
                batches = rows
                rows = pa.RecordBatchReader.from_batches(
                    schema, (batch.select(schema.names).cast(schema) for batch in batches)
                )
            else:
                rows = rows.select(schema.names).cast(schema)
    write(
        path if table is None else table,
        rows,
        mode="append",
        partition_by=list(partition_by) if partition_by else None,
        schema_mode="merge" if merge_schema else None,
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=app_id, version=version)]
        ),
    )
    return True


def transaction_version(path: str, app_id: str) -> int | None:
    """The last version appended under ``app_id``; None for none (or no table)."""
    table = table_or_none(path)
    return None if table is None else table.transaction_version(app_id)


def read(path: str, filters: Filters | None = None, columns: list[str] | None = None) -> pa.Table:
    """The rows of the table's current version matching ``filters`` (pyarrow's
    ``[(column, op, value)]`` form); an empty table without columns when there is no table."""
    table = table_or_none(path)
    if table is None:
        return pa.table({})
    return table.to_pyarrow_table(
        columns=columns, filters=list(filters) if filters is not None else None
    )


def live_files(path: str) -> list[str]:
    """The data files of the table's current version (absolute paths or URIs)."""
    table = table_or_none(path)
    return [] if table is None else list(table.file_uris())


def discard(path: str, app_id: str, version: int) -> int:
    """Delete the rows appended under ``(app_id, version)`` (its ``batch_id = version`` rows)
    and set the transaction back to ``version - 1``, in one commit, so that the next append
    of ``version`` is written again. Returns the rows deleted; nothing happens when no such
    append was recorded."""
    from deltalake import CommitProperties, Transaction

    table = table_or_none(path)
    recorded = None if table is None else table.transaction_version(app_id)
    if recorded is None or recorded < version:
        return 0
    properties = CommitProperties(app_transactions=[Transaction(app_id, version - 1)])
    deleted = table.delete(f"batch_id = {int(version)}", commit_properties=properties)
    if table.transaction_version(app_id) != version - 1:  # no row matched: no commit was made
        commit_empty(table, properties)
    return int(deleted.get("num_deleted_rows", 0))


def rewind(path: str, app_id: str, version: int) -> int:
    """Delete the rows appended under ``app_id`` after ``version`` (``batch_id > version``)
    and set the transaction back to ``version``, in one commit, so that the appends of the
    later versions are written again (rewind.py). Returns the rows deleted; nothing happens
    when nothing after ``version`` was recorded (a repeated rewind)."""
    from deltalake import CommitProperties, Transaction

    table = table_or_none(path)
    recorded = None if table is None else table.transaction_version(app_id)
    if recorded is None or recorded <= version:
        return 0
    properties = CommitProperties(app_transactions=[Transaction(app_id, version)])
    deleted = table.delete(f"batch_id > {int(version)}", commit_properties=properties)
    if table.transaction_version(app_id) != version:  # no row matched: no commit was made
        commit_empty(table, properties)
    return int(deleted.get("num_deleted_rows", 0))


def commit_empty(table: Any, properties: Any) -> None:
    """A commit that adds no rows, for what its ``properties`` record (transactions, commit
    info); made for the version after the one ``table`` was loaded at."""
    table.create_write_transaction(
        [], mode="append", schema=table.schema(),
        partition_by=table.metadata().partition_columns, commit_properties=properties,
    )  # fmt: skip
