"""Records and their coordinates, shared by the DSL, the error handlers, the stores and the runtime.

Headers are a list of ``(name, value)`` pairs, as in Kafka: order is kept, a name may repeat,
and a value may be None.
"""

from __future__ import annotations

from typing import Any, NamedTuple

Headers = list[tuple[str, bytes | None]]
# The headers of every record that has none: one shared list, never modified.
NO_HEADERS: Headers = []
# The source of an output record produced outside any source record (a punctuation): what a
# task records beside such an output, in a ConsumedRecord's layout.
NO_SOURCE = (None, -1, -1, None, None, None, None)


class TopicPartition(NamedTuple):
    """One partition of a Kafka topic, as used for committed offsets."""

    topic: str
    partition: int


class Record(NamedTuple):
    """A record as processors see it: typed key and value, timestamp (ms), headers."""

    key: Any
    value: Any
    timestamp: int
    headers: Headers = []


class ConsumedRecord(NamedTuple):
    """A record as read from a source topic, still raw bytes, with its coordinates."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = []


class ProducerRecord(NamedTuple):
    """A record to write: output of a sink, or a dead letter queue record.

    ``partition`` None lets the runtime choose (by key hash); key and value are bytes here.
    """

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers = []
    partition: int | None = None
