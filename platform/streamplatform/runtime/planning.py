"""Planning a batch: per source partition ``[consumed, min(end, consumed +
platform.max.records.per.batch))``, where ``end`` is the last stable offset; under
exactly_once_v2 never past Kafka outputs that are committed already. Also what the batch
consumed, and the offsets it did not read as records."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from streamplatform.config import ConfigError, iso_duration_ms
from streamplatform.runtime.batch_outputs import Progress
from streamplatform.runtime.group_offsets import GroupOffsets
from streamplatform.runtime.job_context import JobContext
from streamplatform.runtime.logs import CommittedBatch, Ranges

log = logging.getLogger(__name__)


class Planner:
    """Plans batches of ``context``'s sources from one reused watermark client."""

    def __init__(self, context: JobContext, group_offsets: GroupOffsets) -> None:
        self.context = context
        self.group_offsets = group_offsets
        self._watermarks: Any = None
        # Where partitions without a committed position start, resolved once per run by
        # auto.offset.reset: "latest" is the end when the job first looked, not at each plan
        # (records arriving meanwhile are read), as a consumer resets once when assigned.
        self._first_positions: dict[tuple[str, int], int] = {}
        # Where `streamplatform reset` said the inputs start (reset.py), read at the claim.
        self.reset_positions: dict[tuple[str, int], int] = {}
        # Each source partition's lag as the last plan saw it (the metrics, between batches).
        self.last_partition_lag: dict[tuple[str, int], int] = {}

    def plan(self, consumed: Mapping[tuple[str, int], int]) -> Ranges:
        cap = self.context.config["platform.max.records.per.batch"]
        ranges: Ranges = {}
        self._check_partition_counts()
        lag: dict[tuple[str, int], int] = {}
        for tp, (low, high) in self.end_offsets().items():
            position = consumed.get(tp)
            if position is None:
                position = self._first_position(tp, low, high)
            start = max(position, low)
            ranges[tp] = (start, min(high, start + cap))
            lag[tp] = max(0, high - start)
        if self.context.config.exactly_once:
            ranges = self._short_of_committed_outputs(ranges)
        self.last_partition_lag = lag
        return ranges

    def global_ends(self) -> dict[tuple[str, int], int]:
        """Where each global table partition ends now (its last stable offset): a batch's
        tasks catch their global tables up to it, and a replay of the batch to the same."""
        watermarks = self._watermark_client()
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        context = self.context
        return {
            (topic, p): watermarks.get_watermark_offsets(KafkaTopicPartition(topic, p), 10)[1]
            for topic in context.global_topics
            for p in range(context.partitions[topic])
        }

    def end_offsets(self) -> dict[tuple[str, int], tuple[int, int]]:
        """``(low, high)`` watermarks of every source partition."""
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        watermarks = self._watermark_client()
        context = self.context
        return {
            (topic, p): watermarks.get_watermark_offsets(KafkaTopicPartition(topic, p), 10)
            for topic in context.sources
            for p in range(context.partitions[topic])
        }

    def _watermark_client(self) -> Any:
        from streamplatform.kafka.clients import consumer

        if self._watermarks is None:
            # read_committed: the high watermark is the last stable offset, so a plan never
            # reaches into a transaction that is still open.
            committed_only = {"isolation.level": "read_committed"}
            self._watermarks = consumer(
                self.context.kafka, group_id=f"{self.context.app}-watermarks", **committed_only
            )
        return self._watermarks

    def _first_position(self, tp: tuple[str, int], low: int, high: int) -> int:
        """Where partition ``tp``, never committed by this job, starts: ``auto.offset.reset``
        (earliest, latest, by_duration:<ISO-8601>, none), as Kafka Streams' consumer does."""
        if tp in self._first_positions:
            return self._first_positions[tp]
        policy = self.context.config["auto.offset.reset"]
        if tp[0] in self.context.feedback_topics:
            # A new job's is empty; after a reset it holds the old run's answers, which the
            # reset job sends again: their end, whatever auto.offset.reset says.
            position, policy = high, "the job's own cycle topic"
        elif tp in self.reset_positions:
            position, policy = self.reset_positions[tp], "streamplatform reset"
        elif policy == "earliest":
            position = low
        elif policy == "latest":
            position = high
        elif policy.startswith("by_duration:"):
            position = self._offset_at(tp, policy.split(":", 1)[1], high)
        else:  # "none"
            raise ConfigError(
                f"{self.context.app}: no committed position for {tp[0]}-{tp[1]} and "
                "auto.offset.reset=none: set auto.offset.reset (earliest, latest, "
                "by_duration:<ISO-8601>) to say where it starts"
            )
        why = policy if " " in policy else f"auto.offset.reset={policy}"
        log.info("%s: %s-%d has no committed position: starting at offset %d (%s)",
                 self.context.app, *tp, position, why)  # fmt: skip
        self._first_positions[tp] = position
        return position

    def _offset_at(self, tp: tuple[str, int], duration: str, high: int) -> int:
        """The first offset of ``tp`` whose timestamp is at least ``duration`` before now (the
        end when none is)."""
        import time

        from confluent_kafka import TopicPartition as KafkaTopicPartition

        since_ms = int(time.time() * 1000) - iso_duration_ms(duration)
        [found] = self._watermarks.offsets_for_times(
            [KafkaTopicPartition(tp[0], tp[1], since_ms)], timeout=10
        )
        if found.error is not None:
            raise RuntimeError(f"{self.context.app}: offsets_for_times of {tp}: {found.error}")
        return high if found.offset < 0 else int(found.offset)

    def _check_partition_counts(self) -> None:
        """A source topic whose partition count changed since the job started stops the job
        with an error saying so (ConfigError): its tasks, state and repartition widths were
        laid out for the old count. Asked at each plan (one metadata request)."""
        if self._watermarks is None:
            self.end_offsets()
        metadata = self._watermarks.list_topics(timeout=10)
        grown = {
            topic: (self.context.partitions[topic], len(metadata.topics[topic].partitions))
            for topic in self.context.sources
            if topic in metadata.topics
            and len(metadata.topics[topic].partitions) != self.context.partitions[topic]
        }
        if grown:
            raise ConfigError(partition_change_message(self.context.app, grown))

    def _short_of_committed_outputs(self, ranges: Ranges) -> Ranges:
        """Under exactly_once_v2 a new plan never reaches past Kafka outputs that are committed
        already. The consumer group's offset is ahead of the commit log only where a task of a
        batch that never committed had committed its Kafka transaction, and that batch's plan
        is gone (``discard_uncommitted_batch``): its records up to that offset are in the Kafka
        topics. Such a task is planned up to the group's offsets only, on every partition it
        reads, so that it finds its transaction committed and produces nothing (the records
        go to the stores and Delta again, under this job's code); the next batch goes on from
        there. Without this, the new plan would produce them a second time."""
        group = self.group_offsets.committed(sorted(ranges))
        for positions in self.context.task_partitions(ranges).values():
            if not any(group.get(tp, -1) > ranges[tp][0] for tp in positions):
                continue
            for tp in positions:
                start, end = ranges[tp]
                ranges[tp] = (start, min(end, max(start, group.get(tp, start))))
            log.warning("%s: the Kafka outputs of %s up to %s are committed already (a "
                        "discarded batch's task); planning up to there, producing nothing "
                        "twice", self.context.app, positions,
                        {tp: group.get(tp) for tp in positions})  # fmt: skip
        return ranges

    def lag(self, consumed: Mapping[tuple[str, int], int]) -> int:
        return sum(self.partition_lag(consumed).values())

    def partition_lag(self, consumed: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Each source partition's records between ``consumed`` and its last stable offset."""
        return {
            tp: max(0, high - consumed.get(tp, self._first_positions.get(tp, low)))
            for tp, (low, high) in self.end_offsets().items()
        }

    def close(self) -> None:
        if self._watermarks is not None:
            self._watermarks.close()
            self._watermarks = None


def partition_change_message(app: str, changed: Mapping[str, tuple[int, int]]) -> str:
    what = ", ".join(f"{t} from {old} to {new}" for t, (old, new) in sorted(changed.items()))
    return (
        f"{app}: source partitions changed while the job runs ({what}). Its tasks, their "
        "state and its repartition widths were laid out for the old counts, as in Kafka "
        "Streams: stop the job and start it again (the new partitions are then read from "
        "their first offset), or reset the application to re-partition its state."
    )


def consumed_offsets(ranges: Ranges, progress: Progress) -> dict[tuple[str, int], int]:
    """Where the batch stopped on each partition: a task that stopped early (its stores'
    uncommitted limits) reported where it stopped on each partition it was given; every other
    range was read to its end."""
    return {tp: end for tp, (_, end) in ranges.items()} | {
        tp: offset for tp, offset in progress.consumed.items() if tp in ranges
    }


def offset_gaps(
    app: str,
    batch_id: int,
    ranges: Ranges,
    consumed: Mapping[tuple[str, int], int],
    last: CommittedBatch | None,
    metrics: Mapping[str, int],
) -> dict[str, int]:
    """Offsets a batch did not read as records: ``offsets_skipped``, those gone from Kafka
    before they were read (retention, a deleted topic's records: the plan starts at the
    partition's first offset), and ``offset_gaps``, offsets inside the ranges read that held
    no committed record (transaction markers, aborted or compacted records)."""
    skipped = 0
    for tp, (start, _) in ranges.items():
        before = None if last is None else last.consumed.get(tp)
        if before is not None and start > before:
            skipped += start - before
            log.warning("%s batch %d: offsets %d..%d of %s-%d are gone from Kafka (retention?) "
                        "and were never read", app, batch_id, before, start - 1, *tp)  # fmt: skip
    read = sum(consumed[tp] - start for tp, (start, _) in ranges.items())
    gaps = max(0, read - metrics.get("records_in", 0))
    if gaps:
        log.info("%s batch %d: %d offsets held no committed record", app, batch_id, gaps)
    return {"offsets_skipped": skipped, "offset_gaps": gaps}
