"""``KTable.suppress(Suppressed.until_window_closes())``: a windowed table's final results.

The suppression buffers the latest update of each window in its own store (transactional, in
the changelog, like every store) and forwards it once the window has closed: when its stream
time (the largest timestamp of the updates it has seen) passes the window's end by the
windows' grace. It forwards in Kafka Streams' buffer order: by window end, then by the
windowed key's bytes; each with the timestamp of the update it buffered.

``Suppressed.until_time_limit(wait, buffer_config)`` works on any table: each key's latest
update waits ``wait`` ms of stream time after the key's first buffered update, within the
``BufferConfig``'s bounds (suppress_time_limit.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from streamplatform.dsl.aggregate import _TIMESTAMP, KeptStreamTime
from streamplatform.dsl.processor import Processor, ProcessorContext, engine_store
from streamplatform.records import Record
from streamplatform.state.stores import duration_ms

_BUFFER_PREFIX = b"b"  # b"b" + window end (8 bytes, big-endian) + the windowed key's bytes
_NO_LIMIT = 2**63 - 1  # Kafka Streams' Long.MAX_VALUE: no bound


def _limit(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{argument} must be >= 0, got {value}")
    return value


class BufferConfig:
    """How much ``Suppressed.until_time_limit`` may buffer (Kafka Streams'
    ``Suppressed.BufferConfig``): ``max_records(n)`` keys, ``max_bytes(n)`` bytes (an entry
    counts its buffer time, 8 bytes, its key's and value's serialized bytes, its timestamp, 8
    bytes, and its headers as stored), or ``unbounded()``. When full, ``emit_early_when_full()``
    (the default of ``max_records``/``max_bytes``) forwards the oldest entries until it is
    within bounds; ``shut_down_when_full()`` fails the task (a StreamsError). The buffer is the
    suppression's store, on disk: the bounds are of what it holds, not of memory."""

    def __init__(
        self, max_records: int = _NO_LIMIT, max_bytes: int = _NO_LIMIT, shut_down: bool = True
    ) -> None:
        self.record_limit = _limit(max_records, "max_records")
        self.byte_limit = _limit(max_bytes, "max_bytes")
        self.shut_down = shut_down  # when full: fail the task (else forward the oldest)

    @classmethod
    def max_records(cls, record_limit: int) -> BufferConfig:
        """At most ``record_limit`` keys; the oldest are forwarded early when full."""
        return cls(max_records=record_limit, shut_down=False)

    @classmethod
    def max_bytes(cls, byte_limit: int) -> BufferConfig:
        """At most ``byte_limit`` bytes; the oldest are forwarded early when full."""
        return cls(max_bytes=byte_limit, shut_down=False)

    @classmethod
    def unbounded(cls) -> BufferConfig:
        """No bound: every update waits its time (Kafka Streams' strict config)."""
        return cls()

    def with_max_records(self, record_limit: int) -> BufferConfig:
        return BufferConfig(record_limit, self.byte_limit, self.shut_down)

    def with_max_bytes(self, byte_limit: int) -> BufferConfig:
        return BufferConfig(self.record_limit, byte_limit, self.shut_down)

    def with_no_bound(self) -> BufferConfig:
        return BufferConfig()

    def emit_early_when_full(self) -> BufferConfig:
        return BufferConfig(self.record_limit, self.byte_limit, shut_down=False)

    def shut_down_when_full(self) -> BufferConfig:
        return BufferConfig(self.record_limit, self.byte_limit, shut_down=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BufferConfig) and (
            self.record_limit,
            self.byte_limit,
            self.shut_down,
        ) == (other.record_limit, other.byte_limit, other.shut_down)

    def __hash__(self) -> int:
        return hash((self.record_limit, self.byte_limit, self.shut_down))

    def __repr__(self) -> str:
        full = "shut_down_when_full" if self.shut_down else "emit_early_when_full"
        return f"BufferConfig(max_records={self.record_limit}, max_bytes={self.byte_limit}, {full})"


class Suppressed:
    """What ``KTable.suppress`` holds back: ``until_window_closes`` (a windowed table's final
    results; its buffer is the suppression's store, unbounded as Kafka Streams'
    ``BufferConfig.unbounded()``) or ``until_time_limit`` (any table's updates, for a time)."""

    def __init__(
        self,
        kind: str,
        name: str | None = None,
        time_to_wait_ms: int = 0,
        buffer_config: BufferConfig | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.time_to_wait_ms = time_to_wait_ms
        self.buffer_config = buffer_config or BufferConfig.unbounded()

    @classmethod
    def until_window_closes(cls, buffer_config: Any = None) -> Suppressed:
        """A windowed table's final result per window, once the window closes."""
        return cls("until_window_closes")

    @classmethod
    def until_time_limit(
        cls,
        time_to_wait_for_more_updates: timedelta | int,
        buffer_config: BufferConfig | None = None,
    ) -> Suppressed:
        """Each key's latest update, forwarded once stream time is ``time_to_wait_for_more_updates``
        (a timedelta or ms) past the key's first update buffered; a later update of the key
        replaces it without restarting the wait (Kafka Streams' ``untilTimeLimit``).
        ``buffer_config`` bounds the buffer (``BufferConfig.unbounded()`` when not given)."""
        wait = duration_ms(time_to_wait_for_more_updates, "time_to_wait_for_more_updates")
        if wait < 0:
            raise ValueError(f"time_to_wait_for_more_updates must be >= 0, got {wait} ms")
        if buffer_config is not None and not isinstance(buffer_config, BufferConfig):
            raise TypeError(
                "buffer_config must be a BufferConfig (BufferConfig.max_records(n), max_bytes(n), "
                f"unbounded()), got {type(buffer_config).__name__}"
            )
        return cls("until_time_limit", None, wait, buffer_config)

    def with_name(self, name: str) -> Suppressed:
        """The same suppression, its node named ``name`` and its buffer store
        ``<name>-STATE-STORE`` (Kafka Streams' ``Suppressed.withName``); unnamed, both are
        generated and change when an operator is added upstream (docs/upgrades.md)."""
        return Suppressed(self.kind, name, self.time_to_wait_ms, self.buffer_config)


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
