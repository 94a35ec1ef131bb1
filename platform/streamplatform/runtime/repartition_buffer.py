"""Repartitioned records inside a micro-batch: how they are numbered, and where a downstream
task keeps the ones it may not take yet.

On Spark a repartition topic is not a Kafka topic: the records an upstream task writes to it
reach the downstream task of their partition within the batch (paths/stages.py). Each upstream
task's records form one input queue of the downstream task, in the order that task wrote
them, and the downstream task merges its queues by timestamp (partition_group.py), as a live
repartition topic fed by upstream tasks running side by side would give them.

An upstream task that did not read everything (a batch cap, an input that holds it back) is
*bounded*: it reports the time its later records will not be earlier than. A downstream task
takes no record later than such a bound; what it cannot take yet stays in its **repartition
buffer**, a store of the task's like any other (transactional, prepared with the batch, in the
changelog, restored), and is taken first in a later batch. So a batch cut never makes a
repartitioned record late, and a replay takes exactly what its first attempt took.

A repartitioned record's offset is ``batch_id * 2**40 + upstream partition * 2**28 + n``
(``n``: its number among that upstream task's records for this partition): the queue it belongs
to can be read off it, and a re-run of the batch numbers them the same.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterable, Mapping
from itertools import repeat
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform.records import NO_HEADERS
from streamplatform.state.stores import KeyValueStoreSpec

BUFFER_STORE = "__repartition_buffer__"
BUFFER_SPEC = KeyValueStoreSpec(BUFFER_STORE)
OFFSET_BITS = 40  # per batch: the batch id in the bits above
UPSTREAM_BITS = 28  # per upstream task and batch: 2**28 records; 2**12 upstream partitions
MAX_BATCH_ID = (1 << (63 - OFFSET_BITS)) - 1
_KEY = struct.Struct(">iq")  # upstream partition, offset: big-endian, so keys sort in order


def repartition_offset_base(batch_id: int) -> int:
    """The offset of batch ``batch_id``'s first repartitioned record. Raises past
    ``MAX_BATCH_ID``, where it would overflow a long (and so collide with another batch's)."""
    if not 0 <= batch_id <= MAX_BATCH_ID:
        raise OverflowError(
            f"batch {batch_id}: repartitioned records are numbered batch_id * 2**{OFFSET_BITS} "
            f"+ n, which fits a long up to batch {MAX_BATCH_ID}; start the application anew "
            "(another application.id) to go on"
        )
    return batch_id << OFFSET_BITS


def upstream_of(offset: int) -> int:
    """The upstream task partition a repartitioned record's offset names."""
    return (offset >> UPSTREAM_BITS) & ((1 << (OFFSET_BITS - UPSTREAM_BITS)) - 1)


def runtime_stores(topology: Any, subtopology: Any, application_id: str) -> dict[str, Any]:
    """The stores the runtime adds to ``subtopology``'s tasks: the repartition buffer, when
    the sub-topology reads a repartition topic."""
    internal = set(topology.repartition_topics(application_id))
    reads = subtopology.source_topics(topology, application_id)
    return {BUFFER_STORE: BUFFER_SPEC} if internal.intersection(reads) else {}


def every_runtime_store(topology: Any, application_id: str) -> dict[str, Any]:
    """The runtime's stores of any of the topology's tasks (standby copies open them all)."""
    stores: dict[str, Any] = {}
    for subtopology in topology.subtopologies:
        stores |= runtime_stores(topology, subtopology, application_id)
    return stores


def written_bounds(
    topology: Any, subtopology: Any, application_id: str, bounds: Mapping[str, int | None]
) -> dict[str, dict[int, int]]:
    """What the downstream tasks of ``subtopology`` need to know of its tasks: for each
    repartition topic it writes, the bound each of its tasks reported (``bounds``: task id ->
    bound, None for a task that read everything; such tasks are left out)."""
    from streamplatform.dsl.graph import SinkNode, topic_name

    upstream = {int(task.split("_")[1]): b for task, b in bounds.items() if b is not None}
    return {
        topic_name(node.topic, True, application_id): upstream
        for node in map(topology.nodes.__getitem__, subtopology.nodes)
        if isinstance(node, SinkNode) and node.internal
    }


def queues_of(table: pa.Table | None) -> dict[tuple, list]:
    """A downstream task's repartitioned records by input queue, ``{(topic, partition,
    upstream): [records]}``, each record a tuple in ConsumedRecord's layout, from the rows the
    driver handed it (paths/direct_stages.py: sorted by topic, upstream and offset, numbered).
    Built where the task runs, so that the driver ships Arrow columns, not Python objects."""
    queues: dict[tuple, list] = {}
    if table is None or table.num_rows == 0:
        return queues
    groups = (
        table.group_by(["topic", "partition", "upstream"], use_threads=False)
        .aggregate([("offset", "count")])
        .sort_by([("topic", "ascending"), ("partition", "ascending"), ("upstream", "ascending")])
    )
    offsets, timestamps = table["offset"].to_pylist(), table["timestamp"].to_pylist()
    keys, values = table["key"].to_pylist(), table["value"].to_pylist()
    no_headers = pc.all(pc.equal(pc.list_value_length(table["headers"]), 0)).as_py()
    headers = None if no_headers is not False else [
        [(h["key"], h["value"]) for h in hs] if hs else NO_HEADERS
        for hs in table["headers"].to_pylist()
    ]  # fmt: skip
    start = 0
    for topic, partition, upstream, count in zip(
        *(groups[c].to_pylist() for c in ("topic", "partition", "upstream", "offset_count")),
        strict=True,
    ):
        end = start + count
        queues[(topic, partition, upstream)] = list(zip(
            repeat(topic, count), repeat(partition, count), offsets[start:end],
            timestamps[start:end], keys[start:end], values[start:end],
            repeat(NO_HEADERS, count) if headers is None else headers[start:end], strict=True,
        ))  # fmt: skip
        start = end
    return queues


def _prefix(topic: str) -> bytes:
    return topic.encode() + b"\x00"


def load(store: Any, topics: Iterable[str]) -> dict[tuple[str, int], list[tuple]]:
    """The buffered records of each (repartition topic, upstream partition), in order."""
    queues: dict[tuple[str, int], list[tuple]] = {}
    transaction = store.transaction
    for topic in sorted(topics):
        for key, value in transaction.prefix(_prefix(topic)):
            upstream, _ = _KEY.unpack(key[-_KEY.size :])
            queues.setdefault((topic, upstream), []).append(pickle.loads(value))
    return queues


def save(
    store: Any,
    buffered: Mapping[tuple[str, int], list[tuple]],
    taken: Mapping[tuple[str, int], int],
    left: Mapping[tuple[str, int], list[tuple]],
) -> int:
    """After the merge: the buffered records taken go, the new ones not taken come in.
    ``taken``: per queue, how many of its records were taken (buffered ones first); ``left``:
    its records not taken. Returns how many records the buffer holds for the queues given."""
    transaction = store.transaction
    held = 0
    for queue, records in left.items():
        old = buffered.get(queue, [])
        count = taken.get(queue, 0)
        topic, upstream = queue
        for record in old[: min(count, len(old))]:
            transaction.delete(_prefix(topic) + _KEY.pack(upstream, record[2]))
        for record in records[max(0, len(old) - count) :]:  # the new ones among them
            value = pickle.dumps(tuple(record), protocol=pickle.HIGHEST_PROTOCOL)
            transaction.put(_prefix(topic) + _KEY.pack(upstream, record[2]), value)
        held += len(records)
    return held
