"""Tasks kept open in a Spark Python worker between micro-batches.

Spark reuses its Python workers (``spark.python.worker.reuse``, on by default), so a task
that finished a batch can stay open in the worker, as a Kafka Streams task stays open in its
stream thread between commits: its RocksDB stores, the deduplication's live ids, its stream
time and punctuation schedules. The next batch of the task takes it back instead of opening
the stores and reloading the ids again.

A kept task is used again only when it is proven current (``take``): it was kept under the
same job fingerprint (topology, code, settings), its stores' directories are still the ones it
opened, and the batch it last finished is committed with no batch after it having run the
task anywhere else (``executor.ChangelogWrites``, the driver's record of the batches).
Anything else (the batch was re-run, the task ran on another executor, the code changed)
closes it, and the task is opened and restored as if it had never been kept. A task whose
attempt failed, or was stopped half-way, is never kept: it is closed as before.

Only one process may hold a task's stores open. Another process that needs them (another
Python worker that Spark gave the task to, the driver's tests) finds them locked, leaves a
release request beside them (``state.rocks.RELEASE_REQUEST``) and waits; this module's
watcher thread in the holding worker closes the kept task within a few milliseconds. The
watcher also closes tasks idle for ``platform.task.cache.idle.ms``; Spark itself stops Python
workers idle for a minute, which loses nothing (every batch ends with the stores committed or
durably prepared).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streamplatform.runtime.task import Task
from streamplatform.state.rocks import RELEASE_REQUEST

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.01  # how often the watcher looks for release requests and idle tasks


@dataclass
class _Kept:
    task: Task
    fingerprint: str
    batch: int  # the batch the task last finished
    idle_since: float
    idle_limit_s: float
    directories: dict[str, int]  # each store's directory -> its inode when the task was kept

    def still_on_disk(self) -> bool:
        """False when a store's directory was removed or replaced since (a wiped state dir):
        the kept stores would write to files no longer there."""
        try:
            return all(os.stat(path).st_ino == inode for path, inode in self.directories.items())
        except OSError:
            return False


_lock = threading.Lock()
_kept: dict[Path, _Kept] = {}  # task directory -> the task kept open there
_watcher: threading.Thread | None = None
_stopping = threading.Event()  # set at exit: the watcher ends, and no new one starts


def take(directory: Path, fingerprint: str, is_current: Callable[[int], bool]) -> Task | None:
    """The task kept open for ``directory``, when it was kept under ``fingerprint`` and
    ``is_current(batch it last finished)``; else None (a kept task that is not current is
    closed). The caller owns the task until it gives it back with ``keep`` or closes it."""
    with _lock:
        kept = _kept.pop(directory, None)
    if kept is None:
        return None
    if kept.fingerprint == fingerprint and kept.still_on_disk() and is_current(kept.batch):
        return kept.task
    _close(kept.task, "it is not current")
    return None


def keep(task: Task, fingerprint: str, batch: int, idle_ms: int) -> None:
    """Keep ``task`` open after it finished ``batch``; closes it at once when idle_ms is 0."""
    if idle_ms <= 0:
        task.close()
        return
    directories = {str(store.path): os.stat(store.path).st_ino for store in task.every_store()}
    kept = _Kept(task, fingerprint, batch, time.monotonic(), idle_ms / 1000, directories)
    with _lock:
        replaced = _kept.pop(task.directory, None)
        _kept[task.directory] = kept
        _start_watcher()
    if replaced is not None and replaced.task is not task:
        _close(replaced.task, "another copy was kept")


def kept_tasks() -> list[str]:
    """The task directories kept open in this process (for tests and diagnostics)."""
    with _lock:
        return sorted(str(directory) for directory in _kept)


def close_all() -> None:
    """Close every kept task of this process."""
    with _lock:
        kept = list(_kept.values())
        _kept.clear()
    for entry in kept:
        _close(entry.task, "closing all")


def close_under(root: Path) -> None:
    """Close the kept tasks of this process whose directories are under ``root`` (a job's
    own, when it closes)."""
    with _lock:
        leaving = [directory for directory in _kept if directory.is_relative_to(root)]
        kept = [_kept.pop(directory) for directory in leaving]
    for entry in kept:
        _close(entry.task, "its job closed")


def _close_all_at_exit() -> None:
    """At exit, while the interpreter still works: stop the watcher and wait for it, then
    close what is kept. The stores then close in order, not in whatever order the final
    garbage collection tears their objects down; and no watcher is left inside a store's
    close (native code, which may release the GIL) when the interpreter tears down, which
    would end it with pthread_exit in the middle of that code (the crash claim.py describes)."""
    _stopping.set()
    if _watcher is not None:
        _watcher.join()
    close_all()


atexit.register(_close_all_at_exit)


def _start_watcher() -> None:
    global _watcher
    if _stopping.is_set():  # at exit: a task kept now is closed by the exit handler's close_all
        return
    if _watcher is None or not _watcher.is_alive():
        _watcher = threading.Thread(target=_watch, name="streamplatform-task-cache", daemon=True)
        _watcher.start()


def _watch() -> None:
    while not _stopping.wait(WATCH_INTERVAL_S):
        now = time.monotonic()
        with _lock:
            leaving = [
                (directory, reason) for directory, kept in _kept.items()
                if (reason := _why_close(kept, now)) is not None
            ]  # fmt: skip
            closing = [(_kept.pop(directory), reason) for directory, reason in leaving]
        for kept, reason in closing:
            _close(kept.task, reason)


def _why_close(kept: _Kept, now: float) -> str | None:
    if now - kept.idle_since >= kept.idle_limit_s:
        return "it was idle for platform.task.cache.idle.ms"
    for store in kept.task.every_store():
        if (Path(store.path) / RELEASE_REQUEST).exists():
            return "another process asked for its stores"
    return None


def _close(task: Task, reason: str) -> None:
    log.debug("Closing kept task %s: %s", task.task_id, reason)
    try:
        task.close()
    except Exception:
        log.exception("Closing kept task %s failed", task.task_id)
