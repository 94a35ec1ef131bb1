"""``KTable.suppress(Suppressed.until_time_limit(wait, buffer_config))``: rate-limited updates.

As Kafka Streams' KTableSuppressProcessorSupplier (record time) and its
InMemoryTimeOrderedKeyValueChangeBuffer: each update is buffered by key. A key's first update
sets its buffer time (the update's timestamp); a later update replaces the buffered one but
keeps that buffer time ("non-resetting": the wait is not restarted). The suppression's stream
time is the largest timestamp it has seen; after each update every entry whose buffer time is
at or before stream time - ``wait`` is forwarded, in buffer-time order, then by the key's
bytes, each with its own update's timestamp, value and headers; a tombstone is buffered and
forwarded like any update. Over its ``BufferConfig`` bounds afterwards, the buffer forwards
its oldest entries until within them (``emit_early_when_full``) or fails the task
(``shut_down_when_full``: a StreamsError, Kafka Streams' StreamsException).

The buffer is the suppression's store (transactional, in the changelog, restored), laid out:

- ``b"t"`` + buffer time (8 bytes, sortable) + key bytes -> timestamp (8 bytes) + headers
  (4-byte length, then the headers) + ``b"\\x00"`` (a tombstone) or ``b"\\x01"`` + value bytes;
- ``b"k"`` + key bytes -> buffer time (8 bytes, sortable): where the key's entry is;
- ``b"m:stream-time"``, ``b"m:buffer-size"``: the stream time, the entries and their bytes,
  written at each commit.

Unlike Kafka Streams, whose suppression starts a restored task with no stream time, the stream
time is kept with the store, like the aggregations' (aggregate.KeptStreamTime).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from streamplatform.dsl.aggregate import _TIMESTAMP, KeptStreamTime
from streamplatform.dsl.processor import Processor, ProcessorContext, engine_store
from streamplatform.dsl.suppress import BufferConfig
from streamplatform.errors.exceptions import StreamsError
from streamplatform.records import NO_HEADERS, Headers, Record

_ENTRY = b"t"
_ENTRY_END = b"u"
_INDEX = b"k"
_SIZE_KEY = b"m:buffer-size"
_SIZE = struct.Struct(">qq")  # entries, bytes
_TIME = struct.Struct(">Q")  # a buffer time + 2**63: negative times sort before the others
_SHIFT = 1 << 63
_COUNT = struct.Struct(">I")
_NAME = struct.Struct(">H")
_VALUE_LENGTH = struct.Struct(">i")  # -1: a None header value
_TOMBSTONE = b"\x00"
_VALUE = b"\x01"


def encode_headers(headers: Headers) -> bytes:
    """``headers`` as stored: their count, then each name's and value's length and bytes."""
    if not headers:
        return _COUNT.pack(0)
    parts = [_COUNT.pack(len(headers))]
    for name, value in headers:
        raw = name.encode()
        parts += [_NAME.pack(len(raw)), raw]
        parts += (
            [_VALUE_LENGTH.pack(-1)] if value is None else [_VALUE_LENGTH.pack(len(value)), value]
        )
    block = b"".join(parts)
    return _COUNT.pack(len(block)) + block


def decode_headers(raw: bytes, at: int) -> tuple[Headers, int]:
    """The headers stored at ``raw[at:]`` (``encode_headers``), and where what follows starts."""
    (length,) = _COUNT.unpack_from(raw, at)
    at += 4
    if length == 0:
        return NO_HEADERS, at
    end = at + length
    (count,) = _COUNT.unpack_from(raw, at)
    at += 4
    headers: Headers = []
    for _ in range(count):
        (size,) = _NAME.unpack_from(raw, at)
        name = raw[at + 2 : at + 2 + size].decode()
        at += 2 + size
        (size,) = _VALUE_LENGTH.unpack_from(raw, at)
        at += 4
        if size < 0:
            headers.append((name, None))
        else:
            headers.append((name, raw[at : at + size]))
            at += size
    return headers, end


class TimeLimitSuppression(Processor):
    """Buffers each key's latest update until stream time is ``wait_ms`` past the key's
    first buffered update (or the buffer is over its bounds), then forwards it."""

    def __init__(
        self,
        name: str,
        store_name: str,
        key_serde: Any,
        value_serde: Any,
        wait_ms: int,
        buffer_config: BufferConfig,
    ) -> None:
        self.name = name
        self.store_name = store_name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.wait_ms = wait_ms
        self.max_records = buffer_config.record_limit
        self.max_bytes = buffer_config.byte_limit
        self.shut_down = buffer_config.shut_down

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        self.stream_time = KeptStreamTime(self.store)
        saved = self.store.transaction.get(_SIZE_KEY)
        self.size = self.saved_size = (0, 0) if saved is None else _SIZE.unpack(saved)
        self.min_time = self._first_time()  # the earliest buffer time; None: the buffer is empty

    def flush(self) -> None:
        self.stream_time.save()
        if self.size != self.saved_size:
            self.store.transaction.put(_SIZE_KEY, _SIZE.pack(*self.size))
            self.saved_size = self.size

    def _first_time(self) -> int | None:
        for entry_key, _ in self.store.transaction.range(_ENTRY, _ENTRY_END):
            return int(_TIME.unpack_from(entry_key, 1)[0]) - _SHIFT
        return None

    def process(self, record: Record) -> None:
        timestamp = record.timestamp
        if timestamp > self.stream_time.time:
            self.stream_time.time = timestamp
        key = self.key_serde.serialize(record.key) or b""
        value = None if record.value is None else self.value_serde.serialize(record.value)
        entry = (
            _TIMESTAMP.pack(timestamp)
            + encode_headers(record.headers)
            + (_TOMBSTONE if value is None else _VALUE + value)
        )
        transaction = self.store.transaction
        records, size = self.size
        buffer_time = transaction.get(_INDEX + key)
        if buffer_time is None:  # the key's first update: its time is the buffer time
            buffer_time = _TIME.pack(timestamp + _SHIFT)
            transaction.put(_INDEX + key, buffer_time)
            records, size = records + 1, size + 8 + len(key) + len(entry)
            if self.min_time is None or timestamp < self.min_time:
                self.min_time = timestamp
        else:  # replaced in place: the key keeps its first update's buffer time
            replaced = transaction.get(_ENTRY + buffer_time + key)
            size += len(entry) - (0 if replaced is None else len(replaced))
        self.size = (records, size)
        transaction.put(_ENTRY + buffer_time + key, entry)
        self._enforce_constraints(record)

    def _over_capacity(self, time: int) -> bool:
        records, size = self.size
        return records > self.max_records or size > self.max_bytes

    def _enforce_constraints(self, record: Record) -> None:
        expiry = self.stream_time.time - self.wait_ms
        if self.min_time is not None and self.min_time <= expiry:
            self._evict_while(lambda time: time <= expiry, record)
        if not self._over_capacity(0):
            return
        if self.shut_down:
            records, size = self.size
            raise StreamsError(
                f"{self.name} buffer exceeded its max capacity. Currently "
                f"[{records}/{self.max_records}] records and [{size}/{self.max_bytes}] bytes."
            )
        self._evict_while(self._over_capacity, record)

    def _evict_while(self, predicate: Callable[[int], bool], record: Record) -> None:
        """Forward and remove the entries in buffer order while ``predicate(buffer time)``."""
        transaction = self.store.transaction
        for entry_key, entry in transaction.range(_ENTRY, _ENTRY_END):  # as of this call
            time = int(_TIME.unpack_from(entry_key, 1)[0]) - _SHIFT
            if not predicate(time):
                self.min_time = time
                return
            raw_key = entry_key[9:]
            headers, at = decode_headers(entry, 8)
            value = None if entry[at : at + 1] == _TOMBSTONE else entry[at + 1 :]
            forwarded = record._replace(
                key=self.key_serde.deserialize(raw_key),
                value=None if value is None else self.value_serde.deserialize(value),
                timestamp=_TIMESTAMP.unpack_from(entry)[0],
                headers=headers,
            )
            transaction.delete(entry_key)
            transaction.delete(_INDEX + raw_key)
            records, size = self.size
            self.size = (records - 1, size - 8 - len(raw_key) - len(entry))
            self.context.forward(forwarded)
        self.min_time = None
