"""The broker fixture's directories: each test run has its own, and a run only ever removes
what it made or what belongs to a run that is provably gone (no broker needed here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamplatform import processes
from streamplatform.kafka.pytest_fixtures import (
    RUN_FILE,
    new_run_directory,
    remove_brokers_of_ended_runs,
    run_has_ended,
)


@pytest.fixture
def other_run():
    """A live process standing for a concurrent test run."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait(10)


def _gone_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(10)
    return process.pid


def _run_directory(runs, name: str, pid: int, started: str):
    directory = runs / name
    (directory / "broker").mkdir(parents=True)
    (directory / RUN_FILE).write_text(json.dumps({"pid": pid, "started": started}))
    return directory


def test_each_run_gets_a_directory_of_its_own_recording_who_made_it(tmp_path):
    first, second = new_run_directory(tmp_path), new_run_directory(tmp_path)
    assert first != second and first.name.startswith(f"{os.getpid()}-")
    record = json.loads((first / RUN_FILE).read_text())
    assert record == {"pid": os.getpid(), "started": processes.start_mark(os.getpid())}
    assert not run_has_ended(first)
    assert remove_brokers_of_ended_runs(tmp_path) == []
    assert first.is_dir() and second.is_dir()


def test_only_directories_of_runs_that_are_provably_gone_are_removed(tmp_path, other_run):
    live, mark = other_run.pid, processes.start_mark(other_run.pid)
    gone = _gone_pid()
    kept = {
        "ours": new_run_directory(tmp_path),
        "concurrent run": _run_directory(tmp_path, f"{live}-abc", live, mark),
        # A concurrent run between creating its directory and recording itself in it.
        "concurrent run, not recorded yet": tmp_path / f"{live}-def",
        "earlier version's run, going": tmp_path / str(live),
        "unreadable record of a run going": tmp_path / f"{live}-ghi",
        "not a run's": tmp_path / "notes",
    }
    for directory in kept.values():
        directory.mkdir(exist_ok=True)
    (kept["unreadable record of a run going"] / RUN_FILE).write_text('{"pid": ')
    removed = {
        "ended run": _run_directory(tmp_path, f"{gone}-jkl", gone, "12345"),
        # The recorded pid now runs another, later process.
        "reused pid": _run_directory(tmp_path, f"{live}-mno", live, str(int(mark) - 1)),
        "earlier version's run, ended": tmp_path / str(gone),
    }
    removed["earlier version's run, ended"].mkdir()

    assert sorted(remove_brokers_of_ended_runs(tmp_path)) == sorted(removed.values())
    assert {what for what, directory in kept.items() if not directory.is_dir()} == set()
    assert {what for what, directory in removed.items() if directory.exists()} == set()
