"""StreamplatformResource: one Dagster resource with everything a streaming job runs on.

It nests the Kafka connection, the Spark settings, the Delta root and the state directory, so
an asset, op or sensor of the integration takes one resource, not five. Nothing needs setting
locally: an empty ``kafka.bootstrap_servers`` is ``KAFKA_BOOTSTRAP_SERVERS`` or else the broker of
`streamplatform broker start`,
an empty ``spark.master`` is ``SPARK_MASTER`` or ``local[*]``, empty paths are ``.data/delta``
and ``.data/state`` (``STREAMPLATFORM_DATA`` moves both).

The SparkSession starts on first use (a sensor that only reads Kafka offsets never starts a
JVM) with :func:`streamplatform.spark.spark_conf`'s settings: Delta, the Kafka connector's
jars, and the driver's own Python for the workers (``spark.pyspark.python``), so that Spark's
Python workers find ``streamplatform`` without any environment set by hand. A session this
resource started is stopped at the end of the run; one that was already running in the
process (a test suite's, a notebook's) is used and left running.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field, PrivateAttr

from streamplatform.home import data_dir
from streamplatform.kafka import end_offsets
from streamplatform.kafka.local_broker import default_data_dir, running_broker

if TYPE_CHECKING:
    from streamplatform.dagster.spec import StreamingJobSpec


class KafkaConnection(dg.Config):
    """Where the brokers are and how to authenticate, shared by every Kafka client."""

    bootstrap_servers: str = Field(
        default="",
        description="host:port,... Empty: KAFKA_BOOTSTRAP_SERVERS, or else the local broker of "
        "`streamplatform broker start`.",
    )
    settings: dict[str, str] = Field(
        default_factory=dict,
        description="More client settings in Kafka's own names: security.protocol, "
        "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, client.id, ...",
    )


class SparkSettings(dg.Config):
    """The Spark session the jobs run on."""

    master: str = Field(
        default="", description="Spark master URL. Empty: SPARK_MASTER or local[*]."
    )
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="More Spark settings (spark.executor.memory, spark.scheduler.pool, ...); "
        "they override the defaults.",
    )
    stop_after_run: bool = Field(
        default=True, description="Stop the session at the end of a run if this run started it."
    )


class StreamplatformResource(dg.ConfigurableResource):
    """Kafka, Spark, the Delta root and the state directory of the streaming jobs."""

    kafka: KafkaConnection = Field(default_factory=KafkaConnection)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    delta_root: str = Field(
        default="", description="Every job's tables live under <delta_root>/<application.id>/. "
        "Empty: .data/delta. Shared storage on a cluster (s3a://..., abfss://...).",
    )  # fmt: skip
    state_dir: str = Field(
        default="", description="Local state stores: <state_dir>/<application.id>/<task>/. "
        "Empty: resolved on each executor, STREAMPLATFORM_STATE_DIR or .data/state. A local "
        "disk of the executors on a cluster.",
    )  # fmt: skip

    _session: Any = PrivateAttr(default=None)
    _started_here: bool = PrivateAttr(default=False)

    def kafka_settings(self) -> dict[str, Any]:
        """Connection settings in Kafka's names, for StreamsConfig and the Kafka helpers."""
        servers = (self.kafka.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
                   or _local_broker())  # fmt: skip
        return {"bootstrap.servers": servers, **self.kafka.settings}

    def delta_root_path(self) -> str:
        return (self.delta_root or str(data_dir() / "delta")).rstrip("/")

    def state_dir_path(self) -> str:
        """The state dir as configured; empty: each executor's default (home.default_state_dir)."""
        return self.state_dir

    def job_settings(self, job: StreamingJobSpec) -> dict[str, Any]:
        """``job``'s StreamsConfig settings on this Kafka, Delta root and state dir."""
        return job.streams_settings(self.kafka_settings(), self.delta_root_path(),
                                    self.state_dir_path())  # fmt: skip

    def app_root(self, job: StreamingJobSpec) -> str:
        """Where ``job``'s tables live: ``<delta root>/<application.id>`` (its Delta sinks
        under their topic names, ``_offsets``, ``_commits``, ``_dlq``, ``_versions``, ...)."""
        return f"{self.delta_root_path()}/{job.app_id}"

    def end_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` of ``topic``."""
        return end_offsets(self.kafka_settings(), topic)

    @property
    def spark_session(self) -> Any:
        """This process's SparkSession, started on first use (module docstring)."""
        if self._session is None:
            from pyspark import SparkContext
            from pyspark.sql import SparkSession

            from streamplatform.spark import spark_session

            self._started_here = SparkContext._active_spark_context is None
            # A session already running here is used as it is (its JVM settings are fixed;
            # asking the builder again would only warn that they take no effect).
            self._session = None if self._started_here else SparkSession.getActiveSession()
        if self._session is None:
            self._session = spark_session(
                self.spark.master or None, app_name="streamplatform-dagster",
                extra=dict(self.spark.conf),
            )  # fmt: skip
        return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None and self._started_here and self.spark.stop_after_run:
            self._session.stop()
            if context.log is not None:
                context.log.info("Stopped the SparkSession this run started.")
        self._session = None


def _local_broker() -> str:
    state = running_broker()
    if state is None:
        raise ConnectionError(
            "No Kafka broker configured and none running locally: set the resource's "
            "kafka.bootstrap_servers (for example from KAFKA_BOOTSTRAP_SERVERS), or start one "
            f"with `streamplatform broker start` (data in {default_data_dir()})."
        )
    return state.bootstrap_servers
