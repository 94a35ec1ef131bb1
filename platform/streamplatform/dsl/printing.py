"""``KStream.print(Printed...)``: each record as a line, as Kafka Streams' ``Printed`` prints it.

A line is ``[label]: key, value`` (the label defaults to the print's processor name, as in
Kafka Streams; ``with_key_value_mapper`` replaces ``key, value``). Kafka Streams writes Java's
``toString`` of the key and value, so a None is ``null`` here too. To standard output
(``Printed.to_sys_out()``) or appended to a file (``Printed.to_file(path)``), flushed after each
record so that a crash loses no line already printed.

On Spark a task runs in an executor's Python worker: its lines go to that executor's stdout
(the driver's console for a task the driver runs itself), as a Kafka Streams application's go
to its instance's. A replayed batch prints its records again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import IO, Any

from streamplatform.dsl.processor import Processor
from streamplatform.records import Record

__all__ = ["Printed"]


@dataclass(frozen=True)
class Printed:
    """Where and how ``KStream.print`` writes (Kafka Streams' ``Printed``)."""

    path: str | None = None  # None: standard output
    label: str | None = None
    mapper: Callable[[Any, Any], str] | None = None

    @staticmethod
    def to_sys_out() -> Printed:
        return Printed()

    @staticmethod
    def to_file(path: str) -> Printed:
        return Printed(path=str(path))

    def with_label(self, label: str) -> Printed:
        return replace(self, label=label)

    def with_key_value_mapper(self, mapper: Callable[[Any, Any], str]) -> Printed:
        return replace(self, mapper=mapper)


def _text(value: Any) -> str:
    return "null" if value is None else str(value)


class PrintProcessor(Processor):
    """Writes each record's line; forwards nothing."""

    def __init__(self, printed: Printed, label: str) -> None:
        self.printed = printed
        self.label = printed.label if printed.label is not None else label
        self._out: IO[str] | None = None

    def process(self, record: Record) -> None:
        out = self._out
        if out is None:
            path = self.printed.path
            out = self._out = sys.stdout if path is None else open(path, "a", encoding="utf-8")  # noqa: SIM115
        mapper = self.printed.mapper
        text = mapper(record[0], record[1]) if mapper else f"{_text(record[0])}, {_text(record[1])}"
        out.write(f"[{self.label}]: {text}\n")
        out.flush()

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stdout:
            self._out.close()
        self._out = None


def takes_key(function: Callable[..., Any], plain: int) -> bool:
    """Whether ``function`` takes the key first: Kafka Streams' ``...WithKey`` variants
    (``ValueMapperWithKey``) as functions of ``plain + 1`` required positional arguments. A
    function whose signature cannot be read (some builtins) takes ``plain``."""
    import inspect

    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY,
                                                      p.POSITIONAL_OR_KEYWORD)]  # fmt: skip
    required = [p for p in positional if p.default is p.empty]
    return len(required) == plain + 1


def key_joiner(joiner: Callable[..., Any]) -> Callable[[Any, Any, Any], Any]:
    """``joiner`` as the join processors call it, ``(key, left, right)``: itself when it takes
    the key first (Kafka Streams' ``ValueJoinerWithKey``), else one that drops the key."""
    if takes_key(joiner, 2):
        return joiner

    def without_key(key: Any, left: Any, right: Any) -> Any:
        return joiner(left, right)

    return without_key
