"""Processes on this machine, through psutil: the same code on Linux and macOS.

The library finds its own processes again later (the local broker, a Spark cluster's daemons,
the holder of a job claim, the broker of a test run), often from another process and after the
pid may have been handed to an unrelated one. A pid alone does not tell; a pid and the moment
its process started do. Here:

- :func:`start_mark` is that moment as a stable string, to record next to a pid and compare
  later. It is the process's start in clock ticks since boot (``psutil.Process.create_time()``
  minus ``psutil.boot_time()``, times ``SC_CLK_TCK``): on Linux exactly the ``starttime`` field
  of ``/proc/<pid>/stat`` that earlier versions recorded, so their records still compare equal,
  and unlike the wall-clock ``create_time()`` it does not move when the system clock is set;
- :func:`is_running` is "that process still runs": the pid exists, is not a zombie (a zombie
  has exited and only waits for its parent to reap it), and, given a mark, started then.
  Where this user may not look at the process (another user's, on macOS) it counts as running:
  nothing here takes a process for gone without proof;
- :func:`command_line`, :func:`snapshot` (pid -> parent, process group, session, zombie, for
  walking a session or a tree of children) and :func:`live` (which of some pids still run);
- for the local servers (the broker, the registry), each the leader of a process group of its
  own: :func:`stop_group` (SIGTERM, then SIGKILL), :func:`reap`, :func:`log_tail`,
  :class:`ServerRecord` (its state file: found again, checked, stopped) and
  :class:`LocalServer` (a context manager over ``start``/``stop``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import psutil

T = TypeVar("T")

log = logging.getLogger(__name__)

# Clock ticks per second: the unit of start marks (100 on Linux and macOS).
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None when there is no such
    process or it may not be looked at."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def start_mark(pid: int) -> str:
    """When process ``pid`` started, as a string that is the same whenever and from whichever
    process it is read, and different for a later process with the same pid: its start in
    clock ticks since boot. "" when there is no such process or it may not be looked at."""
    started = start_time(pid)
    if started is None:
        return ""
    return str(round((started - psutil.boot_time()) * _TICKS))


def is_running(pid: int, mark: str = "") -> bool:
    """True while process ``pid`` runs (a zombie has exited: it does not) and, when ``mark``
    is given, is the process that :func:`start_mark` gave ``mark`` for (not a later one that
    was handed the same pid). A process this user may not look at counts as running."""
    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:  # includes ZombieProcess
        return False
    except psutil.AccessDenied:
        return True
    if not mark:
        return True
    now = start_mark(pid)
    return now == mark or now == ""  # "": it exited just now, or may not be looked at


def live(pids: Iterable[int]) -> set[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    return {pid for pid in pids if is_running(pid)}


def command_line(pid: int) -> list[str]:
    """The arguments process ``pid`` was started with; [] when it is gone, a zombie, or may
    not be looked at."""
    try:
        return list(psutil.Process(pid).cmdline())
    except psutil.Error:
        return []


@dataclass(frozen=True)
class ProcessInfo:
    """One process of :func:`snapshot`."""

    ppid: int
    pgid: int
    sid: int
    zombie: bool


def snapshot() -> dict[int, ProcessInfo]:
    """Every process on the machine that this user may see: pid -> parent, process group,
    session, and whether it is a zombie. Processes that exit while it is taken are left out."""
    table: dict[int, ProcessInfo] = {}
    for process in psutil.process_iter(["ppid", "status"]):
        pid = process.pid
        if pid <= 0:  # macOS lists the kernel as pid 0; getpgid(0) would be our own group
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            ppid = process.info["ppid"]
            status = process.info["status"]
            if ppid is None or status is None:  # exited, or not to be looked at
                continue
            table[pid] = ProcessInfo(
                ppid=int(ppid),
                pgid=os.getpgid(pid),
                sid=os.getsid(pid),
                zombie=status == psutil.STATUS_ZOMBIE,
            )
    return table


def children(pid: int) -> set[int]:
    """The live (non-zombie) descendants of process ``pid``: its children, theirs, ..."""
    try:
        found = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    return live(child.pid for child in found)


def group_members(pgid: int) -> set[int]:
    """The live (non-zombie) processes of process group ``pgid``."""
    return {pid for pid, info in snapshot().items() if info.pgid == pgid and not info.zombie}


def session_members(sid: int) -> set[int]:
    """The live (non-zombie) processes of session ``sid``."""
    return {pid for pid, info in snapshot().items() if info.sid == sid and not info.zombie}


# --- Local servers (the broker, the registry): one process group each -------------------------


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group that ``pid`` leads (a server started in a session of its own),
    if it is still there."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``done`` every 0.1 s for up to ``timeout_s``: whether it came true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.1)
    return done()


def stop_group(pid: int, gone: Callable[[], bool], timeout_s: float, what: str) -> bool:
    """SIGTERM to the group of ``pid``, SIGKILL when ``gone()`` is not true within
    ``timeout_s``: whether it exited on SIGTERM (a clean exit)."""
    signal_group(pid, signal.SIGTERM)
    if wait_until(gone, timeout_s):
        return True
    log.warning("%s pid %s did not stop in %.0f s; killing its group", what, pid, timeout_s)
    signal_group(pid, signal.SIGKILL)
    wait_until(gone, 5.0)
    return False


def reap(process: subprocess.Popen | None) -> None:
    """Wait for a child server that was told to stop, so that it leaves no zombie (SIGKILL to
    its group if it is still there after 5 s)."""
    if process is None:
        return
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        signal_group(process.pid, signal.SIGKILL)
        process.wait(timeout=5)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a server's output file ("(no output)" without one)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def record_state(path: Path, state: Any) -> None:
    """Write a server's state (a dataclass) to ``path`` as JSON, whole or not at all: a process
    reading it meanwhile sees the old file or the new one."""
    partial = path.with_name(f"{path.name}.partial")
    partial.write_text(json.dumps(asdict(state)))
    partial.replace(path)


def recorded_state(path: Path, kind: type[T]) -> T | None:
    """The state recorded in ``path`` as a ``kind``; None when none (or an unreadable one) is."""
    try:
        return kind(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def runs_with_marker(pid: int, started: str, marker: str) -> bool:
    """True when process ``pid`` still runs (not a zombie), is the one that was started (its
    start mark: not a later process given the same pid), and has ``marker`` in its command
    line (the server of one data directory)."""
    return is_running(pid, started) and marker in command_line(pid)


@dataclass(frozen=True)
class ServerRecord:
    """How one kind of local server (the broker, the registry, the S3 server) records itself in
    its data directory, and the one implementation of finding and stopping it there: its state
    file (a dataclass with ``pid`` and ``started``, :func:`start_mark`), the marker on its
    command line followed by the directory, the state's type and the default directory."""

    what: str  # in messages: "broker", "Schema Registry", "local S3 server"
    state_file: str
    marker: str
    kind: type
    default_dir: Callable[[], Path]

    def directory(self, directory: Path | None = None) -> Path:
        return (directory or self.default_dir()).resolve()

    def read(self, directory: Path | None = None) -> Any:
        """The server recorded in ``directory``, or None when none is recorded."""
        return recorded_state(self.directory(directory) / self.state_file, self.kind)

    def record(self, directory: Path, state: Any) -> None:
        record_state(directory / self.state_file, state)

    def is_ours(self, state: Any, directory: Path) -> bool:
        """The recorded process still runs, is the one that was started (not a later one given
        the same pid) and is this kind of server of ``directory``."""
        return runs_with_marker(state.pid, state.started, f"{self.marker}{directory}")

    def running(self, directory: Path | None = None) -> Any:
        """The server recorded in ``directory`` if it is still running, else None."""
        directory = self.directory(directory)
        state = self.read(directory)
        return state if state is not None and self.is_ours(state, directory) else None

    def stop(
        self, directory: Path | None = None, timeout_s: float = 20.0,
        after: Callable[[Any, bool | None], None] | None = None,
    ) -> bool:  # fmt: skip
        """Stop the server recorded in ``directory`` (SIGTERM to its process group, SIGKILL
        after ``timeout_s``): True when one was running; a stale state file is removed and
        nothing is signalled. ``after(state, exited_cleanly)`` runs before the file goes
        (``exited_cleanly`` None: the recorded one was not running)."""
        directory = self.directory(directory)
        state = self.running(directory)
        if state is None:
            if after is not None and (stale := self.read(directory)) is not None:
                after(stale, None)
        else:  # the server leads its own process group (start_new_session)
            exited = stop_group(state.pid, lambda: not self.is_ours(state, directory),
                                timeout_s, self.what)  # fmt: skip
            if after is not None:
                after(state, exited)
        (directory / self.state_file).unlink(missing_ok=True)
        return state is not None


class LocalServer:
    """A server of this machine in ``directory``, one process group (the broker, the
    registry). ``fresh=True`` wipes the directory before starting (tests); ``fresh=False``
    keeps its data across restarts. ``heap_mb``: the JVM's heap limit; ``properties``: the
    server's settings over its defaults. ``with server:`` starts it and stops it."""

    def __init__(
        self, directory: Path, *, fresh: bool, heap_mb: int, ready_timeout_s: float,
        properties: Mapping[str, str] | None,
    ) -> None:  # fmt: skip
        self.directory = directory.resolve()
        self.fresh = fresh
        self.heap_mb = heap_mb
        self.ready_timeout_s = ready_timeout_s
        self.properties = dict(properties or {})
        self.state: Any = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ports: tuple[int, int] | None = None  # kept by restart()

    def restart(self) -> str:
        """Stop and start again on the same ports with the same data, as a server that went
        away for a moment: its clients keep their address."""
        self.stop()
        self.fresh = False
        return self.start()

    def start(self) -> str:
        raise NotImplementedError

    def stop(self, timeout_s: float = 20.0) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()
