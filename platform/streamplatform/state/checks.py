"""Argument checks shared by the stores; each error names the argument at fault."""

from __future__ import annotations

__all__ = ["check_bytes", "check_limit", "check_time", "check_timestamp"]

MAX_TIMESTAMP = 2**63 - 1


def check_bytes(name: str, value: object) -> None:
    """Raise TypeError naming the argument unless `value` is bytes."""
    if not isinstance(value, bytes):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")


def check_time(name: str, value: object) -> int:
    """A time to query at: any int (milliseconds)."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an int (milliseconds), got {type(value).__name__}")
    return value


def check_timestamp(name: str, value: object) -> int:
    """A record timestamp: an int between 0 and 2**63 - 1 (milliseconds), as in Kafka."""
    check_time(name, value)
    if not 0 <= value <= MAX_TIMESTAMP:  # type: ignore[operator]
        raise ValueError(f"{name} must be between 0 and 2**63 - 1, got {value}")
    return value  # type: ignore[return-value]


def check_limit(name: str, value: int | None) -> int | None:
    """An optional count limit: None (unlimited) or an int >= 0."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be None (unlimited) or an int >= 0, got {value!r}")
    return value
