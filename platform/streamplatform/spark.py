"""The SparkSession factory: local by default, Delta enabled, jars from ``.jvm/spark/``.

``spark_conf()`` is a pure function (settings in, dict out) so the same settings feed a plain
session here, the Dagster integration's ``StreamplatformResource``, and a cluster submit.
``spark_session()`` starts (or returns) the process's session.

JVM-start settings (``spark.jars``, driver memory, Java options) only take effect for the first
session of a process; Spark ignores them on later ``getOrCreate`` calls.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from streamplatform.home import data_dir, jars_in, jvm_dir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_MASTER = "local[*]"

_LOG4J2 = Path(__file__).with_name("log4j2.properties")
# A jar's artifact name without its version: "delta-storage-4.4.0.jar" -> "delta-storage".
_VERSION_SUFFIX = re.compile(r"-\d[\w.\-]*\.jar$")


def _artifact(jar: Path) -> str:
    return _VERSION_SUFFIX.sub("", jar.name)


def spark_jars() -> list[Path]:
    """Jars from ``.jvm/spark/`` that pyspark does not already ship.

    Maven resolves Delta's and the Kafka connector's transitive dependencies too (Hadoop, Jackson,
    Parquet, Scala...). pyspark's own copies are the versions Spark was built against, so those
    artifacts are left out and only what pyspark lacks reaches ``spark.jars``.
    """
    import pyspark

    bundled = {_artifact(jar) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [jar for jar in jars_in("spark") if _artifact(jar) not in bundled]


def s3_classpath() -> str:
    """Hadoop's S3A and the AWS SDK from ``.jvm/s3/`` as one class path ("" when they were not
    fetched). They go on the driver's and executors' class path where they lie, never into
    ``spark.jars``: Spark copies every ``spark.jars`` entry, ``local:`` ones included, into each
    session's and executor's ``userFiles`` directory, and the SDK alone is ~690 MB. A session
    killed before it stops leaves that copy behind in the temporary directory. A cluster's
    hosts need the jars at the same path."""
    return os.pathsep.join(str(jar) for jar in sorted(jvm_dir("s3").glob("*.jar")))


def spark_conf(
    master: str | None = None,
    app_name: str = "streamplatform",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Settings for a Delta- and Kafka-capable session.

    ``master`` defaults to ``$SPARK_MASTER`` or ``local[*]``. ``extra`` overrides anything here.
    """
    master = master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    local = master.startswith("local")
    spark_data = data_dir() / "spark"
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.jars": ",".join(str(jar) for jar in spark_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": str(spark_data / "warehouse"),
        "spark.driver.extraJavaOptions": (
            f"-Dderby.system.home={spark_data / 'derby'} -Dlog4j2.configurationFile={_LOG4J2}"
        ),
        "spark.ui.showConsoleProgress": "false",
        # Python workers must run the interpreter that has pandas and pyarrow (the virtualenv's).
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # A micro-batch caches its tasks' output once and reads it a few times within seconds
        # (sinks, changelog, progress): compressing it costs CPU the tasks need (~8-10% of a
        # batch's throughput measured on 2 cores; bench/RESULTS.md).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if local:
        # Small data on 2 cores: the default 200 shuffle partitions is mostly scheduling overhead.
        conf |= {
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "4",
            "spark.ui.enabled": "false",
            # Nothing local listens beyond loopback.
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "2g",
            "spark.databricks.delta.snapshotPartitions": "2",
        }
    s3 = s3_classpath()
    if s3:
        conf |= {"spark.driver.extraClassPath": s3, "spark.executor.extraClassPath": s3}
    extra = dict(extra or {})
    for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
        # A class path the caller adds extends the S3 one rather than dropping it.
        if s3 and key in extra:
            extra[key] = os.pathsep.join([extra[key], s3])
    conf |= extra
    return conf


def spark_session(
    master: str | None = None,
    app_name: str = "streamplatform",
    extra: Mapping[str, str] | None = None,
    log_level: str = "WARN",
) -> SparkSession:
    """Start (or return) this process's SparkSession with :func:`spark_conf` settings."""
    from pyspark.sql import SparkSession

    remote = _connect_url(master)
    if remote is not None:
        # Spark Connect (Databricks serverless and standard/shared clusters): the server owns
        # the JVM, its jars, Delta settings and the Python workers' interpreter; a client can
        # neither set them (static confs) nor reach a SparkContext for setLogLevel.
        return SparkSession.builder.remote(remote).getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if (master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER).startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    for key, value in spark_conf(master, app_name, extra).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    return session


def _connect_url(master: str | None) -> str | None:
    """``sc://...`` from ``master``, or ``$SPARK_REMOTE`` when no master is given: a Connect
    session. None for a classic session (its JVM in this process)."""
    if master and master.startswith("sc://"):
        return master
    if not master and os.environ.get("SPARK_REMOTE"):
        return os.environ["SPARK_REMOTE"]
    return None


def read_kafka_ranges(
    spark: SparkSession,
    settings: Mapping[str, str],
    ranges: Mapping[str, Mapping[int, tuple[int, int]]],
) -> DataFrame:
    """Read exactly ``{topic: {partition: (start, end)}}`` (end exclusive), headers included,
    committed records only (``read_committed``: transaction markers and aborted records leave
    gaps in the offsets).

    One Spark partition per Kafka partition; columns ``key, value, topic, partition, offset,
    timestamp, timestampType, headers``. Connection settings (``bootstrap.servers``,
    ``security.protocol``, ``sasl.*``, ``ssl.*``) are passed to the Java client as ``kafka.*``.
    """
    from streamplatform.kafka.clients import connection_settings

    if not ranges:
        raise ValueError("read_kafka_ranges needs at least one topic partition range.")
    starting = {
        topic: {str(p): start for p, (start, _) in parts.items()} for topic, parts in ranges.items()
    }
    ending = {
        topic: {str(p): end for p, (_, end) in parts.items()} for topic, parts in ranges.items()
    }
    reader = (
        spark.read.format("kafka")
        .option("assign", json.dumps({topic: sorted(parts) for topic, parts in ranges.items()}))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
        # Committed records only: an aborted transaction's records are never read, and a
        # range never reaches past the last stable offset (the plan stops there too).
        .option("kafka.isolation.level", "read_committed")
    )
    for key, value in connection_settings(settings).items():
        if key != "client.id":
            reader = reader.option(f"kafka.{key}", str(value))
    return reader.load()
