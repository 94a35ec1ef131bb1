"""The replay policy: a batch planned but not committed is replayed exactly (same ranges, same
wall-clock time), and only by a job with the same fingerprint (fingerprint.py). A changed job
meets it with ``ReplayRefused`` unless its first attempt provably wrote nothing; then, or after
``discard``, it is planned anew."""

from __future__ import annotations

import logging

from streamplatform.runtime import delta_direct
from streamplatform.runtime.batch_outputs import DELTA_OUTPUTS
from streamplatform.runtime.errors import ReplayRefused
from streamplatform.runtime.group_offsets import GroupOffsets
from streamplatform.runtime.job_context import JobContext
from streamplatform.runtime.logs import CommitLog, OffsetLog, PlannedBatch

log = logging.getLogger(__name__)


class ReplayPolicy:
    def __init__(
        self,
        context: JobContext,
        offset_log: OffsetLog,
        commit_log: CommitLog,
        group_offsets: GroupOffsets,
    ) -> None:
        self.context = context
        self.offset_log, self.commit_log = offset_log, commit_log
        self.group_offsets = group_offsets
        self.first_batch = 0  # the job's first batch id (after a reset: reset.first_batch)

    def replayable(self, batch_id: int, logged: PlannedBatch) -> bool:
        """A batch planned but not committed is replayed only by the job that planned it:
        its first attempt may have written outputs that a changed job would not. True: replay
        it. False: it was planned under another job but provably wrote no output, so its plan
        is dropped and the batch is planned anew under this job. Raises ReplayRefused when its
        first attempt wrote, or may have written, outputs."""
        app, fingerprint = self.context.app, self.context.fingerprint
        if logged.fingerprint in (None, fingerprint):
            return True
        written = self.outputs_of_uncommitted_batch(batch_id, logged)
        if not written:
            delta_direct.discard(self.offset_log.path, self.offset_log.txn_app_id, batch_id)
            log.warning("%s: batch %d was planned under another topology, code or settings "
                        "and wrote no output; it is planned anew under this job", app,
                        batch_id)  # fmt: skip
            return False
        raise ReplayRefused(
            f"{app}: batch {batch_id} was planned under another topology, code or settings "
            f"(fingerprint {logged.fingerprint[:12]}, now {fingerprint[:12]}), and its "
            f"first attempt {written}. Replaying it under this job would mix two versions of "
            "one batch. Run it with the code and settings it was planned with, or drop what "
            "its first attempt wrote and plan it anew under this job: "
            "StreamingJob.discard_uncommitted_batch() (CLI: streamplatform discard-batch). "
            "See docs/guarantees.md."
        )

    def outputs_of_uncommitted_batch(self, batch_id: int, logged: PlannedBatch) -> str:
        """What the attempts of uncommitted ``batch_id`` wrote, in words; "" for nothing.

        Delta tables record each batch's append by its transaction id. Under exactly_once_v2 a
        task that committed its Kafka transaction moved the consumer group past the plan's
        start. Under at_least_once, Kafka sends leave no such trace: a job with Kafka outputs
        (sinks or a DLQ topic) may have written some."""
        context = self.context
        for path, txn_name in self.batch_tables():
            recorded = delta_direct.transaction_version(path, f"{context.app}-{txn_name}")
            if recorded is not None and recorded >= batch_id:
                return f"wrote to the Delta table {path}"
        kafka_outputs = context.kafka_sink_topics() + (
            [context.dlq_topic] if context.dlq_topic else []
        )
        if context.topology.has_dynamic_sinks():
            kafka_outputs.append("(the topics its topic name extractors chose)")
        if not kafka_outputs:
            return ""
        if not context.config.exactly_once:
            return (f"may have sent records to the Kafka topics {sorted(kafka_outputs)} "
                    "(at_least_once sends leave no trace to check)")  # fmt: skip
        group = self.group_offsets.committed(sorted(logged.ranges))
        moved = sorted(tp for tp, (start, _) in logged.ranges.items() if group.get(tp, -1) > start)
        if moved:
            return (f"committed Kafka outputs (the consumer group {context.app} is at "
                    f"{ {tp: group[tp] for tp in moved} }, past the plan's starts "
                    f"{ {tp: logged.ranges[tp][0] for tp in moved} })")  # fmt: skip
        return ""

    def discard(self) -> int | None:
        """Delete what the uncommitted batch's attempts wrote to the Delta tables and its plan;
        returns its id, None when every planned batch is committed."""
        last = self.commit_log.last()
        batch_id = self.first_batch if last is None else last.batch_id + 1
        if self.offset_log.planned(batch_id) is None:
            return None
        deleted = {}
        for path, txn_name in self.batch_tables():
            deleted[path] = delta_direct.discard(path, f"{self.context.app}-{txn_name}", batch_id)
        delta_direct.discard(self.offset_log.path, self.offset_log.txn_app_id, batch_id)
        log.warning("%s: batch %d discarded (rows deleted per table: %s); it is planned anew",
                    self.context.app, batch_id, deleted)  # fmt: skip
        return batch_id

    def batch_tables(self) -> list[tuple[str, str]]:
        """``(path, transaction name)`` of every Delta table a batch appends to."""
        root = self.context.root
        sinks = self.context.delta_sink_topics()
        tables = [(f"{root}/{topic}", f"sink-{topic}") for topic in sinks]
        return tables + [(f"{root}/{o.table}", o.txn_name) for o in DELTA_OUTPUTS.values()]
