"""Stopping a continuous job on SIGTERM / SIGINT: the first signal ends it after the batch in
flight, a second interrupts that batch."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)


class StopOnSignals:
    """While active (and in the main thread), SIGTERM and SIGINT set ``stop``: the batch in
    flight finishes. A second one raises KeyboardInterrupt in it, and the batch ends with a
    KeyboardInterrupt whatever the interrupted call made of it (py4j turns an interrupt of a
    call into the JVM into its own network error). The previous handlers come back at the
    end."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop: threading.Event, app: str) -> None:
        self.stop, self.app = stop, app
        self.received = ""
        self.interrupted = ""  # set by the second signal: why the batch was interrupted
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self.interrupted and exc is not None and not isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt(self.interrupted) from exc

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.stop.is_set():
            self.interrupted = f"{name} again: the batch in flight is interrupted"
            raise KeyboardInterrupt(self.interrupted)
        self.received = name
        self.stop.set()
        log.warning("%s: %s received; finishing the batch in flight, then stopping (send it "
                    "again to interrupt the batch)", self.app, name)  # fmt: skip
