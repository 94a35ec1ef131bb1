"""A task's planned ranges of its Kafka partitions, read in its Spark Python worker, a range
at a time (``read_range``); a task of several partitions merges them as it takes them
(partition_group.py).

Spark's Kafka batch source costs about half a second per micro-batch before the first record
reaches a task (the relation's offset checks on the driver, its consumers' setup). For small
batches that is most of the batch, so a job that streams its sink (one source topic, one Delta
sink) reads small batches here instead: a Spark job of one row per task, each task reading
exactly its planned ``[start, end)`` with a consumer its worker keeps between batches, as a
Kafka Streams thread keeps its consumer. Same isolation as Spark's reader: ``read_committed``
(aborted records and transaction markers leave gaps), and a start offset that is no longer in
the log fails the task instead of reading from elsewhere.

The records go to the task as chunks of tuples in ``ConsumedRecord``'s layout, the form the
task processes; the Arrow batches of Spark's source are turned into the same tuples
(``rows.arrow_records``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamplatform.exceptions import StreamPlatformError
from streamplatform.records import NO_HEADERS, ConsumedRecord

# Records per chunk handed to the task. Small, so that a chunk's records are still in the
# CPU's cache when the task reaches them: one partition's 288k bench records took 5.8–8.5 µs
# of CPU per record in chunks of 1,000 against 7.8–8.9 in chunks of 10,000 (same run,
# alternating). The task's output still leaves in batches of OUTPUT_BATCH_ROWS (executor).
CHUNK_RECORDS = 1_000
# A range of at least this many records is read with fetches of up to 16 MiB per partition
# instead of librdkafka's 1 MiB: about 1.7 instead of 5-7 us per record on the bench's
# 100-byte records. A small range keeps the small fetches: a 16 MiB fetch for a few thousand
# records costs tens of milliseconds of data read past the range's end.
BULK_RECORDS = 50_000
BULK_FETCH = {"max.partition.fetch.bytes": 16 << 20, "fetch.max.bytes": 64 << 20}
# A fetch at the end of a partition waits up to fetch.wait.max.ms (500 ms by default) for new
# records, and the consumer sends one fetch per broker at a time: the next range's first fetch
# waited behind the last range's, about 280 ms per range on average. The reader never wants
# records past its range, so it does not wait for them.
FETCH_WAIT_MAX_MS = 5
# A fetch of more than queued.min.messages records (a big fetch holds ~160k of the bench's
# records) fills the consumer's queue past its threshold, and librdkafka then postpones the
# partition's next fetch by fetch.queue.backoff.ms: 1 s by default, while the task empties
# the queue in a fraction of that. Measured over 600k records: 1.4-1.5 s with the default,
# 0.6-0.7 s with 10 ms. The reader wants the next records as soon as the task can take them.
FETCH_QUEUE_BACKOFF_MS = 10
STALL_TIMEOUT_S = 120.0  # no record and no end for this long: the broker is not answering

log = logging.getLogger(__name__)
_lock = threading.Lock()


@dataclass
class _Kept:
    """A consumer this process keeps, the topics whose metadata it has asked for, and whether
    a read is using it (a consumer reads one range at a time: two threads reading at once,
    such as the driver's tasks and another job's, each take their own)."""

    consumer: Any
    topics: set[str] = field(default_factory=set)
    in_use: bool = False


_consumers: dict[str, list[_Kept]] = {}  # the consumer settings (JSON) -> the consumers kept


class KafkaInputError(StreamPlatformError, RuntimeError):
    """The planned range could not be read (the message names the range and the cause)."""


def append_rows(
    messages: list[Any], topic: str, partition: int, end: int, rows: list[Any], no_headers: Any
) -> int:
    """Append ``messages`` to ``rows`` in the task's record layout, in order, up to the first
    that has an error or is at or past ``end``; its index (``len(messages)``: none). Straight
    into the tuples the task takes: no Arrow batch in between, which the task would only turn
    back into these tuples. ``_kafka_rows.append_rows`` (C) does the same."""
    append = rows.append
    for index, message in enumerate(messages):
        if message.error() is not None:
            return index
        offset = message.offset()
        if offset >= end:
            return index
        append((topic, partition, offset, message.timestamp()[1], message.key(),
                message.value(), message.headers() or no_headers))  # fmt: skip
    return len(messages)


try:  # built with the package where a C compiler is available (setup.py)
    from streamplatform.runtime import _kafka_rows
except ImportError:  # pragma: no cover - depends on the build
    _kafka_rows = None  # type: ignore[assignment]
_native_append_rows = None if _kafka_rows is None else _kafka_rows.append_rows
_append_rows = append_rows if _native_append_rows is None else _native_append_rows


def read_range(
    settings: Mapping[str, Any], topic: str, partition: int, start: int, end: int
) -> Generator[list[ConsumedRecord], None, None]:
    """The committed records of ``topic``-``partition`` at offsets ``[start, end)``, in offset
    order, in chunks of up to CHUNK_RECORDS: plain tuples in ConsumedRecord's layout, what
    ``Task.process_all`` takes. ``end`` is at most the partition's last stable offset (the
    plan stops there), so the range is complete once the reader is at or past ``end``."""
    from confluent_kafka import KafkaError, TopicPartition

    kept = _take_consumer(settings, bulk=end - start >= BULK_RECORDS)
    consumer = kept.consumer
    what = f"{topic}-{partition} [{start}, {end})"
    try:
        _learn_topic(kept, topic, what)
    except BaseException:
        kept.in_use = False
        raise
    consumer.assign([TopicPartition(topic, partition, start)])
    try:
        rows: list[Any] = []
        position = start
        stalled_since = time.monotonic()
        while position < end:
            messages = consumer.consume(min(CHUNK_RECORDS, end - position), timeout=0.5)
            had = len(rows)
            stopped = _append_rows(messages, topic, partition, end, rows, NO_HEADERS)
            if len(rows) > had:
                position = rows[-1][2] + 1
            if stopped < len(messages):
                error = messages[stopped].error()
                if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise KafkaInputError(
                        f"reading {what}: not authorized: the principal needs the ACL ALLOW "
                        f"READ (and DESCRIBE) on topic {topic}; nothing of the batch is "
                        "committed, and it runs again once the ACL is granted"
                    )
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaInputError(f"reading {what}: {error}")
                # At ``end``, or at the last stable offset, which is at or past it (the rest
                # of the range was markers or aborted records).
                position = end
            if messages:
                stalled_since = time.monotonic()
            elif time.monotonic() - stalled_since > STALL_TIMEOUT_S:
                raise KafkaInputError(
                    f"reading {what}: nothing read for {STALL_TIMEOUT_S:g} s at offset {position}"
                )
            if len(rows) >= CHUNK_RECORDS or (rows and position >= end):
                yield rows
                rows = []
    finally:
        try:
            consumer.unassign()
        finally:
            kept.in_use = False  # a bool's store is atomic: no lock needed to give it back


def has_records(
    settings: Mapping[str, Any], topic: str, partition: int, start: int, end: int
) -> bool:
    """True when ``[start, end)`` of ``topic``-``partition`` holds a committed record."""
    batches = read_range(settings, topic, partition, start, end)
    try:
        return next(batches, None) is not None
    finally:
        batches.close()


def _learn_topic(kept: _Kept, topic: str, what: str) -> None:
    """Ask for ``topic``'s metadata before a kept consumer's first read of it. Assigned a
    partition of a topic it does not know, the consumer waits for its next metadata refresh
    before it fetches: 0.9 s measured on the local broker, for every topic a kept consumer
    (a reused Python worker, the driver) reads for the first time. Asked for, 10 ms."""
    from confluent_kafka import KafkaException

    if topic in kept.topics:
        return
    try:
        kept.consumer.list_topics(topic, timeout=STALL_TIMEOUT_S)
    except KafkaException as error:
        raise KafkaInputError(f"reading {what}: no metadata for {topic}: {error}") from error
    kept.topics.add(topic)  # a set's add is atomic: two threads at worst both ask


def kept_consumers(settings: Mapping[str, Any]) -> int:
    """How many consumers this process keeps for ``settings`` (for tests and diagnostics)."""
    with _lock:
        return sum(len(_consumers.get(_key(settings, bulk), ())) for bulk in (False, True))


def close_consumers(settings: Mapping[str, Any] | None = None) -> None:
    """Close the consumers kept here for ``settings`` (every one when None) that no read is
    using: a job's, when it closes, while its broker is still there to say goodbye to. A
    consumer left open after its broker stopped retries the connection for as long as the
    process lives, and says so in the log."""
    with _lock:
        keys = (
            list(_consumers) if settings is None
            else [_key(settings, bulk) for bulk in (False, True)]
        )  # fmt: skip
        closing = []
        for key in keys:
            kept = _consumers.pop(key, [])
            closing += [entry for entry in kept if not entry.in_use]
            if busy := [entry for entry in kept if entry.in_use]:
                _consumers[key] = busy
    if closing:
        log.debug("Closing %d kept Kafka consumer(s) of task reads", len(closing))
    for entry in closing:
        with contextlib.suppress(Exception):  # a broker already gone: nothing to tell it
            entry.consumer.close()


# Whatever no job closed is closed at exit, while the interpreter still works: librdkafka's
# threads then stop in order, not during the interpreter's final teardown.
atexit.register(close_consumers)


def _key(settings: Mapping[str, Any], bulk: bool) -> str:
    return json.dumps([dict(settings), bulk], sort_keys=True, default=str)


def _take_consumer(settings: Mapping[str, Any], bulk: bool = False) -> _Kept:
    """A consumer kept here for ``settings`` that no read is using, marked in use (created
    when there is none); ``bulk``: one with big fetches (BULK_FETCH), unless the settings
    choose their own. The reader gives it back by clearing ``in_use``."""
    from streamplatform.kafka.clients import consumer

    fetch = dict(BULK_FETCH) if bulk else {}
    fetch["fetch.wait.max.ms"] = FETCH_WAIT_MAX_MS
    fetch["fetch.queue.backoff.ms"] = FETCH_QUEUE_BACKOFF_MS
    fetch = {k: v for k, v in fetch.items() if k not in settings}  # the settings choose first
    with _lock:
        kept = _consumers.setdefault(_key(settings, bulk), [])
        free = next((entry for entry in kept if not entry.in_use), None)
        if free is None:
            free = _Kept(consumer(
                settings, "streamplatform-task-reader",
                **{"isolation.level": "read_committed", "enable.partition.eof": True,
                   "auto.offset.reset": "error", "enable.auto.offset.store": False},
                **fetch,
            ))  # fmt: skip
            kept.append(free)
        free.in_use = True
        return free
