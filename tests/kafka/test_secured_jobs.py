"""A job against a secured broker (LocalBroker(security=...)): one set of security settings, in
the Java client's names, reaches both of the platform's Kafka clients — librdkafka in the
tasks, the planner and the offsets (the direct path), and Spark's Java Kafka source (the
``cached`` path, with ``platform.sink.driver.max.records = 0``) — exactly once, with the
test driver's answer. And the password appears in nothing a run shows or stores.

Each security mode runs its own broker: SASL_SSL with SCRAM-SHA-512, mutual TLS, SASL_PLAINTEXT
with Kafka's unsecured OAUTHBEARER tokens."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from runtime.support import (
    dedup_topology,
    expected_with_the_test_driver,
    job_config,
    make_input,
    read_topic,
)

from streamplatform.config import ConfigError
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics
from streamplatform.runtime.microbatch import StreamingJob

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module", params=[
    ("sasl_ssl", "SCRAM-SHA-512"),
    pytest.param(("ssl", None), marks=pytest.mark.slow),
    pytest.param(("sasl_plaintext", "OAUTHBEARER"), marks=pytest.mark.slow),
], ids=["sasl_ssl-scram", "mtls", "sasl_plaintext-oauthbearer"])  # fmt: skip
def secured(request, secured_kafka_broker):
    """The run's broker with its clients' listener secured in the mode (the shared plugin's
    fixture, streamplatform.kafka.pytest_fixtures), and its client settings."""
    mode, mechanism = request.param
    broker = secured_kafka_broker(mode)
    return broker, broker.client_settings(*(m for m in [mechanism] if m))


@pytest.mark.parametrize("path", [
    "direct-driver",
    pytest.param("direct-spark", marks=pytest.mark.slow),
    pytest.param("cached", marks=pytest.mark.slow),
])  # fmt: skip
def test_a_job_on_a_secured_broker_runs_exactly_once_through_both_clients(
    spark, secured, tmp_path, path, caplog
):
    broker, settings = secured
    source, out = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    create_topics(
        settings, [TopicSpec(source, 3), TopicSpec(out, 1), TopicSpec(f"{source}-dlq", 1)]
    )
    sent = make_input(settings, source)
    overrides = {"platform.max.records.per.batch": 100_000}
    if path == "cached":  # Spark's own Kafka source reads the input: the Java client
        overrides["platform.sink.driver.max.records"] = 0
    if path == "direct-spark":  # the tasks on Spark's executors, the settings shipped to them
        overrides["platform.driver.tasks.max.records"] = 0
    config = job_config(settings, tmp_path, f"secured-{uuid.uuid4().hex[:6]}", source,
                        **overrides) | settings  # fmt: skip
    caplog.set_level(logging.DEBUG, logger="streamplatform")
    job = StreamingJob(dedup_topology(source, out), config, spark=spark)
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert {r.path for r in results} == {path}
    got = sorted((r.key, r.value) for r in read_topic(settings, out))
    assert got == expected_with_the_test_driver(source, sent)

    # Nothing a run shows or keeps holds a secret: logs, results, the job's repr, its
    # offset and commit logs (every file's bytes, and the rows of every Parquet file: a
    # secret in a compressed column is not in the file's bytes).
    secrets = [s for s in _secrets(broker) if s]
    root = Path(config["platform.delta.root"])
    shown = [caplog.text, repr(results), repr(job), repr(job.config)]
    shown += [p.read_bytes().decode(errors="replace") for p in root.rglob("*") if p.is_file()]
    tables = _parquet_rows_as_text(root)
    assert {"_offsets", "_commits"} <= tables.keys(), sorted(tables)  # the logs were read
    shown += tables.values()
    for secret in secrets:
        assert not any(secret in text for text in shown)


def _parquet_rows_as_text(root: Path) -> dict[str, str]:
    """The decoded rows of every Parquet file under ``root`` (data files and Delta checkpoints,
    of the offset and commit logs, changelogs and sinks), as text per top folder under the
    job's folder (``_offsets``, ``_commits``, ...). Files a later version removed are read too."""
    import pyarrow.parquet as pq

    def text(value: object) -> str:
        if isinstance(value, bytes):
            return value.decode(errors="replace")
        if isinstance(value, dict):
            return " ".join(f"{text(k)}={text(v)}" for k, v in value.items())
        if isinstance(value, list | tuple):
            return " ".join(text(v) for v in value)
        return str(value)

    tables: dict[str, str] = {}
    for path in sorted(root.rglob("*.parquet")):
        table = path.relative_to(root).parts[1]  # <root>/<application.id>/<table>/...
        tables[table] = tables.get(table, "") + text(pq.read_table(path).to_pylist())
    return tables


def _secrets(broker: LocalBroker) -> list[str]:
    """The password of the broker's SCRAM user and its private keys' PEM bodies."""
    from streamplatform.kafka import local_security

    material = local_security.prepare(broker.directory / "security")
    keys = [path.read_text().split("-----")[2].strip()[:40]
            for path in (material.client_pem, material.broker_pem)]  # fmt: skip
    return [material.password, *keys]


POISON = [b"{poison"] * 3  # support.make_input's poison records: one DLQ record each


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    """A SASL_SSL broker with ACLs, shared by this module's ACL tests: its clients' user may do
    only what was granted. Each test grants on topics of its own names; the wildcard grants
    (GROUP, TRANSACTIONAL_ID, and DESCRIBE on every topic, which the first test grants only
    after checking its absence) give no test a READ or a WRITE that another checks is missing."""
    directory = tmp_path_factory.mktemp("acls") / "broker"
    with LocalBroker(directory, security="sasl_ssl", acls=True) as broker:
        yield broker


def _nothing_committed(delta_root: Path, app: str) -> bool:
    commits = delta_root / app / "_commits"
    return not commits.exists() or not list(commits.glob("*.parquet"))


@pytest.mark.slow  # ~40 s: the ACL broker (its start), two runs of a job
def test_a_principal_without_write_on_the_sink_gets_one_clear_line_and_nothing_doubles(
    spark, acl_broker, tmp_path
):
    """The job's user may read its source and write its DLQ but not its sink: the batch fails
    with one line naming the topic and the ACL to grant, nothing is committed; once the ACL is
    granted the same job runs the batch again, and the sink and the DLQ hold each record once
    (the failed attempt's DLQ records were in its aborted transaction)."""
    from streamplatform.runtime.kafka_output import KafkaOutputError

    broker = acl_broker
    settings, admin = broker.client_settings(), broker.admin_settings
    source, out = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    create_topics(admin, [TopicSpec(source, 3), TopicSpec(out, 1),
                          TopicSpec(f"{source}-dlq", 1)])  # fmt: skip
    sent = make_input(admin, source)
    broker.grant("TOPIC", source, "READ")  # READ and WRITE imply DESCRIBE
    broker.grant("TOPIC", f"{source}-dlq", "WRITE")
    broker.grant("GROUP", "*", "ALL")
    broker.grant("TRANSACTIONAL_ID", "*", "ALL")
    app = f"acl-{uuid.uuid4().hex[:6]}"
    config = job_config(settings, tmp_path, app, source,
                        **{"platform.max.records.per.batch": 100_000}) | settings  # fmt: skip
    # A sink it may not even see: Kafka lists it as if it did not exist; the start says why.
    with pytest.raises(ConfigError, match=rf"not authorized to DESCRIBE topic\(s\) {out} "):
        StreamingJob(dedup_topology(source, out), config, spark=spark)
    broker.grant("TOPIC", "*", "DESCRIBE")
    job = StreamingJob(dedup_topology(source, out), config, spark=spark)
    try:
        with pytest.raises(KafkaOutputError) as failed:
            job.run_until_caught_up()
    finally:
        job.close()
    line = str(failed.value)
    assert "\n" not in line and f"not authorized to write to {out}" in line
    assert f"ALLOW WRITE (and DESCRIBE) on topic {out}" in line
    assert read_topic(admin, out) == []  # nothing committed
    assert read_topic(admin, f"{source}-dlq") == []
    assert _nothing_committed(tmp_path / "delta", app)

    broker.grant("TOPIC", out, "WRITE")
    job = StreamingJob(dedup_topology(source, out), config, spark=spark)
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert results and results[0].batch_id == 0  # the failed batch, run again whole
    got = sorted((r.key, r.value) for r in read_topic(admin, out))
    assert got == expected_with_the_test_driver(source, sent)  # each record once
    assert [r.value for r in read_topic(admin, f"{source}-dlq")] == POISON


@pytest.mark.slow  # the ACL broker above (shared), two runs of a job
def test_a_principal_without_read_on_the_source_gets_one_clear_line_and_nothing_is_committed(
    spark, acl_broker, tmp_path
):
    """The job's user may see its source (DESCRIBE) and write its sink and DLQ but not read
    the source: the batch fails with one line naming the topic and the ACL to grant; nothing is
    committed, nothing reaches the sink or the DLQ. Once READ is granted the batch runs whole."""
    from streamplatform.runtime.kafka_input import KafkaInputError

    broker = acl_broker
    settings, admin = broker.client_settings(), broker.admin_settings
    source, out = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    dlq = f"{source}-dlq"
    create_topics(admin, [TopicSpec(source, 3), TopicSpec(out, 1), TopicSpec(dlq, 1)])
    sent = make_input(admin, source)
    broker.grant("TOPIC", source, "DESCRIBE")  # it is seen (the start's check passes), not read
    broker.grant("TOPIC", out, "WRITE")
    broker.grant("TOPIC", dlq, "WRITE")
    broker.grant("GROUP", "*", "ALL")
    broker.grant("TRANSACTIONAL_ID", "*", "ALL")
    app = f"acl-read-{uuid.uuid4().hex[:6]}"
    config = job_config(settings, tmp_path, app, source,
                        **{"platform.max.records.per.batch": 100_000}) | settings  # fmt: skip
    job = StreamingJob(dedup_topology(source, out), config, spark=spark)
    try:
        with pytest.raises(KafkaInputError) as failed:
            job.run_until_caught_up()
    finally:
        job.close()
    line = str(failed.value)
    assert "\n" not in line and f"ALLOW READ (and DESCRIBE) on topic {source}" in line
    assert "nothing of the batch is committed" in line
    assert read_topic(admin, out) == [] and read_topic(admin, dlq) == []
    assert _nothing_committed(tmp_path / "delta", app)

    broker.grant("TOPIC", source, "READ")
    job = StreamingJob(dedup_topology(source, out), config, spark=spark)
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert results and results[0].batch_id == 0  # the failed batch, run again whole
    got = sorted((r.key, r.value) for r in read_topic(admin, out))
    assert got == expected_with_the_test_driver(source, sent)
    assert [r.value for r in read_topic(admin, dlq)] == POISON


@pytest.mark.slow  # a child driver with its own Spark
@pytest.mark.child_process
def test_streamplatform_run_takes_the_settings_file_and_prints_no_secret(secured, tmp_path):
    """`streamplatform run --command-config client.properties`, as Kafka's tools take one: the
    job runs against the secured broker, and nothing it prints (settings, progress lines, the
    summary) holds the password or key material."""
    import subprocess

    from test_cli import console_command, env_without_pythonpath, team_module

    from streamplatform.kafka import producer

    broker, settings = secured
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"upper-{uuid.uuid4().hex[:6]}"
    create_topics(settings, [TopicSpec(source, 1)])
    writer = producer(settings)
    for n in range(5):
        writer.produce(source, key=f"k{n}", value=f"v{n}")
    assert writer.flush(30) == 0
    properties = tmp_path / "client.properties"
    properties.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    app = f"cli-secured-{uuid.uuid4().hex[:6]}"
    job = {"application.id": app, "platform.delta.root": str(tmp_path / "delta"),
           "state.dir": str(tmp_path / "state"), "platform.spark.master": "local[1]"}  # fmt: skip
    command = console_command("run", team_module(tmp_path, source, sink), job,
                              "--delta-sink", sink, "--command-config", str(properties),
                              "--until-caught-up")  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=env_without_pythonpath(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    progress = [line for line in done.stdout.splitlines() if line.startswith("batch ")]
    assert progress and progress[0].startswith("batch 0: 5 in, 5 out, ")
    for secret in (s for s in _secrets(broker) if s):
        assert secret not in done.stdout and secret not in done.stderr
