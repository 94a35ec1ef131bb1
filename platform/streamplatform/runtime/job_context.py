"""What the batch spine (microbatch.py) passes down to planning, the replay policy and the
execution paths: the job's fixed facts (``JobContext``) and one batch's plan (``BatchPlan``).
Neither calls back into the job."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamplatform import storage
from streamplatform.config import StreamsConfig
from streamplatform.dsl.topology import Topology
from streamplatform.runtime import kafka_output
from streamplatform.runtime.claim import JobClaim
from streamplatform.runtime.executor import ChangelogWrites, TaskBatchRunner
from streamplatform.runtime.local_master import local_master_slots
from streamplatform.runtime.logs import Ranges
from streamplatform.runtime.standby import InstanceLayout


@dataclass(frozen=True)
class BatchPlan:
    """One batch as the spine hands it to an execution path."""

    batch_id: int
    ranges: Ranges  # (topic, partition) -> [start, end), as logged
    last_committed: int | None
    wall_clock_ms: int  # logged with the plan: the same for every attempt of the batch
    replayed: bool  # an earlier attempt may have written some of its outputs
    # The changelog's files are resolved for this batch (the first of a job, after a failover,
    # after another driver's commits); otherwise ``changelog_writes`` tells each task whether
    # it is current.
    resolve_changelog: bool
    changelog_writes: ChangelogWrites | None
    # Repartitioned records the last committed batch left in its tasks' repartition buffers
    # (its metrics): the tasks holding them run in this batch even without new records.
    repartition_buffered: int = 0
    # (global table topic, partition) -> the offset every task's copy of that global table
    # catches up to before the batch's records, as logged (global_tables.py).
    global_ends: dict[tuple[str, int], int] = field(default_factory=dict)

    def capped(self, cap: int) -> frozenset[tuple[str, int]]:
        """The partitions whose range the batch cap cut: each may hold more records than the
        batch reads, so it holds its task's other inputs back (partition_group.py). Derived
        from the logged ranges and the cap, so every attempt of the batch cuts alike."""
        return frozenset(tp for tp, (start, end) in self.ranges.items() if end - start >= cap)

    @property
    def records(self) -> int:
        return sum(max(0, end - start) for start, end in self.ranges.values())

    def wanted(self) -> dict[str, dict[int, tuple[int, int]]]:
        """``{topic: {partition: (start, end)}}`` of the ranges with records to read."""
        wanted: dict[str, dict[int, tuple[int, int]]] = {}
        for (topic, partition), (start, end) in self.ranges.items():
            if end > start:
                wanted.setdefault(topic, {})[partition] = (start, end)
        return wanted

    def planned_per_partition(self) -> dict[int, int]:
        """Task partition -> records planned for it (the ``during_tasks`` crash point fires
        half-way through them)."""
        planned: dict[int, int] = {}
        for (_, partition), (start, end) in self.ranges.items():
            planned[partition] = planned.get(partition, 0) + max(0, end - start)
        return planned


@dataclass
class JobContext:
    """The job's fixed facts: topology, settings, topics and where its tables live."""

    topology: Topology
    config: StreamsConfig
    root: str  # <platform.delta.root>/<application.id>
    delta_sinks: frozenset[str]
    sources: list[str]  # Kafka topics read (repartition topics excluded)
    internal_topics: frozenset[str]  # repartition topics: shuffles inside the batch
    partitions: dict[str, int]  # of every topic read or written, repartition topics included
    fingerprint: str
    claim: JobClaim
    spark: Callable[[], Any]  # the SparkSession, started on first use
    layout: InstanceLayout | None = None
    # Delta sinks with a typed `value_fields` column (value_fields.py), by topic.
    value_fields: dict[str, Any] = field(default_factory=dict)
    # Internal topics kept in Kafka because they close a cycle of sub-topologies (a
    # foreign-key join's answers: feedback_topics.py).
    feedback_topics: frozenset[str] = frozenset()
    # The commit log's table id, once claimed: task directories of another incarnation of
    # the job (before a reset) are removed before use (incarnation.py).
    incarnation: str = ""
    _slots: int | None = field(default=None, repr=False)

    @property
    def app(self) -> str:
        return self.config["application.id"]

    @property
    def global_topics(self) -> list[str]:
        """The topics of the topology's global tables (read whole by every task)."""
        return self.topology.global_topics()

    @property
    def settings(self) -> dict[str, Any]:
        """What the executors rebuild their StreamsConfig from; the storage settings of a
        root on S3 as resolved here (an executor need not have the driver's environment)."""
        settings = self.config.to_dict()
        if storage.scheme(self.root) in storage.S3_SCHEMES:
            settings |= storage.resolved_settings(settings)
        return settings

    @property
    def kafka(self) -> dict[str, Any]:
        return self.config.kafka_settings()

    @property
    def consumer_settings(self) -> dict[str, Any]:
        return self.config.kafka_settings("consumer")

    @property
    def producer_settings(self) -> dict[str, Any]:
        """The Kafka sinks' and DLQ's producers: the connection and the producer.* settings."""
        return self.config.kafka_settings("producer")

    @property
    def dlq_topic(self) -> str | None:
        return self.config["errors.dead.letter.queue.topic.name"] or None

    def sink_topics(self) -> list[str]:
        """Every topic the topology writes (repartition topics included)."""
        return list(self.topology.sink_topics(self.app))

    def delta_sink_topics(self) -> list[str]:
        return sorted(self.delta_sinks & set(self.sink_topics()))

    def in_task_outputs(self, batch_id: int, marker: tuple[str, int] | None = None) -> Any:
        """What the tasks of the direct paths need to produce their Kafka sinks and DLQ
        records themselves (kafka_output.InTaskOutputs), or None for a job without Kafka
        sinks (its DLQ records are then sent from the driver)."""
        from streamplatform.runtime.kafka_output import InTaskOutputs

        kafka_sinks = self.kafka_sink_topics()
        dynamic = self.topology.has_dynamic_sinks()
        if not kafka_sinks and not dynamic:
            return None
        app = self.app if self.config.exactly_once else None
        but = frozenset(self.internal_topics | self.delta_sinks) if dynamic else None
        return InTaskOutputs(self.producer_settings, frozenset(kafka_sinks), app, batch_id,
                             marker, any_topic_but=but)  # fmt: skip

    def kafka_sink_topics(self) -> list[str]:
        return sorted(
            t for t in self.sink_topics()
            if t not in self.delta_sinks and t not in self.internal_topics
        )  # fmt: skip

    def changelog_table(self) -> str:
        return f"{self.root}/_changelog"

    def staging_root(self) -> str:
        """Where runs keep their side files, one directory per run (claim.run): beside the
        tables, a local path (absolute: executors have other working directories) or a URI
        on the same object storage (storage.py). With tables on object storage and a local
        master, on this host's disk instead (``local_staging_root``)."""
        if storage.is_local(self.root):
            return storage.join(str(Path(storage.local_path(self.root)).absolute()), "_staging")
        if self.local_slots() > 0:
            return self.local_staging_root()
        return storage.join(self.root, "_staging")

    def local_staging_root(self) -> str:
        """The staging directory of a local master when the tables are on object storage:
        under the job's state directory. Side files are scratch (a task writes them, the
        driver reads them once before the commit, and a replay writes them anew), and a local
        master's executors share this host's disk, so they need not go to object storage and
        back, as Spark keeps its own shuffle files in ``spark.local.dir``."""
        from streamplatform.home import default_state_dir

        state = Path(self.config["state.dir"] or default_state_dir()).absolute()
        return str(state / self.app / "_staging")

    def staging_roots(self) -> list[str]:
        """Every staging directory runs of this job may have used (for their cleanup)."""
        if storage.is_local(self.root):
            return [self.staging_root()]
        return [storage.join(self.root, "_staging"), self.local_staging_root()]

    def side_dir(self) -> str:
        """This run's side-output directory."""
        return storage.join(self.staging_root(), self.claim.run, "side")

    def local_slots(self) -> int:
        """The task slots of a local master; 0 for any other (local_master.py)."""
        if self._slots is None:
            try:
                master = self.spark().sparkContext.master
            except Exception:  # Spark Connect: the executors are the server's
                master = ""
            self._slots = local_master_slots(master)
        return self._slots

    def task_partitions(self, partitions: Iterable[tuple[str, int]]) -> dict[str, list[Any]]:
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

    def transactions(
        self, batch_id: int, consumed: Mapping[tuple[str, int], int]
    ) -> kafka_output.Transactions | None:
        """Under exactly_once_v2, what each task commits with its Kafka outputs: its consumed
        offsets on the Kafka partitions it read."""
        if not self.config.exactly_once:
            return None
        offsets_by_task = {
            task: tuple((topic, partition, consumed[(topic, partition)])
                        for topic, partition in positions)
            for task, positions in self.task_partitions(consumed).items()
        }  # fmt: skip
        return kafka_output.Transactions(self.app, batch_id, offsets_by_task, (self.sources[0], 0))

    def runner(
        self,
        plan: BatchPlan,
        changelog_files: Any,
        subtopology: int = 0,
        side_output_dir: str | None = None,
        repartition_bounds: Mapping[str, Mapping[int, int]] | None = None,
    ) -> TaskBatchRunner:
        """What runs the batch's tasks of ``subtopology`` (executor.py)."""
        cap = self.config["platform.max.records.per.batch"]
        return TaskBatchRunner(
            self.topology,
            self.settings,
            plan.batch_id,
            plan.last_committed,
            changelog_files,
            self.partitions,
            self.layout.active_dirs() if self.layout is not None else None,
            planned_records=plan.planned_per_partition(),
            changelog_writes=None if plan.resolve_changelog else plan.changelog_writes,
            subtopology=subtopology,
            internal_topics=self.internal_topics,
            side_output_dir=side_output_dir,
            stream_topic=self.sources[0] if len(self.sources) == 1 else None,
            fingerprint=self.fingerprint,
            task_runs=plan.changelog_writes,
            changelog_table=self.changelog_table(),
            wall_clock_ms=plan.wall_clock_ms,
            task_cap=cap,
            capped=plan.capped(cap),
            repartition_bounds=repartition_bounds,
            global_ends=plan.global_ends,
            incarnation=self.incarnation,
        )
