"""Queries of a job's committed state, from outside the job: the platform's answer to Kafka
Streams' Interactive Queries (docs/queries.md).

Every batch appends its stores' writes to the job's changelog in Delta
(``<root>/<application.id>/_changelog``), and maintenance compacts it into snapshots. A
:class:`StateQuery` restores the stores it is asked about from there, as of the last committed
batch or any committed batch since the last snapshot, into RocksDB stores of its own in a
temporary directory: a running job is never touched (nothing of it is locked or read but its
Delta tables), and a store larger than memory stays on disk (the restore streams the changelog
a chunk at a time; range results are iterators).

    from streamplatform.state_query import StateQuery

    with StateQuery(topology, config) as state:          # as of the last committed batch
        state.batch                                      # which one
        state.store("page-counts").get("/home")
        list(state.store("clicks-per-minute").fetch("/home", time_from, time_to))
        state.at(12).store("page-counts").get("/home")   # as of batch 12

A store lives in one task per partition of its sub-topology; a query asks each partition's
store in partition order (``partitions`` narrows it), as Kafka Streams' composite stores do
across instances: ``range`` and ``all`` are in key order within a partition, not across them.
``at`` moves forward by replaying the batches in between, and back by restoring again.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from streamplatform import storage
from streamplatform.config import StreamsConfig
from streamplatform.exceptions import StreamPlatformError
from streamplatform.registry.serdes import configure_registry_serdes
from streamplatform.state_query.views import (
    DedupView,
    KeyValueView,
    QueryError,
    ResultsView,
    SessionView,
    VersionedView,
    WindowView,
    view_for,
)

__all__ = [
    "DedupView",
    "KeyValueView",
    "QueryError",
    "ResultsView",
    "SessionView",
    "StateQuery",
    "StoreQuery",
    "VersionedView",
    "WindowView",
]


class StateQuery:
    """The committed state of ``topology``'s job (``config``: its settings, ``application.id``
    and ``platform.delta.root`` at least) as of ``batch`` (default: the last committed).
    ``directory``: where the restored stores go (default a temporary directory, removed by
    ``close``); a directory given is the query's own: what it holds is replaced."""

    def __init__(
        self,
        topology: Any,
        config: StreamsConfig | Mapping[str, Any],
        batch: int | None = None,
        directory: str | Path | None = None,
    ) -> None:
        from streamplatform.runtime.reset import app_root

        self.topology = topology
        self.config = config if isinstance(config, StreamsConfig) else StreamsConfig(config)
        self.application_id: str = self.config["application.id"]
        self.root = app_root(self.config)
        storage.configure(self.config)  # the root may be on object storage
        # A store's values may be in a registry format: its serdes need the registry.
        configure_registry_serdes(topology.serdes(), self.config)
        self._owned = directory is None
        self.directory = Path(
            tempfile.mkdtemp(prefix=f"streamplatform-query-{self.application_id}-")
            if directory is None else directory
        )  # fmt: skip
        self._engines: dict[tuple[str, str], Any] = {}  # (task, store) -> opened engine
        self.batch = -1
        self.at(batch)

    # Which batch ----------------------------------------------------------------------------

    def committed_batch(self) -> int | None:
        """The job's last committed batch now (None before its first)."""
        from streamplatform.runtime.logs import CommitLog

        last = CommitLog(f"{self.root}/_commits", self.application_id).last()
        return None if last is None else last.batch_id

    def at(self, batch: int | None = None) -> StateQuery:
        """Hold the state as of ``batch`` (default: the last committed now); returns self."""
        from streamplatform.runtime import reset

        last = self.committed_batch()
        if last is None:
            raise QueryError(f"job {self.application_id} has committed no batch yet "
                             f"(its commit log: {self.root}/_commits)")  # fmt: skip
        wanted = last if batch is None else int(batch)
        if wanted > last:
            raise QueryError(f"batch {wanted} of {self.application_id} is not committed: the "
                             f"last committed batch is {last}")  # fmt: skip
        first = reset.first_batch(self.root)
        if wanted < first:
            raise QueryError(f"batch {wanted} of {self.application_id} is from before its "
                             f"reset: its first batch since is {first}")  # fmt: skip
        if wanted < self.batch:
            self._forget()  # a store can only move forward: restore again from the start
        self.batch = wanted
        opened = sorted(self._engines)
        if opened:
            files = self._files()
            for task, store in opened:
                self._restore(task, store, files)
        return self

    # Stores ---------------------------------------------------------------------------------

    def store(self, name: str, partitions: Iterable[int] | None = None) -> StoreQuery:
        """Store ``name`` as of :attr:`batch`, over every partition that holds data of it (or
        those of ``partitions``)."""
        if name not in self.topology.stores:
            raise QueryError(f"no store named {name!r} in the topology; its stores: "
                             f"{', '.join(sorted(self.topology.stores))}")  # fmt: skip
        global_topic = getattr(self.topology.stores[name], "global_topic", None)
        if global_topic is not None:
            raise QueryError(f"{name!r} is a global table's store: it has no changelog, its "
                             f"topic {global_topic!r} holds the table")  # fmt: skip
        subtopology = next(s for s in self.topology.subtopologies if name in s.stores)
        files = self._files()
        tasks = sorted(
            (task for task in files if task.split("_")[0] == str(subtopology.id)),
            key=lambda task: int(task.split("_")[1]),
        )
        if partitions is not None:
            wanted = {int(p) for p in partitions}
            tasks = [task for task in tasks if int(task.split("_")[1]) in wanted]
        views = {}
        for task in tasks:
            engine = self._restore(task, name, files)
            views[int(task.split("_")[1])] = view_for(self.topology, name, engine)
        if not views:  # no partition wrote anything yet: the views of an empty store
            views[0] = view_for(self.topology, name, self._empty(name))
        return StoreQuery(name, views)

    # Life cycle -----------------------------------------------------------------------------

    def close(self) -> None:
        self._forget()
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> StateQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Internals ------------------------------------------------------------------------------

    def _files(self) -> dict[str, list[Any]]:
        from streamplatform.runtime.changelog import files_by_task

        return files_by_task(f"{self.root}/_changelog")

    def _restore(self, task: str, store: str, files: Mapping[str, list[Any]]) -> Any:
        """The store of ``task`` brought to :attr:`batch` from the changelog."""
        from streamplatform.runtime.changelog import replay
        from streamplatform.runtime.task_run import BATCH_MARKER

        task_files = list(files.get(task, []))
        snapshot = max((f.last_batch for f in task_files if f.snapshot), default=-1)
        if self.batch < snapshot:
            raise QueryError(
                f"batch {self.batch} of {self.application_id} (task {task}) was compacted into "
                f"the changelog's snapshot of batch {snapshot} by maintenance: the oldest batch "
                f"that can be queried is {snapshot}"
            )
        engine = self._engines.get((task, store))
        if engine is None:
            spec = self.topology.stores[store]
            engine = self._engines[(task, store)] = spec.open(self.directory / task)
        try:
            replay(task_files, {store: engine}, self.batch, BATCH_MARKER)
        except Exception as error:
            raise StreamPlatformError(f"restoring store {store} of task {task} to batch "
                                      f"{self.batch} failed: {error}") from error  # fmt: skip
        return engine

    def _empty(self, store: str) -> Any:
        key = ("empty", store)
        if key not in self._engines:
            self._engines[key] = self.topology.stores[store].open(self.directory / "empty")
        return self._engines[key]

    def _forget(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
        for child in self.directory.iterdir() if self.directory.exists() else ():
            shutil.rmtree(child, ignore_errors=True)


class StoreQuery:
    """One store as of a batch, over its partitions (``partitions``: partition -> view, each
    a view of views.py). The view's queries, asked of every partition: single results from the
    first partition that has one, iterations chained in partition order."""

    def __init__(self, name: str, partitions: Mapping[int, Any]) -> None:
        self.name = name
        self.partitions = dict(partitions)
        self.kind: str = next(iter(self.partitions.values())).kind

    def partition(self, partition: int) -> Any:
        """The view of one partition's store."""
        return self.partitions[partition]

    def __getattr__(self, query: str) -> Any:
        views = list(self.partitions.values())
        method = getattr(views[0], query, None)
        if method is None or query.startswith("_") or not callable(method):
            raise AttributeError(f"a {self.kind} store ({type(views[0]).__name__}) has no "
                                 f"query {query!r}")  # fmt: skip
        if query in ("get", "get_with_timestamp"):
            return lambda *args, **kwargs: next(
                (
                    found
                    for view in views
                    if (found := getattr(view, query)(*args, **kwargs)) is not None
                ),
                None,
            )
        if query == "approximate_num_entries":
            return lambda: sum(view.approximate_num_entries() for view in views)
        return lambda *args, **kwargs: _chained(views, query, args, kwargs)

    def __repr__(self) -> str:
        return f"StoreQuery({self.name!r}, partitions={sorted(self.partitions)})"


def _chained(views: list[Any], query: str, args: Any, kwargs: Any) -> Iterator[Any]:
    return itertools.chain.from_iterable(getattr(v, query)(*args, **kwargs) for v in views)
