"""StreamingJobSpec: a streaming job declared once, for Dagster to operate.

A declaration names the job (its asset), its topology (the object, a function that builds it,
or an import path ``"package.module:name"`` to either), its Delta sinks, its DLQ topic and its
settings in Kafka Streams' names. The settings are checked when the definitions load, so a
wrong one stops the code location with a message naming it, not the first run. Where the job
runs (Kafka, Spark, Delta root, state dir) comes from :class:`StreamplatformResource` when a
run starts, never from the declaration.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.dsl.topology import Topology

# Settings the resource supplies at run time: a declaration that sets them is refused.
FROM_THE_RESOURCE = (
    "bootstrap.servers",
    "state.dir",
    "platform.delta.root",
    "platform.spark.master",
)
# Set by the declaration's own fields.
FROM_THE_FIELDS = ("application.id", "errors.dead.letter.queue.topic.name")
# What a job declared without settings gets is StreamsConfig's own defaults, as from the CLI or
# Python: exactly_once_v2, and with a DLQ topic, poison records and failing records to the DLQ
# instead of failing the job (log_and_continue).


@dataclass(frozen=True)
class AsOfJoin:
    """A temporal join of the job's stream with one of its versioned stores (KIP-889).

    ``store``: the versioned store the join reads as of each record's time. ``sink``: the Delta
    sink the join writes; the timestamps of its rows tell how far each task had joined, so the
    store's snapshot asset can report the versions that arrived after the join had passed their
    start (late versions) and the UTC days they make stale. ``backfill_job``: the name of a
    job partitioned by UTC day (``"YYYY-MM-DD"`` keys) that recomputes a day, for example with
    :func:`streamplatform.versioned_snapshot.batch_as_of_join`; with it, a sensor launches it
    for every stale day.
    """

    store: str
    sink: str
    backfill_job: str | None = None


@dataclass(frozen=True)
class StreamingJobSpec:
    """One streaming job, as Dagster operates it (module docstring).

    ``name``: the streaming asset's name, and the ``application.id`` unless ``application_id``
    is given. ``delta_sinks``: output topics written to Delta tables under
    ``<delta root>/<application.id>/<topic>`` instead of Kafka. ``delta_state_tables``: sink
    topics of a table's updates whose Delta table also keeps the table's current state, one
    row per key (per key and window), in ``<topic>_state``. ``dlq_topic``: the DLQ topic
    (KIP-1034); with one, poison records and failing records go there and the job continues,
    unless ``settings`` choose other handlers. ``settings``: more StreamsConfig settings.
    ``freshness``: the asset's freshness policy, a materialization at least this often.
    ``as_of_joins``: the job's temporal joins (:class:`AsOfJoin`), for late-version reports and
    backfills of what they made stale. ``shared_sinks``: Kafka sink topics that another job's
    asset materializes (``kafka/<topic>`` has one writer in Dagster): this job still writes
    them, without materializing their assets.
    """

    name: str
    topology: Topology | Callable[[], Topology] | str
    application_id: str | None = None
    delta_sinks: Sequence[str] = ()
    delta_state_tables: Sequence[str] = ()
    dlq_topic: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    group_name: str = "streaming"
    description: str | None = None
    freshness: timedelta | None = None
    as_of_joins: Sequence[AsOfJoin] = ()
    shared_sinks: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum():
            raise ConfigError(f"{self.name!r}: a job name is an asset name: letters, digits, _")
        given = set(self.settings)
        for name in sorted(given & set(FROM_THE_RESOURCE)):
            raise ConfigError(
                f"{self.name}: settings.{name} comes from the StreamplatformResource "
                "(kafka, spark, delta_root, state_dir), not from a job's settings"
            )
        for name in sorted(given & set(FROM_THE_FIELDS)):
            raise ConfigError(
                f"{self.name}: settings.{name} is the job's "
                f"{'application_id' if name == 'application.id' else 'dlq_topic'} field"
            )
        # Every key and value checked now, with placeholders for what comes at run time.
        try:
            self._checked_config  # noqa: B018
        except ConfigError as error:
            raise ConfigError(f"{self.name}: {error}") from None
        sinks = self.load_topology().sink_topics(self.app_id)
        for field_name in ("delta_sinks", "delta_state_tables"):
            unknown = set(getattr(self, field_name)) - set(sinks)
            if unknown:
                raise ConfigError(
                    f"{self.name}: {field_name} {sorted(unknown)} are not sink topics of the "
                    f"topology (its sinks: {sinks})"
                )
        not_kafka_sinks = set(self.shared_sinks) - set(self.kafka_sink_topics())
        if not_kafka_sinks:
            raise ConfigError(
                f"{self.name}: shared_sinks {sorted(not_kafka_sinks)} are not Kafka sink topics "
                f"of the job (its Kafka sinks: {self.kafka_sink_topics()})"
            )
        for join in self.as_of_joins:
            if join.store not in self.versioned_stores():
                raise ConfigError(
                    f"{self.name}: as_of_joins store {join.store!r} is not a versioned store of "
                    f"the topology (its versioned stores: {self.versioned_stores()})"
                )
            if join.sink not in self.delta_sinks:
                raise ConfigError(
                    f"{self.name}: as_of_joins sink {join.sink!r} is not one of its delta_sinks "
                    f"{list(self.delta_sinks)}"
                )

    @property
    def app_id(self) -> str:
        return self.application_id or self.name

    @property
    def processing_guarantee(self) -> str:
        """``exactly_once_v2`` (StreamsConfig's default) or ``at_least_once``."""
        return str(self._checked_config["processing.guarantee"])

    @functools.cached_property
    def _checked_config(self) -> StreamsConfig:
        """The settings as StreamsConfig takes them, on placeholders for what the resource
        gives at run time."""
        return StreamsConfig(self.streams_settings({"bootstrap.servers": "check:9092"}, "/", "/"))

    def load_topology(self) -> Topology:
        """The topology, built or imported as declared (once)."""
        return self._topology

    @functools.cached_property
    def _topology(self) -> Topology:
        target: Any = self.topology
        if isinstance(target, str):
            target = _import(target, self.name)
        if callable(target) and not isinstance(target, Topology):
            target = target()
        if not isinstance(target, Topology):
            raise ConfigError(
                f"{self.name}: topology must be a Topology, a function returning one, or an "
                f"import path 'package.module:name' to either; got {type(target).__name__}"
            )
        return target

    def streams_settings(
        self, kafka: Mapping[str, Any], delta_root: str, state_dir: str
    ) -> dict[str, Any]:
        """The job's StreamsConfig settings on the given Kafka, Delta root and state dir."""
        # An empty state dir stays unset: each executor resolves its own
        # (home.default_state_dir).
        return (
            dict(kafka)
            | dict(self.settings)
            | {
                "application.id": self.app_id,
                "errors.dead.letter.queue.topic.name": self.dlq_topic,
                "platform.delta.root": delta_root,
            }
            | ({"state.dir": state_dir} if state_dir else {})
        )

    def source_topics(self) -> list[str]:
        """The topics the job reads from outside (not its repartition topics)."""
        topology = self.load_topology()
        internal = set(topology.repartition_topics(self.app_id))
        return [t for t in dict.fromkeys(topology.source_topics(self.app_id)) if t not in internal]

    def kafka_sink_topics(self) -> list[str]:
        topology = self.load_topology()
        internal = set(topology.repartition_topics(self.app_id))
        return [
            t
            for t in dict.fromkeys(topology.sink_topics(self.app_id))
            if t not in internal and t not in self.delta_sinks and t not in self.delta_state_tables
        ]

    def topic_assets(self) -> list[str]:
        """The Kafka sink topics whose assets (``kafka/<topic>``) this job materializes: all but
        its ``shared_sinks``."""
        return [t for t in self.kafka_sink_topics() if t not in self.shared_sinks]

    def versioned_stores(self) -> list[str]:
        return sorted(n for n, s in self.load_topology().stores.items() if s.kind == "versioned")

    def as_of_join(self, store: str) -> AsOfJoin | None:
        """The declared temporal join over ``store``, if any."""
        return next((join for join in self.as_of_joins if join.store == store), None)


def _import(path: str, job: str) -> Any:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{job}: topology {path!r}: expected 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            f"{job}: topology {path!r}: cannot import {module_name}: {error}"
        ) from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigError(f"{job}: topology {path!r}: {module_name} has no {attribute!r}") from None
