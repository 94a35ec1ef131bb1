"""ContinuousJobReporter: a running StreamingJob reports itself to Dagster, without a run.

``streamplatform run --dagster-asset NAME`` (or this class from Python) records, in the Dagster
instance of ``DAGSTER_HOME``, runless asset events (``DagsterInstance.report_runless_asset_event``)
every ``every_batches`` committed batches and/or every ``every_seconds``:

- a **materialization** of the streaming asset ``NAME`` for the batches committed since the
  previous report, with the streaming asset's own metadata names (``rows_in``, ``rows_out``,
  ``duplicates_dropped``, ``dlq_records``, ``lag``, ``committed_batch_id``,
  ``processing.guarantee``, ``consumed_offsets``, ...; :func:`factory.run_metadata`), and one of
  each Delta sink ``delta/<application.id>/<topic>`` (:func:`continuous.delta_sink_key`);
- with no batch since the previous report (nothing to read), an **observation** of ``NAME``: the
  job is alive, its data unchanged;
- when the job ends, a last observation saying how: ``job_state`` ``stopped``, ``failed``,
  ``interrupted``, ``claim_lost`` (another driver holds the job) or ``replay_refused``.

Every report carries ``job_state`` and the driver (``claim_run``, ``claim_epoch``, ``driver_host``,
``driver_pid``): :mod:`streamplatform.dagster.continuous`'s checks and stall sensor read them.

Reporting never stops the job: an instance that cannot be reached (no ``DAGSTER_HOME``, its
database down) is one warning, the batches wait for the next report that gets through, and
reporting resumes by itself (an info line says so).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import dagster as dg

from streamplatform.dagster.continuous import JOB_STATE, delta_sink_key
from streamplatform.dagster.factory import run_metadata
from streamplatform.runtime.errors import JobClaimedError, JobFencedError, ReplayRefused

log = logging.getLogger(__name__)

# Batches kept for the next report while the instance cannot be reached: the newest ones (a
# report's numbers then cover fewer batches than committed; the commit log has them all).
MAX_PENDING = 1_000


def final_state(error: BaseException | None) -> str:
    """The ``job_state`` of the last report of a job that ended with ``error``."""
    if error is None:
        return "stopped"
    if isinstance(error, JobClaimedError | JobFencedError):
        return "claim_lost"
    if isinstance(error, ReplayRefused):
        return "replay_refused"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    return "failed"


class ContinuousJobReporter:
    """Reports ``job`` (a :class:`streamplatform.runtime.microbatch.StreamingJob`: its
    ``config``, ``root``, ``delta_sinks``, ``commit_log`` and ``claim`` are read) as the asset
    ``asset`` (its :class:`StreamingJobSpec`'s ``name``, or a key ``"a/b"``). Give
    :meth:`on_batch` each committed batch; as a context manager it starts the timer and ends
    with the last report (the state from the exception leaving the block, if any)::

        with ContinuousJobReporter(job, "orders", every_batches=10) as reporter:
            job.run_forever(on_batch=reporter.on_batch)

    ``every_batches``: report after this many batches; ``every_seconds``: report at least this
    often, with or without batches (the stall sensor's heartbeat); either or both. ``instance``:
    default ``DagsterInstance.get()`` (``DAGSTER_HOME``), opened at the first report.
    """

    def __init__(
        self,
        job: Any,
        asset: str | dg.AssetKey,
        *,
        every_batches: int | None = None,
        every_seconds: float | None = 30.0,
        instance: dg.DagsterInstance | None = None,
    ) -> None:
        if every_batches is not None and every_batches < 1:
            raise ValueError(f"every_batches must be at least 1, not {every_batches}")
        if every_seconds is not None and every_seconds <= 0:
            raise ValueError(f"every_seconds must be positive, not {every_seconds}")
        if every_batches is None and every_seconds is None:
            raise ValueError("report every_batches, every_seconds or both")
        self.job = job
        self.key = asset if isinstance(asset, dg.AssetKey) else dg.AssetKey.from_user_string(asset)
        self.every_batches, self.every_seconds = every_batches, every_seconds
        self.app: str = job.config["application.id"]
        self.guarantee: str = job.config["processing.guarantee"]
        self._instance = instance
        self._owns_instance = instance is None
        self._pending: list[Any] = []  # BatchResults not reported yet
        self._last_lag: int | None = None
        self._last_batch_id: int | None = None
        self._since = time.monotonic()  # the previous report (or the start): its numbers
        self._attempted = self._since  # the previous attempt: the next is due from it
        self._lock = threading.RLock()  # the state below; never held while Dagster is asked
        self._sending = threading.Lock()  # one report at a time, in order
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        # Reports due after a batch are sent from a thread of their own, so that a slow Dagster
        # database never holds up the job's batches: (state, the batches it covers) per report.
        self._due: queue.Queue[tuple[str, list[Any]] | None] = queue.Queue()
        self._sender: threading.Thread | None = None
        self._failing = False
        self._finished = False

    # Life cycle ------------------------------------------------------------------------------

    def start(self) -> ContinuousJobReporter:
        """Start the thread that sends the reports, and reporting every ``every_seconds`` (a
        daemon thread), if set."""
        if self._sender is None:
            self._sender = threading.Thread(
                target=self._send_due, name=f"{self.app}-dagster-sender", daemon=True
            )
            self._sender.start()
        if self.every_seconds is not None and self._timer is None:
            self._timer = threading.Thread(
                target=self._tick, name=f"{self.app}-dagster-reports", daemon=True
            )
            self._timer.start()
        return self

    def on_batch(self, result: Any) -> None:
        """A committed batch (a ``BatchResult``); reports when one of the intervals is due."""
        with self._lock:
            self._pending = [*self._pending, result][-MAX_PENDING:]
            self._last_lag, self._last_batch_id = int(result.lag), int(result.batch_id)
            due_batches = self.every_batches is not None and len(self._pending) >= (
                self.every_batches)  # fmt: skip
            if not (due_batches or self._seconds_due()):
                return
            if self._sender is None:  # not started: reported here
                self.report("running")
                return
            results, self._pending = self._pending, []
            self._attempted = time.monotonic()
        self._due.put(("running", results))

    def _send_due(self) -> None:
        """The sender thread: the reports ``on_batch`` found due, in order."""
        while (request := self._due.get()) is not None:
            state, results = request
            try:
                with self._sending:
                    if not self._send(state, results, time.monotonic() - self._since):
                        with self._lock:  # kept for the next report that gets through
                            self._pending = [*results, *self._pending][-MAX_PENDING:]
            finally:
                self._due.task_done()
        self._due.task_done()  # the end (None)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until the reports found due so far have been sent (or have failed, and wait
        in the pending ones); False if they had not after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self._due.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._due.unfinished_tasks

    def finish(self, state: str = "stopped", error: BaseException | str | None = None) -> None:
        """Stop the timer and report what is pending, then the job's end (``state``)."""
        self._stop.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join(timeout=60)
        if self._sender is not None and self._sender is not threading.current_thread():
            self._due.put(None)  # after the reports queued before it
            self._sender.join(timeout=60)
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self.report(state, error=None if error is None else str(error), final=True)
            if self._owns_instance and self._instance is not None:
                self._instance.dispose()
                self._instance = None

    def __enter__(self) -> ContinuousJobReporter:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType
        | None,
    ) -> None:  # fmt: skip
        self.finish(final_state(error), error)

    # Reporting -------------------------------------------------------------------------------

    def report(self, state: str, error: str | None = None, final: bool = False) -> bool:
        """Record the pending batches (a materialization of the asset and of each Delta sink),
        or else an observation; a ``final`` report adds the observation of ``state`` after any
        materialization. False when the instance refused them (logged, never raised)."""
        with self._sending:
            with self._lock:
                results = self._pending
                seconds = time.monotonic() - self._since
                self._attempted = time.monotonic()  # a failed report is retried when next due
            if not self._send(state, results, seconds, error, final):
                return False
            with self._lock:
                self._pending = self._pending[len(results) :]
            return True

    def _send(
        self, state: str, results: list[Any], seconds: float, error: str | None = None,
        final: bool = False,
    ) -> bool:  # fmt: skip
        """Ask Dagster to record the report of ``results``; False when it could not (logged
        once per outage, never raised). Called without ``_lock``: Dagster may be slow."""
        try:
            events = self._events(results, seconds, state, error, final)
            instance = self._get_instance()
            for event in events:
                instance.report_runless_asset_event(event)
        except Exception as failure:  # noqa: BLE001 - reporting must never stop the job
            if not self._failing:
                log.warning(
                    "%s: reporting to Dagster failed, the job goes on and reports again "
                    "when it can: %s", self.app, failure,
                )  # fmt: skip
            self._failing = True
            return False
        if self._failing:
            log.info("%s: reporting to Dagster again", self.app)
            self._failing = False
        self._since = time.monotonic()
        return True

    def _events(
        self, results: Sequence[Any], seconds: float, state: str, error: str | None, final: bool
    ) -> list[dg.AssetMaterialization | dg.AssetObservation]:
        driver = self._driver(state, error)
        events: list[dg.AssetMaterialization | dg.AssetObservation] = []
        if results:
            committed = int(results[-1].batch_id)
            metadata = self._batch_metadata(results, seconds, committed)
            events.append(dg.AssetMaterialization(
                asset_key=self.key, metadata=metadata | driver,
                description=f"{len(results)} batch(es) of the continuous job {self.app}",
            ))  # fmt: skip
            for topic in sorted(self.job.delta_sinks):
                events.append(dg.AssetMaterialization(
                    asset_key=delta_sink_key(self.app, topic),
                    metadata={
                        "writer": self.app,
                        "processing.guarantee": self.guarantee,
                        "committed_batch_id": committed,
                        "table": dg.MetadataValue.path(f"{self.job.root}/{topic}"),
                    },
                ))  # fmt: skip
        if final or not results:
            observed: dict[str, Any] = {"batches": 0} if not final else {}
            if self._last_lag is not None:
                observed["lag"] = self._last_lag  # as of the job's last batch
            if self._last_batch_id is not None:
                observed["committed_batch_id"] = self._last_batch_id
            events.append(dg.AssetObservation(
                asset_key=self.key,
                metadata=observed | {"application_id": self.app,
                                     "processing.guarantee": self.guarantee} | driver,
            ))  # fmt: skip
        return events

    def _batch_metadata(
        self, results: Sequence[Any], seconds: float, committed: int
    ) -> dict[str, Any]:
        """The streaming asset's metadata (factory.run_metadata) for ``results``."""
        consumed = self._consumed()
        metadata = run_metadata(results, seconds, consumed, {})
        del metadata["lag_by_partition"]  # unknown here; the lag is the last batch's
        return metadata | {
            "lag": int(results[-1].lag),
            "application_id": self.app,
            "processing.guarantee": self.guarantee,
            "committed_batch_id": committed,
            "commit_log": dg.MetadataValue.path(f"{self.job.root}/_commits"),
        }

    def _consumed(self) -> dict[tuple[str, int], int]:
        """The newest commit's consumed offsets; {} when the commit log cannot be read."""
        try:
            last = self.job.commit_log.last()
        except Exception as error:  # noqa: BLE001 - a report without offsets, not a failure
            log.debug("%s: commit log not read for the report: %s", self.app, error)
            return {}
        return {} if last is None else dict(last.consumed)

    def _driver(self, state: str, error: str | None) -> dict[str, Any]:
        claim = self.job.claim
        driver: dict[str, Any] = {
            JOB_STATE: state,
            "claim_run": str(claim.run),
            # The epoch it holds (-1 once released: a final report comes after the release).
            "claim_epoch": -1 if claim.epoch is None else int(claim.epoch),
            "driver_host": socket.gethostname(),
            "driver_pid": os.getpid(),
        }
        if error:
            driver["error"] = error[:2000]
        return driver

    def _get_instance(self) -> dg.DagsterInstance:
        if self._instance is None:
            self._instance = dg.DagsterInstance.get()
        return self._instance

    def _seconds_due(self) -> bool:
        return self.every_seconds is not None and (
            time.monotonic() - self._attempted >= self.every_seconds)  # fmt: skip

    def _tick(self) -> None:
        """Report every ``every_seconds`` when no batch did meanwhile (an idle job too)."""
        assert self.every_seconds is not None
        while True:
            with self._lock:
                remaining = self.every_seconds - (time.monotonic() - self._attempted)
            if self._stop.wait(max(remaining, 0.01)):
                return
            with self._lock:
                due = not self._finished and self._seconds_due()
            if due:  # asked outside the lock: on_batch never waits for Dagster
                self.report("running")
