"""Exceptions that end a task's processing."""

from __future__ import annotations

from streamplatform.exceptions import StreamPlatformError


class StreamsError(StreamPlatformError, RuntimeError):
    """Base of streamplatform's processing errors."""


class TaskFailedError(StreamsError):
    """A handler answered ``fail``: the task stops and nothing of the batch is committed."""

    def __init__(self, message: str, task_id: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class HandlerError(StreamsError):
    """An exception handler raised, or answered something that is not a Response."""
