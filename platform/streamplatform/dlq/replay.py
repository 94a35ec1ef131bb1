"""DLQ replay: send dead-lettered records back through the current topology, once each.

How (chosen over running the records' outputs from here): a DLQ record that the *current*
topology's task code processes without an error (:mod:`preflight`) is **re-published to its
source topic and partition**, with its original key, value, timestamp and headers plus
``__streamplatform.replay.*`` headers (first failure, attempt, replay batch). The running
streaming job then processes it like any record, with its real state: the dedup store decides
whether it is a duplicate, the join meets the table as it is. A record that fails the preflight
is **parked** in ``_dlq_parked`` with its attempt count and error, and is not retried unless asked
(``retry_parked``). A re-published record that fails again in the job returns to the DLQ with
its replay headers; the next replay counts its attempts and parks it after ``max_attempts``.

Nothing lost, nothing doubled, across crashes at any step of a replay batch R:

1. candidates = mirror rows after the log's position, minus every source record already in
   ``_dlq_replayed`` or ``_dlq_parked`` (an anti-join on topic/partition/offset);
2. the plan of R (each candidate's decision, and the high watermark of every partition it will
   publish to) is appended to ``_dlq_replay_log`` as ``planned`` before anything is published;
3. the re-published records go out with an idempotent producer (no repeats from the client's
   own retries), each stamped with its DLQ record's coordinates and R;
4. outcomes are appended to ``_dlq_replayed`` / ``_dlq_parked`` (idempotent: txnVersion = R),
   then R is logged ``done``.

A replay that finds R ``planned`` but not ``done`` finishes it from the logged plan: it reads the
target partitions from the logged watermarks to their end, collects the records stamped with
R, and publishes only the plan's records that are not there; steps 4 and ``done`` are
idempotent. So each DLQ record is re-published or parked exactly once; the job then reads a
re-published record once (exactly_once_v2) or at least once (at_least_once; the replay headers
let readers drop repeats).

Why not a Kafka transaction for step 3: the runtime plans its next batch from the offset after
the last record it processed, so a transaction's commit marker at the end of a partition would
leave it a range with no record to read. Per-record stamps make the recovery exact without one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamplatform import storage
from streamplatform.config import StreamsConfig
from streamplatform.dlq.inspect import mirror_path, read_mirror
from streamplatform.dlq.ledger import PARK, REPUBLISH, Decision, Plan, ReplayLedger
from streamplatform.dlq.preflight import preflight
from streamplatform.dlq.records import (
    REPLAY_ATTEMPT_HEADER,
    REPLAY_BATCH_HEADER,
    REPLAY_OF_HEADER,
    REPLAY_SOURCE_HEADER,
    DlqRecord,
)
from streamplatform.dsl.topology import Topology
from streamplatform.home import data_dir
from streamplatform.runtime.claim import JobClaim

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

COORDINATES = ["source_topic", "source_partition", "source_offset"]
# The replay's claim table holds no rows: only the claims in its Delta log.
CLAIM_SCHEMA = pa.schema([("claimed", pa.bool_())])
EXHAUSTED = "AttemptsExhausted"  # the "exception" of a record parked for having max_attempts


@dataclass(frozen=True)
class ReplayReport:
    """What one call of :meth:`DlqReplayer.replay` did."""

    application_id: str
    replay_batch: int | None  # None when there was nothing to replay
    candidates: int = 0
    republished: int = 0
    parked: int = 0
    exhausted: int = 0  # parked because they had max_attempts already
    recovered_batch: int | None = None  # an unfinished batch this call finished first
    recovered_already_published: int = 0  # of its records, found already in Kafka
    position: int = -1
    parked_by_exception: dict[str, int] = field(default_factory=dict)


class DlqReplayer:
    """Replays ``config["application.id"]``'s DLQ through ``topology`` (see the module docstring).

    ``config`` is the job's StreamsConfig (or its settings): the Delta root, the DLQ topic and
    the Kafka connection come from it. ``max_attempts``: replays a record's original may have
    before it is parked for good.
    """

    def __init__(
        self,
        topology: Topology,
        config: Mapping[str, Any] | StreamsConfig,
        spark: SparkSession,
        *,
        max_attempts: int = 3,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.topology = topology
        self.config = config if isinstance(config, StreamsConfig) else StreamsConfig(config)
        self.app: str = self.config["application.id"]
        self.spark = spark
        self.max_attempts = max_attempts
        root = self.config["platform.delta.root"] or str(data_dir() / "delta")
        self.app_root = f"{root.rstrip('/')}/{self.app}"
        storage.configure_spark(spark, self.config)  # a root on object storage: both engines
        self.mirror = mirror_path(root, self.app)
        self.ledger = ReplayLedger(spark, self.app_root, self.app)
        self.kafka = self.config.kafka_settings("producer")
        self._claim = JobClaim(
            f"{self.app_root}/_dlq_replay_claim", f"{self.app}-dlq-replay", CLAIM_SCHEMA,
            lease_ms=self.config["platform.claim.lease.ms"],
            wait_ms=self.config["platform.claim.wait.ms"], role="DLQ replay",
        )  # fmt: skip

    # The one entry point ---------------------------------------------------------------------

    def replay(self, *, retry_parked: bool = False) -> ReplayReport:
        """Finish an unfinished batch if there is one, then replay what is new in the mirror.

        One replay of a job at a time: it claims the job's DLQ replay first (as a streaming
        job claims its commit log, runtime/claim.py), so a second replay started meanwhile is
        refused with JobClaimedError (or waits, ``platform.claim.wait.ms``), and one that lost
        its claim stops before it publishes or records anything more."""
        self._claim.acquire()
        try:
            return self._replay(retry_parked)
        finally:
            self._claim.release()

    def _replay(self, retry_parked: bool) -> ReplayReport:
        last = self.ledger.last_batch()
        recovered: tuple[int, int] | None = None
        if last is not None and not last[1]:
            recovered = (last[0].replay_batch, self._finish(last[0], recovering=True))
        batch = 0 if last is None else last[0].replay_batch + 1
        position = -1 if last is None else last[2]
        candidates, newest, forced = self._candidates(position, retry_parked)
        report = ReplayReport(
            application_id=self.app,
            replay_batch=None,
            recovered_batch=None if recovered is None else recovered[0],
            recovered_already_published=0 if recovered is None else recovered[1],
            position=max(position, newest),
        )
        if not candidates:
            return report
        plan = self._plan(batch, max(position, newest), candidates, forced)
        self._claim.check()
        self.ledger.log_planned(plan)
        self._finish(plan, recovering=False, records=candidates)
        parked = [d for d in plan.decisions if d.action == PARK]
        by_exception: dict[str, int] = {}
        for decision in parked:
            name = decision.exception or "unknown"
            by_exception[name] = by_exception.get(name, 0) + 1
        return replace(
            report,
            replay_batch=batch,
            candidates=len(candidates),
            republished=len(plan.decisions) - len(parked),
            parked=len(parked),
            exhausted=sum(d.exception == EXHAUSTED for d in parked),
            position=plan.position,
            parked_by_exception=by_exception,
        )

    # Steps -----------------------------------------------------------------------------------

    def _candidates(
        self, position: int, retry_parked: bool
    ) -> tuple[dict[str, DlqRecord], int, set[str]]:
        """New mirror records not handled yet, by coordinates; the newest mirror batch id seen;
        with ``retry_parked`` also the parked records, whose coordinates come third."""
        from pyspark.sql import functions as F

        fresh = read_mirror(self.spark, self.mirror, since_batch=position)
        parked = self._parked_records() if retry_parked else {}
        if fresh is None:
            return parked, position, set(parked)
        newest_row = fresh.agg(F.max("batch_id")).first()
        newest = position if newest_row is None or newest_row[0] is None else int(newest_row[0])
        handled = self.ledger.handled()
        if handled is not None:
            fresh = fresh.join(handled, COORDINATES, "left_anti")
        rows = [row.asDict() for row in fresh.collect()]
        records = {str(r.source): r for r in map(DlqRecord.from_mirror_row, rows)}
        return records | parked, newest, set(parked)

    def _parked_records(self) -> dict[str, DlqRecord]:
        """Parked records as DLQ records whose attempt count is the parked one."""
        parked = self.ledger.parked()
        if parked is None:
            return {}
        records = {}
        for row in parked.collect():
            record = DlqRecord.from_mirror_row(row.asDict() | {"batch_id": row.dlq_batch_id})
            records[str(record.source)] = _with_attempts(record, int(row.attempts))
        return records

    def _plan(
        self, batch: int, position: int, records: dict[str, DlqRecord], forced: set[str]
    ) -> Plan:
        """Decide for every candidate: exhausted -> park; preflight passes -> re-publish.
        ``forced`` (parked records retried on request) are tried whatever their attempts."""
        settings = self.config.to_dict()
        tryable = [
            record
            for source, record in records.items()
            if record.attempt < self.max_attempts or source in forced
        ]
        verdicts = {str(v.record.source): v for v in preflight(self.topology, settings, tryable)}
        decisions = []
        for source, record in sorted(records.items(), key=lambda item: item[1].source):
            attempt = record.attempt + 1
            verdict = verdicts.get(source)
            if verdict is None:
                decision = Decision(source, str(record.original), attempt, PARK,
                                    batch_of(record), EXHAUSTED,
                                    f"{record.attempt} replays already; max_attempts="
                                    f"{self.max_attempts}")  # fmt: skip
            elif verdict.passes:
                decision = Decision(source, str(record.original), attempt, REPUBLISH,
                                    batch_of(record))  # fmt: skip
            else:
                decision = Decision(source, str(record.original), attempt, PARK,
                                    batch_of(record), verdict.exception,
                                    verdict.message)  # fmt: skip
            decisions.append(decision)
        targets = {_partition_name(d) for d in decisions if d.action == REPUBLISH}
        return Plan(batch, position, tuple(decisions), self._high_watermarks(targets))

    def _finish(
        self, plan: Plan, *, recovering: bool, records: dict[str, DlqRecord] | None = None
    ) -> int:
        """Publish what is not published yet, record the outcomes, log done. Returns how many of
        the plan's records an interrupted attempt had already published."""
        if records is None:
            records = self._records_of(plan)
        republish = [d for d in plan.decisions if d.action == REPUBLISH]
        already = self._published(plan) if recovering and republish else set()
        missing = [(d, records[d.source]) for d in republish if d.source not in already]
        if missing:
            self._claim.check()
            self._publish(plan, missing)
        self._claim.check()
        self.ledger.record(plan, records)
        self.ledger.log_done(plan)
        if recovering:
            log.warning(
                "%s: finished DLQ replay batch %d left unfinished by an earlier run "
                "(%d of its %d records were already published)",
                self.app, plan.replay_batch, len(already), len(republish),
            )  # fmt: skip
        return len(already)

    def _records_of(self, plan: Plan) -> dict[str, DlqRecord]:
        """The plan's DLQ records, read again from the mirror (or, for parked retries, from
        the parked table)."""
        wanted = {d.source for d in plan.decisions}
        mirror = read_mirror(self.spark, self.mirror)
        found: dict[str, DlqRecord] = {}
        if mirror is not None:
            batches = sorted({d.dlq_batch_id for d in plan.decisions})
            for row in mirror.where(mirror["batch_id"].isin(batches)).collect():
                record = DlqRecord.from_mirror_row(row.asDict())
                if str(record.source) in wanted:
                    found[str(record.source)] = record
        missing = wanted - set(found)
        if missing:
            found |= {k: v for k, v in self._parked_records().items() if k in missing}
        missing = wanted - set(found)
        if missing:
            raise LookupError(
                f"{self.app}: DLQ replay batch {plan.replay_batch} names records no longer in "
                f"{self.mirror}: {sorted(missing)[:5]}. Was the mirror rewritten?"
            )
        return found

    # Kafka -----------------------------------------------------------------------------------

    def _high_watermarks(self, partitions: set[tuple[str, int]]) -> dict[str, int]:
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        from streamplatform.kafka.clients import consumer

        if not partitions:
            return {}
        probe = consumer(self.kafka, group_id=f"{self.app}-dlq-replay-watermarks")
        try:
            return {
                f"{topic}/{partition}": int(
                    probe.get_watermark_offsets(KafkaTopicPartition(topic, partition), 10)[1]
                )
                for topic, partition in sorted(partitions)
            }
        finally:
            probe.close()

    def _publish(self, plan: Plan, items: list[tuple[Decision, DlqRecord]]) -> None:
        """Each record to its source partition, stamped; raises unless every one is acked."""
        from streamplatform.kafka.clients import producer

        out = producer(self.kafka, **{"enable.idempotence": True, "acks": "all"})
        stamp = f"{self.app}/{plan.replay_batch}".encode()
        failures: list[str] = []

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                failures.append(f"{message.topic()}/{message.partition()}: {error}")

        for decision, record in items:
            headers: list[tuple[str, str | bytes | None]] = [
                *record.original_headers,
                (REPLAY_OF_HEADER, decision.original.encode()),
                (REPLAY_SOURCE_HEADER, decision.source.encode()),
                (REPLAY_ATTEMPT_HEADER, str(decision.attempt).encode()),
                (REPLAY_BATCH_HEADER, stamp),
            ]
            topic, partition, _ = decision.coordinates
            out.produce(
                topic,
                key=record.key,
                value=record.value,
                partition=partition,
                timestamp=record.timestamp,
                headers=headers,
                on_delivery=delivered,
            )
            out.poll(0)
        unsent = out.flush(60)
        if unsent or failures:
            raise RuntimeError(
                f"{self.app}: publishing DLQ replay batch {plan.replay_batch} to Kafka at "
                f"{self.kafka.get('bootstrap.servers')} failed ({unsent} unsent, "
                f"{failures[:3]}); the next replay publishes what did not arrive."
            )

    def _published(self, plan: Plan, timeout_s: float = 10.0) -> set[str]:
        """The plan's records (by DLQ coordinates) already in their target partitions: read
        from the watermarks logged before publishing to the end, stamped with this batch."""
        from confluent_kafka import KafkaError
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        from streamplatform.kafka.clients import consumer

        stamp = f"{self.app}/{plan.replay_batch}".encode()
        reader = consumer(self.kafka, group_id=f"{self.app}-dlq-replay-check",
                          **{"enable.partition.eof": True})  # fmt: skip
        found: set[str] = set()
        try:
            start = []
            for name, offset in plan.start_offsets.items():
                topic, partition = name.rsplit("/", 1)
                start.append(KafkaTopicPartition(topic, int(partition), offset))
            reader.assign(start)
            remaining = {(tp.topic, tp.partition) for tp in start}
            while remaining:
                message = reader.poll(timeout_s)
                if message is None:
                    raise TimeoutError(
                        f"{self.app}: no answer from Kafka within {timeout_s} s while checking "
                        f"what DLQ replay batch {plan.replay_batch} published; retry."
                    )
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    remaining.discard((message.topic(), message.partition()))
                elif error is not None:
                    raise RuntimeError(f"{self.app}: checking replay batch: {error}")
                else:
                    headers = dict(message.headers() or [])
                    source = headers.get(REPLAY_SOURCE_HEADER)
                    if headers.get(REPLAY_BATCH_HEADER) == stamp and isinstance(source, bytes):
                        found.add(source.decode())
            return found
        finally:
            reader.close()


def batch_of(record: DlqRecord) -> int:
    """The mirror batch a DLQ record came from (-1 when read from the topic)."""
    return -1 if record.dlq_batch_id is None else record.dlq_batch_id


def _partition_name(decision: Decision) -> tuple[str, int]:
    coordinates = decision.coordinates
    return coordinates.topic, coordinates.partition


def _with_attempts(record: DlqRecord, attempts: int) -> DlqRecord:
    return replace(record, attempt=attempts)
