"""The logical graph a StreamsBuilder records: sources, processors and sinks, linked by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from streamplatform.dsl.processor import Processor
from streamplatform.records import Headers
from streamplatform.serdes import Serde

REPARTITION_SUFFIX = "-repartition"


@dataclass
class SourceNode:
    name: str
    topic: str
    key_serde: Serde
    value_serde: Serde
    internal: bool = False  # a repartition topic: its name gets the application.id prefix
    children: list[str] = field(default_factory=list)
    # The records' event time: extract(record, partition_time) -> ms; None: the Kafka
    # record's timestamp (or default.timestamp.extractor).
    timestamp_extractor: Callable[[Any, int], int] | None = None


@dataclass
class ProcessorNode:
    name: str
    supplier: Callable[[], Processor]
    stores: tuple[str, ...] = ()
    parents: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)


class RecordContext(NamedTuple):
    """Kafka Streams' ``RecordContext``, as a topic name extractor sees it: the source record
    being processed (its topic, partition and offset: None, -1, -1 under a punctuation) and
    the timestamp and headers of the record being written."""

    topic: str | None
    partition: int
    offset: int
    timestamp: int
    headers: Headers


class TopicNameExtractor(Protocol):
    """Kafka Streams' ``TopicNameExtractor``: the topic each record is written to
    (``KStream.to(extractor)``). A callable, or an object with this ``extract`` method."""

    def extract(self, key: Any, value: Any, record_context: RecordContext) -> str: ...


@dataclass
class SinkNode:
    name: str
    topic: str
    key_serde: Serde
    value_serde: Serde
    internal: bool = False
    # For repartitioning by something other than the key (KIP-655's `deduplicate` by id):
    # (key, value) -> the object whose canonical bytes choose the partition.
    partition_by: Callable[[Any, Any], Any] | None = None
    parents: list[str] = field(default_factory=list)
    # Kafka Streams' StreamPartitioner for an internal topic: partitioner(key, value,
    # partitions) -> the partition (None: by the key's bytes, as without one).
    partitioner: Callable[[Any, Any, int], int | None] | None = None
    # Dynamic routing (``KStream.to(extractor)``): extract(key, value, record_context) -> the
    # topic of each record; ``topic`` is then only a label for describe().
    topic_extractor: Callable[[Any, Any, RecordContext], str] | None = None


Node = SourceNode | ProcessorNode | SinkNode


def as_extractor(given: Any) -> Callable[[Any, int], int] | None:
    """A TimestampExtractor as a callable ``extract(record, partition_time)``: an object with
    ``extract`` (Kafka Streams' interface; a class is instantiated first), or a callable."""
    if given is None:
        return None
    if isinstance(given, type) and callable(getattr(given, "extract", None)):
        given = given()
    extract = getattr(given, "extract", None)
    if callable(extract):
        return extract  # type: ignore[no-any-return]
    if not callable(given):
        raise TypeError(f"a timestamp extractor must be callable or have extract(), got {given!r}")
    return given  # type: ignore[no-any-return]


def as_topic_extractor(given: Any) -> Callable[[Any, Any, RecordContext], str]:
    """A TopicNameExtractor as a callable ``extract(key, value, record_context)``: an object
    with ``extract`` (a class is instantiated first), or a callable."""
    if isinstance(given, type) and callable(getattr(given, "extract", None)):
        given = given()
    extract = getattr(given, "extract", None)
    if callable(extract):
        return extract  # type: ignore[no-any-return]
    if not callable(given):
        raise TypeError(
            "to: takes a topic name (str) or a topic name extractor, a callable "
            f"(key, value, record_context) -> topic or an object with extract(), got {given!r}"
        )
    return given  # type: ignore[no-any-return]


def topic_name(topic: str, internal: bool, application_id: str) -> str:
    """Internal (repartition) topics are named ``<application.id>-<name>-repartition``."""
    return f"{application_id}-{topic}" if internal else topic
