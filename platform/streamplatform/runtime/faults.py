"""Fault injection for the runtime's crash and concurrency tests: stop the driver at a named step.

Off unless set in the driver's environment (Spark's Python workers inherit it):

- ``STREAMPLATFORM_FAULT=<step>:<batch id>``: SIGKILL the driver there;
- ``STREAMPLATFORM_FAIL_ONCE=<step>:<batch id>`` with ``STREAMPLATFORM_FAIL_ONCE_FILE=<path>``:
  raise ``InjectedFailure`` there the first time (the file records it), so that Spark retries
  the task (a master with retries: ``local[2,2]``) or the batch fails once; ``<step>:*`` fails
  at that step of whichever batch reaches it first;
- ``STREAMPLATFORM_PAUSE=<step>:<batch id>`` with ``STREAMPLATFORM_PAUSE_DIR=<dir>``: write
  ``<dir>/paused`` there and wait until ``<dir>/resume`` exists (a driver held mid-batch, for
  a second driver to meet).

Steps: ``after_plan`` (offset log written), ``during_tasks`` (inside an executor, half-way
through a task's records), ``during_outputs`` (a Delta sink written, other outputs maybe
not), ``after_outputs`` (Delta and Kafka outputs written, commit log not), ``after_commit``
(commit log written), ``after_kafka_commit`` (inside an executor, a task's Kafka transaction
committed; exactly_once_v2); and in a continuous run's start, before any batch, with the
batch id ``start``: ``start_claimed`` (the job claimed, Spark not started) and
``start_spark_ready`` (Spark started, the first batch not planned). The driver's pid is taken
from ``STREAMPLATFORM_FAULT_PID``, which ``arm()`` sets.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_SPEC = "STREAMPLATFORM_FAULT"
_PID = "STREAMPLATFORM_FAULT_PID"
_FAIL_ONCE = "STREAMPLATFORM_FAIL_ONCE"
_FAIL_ONCE_FILE = "STREAMPLATFORM_FAIL_ONCE_FILE"
_PAUSE = "STREAMPLATFORM_PAUSE"
_PAUSE_DIR = "STREAMPLATFORM_PAUSE_DIR"


class InjectedFailure(RuntimeError):
    """The failure ``STREAMPLATFORM_FAIL_ONCE`` asked for."""


def arm() -> None:
    """Record the driver's pid for executors; call before Spark starts."""
    if os.environ.get(_SPEC):
        os.environ[_PID] = str(os.getpid())


def crash_point(step: str, batch_id: int | str) -> None:
    if os.environ.get(_SPEC) == f"{step}:{batch_id}":
        os.kill(int(os.environ.get(_PID, os.getpid())), signal.SIGKILL)
    if os.environ.get(_FAIL_ONCE) in (f"{step}:{batch_id}", f"{step}:*"):
        marker = Path(os.environ[_FAIL_ONCE_FILE])
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            pass  # failed once already
        else:
            raise InjectedFailure(f"injected failure at {step} of batch {batch_id}")
    if os.environ.get(_PAUSE) == f"{step}:{batch_id}":
        directory = Path(os.environ[_PAUSE_DIR])
        (directory / "paused").touch()
        while not (directory / "resume").exists():
            time.sleep(0.05)
