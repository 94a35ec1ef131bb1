"""Pytest fixtures for tests against a real broker. Enable them in a ``conftest.py``:

    pytest_plugins = ["streamplatform.kafka.pytest_fixtures"]

``kafka_broker`` is one local KRaft broker per test run, in ``.data/test-broker`` (or under
``$STREAMPLATFORM_DATA``). It is stopped when the run ends, also when tests fail, on Ctrl-C and
on SIGTERM; a broker left behind by a run that was SIGKILLed is stopped by the next run's start.
Two test runs of one checkout at the same time would share that directory: don't.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from streamplatform.home import data_dir
from streamplatform.kafka.local_broker import LocalBroker


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[LocalBroker]:
    if threading.current_thread() is threading.main_thread():
        # SIGTERM would end the run without finalizers; as an interrupt, they still run.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    broker = LocalBroker(data_dir() / "test-broker", fresh=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_settings(kafka_broker: LocalBroker) -> dict[str, str]:
    """Connection settings for the test broker."""
    return {"bootstrap.servers": kafka_broker.bootstrap_servers}
