"""The Spark settings and the jar lookup, without starting Spark."""

from __future__ import annotations

import pytest

from streamplatform.kafka import LocalBroker
from streamplatform.spark import spark_conf, spark_jars


def test_only_jars_that_pyspark_lacks_reach_spark_jars():
    names = [jar.name for jar in spark_jars()]
    assert any(name.startswith("delta-spark_4.2_2.13-") for name in names)
    assert any(name.startswith("spark-sql-kafka-0-10_2.13-") for name in names)
    assert any(name.startswith("kafka-clients-3.") for name in names)
    # pyspark ships these; a second, older copy on the classpath would be a conflict.
    for bundled in ("jackson-databind", "scala-library", "hadoop-client-runtime", "log4j-core"):
        assert not any(name.startswith(bundled + "-") for name in names), bundled


def test_local_conf_has_delta_and_loopback_defaults():
    conf = spark_conf()
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert int(conf["spark.sql.shuffle.partitions"]) <= 8


def test_cluster_master_keeps_cluster_defaults_and_extra_wins():
    conf = spark_conf(master="spark://cluster:7077", extra={"spark.executor.memory": "8g"})
    assert conf["spark.master"] == "spark://cluster:7077"
    assert "spark.driver.bindAddress" not in conf
    assert "spark.sql.shuffle.partitions" not in conf
    assert conf["spark.executor.memory"] == "8g"


def test_missing_jars_say_run_make_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMPLATFORM_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make setup"):
        spark_conf()
    with pytest.raises(FileNotFoundError, match=r"\.jvm/kafka.*make setup"):
        LocalBroker(tmp_path / "broker").start()
