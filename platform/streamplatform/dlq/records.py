"""A dead letter queue record, decoded: the raw source record, where it came from, what failed.

A DLQ record (KIP-1034, built by ``streamplatform.errors.dlq``) carries the failed record's raw
key and value, its original headers, then six ``__streams.errors.*`` headers: exception class,
message, stack trace, and the source topic, partition and offset. The runtime's Delta mirror
(``<root>/<application.id>/_dlq``) adds the source coordinates and the batch as columns.

A record the replay re-published carries ``__streamplatform.replay.*`` headers (see
``replay.py``); when it fails again, those come back inside its new DLQ record and tell which
original it is and how many attempts it has had.

    >>> record = DlqRecord.from_headers(
    ...     key=b"USD", value=b"{not json", timestamp=5,
    ...     headers=[("trace", b"1"), ("__streams.errors.exception", b"SerializationError"),
    ...              ("__streams.errors.message", b"bad json"), ("__streams.errors.topic", b"tx"),
    ...              ("__streams.errors.partition", b"2"), ("__streams.errors.offset", b"41")])
    >>> record.source, record.error.exception, record.original_headers
    (SourceCoordinates(topic='tx', partition=2, offset=41), 'SerializationError', [('trace', b'1')])
    >>> record.original, record.attempt
    (SourceCoordinates(topic='tx', partition=2, offset=41), 0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from streamplatform.errors.dlq import (
    EXCEPTION_HEADER,
    HEADER_PREFIX,
    MESSAGE_HEADER,
    OFFSET_HEADER,
    PARTITION_HEADER,
    STACKTRACE_HEADER,
    TOPIC_HEADER,
)
from streamplatform.records import Headers

REPLAY_PREFIX = "__streamplatform.replay."
REPLAY_OF_HEADER = REPLAY_PREFIX + "of"  # "<topic>/<partition>/<offset>" of the first failure
REPLAY_SOURCE_HEADER = REPLAY_PREFIX + "source"  # the replayed DLQ record's own coordinates
REPLAY_ATTEMPT_HEADER = REPLAY_PREFIX + "attempt"  # 1 for the first replay
REPLAY_BATCH_HEADER = REPLAY_PREFIX + "batch"  # "<application.id>/<replay batch>"


class SourceCoordinates(NamedTuple):
    """Where a record was read: the identity the replay tracks records by."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @classmethod
    def parse(cls, text: str) -> SourceCoordinates:
        """``"<topic>/<partition>/<offset>"``; the topic may itself contain ``/``."""
        topic, partition, offset = text.rsplit("/", 2)
        return cls(topic, int(partition), int(offset))


@dataclass(frozen=True)
class ErrorInfo:
    """The ``__streams.errors.*`` headers, decoded (None where a header is missing)."""

    exception: str | None
    message: str | None
    stacktrace: str | None
    topic: str | None
    partition: int | None
    offset: int | None

    @classmethod
    def from_headers(cls, headers: Iterable[tuple[str, bytes | None]]) -> ErrorInfo:
        """The last value of each error header wins (a record failing twice carries both)."""
        found: dict[str, str | None] = {}
        for name, value in headers:
            if name.startswith(HEADER_PREFIX):
                found[name] = None if value is None else value.decode("utf-8", errors="replace")

        def number(name: str) -> int | None:
            text = found.get(name)
            try:
                return None if text is None else int(text)
            except ValueError:
                return None

        return cls(
            exception=found.get(EXCEPTION_HEADER),
            message=found.get(MESSAGE_HEADER),
            stacktrace=found.get(STACKTRACE_HEADER),
            topic=found.get(TOPIC_HEADER),
            partition=number(PARTITION_HEADER),
            offset=number(OFFSET_HEADER),
        )


@dataclass(frozen=True)
class DlqRecord:
    """One DLQ record: raw source key/value/timestamp, headers, source coordinates, error."""

    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers
    source: SourceCoordinates
    error: ErrorInfo
    dlq_batch_id: int | None = None  # the mirror's batch_id; None when read from the topic
    dlq_topic: str | None = None
    replay_of: SourceCoordinates | None = field(default=None)
    attempt: int = 0  # replays this record's original has had before this failure

    @property
    def original(self) -> SourceCoordinates:
        """The first failure's coordinates: this record's own unless it is a failed replay."""
        return self.replay_of or self.source

    @property
    def original_headers(self) -> Headers:
        """The headers the record had before it failed: no error or replay headers."""
        return [
            (name, value)
            for name, value in self.headers
            if not name.startswith(HEADER_PREFIX) and not name.startswith(REPLAY_PREFIX)
        ]

    @classmethod
    def from_headers(
        cls,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers,
        source: SourceCoordinates | None = None,
        dlq_batch_id: int | None = None,
        dlq_topic: str | None = None,
    ) -> DlqRecord:
        """Decode a DLQ record; ``source`` defaults to the error headers' coordinates."""
        error = ErrorInfo.from_headers(headers)
        if source is None:
            if error.topic is None or error.partition is None or error.offset is None:
                raise ValueError(
                    "A DLQ record without __streams.errors.topic/partition/offset headers and "
                    "without source coordinates cannot be tracked; read it from the mirror."
                )
            source = SourceCoordinates(error.topic, error.partition, error.offset)
        replay = {name: v for name, v in headers if name.startswith(REPLAY_PREFIX)}
        replay_of = replay.get(REPLAY_OF_HEADER)
        attempt = replay.get(REPLAY_ATTEMPT_HEADER)
        return cls(
            key=key,
            value=value,
            timestamp=int(timestamp),
            headers=list(headers),
            source=source,
            error=error,
            dlq_batch_id=dlq_batch_id,
            dlq_topic=dlq_topic,
            replay_of=None if replay_of is None else SourceCoordinates.parse(replay_of.decode()),
            attempt=0 if attempt is None else int(attempt.decode()),
        )

    @classmethod
    def from_mirror_row(cls, row: Mapping[str, Any]) -> DlqRecord:
        """A row of the Delta mirror (a Spark Row's ``asDict()`` or a pandas row)."""
        headers = [
            (h["key"], _bytes(h["value"]))
            for h in (row["headers"] if row["headers"] is not None else [])
        ]
        return cls.from_headers(
            key=_bytes(row["key"]),
            value=_bytes(row["value"]),
            timestamp=int(row["timestamp"]),
            headers=headers,
            source=SourceCoordinates(
                row["source_topic"], int(row["source_partition"]), int(row["source_offset"])
            ),
            dlq_batch_id=int(row["batch_id"]),
            dlq_topic=row.get("topic"),
        )


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)
