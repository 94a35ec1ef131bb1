"""What a processor gets from ``context.get_state_store(name)``: Kafka Streams' store interfaces.

A facade stands between a processor and the engine's store (transactional.py, versioned.py),
as Kafka Streams' ``MeteredKeyValueStore`` stands over its bytes store:

- keys and values are typed through the serdes declared with the store
  (``Stores.key_value_store_builder(supplier, key_serde, value_serde)``); bytes when none are;
- reads always see the task's own uncommitted writes, under every processing guarantee, as in
  Kafka Streams (KIP-892's isolation level is what *other* readers see, never the writer);
- nothing of the transaction protocol (commit, prepare, settle, close) is reachable: the task
  commits its stores with its offsets when the batch commits.

Ranges follow Kafka Streams: ``range(from_key, to_key)`` includes both ends, None leaves a side
open, and order is that of the serialized keys (bytewise).

>>> import tempfile
>>> from streamplatform.serdes import Serdes
>>> from streamplatform.state import Stores
>>> spec = Stores.key_value_store_builder(
...     Stores.persistent_key_value_store("counts"), Serdes.string(), Serdes.long())
>>> with tempfile.TemporaryDirectory() as directory:
...     engine = spec.open(directory)
...     counts = KeyValueStore(spec, engine)
...     counts.put("a", 1); counts.put_all([("b", 2), ("c", 3)])
...     counts.get("a"), counts.put_if_absent("a", 9), list(counts.range("b", None))
...     engine.close()
(1, 1, [('b', 2), ('c', 3)])
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from streamplatform.serdes import Serde, Serdes
from streamplatform.state.transactional import TransactionalKeyValueStore
from streamplatform.state.versioned import VersionedKeyValueStore, VersionedRecord

if TYPE_CHECKING:
    from streamplatform.state.stores import StoreSpec

__all__ = ["KeyValueStore", "VersionedStore", "facade_for"]

K = TypeVar("K")
V = TypeVar("V")


class _Typed(Generic[K, V]):
    """The serde layer shared by the facades."""

    def __init__(self, spec: StoreSpec) -> None:
        self._name = spec.name
        key_serde: Serde = spec.key_serde or Serdes.bytes()
        value_serde: Serde = spec.value_serde or Serdes.bytes()
        self._key_to_bytes = key_serde.serialize
        self._key_from_bytes = key_serde.deserialize
        self._value_to_bytes = value_serde.serialize
        self._value_from_bytes = value_serde.deserialize

    @property
    def name(self) -> str:
        return self._name

    def persistent(self) -> bool:
        return True

    def _key(self, key: K) -> bytes:
        if key is None:
            raise ValueError(f"state store {self._name}: a key must not be None")
        raw = self._key_to_bytes(key)
        if raw is None:
            raise ValueError(f"state store {self._name}: key {key!r} serialized to None")
        return raw

    def _value(self, raw: bytes | None) -> V | None:
        return None if raw is None else self._value_from_bytes(raw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"


class KeyValueStore(_Typed[K, V]):
    """Kafka Streams' ``KeyValueStore`` for processors: typed, reads its own writes."""

    def __init__(self, spec: StoreSpec, engine: TransactionalKeyValueStore) -> None:
        super().__init__(spec)
        self._engine = engine

    def get(self, key: K) -> V | None:
        """The value of ``key`` (the task's own uncommitted writes included), or None."""
        return self._value(self._engine.transaction.get(self._key(key)))

    def put(self, key: K, value: V | None) -> None:
        """Set ``key`` to ``value``; a None value deletes the key, as in Kafka Streams."""
        self._put(key, value)

    def _put(self, key: K, value: V | None) -> None:
        raw = None if value is None else self._value_to_bytes(value)
        self._engine.transaction.put(self._key(key), raw)

    def put_if_absent(self, key: K, value: V) -> V | None:
        """Put ``value`` when ``key`` has none; returns the value it had (None: it was put)."""
        raw_key = self._key(key)
        transaction = self._engine.transaction
        existing = transaction.get(raw_key)
        if existing is None:
            transaction.put(raw_key, None if value is None else self._value_to_bytes(value))
        return self._value(existing)

    def put_all(self, entries: Iterable[tuple[K, V | None]]) -> None:
        """``put`` each ``(key, value)`` in order."""
        for key, value in entries:
            self._put(key, value)

    def delete(self, key: K) -> V | None:
        """Delete ``key``; returns the value it had, or None."""
        raw_key = self._key(key)
        transaction = self._engine.transaction
        existing = transaction.get(raw_key)
        if existing is not None:
            transaction.delete(raw_key)
        return self._value(existing)

    def range(self, from_key: K | None = None, to_key: K | None = None) -> Iterator[tuple[K, V]]:
        """``(key, value)`` pairs with from_key <= key <= to_key (both ends included; None
        leaves a side open), in the order of the serialized keys; empty when from_key is
        after to_key. The iterator reads the store as of this call."""
        return self._range(from_key, to_key)

    def _range(self, from_key: K | None, to_key: K | None) -> Iterator[tuple[K, V]]:
        start, end = self._bounds(from_key, to_key)
        if start is not None and end is not None and start >= end:
            return iter(())
        return self._typed(self._engine.transaction.range(start, end))

    def reverse_range(
        self, from_key: K | None = None, to_key: K | None = None
    ) -> Iterator[tuple[K, V]]:
        """``range(from_key, to_key)`` from the last key to the first. Holds the range's
        entries in memory while it is iterated."""
        return reversed(list(self._range(from_key, to_key)))

    def all(self) -> Iterator[tuple[K, V]]:
        """Every ``(key, value)``, in the order of the serialized keys."""
        return self._range(None, None)

    def reverse_all(self) -> Iterator[tuple[K, V]]:
        """Every ``(key, value)``, last key first (held in memory while iterated)."""
        return reversed(list(self._range(None, None)))

    def prefix_scan(self, prefix: Any, prefix_serde: Serde | None = None) -> Iterator[tuple[K, V]]:
        """Entries whose serialized key starts with ``prefix`` serialized by ``prefix_serde``
        (default: the store's key serde, right for string and bytes keys), in key order."""
        serialize = (prefix_serde.serialize if prefix_serde is not None
                     else self._key_to_bytes)  # fmt: skip
        raw = serialize(prefix)
        if raw is None:
            raise ValueError(f"state store {self._name}: prefix {prefix!r} serialized to None")
        return self._typed(self._engine.transaction.prefix(raw))

    def approximate_num_entries(self) -> int:
        """An estimate of the number of keys (RocksDB's, plus what the task staged)."""
        return self._engine.approximate_num_entries()

    def _bounds(self, from_key: K | None, to_key: K | None) -> tuple[bytes | None, bytes | None]:
        start = None if from_key is None else self._key(from_key)
        # The engine's end is exclusive: the smallest key after to_key's bytes includes it.
        end = None if to_key is None else self._key(to_key) + b"\x00"
        return start, end

    def _typed(self, pairs: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[K, V]]:
        key_of, value_of = self._key_from_bytes, self._value_from_bytes
        for key, value in pairs:
            yield key_of(key), value_of(value)


class VersionedStore(_Typed[K, V]):
    """Kafka Streams' ``VersionedKeyValueStore`` (KIP-889) for processors: typed; reads see the
    task's own uncommitted writes. Results are ``VersionedRecord(value, timestamp, valid_to)``
    with the value deserialized."""

    def __init__(self, spec: StoreSpec, engine: VersionedKeyValueStore) -> None:
        super().__init__(spec)
        self._engine = engine

    def put(self, key: K, value: V | None, timestamp: int) -> int:
        """Add the version ``value`` (None: a tombstone) of ``key`` valid from ``timestamp``.
        Returns its valid_to, VALID_TO_UNDEFINED (-1) when it became the latest version, or
        PUT_RETURN_CODE_NOT_PUT when ``timestamp`` is older than the history retention."""
        raw = None if value is None else self._value_to_bytes(value)
        return self._engine.put(self._key(key), raw, timestamp)

    def delete(self, key: K, timestamp: int) -> VersionedRecord | None:
        """A tombstone for ``key`` at ``timestamp``; returns the version valid there."""
        return self._typed(self._engine.delete(self._key(key), timestamp))

    def get(self, key: K, as_of: int | None = None) -> VersionedRecord | None:
        """The latest version of ``key``, or with ``as_of`` the version valid then."""
        return self._typed(self._engine.get(self._key(key), as_of))

    def get_versions(
        self, key: K, from_ts: int, to_ts: int, ascending: bool = False
    ) -> list[VersionedRecord]:
        """Every version of ``key`` whose validity overlaps [from_ts, to_ts], newest first
        unless ``ascending``."""
        records = self._engine.get_versions(self._key(key), from_ts, to_ts, ascending)
        return [self._typed(record) for record in records]  # type: ignore[misc]

    @property
    def history_retention_ms(self) -> int:
        return self._engine.history_retention_ms

    def _typed(self, record: VersionedRecord | None) -> VersionedRecord | None:
        if record is None:
            return None
        value = self._value(record.value)  # typed: the record carries the deserialized value
        return VersionedRecord(value, record.timestamp, record.valid_to)  # type: ignore[arg-type]


def facade_for(spec: StoreSpec, engine: Any) -> KeyValueStore | VersionedStore:
    """The processor-facing store over ``engine``, the store ``spec`` opened."""
    if isinstance(engine, VersionedKeyValueStore):
        return VersionedStore(spec, engine)
    if isinstance(engine, TransactionalKeyValueStore):
        return KeyValueStore(spec, engine)
    raise TypeError(f"state store {spec.name}: no processor interface for {type(engine).__name__}")
