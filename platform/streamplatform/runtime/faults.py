"""Fault injection for the runtime's crash and concurrency tests: stop the driver at a named step.

Off unless set in the driver's environment (Spark's Python workers inherit it):

- ``STREAMPLATFORM_FAULT=<step>:<batch id>``: SIGKILL the driver there;
- ``STREAMPLATFORM_PAUSE=<step>:<batch id>`` with ``STREAMPLATFORM_PAUSE_DIR=<dir>``: write
  ``<dir>/paused`` there and wait until ``<dir>/resume`` exists (a driver held mid-batch, for
  a second driver to meet).

Steps: ``after_plan`` (offset log written), ``during_tasks`` (inside an executor, half-way
through a task's records), ``after_outputs`` (Delta and Kafka outputs written, commit log
not), ``after_commit`` (commit log written). The driver's pid is taken from
``STREAMPLATFORM_FAULT_PID``, which ``arm()`` sets.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_SPEC = "STREAMPLATFORM_FAULT"
_PID = "STREAMPLATFORM_FAULT_PID"
_PAUSE = "STREAMPLATFORM_PAUSE"
_PAUSE_DIR = "STREAMPLATFORM_PAUSE_DIR"


def arm() -> None:
    """Record the driver's pid for executors; call before Spark starts."""
    if os.environ.get(_SPEC):
        os.environ[_PID] = str(os.getpid())


def crash_point(step: str, batch_id: int) -> None:
    if os.environ.get(_SPEC) == f"{step}:{batch_id}":
        os.kill(int(os.environ.get(_PID, os.getpid())), signal.SIGKILL)
    if os.environ.get(_PAUSE) == f"{step}:{batch_id}":
        directory = Path(os.environ[_PAUSE_DIR])
        (directory / "paused").touch()
        while not (directory / "resume").exists():
            time.sleep(0.05)
