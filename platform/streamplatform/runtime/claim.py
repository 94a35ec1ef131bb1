"""One writer per application: a driver claims its job, and every commit proves it still does.

The claim lives in the Delta log of the table whose append is the job's commit point (the
commit log of a streaming job, ``_commits``). Delta writes each table version once: a commit
made for exactly version V+1, with no retry, either becomes V+1 or fails because another
writer took V+1 first. That is all the fencing needs:

- **claim**: a commit (no rows) that records the transaction ``<application.id>-epoch`` at
  the next epoch, with the holder (host, pid, run id) in its commit info. Of two drivers
  claiming at once, one wins the version; the other reads who holds the job and is refused
  (:class:`JobClaimedError`) or waits (``platform.claim.wait.ms``);
- **commit**: every later write of the holder (batch commits, heartbeats, the release) is made
  for exactly the version after its previous one. A rival's claim moves the table on, so the
  old holder's next commit fails, writes nothing, and raises :class:`JobFencedError`;
- **liveness**: a claim is live while its holder's newest commit is younger than
  ``platform.claim.lease.ms``; a holder between commits renews it from a background thread.
  A holder on this host whose process is gone (a crash, SIGKILL) has lost it at once, so a
  restart after a crash does not wait out the lease. ``release()`` (``StreamingJob.close()``)
  ends it.

Clocks: liveness compares the holder's commit timestamps with the reader's clock, so the
lease must exceed the clock skew between hosts (the default 30 s does for NTP-synced hosts).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from streamplatform.runtime import delta_direct
from streamplatform.runtime.errors import JobClaimedError, JobFencedError

log = logging.getLogger(__name__)

CLAIM_KEY = "streamplatform.claim"  # the commit-info field with the holder of each commit


@dataclass(frozen=True)
class Holder:
    """Who wrote a commit under a claim, as recorded in the commit's info."""

    epoch: int
    run: str
    host: str
    pid: int
    started: str  # when the process started (ISO time), to tell a reused pid apart
    role: str
    state: str  # "claimed", "held" or "released"

    def describe(self) -> str:
        return (f"run {self.run} (pid {self.pid} on {self.host}, {self.role}, "
                f"epoch {self.epoch})")  # fmt: skip


_LIVE_RUNS: set[str] = set()  # claims held by this process, by run id
_BEATING: weakref.WeakSet[JobClaim] = weakref.WeakSet()  # claims whose heartbeat runs here


def _process_started(pid: int) -> str:
    """When process ``pid`` started, as far as this host tells ("" when it does not): its
    start in clock ticks since boot (:func:`streamplatform.processes.start_mark`, Linux and
    macOS). On Linux it is the ``/proc/<pid>/stat`` start time that earlier versions recorded,
    so a holder recorded by one of them still compares equal."""
    from streamplatform.processes import start_mark

    return start_mark(pid)


def _process_alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not started or _process_started(pid) == started


class JobClaim:
    """The claim of ``job`` (an application id) on the Delta table at ``path``.

    ``schema``: the table's schema, to create it when it does not exist yet. ``role`` names
    what holds it in errors ("streaming job", "DLQ replay").
    """

    def __init__(
        self,
        path: str,
        job: str,
        schema: pa.Schema,
        *,
        lease_ms: int = 30_000,
        wait_ms: int = 0,
        role: str = "streaming job",
    ) -> None:
        self.path, self.job, self.schema, self.role = path, job, schema, role
        self.lease_ms, self.wait_ms = lease_ms, wait_ms
        self.txn_app_id = f"{job}-epoch"
        self.run = uuid.uuid4().hex[:12]
        self._started = _process_started(os.getpid())
        self.epoch: int | None = None
        self._version = -1  # the table version of this holder's newest commit
        self._last_commit = 0.0
        self._lock = threading.Lock()
        self._fenced: JobFencedError | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # Claiming -----------------------------------------------------------------------------

    def acquire(self) -> int:
        """Claim the job; returns the epoch won. Raises JobClaimedError when a live driver
        holds it (after waiting up to ``wait_ms`` for it to end)."""
        from deltalake.exceptions import CommitFailedError

        deadline = time.monotonic() + self.wait_ms / 1000
        waited = False
        while True:
            table = self._table()
            holder, seen_at = self._newest(table)
            if holder is not None and holder.state != "released" and self._alive(holder, seen_at):
                if time.monotonic() >= deadline:
                    raise JobClaimedError(self._claimed_message(holder, seen_at, waited))
                if not waited:
                    log.warning("%s: waiting for %s to end", self.job, holder.describe())
                waited = True
                time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
                continue
            epoch = (table.transaction_version(self.txn_app_id) or 0) + 1
            _LIVE_RUNS.add(self.run)  # live from the moment its claim may be read
            try:
                self._commit_empty(table, "claimed", epoch)
            except CommitFailedError:
                _LIVE_RUNS.discard(self.run)
                continue  # another driver committed first: read again who holds it
            self.epoch, self._version = epoch, table.version() + 1
            if holder is not None and holder.state != "released":
                log.warning("%s: took over from %s, which is gone", self.job, holder.describe())
            self._start_heartbeat()
            return epoch

    def _claimed_message(self, holder: Holder, seen_at: float, waited: bool) -> str:
        seen = datetime.fromtimestamp(seen_at, UTC).isoformat(timespec="seconds")
        waited_for = f"Waited {self.wait_ms} ms. " if waited else ""
        return (
            f"{self.job}: the job is held by {holder.describe()}, last seen {seen}; one "
            f"driver per application.id. {waited_for}"
            "Set platform.claim.wait.ms to wait for it, or stop that run. A holder that "
            f"died on another host loses the job {self.lease_ms} ms after it was last seen "
            "(platform.claim.lease.ms)."
        )

    def _alive(self, holder: Holder, seen_at: float) -> bool:
        if time.time() - seen_at > self.lease_ms / 1000:
            return False
        if holder.host != socket.gethostname():
            return True
        if holder.pid == os.getpid():
            return holder.run in _LIVE_RUNS
        return _process_alive(holder.pid, holder.started)

    # Committing ---------------------------------------------------------------------------

    def append(self, rows: pa.Table, app_id: str, version: int) -> None:
        """Append ``rows`` under the Delta transaction ``(app_id, version)`` as this holder's
        next commit. Raises JobFencedError, writing nothing, when the job was claimed by
        another driver since."""
        from deltalake import Transaction
        from deltalake.exceptions import CommitFailedError

        with self._lock:
            self._check_held()
            table = delta_direct.open_table(self.path, version=self._version)
            properties = self._properties("held")
            properties.app_transactions = [Transaction(app_id, version)]
            try:
                # schema_mode="merge": a commit log written before a column was added (the
                # guarantee) gains it; its older rows read it as null.
                delta_direct.write(
                    table, rows, mode="append", schema_mode="merge", commit_properties=properties
                )
            except CommitFailedError as error:
                if self._table().transaction_version(self.txn_app_id) == self.epoch:
                    raise  # not a rival's claim: nothing to fence
                self._fenced = self._fenced_error(error)
                raise self._fenced from error
            self._version += 1
            self._last_commit = time.monotonic()

    def rewind_rows(self, app_id: str, version: int) -> None:
        """Delete the rows of the batches after ``version`` from the claim's table (the commit
        log) and set ``app_id``'s transaction back to ``version``, as the holder's next commit
        (rewind.py); nothing happens when nothing after it was recorded."""
        from deltalake import Transaction

        with self._lock:
            self._check_held()
            table = delta_direct.open_table(self.path, version=self._version)
            recorded = table.transaction_version(app_id)
            if recorded is None or recorded <= version:
                return
            properties = self._properties("held")
            properties.app_transactions = [Transaction(app_id, version)]
            table.delete(f"batch_id > {int(version)}", commit_properties=properties)
            if table.transaction_version(app_id) == version:  # the delete's commit
                self._version = table.version()
            else:  # no row matched: no commit was made (commit_empty leaves `table` as it was)
                delta_direct.commit_empty(table, properties)
                self._version += 1
            self._last_commit = time.monotonic()

    def release(self) -> None:
        """End the claim (a last commit says so); a fenced or unheld claim just stops."""
        from deltalake.exceptions import CommitFailedError

        self._stop_heartbeat()
        _LIVE_RUNS.discard(self.run)
        with self._lock:
            if self.epoch is not None and self._fenced is None:
                try:
                    table = delta_direct.open_table(self.path, version=self._version)
                    self._commit_empty(table, "released")
                except CommitFailedError:
                    log.warning("%s: the claim was taken over before it was released", self.job)
            # Unheld now: a later acquire() claims anew (and is refused while another holds it).
            self.epoch, self._fenced = None, None

    def check(self) -> None:
        """Raise JobFencedError when another driver claimed the job since; for writers whose
        commit point is not a delta-rs append (the DLQ replay's Spark-written ledger), checked
        before each step that publishes or records."""
        with self._lock:
            self._check_held()
            if self._table().transaction_version(self.txn_app_id) != self.epoch:
                self._fenced = self._fenced_error(RuntimeError("a newer epoch was claimed"))
                raise self._fenced

    def _check_held(self) -> None:
        if self.epoch is None:
            raise RuntimeError(f"{self.job}: the job is not claimed by this driver")
        if self._fenced is not None:
            raise self._fenced

    def _fenced_error(self, cause: Exception) -> JobFencedError:
        table = self._table()
        holder, _ = self._newest(table)
        by = holder.describe() if holder is not None else "another writer"
        return JobFencedError(
            f"{self.job}: this {self.role} ({self.run}, epoch {self.epoch}) lost its claim; "
            f"{by} wrote the commit log since (version {table.version()}). Nothing of this "
            f"commit was written: {cause}"
        )

    # The Delta log --------------------------------------------------------------------------

    def table_id(self) -> str:
        """The id Delta gave the claim's table (the commit log) when it was created: a job
        reset starts a new one (runtime/incarnation.py)."""
        return str(self._table().metadata().id)

    def _table(self) -> Any:
        if not delta_direct.is_table(self.path):
            try:
                delta_direct.create_table(self.path, self.schema)
            except Exception:  # created at the same moment by another driver
                if not delta_direct.is_table(self.path):
                    raise
        return delta_direct.open_table(self.path)

    def _properties(self, state: str, epoch: int | None = None) -> Any:
        from deltalake import CommitProperties, Transaction

        holder = Holder(
            epoch=epoch or self.epoch or 0, run=self.run, host=socket.gethostname(),
            pid=os.getpid(), started=self._started, role=self.role, state=state,
        )  # fmt: skip
        return CommitProperties(
            custom_metadata={CLAIM_KEY: json.dumps(asdict(holder))},
            max_commit_retries=0,
            app_transactions=[] if epoch is None else [Transaction(self.txn_app_id, epoch)],
        )

    def _commit_empty(self, table: Any, state: str, epoch: int | None = None) -> None:
        delta_direct.commit_empty(table, self._properties(state, epoch))

    @staticmethod
    def _newest(table: Any) -> tuple[Holder | None, float]:
        """The holder recorded in the table's newest commit, and when it was written."""
        newest = max(table.history(1), key=lambda commit: commit["version"])
        recorded = newest.get(CLAIM_KEY)
        holder = None if recorded is None else Holder(**json.loads(recorded))
        return holder, newest["timestamp"] / 1000

    # Heartbeats -----------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._last_commit = time.monotonic()
        self._heartbeat = threading.Thread(target=self._beat, name=f"{self.job}-claim", daemon=True)
        self._heartbeat.start()
        _BEATING.add(self)

    def _stop_heartbeat(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout_s)
        _BEATING.discard(self)

    def _beat(self) -> None:
        """Renew the claim when the holder has not committed for a third of the lease."""
        from deltalake.exceptions import CommitFailedError

        every = self.lease_ms / 3000
        while not self._stop.wait(min(every / 4, 1.0)):
            with self._lock:
                if self._fenced is not None or self.epoch is None:
                    return
                if time.monotonic() - self._last_commit < every:
                    continue
                try:
                    self._commit_empty(
                        delta_direct.open_table(self.path, version=self._version), "held"
                    )
                except CommitFailedError as error:
                    self._fenced = self._fenced_error(error)
                    log.error("%s", self._fenced)
                    return
                except Exception:
                    log.exception("%s: renewing the claim failed; trying again", self.job)
                    continue
                self._version += 1
                self._last_commit = time.monotonic()


_EXIT_COMMIT_WAIT_S = 30.0  # at most, for a heartbeat's commit in flight at exit


def _stop_heartbeats_at_exit() -> None:
    """Stop the heartbeats of the claims this process never released, and wait for them,
    while the interpreter still works. A heartbeat left running is a daemon thread that may be
    inside a delta-rs commit (Rust, the GIL released) when the interpreter tears down; CPython
    then ends it with pthread_exit as it asks for the GIL back, and the forced unwind through
    the Rust frames crashed the process (SIGSEGV) after its work was done. The claim is not
    released here (that is ``StreamingJob.close()``'s commit): it ends as a crashed holder's
    does, at once for a driver on this host (the pid is gone), else after the lease."""
    for claim in list(_BEATING):
        # Stopped, a heartbeat ends once the commit it is in (if any) ends: wait for that
        # commit, however slow the storage or the machine. A lease's wait (30 ms in a test)
        # was shorter than a commit on a loaded machine, and the crash came back.
        claim._stop_heartbeat(timeout_s=max(claim.lease_ms / 1000, _EXIT_COMMIT_WAIT_S))
        if claim._heartbeat is not None and claim._heartbeat.is_alive():
            log.warning("%s: the claim's heartbeat did not stop at exit", claim.job)


atexit.register(_stop_heartbeats_at_exit)
