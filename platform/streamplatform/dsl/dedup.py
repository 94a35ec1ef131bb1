"""Deduplication within a time interval (KIP-655), exactly as ../shared/spec/NOTES.md states it.

The store keeps, per id, the (timestamp, offset) of the last record it let through. Stream
time is the task's (largest timestamp processed, None keys included); the processor saves it
in its own store so that it survives a restart together with the entries it explains.

Entries older than ``stream_time - interval`` can never cause a drop again and are purged
through a time-ordered index. The index is a heap in memory, rebuilt from the store when the
task starts: it costs no store write per record and no range scan over deletion markers, and
the store stays the single source of truth. The store holds at most an interval's worth of
ids, so rebuilding reads at most that much.

Store layout (one transactional key-value store, bytes keys):

    b"i" + id   -> timestamp (8 bytes) + offset (8 bytes; -1 = no offset)
    b"m"        -> saved stream time
"""

from __future__ import annotations

import heapq
import json
import struct
from collections.abc import Callable
from typing import Any

from streamplatform.dsl.processor import Processor, ProcessorContext
from streamplatform.records import Record

_ENTRY = struct.Struct(">qq")
_META_KEY = b"m"
_ID_PREFIX = b"i"
NO_OFFSET = -1


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


_U32 = struct.Struct(">I").pack


def canonical_bytes(value: Any) -> bytes:
    """Bytes that identify an id or key; equal values give equal bytes, types never collide."""
    kind = type(value)
    if kind is str:  # the common cases first
        return b"s" + value.encode()
    if kind is tuple and len(value) == 2:
        first, second = value
        if type(first) is str and type(second) is str:
            # deduplicate_by_key_value's (key, id): the generic form below, unrolled.
            first, second = first.encode(), second.encode()
            return (
                b"(" + _U32(len(first) + 1) + b"s" + first + _U32(len(second) + 1) + b"s" + second
            )
    if isinstance(value, bytes | bytearray | memoryview):
        return b"b" + bytes(value)
    if isinstance(value, str):
        return b"s" + value.encode()
    if isinstance(value, tuple):
        parts = [canonical_bytes(item) for item in value]
        return b"(" + b"".join([len(p).to_bytes(4, "big") + p for p in parts])
    try:
        return b"j" + json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    except TypeError:
        return b"r" + repr(value).encode()


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
        self._expiry: list[tuple[int, bytes]] = []  # (timestamp, id key) heap

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = context.get_state_store(self.store_name).transaction
        saved = self.store.get(_META_KEY)
        if saved is not None:
            restore = getattr(context, "restore_stream_time", None)
            if restore is not None:
                restore(_ENTRY.unpack(saved)[0])
        self._saved_stream_time: int | None = None
        self._expiry = [
            (_ENTRY.unpack(value)[0], key) for key, value in self.store.prefix(_ID_PREFIX)
        ]
        heapq.heapify(self._expiry)

    def process(self, record: Record) -> None:
        # should_forward(), inlined: this runs once per record.
        identity = self.id_of(record[0], record[1])
        context = self.context
        if identity is None:
            self.forwarded += 1
            context.forward(record)
            return
        stream_time = context.stream_time
        interval = self.interval
        id_key = _ID_PREFIX + canonical_bytes(identity)
        store = self.store
        stored = store.get(id_key)
        offset = context.offset
        timestamp = record[2]
        if stored is not None:
            entry_ts, entry_offset = _ENTRY.unpack(stored)
            if not (
                stream_time - entry_ts > interval
                or entry_ts - timestamp > interval
                or (offset is not None and offset == entry_offset)
            ):
                self.dropped += 1
                return
        horizon = stream_time - interval
        if timestamp >= horizon:
            store.put(id_key, _ENTRY.pack(timestamp, NO_OFFSET if offset is None else offset))
            heapq.heappush(self._expiry, (timestamp, id_key))
        else:
            self.late += 1
        self.forwarded += 1
        context.forward(record)
        expiry = self._expiry
        if expiry and expiry[0][0] < horizon:
            self._purge(horizon)

    def _purge(self, horizon: int) -> None:
        """Delete entries older than ``horizon``; a heap item whose id was stored again with
        a newer timestamp since is only dropped from the heap."""
        expiry = self._expiry
        while expiry and expiry[0][0] < horizon:
            _, id_key = heapq.heappop(expiry)
            stored = self.store.get(id_key)
            if stored is not None and _ENTRY.unpack(stored)[0] < horizon:
                self.store.delete(id_key)

    def before_commit(self) -> None:
        """Save the task's stream time with the entries it explains (the task calls this)."""
        stream_time = self.context.stream_time
        if stream_time != self._saved_stream_time:
            self.store.put(_META_KEY, _ENTRY.pack(stream_time, 0))
            self._saved_stream_time = stream_time

    def metrics(self) -> dict[str, int]:
        return {"forwarded": self.forwarded, "dropped": self.dropped, "late": self.late}
