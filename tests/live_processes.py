"""What is still running, asked of psutil directly (not of the library's own bookkeeping): the
tests that check a process group is gone use it."""

from __future__ import annotations

import contextlib
import os

import psutil


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies left out: they have exited)."""
    members = []
    for process in psutil.process_iter(["status"]):
        if process.pid <= 0 or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(process.pid) == pgid:
                members.append(process.pid)
    return members
