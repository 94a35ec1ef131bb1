"""StreamingJobComponent: a streaming job declared in YAML, a Dagster 1.13 ``Component``.

A team adds a job by adding a ``defs.yaml`` to its project's defs folder::

    type: streamplatform.dagster.StreamingJobComponent
    attributes:
      name: orders_deduplicated
      topology: my_project.topologies:orders_topology   # a Topology, or a function building one
      dlq_topic: orders-dlq
      delta_sinks: [orders-clean]
      settings:
        platform.max.records.per.batch: 20000
      freshness_minutes: 60
      # A temporal join with a versioned store: late versions reported, stale days backfilled.
      as_of_joins:
        - {store: customers-versions, sink: orders-clean, backfill_job: orders_backfill}
      # A Kafka sink another job's asset materializes (kafka/<topic> has one writer in Dagster).
      shared_sinks: [orders-audit]
      # Optional: bind the resource here (once per project), with Dagster's templating. Spark:
      # dagster-pyspark's LazyPySparkResource with the platform's settings (master, conf).
      resource:
        kafka:
          bootstrap_servers: "{{ env.KAFKA_BOOTSTRAP_SERVERS }}"
        spark:
          master: spark://spark-master:7077
        delta_root: /data/delta

It builds exactly what :func:`streaming_definitions` builds for one :class:`StreamingJobSpec`
(the streaming asset and its checks, snapshot assets, DLQ replay job and schedule, lag
sensor), with the same names, so the YAML and the Python factory are interchangeable. Two
component files whose jobs would give Dagster one asset twice (one name, or the asset of one
Kafka topic both write) stop the load naming both jobs and what to do.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from streamplatform.dagster.factory import check_declarations, streaming_definitions
from streamplatform.dagster.resource import (
    KafkaConnection,
    StreamplatformResource,
    platform_pyspark,
)
from streamplatform.dagster.spec import AsOfJoin, StreamingJobSpec


class SparkModel(dg.Model):
    """The Spark session: dagster-pyspark's LazyPySparkResource with the platform's settings."""

    master: str = Field(default="", description="Spark master URL. Empty: SPARK_MASTER or "
                        "local[*]; sc://... for Spark Connect.")  # fmt: skip
    conf: dict[str, str] = Field(
        default_factory=dict, description="More Spark settings, over the platform's."
    )
    stop_after_run: bool = Field(
        default=True, description="Stop the session at the end of a run if this run started it."
    )


class ResourceModel(dg.Model):
    """The :class:`StreamplatformResource` to bind under ``streamplatform``."""

    kafka: dict[str, Any] = Field(default_factory=dict, description="bootstrap_servers, settings")
    spark: SparkModel = Field(
        default_factory=SparkModel, description="master, conf, stop_after_run"
    )
    delta_root: str = ""
    storage: dict[str, str] = Field(
        default_factory=dict, description="platform.storage.s3.* settings of the Delta root"
    )
    state_dir: str = ""


class AsOfJoinModel(dg.Model):
    """An :class:`~streamplatform.dagster.AsOfJoin`."""

    store: str = Field(description="The versioned store the join reads.")
    sink: str = Field(description="The Delta sink the join writes.")
    backfill_job: str | None = Field(
        default=None, description="A job partitioned by UTC day that recomputes a stale day."
    )


class StreamingJobComponent(dg.Component, dg.Model, dg.Resolvable):
    """One streaming job, operated by Dagster (see the module docstring)."""

    name: str = Field(description="The streaming asset's name; the application.id by default.")
    topology: str = Field(description="Import path 'package.module:name' of a Topology or of a "
                          "function that builds one.")  # fmt: skip
    application_id: str | None = Field(default=None, description="application.id (default: name).")
    delta_sinks: list[str] = Field(
        default_factory=list, description="Sink topics written to Delta."
    )
    delta_state_tables: list[str] = Field(
        default_factory=list,
        description="Sink topics of a table's updates also kept as the table's current state "
        "in Delta (<topic>_state, one row per key).",
    )
    dlq_topic: str | None = Field(default=None, description="errors.dead.letter.queue.topic.name")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="More StreamsConfig settings."
    )
    group_name: str = "streaming"
    description: str | None = None
    freshness_minutes: int | None = Field(default=None, description="Freshness policy window.")
    lag_threshold: int = Field(
        default=1000, description="Records behind before the lag sensor runs it."
    )
    max_dlq_ratio: float = Field(default=0.01, description="The dlq_ratio check's maximum.")
    dlq_replay_cron: str = "*/15 * * * *"
    dlq_replay_running: bool = Field(default=False, description="Start the replay schedule on.")
    as_of_joins: list[AsOfJoinModel] = Field(
        default_factory=list, description="Temporal joins with the job's versioned stores."
    )
    shared_sinks: list[str] = Field(
        default_factory=list,
        description="Kafka sink topics another job's asset materializes (kafka/<topic>): this "
        "job writes them too, without materializing their assets.",
    )
    resource: ResourceModel | None = Field(
        default=None, description="Bind the resource here; leave out where the project binds it."
    )

    _spec: StreamingJobSpec | None = PrivateAttr(default=None)

    def spec(self) -> StreamingJobSpec:
        """The declaration as a :class:`StreamingJobSpec` (built once)."""
        if self._spec is None:
            self._spec = self._build_spec()
        return self._spec

    def _build_spec(self) -> StreamingJobSpec:
        return StreamingJobSpec(
            name=self.name, topology=self.topology, application_id=self.application_id,
            delta_sinks=tuple(self.delta_sinks),
            delta_state_tables=tuple(self.delta_state_tables), dlq_topic=self.dlq_topic,
            settings=dict(self.settings), group_name=self.group_name,
            description=self.description,
            freshness=None if self.freshness_minutes is None
            else timedelta(minutes=self.freshness_minutes),
            as_of_joins=tuple(AsOfJoin(**join.model_dump()) for join in self.as_of_joins),
            shared_sinks=tuple(self.shared_sinks),
        )  # fmt: skip

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        # The project's other streaming jobs (other defs.yaml files): two that would give
        # Dagster one asset twice stop the load with what to do, not a bare duplicate key.
        declared = context.component_tree.get_all_components(of_type=StreamingJobComponent)
        check_declarations([component.spec() for component in declared] or [self.spec()])
        resource = None
        if self.resource is not None:
            resource = StreamplatformResource(
                kafka=KafkaConnection(**self.resource.kafka),
                spark=platform_pyspark(self.resource.spark.master, self.resource.spark.conf),
                stop_spark_after_run=self.resource.spark.stop_after_run,
                delta_root=self.resource.delta_root,
                storage=self.resource.storage,
                state_dir=self.resource.state_dir,
            )
        return streaming_definitions(
            [self.spec()], resource=resource, lag_threshold=self.lag_threshold,
            max_dlq_ratio=self.max_dlq_ratio, dlq_replay_cron=self.dlq_replay_cron,
            dlq_replay_running=self.dlq_replay_running,
        )  # fmt: skip
