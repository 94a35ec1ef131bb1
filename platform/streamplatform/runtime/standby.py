"""Warm standbys and failover (KIP-708 placement) for the Spark runtime.

Locally an *instance* is a state root, ``<instances root>/<name>/``: a task's active stores live
under its active instance's root, and a warm copy under each standby instance's root, as
``placement.plan_standbys`` chose them. After every committed batch the standbys replay that
batch's changelog from Delta (a small Spark job, one Spark task per standby copy), so they stay
current. When an instance is declared lost, each of its active tasks moves to the first of its
standbys that is still there; the task resumes from that warm copy and replays only the tail
the standby had not seen. With no standby left, the task moves to the least-loaded surviving
instance and restores the whole changelog.

On a cluster: Spark cannot pin a partition to an executor. The placement steers scheduler pools
and node selectors (``placement.executor_settings``); an instance's state root is the local
disk of the executors of its pool, and state follows a task by restore when Spark schedules it
elsewhere. What this module guarantees is that a promoted standby's copy is warm, not that
Spark runs the task next to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamplatform.dsl.topology import Topology
from streamplatform.placement import Placement
from streamplatform.runtime.changelog import ChangelogFile


@dataclass
class InstanceLayout:
    """Where each task's active and standby state lives, and how failover moves it."""

    root: Path
    active: dict[str, str]  # task id -> instance
    standbys: dict[str, list[str]]  # task id -> standby instances, KIP-708's order
    lost: set[str] = field(default_factory=set)

    @classmethod
    def from_placement(cls, root: Path, placement: Placement) -> InstanceLayout:
        return cls(
            root,
            dict(placement.active),
            {task: list(clients) for task, clients in placement.standbys.items()},
        )

    def state_dir(self, instance: str) -> Path:
        return self.root / instance

    def active_dirs(self) -> dict[str, str]:
        """Task id -> the state root its active stores live under."""
        return {task: str(self.state_dir(instance)) for task, instance in self.active.items()}

    def standby_copies(self) -> list[tuple[str, str]]:
        """(task id, state root) of every standby copy on an instance still there."""
        return [
            (task, str(self.state_dir(instance)))
            for task, instances in sorted(self.standbys.items())
            for instance in instances
            if instance not in self.lost
        ]

    def fail(self, instance: str) -> dict[str, tuple[str, bool]]:
        """Declare ``instance`` lost; returns ``{task: (new instance, warm)}`` for its tasks."""
        if instance not in set(self.active.values()) | {
            i for s in self.standbys.values() for i in s
        }:
            raise ValueError(f"No instance named {instance!r} in the placement")
        self.lost.add(instance)
        moved: dict[str, tuple[str, bool]] = {}
        for task, current in sorted(self.active.items()):
            if current != instance:
                continue
            survivors = [s for s in self.standbys.get(task, []) if s not in self.lost]
            if survivors:
                target, warm = survivors[0], True
                self.standbys[task] = survivors[1:]
            else:
                target, warm = self._least_loaded(), False
            self.active[task] = target
            moved[task] = (target, warm)
        for task in self.standbys:
            self.standbys[task] = [s for s in self.standbys[task] if s not in self.lost]
        return moved

    def instances(self) -> set[str]:
        """Every instance that holds a copy of some task."""
        return set(self.active.values()) | {i for s in self.standbys.values() for i in s}

    def _least_loaded(self) -> str:
        alive = sorted(self.instances() - self.lost)
        if not alive:
            raise RuntimeError("Every instance is lost: nowhere to move the tasks")
        load = {i: 0 for i in alive}
        for current in self.active.values():
            if current in load:
                load[current] += 1
        return min(alive, key=lambda i: (load[i], i))


class StandbySync:
    """Replays committed changelog batches into the standby copies (on the executors)."""

    def __init__(
        self,
        topology: Topology,
        application_id: str,
        marker: tuple[str, int],
        settings: Mapping[str, Any] | None = None,
    ):
        self.topology = topology
        self.application_id = application_id
        self.marker = marker
        # The job's settings (JobContext.settings): the copies' stores open with the
        # RocksDB options the tasks' do (rocksdb.config.setter, platform.rocksdb.*), as the
        # last store opened in a process sets its shared cache's size.
        self.settings = dict(settings or {})
        self.incarnation = ""  # the job's, once claimed (incarnation.py)

    def run(
        self,
        spark: Any,
        copies: list[tuple[str, str]],
        files: Mapping[str, list[ChangelogFile]],
        up_to_batch: int,
    ) -> int:
        """Bring every copy up to ``up_to_batch``; returns the changelog rows replayed."""
        if not copies:
            return 0
        topology, app, marker = self.topology, self.application_id, self.marker
        settings, current = self.settings, self.incarnation
        work = [(task, root, list(files.get(task, []))) for task, root in copies]

        def replay_copy(item: tuple[str, str, list[ChangelogFile]]) -> int:
            from streamplatform import storage
            from streamplatform.config import StreamsConfig
            from streamplatform.runtime.changelog import replay
            from streamplatform.runtime.repartition_buffer import every_runtime_store
            from streamplatform.state.rocks import TaskStoreOptions

            storage.configure(settings)  # the changelog's files may be on object storage
            task, root, task_files = item
            directory = Path(root) / app / task
            from streamplatform.runtime import incarnation

            incarnation.ensure(directory, current)  # a copy from before a reset starts over
            options = TaskStoreOptions(StreamsConfig(settings))
            stores = {
                name: spec.open(directory, options=options.options(name))
                for name, spec in topology.stores.items()
                if getattr(spec, "global_topic", None) is None  # a global table: no changelog
            } | {
                name: spec.open(directory)  # the repartition buffer (repartition_buffer.py)
                for name, spec in every_runtime_store(topology, app).items()
            }
            try:
                return replay(task_files, stores, up_to_batch, marker)
            finally:
                for store in stores.values():
                    store.close()
                options.close()

        def replay_rows(batches: Any) -> Any:  # mapInArrow: row i replays copy i
            import pyarrow as pa

            for batch in batches:
                for index in batch.column("id").to_pylist():
                    yield pa.RecordBatch.from_pydict({"replayed": [replay_copy(work[index])]})

        # DataFrame API, not sparkContext.parallelize: the same under Spark Connect, which
        # has no SparkContext or RDDs. One Spark partition per copy, as before.
        counts = (
            spark.range(len(work), numPartitions=len(work))
            .mapInArrow(replay_rows, "replayed long")
            .collect()
        )
        return int(sum(row.replayed for row in counts))
