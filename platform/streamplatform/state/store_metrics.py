"""Kafka Streams' state-store operation metrics (``metrics.recording.level=DEBUG``): how many
calls of each operation a processor made on a store, and how long they took, in nanoseconds.

Kafka Streams records them in ``MeteredKeyValueStore``, the outermost layer of every store, only
at the DEBUG recording level: timing each call costs two clock reads. Here the same layer is the
processor-facing facade (facades.py): ``timed(facade)`` returns the store with each operation
timed, and its ``OperationTimings`` hand each batch's counts to the job's metrics
(``metrics.py``: ``put-latency-avg``, ``-max`` and ``put-rate`` and the same for the others).

What is timed is what a processor calls through ``context.get_state_store``: the stores of
users' processors and of the DSL operators that use the store interface. The dedup's and the
time windows' C cores keep their entries in memory and reach their stores in bulk at commit;
their lookups are not store operations here.

Operation names are Kafka Streams': ``put``, ``put-if-absent``, ``put-all``, ``get``,
``delete``, ``range`` (``reverse_range`` too), ``all`` (``reverse_all`` too), ``prefix-scan``.
A range's time runs from the call until its iterator is exhausted or closed, as Kafka Streams
times its iterators until ``close()``.

>>> import tempfile
>>> from streamplatform.serdes import Serdes
>>> from streamplatform.state import Stores
>>> from streamplatform.state.facades import facade_for
>>> spec = Stores.key_value_store_builder(
...     Stores.persistent_key_value_store("counts"), Serdes.string(), Serdes.long())
>>> with tempfile.TemporaryDirectory() as directory:
...     engine = spec.open(directory)
...     counts = timed(facade_for(spec, engine))
...     counts.put("a", 1); counts.put_all([("b", 2), ("c", 3)]); _ = counts.get("a")
...     _ = list(counts.range("a", "b"))
...     engine.close()
>>> sorted((op, n) for op, (n, _total, _most) in counts.timings.take().items())
[('get', 1), ('put', 1), ('put-all', 1), ('range', 1)]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from streamplatform.state.facades import KeyValueStore, VersionedStore

__all__ = ["OPERATIONS", "OperationTimings", "timed"]

# The facade's methods and the Kafka Streams operation each one counts as.
_KEY_VALUE = {
    "get": "get", "put": "put", "put_if_absent": "put-if-absent", "put_all": "put-all",
    "delete": "delete", "range": "range", "reverse_range": "range", "all": "all",
    "reverse_all": "all", "prefix_scan": "prefix-scan",
}  # fmt: skip
_VERSIONED = {"get": "get", "get_versions": "range", "put": "put", "delete": "delete"}
# Iterating methods: timed until the iterator ends.
_ITERATING = {"range", "reverse_range", "all", "reverse_all", "prefix_scan"}
OPERATIONS = tuple(dict.fromkeys([*_KEY_VALUE.values(), *_VERSIONED.values()]))


class OperationTimings:
    """Per operation: calls, total nanoseconds and the longest call, since the last ``take``."""

    __slots__ = ("_numbers",)

    def __init__(self) -> None:
        self._numbers: dict[str, list[int]] = {}

    def add(self, operation: str, nanoseconds: int) -> None:
        numbers = self._numbers.get(operation)
        if numbers is None:
            self._numbers[operation] = [1, nanoseconds, nanoseconds]
        else:
            numbers[0] += 1
            numbers[1] += nanoseconds
            if nanoseconds > numbers[2]:
                numbers[2] = nanoseconds

    def take(self) -> dict[str, tuple[int, int, int]]:
        """``{operation: (calls, total_ns, max_ns)}`` since the last take, and start over."""
        taken = {op: (n, total, most) for op, (n, total, most) in self._numbers.items()}
        self._numbers.clear()
        return taken


def _timed_call(method: Callable, operation: str) -> Callable:
    clock = time.perf_counter_ns

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.timings.add(operation, clock() - started)

    return call


def _timed_iteration(method: Callable, operation: str) -> Callable:
    clock = time.perf_counter_ns

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Iterator:
        started = clock()
        try:
            iterator = iter(method(self, *args, **kwargs))
        except BaseException:
            self.timings.add(operation, clock() - started)
            raise
        return _until_done(iterator, self.timings, operation, started)

    return call


def _until_done(iterator: Iterator, timings: OperationTimings, operation: str,
                started: int) -> Iterator:  # fmt: skip
    try:
        yield from iterator
    finally:  # exhausted, closed or collected
        timings.add(operation, time.perf_counter_ns() - started)


def _timed_class(base: type, methods: dict[str, str]) -> type:
    namespace: dict[str, Any] = {}
    for method, operation in methods.items():
        wrap = _timed_iteration if method in _ITERATING else _timed_call
        namespace[method] = wrap(getattr(base, method), operation)
    return type(f"Timed{base.__name__}", (base,), namespace)


_TIMED = {
    KeyValueStore: _timed_class(KeyValueStore, _KEY_VALUE),
    VersionedStore: _timed_class(VersionedStore, _VERSIONED),
}


def timed(facade: KeyValueStore | VersionedStore) -> Any:
    """``facade`` with each store operation timed into its ``timings`` (an ``OperationTimings``).
    Still an instance of its class: ``isinstance(store, KeyValueStore)`` holds."""
    cls = _TIMED[type(facade)]
    copy: Any = object.__new__(cls)
    copy.__dict__.update(facade.__dict__)
    copy.timings = OperationTimings()
    return copy
