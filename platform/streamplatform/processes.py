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
  walking a session or a tree of children) and :func:`live` (which of some pids still run).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

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
