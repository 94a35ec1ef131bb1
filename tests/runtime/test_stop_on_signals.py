"""Continuous mode's signal handling, without Spark: the first SIGTERM/SIGINT stops after the
batch in flight, a second one interrupts it, and the batch ends with a KeyboardInterrupt even
when the interrupted call turned it into an error of its own (py4j does, for a call into the
JVM), so that `streamplatform run` exits 130 rather than 1."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from streamplatform.runtime.signals import StopOnSignals


def _signal_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_the_first_signal_stops_after_the_batch_and_the_second_interrupts_it():
    stop = threading.Event()
    with StopOnSignals(stop, "app") as signals:
        _signal_self()
        assert stop.is_set() and signals.received == "SIGTERM"
        with pytest.raises(KeyboardInterrupt, match="SIGTERM again"):
            _signal_self()
    assert signal.getsignal(signal.SIGTERM) is not signals._handle  # handlers restored


def test_an_interrupt_the_interrupted_call_turned_into_its_own_error_is_still_an_interrupt():
    class NetworkError(Exception):
        pass

    stop = threading.Event()
    with pytest.raises(KeyboardInterrupt, match="SIGTERM again") as interrupted:  # noqa: SIM117
        with StopOnSignals(stop, "app"):
            _signal_self()
            try:
                _signal_self()
            except KeyboardInterrupt as interrupt:
                raise NetworkError("Answer from Java side is empty") from interrupt
    assert isinstance(interrupted.value.__cause__, NetworkError)


def test_an_error_without_a_second_signal_stays_what_it_is():
    with pytest.raises(ValueError, match="a batch failed"), StopOnSignals(threading.Event(), "a"):
        raise ValueError("a batch failed")
