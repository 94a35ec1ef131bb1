"""A task's copies of its global tables, caught up before each batch (``GlobalKTable``).

Kafka Streams keeps one copy of each global table per instance, filled by a global thread from
every partition of the table's topic and read by the stream-global joins of every task; the
topic is its changelog. Here each task keeps its own copy (a store in its directory, no
changelog: ``Task.global_stores``), and before it processes a batch's records it applies the
table's records from where its copy stands up to the offsets the batch's plan logged
(``BatchPlan.global_ends``: each partition's last stable offset when the batch was planned).

- **Replays are exact.** Every attempt of a batch, on any executor, catches up to the same
  logged offsets, so its joins see the same table.
- **Not time-synchronized**, as in Kafka Streams (its global thread runs beside the stream
  threads): a stream record sees every update of the table planned with its batch, including
  those produced after it.
- **A copy is rebuilt from the topic** when a task starts without one (a new executor): read
  from the topic's first offset, as Kafka Streams restores a global store.
- The copy commits the offsets it reached with its writes; applying records again from an
  older position gives the same table (the latest value per key wins), so a crash while
  catching up leaves nothing wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from streamplatform.records import TopicPartition

log = logging.getLogger(__name__)


def catch_up(
    task: Any, ends: Mapping[tuple[str, int], int], consumer_settings: Mapping[str, Any]
) -> int:
    """Apply each global table's records to ``task``'s copy up to ``ends`` (a plan's
    ``global_ends``); returns how many records it applied."""
    from streamplatform.runtime.kafka_input import read_range

    applied = 0
    for table in task.topology.global_tables():
        store = task.global_stores.get(table.store_name)
        if store is None:
            continue  # a global table this task's sub-topology does not join
        for (topic, partition), end in sorted(ends.items()):
            if topic != table.topic:
                continue
            tp = TopicPartition(topic, partition)
            position = store.committed_offset(tp)
            if position is None:
                position = _first_offset(consumer_settings, topic, partition)
                store.commit({tp: position})  # known from now on, even if empty
            if position >= end:
                continue
            # Committed chunk by chunk: a rebuild holds one chunk in memory, not the table.
            for chunk in read_range(consumer_settings, topic, partition, position, end):
                applied += apply_global_records(store, chunk)
                store.commit({tp: chunk[-1][2] + 1})
            store.commit({tp: end})  # past the end's markers and aborted records
    if applied:
        log.debug("task %s: %d global table records applied", task.task_id, applied)
    return applied


def apply_global_records(store: Any, records: Iterable[Any]) -> int:
    """Write ``records`` (ConsumedRecord, or plain tuples in its layout: topic, partition,
    offset, timestamp, key bytes, value bytes, headers) of a global table's topic into
    ``store``, a task's copy of the table: the raw bytes, a None value deleting the key, a
    None key skipped (Kafka Streams' table source skips it). The writes are staged in the
    store's writing transaction: the caller commits the store with the offsets it reached
    (``store.commit({TopicPartition(topic, partition): next_offset})``), not with its task.
    Returns how many records were applied."""
    transaction = store.transaction
    applied = 0
    for record in records:
        key, value = record[4], record[5]
        if key is None:
            continue
        if value is None:
            transaction.delete(key)
        else:
            transaction.put(key, value)
        applied += 1
    return applied


def _first_offset(settings: Mapping[str, Any], topic: str, partition: int) -> int:
    """The partition's first offset still in the log (its low watermark)."""
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from streamplatform.kafka.clients import consumer

    reader = consumer(settings, group_id=f"global-table-{topic}")
    try:
        low, _ = reader.get_watermark_offsets(KafkaTopicPartition(topic, partition), 10)
        return int(low)
    finally:
        reader.close()
