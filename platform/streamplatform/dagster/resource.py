"""StreamplatformResource: one Dagster resource with everything a streaming job runs on.

It nests the Kafka connection, the Spark session, the Delta root and the state directory, so
an asset, op or sensor of the integration takes one resource, not five. Nothing needs setting
locally: an empty ``kafka.bootstrap_servers`` is ``KAFKA_BOOTSTRAP_SERVERS`` or else the broker of
`streamplatform broker start`, Spark's master is ``SPARK_MASTER`` or ``local[*]``, empty paths are
``.data/delta`` and ``.data/state`` (``STREAMPLATFORM_DATA`` moves both).

The SparkSession comes from dagster-pyspark: ``spark`` is a ``LazyPySparkResource`` (a nested
resource, shown with its settings in the UI) whose ``spark_config`` is the platform's
(:func:`platform_pyspark`: :func:`streamplatform.spark.spark_conf`'s Delta extensions, the Kafka
connector's jars from ``.jvm/spark/``, and the driver's own Python for the workers,
``spark.pyspark.python``), so that Spark's Python workers find ``streamplatform`` without any
environment set by hand. It starts on first use (a sensor that only reads Kafka offsets never
starts a JVM), once per run: every step of a run in one process shares it. A session this
resource started is stopped at the end of the run; one that was already running in the
process (a test suite's, a notebook's) is used and left running.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr

from streamplatform import storage
from streamplatform.config import ConfigError
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
        description="More client settings in the Java client's (Kafka Streams') names: "
        "security.protocol, sasl.mechanism, ssl.truststore.type, ssl.truststore.location, "
        "ssl.keystore.location, client.id, ... (docs/security.md). Secrets go in the fields "
        "below, from EnvVar.",
    )
    sasl_jaas_config: str = Field(
        default="", description="sasl.jaas.config (holds the password or client secret): "
        'EnvVar("KAFKA_SASL_JAAS_CONFIG"), say.',
    )  # fmt: skip
    ssl_truststore_password: str = Field(default="", description="ssl.truststore.password")
    ssl_keystore_password: str = Field(default="", description="ssl.keystore.password")
    ssl_key_password: str = Field(default="", description="ssl.key.password")
    ssl_keystore_key: str = Field(
        default="", description="ssl.keystore.key: the client's private key inline, as PEM "
        "(with ssl.keystore.type=PEM and ssl.keystore.certificate.chain in settings); a secret "
        'like a password: EnvVar("KAFKA_SSL_KEY_PEM"), say.',
    )  # fmt: skip

    def secrets(self) -> dict[str, str]:
        """The secret settings given, in Kafka's names."""
        given = {"sasl.jaas.config": self.sasl_jaas_config,
                 "ssl.truststore.password": self.ssl_truststore_password,
                 "ssl.keystore.password": self.ssl_keystore_password,
                 "ssl.key.password": self.ssl_key_password,
                 "ssl.keystore.key": self.ssl_keystore_key}  # fmt: skip
        return {key: value for key, value in given.items() if value}


class SchemaRegistryConnection(dg.Config):
    """The Schema Registry of the jobs' registry serdes (Serdes.avro, protobuf, json_schema)."""

    url: str = Field(
        default="",
        description="schema.registry.url. Empty: SCHEMA_REGISTRY_URL, or else the local "
        "registry of `streamplatform registry start` when one runs (else no registry).",
    )
    settings: dict[str, str] = Field(
        default_factory=dict,
        description="More registry settings in Confluent's names: basic.auth.credentials.source, "
        "basic.auth.user.info (give it as an EnvVar), schema.registry.ssl.ca.location, "
        "auto.register.schemas, value.subject.name.strategy, value.schema.id.serializer, ...",
    )


APP_NAME = "streamplatform-dagster"


def platform_pyspark(
    master: str = "", conf: Mapping[str, str] | None = None
) -> LazyPySparkResource:
    """dagster-pyspark's ``LazyPySparkResource`` with the platform's Spark settings.

    ``master``: the Spark master URL; empty: ``SPARK_MASTER``, else ``local[*]``
    (``sc://...``, or ``SPARK_REMOTE`` with no master: a Spark Connect session, whose server
    owns its jars and settings). ``conf``: more Spark settings (``spark.executor.memory``,
    ``spark.scheduler.pool``, ...), over the platform's (:func:`streamplatform.spark.spark_conf`:
    Delta, the jars of ``.jvm/spark/``, ``spark.pyspark.python``)."""
    from streamplatform.spark import _connect_url, spark_conf

    remote = _connect_url(master or None)
    if remote is not None:
        return LazyPySparkResource(spark_config={"spark.remote": remote})
    return LazyPySparkResource(spark_config=spark_conf(master or None, APP_NAME, conf))


class StreamplatformResource(dg.ConfigurableResource):
    """Kafka, Spark, the Delta root and the state directory of the streaming jobs."""

    kafka: KafkaConnection = Field(default_factory=KafkaConnection)
    schema_registry: SchemaRegistryConnection = Field(default_factory=SchemaRegistryConnection)
    spark: LazyPySparkResource = Field(
        description="The SparkSession's resource (dagster-pyspark). Default: "
        "platform_pyspark(), the platform's settings on SPARK_MASTER or local[*]."
    )
    delta_root: str = Field(
        default="", description="Every job's tables live under <delta_root>/<application.id>/. "
        "Empty: .data/delta. Shared storage on a cluster (s3a://..., abfss://...).",
    )  # fmt: skip
    storage: dict[str, str] = Field(
        default_factory=dict, description="The Delta root's storage settings for every job "
        "(`platform.storage.s3.*`: endpoint, region, keys); each falls back to the standard "
        "AWS environment variable (docs/cluster.md).",
    )  # fmt: skip
    state_dir: str = Field(
        default="", description="Local state stores: <state_dir>/<application.id>/<task>/. "
        "Empty: resolved on each executor, STREAMPLATFORM_STATE_DIR or .data/state. A local "
        "disk of the executors on a cluster.",
    )  # fmt: skip
    stop_spark_after_run: bool = Field(
        default=True,
        description="Stop the SparkSession at the end of a run if this run started it.",
    )

    _session: Any = PrivateAttr(default=None)
    _started_here: bool = PrivateAttr(default=False)

    def __init__(self, *, spark: LazyPySparkResource | None = None, **fields: Any) -> None:
        # A nested resource cannot have a default in Dagster's config schema: the platform's
        # session is the default here.
        fields["spark"] = platform_pyspark() if spark is None else spark
        super().__init__(**fields)

    def kafka_settings(self) -> dict[str, Any]:
        """Connection settings in Kafka's names, for StreamsConfig and the Kafka helpers."""
        servers = (self.kafka.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
                   or _local_broker())  # fmt: skip
        return {"bootstrap.servers": servers, **self.kafka.settings, **self.kafka.secrets()}

    def registry_settings(self) -> dict[str, Any]:
        """The registry's settings in Confluent's names (none when there is no registry)."""
        url = (self.schema_registry.url or os.environ.get("SCHEMA_REGISTRY_URL")
               or _local_registry())  # fmt: skip
        return ({"schema.registry.url": url} if url else {}) | dict(self.schema_registry.settings)

    def delta_root_path(self) -> str:
        return (self.delta_root or str(data_dir() / "delta")).rstrip("/")

    def state_dir_path(self) -> str:
        """The state dir as configured; empty: each executor's default (home.default_state_dir)."""
        return self.state_dir

    def job_settings(self, job: StreamingJobSpec) -> dict[str, Any]:
        """``job``'s StreamsConfig settings on this Kafka, Delta root and state dir."""
        return job.streams_settings(
            self.kafka_settings() | self.registry_settings() | self.storage_settings(),
            self.delta_root_path(), self.state_dir_path(),
        )  # fmt: skip

    def storage_settings(self) -> dict[str, Any]:
        """``storage``, checked: only ``platform.storage.*`` settings belong there."""
        wrong = sorted(k for k in self.storage if not k.startswith("platform.storage."))
        if wrong:
            raise ConfigError(f"StreamplatformResource.storage: {', '.join(wrong)} are not "
                              "storage settings (platform.storage.*)")  # fmt: skip
        return dict(self.storage)

    def app_root(self, job: StreamingJobSpec) -> str:
        """Where ``job``'s tables live: ``<delta root>/<application.id>`` (its Delta sinks
        under their topic names, ``_offsets``, ``_commits``, ``_dlq``, ``_versions``, ...)."""
        return f"{self.delta_root_path()}/{job.app_id}"

    def query_state(self, job: StreamingJobSpec, batch: int | None = None) -> Any:
        """A :class:`streamplatform.state_query.StateQuery` of ``job``'s committed stores on
        this Delta root, as of ``batch`` (default: the last committed), for an asset or an op
        that reads a running job's state (close it, or use it in a ``with``)::

            with streamplatform.query_state(orders) as state:
                counts = dict(state.store("counts").all())

        No Kafka is asked: the stores are restored from the job's Delta changelog."""
        from streamplatform.state_query import StateQuery

        settings = job.streams_settings(self.registry_settings() | self.storage_settings(),
                                        self.delta_root_path(), self.state_dir_path())  # fmt: skip
        return StateQuery(job.load_topology(), settings, batch=batch)

    def end_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` of ``topic``."""
        return end_offsets(self.kafka_settings(), topic)

    @property
    def spark_session(self) -> Any:
        """This run's SparkSession, from ``spark`` on first use (module docstring)."""
        if self._session is None:
            from pyspark import SparkContext

            started_here = SparkContext._active_spark_context is None
            if self.spark.spark_config.get("spark.master", "").startswith("local"):
                os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            self._session = self.spark.spark_session
            self._started_here = started_here
            # Assets and checks read the jobs' tables: on object storage, with its settings.
            root_settings = {"platform.delta.root": self.delta_root_path(),
                             **self.storage_settings()}  # fmt: skip
            storage.configure_spark(self._session, root_settings)
        return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None and self._started_here and self.stop_spark_after_run:
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


def _local_registry() -> str | None:
    """The URL of the local registry of ``streamplatform registry start``, if one runs."""
    from streamplatform.registry.local_registry import running_registry

    state = running_registry()
    return None if state is None else state.url
