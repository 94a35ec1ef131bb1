"""StreamingJob: a Topology run on Spark in micro-batches, exactly once into Delta.

A driver first claims its application (claim.py): one driver per application.id, and a driver
that lost its claim cannot commit. Then one micro-batch N (docs/guarantees.md):

1. plan: per source partition ``[consumed, min(end, consumed + platform.max.records.per.batch))``
   where ``end`` is the last stable offset; appended to the offset log, with the job's
   fingerprint (fingerprint.py), before anything runs. A batch planned but not committed (a
   crash, or a failure in this process) is re-run with exactly the same ranges, and only by
   a job with the same fingerprint (``ReplayRefused``, ``discard_uncommitted_batch``);
2. read exactly those ranges with Spark's Kafka batch source, committed records only,
   headers included;
3. run every task in an executor (``mapInArrow``, one Spark partition per Kafka partition, or
   ``applyInArrow`` grouped by task when a task reads several topics; executor.py); the
   output is cached so that every table below reads it without running the tasks again. A job
   with one Kafka source and one Delta sink (the dedup job) caches nothing: its tasks read
   their ranges themselves and the driver appends the sink with delta-rs, from the rows
   Spark brings back (a small batch) or from a file each task spilled (a big one); with
   ``platform.sink.driver.max.records = 0`` its tasks run inside Spark's Delta write of the
   sink and leave their other rows in side files (``_sink_streamed``, ``_execute``);
4. write the outputs: Delta sinks, the DLQ mirror, the state changelog and the versioned
   snapshots, all idempotent by ``txnAppId``/``txnVersion = N``; Kafka sinks and the DLQ topic
   (produced from the executors with each record's own timestamp; under exactly_once_v2 in one
   Kafka transaction per task that also commits its offsets to the consumer group, otherwise
   at least once: kafka_output.py). The Delta sinks and the changelog start while the tasks
   still run (see ``_write_outputs``);
5. append N to the commit log, as the claim holder's next commit: the commit point. The
   consumed offsets are the planned ends, except where a task stopped early: there, where it
   stopped on each partition it was given. Under either guarantee the stores applied nothing
   yet; the tasks settle their prepared writes against the commit log at batch N+1.

After a crash anywhere, re-running plans the same N and produces the same Delta output once.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.dsl.graph import SinkNode, topic_name
from streamplatform.dsl.topology import Topology
from streamplatform.home import data_dir, default_state_dir
from streamplatform.kafka.clients import describe_topics
from streamplatform.placement import Placement
from streamplatform.runtime import (
    changelog,
    delta_direct,
    kafka_input,
    kafka_output,
    task_cache,
)
from streamplatform.runtime.batch_outputs import (
    DELTA_OUTPUTS,
    Progress,
    append_outputs,
    progress_of,
    read_side_files,
    sink_rows,
    spilled_files,
    spilled_sink_rows,
)
from streamplatform.runtime.claim import JobClaim
from streamplatform.runtime.errors import JobFencedError, MissingTaskOutputs, ReplayRefused
from streamplatform.runtime.executor import (
    BATCH_MARKER,
    INPUT_COLUMNS,
    OUTPUT_ARROW,
    OUTPUT_SCHEMA,
    SINK_COLUMNS,
    SINK_SCHEMA,
    STREAM_COLUMNS,
    ChangelogWrites,
    TaskBatchRunner,
)
from streamplatform.runtime.faults import arm, crash_point
from streamplatform.runtime.fingerprint import job_fingerprint
from streamplatform.runtime.group_offsets import GroupOffsets
from streamplatform.runtime.logs import (
    COMMITS_SCHEMA,
    CommitLog,
    CommittedBatch,
    OffsetLog,
    PlannedBatch,
    Ranges,
)
from streamplatform.runtime.standby import InstanceLayout, StandbySync

log = logging.getLogger(__name__)
_UNREAD = object()


@dataclass(frozen=True)
class BatchResult:
    """What one micro-batch did; also logged as a progress line."""

    batch_id: int
    records_in: int
    records_out: int
    dlq_records: int
    duplicates_dropped: int
    restored_records: int
    lag: int
    duration_ms: int
    replayed: bool  # re-ran a batch that was planned but never committed
    guarantee: str  # processing.guarantee the batch ran under: exactly_once_v2 | at_least_once
    metrics: dict[str, int] = field(default_factory=dict)
    # (task, "<executor host>:<state dir>", changelog rows replayed) of each task that
    # restored its state in this batch, where Spark ran it.
    restores: tuple[tuple[str, str, int], ...] = ()


class StreamingJob:
    """Run ``topology`` with ``config`` on Spark.

    ``delta_sinks``: output topics written to Delta tables (``<root>/<application.id>/<topic>``)
    instead of Kafka. Everything else the topology writes, and the DLQ, goes to Kafka.
    """

    def __init__(
        self,
        topology: Topology,
        config: Mapping[str, Any] | StreamsConfig,
        *,
        spark: Any = None,
        delta_sinks: Iterable[str] = (),
        placement: Placement | None = None,
    ) -> None:
        self.topology = topology
        self.config = config if isinstance(config, StreamsConfig) else StreamsConfig(config)
        self.app: str = self.config["application.id"]
        self.kafka = self.config.kafka_settings()
        # The Kafka sinks' and DLQ's producers: the connection and the producer.* settings.
        self.producer_settings = self.config.kafka_settings("producer")
        kafka_output.check_producer_settings(self.producer_settings, self.config.exactly_once)
        self.group_offsets = GroupOffsets(
            self.producer_settings, self.app, self.config.exactly_once
        )
        root = self.config["platform.delta.root"] or str(data_dir() / "delta")
        self.root = f"{root.rstrip('/')}/{self.app}"
        # Unset, ``state.dir`` is resolved where each task runs (home.default_state_dir): a
        # cluster's executors keep their tasks' state on their own local disks.
        self.state_dir = self.config["state.dir"] or str(default_state_dir())
        # What the executors rebuild their StreamsConfig from.
        self.settings = self.config.to_dict()
        self.delta_sinks = set(delta_sinks)
        # Repartition topics are not Kafka topics here: a Spark shuffle inside the batch
        # carries their records from one sub-topology's tasks to the next (_execute_stages).
        self.internal_topics = set(topology.repartition_topics(self.app))
        self.sources = [
            t for t in topology.source_topics(self.app) if t not in self.internal_topics
        ]
        self.partitions = self._check_topics()
        self.partitions |= self._internal_partitions(self.partitions)
        self._stage_outputs: list[Any] = []  # cached per sub-topology, released after a batch
        self._streamed_ms = 0  # the last streamed batch's tasks and sink write
        self._local_slots: int | None = None  # known once a batch asked (_local_master_slots)
        self._tasks_in_this_process = 0  # of the last streamed batch (_tasks_in_driver)
        self._spark = spark
        self._last: Any = _UNREAD  # the newest committed batch, once read
        # One driver per application.id: claimed at the first batch, proven at each commit.
        self.claim = JobClaim(
            f"{self.root}/_commits", self.app, COMMITS_SCHEMA,
            lease_ms=self.config["platform.claim.lease.ms"],
            wait_ms=self.config["platform.claim.wait.ms"],
        )  # fmt: skip
        self.offset_log = OffsetLog(f"{self.root}/_offsets", self.app)
        self.commit_log = CommitLog(f"{self.root}/_commits", self.app, self.claim)
        self.fingerprint = job_fingerprint(topology, self.config.to_dict(), self.delta_sinks)
        self._watermarks: Any = None
        # With a placement, each task's state lives in its instance's root, and standbys
        # keep warm copies (standby.py); without one, every task uses state.dir.
        self.layout = (
            InstanceLayout.from_placement(Path(self.state_dir).parent / "instances", placement)
            if placement is not None
            else None
        )
        self.standby_sync = StandbySync(topology, self.app, BATCH_MARKER)
        self.keep_standbys_warm = True
        # The changelog's files (one per task and batch, read from the Delta log) would be
        # shipped to every task, and only a task whose local state is behind needs them: they
        # are resolved for the first batch of this job and after a failover, when restores
        # happen; a task that finds itself behind in another batch fails it, and the batch runs
        # again with them.
        self._resolve_changelog = True
        # Which batches wrote changelog rows, per task, since the files were last resolved: a
        # task behind only because it had no records since (an idle partition) moves on
        # without them.
        self._changelog_writes: ChangelogWrites | None = None
        self._committed_here: int | None = None  # the last batch this driver committed

    # Set-up --------------------------------------------------------------------------------

    def _check_topics(self) -> dict[str, int]:
        """Every source, Kafka sink and the DLQ topic must exist: an error at start names it."""
        wanted = list(self.sources)
        wanted += [
            t
            for t in self.topology.sink_topics(self.app)
            if t not in self.delta_sinks and t not in self.internal_topics
        ]
        dlq = self.config["errors.dead.letter.queue.topic.name"]
        if dlq:
            wanted.append(dlq)
        try:
            return describe_topics(self.kafka, dict.fromkeys(wanted))
        except LookupError as error:
            raise ConfigError(f"{self.app}: {error} Create them first (the DLQ too).") from error
        except Exception as error:
            servers = self.kafka["bootstrap.servers"]
            raise ConnectionError(
                f"{self.app}: cannot reach Kafka at bootstrap.servers={servers}: {error}"
            ) from error

    @property
    def spark(self) -> Any:
        if self._spark is None:
            arm()
            from streamplatform.spark import spark_session

            self._spark = spark_session(self.config["platform.spark.master"], app_name=self.app)
        return self._spark

    # Running -------------------------------------------------------------------------------

    def run(self, max_batches: int | None = None) -> list[BatchResult]:
        """Run batches until caught up (or ``max_batches``); returns what each did. A run
        that claimed the job releases it at the end."""
        claimed_here = self.claim.epoch is None
        results: list[BatchResult] = []
        try:
            while max_batches is None or len(results) < max_batches:
                result = self.run_batch()
                if result is None:
                    break
                results.append(result)
        finally:
            if claimed_here:
                self.claim.release()
        return results

    def run_until_caught_up(self) -> list[BatchResult]:
        return self.run()

    def run_forever(
        self,
        trigger_interval_ms: int = 0,
        idle_interval_ms: int = 1_000,
        on_batch: Callable[[BatchResult], None] | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Continuous mode: batch after batch until stopped; returns how many batches ran.

        A batch starts at most every ``trigger_interval_ms`` (0: as soon as the previous one
        has committed); with nothing to read, the job looks again after ``idle_interval_ms``.
        ``on_batch`` is called with each batch's result (a progress line, metrics).

        SIGTERM or SIGINT (handled when called from the main thread), or ``stop.set()``, ends
        it cleanly: the batch in flight finishes and commits, no new one starts, the claim is
        released, and the method returns. A second signal interrupts the batch in flight
        (``KeyboardInterrupt``); its plan is logged, so the next run replays it exactly. A
        batch that fails raises, with nothing of it committed (the claim released): run
        again, and it is replayed.
        """
        stop = stop or threading.Event()
        signals = _StopOnSignals(stop, self.app)
        if self.claim.epoch is None:
            self._claim()  # a second driver is refused before it starts Spark
        batches = 0
        try:
            _ = self.spark  # started first: PySpark's own SIGINT handler would replace ours
            with signals:
                while not stop.is_set():
                    started = time.monotonic()
                    result = self.run_batch()
                    if result is not None:
                        batches += 1
                        if on_batch is not None:
                            on_batch(result)
                    wait_ms = trigger_interval_ms if result is not None else max(
                        trigger_interval_ms, idle_interval_ms)  # fmt: skip
                    remaining = wait_ms / 1000 - (time.monotonic() - started)
                    if remaining > 0:
                        stop.wait(remaining)
        finally:
            self.claim.release()
        log.info("%s: stopped after %d batches%s", self.app, batches,
                 f" ({signals.received})" if signals.received else "")  # fmt: skip
        return batches

    def run_batch(self) -> BatchResult | None:
        """Plan, run and commit one micro-batch; None when there is nothing to read.

        The first call claims the job (claim.py): a second driver of the same application.id
        is refused. After a failure of any kind the next call reads the logs again and so
        replays the logged plan of the batch that failed, exactly.
        """
        if self.claim.epoch is None:
            self._claim()
        try:
            return self._run_batch()
        except JobFencedError:
            self._last = _UNREAD
            self.claim.release()  # the next call claims anew, or is refused while the other runs
            raise
        except BaseException:
            self._last = _UNREAD
            raise

    def _claim(self) -> None:
        """Claim the job; the staging files of earlier runs, now surely dead, go."""
        self.claim.acquire()
        self._last = _UNREAD
        # Under exactly_once_v2: fences the offset commits of the driver that lost the claim,
        # and checks that the broker allows transactions, before any batch runs.
        try:
            self.group_offsets.start()
        except BaseException:
            self.claim.release()
            raise
        staging = self._staging_root()
        if staging is not None and staging.exists():
            for run in staging.iterdir():
                if run.name != self.claim.run:
                    shutil.rmtree(run, ignore_errors=True)

    def _run_batch(self) -> BatchResult | None:
        started = time.monotonic()
        offset_log, commit_log = self.offset_log, self.commit_log
        # A plan of the next batch is only met after (re)reading the logs: at the start and
        # after a failure. Any other plan logged meanwhile makes the append below say so.
        fresh = self._last is _UNREAD
        if fresh:
            self._last = commit_log.last()
            if (None if self._last is None else self._last.batch_id) != self._committed_here:
                # Another driver committed batches since this one's last: what this one knows
                # of the tasks' runs and changelog writes is stale. Restores read the
                # changelog, and no task kept open in a worker is taken as current.
                self._resolve_changelog = True
                self._changelog_writes = None
        last = self._last
        batch_id = 0 if last is None else last.batch_id + 1
        logged = offset_log.planned(batch_id) if fresh else None
        if logged is None:
            ranges = self._plan({} if last is None else last.consumed)
            if not any(end > start for start, end in ranges.values()):
                return None
            if not offset_log.append(batch_id, ranges, self.fingerprint):
                logged = offset_log.planned(batch_id)  # planned meanwhile: that plan holds
                log.warning("%s batch %d was planned by another driver meanwhile; running "
                            "its plan", self.app, batch_id)  # fmt: skip
        if logged is not None and not self._check_replayable(batch_id, logged):
            return self._run_batch()  # its plan is gone: planned anew under this job
        replayed = logged is not None
        if logged is not None:
            ranges = logged.ranges
        crash_point("after_plan", batch_id)
        planned = time.monotonic()
        last_committed = None if last is None else last.batch_id
        resolved = self._resolve_changelog
        # A replayed batch may have written its sink already: Delta would then skip that
        # write, and with it the tasks, if they ran inside it (see _sink_streamed).
        streamed = self._sink_streamed() if not replayed else None
        try:
            try:
                progress = self._run_and_write(batch_id, ranges, last_committed, resolved, streamed)
            finally:
                self._resolve_changelog = False
            for task, where, rows in sorted(progress.restores):
                log.info("%s batch %d: task %s restored its state on %s (%d changelog rows)",
                         self.app, batch_id, task, where, rows)  # fmt: skip
            crash_point("after_outputs", batch_id)
            consumed = _consumed(ranges, progress)
            metrics = progress.metrics
            metrics |= _offset_gaps(self.app, batch_id, ranges, consumed, last, metrics)
            written = time.monotonic()
            metrics["plan_ms"] = int((planned - started) * 1000)
            metrics["run_and_write_ms"] = int((written - planned) * 1000)
            metrics["duration_ms"] = int((written - started) * 1000)
            commit_log.append(batch_id, consumed, metrics, self.config["processing.guarantee"])
            if resolved or self._changelog_writes is None:
                self._changelog_writes = ChangelogWrites(batch_id, {})
            for task in progress.changelog_writers:
                self._changelog_writes.last_write[task] = batch_id
            for task in progress.tasks_run:
                self._changelog_writes.last_run[task] = batch_id
            self._last = CommittedBatch(
                batch_id, consumed, metrics, self.config["processing.guarantee"]
            )
            self._committed_here = batch_id
            crash_point("after_commit", batch_id)
            self.group_offsets.commit(consumed)
            if streamed is not None:
                shutil.rmtree(Path(streamed).parent, ignore_errors=True)
            metrics["commit_ms"] = int((time.monotonic() - written) * 1000)
            if self.layout is not None and self.keep_standbys_warm:
                metrics["standby_replayed"] = self.standby_sync.run(
                    self.spark,
                    self.layout.standby_copies(),
                    changelog.files_by_task(f"{self.root}/_changelog"),
                    batch_id,
                )
        finally:
            self._release()
        lag = self._lag(consumed)
        result = BatchResult(
            batch_id=batch_id,
            records_in=metrics.get("records_in", 0),
            records_out=metrics.get("records_out", 0),
            dlq_records=metrics.get("dlq_records", 0),
            duplicates_dropped=metrics.get("dedup_dropped", 0),
            restored_records=metrics.get("restored_records", 0),
            lag=lag,
            duration_ms=metrics["duration_ms"],
            replayed=replayed,
            guarantee=self.config["processing.guarantee"],
            metrics=metrics,
            restores=tuple(sorted(progress.restores)),
        )
        log.info(
            "%s batch %d%s: %d in, %d out, %d duplicates dropped, %d to DLQ, lag %d, %d ms, %s",
            self.app, batch_id, " (replayed)" if replayed else "", result.records_in,
            result.records_out, result.duplicates_dropped, result.dlq_records, lag,
            result.duration_ms, result.guarantee,
        )  # fmt: skip
        return result

    def _check_replayable(self, batch_id: int, logged: PlannedBatch) -> bool:
        """A batch planned but not committed is replayed only by the job that planned it:
        its first attempt may have written outputs that a changed job would not. True: replay
        it. False: it was planned under another job but provably wrote no output, so its plan
        is dropped and the batch is planned anew under this job. Raises ReplayRefused when its
        first attempt wrote, or may have written, outputs."""
        if logged.fingerprint in (None, self.fingerprint):
            return True
        written = self._outputs_of_uncommitted_batch(batch_id, logged)
        if not written:
            delta_direct.discard(self.offset_log.path, self.offset_log.txn_app_id, batch_id)
            self._last = _UNREAD
            log.warning("%s: batch %d was planned under another topology, code or settings "
                        "and wrote no output; it is planned anew under this job", self.app,
                        batch_id)  # fmt: skip
            return False
        raise ReplayRefused(
            f"{self.app}: batch {batch_id} was planned under another topology, code or settings "
            f"(fingerprint {logged.fingerprint[:12]}, now {self.fingerprint[:12]}), and its "
            f"first attempt {written}. Replaying it under this job would mix two versions of "
            "one batch. Run it with the code and settings it was planned with, or drop what "
            "its first attempt wrote and plan it anew under this job: "
            "StreamingJob.discard_uncommitted_batch() (CLI: streamplatform discard-batch). "
            "See docs/guarantees.md."
        )

    def _outputs_of_uncommitted_batch(self, batch_id: int, logged: PlannedBatch) -> str:
        """What the attempts of uncommitted ``batch_id`` wrote, in words; "" for nothing.

        Delta tables record each batch's append by its transaction id. Under exactly_once_v2 a
        task that committed its Kafka transaction moved the consumer group past the plan's
        start. Under at_least_once, Kafka sends leave no such trace: a job with Kafka outputs
        (sinks or a DLQ topic) may have written some."""
        for path, txn_name in self._batch_tables():
            recorded = delta_direct.transaction_version(path, f"{self.app}-{txn_name}")
            if recorded is not None and recorded >= batch_id:
                return f"wrote to the Delta table {path}"
        kafka_outputs = [
            t for t in self.topology.sink_topics(self.app)
            if t not in self.delta_sinks and t not in self.internal_topics
        ] + ([self.config["errors.dead.letter.queue.topic.name"]]
             if self.config["errors.dead.letter.queue.topic.name"] else [])  # fmt: skip
        if not kafka_outputs:
            return ""
        if not self.config.exactly_once:
            return (f"may have sent records to the Kafka topics {sorted(kafka_outputs)} "
                    "(at_least_once sends leave no trace to check)")  # fmt: skip
        group = self.group_offsets.committed(sorted(logged.ranges))
        moved = sorted(tp for tp, (start, _) in logged.ranges.items() if group.get(tp, -1) > start)
        if moved:
            return (f"committed Kafka outputs (the consumer group {self.app} is at "
                    f"{ {tp: group[tp] for tp in moved} }, past the plan's starts "
                    f"{ {tp: logged.ranges[tp][0] for tp in moved} })")  # fmt: skip
        return ""

    def discard_uncommitted_batch(self) -> int | None:
        """Forget the batch that was planned but never committed: delete what its attempts
        wrote to the Delta tables (sinks, DLQ mirror, changelog, versions) and its plan, so
        that the next batch plans it anew under this job's topology, code and settings.
        Returns its id; None when every planned batch is committed.

        The way on after a refused replay (``ReplayRefused``): a record that failed under the
        old code and is processed under the new one is then in the sink only, not also in the
        DLQ mirror. Its stores' prepared writes are discarded by the tasks, as after any crash.
        What its attempts committed to Kafka topics stays there, and the next plan does not
        produce it again (``_short_of_committed_outputs``). A claim it took for this is
        released again."""
        claimed_here = self.claim.epoch is None
        if claimed_here:
            self._claim()
        try:
            return self._discard_uncommitted_batch()
        finally:
            if claimed_here:
                self.claim.release()

    def _discard_uncommitted_batch(self) -> int | None:
        last = self.commit_log.last()
        batch_id = 0 if last is None else last.batch_id + 1
        if self.offset_log.planned(batch_id) is None:
            return None
        deleted = {}
        for path, txn_name in self._batch_tables():
            deleted[path] = delta_direct.discard(path, f"{self.app}-{txn_name}", batch_id)
        delta_direct.discard(self.offset_log.path, self.offset_log.txn_app_id, batch_id)
        self._last = _UNREAD
        log.warning("%s: batch %d discarded (rows deleted per table: %s); it is planned anew",
                    self.app, batch_id, deleted)  # fmt: skip
        return batch_id

    def _batch_tables(self) -> list[tuple[str, str]]:
        """``(path, transaction name)`` of every Delta table a batch appends to."""
        sinks = sorted(self.delta_sinks & set(self.topology.sink_topics(self.app)))
        tables = [(f"{self.root}/{topic}", f"sink-{topic}") for topic in sinks]
        return tables + [(f"{self.root}/{o.table}", o.txn_name) for o in DELTA_OUTPUTS.values()]

    def _end_offsets(self) -> dict[tuple[str, int], tuple[int, int]]:
        """``(low, high)`` watermarks of every source partition, from one reused client."""
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        from streamplatform.kafka.clients import consumer

        if self._watermarks is None:
            # read_committed: the high watermark is the last stable offset, so a plan never
            # reaches into a transaction that is still open.
            committed_only = {"isolation.level": "read_committed"}
            self._watermarks = consumer(
                self.kafka, group_id=f"{self.app}-watermarks", **committed_only
            )
        return {
            (topic, p): self._watermarks.get_watermark_offsets(KafkaTopicPartition(topic, p), 10)
            for topic in self.sources
            for p in range(self.partitions[topic])
        }

    def _plan(self, consumed: Mapping[tuple[str, int], int]) -> Ranges:
        cap = self.config["platform.max.records.per.batch"]
        ranges: Ranges = {}
        for (topic, partition), (low, high) in self._end_offsets().items():
            start = max(consumed.get((topic, partition), low), low)
            ranges[(topic, partition)] = (start, min(high, start + cap))
        if self.config.exactly_once:
            ranges = self._short_of_committed_outputs(ranges)
        return ranges

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
        for positions in self._task_partitions(ranges).values():
            if not any(group.get(tp, -1) > ranges[tp][0] for tp in positions):
                continue
            for tp in positions:
                start, end = ranges[tp]
                ranges[tp] = (start, min(end, max(start, group.get(tp, start))))
            log.warning("%s: the Kafka outputs of %s up to %s are committed already (a "
                        "discarded batch's task); planning up to there, producing nothing "
                        "twice", self.app, positions,
                        {tp: group.get(tp) for tp in positions})  # fmt: skip
        return ranges

    def _task_partitions(self, partitions: Iterable[tuple[str, int]]) -> dict[str, list[Any]]:
        """``{task: its source partitions}`` among ``partitions``: task
        ``<sub-topology>_<partition>`` reads that partition of each of its sub-topology's Kafka
        topics."""
        tasks: dict[str, list[Any]] = {}
        for subtopology in self.topology.subtopologies:
            for topic in subtopology.source_topics(self.topology, self.app):
                for read, partition in sorted(partitions):
                    if read == topic:
                        tasks.setdefault(f"{subtopology.id}_{partition}", []).append(
                            (read, partition)
                        )
        return tasks

    def _lag(self, consumed: Mapping[tuple[str, int], int]) -> int:
        return sum(
            max(0, high - consumed.get(tp, 0)) for tp, (_, high) in self._end_offsets().items()
        )

    def fail_instance(self, instance: str) -> dict[str, tuple[str, bool]]:
        """Declare ``instance`` lost: its tasks move to their standbys (warm) or, with none,
        to the least-loaded instance (cold). Returns ``{task: (instance, warm)}``."""
        if self.layout is None:
            raise ValueError(f"{self.app}: no placement given, so there are no instances")
        moved = self.layout.fail(instance)
        self._resolve_changelog = True  # the moved tasks restore (or replay a tail) next batch
        log.warning("%s: instance %s lost; tasks moved: %s", self.app, instance, moved)
        return moved

    def close(self) -> None:
        """Release the claim, the Kafka clients and the tasks kept open in this process (the
        SparkSession belongs to whoever made it)."""
        roots = {self.state_dir} | set(self.layout.active_dirs().values() if self.layout else ())
        for root in roots:
            task_cache.close_under(Path(root) / self.app)
        kafka_input.close_consumers(self.config.kafka_settings("consumer"))
        self.claim.release()
        self.group_offsets.close()
        if self._watermarks is not None:
            self._watermarks.close()
            self._watermarks = None

    def _sink_streamed(self) -> str | None:
        """The side-output directory when this job's tasks can stream their sink rows straight
        into the Delta write (see executor.SINK_COLUMNS); None when the output is cached.

        That takes one sub-topology reading one Kafka topic and writing one Delta sink, and a
        local Delta root (the tasks write their other rows there, and the driver reads them).
        It saves caching every sink row and reading it back. A replayed batch is not streamed
        (run_batch): Delta skips a write it already committed, and the tasks with it.
        """
        sinks = set(self.topology.sink_topics(self.app))
        if (
            len(self.topology.subtopologies) != 1
            or len(self.sources) != 1
            or len(sinks) != 1
            or not sinks <= self.delta_sinks
        ):
            return None
        staging = self._staging_root()
        return None if staging is None else str(staging / self.claim.run / "side")

    def _tasks_in_driver(self, records: int) -> bool:
        """True when a batch of ``records`` runs its tasks in this process: at most
        ``platform.driver.tasks.max.records``, on a local master (its executors are this
        host). Not on a cluster or through Spark Connect (no SparkContext here)."""
        if records > self.config["platform.driver.tasks.max.records"]:
            return False
        return self._local_master_slots() > 0

    def _tasks_beside_spark(self, tasks: int) -> int:
        """How many of a batch's ``tasks`` that Spark runs this process runs itself, at the
        same time: on a local master with fewer slots than tasks, the tasks of Spark's last,
        partial wave (tasks mod slots), which would run alone while a core idles; at most
        ``platform.driver.tasks.beside.spark``. Three tasks on local[2]: one here, two in
        Spark, the three at once instead of two waves (bench/RESULTS.md)."""
        slots = self._local_master_slots()
        if slots == 0 or tasks <= slots:
            return 0
        return min(tasks % slots, self.config["platform.driver.tasks.beside.spark"])

    def _local_master_slots(self) -> int:
        """The task slots of a local master (local: 1, local[N]: N, local[*]: the cores); 0 for
        any other master (a cluster, Spark Connect: no SparkContext here). ``local[N,F]``
        counts as other: its tasks are retried by Spark, which the driver's are not."""
        if self._local_slots is None:
            try:
                master = self.spark.sparkContext.master
            except Exception:  # Spark Connect: the executors are the server's
                master = ""
            local = re.fullmatch(r"local(\[(\d+|\*)\])?", master)
            if local is None:
                self._local_slots = 0
            elif local.group(2) in (None, "*"):
                self._local_slots = 1 if local.group(2) is None else os.cpu_count() or 1
            else:
                self._local_slots = int(local.group(2))
        return self._local_slots

    def _run_tasks(self, run: Callable[[Any], Any], tasks: int, here: int) -> pa.Table:
        """Run ``read_and_run``'s tasks 0 .. ``tasks`` - 1: the last ``here`` of them in this
        process, in a thread, while a Spark job runs the others (``_tasks_beside_spark``).
        Returns their rows. Waits for both sides whatever happens, so that no task of this
        attempt still writes its side file once the batch has failed; then raises the first
        failure (the batch is not committed, and its next run re-runs it whole)."""
        in_spark = tasks - here
        lane: list[pa.Table] = []
        failures: list[BaseException] = []

        def run_here() -> None:
            try:
                ids = pa.record_batch([pa.array(range(in_spark, tasks), pa.int64())], ["id"])
                lane.append(pa.Table.from_batches(list(run([ids])), OUTPUT_ARROW))
            except BaseException as failure:  # raised in the caller's thread below
                failures.append(failure)

        thread = threading.Thread(target=run_here, name=f"{self.app}-driver-tasks")
        if here:
            thread.start()
        try:
            rows = (
                self.spark.range(in_spark, numPartitions=in_spark)
                .mapInArrow(run, OUTPUT_SCHEMA)
                .toArrow()
            )
        finally:
            if here:
                thread.join()
        if failures:
            raise failures[0]
        return pa.concat_tables([rows.cast(OUTPUT_ARROW), *lane]) if lane else rows

    def _staging_root(self) -> Path | None:
        """Where runs keep their side files, one directory per run (claim.run); None when
        the Delta root is not a local path."""
        root = self.root.removeprefix("file://") if self.root.startswith("file:/") else self.root
        if "://" in root or ":" in root.split("/")[0]:
            return None
        return Path(root).absolute() / "_staging"

    def _run_and_write(
        self,
        batch_id: int,
        ranges: Ranges,
        last_committed: int | None,
        resolve_changelog: bool,
        streamed: str | None,
    ) -> Progress:
        """Run the tasks and write every output of the batch; returns the tasks' progress."""
        if streamed is not None:
            rows = self._execute(batch_id, ranges, last_committed, resolve_changelog, streamed)
            if rows is None:  # a big batch: the tasks' other rows are in their side files
                rows = read_side_files(streamed)
            return self._write_streamed_outputs(batch_id, ranges, rows, streamed)
        outputs = self._execute(batch_id, ranges, last_committed, resolve_changelog)
        try:
            return self._write_outputs(batch_id, ranges, outputs)
        finally:
            self._release(outputs)

    def _execute(
        self,
        batch_id: int,
        ranges: Ranges,
        last_committed: int | None,
        resolve_changelog: bool,
        streamed: str | None = None,
    ) -> Any:
        """Start the batch's tasks; returns their output (cached). With ``streamed`` (a
        directory) the sink rows are appended here: a small batch's come to the driver with
        every other row of the tasks, which are returned (an Arrow table); a big batch's tasks
        run inside the Delta sink's write, which leaves their other rows in side files in
        ``streamed``, and None is returned."""
        from pyspark.sql import functions as F

        from streamplatform.spark import read_kafka_ranges

        wanted: dict[str, dict[int, tuple[int, int]]] = {}
        for (topic, partition), (start, end) in ranges.items():
            if end > start:
                wanted.setdefault(topic, {})[partition] = (start, end)
        planned: dict[int, int] = {}
        for (_, partition), (start, end) in ranges.items():
            planned[partition] = planned.get(partition, 0) + max(0, end - start)
        files = changelog.files_by_task(f"{self.root}/_changelog") if resolve_changelog else None

        def runner(subtopology: int) -> TaskBatchRunner:
            return TaskBatchRunner(
                self.topology,
                self.settings,
                batch_id,
                last_committed,
                files,
                self.partitions,
                self.layout.active_dirs() if self.layout is not None else None,
                planned_records=planned,
                changelog_writes=None if resolve_changelog else self._changelog_writes,
                subtopology=subtopology,
                internal_topics=self.internal_topics,
                side_output_dir=streamed,
                stream_topic=self.sources[0] if len(self.sources) == 1 else None,
                fingerprint=self.fingerprint,
                task_runs=self._changelog_writes,
                changelog_table=f"{self.root}/_changelog",
            )

        def kafka_records() -> Any:  # Spark's Kafka source: jobs whose tasks do not read Kafka
            return (
                read_kafka_ranges(self.spark, self.kafka, wanted)
                .withColumn("task_partition", F.col("partition"))
                .withColumn("timestamp", F.unix_millis("timestamp"))
                .withColumn("headers", _headers_as_json("headers"))
                .select(*INPUT_COLUMNS)
            )

        if streamed is not None:
            shutil.rmtree(streamed, ignore_errors=True)  # a crashed attempt's files
            self._tasks_in_this_process = 0
            (sink,) = self.topology.sink_topics(self.app)
            started = time.monotonic()
            limit = self.config["platform.sink.driver.max.records"]
            if limit > 0:
                # The tasks read their ranges themselves (kafka_input.py: no Spark Kafka
                # source to set up, and a C consumer instead of the JVM's rows turned into
                # Arrow), and the driver appends the sink rows with delta-rs instead of
                # Spark's Delta writer (~1 s of job and commit). Same table, same transaction
                # id: a re-run through Spark skips it. A small batch's rows come back through
                # Spark; a bigger one's are spilled to a file per task, and its sink is
                # appended only once every task is known to have reported
                # (_write_streamed_outputs): a lost file must fail the batch, not shorten it.
                (topic,) = wanted
                tasks = [(p, start, end) for p, (start, end) in sorted(wanted[topic].items())]
                records = sum(planned.values())
                small = records <= limit
                reader = copy.copy(runner(0))
                reader.side_output_dir = None  # every row in OUTPUT_ARROW
                run = reader.read_and_run(tasks, self.config.kafka_settings("consumer"),
                                          spill_dir=None if small else streamed)  # fmt: skip
                if small and self._tasks_in_driver(records):
                    # Spark's local executors share this host, state dir and environment: the
                    # same task code runs here, and its tasks stay open in this process.
                    ids = pa.record_batch([pa.array(range(len(tasks)), pa.int64())], ["id"])
                    rows = pa.Table.from_batches(list(run([ids])), OUTPUT_ARROW)
                    self._tasks_in_this_process = len(tasks)
                else:
                    here = self._tasks_beside_spark(len(tasks))
                    rows = self._run_tasks(run, len(tasks), here)
                    self._tasks_in_this_process = here
                if small:
                    self._append_sink(sink_rows(rows, batch_id), batch_id)
                self._streamed_ms = int((time.monotonic() - started) * 1000)
                return rows if small else None
            else:
                streamed_rows = (
                    kafka_records()
                    .select(*STREAM_COLUMNS)
                    .mapInArrow(runner(0).run_partition, SINK_SCHEMA)
                )
                sink_frame = (
                    streamed_rows.withColumn("headers", _headers_from_json("headers"))
                    .withColumn("source_topic", F.lit(self.sources[0]))
                    .select(*SINK_COLUMNS)
                )
                self._append(batch_id, sink_frame, f"{self.root}/{sink}", f"sink-{sink}")
            self._streamed_ms = int((time.monotonic() - started) * 1000)
            return None
        if len(self.topology.subtopologies) > 1:
            return self._execute_stages(batch_id, kafka_records(), runner)
        if len(self.sources) == 1:
            # Spark's Kafka source makes one partition per Kafka partition: one task each.
            outputs = (
                kafka_records()
                .select(*STREAM_COLUMNS)
                .mapInArrow(runner(0).run_partition, OUTPUT_SCHEMA)
            )
        else:
            outputs = _run_grouped(kafka_records(), runner(0))
        return outputs.persist()

    def _execute_stages(
        self, batch_id: int, records: Any, runner: Callable[[int], TaskBatchRunner]
    ) -> Any:
        """A topology with repartitions: its sub-topologies run one after another in the
        batch, each reading its Kafka records and the records earlier ones wrote to its
        repartition topics. Those records never leave Spark: they are shuffled to the task of
        their partition (the one the writing task chose with murmur2, as Kafka Streams would)
        and get offsets ``batch_id * 2**40 + n``, numbered in the order of the records they
        came from (source partition, offset), so a re-run of the batch sees them in the same
        order at the same offsets. The batch stays one atomic unit: nothing of it is visible
        before its commit, and no repartition topic has to be created or kept."""
        from functools import reduce

        from pyspark.sql import Window
        from pyspark.sql import functions as F

        internal = sorted(self.internal_topics)
        outputs, repartitioned = [], None
        for subtopology in self.topology.subtopologies:
            topics = subtopology.source_topics(self.topology, self.app)
            external = [t for t in topics if t in self.sources]
            # Only a sub-topology with Kafka sources reads Kafka (the source pushes no filter
            # down: a stage reading none would fetch every range again for nothing).
            inputs = [records.where(F.col("topic").isin(external))] if external else []
            if len(external) < len(topics) and repartitioned is not None:
                inputs.append(repartitioned.where(F.col("topic").isin(topics)))
            stage = _run_grouped(reduce(_union, inputs), runner(subtopology.id)).persist()
            self._stage_outputs.append(stage)
            outputs.append(stage)
            order = Window.partitionBy("topic", "partition").orderBy(
                "source_topic", "source_partition", "source_offset", "row"
            )
            written = (
                stage.where((F.col("kind") == "sink") & F.col("topic").isin(internal))
                .withColumn("row", F.monotonically_increasing_id())  # order within a task
                .withColumn("offset", F.lit(batch_id << 40) + F.row_number().over(order) - 1)
                .withColumn("task_partition", F.col("partition"))
                .withColumn("headers", _headers_as_json("headers"))
                .select(*INPUT_COLUMNS)
            )
            repartitioned = written if repartitioned is None else _union(repartitioned, written)
        every = reduce(_union, outputs)
        return every.where(~((F.col("kind") == "sink") & F.col("topic").isin(internal)))

    def _release(self, outputs: Any = None) -> None:
        if outputs is not None:
            outputs.unpersist()
        for stage in self._stage_outputs:
            stage.unpersist()
        self._stage_outputs = []

    def _internal_partitions(self, partitions: Mapping[str, int]) -> dict[str, int]:
        """Partitions of each repartition topic: as many as the widest source topic of the
        sub-topology writing it, as in Kafka Streams. A sub-topology must come after the
        ones that write the repartition topics it reads."""
        known = dict(partitions)
        counts: dict[str, int] = {}
        for subtopology in self.topology.subtopologies:
            topics = subtopology.source_topics(self.topology, self.app)
            unknown = [t for t in topics if t not in known]
            if unknown:
                raise NotImplementedError(
                    f"{self.app}: sub-topology {subtopology.id} reads {unknown}, written by a "
                    "later sub-topology; the Spark runtime runs sub-topologies in order."
                )
            width = max(known[t] for t in topics)
            for name in subtopology.nodes:
                node = self.topology.nodes[name]
                if isinstance(node, SinkNode) and node.internal:
                    topic = topic_name(node.topic, True, self.app)
                    counts[topic] = known[topic] = width
        return counts

    def _append(
        self, batch_id: int, frame: Any, path: str, name: str, partition_by: str | None = None
    ) -> None:
        """Append ``frame`` with its ``batch_id`` column, once per batch (``txnVersion``)."""
        from pyspark.sql import functions as F

        writer = (
            frame.withColumn("batch_id", F.lit(batch_id).cast("long"))
            .write.format("delta")
            .mode("append")
            .option("txnAppId", f"{self.app}-{name}")
            .option("txnVersion", str(batch_id))
        )
        if partition_by:
            writer = writer.partitionBy(partition_by)
        writer.save(path)
        if name.startswith("sink-"):
            crash_point("during_outputs", batch_id)  # a Delta sink written, maybe not the rest

    def _write_outputs(self, batch_id: int, ranges: Ranges, outputs: Any) -> Progress:
        """Write the batch's outputs (all idempotent by ``txnVersion = batch_id``) and return
        the tasks' numbers and consumed offsets.

        The Delta sinks and the changelog, which nearly every batch writes, are appended while
        the tasks still run: Spark starts a write task as soon as a slot is free and reads the
        cached output of the tasks that are done (a partition still being computed is waited
        for, never computed twice), so the writes fill the core that the last task leaves idle.
        An empty append there only costs an empty commit. The DLQ, versions and Kafka outputs,
        rarer, are written once the progress rows say they exist.
        """
        from functools import partial

        from pyspark.sql import functions as F

        append = partial(self._append, batch_id)

        def append_kind(kind: str) -> None:
            output = DELTA_OUTPUTS[kind]
            rows = outputs.where(F.col("kind") == kind).select(
                *(F.col(source).alias(target) for source, target in output.sources())
            )
            append(rows, f"{self.root}/{output.table}", output.txn_name, output.partition_by)

        started = time.monotonic()
        # The Delta commits are mostly waiting: the tables' writes overlap.
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"{self.app}-write") as pool:
            futures = []
            for topic in sorted(self.delta_sinks & set(self.topology.sink_topics(self.app))):
                rows = outputs.where((F.col("kind") == "sink") & (F.col("topic") == topic))
                futures.append(pool.submit(append, rows.select(*SINK_COLUMNS),
                                           f"{self.root}/{topic}", f"sink-{topic}"))  # fmt: skip
            if any(subtopology.stores for subtopology in self.topology.subtopologies):
                futures.append(pool.submit(append_kind, "changelog"))
            try:
                # The progress rows: the tasks' numbers and how many rows of each kind they
                # sent. Asking for them computes and caches the whole output, in one pass.
                progress = Progress.of(
                    outputs.where(F.col("kind") == "progress").select("task", "value").collect()
                )
                summary_ms = int((time.monotonic() - started) * 1000)
                futures += [
                    pool.submit(append_kind, kind)
                    for kind in ("dlq", "version")
                    if kind in progress.kinds
                ]
                kafka_sinks = [
                    t
                    for kind, t in progress.present
                    if kind == "sink"
                    and t not in self.delta_sinks
                    and t not in self.internal_topics
                ]
                if "dlq" in progress.kinds or kafka_sinks:
                    transactions = self._transactions(batch_id, _consumed(ranges, progress))
                    futures.append(
                        pool.submit(self._produce_to_kafka, outputs, transactions, progress)
                    )
            except BaseException:
                wait(futures)  # the writes already started end (or fail) before this raises
                raise
            for future in futures:
                future.result()
        progress.metrics["summary_ms"] = summary_ms
        progress.metrics["writes_ms"] = int((time.monotonic() - started) * 1000) - summary_ms
        return progress

    def _write_streamed_outputs(
        self, batch_id: int, ranges: Ranges, rows: Any, directory: str
    ) -> Progress:
        """A streamed batch's other rows (changelog, DLQ, versions; batch_outputs.py): to
        their Delta tables, and its DLQ records to Kafka, from the driver (they are few).
        First, every task that had records must have reported: a side file that never
        reached the driver fails the batch, which is then not committed."""
        started = time.monotonic()
        progress = progress_of(rows)
        self._check_every_task_reported(batch_id, ranges, progress, directory)
        if spilled_files(directory):  # the sink rows of a big batch whose tasks read Kafka
            self._append_sink(spilled_sink_rows(directory, batch_id), batch_id)
        crash_point("during_outputs", batch_id)  # the sink written, the other tables not
        append_outputs(self.root, self.app, batch_id, rows, progress)
        if "dlq" in progress.kinds:
            transactions = self._transactions(batch_id, _consumed(ranges, progress))
            dlq = rows.filter(pc.equal(rows["kind"], "dlq")).select(list(kafka_output.COLUMNS))
            produced, already = kafka_output.send(
                self.producer_settings, dlq.to_batches(), transactions,
                "the batch's DLQ records",
            )  # fmt: skip
            progress.metrics["kafka_records_produced"] = produced
            progress.metrics["kafka_tasks_already_committed"] = already
        progress.metrics["tasks_and_sink_ms"] = self._streamed_ms
        progress.metrics["tasks_in_driver"] = self._tasks_in_this_process
        progress.metrics["writes_ms"] = int((time.monotonic() - started) * 1000)
        return progress

    def _append_sink(self, rows: Any, batch_id: int) -> None:
        """Append a streamed batch's sink rows (a table or a stream of them) with delta-rs,
        under the transaction id Spark's append of the same sink uses (``_append``): a
        re-run of the batch through Spark skips it."""
        (sink,) = self.topology.sink_topics(self.app)
        delta_direct.append(f"{self.root}/{sink}", rows, f"{self.app}-sink-{sink}", batch_id,
                            conform=True)  # fmt: skip

    def _check_every_task_reported(
        self, batch_id: int, ranges: Ranges, progress: Progress, directory: str
    ) -> None:
        """Raise MissingTaskOutputs when a task that had records in the batch sent no
        progress row (its side file is missing: not written, or written where the driver
        cannot read it). A task sends none only when its range held no committed record
        (markers or aborted records only), which the driver checks with a read of it."""
        consumer = self.config.kafka_settings("consumer")
        for (topic, partition), (start, end) in sorted(ranges.items()):
            task = f"0_{partition}"
            if end <= start or task in progress.tasks_run:
                continue
            if kafka_input.has_records(consumer, topic, partition, start, end):
                raise MissingTaskOutputs(
                    f"{self.app} batch {batch_id}: task {task} had records of {topic}-"
                    f"{partition} [{start}, {end}), and its outputs never reached the driver "
                    f"(no side file in {directory} that the driver can read; on a cluster "
                    "the Delta root must be storage that every executor and the driver reach "
                    "at the same URI). The batch is not committed; its next run re-runs it."
                )

    def _produce_to_kafka(
        self, outputs: Any, transactions: kafka_output.Transactions | None, progress: Progress
    ) -> None:
        """The DLQ records and the Kafka sinks' records of ``outputs``, produced from the
        executors, each with its own timestamp (Spark's Kafka writer would stamp them with the
        time of the write); under exactly_once_v2 one transaction per task (kafka_output.py).
        A Spark partition of ``outputs`` holds whole tasks (one, or several grouped)."""
        from pyspark.sql import functions as F

        to_kafka = outputs.where(
            (F.col("kind") == "dlq")
            | ((F.col("kind") == "sink") & ~F.col("topic").isin(list(self.delta_sinks)))
        )
        counts = (
            to_kafka.select(*kafka_output.COLUMNS)
            .mapInArrow(
                kafka_output.producing(self.producer_settings, transactions),
                kafka_output.PRODUCED_SCHEMA,
            )
            .collect()
        )
        progress.metrics["kafka_records_produced"] = sum(row.produced for row in counts)
        progress.metrics["kafka_tasks_already_committed"] = sum(
            row.already_committed for row in counts
        )

    def _transactions(
        self, batch_id: int, consumed: Mapping[tuple[str, int], int]
    ) -> kafka_output.Transactions | None:
        """Under exactly_once_v2, what each task commits with its Kafka outputs: its consumed
        offsets on the Kafka partitions it read (task ``<sub-topology>_<partition>`` reads that
        partition of each of its sub-topology's Kafka topics)."""
        if not self.config.exactly_once:
            return None
        offsets_by_task = {
            task: tuple((topic, partition, consumed[(topic, partition)])
                        for topic, partition in positions)
            for task, positions in self._task_partitions(consumed).items()
        }  # fmt: skip
        return kafka_output.Transactions(self.app, batch_id, offsets_by_task, (self.sources[0], 0))


class _StopOnSignals:
    """While active (and in the main thread), SIGTERM and SIGINT set ``stop``: the batch in
    flight finishes. A second one raises KeyboardInterrupt in it, and the batch ends with a
    KeyboardInterrupt whatever the interrupted call made of it (py4j turns an interrupt of a
    call into the JVM into its own network error). The previous handlers come back at the
    end."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop: threading.Event, app: str) -> None:
        self.stop, self.app = stop, app
        self.received = ""
        self.interrupted = ""  # set by the second signal: why the batch was interrupted
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self.interrupted and exc is not None and not isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt(self.interrupted) from exc

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.stop.is_set():
            self.interrupted = f"{name} again: the batch in flight is interrupted"
            raise KeyboardInterrupt(self.interrupted)
        self.received = name
        self.stop.set()
        log.warning("%s: %s received; finishing the batch in flight, then stopping (send it "
                    "again to interrupt the batch)", self.app, name)  # fmt: skip


def _consumed(ranges: Ranges, progress: Progress) -> dict[tuple[str, int], int]:
    """Where the batch stopped on each partition: a task that stopped early (its stores'
    uncommitted limits) reported where it stopped on each partition it was given; every other
    range was read to its end."""
    return {tp: end for tp, (_, end) in ranges.items()} | {
        tp: offset for tp, offset in progress.consumed.items() if tp in ranges
    }


def _offset_gaps(
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


def _headers_as_json(column: str) -> Any:
    """Headers cross to Python as JSON, values in base64, null when a record has none (see
    executor.INPUT_COLUMNS): far cheaper to convert than Arrow lists of structs."""
    from pyspark.sql import functions as F

    return F.when(
        F.size(column) > 0,
        F.to_json(
            F.transform(
                column, lambda h: F.struct(h["key"].alias("k"), F.base64(h["value"]).alias("v"))
            ),
            {"ignoreNullFields": "true"},
        ),
    )


def _headers_from_json(column: str) -> Any:
    """The inverse of _headers_as_json: the ARRAY<STRUCT<key, value>> of the output tables."""
    from pyspark.sql import functions as F

    return F.when(
        F.col(column).isNull(), F.array().cast("array<struct<key: string, value: binary>>")
    ).otherwise(
        F.transform(
            F.from_json(column, "array<struct<k: string, v: string>>"),
            lambda h: F.struct(h["k"].alias("key"), F.unbase64(h["v"]).alias("value")),
        )
    )


def _run_grouped(records: Any, runner: TaskBatchRunner) -> Any:
    """Each task's records grouped by task partition (a task reading several topics, or
    repartitioned records), one ``applyInArrow`` call per task."""

    def run_task(table: Any) -> Any:  # a plain function: what applyInArrow accepts
        return runner.run(table)

    return records.groupBy("task_partition").applyInArrow(run_task, OUTPUT_SCHEMA)


def _union(first: Any, second: Any) -> Any:
    return first.unionByName(second)
