"""The job claim (one driver per application.id) on a Delta table, without Spark or Kafka."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pyarrow as pa
import pytest

from streamplatform import JobClaimedError, JobFencedError, storage
from streamplatform.runtime import delta_direct
from streamplatform.runtime.claim import JobClaim
from streamplatform.runtime.logs import COMMITS_SCHEMA, CommitLog

ROW = pa.schema([("batch_id", pa.int64())])


_MADE: list[JobClaim] = []


def claim(path, **options) -> JobClaim:
    made = JobClaim(str(path), "app", ROW, **options)
    _MADE.append(made)
    return made


@pytest.fixture(autouse=True)
def _release_every_claim():
    """A claim a test leaves held keeps its heartbeat going: past the test, and on S3 past the
    run's S3 server, whose absence it would retry for minutes at exit."""
    yield
    while _MADE:
        _MADE.pop().release()


def append(holder: JobClaim, batch_id: int) -> None:
    holder.append(pa.table({"batch_id": pa.array([batch_id], pa.int64())}), "app-commits", batch_id)


def rows(path) -> list[int]:
    return sorted(delta_direct.read(str(path)).column("batch_id").to_pylist())


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def claim_root(request, tmp_path) -> str:
    """Where the claimed table lives: a local directory, or the local S3 server's bucket (the
    claim's commits are then conditional puts)."""
    if request.param == "local":
        return str(tmp_path)
    server = request.getfixturevalue("s3_server")
    # s3a://, as Hadoop users write it (the job tests use s3://): the same bucket to delta-rs.
    root = f"s3a://{server.bucket}/claims-{uuid.uuid4().hex[:8]}"
    storage.configure({"platform.delta.root": root, **server.settings})
    return root


def test_a_second_claim_is_refused_naming_the_holder(claim_root):
    first = claim(f"{claim_root}/c")
    assert first.acquire() == 1
    try:
        with pytest.raises(JobClaimedError) as refused:
            claim(f"{claim_root}/c").acquire()
        message = str(refused.value)
        assert "app" in message and first.run in message and f"pid {os.getpid()}" in message
        assert "platform.claim.wait.ms" in message
    finally:
        first.release()
    assert claim(f"{claim_root}/c").acquire() == 2  # released: the next driver gets it


def test_a_waiting_claim_gets_the_job_when_the_holder_releases_it(claim_root):
    first = claim(f"{claim_root}/c")
    first.acquire()
    threading.Timer(1.0, first.release).start()
    started = time.monotonic()
    second = claim(f"{claim_root}/c", wait_ms=30_000)
    assert second.acquire() == 2
    assert time.monotonic() - started >= 0.9
    second.release()


def test_a_holder_that_lost_its_claim_cannot_commit(claim_root):
    path = f"{claim_root}/c"
    old = claim(path, lease_ms=1_000)
    old.acquire()
    append(old, 0)
    # The old holder stalls (no heartbeat, as if its process were paused) past its lease.
    old._stop.set()
    old._heartbeat.join()
    time.sleep(1.2)
    new = claim(path, lease_ms=1_000)
    assert new.acquire() == 2
    with pytest.raises(JobFencedError, match="lost its claim"):
        append(old, 1)
    append(new, 1)
    assert rows(path) == [0, 1]  # the fenced commit wrote nothing
    old.release()  # a fenced holder writes nothing when it lets go...
    with pytest.raises(JobClaimedError):  # ...and claiming again is refused while the new runs
        old.acquire()
    new.release()
    assert old.acquire() == 3
    old.release()


def test_the_holder_renews_its_claim_while_it_does_not_commit(claim_root):
    holder = claim(f"{claim_root}/c", lease_ms=1_000)
    holder.acquire()
    time.sleep(2.5)  # more than two leases without a commit
    with pytest.raises(JobClaimedError):
        claim(f"{claim_root}/c", lease_ms=1_000).acquire()
    append(holder, 0)  # its own commits still go through after the heartbeats
    holder.release()


def test_a_crashed_holder_on_this_host_is_taken_over_at_once(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, pyarrow as pa
        from streamplatform.runtime.claim import JobClaim
        JobClaim({str(tmp_path / "c")!r}, "app", pa.schema([("batch_id", pa.int64())])).acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    started = time.monotonic()
    holder = claim(tmp_path / "c", lease_ms=60_000)
    assert holder.acquire() == 2  # the lease has not run out, but its process is gone
    assert time.monotonic() - started < 10
    holder.release()


EXIT_WITHOUT_RELEASE = """
import atexit, threading
def heartbeats_left():  # registered first, so it runs after the library's exit handlers
    left = [t.name for t in threading.enumerate() if t.name == "app-claim" and t.is_alive()]
    print("heartbeats left at teardown:", left, flush=True)
atexit.register(heartbeats_left)
import time, pyarrow as pa
from streamplatform.runtime.claim import JobClaim
JobClaim({path!r}, "app", pa.schema([("batch_id", pa.int64())]), lease_ms=30).acquire()
time.sleep(0.3)  # a 30 ms lease: the heartbeat commits every 10 ms, the exit comes during one
print("exiting without release", flush=True)
"""


@pytest.mark.parametrize("run", range(3))
def test_a_process_that_exits_holding_a_claim_stops_its_heartbeat_first(tmp_path, run):
    """A driver that ends without close() (a script, a failed run) stops its claim's heartbeat
    at exit, while the interpreter still works. Left running, the heartbeat thread was ended
    by the interpreter's teardown in the middle of a delta-rs commit, and the process crashed
    with SIGSEGV after its work was done (the test suite's own exit, in 2 of 4 runs). The
    first assertion catches the crash when the exit meets a commit; the second, which does
    not depend on timing, that no heartbeat is left when the teardown begins."""
    script = EXIT_WITHOUT_RELEASE.format(path=str(tmp_path / "c"))
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert child.returncode == 0, child.stdout + child.stderr
    assert "exiting without release" in child.stdout
    assert "heartbeats left at teardown: []" in child.stdout, child.stdout
    # Not released (that is close()'s commit), but its process is gone: taken over at once.
    holder = claim(tmp_path / "c", lease_ms=60_000)
    assert holder.acquire() == 2
    holder.release()


def test_two_drivers_claiming_at_once_get_one_claim(claim_root):
    delta_direct.create_table(f"{claim_root}/c", ROW)
    outcomes: list[str] = []
    winners: list[JobClaim] = []
    barrier = threading.Barrier(4)

    def contend() -> None:
        contender = claim(f"{claim_root}/c")
        barrier.wait()
        try:
            contender.acquire()
            outcomes.append("won")
            winners.append(contender)
        except JobClaimedError:
            outcomes.append("refused")

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert sorted(outcomes) == ["refused"] * 3 + ["won"]
        assert delta_direct.open_table(f"{claim_root}/c").transaction_version("app-epoch") == 1
    finally:
        for winner in winners:  # its heartbeat would outlive the test (and the S3 server)
            winner.release()


def test_a_commit_log_append_goes_through_the_claim(claim_root):
    holder = JobClaim(f"{claim_root}/_commits", "app", COMMITS_SCHEMA)
    log = CommitLog(f"{claim_root}/_commits", "app", holder)
    with pytest.raises(RuntimeError, match="not claimed"):
        log.append(0, {("t", 0): 3}, {}, "exactly_once_v2")
    holder.acquire()
    log.append(0, {("t", 0): 3}, {"records_in": 3}, "exactly_once_v2")
    assert log.last().consumed == {("t", 0): 3}
    holder.release()


def test_a_live_holder_in_another_process_is_refused_and_one_whose_pid_was_reused_is_not(tmp_path):
    """The holder's start time, recorded by it and read for its pid by another process (psutil,
    Linux and macOS), tells the live holder from a later process that was handed its pid."""
    from streamplatform.runtime.claim import _process_alive, _process_started

    script = textwrap.dedent(f"""
        import time, pyarrow as pa
        from streamplatform.runtime.claim import JobClaim
        JobClaim({str(tmp_path / "c")!r}, "app", pa.schema([("batch_id", pa.int64())]),
                 lease_ms=60_000).acquire()
        print("claimed", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "claimed"
        with pytest.raises(JobClaimedError, match=f"pid {child.pid} "):
            claim(tmp_path / "c", lease_ms=60_000).acquire()
        started = _process_started(child.pid)
        assert started and _process_alive(child.pid, started)
        assert not _process_alive(child.pid, str(int(started) - 1))  # an earlier process's pid
    finally:
        child.kill()
        child.wait(10)
    assert not _process_alive(child.pid, started)
