"""Crash injection for the runtime's crash tests: SIGKILL the driver at a named step.

Off unless ``STREAMPLATFORM_FAULT=<step>:<batch id>`` is set in the driver's environment
(Spark's Python workers inherit it). Steps: ``after_plan`` (offset log written),
``during_tasks`` (inside an executor, half-way through a task's records), ``after_outputs``
(Delta and Kafka outputs written, commit log not), ``after_commit`` (commit log written).
The driver's pid is taken from ``STREAMPLATFORM_FAULT_PID``, which ``arm()`` sets.
"""

from __future__ import annotations

import os
import signal

_SPEC = "STREAMPLATFORM_FAULT"
_PID = "STREAMPLATFORM_FAULT_PID"


def arm() -> None:
    """Record the driver's pid for executors; call before Spark starts."""
    if os.environ.get(_SPEC):
        os.environ[_PID] = str(os.getpid())


def crash_point(step: str, batch_id: int) -> None:
    if os.environ.get(_SPEC) == f"{step}:{batch_id}":
        os.kill(int(os.environ.get(_PID, os.getpid())), signal.SIGKILL)
