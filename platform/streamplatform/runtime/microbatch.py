"""StreamingJob: a Topology run on Spark in micro-batches, exactly once into Delta.

This module is the batch spine; it reads as the protocol (docs/architecture.md,
docs/guarantees.md). A driver first claims its application (claim.py): one driver per
application.id, and a driver that lost its claim cannot commit. Then one micro-batch N:

1. **plan** (planning.py): per source partition ``[consumed, min(end, consumed +
   platform.max.records.per.batch))``, ``end`` the last stable offset, appended to the offset
   log with the job's fingerprint and the batch's wall-clock time before anything runs. A
   batch planned but not committed is re-run with exactly that plan (ranges and time), and
   only by a job with the same fingerprint (replay.py: ``ReplayRefused``,
   ``discard_uncommitted_batch``);
2. **run the chosen path** (paths/: ``paths.choose`` is the one place that decides): the
   tasks run and every output of the batch is written, each idempotent by the batch's
   transaction id (Delta ``txnAppId``/``txnVersion = N``; Kafka outputs in one transaction
   per task under exactly_once_v2, committing its offsets to the consumer group);
3. **commit**: append N to the commit log, as the claim holder's next commit: the commit
   point. The consumed offsets are the planned ends, except where a task stopped early;
4. **group offsets**: the consumer group ``application.id`` moves to the consumed offsets
   (monitoring; under exactly_once_v2 the tasks' transactions moved it already);
5. **standbys** (standby.py): with a placement, warm copies replay the batch's changelog.

The stores applied nothing yet at the commit: the tasks settle their prepared writes against
the commit log at batch N+1. After a crash anywhere, re-running plans the same N and produces
the same output once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamplatform import storage
from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.dsl.graph import SinkNode, topic_name
from streamplatform.dsl.naming import check_explicit_naming
from streamplatform.dsl.topology import Topology
from streamplatform.home import data_dir, default_state_dir
from streamplatform.kafka.clients import TopicNotAuthorizedError, describe_topics
from streamplatform.placement import Placement
from streamplatform.registry.serdes import configure_registry_serdes
from streamplatform.runtime import (
    changelog,
    feedback_topics,
    kafka_input,
    kafka_output,
    paths,
    reset,
    rewind,
    state_tables,
    task_cache,
    upgrade,
)
from streamplatform.runtime.claim import JobClaim
from streamplatform.runtime.errors import JobFencedError
from streamplatform.runtime.executor import ChangelogWrites
from streamplatform.runtime.faults import arm, crash_point
from streamplatform.runtime.fingerprint import job_fingerprint
from streamplatform.runtime.group_offsets import GroupOffsets
from streamplatform.runtime.job_context import BatchPlan, JobContext
from streamplatform.runtime.logs import COMMITS_SCHEMA, CommitLog, CommittedBatch, OffsetLog
from streamplatform.runtime.planning import Planner, consumed_offsets, offset_gaps
from streamplatform.runtime.replay import ReplayPolicy
from streamplatform.runtime.signals import StopOnSignals
from streamplatform.runtime.standby import InstanceLayout, StandbySync
from streamplatform.runtime.state_tables import STATE_SUFFIX, StateTable
from streamplatform.runtime.task_run import BATCH_MARKER
from streamplatform.runtime.value_fields import value_fields
from streamplatform.state.rocks import TaskStoreOptions

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
    path: str = ""  # the execution path the batch took (runtime/paths/)
    # Each task's own numbers (Progress.per_task), and each source partition's lag after the
    # batch: what the metrics' task level and records-lag show (streamplatform/metrics.py).
    task_metrics: dict[str, dict[str, int]] = field(default_factory=dict)
    partition_lag: dict[tuple[str, int], int] = field(default_factory=dict)
    store_metrics: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)


class StreamingJob:
    """Run ``topology`` with ``config`` on Spark.

    ``delta_sinks``: output topics written to Delta tables (``<root>/<application.id>/<topic>``)
    instead of Kafka. Everything else the topology writes, and the DLQ, goes to Kafka.
    ``delta_state_tables``: sink topics of a table's updates whose Delta table also keeps the
    table's current state, one row per key (``<topic>_state``, state_tables.py); they are
    Delta sinks too.
    """

    def __init__(
        self,
        topology: Topology,
        config: Mapping[str, Any] | StreamsConfig,
        *,
        spark: Any = None,
        delta_sinks: Iterable[str] = (),
        placement: Placement | None = None,
        delta_state_tables: Iterable[str] = (),
    ) -> None:
        self.topology = topology
        self.config = config if isinstance(config, StreamsConfig) else StreamsConfig(config)
        _check_store_options(topology, self.config)
        # Stores and internal topics with generated names: an error under
        # ensure.explicit.internal.resource.naming, else a warning (KIP-1111).
        check_explicit_naming(topology, self.config, warn=True)
        # A registry serde with no registry to go to stops the job here, naming the setting.
        configure_registry_serdes(topology.serdes(), self.config)
        self.app: str = self.config["application.id"]
        # Recorded with each commit; the first read of the commit log compares the last
        # commit's with it, so that an upgrade never starts a store empty silently.
        self.store_layout = upgrade.layout_json(topology, self.app)
        self._upgrade_checked = False
        self.kafka = self.config.kafka_settings()
        producer_settings = self.config.kafka_settings("producer")
        kafka_output.check_producer_settings(producer_settings, self.config.exactly_once)
        self.group_offsets = GroupOffsets(producer_settings, self.app, self.config.exactly_once)
        root = self.config["platform.delta.root"] or str(data_dir() / "delta")
        self.root = f"{root.rstrip('/')}/{self.app}"
        storage.configure(self.config)  # where the root's tables and files are, in this process
        # Unset, ``state.dir`` is resolved where each task runs (home.default_state_dir): a
        # cluster's executors keep their tasks' state on their own local disks.
        self.state_dir = self.config["state.dir"] or str(default_state_dir())
        self.state_tables = [StateTable.of(topology, topic) for topic in delta_state_tables]
        self.delta_sinks = set(delta_sinks) | {table.topic for table in self.state_tables}
        # Repartition topics are not Kafka topics here: a Spark shuffle inside the batch
        # carries their records from one sub-topology's tasks to the next (paths/stages.py).
        internal_topics = set(topology.repartition_topics(self.app))
        # Except those that close a cycle between sub-topologies (a foreign-key join's
        # answers): Kafka topics of the job's own, read the next batch (feedback_topics.py).
        feedback = feedback_topics.feedback_topics(topology, self.app)
        internal_topics -= set(feedback)
        sources = [t for t in topology.source_topics(self.app) if t not in internal_topics]
        if feedback:
            plain = [t for t in sources if t not in feedback]
            sizes = feedback_topics.partitions_of_feedback(
                topology, self.app, feedback,
                self._check_topics(plain, internal_topics | set(feedback)),
            )  # fmt: skip
            feedback_topics.create(self.kafka, sizes)
        partitions = self._check_topics(sources, internal_topics)
        partitions |= _internal_partitions(topology, self.app, partitions)
        self._spark = spark
        self._spark_configured = False
        self._last: Any = _UNREAD  # the newest committed batch, once read
        # One driver per application.id: claimed at the first batch, proven at each commit.
        self.claim = JobClaim(
            f"{self.root}/_commits", self.app, COMMITS_SCHEMA,
            lease_ms=self.config["platform.claim.lease.ms"],
            wait_ms=self.config["platform.claim.wait.ms"],
        )  # fmt: skip
        self.offset_log = OffsetLog(f"{self.root}/_offsets", self.app)
        self.commit_log = CommitLog(f"{self.root}/_commits", self.app, self.claim)
        self.fingerprint = job_fingerprint(
            topology, self.config.to_dict(),
            self.delta_sinks | {f"{t.topic}{STATE_SUFFIX}" for t in self.state_tables},
        )  # fmt: skip
        # With a placement, each task's state lives in its instance's root, and standbys
        # keep warm copies (standby.py); without one, every task uses state.dir.
        self.layout = (
            InstanceLayout.from_placement(Path(self.state_dir).parent / "instances", placement)
            if placement is not None
            else None
        )
        self.context = JobContext(
            topology=topology, config=self.config, root=self.root,
            delta_sinks=frozenset(self.delta_sinks), sources=sources,
            internal_topics=frozenset(internal_topics), partitions=partitions,
            fingerprint=self.fingerprint, claim=self.claim, spark=lambda: self.spark,
            layout=self.layout, feedback_topics=frozenset(feedback),
            value_fields=value_fields(topology, self.config, frozenset(self.delta_sinks)),
        )  # fmt: skip
        self.planner = Planner(self.context, self.group_offsets)
        self.replay = ReplayPolicy(self.context, self.offset_log, self.commit_log,
                                   self.group_offsets)  # fmt: skip
        self.standby_sync = StandbySync(topology, self.app, BATCH_MARKER, self.context.settings)
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
        self._first_batch = 0  # the first batch id: after a reset, the old job's last + 1
        self._fresh = True  # the logs were just read: a logged plan may be waiting

    # Set-up --------------------------------------------------------------------------------

    def _check_topics(self, sources: list[str], internal_topics: set[str]) -> dict[str, int]:
        """Every source, Kafka sink and the DLQ topic must exist: an error at start names it."""
        wanted = list(sources)
        wanted += [
            t
            for t in self.topology.sink_topics(self.app)
            if t not in self.delta_sinks and t not in internal_topics
        ]
        wanted += [table.topic for table in self.topology.global_tables()]
        dlq = self.config["errors.dead.letter.queue.topic.name"]
        if dlq:
            wanted.append(dlq)
        try:
            return describe_topics(self.kafka, dict.fromkeys(wanted))
        except TopicNotAuthorizedError as error:
            raise ConfigError(f"{self.app}: {error}") from error
        except LookupError as error:
            raise ConfigError(f"{self.app}: {error} Create them first (the DLQ too).") from error
        except Exception as error:
            from streamplatform.kafka.security import why_unreachable

            servers = self.kafka["bootstrap.servers"]
            raise ConnectionError(
                f"{self.app}: cannot reach Kafka at bootstrap.servers={servers}: {error}"
                f"{why_unreachable(self.kafka)}"
            ) from error

    @property
    def spark(self) -> Any:
        if self._spark is None:
            arm()
            from streamplatform.spark import spark_session

            self._spark = spark_session(self.config["platform.spark.master"], app_name=self.app,
                                        extra=storage.spark_settings(self.config))  # fmt: skip
        if not self._spark_configured:  # a session given to the job too: S3A for its root
            storage.configure_spark(self._spark, self.config)
            self._spark_configured = True
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
        until_caught_up: bool = False,
        on_idle: Callable[[], None] | None = None,
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
        again, and it is replayed. A caller that handles the signals from before the job
        starts (``streamplatform run``) passes its ``stop``: a first signal during the start
        (the claim, Spark's start) then means "start no batch". ``until_caught_up``: stop once
        a batch finds nothing to read. ``on_idle`` is called when a look found nothing to
        read (``self.planner.last_partition_lag`` is then the sources' lag).
        """
        stop = stop or threading.Event()
        signals = StopOnSignals(stop, self.app)
        if self.claim.epoch is None:
            self._claim()  # a second driver is refused before it starts Spark
        batches = 0
        try:
            crash_point("start_claimed", "start")
            _ = self.spark  # started first: PySpark's own SIGINT handler would replace ours
            crash_point("start_spark_ready", "start")
            with signals:
                while not stop.is_set():
                    started = time.monotonic()
                    result = self.run_batch()
                    if result is not None:
                        batches += 1
                        if on_batch is not None:
                            on_batch(result)
                    elif until_caught_up:
                        break
                    elif on_idle is not None:  # nothing to read: the metrics' lag, say
                        on_idle()
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
        try:  # an interrupted reset or rewind is finished before the job runs
            self.planner.reset_positions = reset.start_positions(self.root)
            self._first_batch = self.replay.first_batch = reset.first_batch(self.root)
            rewind.check_finished(self.root)
            incarnation = f"{self.claim.table_id()}.{rewind.rewinds_of(self.root)}"
            self.context.incarnation = self.standby_sync.incarnation = incarnation
        except BaseException:
            self.claim.release()
            raise
        self._last = _UNREAD
        # Under exactly_once_v2: fences the offset commits of the driver that lost the claim,
        # and checks that the broker allows transactions, before any batch runs.
        try:
            self.group_offsets.start()
        except BaseException:
            self.claim.release()
            raise
        for staging in self.context.staging_roots():
            for run in storage.list_directories(staging):
                if run != self.claim.run:
                    storage.remove_tree(storage.join(staging, run))

    # The spine -------------------------------------------------------------------------------

    def _run_batch(self) -> BatchResult | None:
        """plan (or the logged plan) -> fingerprint check -> run the chosen path -> commit ->
        group offsets -> standbys."""
        started = time.monotonic()
        last = self._read_logs()
        plan = self._plan_or_replay(last)
        if plan is None:
            return None
        crash_point("after_plan", plan.batch_id)
        planned = time.monotonic()
        path = paths.choose(self.context, plan)
        files = (
            changelog.files_by_task(f"{self.root}/_changelog") if plan.resolve_changelog else None
        )
        try:
            try:
                progress = path.run(plan, files)
            finally:
                self._resolve_changelog = False
            for task, where, rows in sorted(progress.restores):
                log.info("%s batch %d: task %s restored its state on %s (%d changelog rows)",
                         self.app, plan.batch_id, task, where, rows)  # fmt: skip
            crash_point("after_outputs", plan.batch_id)
            if self.state_tables:  # before the commit: a batch run again merges once
                merged = state_tables.merge_all(self.root, self.app, self.state_tables,
                                                plan.batch_id)  # fmt: skip
                progress.metrics["state_table_rows_merged"] = merged
                crash_point("after_state_merge", plan.batch_id)
            consumed = consumed_offsets(plan.ranges, progress)
            metrics = progress.metrics
            metrics |= offset_gaps(self.app, plan.batch_id, plan.ranges, consumed, last, metrics)
            written = time.monotonic()
            metrics["plan_ms"] = int((planned - started) * 1000)
            metrics["run_and_write_ms"] = int((written - planned) * 1000)
            metrics["duration_ms"] = int((written - started) * 1000)
            self._commit(plan, consumed, metrics, progress)
            crash_point("after_commit", plan.batch_id)
            self.group_offsets.commit(consumed)
            path.after_commit()
            metrics["commit_ms"] = int((time.monotonic() - written) * 1000)
            if self.layout is not None and self.keep_standbys_warm:
                metrics["standby_replayed"] = self.standby_sync.run(
                    self.spark,
                    self.layout.standby_copies(),
                    changelog.files_by_task(f"{self.root}/_changelog"),
                    plan.batch_id,
                )
        finally:
            path.release()
        return self._result(plan, path, consumed, metrics, progress)

    def _read_logs(self) -> CommittedBatch | None:
        """The newest committed batch: read from the commit log at the start and after a
        failure (another driver may have committed meanwhile), else known."""
        if self._last is _UNREAD:
            self._last = self.commit_log.last()
            if self._last is not None and not self._upgrade_checked:
                upgrade.check_upgrade(self._last.layout, self.store_layout, self.config,
                                      self._last.batch_id, _buffered(self._last))  # fmt: skip
            self._upgrade_checked = True
            newest = None if self._last is None else self._last.batch_id
            if newest != self._committed_here:
                # Another driver committed batches since this one's last: what this one knows
                # of the tasks' runs and changelog writes is stale. Restores read the
                # changelog, and no task kept open in a worker is taken as current.
                self._resolve_changelog = True
                self._changelog_writes = None
            self._fresh = True
        else:
            self._fresh = False
        return self._last  # type: ignore[no-any-return]

    def _plan_or_replay(self, last: CommittedBatch | None) -> BatchPlan | None:
        """The next batch's plan: the logged one when a batch was planned and not committed
        (met only after reading the logs: at the start and after a failure; any other plan
        logged meanwhile makes the append say so), else a new one; None when there is
        nothing to read."""
        batch_id = self._first_batch if last is None else last.batch_id + 1
        logged = self.offset_log.planned(batch_id) if self._fresh else None
        if logged is not None and not self.replay.replayable(batch_id, logged):
            self._last = _UNREAD  # its plan is gone: planned anew under this job
            return self._plan_or_replay(self._read_logs())
        wall_clock_ms = int(time.time() * 1000)
        if logged is None:
            ranges = self.planner.plan({} if last is None else last.consumed)
            if not any(end > start for start, end in ranges.values()) and not _buffered(last):
                return None  # (records waiting in repartition buffers get a batch of their own)
            global_ends = self.planner.global_ends()
            if not self.offset_log.append(batch_id, ranges, self.fingerprint, wall_clock_ms,
                                          global_ends):  # fmt: skip
                logged = self.offset_log.planned(batch_id)  # planned meanwhile: that plan holds
                log.warning("%s batch %d was planned by another driver meanwhile; running "
                            "its plan", self.app, batch_id)  # fmt: skip
                if logged is not None and not self.replay.replayable(batch_id, logged):
                    self._last = _UNREAD
                    return self._plan_or_replay(self._read_logs())
        if logged is not None:
            ranges, global_ends = logged.ranges, logged.global_ends
            if logged.wall_clock_ms is not None:  # else planned before the time was logged
                wall_clock_ms = logged.wall_clock_ms
        return BatchPlan(
            batch_id=batch_id,
            ranges=ranges,
            last_committed=None if last is None else last.batch_id,
            wall_clock_ms=wall_clock_ms,
            replayed=logged is not None,
            resolve_changelog=self._resolve_changelog,
            changelog_writes=self._changelog_writes,
            repartition_buffered=0
            if last is None
            else int(last.metrics.get("repartition_buffered", 0) or 0),
            global_ends=global_ends,
        )

    def _commit(
        self, plan: BatchPlan, consumed: dict[tuple[str, int], int], metrics: dict[str, int],
        progress: Any,
    ) -> None:  # fmt: skip
        """Append the batch to the commit log (the commit point), then note which tasks ran
        and wrote changelog rows (tasks kept open in workers are current up to it)."""
        guarantee = self.config["processing.guarantee"]
        self.commit_log.append(plan.batch_id, consumed, metrics, guarantee, self.store_layout)
        if plan.resolve_changelog or self._changelog_writes is None:
            self._changelog_writes = ChangelogWrites(plan.batch_id, {})
        for task in progress.changelog_writers:
            self._changelog_writes.last_write[task] = plan.batch_id
        for task in progress.tasks_run:
            self._changelog_writes.last_run[task] = plan.batch_id
        self._last = CommittedBatch(plan.batch_id, consumed, metrics, guarantee,
                                    self.store_layout)  # fmt: skip
        self._committed_here = plan.batch_id

    def _result(
        self, plan: BatchPlan, path: paths.ExecutionPath, consumed: dict[tuple[str, int], int],
        metrics: dict[str, int], progress: Any,
    ) -> BatchResult:  # fmt: skip
        partition_lag = self.planner.partition_lag(consumed)
        lag = sum(partition_lag.values())
        result = BatchResult(
            batch_id=plan.batch_id,
            records_in=metrics.get("records_in", 0),
            records_out=metrics.get("records_out", 0),
            dlq_records=metrics.get("dlq_records", 0),
            duplicates_dropped=metrics.get("dedup_dropped", 0),
            restored_records=metrics.get("restored_records", 0),
            lag=lag,
            duration_ms=metrics["duration_ms"],
            replayed=plan.replayed,
            guarantee=self.config["processing.guarantee"],
            metrics=metrics,
            restores=tuple(sorted(progress.restores)),
            path=path.name,
            task_metrics=dict(getattr(progress, "per_task", {})),
            store_metrics=dict(getattr(progress, "per_store", {})),
            partition_lag=partition_lag,
        )
        log.info(
            "%s batch %d%s: %d in, %d out, %d duplicates dropped, %d to DLQ, lag %d, %d ms, "
            "%s, path %s",
            self.app, plan.batch_id, " (replayed)" if plan.replayed else "", result.records_in,
            result.records_out, result.duplicates_dropped, result.dlq_records, lag,
            result.duration_ms, result.guarantee, result.path,
        )  # fmt: skip
        return result

    # Operations ------------------------------------------------------------------------------

    def discard_uncommitted_batch(self) -> int | None:
        """Forget the batch that was planned but never committed: delete what its attempts
        wrote to the Delta tables (sinks, DLQ mirror, changelog, versions) and its plan, so
        that the next batch plans it anew under this job's topology, code and settings.
        Returns its id; None when every planned batch is committed.

        The way on after a refused replay (``ReplayRefused``): a record that failed under the
        old code and is processed under the new one is then in the sink only, not also in the
        DLQ mirror. Its stores' prepared writes are discarded by the tasks, as after any crash.
        What its attempts committed to Kafka topics stays there, and the next plan does not
        produce it again (planning.py). A claim it took for this is released again."""
        claimed_here = self.claim.epoch is None
        if claimed_here:
            self._claim()
        try:
            discarded = self.replay.discard()
            self._last = _UNREAD
            return discarded
        finally:
            if claimed_here:
                self.claim.release()

    def rewind(self, to_batch: int, accept_kafka_repeats: bool = False) -> Any:
        """Put the stopped job back to just after committed batch ``to_batch`` — its Delta
        sinks, logs, changelog, consumer group and stores — so that the next run computes the
        batches after it anew (rewind.py); a job with Kafka sinks only with
        ``accept_kafka_repeats``. Returns a RewindReport."""
        return rewind.rewind(self, to_batch, accept_kafka_repeats)

    def forget_committed_state(self) -> None:
        """What this driver knew of the committed batches and the tasks' changelog writes is
        read again (after a rewind)."""
        self._last = _UNREAD
        self._resolve_changelog = True
        self._changelog_writes = None
        self._committed_here = None

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
        self.planner.close()


def _buffered(last: CommittedBatch | None) -> int:
    """Repartitioned records the last committed batch left waiting in its tasks' buffers."""
    return 0 if last is None else int(last.metrics.get("repartition_buffered", 0) or 0)


def _internal_partitions(
    topology: Topology, app: str, partitions: Mapping[str, int]
) -> dict[str, int]:
    """Partitions of each repartition topic: as many as the Kafka topics the sub-topology
    reading it reads besides (it is co-partitioned with them: a re-keyed stream joined with a
    table, a foreign-key join's subscriptions and the right table), else as the widest source
    topic of the sub-topology writing it, as in Kafka Streams. A sub-topology must come after
    the ones that write the repartition topics it reads."""
    known = dict(partitions)
    counts: dict[str, int] = {}
    readers_width: dict[str, int] = {}
    for subtopology in topology.subtopologies:
        topics = subtopology.source_topics(topology, app)
        widths = [partitions[t] for t in topics if t in partitions]
        for topic in topics:
            if topic not in partitions and widths:
                readers_width[topic] = max(widths)
    for subtopology in topology.subtopologies:
        topics = subtopology.source_topics(topology, app)
        unknown = [t for t in topics if t not in known]
        if unknown:
            raise NotImplementedError(
                f"{app}: sub-topology {subtopology.id} reads {unknown}, of unknown width "
                "(an internal topic read before it is written is kept in Kafka: "
                "feedback_topics.py; this one was not)"
            )
        width = max(known[t] for t in topics)
        for name in subtopology.nodes:
            node = topology.nodes[name]
            if isinstance(node, SinkNode) and node.internal:
                topic = topic_name(node.topic, True, app)
                if topic in partitions:
                    continue  # a Kafka topic of its own (feedback_topics.py): sized there
                counts[topic] = known[topic] = readers_width.get(topic, width)
    return counts


def _check_store_options(topology: Topology, config: StreamsConfig) -> None:
    """Build every store's RocksDB options once at start-up, so that a rocksdb.config.setter
    that fails or leaves a bad value stops the job here (ConfigError naming the setting and
    the store), not in the first batch's tasks."""
    options = TaskStoreOptions(config)
    try:
        for name in topology.stores:
            options.options(name)
    finally:
        options.close()
