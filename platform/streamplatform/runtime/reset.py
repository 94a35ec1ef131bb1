"""``streamplatform reset``: Kafka Streams' application reset tool for a streamplatform job.

Kafka Streams' ``kafka-streams-application-reset`` moves the input topics' committed offsets
(to the earliest, the latest, a date-time or a duration before now), deletes the internal
topics, and leaves the local state to ``KafkaStreams#cleanUp()``. A streamplatform job keeps
its positions and state in Delta under ``<platform.delta.root>/<application.id>/``, so a reset
here:

- removes the job's internal tables — the offset and commit logs, the changelog (with its
  snapshots), the versions and the staging area (``INTERNAL_TABLES``) — its local state under
  ``state.dir/<application.id>`` on this machine (task directories left on other machines
  belong to the old *incarnation* and are removed before use: incarnation.py), and the
  committed offsets of its consumer group ``<application.id>``;
- records where each input partition starts (``START_POSITIONS``), which the next run takes
  for every partition it has no committed position of (before ``auto.offset.reset``);
- leaves the sinks — Delta tables and Kafka topics — and the DLQ with its mirror as they are:
  a reset job writes its results again next to the old ones, as in Kafka Streams.

It holds the job's claim while it works, so a running job refuses it (and a job started
meanwhile waits or is refused). A marker (``UNFINISHED``) is written first and removed last:
a job refuses to start while a reset is unfinished, and running the reset again finishes it.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from streamplatform import storage
from streamplatform.config import ConfigError, StreamsConfig, iso_duration_ms
from streamplatform.exceptions import StreamPlatformError
from streamplatform.runtime import markers

log = logging.getLogger(__name__)

INTERNAL_TABLES = ("_offsets", "_changelog", "_versions", "_staging", "_commits")
START_POSITIONS = "_start_positions.json"
UNFINISHED = markers.RESET_UNFINISHED
TARGETS = ("earliest", "latest", "datetime", "duration")


class ResetUnfinishedError(StreamPlatformError, RuntimeError):
    """A job was started while a reset of it is unfinished."""


@dataclass
class ResetPlan:
    """What a reset changes, for ``--dry-run`` to list and ``apply_reset`` to do."""

    application_id: str
    app_root: str
    target: str  # how the positions were chosen, as the command said it
    positions: dict[tuple[str, int], int]
    # The reset job's first batch id: after the old job's, so that the tables kept (Delta
    # sinks, the DLQ mirror, state tables), which skip a batch id they hold already, take its
    # batches, and a DLQ replay's position stays behind them.
    first_batch: int = 0
    internal_tables: list[str] = field(default_factory=list)  # those that exist
    local_state: str | None = None  # state.dir/<application.id>, when it exists
    group_offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # committed now
    kept: list[str] = field(default_factory=list)  # sinks and DLQ tables, untouched

    def lines(self) -> list[str]:
        """The plan as the command prints it."""
        out = [f"Reset of {self.application_id} ({self.target}):"]
        for (topic, partition), offset in sorted(self.positions.items()):
            before = self.group_offsets.get((topic, partition))
            was = "" if before is None else f" (the consumer group is at {before})"
            out.append(f"  input {topic}-{partition}: starts at offset {offset}{was}")
        out.append(f"  its batches go on from batch {self.first_batch} (batch ids keep rising: "
                   "the kept tables tell the old job's rows from the new)")  # fmt: skip
        for table in self.internal_tables:
            out.append(f"  remove internal table {table}")
        if self.local_state:
            out.append(f"  remove local state {self.local_state}")
        if self.group_offsets:
            out.append(f"  delete the committed offsets of consumer group {self.application_id}")
        for table in self.kept:
            out.append(f"  keep {table} (sinks and the DLQ are not reset)")
        out.append("  Kafka sink topics are not touched: the reset job writes its results to "
                   "them again.")  # fmt: skip
        return out


def app_root(config: StreamsConfig) -> str:
    from streamplatform.home import data_dir

    root = config["platform.delta.root"] or str(data_dir() / "delta")
    return f"{root.rstrip('/')}/{config['application.id']}"


def plan_reset(
    config: StreamsConfig, input_topics: Iterable[str], target: str, value: str | None = None
) -> ResetPlan:
    """The reset of ``config``'s job: ``input_topics`` to ``target`` — "earliest", "latest",
    "datetime" (``value``: ISO-8601, e.g. 2026-11-28T12:00:00Z) or "duration" (``value``:
    ISO-8601 duration before now, e.g. PT1H)."""
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from streamplatform.kafka.clients import consumer, describe_topics

    if target not in TARGETS:
        raise ConfigError(f"reset: target {target!r}: one of {', '.join(TARGETS)}")
    topics = list(input_topics)
    if not topics:
        raise ConfigError("reset: name the job's input topics (--input-topics), as Kafka "
                          "Streams' reset tool asks")  # fmt: skip
    app = config["application.id"]
    storage.configure(config.to_dict())
    root = app_root(config)
    kafka = config.kafka_settings()
    partitions = describe_topics(kafka, dict.fromkeys(topics))
    probe = consumer(kafka, group_id=app, **{"isolation.level": "read_committed"})
    try:
        wanted = [KafkaTopicPartition(t, p) for t in topics for p in range(partitions[t])]
        at_ms = _target_ms(target, value)
        positions: dict[tuple[str, int], int] = {}
        for tp in wanted:
            low, high = probe.get_watermark_offsets(tp, timeout=10)
            if target == "earliest":
                positions[(tp.topic, tp.partition)] = low
            elif target == "latest":
                positions[(tp.topic, tp.partition)] = high
        if at_ms is not None:
            found = probe.offsets_for_times(
                [KafkaTopicPartition(tp.topic, tp.partition, at_ms) for tp in wanted], timeout=10
            )
            for tp in found:
                if tp.offset < 0:  # nothing at or after the time: the end
                    tp.offset = probe.get_watermark_offsets(tp, timeout=10)[1]
                positions[(tp.topic, tp.partition)] = int(tp.offset)
        committed = probe.committed(wanted, timeout=10)
        group = {(tp.topic, tp.partition): int(tp.offset) for tp in committed if tp.offset >= 0}
    finally:
        probe.close()
    from streamplatform.home import default_state_dir
    from streamplatform.runtime import delta_direct

    if storage.exists(storage.join(root, markers.REWIND_UNFINISHED)):
        raise ConfigError(f"reset: a rewind of {app} is unfinished: run it again to finish it "
                          "first (streamplatform rewind)")  # fmt: skip
    existing = set(storage.list_directories(root)) if storage.exists(root) else set()
    local = Path(config["state.dir"] or default_state_dir()) / app
    before = [
        delta_direct.transaction_version(storage.join(root, "_offsets"), f"{app}-offsets"),
        delta_direct.transaction_version(storage.join(root, "_commits"), f"{app}-commits"),
        first_batch(root) - 1,  # an earlier reset's, when no batch ran since
    ]
    said = target if value is None else f"{target} {value}"
    return ResetPlan(
        application_id=app, app_root=root, target=f"--to-{said}", positions=positions,
        first_batch=max(v for v in before if v is not None) + 1,
        internal_tables=[storage.join(root, t) for t in INTERNAL_TABLES if t in existing],
        local_state=str(local) if local.exists() else None,
        group_offsets=group,
        kept=[storage.join(root, t) for t in sorted(existing - set(INTERNAL_TABLES))],
    )  # fmt: skip


def _target_ms(target: str, value: str | None) -> int | None:
    if target == "datetime":
        if not value:
            raise ConfigError("reset --to-datetime: give a time, e.g. 2026-11-28T12:00:00Z")
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"reset --to-datetime {value!r}: not an ISO-8601 date-time "
                              "(2026-11-28T12:00:00Z, say)") from None  # fmt: skip
        if moment.tzinfo is None:
            raise ConfigError(f"reset --to-datetime {value!r}: give its time zone (Z or +01:00)")
        return int(moment.timestamp() * 1000)
    if target == "duration":
        try:
            return int(time.time() * 1000) - iso_duration_ms(value or "")
        except ValueError as error:
            raise ConfigError(f"reset --by-duration: {error}") from None
    return None


def apply_reset(plan: ResetPlan, config: StreamsConfig) -> None:
    """Carry ``plan`` out, holding the job's claim (JobClaimedError while a job runs)."""
    from streamplatform.runtime.claim import JobClaim
    from streamplatform.runtime.logs import COMMITS_SCHEMA

    claim = JobClaim(
        storage.join(plan.app_root, "_commits"), plan.application_id, COMMITS_SCHEMA,
        lease_ms=config["platform.claim.lease.ms"], wait_ms=config["platform.claim.wait.ms"],
        role="reset",
    )  # fmt: skip
    claim.acquire()
    positions = [[t, p, o] for (t, p), o in sorted(plan.positions.items())]
    recorded = {"positions": positions, "first_batch": plan.first_batch}
    try:
        storage.write_json(storage.join(plan.app_root, UNFINISHED), recorded)
        if plan.group_offsets:
            _delete_group_offsets(config, plan.application_id)
        if plan.local_state:
            shutil.rmtree(plan.local_state, ignore_errors=True)
        for table in plan.internal_tables:
            if not table.endswith("/_commits"):  # the claim's table: last, once released
                storage.remove_tree(table)
    finally:
        claim.release()
    storage.remove_tree(storage.join(plan.app_root, "_commits"))
    storage.write_json(storage.join(plan.app_root, START_POSITIONS), recorded)
    storage.remove_file(storage.join(plan.app_root, UNFINISHED))
    log.info("%s: reset (%s)", plan.application_id, plan.target)


def start_positions(root: str) -> dict[tuple[str, int], int]:
    """Where a reset said the inputs start; {} when no reset did. Raises ResetUnfinishedError
    while a reset is unfinished."""
    if storage.exists(storage.join(root, UNFINISHED)):
        raise ResetUnfinishedError(
            f"{root}: a reset of this job is unfinished (it was interrupted): run "
            "`streamplatform reset` again before starting the job"
        )
    recorded = storage.read_json(storage.join(root, START_POSITIONS))
    if recorded is None:
        return {}
    return {(str(t), int(p)): int(o) for t, p, o in recorded["positions"]}


def first_batch(root: str) -> int:
    """The first batch id of a job a reset started over (0 when none did)."""
    recorded = storage.read_json(storage.join(root, START_POSITIONS))
    return 0 if recorded is None else int(recorded.get("first_batch", 0))


def _delete_group_offsets(config: StreamsConfig, group: str) -> None:
    from streamplatform.kafka.clients import admin_client

    admin = admin_client(config.kafka_settings())
    for future in admin.delete_consumer_groups([group], request_timeout=30).values():
        try:
            future.result()
        except Exception as error:  # noqa: BLE001 - a group that has no offsets: nothing to do
            if "GROUP_ID_NOT_FOUND" not in str(error):
                raise
