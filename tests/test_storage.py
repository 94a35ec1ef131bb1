"""The storage layer's settings and local files, without a server: one set of settings becomes
delta-rs' options, pyarrow's filesystem and Spark's S3A settings; a wrong root or endpoint
stops start-up naming the setting; secrets never show."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from streamplatform import storage
from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.spark import spark_conf

GIVEN = {
    "platform.delta.root": "s3://bucket/streams",
    "platform.storage.s3.endpoint": "http://127.0.0.1:9000",
    "platform.storage.s3.region": "eu-west-1",
    "platform.storage.s3.access.key.id": "AKIA-TEST",
    "platform.storage.s3.secret.access.key": "very-secret",
}


@pytest.fixture(autouse=True)
def _no_aws_environment(monkeypatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_one_set_of_settings_reaches_all_three_engines_alike():
    found = storage.s3_settings(StreamsConfig(GIVEN | {"application.id": "a"}))
    assert found.delta_options() == {
        "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ACCESS_KEY_ID": "AKIA-TEST", "AWS_SECRET_ACCESS_KEY": "very-secret",
    }  # fmt: skip
    spark = storage.spark_settings(GIVEN)
    assert spark["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert spark["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert spark["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert spark["spark.hadoop.fs.s3a.access.key"] == "AKIA-TEST"
    assert spark["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    # s3:// in Spark is S3A too: the same URI names the same table in both engines.
    assert spark["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    filesystem = found.arrow_filesystem()
    assert isinstance(filesystem, pafs.S3FileSystem) and filesystem.region == "eu-west-1"
    assert storage.spark_settings({"platform.delta.root": "/data/delta"}) == {}


def test_each_setting_falls_back_to_the_standard_aws_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://minio.example:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    found = storage.s3_settings({"platform.delta.root": "s3://b/x"})
    assert (found.endpoint, found.region, found.access_key_id) == (
        "https://minio.example:9000", "ap-south-1", "from-env")  # fmt: skip
    assert found.path_style  # an endpoint of one's own: path-style unless told otherwise
    assert found.delta_options()["AWS_ALLOW_HTTP"] == "false"
    # A setting given wins over the environment; AWS itself gets virtual-hosted requests.
    given = storage.s3_settings({"platform.storage.s3.access.key.id": "given",
                                 "platform.storage.s3.path.style.access": False})  # fmt: skip
    assert given.access_key_id == "given" and not given.path_style
    # What the driver ships to executors: resolved here, whatever their environment.
    assert storage.resolved_settings({})["platform.storage.s3.secret.access.key"] == "env-secret"


def test_a_wrong_root_or_endpoint_stops_start_up_naming_the_setting():
    with pytest.raises(ConfigError) as wrong:
        StreamsConfig({"application.id": "a", "platform.delta.root": "hdfs://nn/streams",
                       "platform.storage.s3.endpoint": "127.0.0.1:9000"})  # fmt: skip
    message = str(wrong.value)
    assert "platform.delta.root='hdfs://nn/streams'" in message and "hdfs://" in message
    assert "platform.storage.s3.endpoint='127.0.0.1:9000'" in message and "http://" in message
    with pytest.raises(ConfigError, match="no bucket"):
        StreamsConfig({"application.id": "a", "platform.delta.root": "s3:///streams"})
    for fine in ("/data/delta", "file:///data/delta", "s3a://b/x", "gs://b/x",
                 "abfss://c@account.dfs.core.windows.net/x"):  # fmt: skip
        StreamsConfig({"application.id": "a", "platform.delta.root": fine})


def test_credentials_never_show():
    config = StreamsConfig(
        GIVEN | {"application.id": "a", "platform.storage.s3.session.token": "token-123"}
    )
    shown = repr(config) + repr(storage.s3_settings(config))
    assert "very-secret" not in shown and "token-123" not in shown
    assert "AKIA-TEST" not in repr(storage.s3_settings(config))


def test_the_s3_jars_are_on_the_class_path_never_in_spark_jars():
    conf = spark_conf("local[1]", extra={"spark.executor.extraClassPath": "/opt/team.jar"})
    driver = conf.get("spark.driver.extraClassPath", "")
    if "hadoop-aws" not in driver:
        pytest.skip("the S3A jars are not fetched (.jvm/s3: make setup)")
    assert "bundle-" in driver
    assert "hadoop-aws" not in conf["spark.jars"] and "bundle-" not in conf["spark.jars"]
    # A caller's class path keeps the S3 jars.
    executor = conf["spark.executor.extraClassPath"].split(os.pathsep)
    assert executor[0] == "/opt/team.jar" and any("bundle-" in jar for jar in executor)


@pytest.mark.spark
def test_a_session_loads_s3a_without_copying_the_sdk(spark):
    # Spark copies each spark.jars entry into the session's userFiles directory; the SDK's
    # ~690 MB there per session filled a CI machine's disk once sessions were killed.
    from pyspark import SparkFiles

    if not spark_conf("local[1]").get("spark.driver.extraClassPath"):
        pytest.skip("the S3A jars are not fetched (.jvm/s3: make setup)")
    loaded = spark._jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3AFileSystem")
    assert loaded.getName() == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    copied = sorted(os.listdir(SparkFiles.getRootDirectory()))
    assert not [name for name in copied if name.startswith(("bundle-", "hadoop-aws"))], copied


def test_local_files_are_written_whole_listed_and_removed(tmp_path):
    directory = str(tmp_path / "run" / "side")
    storage.write_file(f"{directory}/0_1.arrow", lambda sink: sink.write(b"x" * 10))

    def fail(sink):
        sink.write(b"half")
        raise RuntimeError("killed half-way")

    with pytest.raises(RuntimeError):
        storage.write_file(f"{directory}/0_2.arrow", fail)
    assert storage.list_files(directory, ".arrow") == [f"{directory}/0_1.arrow"]  # no half
    assert list((tmp_path / "run" / "side").iterdir()) == [tmp_path / "run" / "side" / "0_1.arrow"]
    table = pa.table({"n": [1, 2]})
    storage.write_file(
        f"{directory}/0_3.parquet",
        lambda sink: __import__("pyarrow.parquet").parquet.write_table(table, sink),
    )
    assert storage.read_parquet(f"{directory}/0_3.parquet").equals(table)
    assert storage.list_directories(str(tmp_path)) == ["run"]
    storage.remove_tree(str(tmp_path / "run"))
    storage.remove_tree(str(tmp_path / "run"))  # gone already: nothing happens
    assert storage.list_files(directory, ".arrow") == []


def test_storage_settings_mean_the_same_from_python_the_cli_and_dagster(monkeypatch):
    from streamplatform.dagster import StreamingJobSpec, StreamplatformResource
    from tests.runtime.support import dedup_topology

    python = StreamsConfig(GIVEN | {"application.id": "a",
                                    "platform.storage.s3.path.style.access": True})  # fmt: skip
    cli = StreamsConfig(dict(setting.split("=", 1) for setting in [
        "application.id=a", "platform.delta.root=s3://bucket/streams",
        "platform.storage.s3.endpoint=http://127.0.0.1:9000",
        "platform.storage.s3.region=eu-west-1", "platform.storage.s3.access.key.id=AKIA-TEST",
        "platform.storage.s3.secret.access.key=very-secret",
        "platform.storage.s3.path.style.access=true",
    ]))  # fmt: skip
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker:9092")
    resource = StreamplatformResource(
        delta_root="s3://bucket/streams",
        storage={k: str(v) for k, v in GIVEN.items() if k.startswith("platform.storage.")}
        | {"platform.storage.s3.path.style.access": "true"},
    )  # fmt: skip
    spec = StreamingJobSpec(name="a", topology=lambda: dedup_topology("in", "out"))
    dagster = StreamsConfig(resource.job_settings(spec))
    assert dagster["platform.delta.root"] == "s3://bucket/streams"
    made = [storage.s3_settings(config) for config in (python, cli, dagster)]
    assert made[0] == made[1] == made[2]
    assert [storage.spark_settings(c) for c in (cli, dagster)] == [
        storage.spark_settings(python)
    ] * 2
    with pytest.raises(ConfigError, match="spark.master"):
        StreamplatformResource(storage={"spark.master": "local"}).storage_settings()
