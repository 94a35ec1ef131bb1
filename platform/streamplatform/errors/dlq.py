"""The default dead letter queue record (KIP-1034), built in one place."""

from __future__ import annotations

import traceback

from streamplatform.errors.context import ErrorHandlerContext
from streamplatform.records import Headers, ProducerRecord

HEADER_PREFIX = "__streams.errors."
EXCEPTION_HEADER = HEADER_PREFIX + "exception"
MESSAGE_HEADER = HEADER_PREFIX + "message"
STACKTRACE_HEADER = HEADER_PREFIX + "stacktrace"
TOPIC_HEADER = HEADER_PREFIX + "topic"
PARTITION_HEADER = HEADER_PREFIX + "partition"
OFFSET_HEADER = HEADER_PREFIX + "offset"


def _utf8(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8", errors="replace")


def error_headers(context: ErrorHandlerContext, exception: BaseException) -> Headers:
    """The six ``__streams.errors.*`` headers describing ``exception`` at ``context``."""
    message = str(exception) if exception.args else None
    stacktrace = "".join(
        traceback.format_exception(type(exception), exception, exception.__traceback__)
    )
    return [
        (EXCEPTION_HEADER, _utf8(type(exception).__name__)),
        (MESSAGE_HEADER, _utf8(message)),
        (STACKTRACE_HEADER, _utf8(stacktrace)),
        (TOPIC_HEADER, _utf8(context.topic)),
        (PARTITION_HEADER, _utf8(str(context.partition))),
        (OFFSET_HEADER, _utf8(str(context.offset))),
    ]


def build_dlq_record(
    dlq_topic: str, context: ErrorHandlerContext, exception: BaseException
) -> ProducerRecord:
    """The default DLQ record: raw source key/value, the source headers, then error headers."""
    return ProducerRecord(
        topic=dlq_topic,
        key=context.source_raw_key,
        value=context.source_raw_value,
        timestamp=context.timestamp,
        headers=[*context.headers, *error_headers(context, exception)],
    )
