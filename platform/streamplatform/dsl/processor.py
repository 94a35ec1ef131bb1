"""The Processor API: what a topology node does with a record, and what it may ask the task.

User processors (``KStream.process``) and the DSL's own operators are the same kind of object:
``init(context)`` once, ``process(record)`` per record, ``close()`` at the end. A processor
passes records on with ``context.forward(record)``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from streamplatform.records import Headers, Record


class PunctuationType(enum.Enum):
    STREAM_TIME = "stream_time"  # fires as record timestamps move the task's stream time
    WALL_CLOCK_TIME = "wall_clock_time"  # fires as the (driver's or system) clock moves


class ProcessorContext(Protocol):
    """What a processor may see and do, given to ``Processor.init``."""

    @property
    def application_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def stream_time(self) -> int: ...
    @property
    def topic(self) -> str | None: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int | None: ...
    @property
    def headers(self) -> Headers: ...

    def forward(self, record: Record, child: str | None = None) -> None:
        """Pass ``record`` to every child node, or to the child named ``child`` only."""
        ...

    def current_system_time_ms(self) -> int:
        """The wall-clock time to use instead of reading the clock: on Spark the batch's,
        fixed when it was planned, so that a replayed batch sees what its first attempt saw
        (docs/guarantees.md); in TopologyTestDriver the driver's mocked time."""
        ...

    def current_stream_time_ms(self) -> int:
        """The task's stream time: the largest record timestamp it has seen (-1 before any)."""
        ...

    def get_state_store(self, name: str) -> Any:
        """The store ``name`` declared with the processor, as a ``KeyValueStore`` or
        ``VersionedStore`` (streamplatform.state): typed by the serdes it was declared with,
        reading the processor's own uncommitted writes."""
        ...

    def schedule(
        self, interval: timedelta | int, kind: PunctuationType, punctuator: Callable[[int], None]
    ) -> None: ...


class EngineTask(Protocol):
    """What the runtime's task (``runtime.task.Task``) offers the built-in processors' per-record
    paths beyond ``ProcessorContext``; internal, free to change with them."""

    # The source record being processed (a ConsumedRecord, or a tuple in its layout: topic,
    # partition, offset, timestamp, key, value, headers); None between records. The C cores
    # (_dedup_core.c, _window_core.c, _sliding_core.c, _join_core.c) read it under this name.
    current: Any
    stream_time: int  # the largest timestamp the task has read (-1 before any)
    shared: dict[str, Any]  # what the built-in processors of one task share, by a name

    def direct_sink(self, node: str) -> tuple[Any, str, list, list] | None:
        """The sink node ``node`` may write to itself, as its delivery function would."""
        ...


@dataclass(frozen=True)
class Engine:
    """The runtime behind a processor's context: its task, its node's name and its children's
    delivery functions (``engine(context)``)."""

    task: EngineTask
    node: str
    children: list[Callable[[Record], None]]


def engine(context: Any) -> Engine | None:
    """The runtime behind ``context`` (``runtime.node_context.NodeContext.engine``), for the
    built-in processors' per-record paths; None for any other ProcessorContext, which they
    then use through the protocol."""
    found = getattr(context, "engine", None)
    return found if isinstance(found, Engine) else None


def single_forward(context: ProcessorContext) -> Callable[[Record], None]:
    """How a built-in processor forwards a record: with the runtime's context and a single
    child, that child's delivery function itself (no forward loop per record); else
    ``context.forward``."""
    found = engine(context)
    children = None if found is None else found.children
    return children[0] if children is not None and len(children) == 1 else context.forward


def engine_store(context: ProcessorContext, name: str) -> Any:
    """The engine's own store behind ``name`` (bytes, the writing transaction): for the
    built-in processors only. A user's processor gets ``context.get_state_store(name)``."""
    return context.engine_store(name)  # type: ignore[attr-defined]


class Processor:
    """Base class for processors; override ``process`` (and ``init`` / ``close`` if needed)."""

    context: ProcessorContext

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, record: Record) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    # What the engine asks of a processor (runtime/task.py). The defaults suit any processor;
    # the built-in operators override them. The engine knows no operator by its class.

    #: Declared True by a class (not inherited) whose processors forward only the record they
    #: were given, unchanged, or nothing: a sink fed only through such processors from a
    #: source of the same serdes writes the bytes it read instead of serializing again.
    forwards_unchanged = False

    #: Declared True by a class (not inherited) whose processors forward records with the
    #: value they were given (another key, say: a re-keying), or nothing. With
    #: ``forwards_unchanged`` processors they let a repartition sink write the value's bytes
    #: as read (runtime/sink_writers.py).
    forwards_value_unchanged = False

    def reads_values(self) -> bool:
        """False when the processor never looks into a record's value, only at whether it
        is None (count()): a repartition topic read only by such processors is not decoded.
        Asked once, when the task is built."""
        return True

    def flush(self) -> None:
        """Forward what the processor holds back until a commit (the aggregations' record
        cache: one update per key per commit). The engine calls it before each commit."""

    def uses_record_cache(self) -> bool:
        """True when the processor keeps state in memory within its share of the task's
        ``statestore.cache.max.bytes`` (``context.cache_max_bytes``); the engine asks before
        ``init`` and divides the budget between those that do."""
        return False

    def held_writes(self) -> dict[str, Callable[[], bool]]:
        """Stores whose writes this processor holds back before handing them over (at
        ``before_commit``), each with the check of the store's uncommitted limits
        (``statestore.uncommitted.max.*``) that counts the held writes too."""
        return {}

    def task_metrics(self) -> dict[str, int]:
        """Counters since the processor was opened, as the batch's metrics name them (summed
        over the task's processors, the batch's share reported)."""
        return {}


class Filter(Processor):
    def __init__(self, predicate: Callable[[Any, Any], bool], negate: bool = False) -> None:
        self.predicate = predicate
        self.negate = negate

    def process(self, record: Record) -> None:
        if bool(self.predicate(record.key, record.value)) != self.negate:
            self.context.forward(record)


# Builds a Record without NamedTuple's Python-level _replace and __new__ (a third of a
# re-keying's per-record cost went there).
_new_record = tuple.__new__


class MapValues(Processor):
    def __init__(self, mapper: Callable[[Any], Any]) -> None:
        self.mapper = mapper

    def process(self, record: Record) -> None:
        key, value, timestamp, headers = record
        self.context.forward(_new_record(Record, (key, self.mapper(value), timestamp, headers)))


class Map(Processor):
    """``mapper(key, value) -> (new_key, new_value)``."""

    def __init__(self, mapper: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        self.mapper = mapper

    def process(self, record: Record) -> None:
        key, value = self.mapper(record.key, record.value)
        self.context.forward(_new_record(Record, (key, value, record[2], record[3])))


class SelectKey(Processor):
    forwards_value_unchanged = True

    def __init__(self, selector: Callable[[Any, Any], Any]) -> None:
        self.selector = selector

    def process(self, record: Record) -> None:
        key, value, timestamp, headers = record
        self.context.forward(_new_record(Record, (self.selector(key, value), value, timestamp,
                                                  headers)))  # fmt: skip


class MapValuesWithKey(Processor):
    """``map_values`` with Kafka Streams' ``ValueMapperWithKey``: ``mapper(key, value)``."""

    def __init__(self, mapper: Callable[[Any, Any], Any]) -> None:
        self.mapper = mapper

    def process(self, record: Record) -> None:
        key, value, timestamp, headers = record
        self.context.forward(_new_record(Record, (key, self.mapper(key, value), timestamp,
                                                  headers)))  # fmt: skip


class FlatMapValues(Processor):
    """``mapper(value)``, or ``mapper(key, value)`` with ``with_key``: each value it returns."""

    def __init__(self, mapper: Callable[..., Iterable[Any]], with_key: bool = False) -> None:
        self.mapper = mapper
        self.with_key = with_key

    def process(self, record: Record) -> None:
        key, value, timestamp, headers = record
        values = self.mapper(key, value) if self.with_key else self.mapper(value)
        for new_value in values:
            self.context.forward(_new_record(Record, (key, new_value, timestamp, headers)))


class FlatMap(Processor):
    """``mapper(key, value) -> iterable of (key, value)``: each pair a record, with the input
    record's timestamp and headers."""

    def __init__(self, mapper: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> None:
        self.mapper = mapper

    def process(self, record: Record) -> None:
        _, _, timestamp, headers = record
        for new_key, new_value in self.mapper(record[0], record[1]):
            self.context.forward(_new_record(Record, (new_key, new_value, timestamp, headers)))


class Foreach(Processor):
    """``action(key, value)`` for each record; forwards nothing (a terminal operation)."""

    def __init__(self, action: Callable[[Any, Any], None]) -> None:
        self.action = action

    def process(self, record: Record) -> None:
        self.action(record[0], record[1])


class Peek(Processor):
    def __init__(self, action: Callable[[Any, Any], None]) -> None:
        self.action = action

    def process(self, record: Record) -> None:
        self.action(record.key, record.value)
        self.context.forward(record)


class PassThrough(Processor):
    """Forwards every record unchanged (merge, the branches of split)."""

    forwards_unchanged = True

    def process(self, record: Record) -> None:
        self.context.forward(record)


class Branch(Processor):
    """``split()``: a record goes to the child of the first predicate that accepts it."""

    forwards_unchanged = True

    def __init__(self, predicates: list[Callable[[Any, Any], bool]], children: list[str]) -> None:
        self.predicates = predicates
        self.children = children

    def process(self, record: Record) -> None:
        for predicate, child in zip(self.predicates, self.children, strict=True):
            if predicate(record.key, record.value):
                self.context.forward(record, child)
                return
