"""A pytest fixture for tests against a real S3-compatible server. Enable it in a
``conftest.py``:

    pytest_plugins = ["streamplatform.storage.pytest_fixtures"]

``s3_server`` is one local S3 server (:class:`LocalS3`: moto's S3 API, conditional writes made
atomic) per test run, with the bucket ``streamplatform``; ``.settings`` are the job settings
that reach it and ``.bucket`` the bucket. It is kept the way the broker fixture
(streamplatform.kafka.pytest_fixtures) keeps its broker, with the same helpers: a directory of
the run's own under ``.data/test-s3/`` (or under ``$STREAMPLATFORM_DATA``), stopped and removed
when the run ends, also when tests fail, on Ctrl-C and on SIGTERM; a SIGKILLed run's server is
stopped by the next run once that run is provably gone.
"""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamplatform.home import data_dir
from streamplatform.kafka.pytest_fixtures import (
    _raise_interrupt,
    new_run_directory,
    remove_brokers_of_ended_runs,
)
from streamplatform.storage.local_s3 import LocalS3, stop_s3


def _stop_s3_in(directory: Path) -> None:
    stop_s3(directory / "s3")  # checks the server's pid, start and command line


@pytest.fixture(scope="session")
def s3_server() -> Iterator[LocalS3]:
    """The run's local S3 server; ``.settings`` reach it, ``.bucket`` is its bucket."""
    try:
        import moto  # noqa: F401
    except ImportError:
        pytest.skip("moto is not installed (it comes with the dev tools: make setup)")
    if threading.current_thread() is threading.main_thread():
        # SIGTERM would end the run without finalizers; as an interrupt, they still run.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    runs = data_dir() / "test-s3"
    remove_brokers_of_ended_runs(runs, stop=_stop_s3_in)
    directory = new_run_directory(runs)
    try:
        with LocalS3(directory / "s3", fresh=True) as server:
            yield server
    finally:
        shutil.rmtree(directory, ignore_errors=True)
