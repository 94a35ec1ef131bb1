"""Shared fixtures: one Kafka broker and one SparkSession per test run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import settings

# CI runs the property tests with a fixed seed, so a run is repeatable; locally each run draws
# new examples and may find new counterexamples.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "default")

pytest_plugins = ["streamplatform.kafka.pytest_fixtures"]


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
