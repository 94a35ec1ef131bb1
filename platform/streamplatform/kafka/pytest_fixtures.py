"""Pytest fixtures for tests against a real broker. Enable them in a ``conftest.py``:

    pytest_plugins = ["streamplatform.kafka.pytest_fixtures"]

``kafka_broker`` is one local KRaft broker per test run, in ``.data/test-brokers/<pid>`` (or
under ``$STREAMPLATFORM_DATA``), so two runs of one checkout at the same time do not meet. It is
stopped when the run ends, also when tests fail, on Ctrl-C and on SIGTERM; a broker left behind
by a run that was SIGKILLed is stopped, and its directory removed, by the next run's start.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamplatform.home import data_dir
from streamplatform.kafka.local_broker import LocalBroker, stop_broker


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[LocalBroker]:
    if threading.current_thread() is threading.main_thread():
        # SIGTERM would end the run without finalizers; as an interrupt, they still run.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    runs = data_dir() / "test-brokers"
    _remove_brokers_of_ended_runs(runs)
    broker = LocalBroker(runs / str(os.getpid()), fresh=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(broker.directory, ignore_errors=True)


def _remove_brokers_of_ended_runs(runs: Path) -> None:
    """Stop the brokers of test runs whose process is gone (SIGKILLed) and remove their data."""
    for directory in runs.glob("*") if runs.is_dir() else ():
        if directory.name.isdigit() and Path(f"/proc/{directory.name}").exists():
            continue  # a run still going
        stop_broker(directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_settings(kafka_broker: LocalBroker) -> dict[str, str]:
    """Connection settings for the test broker."""
    return {"bootstrap.servers": kafka_broker.bootstrap_servers}
