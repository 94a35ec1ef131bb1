"""Exception handlers (KIP-1033/1034): the protocol, the two built-ins, loading and calling.

Three settings choose a handler each: ``default.deserialization.exception.handler``,
``processing.exception.handler`` and ``default.production.exception.handler``. The value is
``log_and_fail`` (default), ``log_and_continue`` or an import path to a class with
``handle(context, record, exception) -> Response`` (an optional ``configure(config)`` is called
once with the StreamsConfig).

The built-ins write one default DLQ record per error when ``errors.dead.letter.queue.topic.name``
is set; custom handlers ignore that setting and return their own DLQ records.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from streamplatform.config import BUILTIN_HANDLERS, ConfigError, StreamsConfig, load_object
from streamplatform.errors.context import ErrorHandlerContext
from streamplatform.errors.dlq import build_dlq_record
from streamplatform.errors.exceptions import HandlerError
from streamplatform.errors.response import Response

log = logging.getLogger(__name__)

DESERIALIZATION = "default.deserialization.exception.handler"
PROCESSING = "processing.exception.handler"
PRODUCTION = "default.production.exception.handler"
HANDLER_SETTINGS = (DESERIALIZATION, PROCESSING, PRODUCTION)
DLQ_TOPIC_SETTING = "errors.dead.letter.queue.topic.name"


@runtime_checkable
class ExceptionHandler(Protocol):
    """``record`` is the raw ConsumedRecord (deserialization), the processor's Record
    (processing) or the ProducerRecord (production)."""

    def handle(
        self, context: ErrorHandlerContext, record: Any, exception: BaseException
    ) -> Response: ...


class _BuiltinHandler:
    def __init__(self, dlq_topic: str | None = None) -> None:
        self.dlq_topic = dlq_topic

    def _dlq_records(self, context: ErrorHandlerContext, exception: BaseException) -> list[Any]:
        if self.dlq_topic is None:
            return []
        return [build_dlq_record(self.dlq_topic, context, exception)]

    def _describe(self, context: ErrorHandlerContext, exception: BaseException) -> str:
        where = f"{context.topic}-{context.partition}@{context.offset}"
        return (
            f"{type(exception).__name__}: {exception} at {context.processor_node_name} "
            f"(task {context.task_id}, source {where})"
        )


class LogAndFailExceptionHandler(_BuiltinHandler):
    """Log the error and fail the task (the default)."""

    def handle(
        self, context: ErrorHandlerContext, record: Any, exception: BaseException
    ) -> Response:
        log.error("Failing the task on %s", self._describe(context, exception))
        return Response.fail(self._dlq_records(context, exception))


class LogAndContinueExceptionHandler(_BuiltinHandler):
    """Log the error, drop the record and go on."""

    def handle(
        self, context: ErrorHandlerContext, record: Any, exception: BaseException
    ) -> Response:
        log.warning("Skipping a record after %s", self._describe(context, exception))
        return Response.resume(self._dlq_records(context, exception))


_BUILTINS: dict[str, type[LogAndFailExceptionHandler] | type[LogAndContinueExceptionHandler]] = {
    "log_and_fail": LogAndFailExceptionHandler,
    "log_and_continue": LogAndContinueExceptionHandler,
}
assert set(_BUILTINS) == set(BUILTIN_HANDLERS)


def load_handler(config: StreamsConfig, setting: str) -> ExceptionHandler:
    """The handler that ``setting`` names, ready to use."""
    value = config[setting]
    if value in _BUILTINS:
        return _BUILTINS[value](config[DLQ_TOPIC_SETTING])
    target = load_object(value)
    handler = target() if isinstance(target, type) else target
    if not callable(getattr(handler, "handle", None)):
        raise ConfigError(f"{setting}={value!r}: has no handle(context, record, exception)")
    configure = getattr(handler, "configure", None)
    if callable(configure):
        configure(config)
    return handler  # type: ignore[no-any-return]


def call_handler(
    handler: ExceptionHandler,
    setting: str,
    context: ErrorHandlerContext,
    record: Any,
    exception: BaseException,
) -> Response:
    """Ask ``handler``; a handler that raises or answers no Response fails, naming it."""
    name = f"{setting} ({type(handler).__module__}.{type(handler).__qualname__})"
    try:
        response = handler.handle(context, record, exception)
    except Exception as handler_exception:
        raise HandlerError(
            f"The {name} raised {type(handler_exception).__name__}: {handler_exception} "
            f"while handling {type(exception).__name__}: {exception}"
        ) from handler_exception
    if not isinstance(response, Response):
        raise HandlerError(f"The {name} returned {response!r}, not a Response")
    return response
