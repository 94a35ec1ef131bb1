"""Kafka sinks and the DLQ topic, produced from the executors with each record's own timestamp.

Spark's Kafka writer (4.2) has no timestamp column: every record it writes gets the time of the
write. A job downstream would then see processing time instead of event time (the enrichment
job reading the deduplicated topic would join each transaction with the rate valid when the
dedup job ran, and the daily partitions would follow the wall clock). Kafka Streams forwards
the record's timestamp to its sinks, so we do too: each Spark partition of the batch's Kafka
output is produced by an idempotent librdkafka producer with ``timestamp=`` the record's, its
headers, and the partition the task chose (internal topics) or murmur2 of the key, as Java
clients do.

The writes are at least once: a batch whose producing fails raises, is not committed, and runs
again; an idempotent producer only removes duplicates from its own retries. So that readers can
drop repeats, every sink record carries the header ``__streamplatform.source`` =
``<source topic>/<partition>/<offset>/<n>``: the record its task was processing and the n-th
output of that record (replacing such a header from an upstream job). DLQ records carry their
source coordinates in their error headers already.

A task that fails sends its own DLQ records with ``send`` before it fails (executor.py), also
at least once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

PRODUCED_SCHEMA = "produced LONG"
COLUMNS = ("kind", "topic", "key", "value", "timestamp", "headers", "partition", "source_topic",
           "source_partition", "source_offset")  # fmt: skip
SOURCE_HEADER = "__streamplatform.source"
_FLUSH_TIMEOUT_S = 120.0


class KafkaOutputError(RuntimeError):
    """Some records of a batch were not acknowledged by the broker; the batch is not committed."""


def producing(settings: Mapping[str, Any]) -> Callable[[Iterator[pa.RecordBatch]], Iterator]:
    """A ``mapInArrow`` function producing rows of ``COLUMNS`` to Kafka; it yields one row with
    how many records it produced."""
    connection = dict(settings)

    def produce(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        produced = send(connection, batches, "the batch's Kafka output")
        yield pa.RecordBatch.from_pydict({"produced": [produced]})

    return produce


def send(settings: Mapping[str, Any], batches: Iterable[pa.RecordBatch], what: str) -> int:
    """Produce the rows of ``batches`` (at least ``COLUMNS``) and wait until the broker has
    acknowledged every one; returns how many. Raises KafkaOutputError, naming ``what``, when
    some were not: the caller's batch must then not be committed."""
    from streamplatform.kafka.clients import producer

    out = producer(settings, **{"enable.idempotence": True, "linger.ms": 20})
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(f"{message.topic()}[{message.partition()}]: {error}")

    produced, last_source, nth = 0, None, 0
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in COLUMNS]
        for row in zip(*columns, strict=True):
            kind, topic, key, value, timestamp, headers, partition = row[:7]
            pairs = [(h["key"], h["value"]) for h in headers or ()]
            if kind == "sink":  # a task's outputs of one source record come one after another
                source = row[7:]
                nth = nth + 1 if source == last_source else 0
                last_source = source
                stamp = "/".join(str(part) for part in (*source, nth)).encode()
                pairs = [(k, v) for k, v in pairs if k != SOURCE_HEADER] + [(SOURCE_HEADER, stamp)]
            options: dict[str, Any] = {"on_delivery": delivered}
            if timestamp is not None and timestamp >= 0:  # 0: the producer's clock
                options["timestamp"] = timestamp
            if pairs:
                options["headers"] = pairs
            if partition is not None:
                options["partition"] = partition
            _produce(out, topic, key, value, options)
            produced += 1
    unsent = out.flush(_FLUSH_TIMEOUT_S)
    if failures or unsent:
        shown = "; ".join(failures[:5])
        raise KafkaOutputError(
            f"{len(failures)} record(s) failed and {unsent} were not acknowledged within "
            f"{_FLUSH_TIMEOUT_S:g}s while producing {what}: {shown}"
        )
    return produced


def _produce(out: Any, topic: str, key: Any, value: Any, options: dict[str, Any]) -> None:
    while True:
        try:
            out.produce(topic, value=value, key=key, **options)
            out.poll(0)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            out.poll(0.1)
