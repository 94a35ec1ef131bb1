"""Kafka's default partitioner: murmur2 of the key bytes, as the Java producer computes it.

Records written to repartition topics carry an explicit partition from here, so they land where
a Java client would put them (confluent-kafka's own default, CRC32-based, would not).

    >>> partition_for(b"a", 3), partition_for(b"hello", 12)
    (1, 9)
"""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """32-bit murmur2 with Kafka's seed, as a signed int like Java's ``Utils.murmur2``."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def python_partition_for(key: bytes, partitions: int) -> int:
    """``Utils.toPositive(Utils.murmur2(key)) % partitions``: the reference of the C one."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


try:  # built with the package where a C compiler is available (setup.py)
    from streamplatform.runtime._kafka_rows import partition_for
except ImportError:  # pragma: no cover - depends on the build
    partition_for = python_partition_for
