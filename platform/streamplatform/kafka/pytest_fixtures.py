"""Pytest fixtures for tests against a real broker. Enable them in a ``conftest.py``:

    pytest_plugins = ["streamplatform.kafka.pytest_fixtures"]

``kafka_broker`` is one local KRaft broker per test run, in a directory of its own under
``.data/test-brokers/`` (or under ``$STREAMPLATFORM_DATA``): ``<pid>-<random>/``, created
atomically by the run (so no two runs, nor two sessions in one process, ever share one), with
``run.json`` recording the run's pid and when that process started, and the broker's data in
``broker/``. It is stopped and its directory removed when the run ends, also when tests fail,
on Ctrl-C and on SIGTERM.

``secured_kafka_broker`` is a factory of brokers whose clients' listener is secured, as a
team's brokers are: ``secured_kafka_broker("sasl_ssl")`` (or ``"ssl"``: mutual TLS;
``"sasl_plaintext"``) starts one on the first call for that mode and returns the same one on
the run's later calls; each is stopped and its directory removed when the run ends, and each
lives in a run directory of its own, under the same rules as ``kafka_broker``'s. Its
``client_settings(mechanism)`` are what a job needs (the security settings in the Java client's
names, the password and keys of its ``security/`` folder); ``admin_settings`` reach its own
plaintext listener as a super user, for a test's set-up. Parametrize over the modes with a
fixture of one's own::

    @pytest.fixture(params=["sasl_ssl", "ssl"])
    def secured_settings(request, secured_kafka_broker):
        return secured_kafka_broker(request.param).client_settings()

A broker with ACLs is not shared this way (its grants are one test's set-up):
``LocalBroker(directory, security="sasl_ssl", acls=True)`` in a fixture of the module.

A run that was SIGKILLed leaves its directory behind; the next run's start stops that broker
and removes the directory, but only when its run is provably gone: the recorded pid runs no
more, or runs a later process (its start time differs from the recorded one). A directory
whose run may still be going (its process runs, or cannot be told) is never touched, nor is
anything that this fixture did not create.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamplatform.home import data_dir
from streamplatform.kafka.local_broker import LocalBroker, stop_broker
from streamplatform.processes import is_running, start_mark

RUN_FILE = "run.json"  # in each run's directory: {"pid": ..., "started": start_mark(pid)}
_RUN_DIRECTORY = re.compile(r"(\d+)(-.+)?")  # <pid>-<random>; <pid> alone: earlier versions


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _finalizers_on_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():
        # SIGTERM would end the run without finalizers; as an interrupt, they still run.
        signal.signal(signal.SIGTERM, _raise_interrupt)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[LocalBroker]:
    _finalizers_on_sigterm()
    runs = data_dir() / "test-brokers"
    remove_brokers_of_ended_runs(runs)
    directory = new_run_directory(runs)
    try:
        broker = LocalBroker(directory / "broker", fresh=True)
        broker.start()
        try:
            yield broker
        finally:
            broker.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def secured_kafka_broker() -> Iterator[Callable[[str], LocalBroker]]:
    """``secured_kafka_broker(mode)``: the run's broker whose clients' listener is secured in
    ``mode`` (``sasl_ssl``, ``ssl``, ``sasl_plaintext``: local_security.MODES), started on the
    first call for it. One broker per mode, not per call: a JVM each, for the whole run."""
    started: dict[str, tuple[LocalBroker, Path]] = {}

    def broker_for(mode: str) -> LocalBroker:
        if mode in started:
            return started[mode][0]
        _finalizers_on_sigterm()
        runs = data_dir() / "test-brokers"
        remove_brokers_of_ended_runs(runs)
        directory = new_run_directory(runs)
        try:
            broker = LocalBroker(directory / "broker", fresh=True, security=mode)
            broker.start()
        except BaseException:
            _stop_brokers_in(directory)  # a start that failed half-way: no JVM left behind
            shutil.rmtree(directory, ignore_errors=True)
            raise
        started[mode] = (broker, directory)
        return broker

    try:
        yield broker_for
    finally:
        for broker, directory in started.values():
            try:
                broker.stop()
            finally:
                shutil.rmtree(directory, ignore_errors=True)


def new_run_directory(runs: Path) -> Path:
    """A new directory of this test run under ``runs``, recording who owns it."""
    runs.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=runs))
    record = {"pid": os.getpid(), "started": start_mark(os.getpid())}
    partial = directory / f"{RUN_FILE}.partial"
    partial.write_text(json.dumps(record))
    partial.replace(directory / RUN_FILE)  # whole or not at all for a run reading it
    return directory


def run_has_ended(directory: Path) -> bool:
    """True when the test run that made ``directory`` is provably gone.

    With ``run.json``: its pid runs no more, or runs a process that started at another time
    (the pid was reused). Without it (a run between creating its directory and recording
    itself, or an earlier version's ``<pid>/``): the pid in the directory's name runs no more.
    Anything else (a name that holds no pid) is not a run's directory: False."""
    try:
        record = json.loads((directory / RUN_FILE).read_text())
        pid, started = int(record["pid"]), str(record["started"])
    except (OSError, ValueError, KeyError, TypeError):
        named = _RUN_DIRECTORY.fullmatch(directory.name)
        return named is not None and not is_running(int(named.group(1)))
    return not is_running(pid, started)


def _stop_brokers_in(directory: Path) -> None:
    stop_broker(directory / "broker")  # each checks the broker's command line first
    stop_broker(directory)  # an earlier version's layout: the broker in <pid>/ itself


def remove_brokers_of_ended_runs(
    runs: Path, stop: Callable[[Path], object] = _stop_brokers_in
) -> list[Path]:
    """Stop the brokers of test runs that are provably gone (SIGKILLed) and remove their
    directories; returns those removed. Directories of runs that may still be going, and
    anything not made by this fixture, are left alone. ``stop(directory)`` stops what such a
    run left running in its directory (default: its broker; the Schema Registry fixture
    passes its own)."""
    removed = []
    for directory in sorted(runs.iterdir()) if runs.is_dir() else ():
        if not directory.is_dir() or not run_has_ended(directory):
            continue
        stop(directory)
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
    return removed


@pytest.fixture(scope="session")
def kafka_settings(kafka_broker: LocalBroker) -> dict[str, str]:
    """Connection settings for the test broker."""
    return {"bootstrap.servers": kafka_broker.bootstrap_servers}
