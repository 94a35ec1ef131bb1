"""The local KRaft broker: serves metadata, stops its whole process group, never leaks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil
import pytest
from live_processes import group_members

from streamplatform.kafka import LocalBroker, TopicSpec, create_topics, describe_topics
from streamplatform.kafka.local_broker import _cluster_id, read_state, running_broker


def _alive(pid: int) -> bool:
    try:
        # A zombie has exited and only waits to be reaped: it is dead for our purposes.
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_broker_serves_metadata_and_creates_topics(kafka_settings, topic_name):
    assert create_topics(kafka_settings, [TopicSpec(topic_name, partitions=3)]) == [topic_name]
    assert describe_topics(kafka_settings, [topic_name]) == {topic_name: 3}
    # Creating it again is not an error and creates nothing.
    assert create_topics(kafka_settings, [TopicSpec(topic_name, partitions=3)]) == []


def test_missing_topic_is_an_error_naming_it(kafka_settings):
    with pytest.raises(LookupError, match="no-such-topic"):
        describe_topics(kafka_settings, ["no-such-topic"])


def test_broker_listens_on_loopback_only(kafka_broker):
    host, _ = kafka_broker.bootstrap_servers.split(":")
    assert host == "127.0.0.1"
    config = (kafka_broker.directory / "server.properties").read_text()
    assert "0.0.0.0" not in config


@pytest.mark.slow  # ~15 s: two brokers of its own
def test_stop_ends_the_whole_process_group_and_a_stale_broker_is_stopped(tmp_path):
    directory = tmp_path / "broker"
    first = LocalBroker(directory)
    first.start()
    first_pid = first.state.pid
    assert group_members(first_pid), "the broker runs in a process group of its own"

    # The owner "dies" without stopping its broker; the next start on that directory finds it.
    second = LocalBroker(directory)
    second.start()
    second_pid = second.state.pid
    try:
        assert not _alive(first_pid)
        assert group_members(first_pid) == []
        assert running_broker(directory).pid == second_pid
    finally:
        second.stop()
    assert not _alive(second_pid)
    assert group_members(second_pid) == []
    assert running_broker(directory) is None
    assert read_state(directory) is None


@pytest.mark.slow  # ~10-15 s: a child pytest and a broker of its own
def test_fixture_stops_the_broker_even_when_a_test_fails(tmp_path):
    """Run a failing test that uses the fixture in a child pytest; no broker may survive it."""
    pid_file = tmp_path / "pid"
    test_file = tmp_path / "test_fails.py"
    test_file.write_text(
        textwrap.dedent(f"""
        pytest_plugins = ["streamplatform.kafka.pytest_fixtures"]

        def test_uses_broker_then_fails(kafka_broker):
            open({str(pid_file)!r}, "w").write(str(kafka_broker.state.pid))
            assert False, "deliberate failure"
        """)
    )
    env = os.environ | {"STREAMPLATFORM_DATA": str(tmp_path / "data")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "deliberate failure" in result.stdout
    pid = int(pid_file.read_text())
    assert not _alive(pid)
    assert group_members(pid) == []
    assert list((tmp_path / "data" / "test-brokers").iterdir()) == [], "the run's directory"


@pytest.mark.slow  # ~13 s: a broker of its own through the CLI
def test_cli_start_status_stop(tmp_path):
    env = os.environ | {"STREAMPLATFORM_DATA": str(tmp_path)}
    cli = [sys.executable, "-m", "streamplatform.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, env=env, timeout=180)

    assert run("broker", "status").returncode == 3
    started = run("broker", "start")
    try:
        assert started.returncode == 0, started.stderr
        assert "bootstrap.servers=127.0.0.1:" in started.stdout
        status = run("broker", "status")
        assert status.returncode == 0 and "Running: pid" in status.stdout
        assert "Already running" in run("broker", "start").stdout
        assert run("topics", "create", "cli-topic", "--partitions", "2").returncode == 0
        assert "cli-topic\t2" in run("topics", "list").stdout
        pid = read_state(tmp_path / "broker").pid
    finally:
        stopped = run("broker", "stop")
    assert "Stopped." in stopped.stdout
    assert run("broker", "status").returncode == 3
    assert not _alive(pid)


def test_cluster_ids_never_look_like_an_option():
    ids = {_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


@pytest.mark.slow  # ~15 s: a secured broker of its own through the CLI
def test_cli_starts_a_secured_broker_that_the_topic_tools_reach(tmp_path):
    """`broker start --security sasl_ssl`: the clients' settings are written to a file only its
    owner reads, shown without the password; the topic tools find them by themselves, and
    a client with the wrong password or no TLS is turned away."""
    env = os.environ | {"STREAMPLATFORM_DATA": str(tmp_path)}
    cli = [sys.executable, "-m", "streamplatform.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, env=env, timeout=180)

    started = run("broker", "start", "--security", "sasl_ssl")
    try:
        assert started.returncode == 0, started.stderr
        properties = tmp_path / "broker" / "client.properties"
        assert properties.stat().st_mode & 0o777 == 0o600
        settings = dict(line.split("=", 1) for line in properties.read_text().splitlines())
        password = settings["sasl.jaas.config"].split('password="')[1].split('"')[0]
        assert "sasl.jaas.config=[hidden]" in started.stdout and password not in started.stdout
        assert run("topics", "create", "secured", "--partitions", "2").returncode == 0
        assert "secured\t2" in run("topics", "list").stdout
        bootstrap = ["--bootstrap-servers", settings["bootstrap.servers"]]
        wrong = tmp_path / "wrong.properties"
        wrong.write_text(properties.read_text().replace(password, "not-the-password"))
        refused = run("topics", "list", *bootstrap, "--command-config", str(wrong))
        assert refused.returncode != 0 and "secured" not in refused.stdout
        good = run("topics", "list", *bootstrap, "--command-config", str(properties))
        assert "secured\t2" in good.stdout, good.stderr
    finally:
        run("broker", "stop")


@pytest.mark.slow  # ~15 s: a broker with ACLs of its own through the CLI
def test_cli_grants_acls_on_a_broker_started_with_them(tmp_path):
    """`broker start --security sasl_ssl --acls`: the clients' user may do nothing until
    `broker grant` allows it; then the same command succeeds. ``--acls`` alone is refused."""
    env = os.environ | {"STREAMPLATFORM_DATA": str(tmp_path)}
    cli = [sys.executable, "-m", "streamplatform.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, env=env, timeout=180)

    alone = run("broker", "start", "--acls")
    assert alone.returncode != 0 and "needs --security" in alone.stderr
    assert (
        run("broker", "grant", "--topic", "t", "--operation", "READ").returncode == 1
    )  # none runs
    started = run("broker", "start", "--security", "sasl_ssl", "--acls")
    try:
        assert started.returncode == 0, started.stderr
        assert "ACLs on" in started.stdout
        refused = run("topics", "create", "orders", "--partitions", "2")
        assert refused.returncode != 0 and "orders" not in run("topics", "list").stdout
        assert refused.stderr.strip().splitlines() == [
            "streamplatform topics: Could not create topic 'orders': Authorization failed. (the "
            "principal needs ALLOW CREATE on topic orders or on the cluster)"
        ]  # one line, no stack trace
        both = run("broker", "grant", "--topic", "orders", "--group", "g", "--operation", "ALL")
        assert both.returncode != 0 and "one of --topic" in both.stderr
        granted = run("broker", "grant", "--topic", "ord", "--prefixed",
                      "--operation", "CREATE", "--operation", "DESCRIBE")  # fmt: skip
        assert granted.returncode == 0, granted.stderr
        assert "CREATE, DESCRIBE on topic ord (names starting with it)" in granted.stdout
        assert run("topics", "create", "orders", "--partitions", "2").returncode == 0
        assert "orders\t2" in run("topics", "list").stdout
        assert run("topics", "create", "other").returncode == 1  # not granted: refused
    finally:
        run("broker", "stop")
