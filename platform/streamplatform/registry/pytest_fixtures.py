"""A pytest fixture for tests against a real Schema Registry. Enable it in a ``conftest.py``:

    pytest_plugins = ["streamplatform.registry.pytest_fixtures"]

``schema_registry`` is one local registry (:class:`LocalRegistry`: Apicurio Registry with
Confluent's API) per test run; its ``.url`` is the ``schema.registry.url`` to give clients and
serdes. It is kept the way the broker fixture (streamplatform.kafka.pytest_fixtures) keeps its
broker, with the same helpers: a directory of the run's own under
``.data/test-registries/`` (or under ``$STREAMPLATFORM_DATA``), ``<pid>-<random>/`` with
``run.json`` (the run's pid and start) and the registry's data in ``registry/``; stopped and
removed when the run ends, also when tests fail, on Ctrl-C and on SIGTERM. A run that was
SIGKILLed leaves its directory behind; the next run's fixture stops that registry and removes
the directory, but only once that run is provably gone.

The registry needs Java 21+ (it need not be the default ``java``); without one, the tests that
use the fixture are skipped, saying why.
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
from streamplatform.registry.local_registry import (
    LocalRegistry,
    NoSuitableJava,
    registry_java,
    stop_registry,
)


def _stop_registry_in(directory: Path) -> None:
    stop_registry(directory / "registry")  # checks the registry's pid, start and command line


def remove_registries_of_ended_runs(runs: Path) -> list[Path]:
    """Stop the registries of test runs that are provably gone and remove their directories
    (the broker fixture's rules: nothing of a run that may still be going is touched)."""
    return remove_brokers_of_ended_runs(runs, stop=_stop_registry_in)


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[LocalRegistry]:
    """The run's local Schema Registry; ``.url`` is its ``schema.registry.url``."""
    try:
        registry_java()
    except NoSuitableJava as error:
        pytest.skip(str(error))
    if threading.current_thread() is threading.main_thread():
        # SIGTERM would end the run without finalizers; as an interrupt, they still run.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    runs = data_dir() / "test-registries"
    remove_registries_of_ended_runs(runs)
    directory = new_run_directory(runs)
    try:
        registry = LocalRegistry(directory / "registry", fresh=True)
        registry.start()
        try:
            yield registry
        finally:
            registry.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
