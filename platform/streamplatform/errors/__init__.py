"""Error handling with a dead letter queue (KIP-1033 / KIP-1034)."""

from streamplatform.errors.context import ErrorHandlerContext
from streamplatform.errors.dlq import build_dlq_record, error_headers
from streamplatform.errors.exceptions import HandlerError, StreamsError, TaskFailedError
from streamplatform.errors.handlers import (
    ExceptionHandler,
    LogAndContinueExceptionHandler,
    LogAndFailExceptionHandler,
)
from streamplatform.errors.response import Action, Response

__all__ = [
    "Action",
    "ErrorHandlerContext",
    "ExceptionHandler",
    "HandlerError",
    "LogAndContinueExceptionHandler",
    "LogAndFailExceptionHandler",
    "Response",
    "StreamsError",
    "TaskFailedError",
    "build_dlq_record",
    "error_headers",
]
