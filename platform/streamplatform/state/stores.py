"""`Stores`: the factory of store specs that a topology names and the runtime opens.

A spec is what Kafka Streams calls a store supplier: a name, a kind and parameters, checked
when the spec is made. `spec.open(directory)` opens the store under ``directory/name``; the
runtime calls it once per task with the task's state directory and isolation level.

>>> from datetime import timedelta
>>> spec = Stores.persistent_versioned_key_value_store("rates", timedelta(days=1))
>>> spec.kind, spec.history_retention_ms, spec.segment_interval_ms
('versioned', 86400000, None)
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from pathlib import Path
from typing import ClassVar, TypeVar

from streamplatform.serdes import Serde
from streamplatform.state.rocks import StoreOptions
from streamplatform.state.transaction import IsolationLevel
from streamplatform.state.transactional import TransactionalKeyValueStore
from streamplatform.state.versioned import VersionedKeyValueStore

__all__ = ["KeyValueStoreSpec", "StoreSpec", "Stores", "VersionedStoreSpec", "duration_ms"]


def duration_ms(value: timedelta | int, argument: str) -> int:
    """`value` in whole milliseconds; a timedelta is truncated to the millisecond, as in Kafka."""
    if isinstance(value, timedelta):
        return value // timedelta(milliseconds=1)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{argument} must be a timedelta or int milliseconds, got {type(value).__name__}"
        )
    return value


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise ValueError(f"name must be a plain directory name, got {name!r}")
    return name


@dataclasses.dataclass(frozen=True)
class KeyValueStoreSpec:
    """A persistent transactional key-value store, opened per task under its name."""

    kind: ClassVar[str] = "key_value"
    name: str
    key_serde: Serde | None = None
    """How a processor's keys become the store's bytes (``Stores.key_value_store_builder``);
    None: the processor uses bytes."""
    value_serde: Serde | None = None
    global_topic: str | None = None
    """The topic of the global table this store holds (``StreamsBuilder.global_table``): the
    store has no changelog (the topic is its changelog, as in Kafka Streams) and is not
    committed with its task; each task's copy is fed from the whole topic
    (dsl/global_table.py). None for any other store."""

    def open(
        self,
        directory: str | os.PathLike[str],
        isolation_level: IsolationLevel = IsolationLevel.READ_COMMITTED,
        *,
        options: StoreOptions | None = None,
        max_uncommitted_records: int | None = None,
        max_uncommitted_bytes: int | None = None,
    ) -> TransactionalKeyValueStore:
        """Open the store at ``directory/name`` (see TransactionalKeyValueStore)."""
        return TransactionalKeyValueStore(
            Path(directory) / self.name,
            isolation_level,
            options=options,
            max_uncommitted_records=max_uncommitted_records,
            max_uncommitted_bytes=max_uncommitted_bytes,
        )


@dataclasses.dataclass(frozen=True)
class VersionedStoreSpec:
    """A persistent versioned key-value store (KIP-889), opened per task under its name."""

    kind: ClassVar[str] = "versioned"
    name: str
    history_retention_ms: int
    segment_interval_ms: int | None = None
    """None: KIP-889's default for the retention (see history.default_segment_interval)."""
    key_serde: Serde | None = None
    """A processor's key and value serdes (``Stores.versioned_key_value_store_builder``)."""
    value_serde: Serde | None = None

    def open(
        self,
        directory: str | os.PathLike[str],
        isolation_level: IsolationLevel = IsolationLevel.READ_COMMITTED,
        *,
        options: StoreOptions | None = None,
        max_uncommitted_records: int | None = None,
        max_uncommitted_bytes: int | None = None,
    ) -> VersionedKeyValueStore:
        """Open the store at ``directory/name`` (see VersionedKeyValueStore)."""
        return VersionedKeyValueStore(
            Path(directory) / self.name,
            self.history_retention_ms,
            self.segment_interval_ms,
            isolation_level=isolation_level,
            options=options,
            max_uncommitted_records=max_uncommitted_records,
            max_uncommitted_bytes=max_uncommitted_bytes,
        )


class Stores:
    """Factory of store specs, named after Kafka Streams' `Stores`."""

    @staticmethod
    def persistent_key_value_store(name: str) -> KeyValueStoreSpec:
        """A RocksDB key-value store with transactions (KIP-892)."""
        return KeyValueStoreSpec(_check_name(name))

    @staticmethod
    def persistent_versioned_key_value_store(
        name: str,
        history_retention: timedelta | int,
        segment_interval: timedelta | int | None = None,
    ) -> VersionedStoreSpec:
        """A RocksDB versioned store keeping old versions for `history_retention` (>= 0).

        Durations are timedeltas or int milliseconds; `segment_interval` must be > 0 when
        given and defaults to KIP-889's choice for the retention.
        """
        retention = duration_ms(history_retention, "history_retention")
        if retention < 0:
            raise ValueError(f"history_retention must not be negative, got {history_retention!r}")
        interval = None
        if segment_interval is not None:
            interval = duration_ms(segment_interval, "segment_interval")
            if interval <= 0:
                raise ValueError(
                    f"segment_interval must be positive (at least 1 ms), got {segment_interval!r}"
                )
        return VersionedStoreSpec(_check_name(name), retention, interval)

    @staticmethod
    def key_value_store_builder(
        supplier: KeyValueStoreSpec, key_serde: Serde | None, value_serde: Serde | None
    ) -> KeyValueStoreSpec:
        """The store ``supplier`` describes, typed for processors: ``get_state_store`` then
        takes and returns keys and values through ``key_serde`` / ``value_serde`` (None:
        bytes), as Kafka Streams' ``Stores.keyValueStoreBuilder``."""
        return _typed(supplier, KeyValueStoreSpec, "persistent_key_value_store", key_serde,
                      value_serde)  # fmt: skip

    @staticmethod
    def versioned_key_value_store_builder(
        supplier: VersionedStoreSpec, key_serde: Serde | None, value_serde: Serde | None
    ) -> VersionedStoreSpec:
        """The versioned store ``supplier`` describes, typed for processors (Kafka Streams'
        ``Stores.versionedKeyValueStoreBuilder``)."""
        return _typed(supplier, VersionedStoreSpec, "persistent_versioned_key_value_store",
                      key_serde, value_serde)  # fmt: skip


_Spec = TypeVar("_Spec", KeyValueStoreSpec, VersionedStoreSpec)


def _typed(
    supplier: _Spec, kind: type[_Spec], factory: str, key_serde: Serde | None,
    value_serde: Serde | None,
) -> _Spec:  # fmt: skip
    """``supplier`` with the processor-facing serdes, checked."""
    if not isinstance(supplier, kind):
        raise TypeError(f"this builder needs Stores.{factory}(...), got {type(supplier).__name__}")
    for argument, serde in (("key_serde", key_serde), ("value_serde", value_serde)):
        if serde is not None and not (
            hasattr(serde, "serialize") and hasattr(serde, "deserialize")
        ):
            raise TypeError(f"{argument} must be a Serde (Serdes.string(), ...), got {serde!r}")
    return dataclasses.replace(supplier, key_serde=key_serde, value_serde=value_serde)


StoreSpec = KeyValueStoreSpec | VersionedStoreSpec
"""Any spec `Stores` makes."""
