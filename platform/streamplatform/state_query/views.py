"""Read-only, typed views of one task's store, one per kind of store, as Kafka Streams'
Interactive Queries name their query types (IQv2's ``KeyQuery``/``RangeQuery``,
``WindowKeyQuery``/``WindowRangeQuery``, ``VersionedKeyQuery``/``MultiVersionedKeyQuery``).

A view reads a store's committed data through the layout the processor that writes it keeps
(``view_for`` finds that processor in the topology):

- a store of a user's processor or a table (``KeyValueView``): the key and value serdes the
  store was declared with (the table's serdes for a table);
- an aggregation over all time (``ResultsView``): key -> result; the store's value is the
  result's timestamp (8 bytes) and its bytes;
- a windowed aggregation (``WindowView``: time windows, sliding windows) and a session
  aggregation (``SessionView``): ``Windowed(key, Window)`` -> result;
- a versioned store (``VersionedView``): versions of a key as of a time;
- a deduplication (``DedupView``): the ids it holds, with the timestamp of the record each was
  last forwarded with.

Range results are iterators over the store (RocksDB): they hold one entry at a time, however
large the store. Keys are ordered by their serialized bytes, as in Kafka Streams.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from streamplatform.dsl.aggregate import (
    _EMITTED_KEY,
    _KEYED_PREFIX,
    _STORE_TIME_KEY,
    _STREAM_TIME_KEY,
    KeyedWindowAggregation,
    StreamAggregate,
    keyed_prefix,
)
from streamplatform.dsl.dedup import DeduplicationProcessor
from streamplatform.dsl.dedup_store import ID_PREFIX, key_from_store, memory_key, store_key
from streamplatform.dsl.grouped_table import TableAggregate
from streamplatform.dsl.join import TableSource
from streamplatform.dsl.session_aggregate import SessionWindowAggregate
from streamplatform.dsl.sliding_aggregate import SlidingWindowAggregate
from streamplatform.dsl.window_aggregate import WINDOW_PREFIX, WindowedAggregate
from streamplatform.dsl.windows import Window, Windowed
from streamplatform.exceptions import StreamPlatformError
from streamplatform.serdes import Serde, Serdes
from streamplatform.state.transaction import prefix_end
from streamplatform.state.versioned import VersionedKeyValueStore, VersionedRecord

__all__ = [
    "DedupView",
    "KeyValueView",
    "QueryError",
    "ResultsView",
    "SessionView",
    "VersionedView",
    "WindowView",
    "view_for",
]

_TIMESTAMP = struct.Struct(">q")
_META_KEYS = frozenset({_STREAM_TIME_KEY, _STORE_TIME_KEY, _EMITTED_KEY})
_LATEST = 2**63 - 1


class QueryError(StreamPlatformError, ValueError):
    """A query the store cannot answer: an unknown or internal store, a wrong kind of query,
    a batch not committed or compacted away. The message names what to do instead."""


class _View:
    kind = "key_value"

    def __init__(self, name: str, engine: Any) -> None:
        self.name = name
        self._engine = engine

    def approximate_num_entries(self) -> int:
        """RocksDB's estimate of the keys the store holds (layout keys included)."""
        return int(self._engine.approximate_num_entries())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class KeyValueView(_View):
    """A key-value store: ``get``, ``range`` (both ends included, None open), ``all``,
    ``prefix_scan``, typed by the store's serdes (bytes where it declares none)."""

    def __init__(self, name: str, engine: Any, key_serde: Serde | None,
                 value_serde: Serde | None) -> None:  # fmt: skip
        super().__init__(name, engine)
        self.key_serde = key_serde or Serdes.bytes()
        self.value_serde = value_serde or Serdes.bytes()

    def get(self, key: Any) -> Any:
        raw = self._engine.get(_serialized(self.key_serde, key, self.name))
        return None if raw is None else self._value(raw)

    def range(self, from_key: Any = None, to_key: Any = None) -> Iterator[tuple[Any, Any]]:
        start = None if from_key is None else _serialized(self.key_serde, from_key, self.name)
        end = None if to_key is None else _serialized(self.key_serde, to_key, self.name) + b"\0"
        if start is not None and end is not None and start >= end:
            return iter(())
        return self._typed(self._engine.range(start, end))

    def all(self) -> Iterator[tuple[Any, Any]]:
        return self.range(None, None)

    def prefix_scan(self, prefix: Any, prefix_serde: Serde | None = None) -> Iterator[tuple]:
        raw = _serialized(prefix_serde or self.key_serde, prefix, self.name)
        return self._typed(self._engine.range(raw, prefix_end(raw)))

    def _value(self, raw: bytes) -> Any:
        return self.value_serde.deserialize(raw)

    def _typed(self, pairs: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[Any, Any]]:
        key_of = self.key_serde.deserialize
        for key, raw in pairs:
            if self._is_data(key):
                yield key_of(key), self._value(raw)

    def _is_data(self, key: bytes) -> bool:
        return True


class ResultsView(KeyValueView):
    """An aggregation over all time (count, reduce, aggregate of a grouped stream or table):
    key -> result, as Kafka Streams' timestamped key-value store; ``get_with_timestamp`` also
    gives the result's timestamp (the largest of the records aggregated)."""

    def get_with_timestamp(self, key: Any) -> tuple[Any, int] | None:
        raw = self._engine.get(_serialized(self.key_serde, key, self.name))
        return None if raw is None else (self._value(raw), _TIMESTAMP.unpack_from(raw)[0])

    def _value(self, raw: bytes) -> Any:
        return self.value_serde.deserialize(raw[8:])

    def _is_data(self, key: bytes) -> bool:
        return key not in _META_KEYS


class WindowView(_View):
    """A windowed aggregation (time or sliding windows): ``fetch(key, time_from, time_to)``
    gives ``(Window, result)`` of the key's windows that start in [time_from, time_to], in
    time order, as Kafka Streams' ``WindowStore.fetch``; ``fetch_all(time_from, time_to)`` and
    ``all()`` give ``(Windowed(key, Window), result)`` of every key."""

    kind = "window"

    def __init__(self, name: str, engine: Any, key_serde: Serde, result_serde: Serde,
                 size_ms: int, keyed: bool) -> None:  # fmt: skip
        super().__init__(name, engine)
        self.key_serde, self.result_serde = key_serde, result_serde
        self.size_ms = size_ms
        self._keyed = keyed  # sliding windows: b"k" + key layout; time windows: b"w" + start

    def fetch(self, key: Any, time_from: int = 0, time_to: int = _LATEST) -> list[tuple]:
        raw_key = _serialized(self.key_serde, key, self.name)
        found = []
        if self._keyed:
            prefix = keyed_prefix(raw_key)
            high = (
                prefix_end(prefix) if time_to >= _LATEST else prefix + _TIMESTAMP.pack(time_to + 1)
            )
            pairs = self._engine.range(prefix + _TIMESTAMP.pack(max(0, time_from)), high)
            for stored, raw in pairs:
                start = _TIMESTAMP.unpack_from(stored, len(prefix))[0]
                found.append((self._window(start), self._result(raw)))
            return found
        for stored, raw in self._engine.range(*self._time_bounds(time_from, time_to)):
            if stored[9:] == raw_key:
                found.append((self._window(_TIMESTAMP.unpack_from(stored, 1)[0]),
                              self._result(raw)))  # fmt: skip
        return found

    def fetch_all(self, time_from: int = 0, time_to: int = _LATEST) -> Iterator[tuple]:
        deserialize = self.key_serde.deserialize
        if self._keyed:
            for stored, raw in self._engine.range(_KEYED_PREFIX, prefix_end(_KEYED_PREFIX)):
                length = int.from_bytes(stored[1:5], "big")
                start = _TIMESTAMP.unpack_from(stored, 5 + length)[0]
                if time_from <= start <= time_to:
                    key = deserialize(stored[5 : 5 + length])
                    yield Windowed(key, self._window(start)), self._result(raw)
            return
        for stored, raw in self._engine.range(*self._time_bounds(time_from, time_to)):
            start = _TIMESTAMP.unpack_from(stored, 1)[0]
            yield Windowed(deserialize(stored[9:]), self._window(start)), self._result(raw)

    def all(self) -> Iterator[tuple]:
        return self.fetch_all()

    def _time_bounds(self, time_from: int, time_to: int) -> tuple[bytes, bytes]:
        low = WINDOW_PREFIX + _TIMESTAMP.pack(max(0, time_from))
        if time_to >= _LATEST:
            return low, prefix_end(WINDOW_PREFIX)  # type: ignore[return-value]
        return low, WINDOW_PREFIX + _TIMESTAMP.pack(time_to + 1)

    def _window(self, start: int) -> Window:
        return Window(start, start + self.size_ms)

    def _result(self, raw: bytes) -> Any:
        return self.result_serde.deserialize(raw[8:])


class SessionView(_View):
    """A session aggregation: ``fetch(key)`` gives ``(Window(start, end), result)`` of the
    key's sessions in end-time order, as Kafka Streams' ``SessionStore.fetch``; ``all()``
    gives ``(Windowed(key, Window), result)``."""

    kind = "session"

    def __init__(self, name: str, engine: Any, key_serde: Serde, result_serde: Serde) -> None:
        super().__init__(name, engine)
        self.key_serde, self.result_serde = key_serde, result_serde

    def fetch(self, key: Any) -> list[tuple[Window, Any]]:
        prefix = keyed_prefix(_serialized(self.key_serde, key, self.name))
        return [(_session(stored, len(prefix)), self.result_serde.deserialize(raw[8:]))
                for stored, raw in self._engine.range(prefix, prefix_end(prefix))]  # fmt: skip

    def all(self) -> Iterator[tuple[Windowed, Any]]:
        deserialize = self.key_serde.deserialize
        for stored, raw in self._engine.range(_KEYED_PREFIX, prefix_end(_KEYED_PREFIX)):
            length = int.from_bytes(stored[1:5], "big")
            key = deserialize(stored[5 : 5 + length])
            session = _session(stored, 5 + length)
            yield Windowed(key, session), self.result_serde.deserialize(raw[8:])


class VersionedView(_View):
    """A versioned store (a versioned table, or a user's): ``get(key, as_of=None)`` the
    version valid at ``as_of`` (the latest without), ``get_versions(key, from_ts, to_ts)``,
    each a ``VersionedRecord(value, timestamp, valid_to)`` with the value typed."""

    kind = "versioned"

    def __init__(self, name: str, engine: VersionedKeyValueStore, key_serde: Serde | None,
                 value_serde: Serde | None) -> None:  # fmt: skip
        super().__init__(name, engine)
        self.key_serde = key_serde or Serdes.bytes()
        self.value_serde = value_serde or Serdes.bytes()

    def get(self, key: Any, as_of: int | None = None) -> VersionedRecord | None:
        found = self._engine.get(_serialized(self.key_serde, key, self.name), as_of)
        return self._typed(found)

    def get_versions(self, key: Any, from_ts: int = 0, to_ts: int = _LATEST,
                     ascending: bool = False) -> list[VersionedRecord]:  # fmt: skip
        raw = _serialized(self.key_serde, key, self.name)
        return [self._typed(v) for v in self._engine.get_versions(raw, from_ts, to_ts, ascending)]  # type: ignore[misc]

    def _typed(self, record: VersionedRecord | None) -> VersionedRecord | None:
        if record is None:
            return None
        value = None if record.value is None else self.value_serde.deserialize(record.value)
        return VersionedRecord(value, record.timestamp, record.valid_to)


class DedupView(_View):
    """A deduplication's ids: ``get(id)`` the timestamp of the record last forwarded with
    ``id`` (None: not held, so a record with it would pass), ``all()`` ``(id, timestamp)``.
    An id is what the deduplication keys on: ``deduplicate_by_key``'s key,
    ``deduplicate_by_key_value``'s ``(key, id)``. ``all()`` gives a str id, or a pair of
    strs, as itself; any other id as its canonical bytes (identity.py)."""

    kind = "dedup"

    def get(self, identity: Any) -> int | None:
        raw = self._engine.get(store_key(memory_key(identity)))
        return None if raw is None else int(_TIMESTAMP.unpack_from(raw)[0])

    def all(self) -> Iterator[tuple[Any, int]]:
        for stored, raw in self._engine.range(ID_PREFIX, prefix_end(ID_PREFIX)):
            yield key_from_store(stored), int(_TIMESTAMP.unpack_from(raw)[0])


def _session(data: bytes, at: int) -> Window:
    end, start = _TIMESTAMP.unpack_from(data, at)[0], _TIMESTAMP.unpack_from(data, at + 8)[0]
    return Window(start, end)


def _serialized(serde: Serde, key: Any, store: str) -> bytes:
    if key is None:
        raise QueryError(f"store {store}: a key must not be None")
    raw = serde.serialize(key)
    if raw is None:
        raise QueryError(f"store {store}: key {key!r} serialized to None")
    return raw


_WRITERS = (TableSource, DeduplicationProcessor, WindowedAggregate, KeyedWindowAggregation,
            StreamAggregate, TableAggregate)  # fmt: skip


def writer_of(topology: Any, store: str) -> Any:
    """The processor (an instance from its node's supplier) that writes ``store``, when
    several use it (a stream-table join reads its table's store): a table, an aggregation,
    a deduplication or a user's processor first; None when no processor uses it."""
    found = [node.supplier() for node in topology.nodes.values()
             if store in getattr(node, "stores", ())]  # fmt: skip
    for processor in found:
        if isinstance(processor, _WRITERS) or _is_users(processor):
            return processor
    return found[0] if found else None


def _is_users(processor: Any) -> bool:
    return not type(processor).__module__.startswith("streamplatform.")


def view_for(topology: Any, store: str, engine: Any) -> _View:
    """The typed view of ``store`` (a name in ``topology.stores``) over ``engine``, the
    store opened (one task's)."""
    if store not in topology.stores:
        raise QueryError(f"no store named {store!r}; the topology's stores: "
                         f"{', '.join(sorted(topology.stores))}")  # fmt: skip
    spec = topology.stores[store]
    processor = writer_of(topology, store)
    if isinstance(engine, VersionedKeyValueStore):
        key_serde = getattr(spec, "key_serde", None) or getattr(processor, "key_serde", None)
        value_serde = getattr(spec, "value_serde", None) or getattr(processor, "value_serde",
                                                                    None)  # fmt: skip
        return VersionedView(store, engine, key_serde, value_serde)
    if isinstance(processor, DeduplicationProcessor):
        return DedupView(store, engine)
    if isinstance(processor, WindowedAggregate):
        return WindowView(store, engine, processor.key_serde, processor.result_serde,
                          processor.windows.size_ms, keyed=False)  # fmt: skip
    if isinstance(processor, SessionWindowAggregate):
        return SessionView(store, engine, processor.key_serde, processor.result_serde)
    if isinstance(processor, SlidingWindowAggregate):
        return WindowView(store, engine, processor.key_serde, processor.result_serde,
                          processor.windows.time_difference_ms, keyed=True)  # fmt: skip
    if isinstance(processor, StreamAggregate | TableAggregate):
        return ResultsView(store, engine, processor.key_serde, processor.result_serde)
    if isinstance(processor, TableSource):
        return KeyValueView(store, engine, processor.key_serde, processor.value_serde)
    if processor is not None and _is_users(processor):
        return KeyValueView(store, engine, getattr(spec, "key_serde", None),
                            getattr(spec, "value_serde", None))  # fmt: skip
    kind = "no processor" if processor is None else type(processor).__name__
    raise QueryError(
        f"store {store} is internal to {kind} (a join's buffer, a suppression's, a grouping's "
        "pairs): its layout is not a table. Queryable stores: user processors' stores, "
        "tables, aggregations (over all time, windows, sessions), versioned stores and "
        "deduplications."
    )
