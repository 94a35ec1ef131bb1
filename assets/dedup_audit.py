"""How many times each (key, id) may appear in a deduplicated output, by KIP-655's own rule.

The dedup job forwards a record unless a record with the same id was stored within the
interval (KIP-655's rule as docs/semantics.md states it; :func:`forwards` writes it down here,
apart from the library's code, so that the audit holds the job to the rule, not to itself).
Duplicates in the demo data repeat the
original's timestamp, so the output legitimately holds an id twice when the repeat arrived after
stream time had moved more than the interval past the original: "no duplicate ids" is only true
*within the interval*, judged at the stream time of the task.

:func:`expected_forwards` replays that rule over the job's *input* — per source partition in
offset order, stream time as the largest timestamp of records that deserialized — independently
of the runtime's stores, batches, restarts and replays. The asset check compares its counts with
the output's: an extra copy is a duplicate within the interval (e.g. an at-least-once Kafka write
repeated), a missing one a lost record.

    >>> rows = [(0, 0, "USD", {"id": "a"}, 1_000), (0, 1, "USD", {"id": "a"}, 1_000),
    ...         (0, 2, "USD", {"id": "b"}, 700_000), (0, 3, "USD", {"id": "a"}, 1_000)]
    >>> dict(expected_forwards(rows, interval_ms=600_000))  # the 2nd "a" is a duplicate,
    ... # the 3rd arrives when stream time is 699 s past the first: forwarded again
    {('USD', 'a'): 2, ('USD', 'b'): 1}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

Row = tuple[int, int, Any, Any, int]  # (partition, offset, key, value or None, timestamp)
NOT_DESERIALIZED = object()  # a poison record: neither processed nor moving stream time


def forwards(
    entry: tuple[int, int] | None, timestamp: int, offset: int, stream_time: int, interval_ms: int
) -> bool:
    """Whether a record with an id is forwarded (docs/semantics.md, "Deduplication"): when its
    id has no entry (``(timestamp, offset)`` of the last record forwarded), when the entry is
    more than the interval behind stream time or more than the interval after the record, or
    when it is the entry's own record, replayed. Both ends of the interval are inclusive."""
    if entry is None:
        return True
    entry_ts, entry_offset = entry
    return (
        stream_time - entry_ts > interval_ms
        or entry_ts - timestamp > interval_ms
        or offset == entry_offset
    )


def expected_forwards(rows: Iterable[Row], interval_ms: int) -> Counter[tuple[Any, Any]]:
    """Forwarded records per ``(key, id)`` by ``deduplicate_by_key_value(value["id"])``.

    ``value`` is the deserialized value, or :data:`NOT_DESERIALIZED` for a poison record.
    """
    counts: Counter[tuple[Any, Any]] = Counter()
    by_partition: dict[int, list[Row]] = {}
    for row in rows:
        by_partition.setdefault(row[0], []).append(row)
    for partition_rows in by_partition.values():
        stream_time = -1
        stored: dict[tuple[Any, Any], tuple[int, int]] = {}
        for _, offset, key, value, timestamp in sorted(partition_rows, key=lambda r: r[1]):
            if value is NOT_DESERIALIZED:
                continue
            stream_time = max(stream_time, timestamp)
            identity = value.get("id") if isinstance(value, dict) else None
            if identity is None:
                continue  # forwarded, never tracked: not a dedup candidate
            entry = stored.get((key, identity))
            if not forwards(entry, timestamp, offset, stream_time, interval_ms):
                continue
            if timestamp >= stream_time - interval_ms:
                stored[(key, identity)] = (timestamp, offset)
            counts[(key, identity)] += 1
    return counts


def compare(
    expected: Counter[tuple[Any, Any]], actual: Counter[tuple[Any, Any]]
) -> tuple[dict[str, int], dict[str, int]]:
    """``(extra, missing)``: ``"key/id"`` -> how many copies too many / too few."""
    extra = {
        f"{k}/{i}": n - expected[(k, i)] for (k, i), n in actual.items() if n > expected[(k, i)]
    }
    missing = {
        f"{k}/{i}": n - actual[(k, i)] for (k, i), n in expected.items() if n > actual[(k, i)]
    }
    return extra, missing
