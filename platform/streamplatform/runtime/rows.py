"""The rows a task's batch takes and gives, in Arrow and in Spark's schema strings: its input
(``INPUT_COLUMNS``, ``STREAM_COLUMNS``), its output (``OUTPUT_ARROW``: sink, DLQ, changelog,
version and progress rows; ``SINK_ARROW`` when only the sink's rows go back to Spark), headers
across the Python boundary, and the input queues a task's rows make (partition_group.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamplatform.records import NO_HEADERS, ConsumedRecord
from streamplatform.runtime import repartition_buffer

OUTPUT_SCHEMA = (
    "kind STRING, topic STRING, key BINARY, value BINARY, timestamp LONG, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, partition INT, "
    "source_topic STRING, source_partition INT, source_offset LONG, "
    "task STRING, store STRING, column_family STRING, seq LONG"
)
HEADERS_ARROW = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
OUTPUT_ARROW = pa.schema([
    ("kind", pa.string()), ("topic", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
    ("timestamp", pa.int64()), ("headers", HEADERS_ARROW),
    ("partition", pa.int32()), ("source_topic", pa.string()), ("source_partition", pa.int32()),
    ("source_offset", pa.int64()), ("task", pa.string()), ("store", pa.string()),
    ("column_family", pa.string()), ("seq", pa.int64()),
])  # fmt: skip
_NO_HEADER_VALUES = pa.array([], HEADERS_ARROW.value_type)

try:  # output columns' Arrow buffers built in C (runtime/_task_loop.c)
    from streamplatform.runtime._task_loop import binary_buffers as _binary_buffers
    from streamplatform.runtime._task_loop import int64_buffer as _int64_buffer
except ImportError:  # pragma: no cover - depends on the build
    _binary_buffers = _int64_buffer = None  # type: ignore[assignment]
# Tests set this to False to hold the C-built columns to pa.array's.
NATIVE_COLUMNS = True

# A job whose only output is one Delta sink streams just the sink rows back to Spark, in the
# sink table's columns, and the Delta write consumes them as the tasks produce them: nothing
# is cached. Every other row (DLQ, changelog, versions, progress) goes to a side file per task
# (``TaskBatchRunner.side_output_dir``), which the driver reads after the write.
SINK_COLUMNS = ("key", "value", "timestamp", "headers", "source_topic", "source_partition",
                "source_offset")  # fmt: skip
# Streamed, the headers cross as JSON (see INPUT_COLUMNS; null: none) and Spark turns them
# back into the table's ARRAY<STRUCT<key, value>>: reading an Arrow list of structs costs the
# JVM more per row than the rest of the row. The job's one source topic is added by Spark.
SINK_ARROW = pa.schema([
    pa.field("key", pa.binary()), pa.field("value", pa.binary()),
    pa.field("timestamp", pa.int64()), pa.field("headers", pa.string()),
    pa.field("source_partition", pa.int32()), pa.field("source_offset", pa.int64()),
])  # fmt: skip
SINK_SCHEMA = (
    "key BINARY, value BINARY, timestamp LONG, headers STRING, source_partition INT, "
    "source_offset LONG"
)

# The input columns, in this order (paths/spark_frames.py selects them). ``headers`` arrives as
# JSON, ``[{"k": name, "v": base64 value}]`` (no "v": a None value), or null when a record has
# none:
# Spark's JVM-to-Arrow writer is several times slower on any array column than on all the
# other columns together, and nearly every record has no header.
INPUT_COLUMNS = ("task_partition", "topic", "partition", "offset", "timestamp", "key", "value",
                 "headers")  # fmt: skip
# Under mapInArrow (one Kafka topic, a Spark partition per Kafka partition) the task knows its
# topic and partition: these columns only (``TaskBatchRunner.stream_topic``).
STREAM_COLUMNS = ("partition", "offset", "timestamp", "key", "value", "headers")


def decode_headers(encoded: str | None) -> list[tuple[str, bytes | None]]:
    """Headers from their input encoding (see ``INPUT_COLUMNS``)."""
    if encoded is None:
        return NO_HEADERS
    return [
        (h["k"], None if h.get("v") is None else base64.b64decode(h["v"]))
        for h in json.loads(encoded)
    ]


def encode_headers(headers: list[tuple[str, bytes | None]]) -> str | None:
    """Headers in their JSON crossing form (see ``INPUT_COLUMNS``); None when there are none."""
    if not headers:
        return None
    return json.dumps([
        {"k": key} if value is None else {"k": key, "v": base64.b64encode(value).decode()}
        for key, value in headers
    ])  # fmt: skip


def table_queues(table: pa.Table, internal_topics: frozenset[str]) -> dict[tuple, list]:
    """A task's rows (INPUT_COLUMNS) as its input queues, each in offset order: one per Kafka
    partition, keyed ``(topic, partition, -1)``, and one per repartition topic and upstream
    task, keyed ``(topic, partition, upstream partition)`` (repartition_buffer.py)."""
    columns = table.select(["topic", "partition", "offset", "timestamp", "key", "value", "headers"])
    queues: dict[tuple, list] = {}
    for topic, partition, offset, timestamp, key, value, headers in zip(
        *(column.to_pylist() for column in columns.columns), strict=True
    ):
        if topic is None:
            continue  # a row that only wakes the task (its repartition buffer)
        upstream = repartition_buffer.upstream_of(offset) if topic in internal_topics else -1
        queues.setdefault((topic, partition, upstream), []).append(
            ConsumedRecord(topic, partition, offset, timestamp, key, value,
                           decode_headers(headers))
        )  # fmt: skip
    for queue in queues.values():
        queue.sort(key=lambda record: record.offset)
    return queues


def arrow_records(
    topic: str, subtopology: int, batches: Iterable[pa.RecordBatch]
) -> Iterator[list[ConsumedRecord]]:
    """The records of Arrow batches (STREAM_COLUMNS) that must all be of one Kafka partition
    of ``topic``, in offset order (Spark's Kafka source makes one Spark partition of each):
    a batch that breaks that fails the task."""
    source: tuple[str, int] | None = None
    last_offset = -1
    for batch in batches:
        if batch.num_rows == 0:
            continue
        partitions, offsets = batch.column(0), batch.column(1)
        this = (topic, partitions[0].as_py())
        source = this if source is None else source
        first, last = offsets[0].as_py(), offsets[len(offsets) - 1].as_py()
        if (
            this != source
            or first <= last_offset
            or pc.count_distinct(partitions).as_py() != 1
            or (len(offsets) > 1 and not pc.all(pc.less(offsets[:-1], offsets[1:])).as_py())
        ):
            raise RuntimeError(
                f"Task {subtopology}_{source[1]}: a Spark partition must hold one Kafka "
                f"partition in offset order; got {this} offsets {first}..{last} after "
                f"{source}@{last_offset}"
            )
        last_offset = last
        columns = (repeat(topic), repeat(this[1]), offsets.to_pylist(),
                   batch.column(2).to_pylist(), batch.column(3).to_pylist(),
                   batch.column(4).to_pylist())  # fmt: skip
        headers = batch.column(5)
        if headers.null_count == len(headers):  # nearly always: no record has headers
            # Plain tuples in ConsumedRecord's layout, built by zip (Task.process_all takes them).
            yield list(zip(*columns, repeat(NO_HEADERS), strict=False))  # type: ignore[arg-type]
        else:
            decoded = [NO_HEADERS if h is None else decode_headers(h) for h in headers.to_pylist()]
            yield list(zip(*columns, decoded, strict=False))  # type: ignore[arg-type]


def first_offsets(table: pa.Table) -> dict[tuple[str, int], int]:
    """The first offset of each (topic, partition) in a task's rows."""
    firsts = table.group_by(["topic", "partition"]).aggregate([("offset", "min")])
    return {
        (topic, partition): offset
        for topic, partition, offset in zip(
            *(firsts.column(c).to_pylist() for c in ("topic", "partition", "offset_min")),
            strict=True,
        )
    }


def header_structs(headers: Sequence[list[tuple[str, bytes | None]]]) -> pa.Array:
    """Each record's headers as the output tables' ARRAY<STRUCT<key, value>> (HEADERS_ARROW);
    built without a Python object per record when no record has any, as is nearly always."""
    if not any(headers):  # len(headers) empty lists
        return pa.ListArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), len(headers) + 1), _NO_HEADER_VALUES,
            HEADERS_ARROW,
        )  # fmt: skip
    return pa.array(
        [[{"key": key, "value": value} for key, value in h] for h in headers], HEADERS_ARROW
    )


_OFTEN_REPEATED = frozenset({"topic", "partition", "source_topic", "source_partition"})


def column(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array; a single value repeated (a task's output nearly always
    has one topic, one source partition, no partition chosen) without a conversion per row."""
    if values and values.count(values[0]) == len(values):
        return pa.repeat(pa.scalar(values[0], arrow_type), len(values))
    return pa.array(values, type=arrow_type)


def binary_column(rows: Sequence[tuple], index: int) -> pa.Array:
    """Column ``index`` of the tuples ``rows`` (bytes or None) as an Arrow binary array:
    its buffers built in C in one pass over the rows, where ``pa.array`` converts each object
    through its generic converter (several times the cost); ``pa.array`` for what C declines
    (other buffer types, more than 2 GiB)."""
    built = _binary_buffers(rows, index) if _binary_buffers is not None and NATIVE_COLUMNS else None
    if built is None:
        return pa.array(list(map(itemgetter(index), rows)), pa.binary())
    nulls, validity, offsets, data = built
    return pa.Array.from_buffers(
        pa.binary(), len(rows),
        [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
         pa.py_buffer(data)],
        null_count=nulls,
    )  # fmt: skip


def int64_column(rows: Sequence[tuple], index: int) -> pa.Array:
    """Column ``index`` of the tuples ``rows`` (ints) as an Arrow int64 array, as
    ``binary_column`` builds its columns; ``pa.array`` for anything else (None included)."""
    built = _int64_buffer(rows, index) if _int64_buffer is not None and NATIVE_COLUMNS else None
    if built is None:
        return pa.array(list(map(itemgetter(index), rows)), pa.int64())
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(built)])


def output_batch(rows: int, **columns: Any) -> pa.RecordBatch:
    """An output batch of ``rows`` rows; a column given as a sequence or an Arrow array is
    taken as is, a scalar is repeated, a missing column is null. ``seq`` numbers the rows
    when not given."""
    arrays = []
    for field in OUTPUT_ARROW:
        value = columns.get(field.name)
        if isinstance(value, pa.Array):
            arrays.append(value)
        elif isinstance(value, list | tuple):
            if field.name in _OFTEN_REPEATED:
                arrays.append(column(value, field.type))
            else:
                arrays.append(pa.array(value, type=field.type))
        elif field.name == "seq":
            # From numpy: pa.array(range(rows)) converts row by row (2.8 ms per 10k rows).
            arrays.append(pa.array(np.arange(rows, dtype=np.int64)))
        elif value is None:
            arrays.append(pa.nulls(rows, field.type))
        else:
            arrays.append(pa.repeat(pa.scalar(value, field.type), rows))
    return pa.RecordBatch.from_arrays(arrays, schema=OUTPUT_ARROW)
