"""Local state of an earlier incarnation of a job is never taken for its current state.

A task's stores (``state.dir/<application.id>/<task id>/``) say which batch they hold, and a
task trusts a store that is not behind the commit log. After ``streamplatform reset`` the
commit log starts anew, and a store left on some executor from before would hold "batch 40"
of a job whose log has no batch 40 yet: it would be taken as current, its counts carried into
the reset job. So each task directory records the *incarnation* it belongs to — the id of the
job's commit-log table, which a reset replaces (Delta gives every new table a new id) — and a
directory of another incarnation is removed before the task opens it, as if the executor were
new: the task then restores from the (new) changelog, like any task on a fresh executor.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = ".incarnation"


def _recorded(task_dir: Path) -> str:
    try:
        return (task_dir / MARKER).read_text().strip()
    except OSError:
        return ""


def is_stale(task_dir: Path, incarnation: str) -> bool:
    """True when ``task_dir`` holds the state of another incarnation than ``incarnation``."""
    recorded = _recorded(task_dir) if incarnation else ""
    return bool(recorded) and recorded != incarnation


def ensure(task_dir: Path, incarnation: str) -> bool:
    """Make ``task_dir`` belong to ``incarnation``: remove it when it holds another one's
    state, then record ``incarnation`` in it. True when something was removed. ``""`` (not
    known) checks nothing. A directory from before incarnations were recorded is adopted."""
    if not incarnation:
        return False
    marker = task_dir / MARKER
    removed = False
    recorded = _recorded(task_dir)
    if recorded and recorded != incarnation:
        log.warning("%s: state of an earlier incarnation of the job (a reset since): removed; "
                    "the task restores from the changelog", task_dir)  # fmt: skip
        shutil.rmtree(task_dir, ignore_errors=True)
        removed = True
    if recorded != incarnation or removed:
        task_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(incarnation)
    return removed
