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
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from streamplatform.dsl.processor import Processor, ProcessorContext, engine_store
from streamplatform.records import Record
from streamplatform.serdes import Serde

_TIMESTAMP = struct.Struct(">q")
LEFT, RIGHT = b"l", b"r"  # the prefixes of each side's keys in the join's store
INNER, LEFT_JOIN, OUTER = "inner", "left", "outer"


class TableJoinSide(Processor):
    """One side of a table-table join (``side`` LEFT or RIGHT) of kind ``kind`` (INNER,
    LEFT_JOIN, OUTER). ``joiner(left_value, right_value)`` whichever side this is."""

    dropped_records: int = 0  # updates with a None key (a table has none; derived ones might)

    def __init__(
        self,
        store_name: str,
        kind: str,
        side: bytes,
        key_serde: Serde,
        serdes: dict[bytes, Serde],
        joiner: Callable[[Any, Any, Any], Any],  # (key, left, right)
        drops_unchanged: bool = False,
    ) -> None:
        self.store_name = store_name
        # The input comes through a filter that sends old values (KTable._send_old_values):
        # Kafka Streams' filter forwards no update from no value to no value.
        self.drops_unchanged = drops_unchanged
        self.kind = kind
        self.side = side
        self.other = RIGHT if side == LEFT else LEFT
        self.key_serde = key_serde
        self.own_serde = serdes[side]
        self.other_serde = serdes[self.other]
        self.joiner = joiner

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)

    def task_metrics(self) -> dict[str, int]:
        return {"dropped_records": self.dropped_records}

    def _join(self, key: Any, own: Any, other: Any) -> Any:
        if self.side == LEFT:
            return self.joiner(key, own, other)
        return self.joiner(key, other, own)

    def process(self, record: Record) -> None:
        raw_key = None if record.key is None else self.key_serde.serialize(record.key)
        if raw_key is None:
            self.dropped_records += 1  # Kafka Streams skips (and counts) a null key
            return
        transaction = self.store.transaction
        own_key = self.side + raw_key
        new = record.value
        had_value = transaction.get(own_key) is not None  # this side's previous value
        if new is None:
            transaction.delete(own_key)
        else:
            data = self.own_serde.serialize(new) or b""
            transaction.put(own_key, _TIMESTAMP.pack(record.timestamp) + data)
        raw_other = transaction.get(self.other + raw_key)
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
