"""Deduplication within a time interval (KIP-655), exactly as ../shared/spec/NOTES.md states it.

The store keeps, per id, the (timestamp, offset) of the last record it let through, plus a
time-ordered index used to purge entries that can no longer cause a drop. Stream time is the
task's (largest timestamp processed, None keys included); the processor saves it in its own
store so that it survives a restart together with the entries it explains.

Store layout (one transactional key-value store, bytes keys):

    b"i" + id                  -> timestamp (8 bytes) + offset (8 bytes; -1 = no offset)
    b"t" + timestamp + id      -> b""   (purge index, ordered by time)
    b"m"                       -> saved stream time
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

from streamplatform.dsl.processor import Processor, ProcessorContext
from streamplatform.records import Record

_ENTRY = struct.Struct(">qq")
_TIME = struct.Struct(">Q")
_SIGN = 1 << 63
_META_KEY = b"m"
NO_OFFSET = -1
# Purge at most once per this many records when stream time has not moved by an interval.
_PURGE_EVERY_RECORDS = 10_000


def should_forward(
    entry: tuple[int, int] | None,
    timestamp: int,
    offset: int | None,
    stream_time: int,
    interval: int,
) -> bool:
    """KIP-655's rule for a record with a non-None id. Both ends of the interval are inclusive."""
    if entry is None:
        return True
    entry_ts, entry_offset = entry
    return (
        stream_time - entry_ts > interval
        or entry_ts - timestamp > interval
        or (offset is not None and offset == entry_offset)  # the same record, replayed
    )


def canonical_bytes(value: Any) -> bytes:
    """Bytes that identify an id or key; equal values give equal bytes, types never collide."""
    if isinstance(value, bytes | bytearray | memoryview):
        return b"b" + bytes(value)
    if isinstance(value, str):
        return b"s" + value.encode()
    if isinstance(value, tuple):
        parts = [canonical_bytes(item) for item in value]
        return b"(" + b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    try:
        return b"j" + json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    except TypeError:
        return b"r" + repr(value).encode()


def _time_key(timestamp: int) -> bytes:
    return _TIME.pack((timestamp + _SIGN) & (2**64 - 1))  # signed -> unsigned, order kept


class DeduplicationProcessor(Processor):
    """Forwards the first of duplicates; see :func:`should_forward` and the module docstring.

    ``id_of(key, value)`` returns the record's id or None (None: forwarded, no trace kept).
    """

    def __init__(self, store_name: str, interval_ms: int, id_of: Callable[[Any, Any], Any]) -> None:
        self.store_name = store_name
        self.interval = interval_ms
        self.id_of = id_of
        self.forwarded = 0
        self.dropped = 0
        self.late = 0  # forwarded but too old to open a window
        self._since_purge = 0
        self._purged_up_to: int | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = context.get_state_store(self.store_name).transaction
        saved = self.store.get(_META_KEY)
        if saved is not None:
            restore = getattr(context, "restore_stream_time", None)
            if restore is not None:
                restore(_ENTRY.unpack(saved)[0])
        self._saved_stream_time: int | None = None

    def process(self, record: Record) -> None:
        identity = self.id_of(record.key, record.value)
        if identity is None:
            self.forwarded += 1
            self.context.forward(record)
            return
        stream_time = self.context.stream_time
        self._save_stream_time(stream_time)
        id_key = b"i" + canonical_bytes(identity)
        stored = self.store.get(id_key)
        entry = _ENTRY.unpack(stored) if stored is not None else None
        offset = self.context.offset
        if not should_forward(entry, record.timestamp, offset, stream_time, self.interval):
            self.dropped += 1
            return
        if record.timestamp >= stream_time - self.interval:
            if entry is not None and entry != (record.timestamp, offset):
                self.store.delete(b"t" + _time_key(entry[0]) + id_key[1:])
            recorded = NO_OFFSET if offset is None else offset
            self.store.put(id_key, _ENTRY.pack(record.timestamp, recorded))
            self.store.put(b"t" + _time_key(record.timestamp) + id_key[1:], b"")
        else:
            self.late += 1
        self.forwarded += 1
        self.context.forward(record)
        self._maybe_purge(stream_time)

    def _save_stream_time(self, stream_time: int) -> None:
        if stream_time != self._saved_stream_time:
            self.store.put(_META_KEY, _ENTRY.pack(stream_time, 0))
            self._saved_stream_time = stream_time

    def _maybe_purge(self, stream_time: int) -> None:
        """Drop entries older than ``stream_time - interval``: they can never cause a drop."""
        self._since_purge += 1
        horizon = stream_time - self.interval
        moved = self._purged_up_to is None or horizon - self._purged_up_to >= self.interval
        if not moved and self._since_purge < _PURGE_EVERY_RECORDS:
            return
        self._since_purge = 0
        self._purged_up_to = horizon
        expired = list(self.store.range(b"t", b"t" + _time_key(horizon)))
        for index_key, _ in expired:
            self.store.delete(index_key)
            id_key = b"i" + index_key[1 + _TIME.size :]
            stored = self.store.get(id_key)
            if stored is not None and _ENTRY.unpack(stored)[0] < horizon:
                self.store.delete(id_key)

    def metrics(self) -> dict[str, int]:
        return {"forwarded": self.forwarded, "dropped": self.dropped, "late": self.late}
