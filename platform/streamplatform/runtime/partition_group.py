"""A task's input queues merged in Kafka Streams' order, and where a micro-batch cuts it.

Kafka Streams' task keeps one record queue per input partition, stamps each record with its
*extracted* timestamp as it enters the queue, and always takes the head with the lowest
timestamp (its partition group). When one queue is empty while its partition has more records
in Kafka, the task waits for them (KIP-353, KIP-695): it never runs ahead of a partition it has
not heard the end of.

A micro-batch holds a cut of each queue. ``merge`` takes the heads in that order and stops where
Kafka Streams could not have gone on without the records after the cut:

- a queue is **complete** (``limit=None``) when nothing more can come into it before the next
  batch's records, which are all later in time: a partition read up to its end, the
  repartitioned records of an upstream task that read everything it was given;
- a queue is **bounded** otherwise: its next records, in the next batch, are not earlier than
  its ``limit`` (``FROM_LAST``: the timestamp of its last record in this batch; a number: the
  bound its upstream task reported). Once a bounded queue is empty, no record of any other
  queue later than that limit is taken: it waits for the next batch;
- ``cap``: at most that many records are taken (``platform.max.records.per.batch`` is per
  task).

What is not taken stays where it was: a Kafka partition's records are read again by the next
batch (the task reports where it stopped), repartitioned records are kept in the task's
repartition buffer (executor.py). The same queues always give the same order and the same
cut, so a replayed batch takes exactly the same records.

The result's ``bound`` is what a downstream task needs to know of this one: None when it took
everything and every queue was complete, else the time its future records will not be earlier
than (live traffic: each partition's records come in time order).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamplatform.runtime.kafka_input import CHUNK_RECORDS  # records per chunk to a task

FROM_LAST = "from-last"  # a bounded queue's limit: the timestamp of its last record


@dataclass
class InputQueue:
    """One input of a task: ``chunks`` of records (tuples in ConsumedRecord's layout) in the
    order they were written; ``key`` breaks timestamp ties (lowest first); ``limit``: None
    (complete), FROM_LAST, or a timestamp (see the module docstring)."""

    chunks: Iterator[list[Any]]
    key: tuple
    limit: Any = None
    left: list[Any] = field(default_factory=list)  # what merge did not take, in order
    taken: int = 0

    def rest(self) -> Iterator[Any]:
        """The records not taken, reading the rest of the queue."""
        yield from self.left
        for chunk in self.chunks:
            yield from chunk


@dataclass
class MergeResult:
    """Filled in as ``merge`` runs: whether it stopped before the end of its queues, and
    the bound of the task's output (see the module docstring)."""

    stopped: bool = False
    bound: int | None = None
    taken: int = 0
    last_time: int | None = None


def merge(
    queues: Sequence[InputQueue],
    time_of: Callable[[Any], int] | None = None,
    cap: int | None = None,
    result: MergeResult | None = None,
    chunk_records: int = CHUNK_RECORDS,
) -> Iterator[list[Any]]:
    """The records of ``queues`` in pick order, in chunks, cut as the module docstring says.
    ``time_of(record)``: its timestamp for ordering (the extracted one); None: the record's
    own (``record[3]``). ``result`` is filled in as the merge runs and is final once the
    iterator is exhausted."""
    result = result if result is not None else MergeResult()
    stamp = time_of if time_of is not None else _record_time
    if len(queues) == 1:  # nothing to order: the queue's chunks as they come
        yield from _one_queue(queues[0], stamp, cap, result)
        return
    watermark: int | None = None  # the lowest limit of a bounded queue that ran empty
    heads: list[tuple[int, tuple, int]] = []
    current: list[list[Any]] = []
    positions: list[int] = []
    for index, queue in enumerate(queues):
        chunk = _next_chunk(queue)
        current.append(chunk)
        positions.append(0)
        if chunk:
            heads.append((stamp(chunk[0]), queue.key, index))
        elif queue.limit is not None and queue.limit != FROM_LAST:
            watermark = _lower(watermark, queue.limit)  # an upstream bound, nothing yet
    heapq.heapify(heads)
    out: list[Any] = []
    append = out.append
    taken = 0
    limit = cap if cap is not None else -1
    while heads:
        time, key, index = heads[0]
        if (watermark is not None and time > watermark) or taken == limit:
            result.stopped = True
            break
        queue, chunk, position = queues[index], current[index], positions[index]
        append(chunk[position])
        taken += 1
        queue.taken += 1
        result.last_time = time
        position += 1
        if position == len(chunk):
            chunk, position = _next_chunk(queue), 0
            current[index] = chunk
        positions[index] = position
        if chunk:
            heapq.heapreplace(heads, (stamp(chunk[position]), key, index))
        else:
            heapq.heappop(heads)
            if queue.limit is not None:
                watermark = _lower(watermark, time if queue.limit == FROM_LAST else queue.limit)
        if len(out) >= chunk_records:
            yield out
            out = []
            append = out.append
    if out:
        yield out
    for index, queue in enumerate(queues):  # what was not taken stays with its queue
        chunk = current[index]
        queue.left = chunk[positions[index] :] if chunk else []
    result.taken = taken
    _finish(result, watermark)


def _one_queue(
    queue: InputQueue, stamp: Callable[[Any], int], cap: int | None, result: MergeResult
) -> Iterator[list[Any]]:
    """``merge`` of a single queue: its chunks as they come, cut at ``cap``; the timestamp of
    only its last record taken is asked for (the bound)."""
    taken = 0
    last = None
    for chunk in queue.chunks:
        if not chunk:
            continue
        if cap is not None and taken + len(chunk) >= cap:
            room = cap - taken
            queue.left = chunk[room:]
            chunk = chunk[:room]
            result.stopped = bool(queue.left) or _has_more(queue)
        if chunk:
            taken += len(chunk)
            last = chunk[-1]
            yield chunk
        if result.stopped or (cap is not None and taken >= cap):
            break
    queue.taken = result.taken = taken
    result.last_time = None if last is None else stamp(last)
    watermark = None
    if not result.stopped and queue.limit is not None:
        if queue.limit != FROM_LAST:
            watermark = queue.limit
        elif result.last_time is not None:
            watermark = result.last_time
    _finish(result, watermark)


def _has_more(queue: InputQueue) -> bool:
    """Whether ``queue`` has a record after its ``left`` ones (read ahead: kept in ``left``)."""
    chunk = _next_chunk(queue)
    queue.left = list(queue.left) + chunk
    return bool(queue.left)


def _finish(result: MergeResult, watermark: int | None) -> None:
    bounds = [] if watermark is None else [watermark]
    if result.stopped and result.last_time is not None:
        bounds.append(result.last_time)
    if result.stopped and watermark is None and result.last_time is None:
        bounds.append(-1)  # stopped before any record: nothing is known yet
    result.bound = min(bounds) if bounds else None


def _record_time(record: Any) -> int:
    return record[3]  # type: ignore[no-any-return]


def _lower(current: int | None, limit: int) -> int:
    return limit if current is None else min(current, limit)


def _next_chunk(queue: InputQueue) -> list[Any]:
    for chunk in queue.chunks:
        if chunk:
            return chunk
    return []
