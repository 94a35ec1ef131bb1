"""KTable materialization and stream-table joins, temporal when the table is versioned (KIP-889).

A table's store holds the table topic's raw key and value bytes. With a versioned store a
stream record with timestamp t joins the table version valid at t (``get(key, as_of=t)``), so
an out-of-order stream record still meets the table as it was at its time. With a plain
key-value store it joins the latest value. A table tombstone ends the key's value: an inner
join drops, a left join passes None to the joiner.

**Grace period (KIP-923)**, with a versioned table only: each stream record waits in the
join's buffer until the join's stream time (the largest timestamp of the records it buffered)
is ``grace`` past its timestamp, then joins the table version valid at its timestamp, so table
updates that arrive late, within the grace, are seen. As Kafka Streams'
KStreamKTableJoinProcessor and RocksDBTimeOrderedKeyValueBuffer: after each buffered record,
every record at or before stream time - grace is joined, in the buffer's order (timestamp,
then the key's bytes, then arrival); a record already older than stream time - grace joins at
once and releases nothing. Records with a None value, and an inner join's records with a None
key, are dropped and counted (``dropped_records``); a left join's record with a None key joins
None at once (Kafka Streams' buffer would refuse it). Grace 0: a record at stream time joins
at once, through the buffer.

The buffer is the join's store (transactional, in the changelog, restored), laid out:

- ``b"b"`` + timestamp (8 bytes, + 2**63: sortable) + key bytes + arrival number (4 bytes) ->
  headers (suppress_time_limit.encode_headers) + value bytes;
- ``b"m:stream-time"``, ``b"m:seqnum"``: the join's stream time and the last arrival number,
  written at each commit, so a restarted task goes on from them (Kafka Streams restores its
  buffer's stream time from the changelog's keys and restarts the arrival number at 0).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamplatform.dsl.aggregate import KeptStreamTime, results_name
from streamplatform.dsl.processor import Processor, ProcessorContext, engine, engine_store
from streamplatform.dsl.suppress_time_limit import decode_headers, encode_headers
from streamplatform.records import Record
from streamplatform.serdes import Serde
from streamplatform.state import PUT_RETURN_CODE_NOT_PUT, VersionedKeyValueStore

_BUFFER = b"b"  # b"b" + timestamp + 2**63 (8 bytes) + key bytes + arrival number (4 bytes)
_BUFFER_END = b"c"
_SEQNUM_KEY = b"m:seqnum"
_TIME = struct.Struct(">Q")
_SHIFT = 1 << 63
_SEQNUM = struct.Struct(">I")
_SEQNUM_MASK = 0x7FFFFFFF  # Kafka Streams' buffer wraps its sequence number so


@dataclass(frozen=True)
class GraceBuffer:
    """A stream-table join's grace period (KIP-923): its buffer store, the grace in ms, and
    the stream's serdes (what the buffer holds)."""

    store_name: str
    grace_ms: int
    key_serde: Serde
    value_serde: Serde


class TableSource(Processor):
    """Writes each table record into the table's store (a None value is a tombstone) and
    forwards it. A versioned store refuses a record older than its history retention
    (PUT_RETURN_CODE_NOT_PUT): that record is not forwarded either, as Kafka Streams'
    KTableSource ("if not put to store, do not forward downstream either")."""

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
            put = self.store.put(key, value, record.timestamp)
            log_version = getattr(self.context, "log_version", None)
            if log_version is not None:
                log_version(self.store_name, key, value, record.timestamp)
            if put == PUT_RETURN_CODE_NOT_PUT:
                return
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
        grace: GraceBuffer | None = None,
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
        self.grace = grace  # None: each record joins at once
        self.dropped_records = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        self.versioned = isinstance(self.store, VersionedKeyValueStore)
        found = engine(context)
        self.task = None if found is None else found.task
        if self.grace is not None:
            self.buffer = engine_store(context, self.grace.store_name)
            self.stream_time = KeptStreamTime(self.buffer)
            self.seqnum = KeptStreamTime(self.buffer, _SEQNUM_KEY)
            self.min_time = self._first_time()  # the earliest buffered timestamp; None: empty

    def flush(self) -> None:
        if self.grace is not None:
            self.stream_time.save()
            self.seqnum.save()

    def metrics(self) -> dict[str, int]:
        """Stream records joined, and those that found no table value (dropped by an inner
        join, forwarded with None by a left join)."""
        return {"joined": self.joined, "misses": self.misses}

    def task_metrics(self) -> dict[str, int]:
        found = {f"join_{name}": value for name, value in self.metrics().items()}
        found["dropped_records"] = self.dropped_records
        return found

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
        grace = self.grace
        key, value, timestamp = record[0], record[1], record[2]
        if value is None or (key is None and not self.left):
            self.dropped_records += 1  # Kafka Streams' "Skipping record due to null join key
            return  # or value" (a left join joins a None key)
        if grace is None:
            self._join(record)
            return
        raw_key = None if key is None else grace.key_serde.serialize(key)
        stream_time = self.stream_time
        if raw_key is None or timestamp < stream_time.time - grace.grace_ms:
            self._join(record)  # late (or a left join's None key): joined at once, alone
            return
        if timestamp > stream_time.time:
            stream_time.time = timestamp
        seqnum = self.seqnum
        seqnum.time = (seqnum.time + 1) & _SEQNUM_MASK
        store_key = _BUFFER + _TIME.pack(timestamp + _SHIFT) + raw_key + _SEQNUM.pack(seqnum.time)
        raw_value = grace.value_serde.serialize(value) or b""
        self.buffer.transaction.put(store_key, encode_headers(record.headers) + raw_value)
        if self.min_time is None or timestamp < self.min_time:
            self.min_time = timestamp
        self._join_waited(record)

    def _first_time(self, start: bytes = _BUFFER) -> int | None:
        for store_key, _ in self.buffer.transaction.range(start, _BUFFER_END):
            return int(_TIME.unpack_from(store_key, 1)[0]) - _SHIFT
        return None

    def _join_waited(self, record: Record) -> None:
        """Join the buffered records whose timestamp is at or before stream time - grace, in
        the buffer's order, and take them out of it."""
        assert self.grace is not None
        expiry = self.stream_time.time - self.grace.grace_ms
        if self.min_time is None or self.min_time > expiry:
            return  # nothing buffered has waited long enough
        key_serde, value_serde = self.grace.key_serde, self.grace.value_serde
        transaction = self.buffer.transaction
        end = _BUFFER + _TIME.pack(expiry + 1 + _SHIFT)
        for store_key, raw in transaction.range(_BUFFER, end):  # as of this call
            transaction.delete(store_key)
            headers, at = decode_headers(raw, 0)
            self._join(record._replace(
                key=key_serde.deserialize(store_key[9:-4]),
                value=value_serde.deserialize(raw[at:]),
                timestamp=int(_TIME.unpack_from(store_key, 1)[0]) - _SHIFT,
                headers=headers,
            ))  # fmt: skip
        self.min_time = self._first_time(end)

    def _join(self, record: Record) -> None:
        table_value = self._table_value(record.key, record.timestamp)
        if table_value is None:
            self.misses += 1
            if not self.left:
                return
        else:
            self.joined += 1
        joined = self.joiner(record.key, record.value, table_value)
        self.context.forward(record._replace(value=joined))
