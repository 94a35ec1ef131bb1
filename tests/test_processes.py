"""streamplatform.processes: start times, reused pids, zombies, command lines, groups, sessions
and children, with psutil (no broker, no Spark)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamplatform import processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", "sleeper-marker"]


@pytest.fixture
def child():
    """A child process that sleeps in a session (and process group) of its own."""
    process = subprocess.Popen(SLEEPER, start_new_session=True)
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(10)


def _gone_pid() -> int:
    """The pid of a process that ran and was reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(10)
    return process.pid


def test_the_start_of_this_process_is_stable_and_the_same_seen_from_another_process():
    mine = processes.start_mark(os.getpid())
    assert mine.isdigit() and mine == processes.start_mark(os.getpid())
    started = processes.start_time(os.getpid())
    assert started is not None and started <= time.time()
    # What a later process reads for this pid (the job claim's check of a holder): the same.
    code = "import os, streamplatform.processes as p; print(p.start_mark(os.getppid()))"
    seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert seen.stdout.strip() == mine


def test_a_child_started_later_has_a_later_start(child):
    mine, theirs = processes.start_time(os.getpid()), processes.start_time(child.pid)
    assert mine is not None and theirs is not None and theirs >= mine
    assert int(processes.start_mark(child.pid)) >= int(processes.start_mark(os.getpid()))
    assert processes.is_running(child.pid, processes.start_mark(child.pid))


def test_a_pid_that_is_gone_has_no_start_and_does_not_run():
    pid = _gone_pid()
    assert processes.start_time(pid) is None
    assert processes.start_mark(pid) == ""
    assert not processes.is_running(pid)
    assert not processes.is_running(pid, "12345")
    assert processes.command_line(pid) == []
    assert processes.live([pid, os.getpid()]) == {os.getpid()}
    assert not processes.is_running(0) and not processes.is_running(-1)


def test_a_reused_pid_is_not_the_process_recorded(child):
    """A pid handed to a later process: the same pid, another start. Recorded with the mark of
    the earlier process, it counts as gone."""
    mark = processes.start_mark(child.pid)
    assert processes.is_running(child.pid, mark)
    assert not processes.is_running(child.pid, str(int(mark) - 1))  # an earlier process's
    assert processes.is_running(child.pid)  # without a mark: the pid runs


def test_a_zombie_does_not_run(child):
    child.kill()
    deadline = time.monotonic() + 10  # exited, not reaped yet: a zombie
    while not processes.snapshot()[child.pid].zombie:
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.02)
    assert not processes.is_running(child.pid)
    assert processes.live([child.pid]) == set()
    assert child.pid not in processes.children(os.getpid())
    assert child.pid not in processes.session_members(child.pid)


def test_command_line_children_groups_and_sessions(child):
    assert processes.command_line(child.pid) == SLEEPER
    assert child.pid in processes.children(os.getpid())
    assert processes.group_members(child.pid) == {child.pid}
    assert processes.session_members(child.pid) == {child.pid}
    me = processes.snapshot()[os.getpid()]
    assert (me.ppid, me.pgid, me.sid, me.zombie) == (
        os.getppid(), os.getpgid(0), os.getsid(0), False)  # fmt: skip
    theirs = processes.snapshot()[child.pid]
    assert (theirs.ppid, theirs.pgid, theirs.sid) == (os.getpid(), child.pid, child.pid)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux only: /proc")
def test_on_linux_the_mark_is_what_earlier_versions_read_from_proc(child):
    """Job claims recorded by earlier versions hold /proc's start time: still comparable."""
    for pid in (os.getpid(), child.pid):
        stat = Path(f"/proc/{pid}/stat").read_text()
        assert processes.start_mark(pid) == stat.rsplit(")", 1)[1].split()[19]
