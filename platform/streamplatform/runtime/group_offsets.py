"""The job's progress in its consumer group ``application.id``, where Kafka tools look for it.

After each batch's commit the driver commits the batch's consumed offsets to the group, so
consumer-group lag (``kafka-consumer-groups.sh``, Burrow, Cruise Control, Kafka UI) shows the
job like any Kafka Streams application. The commit log stays the job's own record of progress.

Under exactly_once_v2 the tasks with Kafka outputs have committed their offsets already, in
their transactions (kafka_output.py), and those offsets decide whether a re-run produces their
records again: so they must never go back. The driver's commit is transactional too, with
``transactional.id`` = ``<application.id>-offsets``: a new driver's ``init_transactions``, done
right after it claims the job, fences the commit of a driver that lost the claim. That first
``init_transactions`` also checks, at start-up, that the broker allows transactions.
Under at_least_once it is a plain commit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from streamplatform.runtime.kafka_output import (
    KafkaOutputError,
    _group_client,
    _transactional_call,
    committed_offsets,
    producer_for,
)

log = logging.getLogger(__name__)


class GroupOffsets:
    """Commits a job's consumed offsets to its consumer group ``app``."""

    def __init__(self, settings: Mapping[str, Any], app: str, exactly_once: bool) -> None:
        self.settings, self.app, self.exactly_once = settings, app, exactly_once
        self._producer: Any = None
        self._group: Any = None

    def start(self) -> None:
        """Under exactly_once_v2: fence the commits of earlier drivers; raises
        KafkaOutputError, saying what to change, when the broker refuses transactions."""
        self.close()
        self._group = _group_client(self.settings, self.app)
        if self.exactly_once:
            fixed = {"transactional.id": f"{self.app}-offsets"}
            self._producer = producer_for(self.settings, **fixed)
            what = f"{self.app}: the driver's offset commits (processing.guarantee=exactly_once_v2)"
            _transactional_call(self._producer.init_transactions, what, self.settings)

    def commit(self, consumed: Mapping[tuple[str, int], int]) -> bool:
        """Commit ``consumed``; False, with a warning, when the broker did not take it (the
        next batch's commit carries it). Called right after the batch's commit, which proved
        the claim: only then may a driver whose producer failed start a new one (a fenced
        driver must not fence the one that replaced it)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            if self._group is None:
                self.start()
            if self.exactly_once:
                # Never back: where a task's transaction committed further (a discarded
                # batch's, see planning.Planner._short_of_committed_outputs) and the batch
                # stopped short of it, the group's offset says how far outputs exist.
                ahead = self.committed(sorted(consumed))
                consumed = {tp: max(offset, ahead.get(tp, offset)) for tp, offset in
                            consumed.items()}  # fmt: skip
            offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(consumed.items())]
            if self._producer is None:
                self._group.commit(offsets=offsets, asynchronous=False)
                return True
            what = f"{self.app}: committing the consumed offsets"
            self._producer.begin_transaction()
            metadata = self._group.consumer_group_metadata()
            _transactional_call(self._producer.send_offsets_to_transaction, what,
                                self.settings, offsets, metadata)  # fmt: skip
            _transactional_call(self._producer.commit_transaction, what, self.settings)
            return True
        except (KafkaException, KafkaOutputError) as error:
            log.warning("%s: the consumer group's offsets were not committed (%s); the next "
                        "batch commits them", self.app, error)  # fmt: skip
            self.close()
            return False

    def committed(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's stable committed offsets on ``partitions`` (where it has any)."""
        if self._group is None:
            self.start()
        return committed_offsets(self._group, partitions, f"{self.app}: the consumer group")

    def close(self) -> None:
        if self._group is not None:
            self._group.close()
        self._producer = self._group = None
