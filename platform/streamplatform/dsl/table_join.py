"""KTable-KTable joins on the key: inner, left and outer, as Kafka Streams joins two tables.

Each side's updates go to a processor of their own (Kafka Streams' ``KTableKTable*Join`` for
this side, the mirror one for the other side), which looks the key up in the other side and
forwards the join's new value for that key; a merge node passes both sides' results on as the
joined table's updates. The result's timestamp is the larger of the update's and the other
side's value's (the update's alone when the other side has none).

**Why the join keeps both sides in its own store.** Kafka Streams reads the other side through
its store, which keeps each value's timestamp; our table stores hold the topic's value bytes
only, and a derived table (filter, map_values, another join) has no store at all. So the join
keeps, per side, the last value and timestamp it saw for each key (``b"l"``/``b"r"`` + key ->
8-byte timestamp + value bytes, in the side's value serde). That also gives the side's previous
value, which a left or outer join needs (Kafka Streams' "send old values"): a tombstone for a
key that had no value on either side forwards nothing.

Which updates go on (with the record cache off, as Kafka Streams forwards them):

- inner: nothing when the other side has no value for the key; otherwise the joined value, or a
  tombstone when this side's update is one (even for a key this side never had);
- left, left side: ``joiner(left, right_or_None)``; a tombstone goes on unless the key had no
  value on the left before and has none on the right; right side: nothing when the left has no
  value, else ``joiner(left, right_or_None)`` (a right tombstone updates, never deletes);
- outer: like the left side of a left join, from both sides, with None for a missing value; a
  key left on neither side forwards a tombstone.

A filter before a join drops, in Kafka Streams, the updates that leave a key without a value
before and after once something downstream asks for old values (a left or outer join, a
grouping, KTable._send_old_values); our filter forwards them all, so the join side drops them
instead (``drops_unchanged``).

**A versioned side (KIP-914).** When a side's table is read from a topic into a versioned store
(through filters and map_values only), Kafka Streams' join processor for that side drops every
update that is not the key's latest version (``if (useVersionedSemantics &&
!record.value().isLatest) return;``): the versioned table source marks an update latest when
the store's put returned VALID_TO_UNDEFINED, i.e. when its timestamp is at or after the
timestamp of the key's latest version, a tombstone included. Such an update changes neither
the join's result nor what the other side sees (the store's latest version stays). Our table
source forwards no update the store refused (older than its history retention), and the join
side keeps the timestamp of the side's latest update per key (``b"t"`` + side + key -> 8
bytes, tombstones included), which gives the store's answer: an accepted update older than it
is not the latest. Kafka Streams' filter does not drop updates from no value to no value when
its table is versioned, so neither does the join side then. A join's result is no versioned
table: its updates are all latest (the others were dropped), so a join of joins drops nothing.

**A windowed side.** A windowed aggregation's table (time or sliding windows, or a filter or
map_values of one) is read, in Kafka Streams, through its window store, which no longer finds a
window whose start is a retention behind the largest window start written to it (``get``
returns null when ``start < observedStreamTime - retentionPeriod + 1``,
AbstractRocksDBSegmentedBytesStore). So the lookup of such a side treats a window past its
store's retention as absent: the join side keeps the largest window start of the side's updates
(``b"w"`` + side -> 8 bytes; with the record cache off the aggregation forwards every window it
writes), and the other side's update meets no value there. The update itself is never of an
expired window (the aggregation drops records too late for theirs).

``TableJoinSide.process`` below is the reference. ``_table_join_core.Core`` (C, built with the
package where a C compiler is available) does the same per update for a side neither versioned
nor windowed, and ``tests/dsl/test_table_join_core.py`` holds the two to the same results.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from streamplatform.dsl.processor import (
    Processor,
    ProcessorContext,
    engine_store,
    single_forward,
)
from streamplatform.records import Record
from streamplatform.serdes import Serde

try:
    from streamplatform.dsl import _table_join_core as _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]
# Tests set this to False to run the Python reference where the C core would run.
NATIVE_CORE = True

_TIMESTAMP = struct.Struct(">q")
LEFT, RIGHT = b"l", b"r"  # the prefixes of each side's keys in the join's store
_LATEST = b"t"  # b"t" + side + key: the timestamp of a versioned side's latest update
_WINDOW_TIME = b"w"  # b"w" + side: the largest window start of a windowed side's updates
INNER, LEFT_JOIN, OUTER = "inner", "left", "outer"


class TableJoinSide(Processor):
    """One side of a table-table join (``side`` LEFT or RIGHT) of kind ``kind`` (INNER,
    LEFT_JOIN, OUTER). ``joiner(left_value, right_value)`` whichever side this is."""

    # Updates with a None key (a table has none; derived ones might), and a versioned side's
    # updates that are not the key's latest (Kafka Streams counts both as dropped records).
    dropped_records: int = 0

    def __init__(
        self,
        store_name: str,
        kind: str,
        side: bytes,
        key_serde: Serde,
        serdes: dict[bytes, Serde],
        joiner: Callable[[Any, Any, Any], Any],  # (key, left, right)
        drops_unchanged: bool = False,
        versioned: bool = False,
        retentions: dict[bytes, int] | None = None,
    ) -> None:
        self.store_name = store_name
        # This side's table is versioned: an update that is not the key's latest is dropped.
        self.versioned = versioned
        # The window store retention of each windowed side (by LEFT / RIGHT): its keys end
        # with the window start (8 bytes, TimeWindowedSerde), found only within the retention.
        retentions = retentions or {}
        self.own_retention = retentions.get(side)
        # The input comes through a filter that sends old values (KTable._send_old_values):
        # Kafka Streams' filter forwards no update from no value to no value.
        self.drops_unchanged = drops_unchanged
        self.kind = kind
        self.side = side
        self.other = RIGHT if side == LEFT else LEFT
        self.key_serde = key_serde
        self.own_serde = serdes[side]
        self.other_serde = serdes[self.other]
        self.other_retention = retentions.get(self.other)
        self.joiner = joiner
        self._core: Any = None  # the C core, once init found it can run

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        self._core = self._native_core(context)
        if self._core is not None:
            self.process = self._core.process  # type: ignore[method-assign]

    def _native_core(self, context: ProcessorContext) -> Any:
        """The C core doing what ``process`` does (``_table_join_core.c``), or None: not
        built, switched off by a test, or a side versioned or windowed (Python's alone)."""
        if (_native is None or not NATIVE_CORE or self.versioned
                or self.own_retention is not None or self.other_retention is not None):  # fmt: skip
            return None
        return _native.Core(
            processor=self, store=self.store, kind=(INNER, LEFT_JOIN, OUTER).index(self.kind),
            left=self.side == LEFT, key_serialize=self.key_serde.serialize,
            own_serialize=self.own_serde.serialize,
            other_deserialize=self.other_serde.deserialize, joiner=self.joiner,
            drops_unchanged=self.drops_unchanged, forward=single_forward(context),
            record_type=Record, pack=_TIMESTAMP.pack, unpack_from=_TIMESTAMP.unpack_from,
        )  # fmt: skip

    def task_metrics(self) -> dict[str, int]:
        return {"dropped_records": self.dropped_records}

    def _join(self, key: Any, own: Any, other: Any) -> Any:
        if self.side == LEFT:
            return self.joiner(key, own, other)
        return self.joiner(key, other, own)

    def _observe_window(self, transaction: Any, raw_key: bytes) -> None:
        """This side's store time: the largest window start written (its updates')."""
        start = _TIMESTAMP.unpack_from(raw_key, len(raw_key) - 8)[0]
        time_key = _WINDOW_TIME + self.side
        stored = transaction.get(time_key)
        if stored is None or start > _TIMESTAMP.unpack(stored)[0]:
            transaction.put(time_key, _TIMESTAMP.pack(start))

    def _expired(self, raw_key: bytes, retention: int) -> bool:
        """Whether the other side's window store no longer finds the window of ``raw_key``."""
        stored = self.store.transaction.get(_WINDOW_TIME + self.other)
        if stored is None:
            return False
        start = _TIMESTAMP.unpack_from(raw_key, len(raw_key) - 8)[0]
        return start < _TIMESTAMP.unpack(stored)[0] - retention + 1

    def process(self, record: Record) -> None:
        if self._core is not None:  # a delivery function taken before init() comes here
            self._core.process(record)
            return
        raw_key = None if record.key is None else self.key_serde.serialize(record.key)
        if raw_key is None:
            self.dropped_records += 1  # Kafka Streams skips (and counts) a null key
            return
        transaction = self.store.transaction
        if self.versioned:
            latest_key = _LATEST + self.side + raw_key
            latest = transaction.get(latest_key)
            if latest is not None and record.timestamp < _TIMESTAMP.unpack(latest)[0]:
                self.dropped_records += 1  # out of order: not the key's latest version
                return
            transaction.put(latest_key, _TIMESTAMP.pack(record.timestamp))
        own_key = self.side + raw_key
        new = record.value
        had_value = transaction.get(own_key) is not None  # this side's previous value
        if new is None:
            transaction.delete(own_key)
        else:
            data = self.own_serde.serialize(new) or b""
            transaction.put(own_key, _TIMESTAMP.pack(record.timestamp) + data)
        if self.own_retention is not None:
            self._observe_window(transaction, raw_key)
        raw_other = transaction.get(self.other + raw_key)
        retention = self.other_retention
        if raw_other is not None and retention is not None and self._expired(raw_key, retention):
            raw_other = None  # past the other side's store retention: not found
        if raw_other is None:
            other = None
            timestamp = record.timestamp
        else:
            other = self.other_serde.deserialize(raw_other[8:])
            timestamp = max(record.timestamp, _TIMESTAMP.unpack_from(raw_other)[0])
        if new is None and not had_value and self.drops_unchanged:
            return
        kind = self.kind
        if kind == INNER or (kind == LEFT_JOIN and self.side == RIGHT):
            # The inner join, and the right side of a left join (Kafka Streams' RightJoin): the
            # other side has no value, so the key is in no result and nothing changes.
            if other is None:
                return
            if kind == INNER:
                value = None if new is None else self._join(record.key, new, other)
            else:
                value = self._join(
                    record.key, new, other
                )  # the left value, with the right's new or None
        else:  # the left side of a left join, either side of an outer join
            if other is None and new is None and not had_value:
                return  # the key is in the result neither before nor after
            if new is None and (kind == LEFT_JOIN or other is None):
                value = None
            else:
                value = self._join(record.key, new, other)
        self.context.forward(record._replace(value=value, timestamp=timestamp))
