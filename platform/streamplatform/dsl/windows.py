"""Windows of a windowed aggregation, as Kafka Streams defines them, and the keys of its results.

``TimeWindows`` are tumbling (advance = size) or hopping (advance < size): a record at time t
belongs to every window [start, start + size) with start a multiple of the advance and
start <= t < start + size. A window accepts records until stream time passes its end by the
grace period; a record for a window already closed is dropped and counted
(``dropped_records``), as Kafka Streams drops it. The store keeps a window for size + grace
(Kafka Streams' default retention).

``SlidingWindows`` (KIP-450) hold the records within ``time_difference`` of each other: a window
[start, start + time_difference], both ends inclusive, exists for each record as its end and
just after it as its start, as far as other records fall into it. ``SessionWindows`` hold a
key's records separated by less than the inactivity gap: a session [first, last] (inclusive)
grows and merges as records come. The processors are in sliding_aggregate.py and
session_aggregate.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from streamplatform.state.stores import duration_ms

K = TypeVar("K")


@dataclass(frozen=True, order=True)
class Window:
    """A window's interval in milliseconds: [start, end) for ``TimeWindows``; [start, end],
    both inclusive, for sliding windows and sessions (as Kafka Streams' windows)."""

    start: int
    end: int


@dataclass(frozen=True)
class Windowed(Generic[K]):
    """The key of a windowed aggregation's result: the record key and its window."""

    key: K
    window: Window

    def __str__(self) -> str:
        return f"[{self.key}@{self.window.start}/{self.window.end}]"


def _positive(value: timedelta | int, what: str) -> int:
    millis = duration_ms(value, what)
    if millis <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return millis


def _grace(value: timedelta | int) -> int:
    millis = duration_ms(value, "grace")
    if millis < 0:
        raise ValueError(f"grace must not be negative, got {value!r}")
    return millis


def _not_negative(value: timedelta | int, what: str) -> int:
    millis = duration_ms(value, what)
    if millis < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return millis


@dataclass(frozen=True)
class TimeWindows:
    """Fixed-size windows: tumbling, or hopping with ``advance_by``. Build them with
    ``of_size_with_no_grace`` or ``of_size_and_grace``."""

    size_ms: int
    advance_ms: int
    grace_ms: int

    @classmethod
    def of_size_with_no_grace(cls, size: timedelta | int) -> TimeWindows:
        size_ms = _positive(size, "size")
        return cls(size_ms, size_ms, 0)

    @classmethod
    def of_size_and_grace(cls, size: timedelta | int, grace: timedelta | int) -> TimeWindows:
        size_ms = _positive(size, "size")
        return cls(size_ms, size_ms, _grace(grace))

    def advance_by(self, advance: timedelta | int) -> TimeWindows:
        """Hopping windows that start every ``advance`` (at most the size)."""
        advance_ms = _positive(advance, "advance")
        if advance_ms > self.size_ms:
            raise ValueError(
                f"advance ({advance_ms} ms) must not be larger than the window size "
                f"({self.size_ms} ms)"
            )
        return TimeWindows(self.size_ms, advance_ms, self.grace_ms)

    def windows_for(self, timestamp: int) -> list[Window]:
        """The windows a record at ``timestamp`` belongs to, earliest first."""
        size = self.size_ms
        return [Window(start, start + size) for start in self.window_starts(timestamp)]

    def window_starts(self, timestamp: int) -> range:
        """The starts of the windows a record at ``timestamp`` belongs to, earliest first."""
        advance = self.advance_ms
        first = (max(0, timestamp - self.size_ms + advance) // advance) * advance
        return range(first, timestamp + 1, advance)

    @property
    def retention_ms(self) -> int:
        return self.size_ms + self.grace_ms


@dataclass(frozen=True)
class SlidingWindows:
    """Windows of a fixed ``time_difference`` that slide with the records (Kafka Streams'
    ``SlidingWindows``): a record at t makes the window [t - time_difference, t] and, when a
    later record of its key falls within the time difference, [t + 1, t + 1 +
    time_difference]. Build them with ``of_time_difference_with_no_grace`` or
    ``of_time_difference_and_grace``. A time difference of 0 is allowed, as in Kafka Streams."""

    time_difference_ms: int
    grace_ms: int

    @classmethod
    def of_time_difference_with_no_grace(cls, time_difference: timedelta | int) -> SlidingWindows:
        return cls(_not_negative(time_difference, "time_difference"), 0)

    @classmethod
    def of_time_difference_and_grace(
        cls, time_difference: timedelta | int, grace: timedelta | int
    ) -> SlidingWindows:
        return cls(_not_negative(time_difference, "time_difference"), _grace(grace))

    @property
    def retention_ms(self) -> int:
        """Kafka Streams' default: twice the time difference plus grace, so that every window
        a new record may need (starting from its time - 2 * time difference) is still there."""
        return 2 * self.time_difference_ms + self.grace_ms


@dataclass(frozen=True)
class SessionWindows:
    """Sessions of activity (Kafka Streams' ``SessionWindows``): a key's records less than
    ``inactivity_gap`` apart (at most the gap) share a session [first, last]. Build them with
    ``of_inactivity_gap_with_no_grace`` or ``of_inactivity_gap_and_grace``."""

    inactivity_gap_ms: int
    grace_ms: int

    @classmethod
    def of_inactivity_gap_with_no_grace(cls, inactivity_gap: timedelta | int) -> SessionWindows:
        return cls(_positive(inactivity_gap, "inactivity_gap"), 0)

    @classmethod
    def of_inactivity_gap_and_grace(
        cls, inactivity_gap: timedelta | int, grace: timedelta | int
    ) -> SessionWindows:
        return cls(_positive(inactivity_gap, "inactivity_gap"), _grace(grace))

    @property
    def retention_ms(self) -> int:
        """Kafka Streams' default: the gap plus grace after a session's end."""
        return self.inactivity_gap_ms + self.grace_ms

    @property
    def close_after_end_ms(self) -> int:
        """How long after a session's end it closes: the gap (a record may still extend it)
        plus grace; what ``suppress(until_window_closes())`` waits, as in Kafka Streams."""
        return self.inactivity_gap_ms + self.grace_ms


class EmitStrategy:
    """When a windowed aggregation forwards its results (KIP-825)."""

    ON_WINDOW_UPDATE = "on_window_update"
    ON_WINDOW_CLOSE = "on_window_close"

    def __init__(self, kind: str) -> None:
        self.kind = kind

    @classmethod
    def on_window_update(cls) -> EmitStrategy:
        """Every update of a window, through the record cache (the default)."""
        return cls(cls.ON_WINDOW_UPDATE)

    @classmethod
    def on_window_close(cls) -> EmitStrategy:
        """Only a window's final result, once stream time passes its end plus grace."""
        return cls(cls.ON_WINDOW_CLOSE)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, EmitStrategy) and other.kind == self.kind

    def __hash__(self) -> int:
        return hash(self.kind)

    def __repr__(self) -> str:
        return f"EmitStrategy.{self.kind}()"


class TimeWindowedSerde:
    """Writes ``Windowed`` keys as Kafka Streams' time-windowed serde does: the key's bytes
    then the window's start (8 bytes, big-endian); reads them back with the window's size."""

    # What a sink's C writer needs to write these keys itself (runtime/sink_writers.py): the
    # layout, and the key types it writes (any other object goes through serialize).
    windowed_layout = "time"
    windowed_types = (Windowed, Window)

    def __init__(self, inner: Any, size_ms: int) -> None:
        self.inner = inner
        self.size_ms = size_ms
        self.name = f"time-windowed({inner.name}, {size_ms})"

    def serialize(self, value: Windowed | None) -> bytes | None:
        if value is None:
            return None
        key = self.inner.serialize(value.key)
        return (key or b"") + value.window.start.to_bytes(8, "big", signed=True)

    def deserialize(self, data: bytes | None) -> Windowed | None:
        if data is None:
            return None
        start = int.from_bytes(data[-8:], "big", signed=True)
        return Windowed(self.inner.deserialize(data[:-8]), Window(start, start + self.size_ms))


class SessionWindowedSerde:
    """Writes session ``Windowed`` keys as Kafka Streams' session-windowed serde does
    (``SessionKeySchema``): the key's bytes, then the session's end, then its start (8 bytes
    each, big-endian)."""

    windowed_layout = "session"  # as TimeWindowedSerde's
    windowed_types = (Windowed, Window)

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = f"session-windowed({inner.name})"

    def serialize(self, value: Windowed | None) -> bytes | None:
        if value is None:
            return None
        key = self.inner.serialize(value.key) or b""
        window = value.window
        return (
            key
            + window.end.to_bytes(8, "big", signed=True)
            + window.start.to_bytes(8, "big", signed=True)
        )

    def deserialize(self, data: bytes | None) -> Windowed | None:
        if data is None:
            return None
        end = int.from_bytes(data[-16:-8], "big", signed=True)
        start = int.from_bytes(data[-8:], "big", signed=True)
        return Windowed(self.inner.deserialize(data[:-16]), Window(start, end))
