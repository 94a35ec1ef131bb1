"""Bytes that identify a value: the deduplication's ids and the repartition keys of
``partition_by`` are hashed and stored through them."""

from __future__ import annotations

import json
import struct
from typing import Any

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
