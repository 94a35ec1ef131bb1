"""What an exception handler answers (KIP-1033/1034): resume or fail, plus DLQ records."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from streamplatform.records import ProducerRecord


class Action(Enum):
    RESUME = "resume"
    FAIL = "fail"
    RETRY = "retry"  # production errors only: try the write again


@dataclass(frozen=True)
class Response:
    """A handler's decision. Build it with :meth:`resume`, :meth:`fail` or :meth:`retry`."""

    action: Action
    dlq_records: tuple[ProducerRecord, ...] = field(default=())

    @classmethod
    def resume(cls, dlq_records: Iterable[ProducerRecord] = ()) -> Response:
        """Drop the failed record and go on; the DLQ records are written with the task's output."""
        return cls(Action.RESUME, tuple(dlq_records))

    @classmethod
    def fail(cls, dlq_records: Iterable[ProducerRecord] = ()) -> Response:
        """Fail the task; nothing of the batch is committed, the DLQ records are still written."""
        return cls(Action.FAIL, tuple(dlq_records))

    @classmethod
    def retry(cls) -> Response:
        """Production errors that may pass on a second try (a broker away for a moment)."""
        return cls(Action.RETRY)
