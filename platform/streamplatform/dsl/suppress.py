"""``KTable.suppress(Suppressed.until_window_closes())``: a windowed table's final results.

The suppression buffers the latest update of each window in its own store (transactional, in
the changelog, like every store) and forwards it once the window has closed: when its stream
time (the largest timestamp of the updates it has seen) passes the window's end by the
windows' grace. It forwards in Kafka Streams' buffer order: by window end, then by the
windowed key's bytes; each with the timestamp of the update it buffered.
"""

from __future__ import annotations

from typing import Any

from streamplatform.dsl.aggregate import _TIMESTAMP, KeptStreamTime
from streamplatform.dsl.processor import Processor, ProcessorContext, engine_store
from streamplatform.records import Record

_BUFFER_PREFIX = b"b"  # b"b" + window end (8 bytes, big-endian) + the windowed key's bytes


class Suppressed:
    """What ``KTable.suppress`` holds back. Only ``until_window_closes`` is built (the
    buffer is the suppression's store: unbounded in memory terms, as Kafka Streams'
    ``BufferConfig.unbounded()``)."""

    def __init__(self, kind: str, name: str | None = None) -> None:
        self.kind = kind
        self.name = name

    @classmethod
    def until_window_closes(cls, buffer_config: Any = None) -> Suppressed:
        """A windowed table's final result per window, once the window closes."""
        return cls("until_window_closes")

    def with_name(self, name: str) -> Suppressed:
        """The same suppression, its node named ``name`` and its buffer store
        ``<name>-STATE-STORE`` (Kafka Streams' ``Suppressed.withName``); unnamed, both are
        generated and change when an operator is added upstream (docs/upgrades.md)."""
        return Suppressed(self.kind, name)


class WindowCloseSuppression(Processor):
    """Buffers each window's latest update until the window closes, then forwards it."""

    def __init__(self, store_name: str, key_serde: Any, value_serde: Any, grace_ms: int) -> None:
        self.store_name = store_name
        self.key_serde = key_serde  # a TimeWindowedSerde
        self.value_serde = value_serde
        self.grace_ms = grace_ms

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        self.stream_time = KeptStreamTime(self.store)
        self.emitted_to = -1  # windows ending at or before it were forwarded (unknown: -1)

    def flush(self) -> None:
        self.stream_time.save()

    def process(self, record: Record) -> None:
        transaction = self.store.transaction
        if record.timestamp > self.stream_time.time:
            self.stream_time.time = record.timestamp
        key = self.key_serde.serialize(record.key) or b""
        buffered = _BUFFER_PREFIX + _TIMESTAMP.pack(record.key.window.end) + key
        value = self.value_serde.serialize(record.value)
        if value is None:
            transaction.delete(buffered)  # a tombstone takes the window's result back
        else:
            transaction.put(buffered, _TIMESTAMP.pack(record.timestamp) + value)
        self._forward_closed(record, record.key.window.end)

    def _forward_closed(self, record: Record, end: int) -> None:
        """The buffered windows that ended at or before stream time - grace, in order. Those
        ending at or before the last expiry are gone already: the scan starts past them, or
        at ``end``, the window just buffered, when it had closed already (a sliding window
        made late, a session: Kafka Streams forwards it at once)."""
        expiry = self.stream_time.time - self.grace_ms
        late = 0 <= end <= self.emitted_to
        if (expiry <= self.emitted_to and not late) or expiry <= 0:  # nothing more has closed
            return  # (a window's end is positive; a negative one would not sort as a number)
        transaction = self.store.transaction
        low = _BUFFER_PREFIX + _TIMESTAMP.pack(end if late else max(0, self.emitted_to + 1))
        high = _BUFFER_PREFIX + _TIMESTAMP.pack(expiry + 1)
        for buffered, raw in list(transaction.range(low, high)):
            value = self.value_serde.deserialize(raw[8:])
            key = self.key_serde.deserialize(buffered[9:])
            timestamp = _TIMESTAMP.unpack_from(raw)[0]
            self.context.forward(record._replace(key=key, value=value, timestamp=timestamp))
            transaction.delete(buffered)
        self.emitted_to = max(self.emitted_to, expiry)
