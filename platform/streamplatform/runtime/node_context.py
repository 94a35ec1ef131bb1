"""What a processor sees of its task (Kafka Streams' ProcessorContext, one per processor node
and task: ``NodeContext``), and a punctuation schedule (``Punctuation``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from streamplatform.dsl.graph import ProcessorNode
from streamplatform.dsl.processor import Engine, PunctuationType
from streamplatform.records import Record
from streamplatform.state.stores import duration_ms


class Punctuation:
    """One schedule, as Kafka Streams' PunctuationSchedule: it fires when the time reaches
    ``next_time``; the next time is the following multiple of the interval after the time it
    fired at, so missed intervals are skipped, not caught up. A stream-time schedule starts
    at 0 (the first record fires it, later ones fire on multiples of the interval); a
    wall-clock one at the time it was scheduled plus the interval."""

    def __init__(
        self, node: str, interval: int, kind: PunctuationType, call: Callable[[int], None],
        next_time: int,
    ):  # fmt: skip
        self.node, self.interval, self.kind, self.call = node, interval, kind, call
        self.next_time = next_time

    def advance(self, now: int) -> None:
        """Move ``next_time`` past ``now``, after firing at ``now``."""
        missed = max(0, now - self.next_time) // self.interval
        self.next_time += (missed + 1) * self.interval


class NodeContext:
    """The ProcessorContext of one processor node in one task."""

    def __init__(self, task: Any, node: ProcessorNode) -> None:  # task: runtime.task.Task
        self._task = task
        self._node = node
        self._children = [task._deliver[child] for child in node.children]
        self._child = dict(zip(node.children, self._children, strict=True))
        if len(self._children) == 1:  # most nodes: forward without the loop
            only, named = self._children[0], self._child

            def forward_to_the_child(record: Record, child: str | None = None) -> None:
                (only if child is None else named[child])(record)

            self.forward = forward_to_the_child  # type: ignore[method-assign]
        # For the built-in processors' per-record paths (dsl.processor.engine).
        self.engine = Engine(task, node.name, self._children)

    application_id = property(lambda self: self._task.application_id)
    task_id = property(lambda self: str(self._task.task_id))
    stream_time = property(lambda self: self._task.stream_time)
    # The current record is a ConsumedRecord or a plain tuple in its layout (see
    # Task.process_all): read by index.
    topic = property(lambda self: self._task.current[0] if self._task.current else None)
    partition = property(lambda self: self._task.current[1] if self._task.current else -1)
    offset = property(lambda self: self._task.current[2] if self._task.current else None)
    headers = property(lambda self: list(self._task.current[6]) if self._task.current else [])

    @property
    def cache_max_bytes(self) -> int:
        """This processor's share of ``statestore.cache.max.bytes`` (Task.cache_share): its
        record cache (dsl/aggregate.py) or its ids in memory (dsl/dedup.py)."""
        return self._task.cache_share

    def current_system_time_ms(self) -> int:
        """The task's wall-clock time: on Spark the batch's, fixed when it was planned (a
        replay sees the same), in TopologyTestDriver the driver's mocked time."""
        return self._task.wall_clock()

    def current_stream_time_ms(self) -> int:
        """The task's stream time: the largest record timestamp it has seen (-1 before any)."""
        return self._task.stream_time

    def forward(self, record: Record, child: str | None = None) -> None:
        if child is not None:
            self._child[child](record)
            return
        for deliver in self._children:
            deliver(record)

    def get_state_store(self, name: str) -> Any:
        """The store as Kafka Streams gives it to a processor (state/facades.py): typed by
        its serdes, reading the task's own uncommitted writes, without the commit protocol."""
        self._check_declared(name)
        return self._task.store_facade(name)

    def engine_store(self, name: str) -> Any:
        """The engine's store itself, for the built-in processors (dedup, joins, tables),
        which work on bytes and through the store's writing transaction."""
        self._check_declared(name)
        return self._task.engine_store(name)

    def _check_declared(self, name: str) -> None:
        if name not in self._node.stores:
            raise ValueError(
                f"{self._node.name} did not declare store {name!r}: name it where the "
                f"processor is added (process(supplier, {name!r}))"
            )

    def schedule(
        self, interval: timedelta | int, kind: PunctuationType, punctuator: Callable[[int], None]
    ) -> None:
        millis = duration_ms(interval, "interval")
        if millis <= 0:
            raise ValueError(f"punctuation interval must be positive, got {interval!r}")
        start = self._task.wall_clock() + millis if kind is PunctuationType.WALL_CLOCK_TIME else 0
        self._task.punctuations.append(Punctuation(self._node.name, millis, kind, punctuator,
                                                    start))  # fmt: skip

    def log_version(self, store: str, key: bytes, value: bytes | None, timestamp: int) -> None:
        """Table sources report what they write to a versioned store (for its Delta snapshot)."""
        self._task.versions.append((store, key, value, timestamp))

    def restore_stream_time(self, stream_time: int) -> None:
        """Stores that saved the task's stream time give it back after a restart."""
        self._task.stream_time = max(self._task.stream_time, stream_time)
