"""Shared fixtures: one Kafka broker, one Schema Registry, one S3 server and one SparkSession
per test run (each started by the first test that needs it)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import jvm_class_archive
import pytest
from hypothesis import settings
from process_markers import fail_on_missing_markers

# CI runs the property tests with a fixed seed, so a run is repeatable; locally each run draws
# new examples and may find new counterexamples.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "default")

# Every Spark driver JVM of the run (this process's session, the child drivers of the
# crash-point tests, the Spark Connect server: all start through spark-submit, which adds
# $SPARK_SUBMIT_OPTS) compiles with C1 only and collects with the serial collector. Test jobs
# are short and small: on the machine's 2 cores, C2's compiler threads and G1's concurrent
# threads took CPU from the job and the tests, and the crash-point tests ran 23% faster
# without them (8 of test_streaming_job's, 167-171 s against 127-134 s, alternating runs).
# Semantics do not depend on them; the benchmarks (bench/) keep the JVM's defaults. A value
# set by whoever runs the tests is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# Markers of tests that start Spark driver JVMs of their own; a run with enough of them builds
# the class archive those JVMs start from (jvm_class_archive.py).
CHILD_JVM_MARKERS = ("child_process", "cluster", "connect_server", "dagster_dev")
ARCHIVE_WORTH_TESTS = 5

pytest_plugins = [
    "streamplatform.kafka.pytest_fixtures",
    "streamplatform.registry.pytest_fixtures",
    "streamplatform.storage.pytest_fixtures",
    "pytester",
    "ci_skips",
]


@pytest.fixture(scope="session", autouse=True)
def spark_scratch_in_the_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every Spark JVM and Python worker of the run (this process's and its children's) keeps
    its scratch (``spark-*``, ``blockmgr-*``) under the run's temporary directory, which pytest
    prunes, instead of /tmp: a JVM killed by a test never removes its own."""
    if "SPARK_LOCAL_DIRS" not in os.environ:
        scratch = tmp_path_factory.mktemp("spark-scratch", numbered=False)
        os.environ["SPARK_LOCAL_DIRS"] = str(scratch)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: every collected test is checked
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a heavy process of its own (a child driver, a Spark cluster or
    Connect server, dagster dev, a browser) must carry the marker that says so: `make test`
    deselects those markers, and stays fast only if none is missing. The test's source (and
    its fixtures', and the helpers of the tests beside this file that they name) is read by
    tests/process_markers.py; a missing marker is a usage error."""
    fail_on_missing_markers(items, Path(__file__).parent)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the run's tests are known and before any Spark JVM starts: every driver JVM of the
    run maps its classes from the class archive (jvm_class_archive.py), built first when the
    run starts enough JVMs to repay it and there is none yet."""
    if session.config.option.collectonly or not session.items:
        return
    children = sum(
        any(item.get_closest_marker(name) for name in CHILD_JVM_MARKERS) for item in session.items
    )
    options, said = jvm_class_archive.prepare(
        os.environ["SPARK_SUBMIT_OPTS"], build=children >= ARCHIVE_WORTH_TESTS
    )
    if options:
        os.environ["SPARK_SUBMIT_OPTS"] += " " + options
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(said)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The run's SparkSession (local[2], Delta, Kafka connector), stopped at the end."""
    from streamplatform.spark import spark_session

    session = spark_session(master="local[2]", app_name="streamplatform-tests")
    yield session
    session.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name of its own for each test, so tests sharing the broker never collide."""
    return f"{request.node.name[:40]}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")


@pytest.fixture(autouse=True)
def _close_kept_task_readers() -> Iterator[None]:
    """After each test, close the Kafka consumers this process kept for task reads (a job
    closes its own; a test that never closes its job leaves them): closed while the test's
    broker still runs, they do not retry a stopped broker until the run's exit."""
    yield
    from streamplatform.runtime import kafka_input

    kafka_input.close_consumers()
