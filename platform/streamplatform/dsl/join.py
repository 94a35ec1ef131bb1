"""KTable materialization and stream-table joins, temporal when the table is versioned (KIP-889).

A table's store holds the table topic's raw key and value bytes. With a versioned store a
stream record with timestamp t joins the table version valid at t (``get(key, as_of=t)``), so
an out-of-order stream record still meets the table as it was at its time. With a plain
key-value store it joins the latest value. A table tombstone ends the key's value: an inner
join drops, a left join passes None to the joiner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamplatform.dsl.aggregate import results_name
from streamplatform.dsl.processor import Processor, ProcessorContext, engine, engine_store
from streamplatform.records import Record
from streamplatform.serdes import Serde
from streamplatform.state import VersionedKeyValueStore


class TableSource(Processor):
    """Writes each table record into the table's store (a None value is a tombstone)."""

    def __init__(self, store_name: str, key_serde: Serde, value_serde: Serde) -> None:
        self.store_name = store_name
        self.key_serde = key_serde
        self.value_serde = value_serde

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        self.versioned = isinstance(self.store, VersionedKeyValueStore)

    def process(self, record: Record) -> None:
        key = self.key_serde.serialize(record.key)
        if key is None:
            return  # a table ignores records without a key, as in Kafka Streams
        value = self.value_serde.serialize(record.value)
        if self.versioned:
            self.store.put(key, value, record.timestamp)
            log_version = getattr(self.context, "log_version", None)
            if log_version is not None:
                log_version(self.store_name, key, value, record.timestamp)
        else:
            self.store.transaction.put(key, value)
        self.context.forward(record)  # the table's update, for to_stream() and its operators


class StreamTableJoin(Processor):
    """``joiner(key, stream_value, table_value)`` (kstream.py adapts a joiner without the
    key); ``left`` keeps stream records with no match."""

    joined: int = 0  # counted per task instance (metrics())
    misses: int = 0

    def __init__(
        self,
        store_name: str,
        key_serde: Serde,
        value_serde: Serde,
        joiner: Callable[[Any, Any, Any], Any],  # (key, stream value, table value)
        left: bool,
        aggregated: bool = False,
    ) -> None:
        self.store_name = store_name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.joiner = joiner
        self.left = left
        # The table of an aggregation: its latest results are in the aggregation's record
        # cache, the others in its store after an 8-byte timestamp (aggregate.py).
        self.aggregated = aggregated
        self.results: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        self.versioned = isinstance(self.store, VersionedKeyValueStore)
        found = engine(context)
        self.task = None if found is None else found.task

    def metrics(self) -> dict[str, int]:
        """Stream records joined, and those that found no table value (dropped by an inner
        join, forwarded with None by a left join)."""
        return {"joined": self.joined, "misses": self.misses}

    def task_metrics(self) -> dict[str, int]:
        return {f"join_{name}": value for name, value in self.metrics().items()}

    def _table_value(self, key: Any, timestamp: int) -> Any:
        if key is None:
            return None
        raw_key = self.key_serde.serialize(key)
        if raw_key is None:
            return None
        if self.aggregated:
            return self._result(raw_key)
        if self.versioned:
            version = self.store.get(raw_key, timestamp)
            raw = None if version is None else version.value
        else:
            raw = self.store.transaction.get(raw_key)
        return self.value_serde.deserialize(raw)

    def _result(self, raw_key: bytes) -> Any:
        """An aggregation's latest result for the key: through its record cache (the
        aggregation inits after this processor when it comes later in the topology)."""
        if self.results is None and self.task is not None:
            self.results = self.task.shared.get(results_name(self.store_name))
        if self.results is not None:
            found = self.results.get(raw_key)
            return None if found is None else found[0]
        raw = self.store.transaction.get(raw_key)
        return None if raw is None else self.value_serde.deserialize(raw[8:])

    def process(self, record: Record) -> None:
        table_value = self._table_value(record.key, record.timestamp)
        if table_value is None:
            self.misses += 1
            if not self.left:
                return
        else:
            self.joined += 1
        joined = self.joiner(record.key, record.value, table_value)
        self.context.forward(record._replace(value=joined))
