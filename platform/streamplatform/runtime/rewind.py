"""``streamplatform rewind``: put a stopped job back to just after a committed batch.

The way to undo a bad deploy: rewind to the last good batch, fix the code, run again — the
batches after it are then computed anew by the fixed job, exactly once. Everything the job
keeps goes back together:

- every Delta table a batch appends to — the Delta sinks, the DLQ mirror, the changelog, the
  versions, the offset log — loses the rows of the batches after N, and its transaction id
  goes back to N in the same commit, so the re-run's appends are written again
  (``delta_direct.rewind``);
- the commit log likewise, as the claim holder's own commit;
- the consumer group's offsets go back to where batch N stopped;
- the stores: the job's *incarnation* changes (incarnation.py), so every task directory and
  standby copy of before — on this machine or an executor — is removed before use, and the
  tasks restore from the changelog, which now ends at batch N.

A marker (``UNFINISHED``) is written first and removed last: a job refuses to start while a
rewind is unfinished, and running the rewind again (every step can be repeated) finishes it.
What cannot be taken back is refused, said plainly: records already in Kafka sink topics (the
re-run writes them again: ``accept_kafka_repeats``), a changelog snapshot after batch N
(maintenance replaced the rows before it), and Delta state tables (merged in place).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from streamplatform import storage
from streamplatform.config import ConfigError
from streamplatform.exceptions import StreamPlatformError
from streamplatform.runtime import delta_direct, markers
from streamplatform.runtime.faults import crash_point

log = logging.getLogger(__name__)

UNFINISHED = markers.REWIND_UNFINISHED
INCARNATION = "_incarnation.json"  # how many rewinds the job has had (incarnation.py)


class RewindUnfinishedError(StreamPlatformError, RuntimeError):
    """A job was started while a rewind of it is unfinished."""


@dataclass
class RewindReport:
    """What a rewind did."""

    application_id: str
    from_batch: int | None  # the last committed batch before it (None: a finished re-run)
    to_batch: int
    rows_deleted: dict[str, int] = field(default_factory=dict)  # per table
    kafka_topics_repeating: list[str] = field(default_factory=list)
    group_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [
            f"{self.application_id} rewound to just after batch {self.to_batch}"
            + ("" if self.from_batch is None else f" (was at batch {self.from_batch})")
        ]
        for table, rows in sorted(self.rows_deleted.items()):
            out.append(f"  {table}: {rows} rows of later batches removed")
        for (topic, partition), offset in sorted(self.group_offsets.items()):
            out.append(f"  consumer group at {topic}-{partition}: {offset}")
        for topic in self.kafka_topics_repeating:
            out.append(f"  Kafka topic {topic}: what batches after {self.to_batch} wrote stays; "
                       "the next run writes it again (repeats downstream)")  # fmt: skip
        out.append("  the stores restore from the changelog at their next open")
        return out


def check_finished(root: str) -> None:
    """Raise RewindUnfinishedError while a rewind of the job at ``root`` is unfinished."""
    if storage.exists(storage.join(root, UNFINISHED)):
        raise RewindUnfinishedError(
            f"{root}: a rewind of this job is unfinished (it was interrupted): run "
            "`streamplatform rewind` again with the same --to-batch before starting the job"
        )


def rewinds_of(root: str) -> int:
    """How many rewinds the job at ``root`` has had: part of its incarnation."""
    recorded = storage.read_json(storage.join(root, INCARNATION))
    return 0 if recorded is None else int(recorded["rewinds"])


def rewind(job: Any, to_batch: int, accept_kafka_repeats: bool = False) -> RewindReport:
    """Put ``job`` (a stopped StreamingJob) back to just after committed batch ``to_batch``;
    see the module docstring. Holds the job's claim throughout (JobClaimedError while the job
    runs)."""
    root, app = job.root, job.app
    marker = storage.join(root, UNFINISHED)
    job.claim.acquire()
    try:
        unfinished = storage.read_json(marker)
        if unfinished is not None and int(unfinished["to_batch"]) != to_batch:
            raise ConfigError(
                f"{app}: an unfinished rewind to batch {unfinished['to_batch']} must be "
                "finished first (run it again with that --to-batch)"
            )
        last = job.commit_log.last()
        if unfinished is None:
            _refuse_what_cannot_be_taken_back(job, to_batch, last, accept_kafka_repeats)
            unfinished = {"to_batch": to_batch, "rewinds": rewinds_of(root) + 1}
            storage.write_json(marker, unfinished)
        report = RewindReport(app, None if last is None else last.batch_id, to_batch)
        report.kafka_topics_repeating = _kafka_outputs(job)
        crash_point("rewind_marked", to_batch)
        for path, txn_name in [*job.replay.batch_tables(),
                               (job.offset_log.path, "offsets")]:  # fmt: skip
            report.rows_deleted[path.rsplit("/", 1)[1]] = delta_direct.rewind(
                path, f"{app}-{txn_name}", to_batch
            )
        crash_point("rewind_tables", to_batch)
        consumed = _consumed_at(job, to_batch)
        report.group_offsets = _set_group_offsets(job, consumed)
        _set_marker_groups(job, to_batch)
        job.claim.rewind_rows(job.commit_log.txn_app_id, to_batch)
        crash_point("rewind_commits", to_batch)
        storage.write_json(storage.join(root, INCARNATION), {"rewinds": int(unfinished["rewinds"])})
        storage.remove_file(marker)
    finally:
        job.claim.release()
    job.forget_committed_state()
    log.warning("%s", "; ".join(report.lines()))
    return report


def _refuse_what_cannot_be_taken_back(
    job: Any, to_batch: int, last: Any, accept_kafka_repeats: bool
) -> None:
    app = job.app
    if storage.exists(storage.join(job.root, markers.RESET_UNFINISHED)):
        raise ConfigError(f"{app}: a reset of the job is unfinished: finish it first "
                          "(streamplatform reset again)")  # fmt: skip
    if last is None or to_batch > last.batch_id or to_batch < 0:
        now = "no batch is committed" if last is None else f"batch {last.batch_id} is the last"
        raise ConfigError(f"{app}: cannot rewind to batch {to_batch}: {now}")
    if to_batch == last.batch_id:
        raise ConfigError(f"{app}: batch {to_batch} is the last committed: nothing to rewind")
    if job.context.feedback_topics:
        raise ConfigError(
            f"{app}: a foreign-key join's answers ({sorted(job.context.feedback_topics)}) "
            "are in Kafka and cannot be taken back: a rewound job would join them twice. "
            "Reset the job instead (streamplatform reset)"
        )
    kafka = job.context.kafka_sink_topics()
    if job.context.topology.has_dynamic_sinks():
        kafka = [*kafka, "the topics its topic name extractors chose"]
    if kafka and not accept_kafka_repeats:
        raise ConfigError(
            f"{app}: the batches after {to_batch} wrote to the Kafka topics {kafka}, which "
            "cannot be taken back: the re-run writes those records again, and readers see them "
            "twice. Accept that with --accept-kafka-repeats (accept_kafka_repeats=True)."
        )
    if job.state_tables:
        raise ConfigError(f"{app}: Delta state tables ({[t.topic for t in job.state_tables]}) "
                          "are merged in place and cannot be rewound yet")  # fmt: skip
    named = {path for path, _ in job.replay.batch_tables()}
    for table in storage.list_directories(job.root) if storage.exists(job.root) else []:
        path = storage.join(job.root, table)
        if table.startswith("_") or path in named:
            continue
        written = delta_direct.transaction_version(path, f"{app}-sink-{table}")
        if written is not None and written > to_batch:
            raise ConfigError(
                f"{app}: the Delta sink {path} holds batches after {to_batch}, and the job was "
                f"given without it: name it (--delta-sink {table}) so that it goes back too"
            )
    replay_log = delta_direct.read(storage.join(job.root, "_dlq_replay_log"),
                                   columns=["position"])  # fmt: skip
    if replay_log.num_rows and max(replay_log.column("position").to_pylist()) > to_batch:
        raise ConfigError(
            f"{app}: the DLQ replay has looked at the dead letters of batches after {to_batch}; "
            "rewound, it would not see those the re-run writes again (not supported yet)"
        )
    snapshot = delta_direct.read(
        job.context.changelog_table(),
        [("batch_id", ">", to_batch), ("seq", "<", 0)], columns=["batch_id"],
    )  # fmt: skip
    if snapshot.num_rows:
        at = max(snapshot.column("batch_id").to_pylist())
        raise ConfigError(
            f"{app}: the changelog was snapshotted at batch {at} (streamplatform maintain), "
            f"which replaced its rows of the batches before: it cannot go back to {to_batch}"
        )


def _kafka_outputs(job: Any) -> list[str]:
    dlq = job.context.dlq_topic
    chosen = ["(the topics its topic name extractors chose)"]
    return sorted({*job.context.kafka_sink_topics(), *([dlq] if dlq else []),
                   *(chosen if job.context.topology.has_dynamic_sinks() else [])})  # fmt: skip


def _set_marker_groups(job: Any, to_batch: int) -> None:
    """Tasks that read no Kafka topic (after a repartition) mark their Kafka transaction of
    batch B by offset B + 1 in a group of their own, ``<app>-task-<task>`` (kafka_output.py):
    set back to ``to_batch + 1``, so the re-run's tasks produce their records again."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from streamplatform.kafka.clients import admin_client

    admin = admin_client(job.kafka)
    listed = admin.list_consumer_groups(request_timeout=30).result()
    prefix = f"{job.app}-task-"
    groups = [g.group_id for g in listed.valid if g.group_id.startswith(prefix)]
    for group in groups:
        asked = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
        offsets = asked[group].result(timeout=30).topic_partitions or []
        ahead = [KafkaTopicPartition(tp.topic, tp.partition, to_batch + 1)
                 for tp in offsets if tp.offset > to_batch + 1]  # fmt: skip
        if ahead:
            request = ConsumerGroupTopicPartitions(group, ahead)
            for future in admin.alter_consumer_group_offsets([request]).values():
                future.result(timeout=30)


def _consumed_at(job: Any, batch_id: int) -> dict[tuple[str, int], int]:
    rows = delta_direct.read(job.commit_log.path, [("batch_id", "=", batch_id)]).to_pylist()
    if not rows:
        raise RuntimeError(f"{job.app}: the commit log has no row of batch {batch_id}")
    return {(t, int(p)): int(o) for t, p, o in json.loads(rows[0]["consumed"])}


def _set_group_offsets(job: Any, consumed: dict[tuple[str, int], int]) -> dict:
    """The consumer group back at batch N's positions: the planner takes a group ahead of the
    commit log for Kafka outputs committed already (planning.py)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from streamplatform.kafka.clients import admin_client

    if not consumed:
        return {}
    admin = admin_client(job.kafka)
    request = ConsumerGroupTopicPartitions(
        job.app, [KafkaTopicPartition(t, p, o) for (t, p), o in sorted(consumed.items())]
    )
    for future in admin.alter_consumer_group_offsets([request]).values():
        future.result(timeout=30)
    return consumed
