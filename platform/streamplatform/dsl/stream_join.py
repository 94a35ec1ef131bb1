"""Stream-stream joins within a time difference (``JoinWindows``), as Kafka Streams joins.

Each side keeps its records in a window store for ``before + after + grace`` (its retention);
a record of one side joins every record of the other side with the same key whose timestamp is
within ``[t - before, t + after]`` (for the right side the other way round), and the joined
record's timestamp is the later of the two. ``joiner(left_value, right_value)`` always gets
the left value first.

**Left and outer joins** (Kafka Streams' fix of spurious results, KIP-633): a record that
found no partner is not forwarded with None at once; it waits in a shared "outer" store until
its window closes (stream time passes its timestamp plus the other side's window and the
grace), and goes on with None only if no partner came by then. The records whose windows
closed are forwarded when a record in order (its timestamp is the join's stream time) arrives,
in the store's order: by timestamp, right before left, then key. A record that is already past
its window when it arrives goes on with None at once.

Records with a None key or value are dropped and counted (``dropped_records``), except a left
(outer) side's record with a None key and a value, which goes on with None at once, as Kafka
Streams does.

Where this differs from Kafka Streams: there is no wall-clock throttle on emitting the closed
records (Kafka Streams checks at most once a second by default; its tests set it to 0), and
the join's stream time is kept in the outer store, so a restarted task goes on from it.

``StreamStreamJoinSide.process`` (with ``_WindowSide``, ``_OuterRecords`` and
``_emit_closed``) below is the reference. ``_join_core.Core`` (C, built with the package where a
C compiler is available) does the same per record, on the same Python objects and through the
same store transactions' methods, and ``tests/dsl/test_join_core.py`` holds the two to the same
results.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from operator import itemgetter
from typing import Any

from streamplatform.dsl.aggregate import KeptStreamTime
from streamplatform.dsl.processor import (
    Processor,
    ProcessorContext,
    engine,
    engine_store,
    single_forward,
)
from streamplatform.records import Record
from streamplatform.serdes import Serde, Serdes
from streamplatform.state.stores import duration_ms

try:  # the C per-record path, built with the package where a C compiler is available
    from streamplatform.dsl import _join_core as _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]
# Tests set this to False to run the Python reference where the C core would run.
NATIVE_CORE = True

_TIME = struct.Struct(">q")
_LENGTH = struct.Struct(">I")
_RECORD_HEAD = struct.Struct(">qI")  # a stored record: timestamp, value length, then the value
_pack_time, _pack_record_head = _TIME.pack, _RECORD_HEAD.pack
_unpack_record_head = _RECORD_HEAD.unpack_from
_OBSERVED_TIME_KEY = b"m:observed-time"  # a window store's largest timestamp put
_RECORD_PREFIX = b"w"  # window store: b"w" + segment + key -> (timestamp, value)s
_OUTER_PREFIX = b"o"  # outer store: b"o" + timestamp + side + key -> values
_LEFT, _RIGHT = b"\x01", b"\x00"  # at one timestamp right sorts first, as in Kafka Streams
_MIN_SEGMENT_MS = 60_000  # Kafka Streams' smallest segment interval
_new_record = tuple.__new__  # a Record without its Python-level __new__ (as Task does)


@dataclass(frozen=True)
class JoinWindows:
    """How far apart in time two records may be to join: a left record at t joins right
    records in ``[t - before, t + after]``; records wait ``grace`` more for late partners.
    Build them with ``of_time_difference_and_grace`` or ``of_time_difference_with_no_grace``;
    ``before``/``after`` make them asymmetric."""

    before_ms: int
    after_ms: int
    grace_ms: int

    def __post_init__(self) -> None:
        if self.before_ms + self.after_ms < 0:
            raise ValueError(
                f"the join window (before {self.before_ms} ms + after {self.after_ms} ms) "
                "must not be negative"
            )
        if self.grace_ms < 0:
            raise ValueError(f"grace must not be negative, got {self.grace_ms} ms")

    @classmethod
    def of_time_difference_and_grace(
        cls, time_difference: timedelta | int, grace: timedelta | int
    ) -> JoinWindows:
        difference = duration_ms(time_difference, "time_difference")
        return cls(difference, difference, duration_ms(grace, "grace"))

    @classmethod
    def of_time_difference_with_no_grace(cls, time_difference: timedelta | int) -> JoinWindows:
        return cls.of_time_difference_and_grace(time_difference, 0)

    def before(self, time_difference: timedelta | int) -> JoinWindows:
        """Right records up to ``time_difference`` before a left record join it."""
        before_ms = duration_ms(time_difference, "time_difference")
        return JoinWindows(before_ms, self.after_ms, self.grace_ms)

    def after(self, time_difference: timedelta | int) -> JoinWindows:
        """Right records up to ``time_difference`` after a left record join it."""
        after_ms = duration_ms(time_difference, "time_difference")
        return JoinWindows(self.before_ms, after_ms, self.grace_ms)

    @property
    def size_ms(self) -> int:
        return self.before_ms + self.after_ms

    @property
    def retention_ms(self) -> int:
        """How long each side's store keeps a record (Kafka Streams': size + grace)."""
        return self.size_ms + self.grace_ms


def _unpack_values(raw: bytes) -> Iterator[bytes]:
    position = 0
    while position < len(raw):
        (length,) = _LENGTH.unpack_from(raw, position)
        position += 4
        yield raw[position : position + length]
        position += length


def _serde_kind(serde: Serde) -> int:
    """How the C core does a serde's work: 1 and 2 in C for the built-in bytes and string
    serdes (the same bytes and values), 0 by calling it."""
    return 1 if serde is Serdes.bytes() else 2 if serde is Serdes.string() else 0


class _WindowSide:
    """One side's records, by time segment and key: one store entry per segment and key
    holds that key's records of the segment (timestamp, value), in their arrival order, so
    a fetch is a point read per segment, not a scan. A segment older than the retention
    leaves the store whole, as Kafka Streams' segmented window store drops it."""

    def __init__(self, store: Any, retention_ms: int) -> None:
        self.store = store
        # The store's writing transaction, taken once: it stays the same while the task is
        # open (a reopened task makes new processors, and so a new _WindowSide).
        self.transaction = store.transaction
        self.retention_ms = retention_ms
        self.segment_ms = max(retention_ms // 2, _MIN_SEGMENT_MS)
        self.observed = KeptStreamTime(store, _OBSERVED_TIME_KEY)
        self.dropped_below = 0  # segments before it are gone (0: not known yet, look from 0)
        self.next_drop_at = 0  # the observed time at which a segment may expire next

    def put(self, key: bytes, timestamp: int, value: bytes) -> None:
        observed = self.observed
        if timestamp > observed.time:
            observed.time = timestamp
            if timestamp >= self.next_drop_at:
                self._drop_expired_segments()
        elif timestamp <= observed.time - self.retention_ms:
            return  # already expired: no fetch could see it
        store_key = _RECORD_PREFIX + _pack_time(timestamp // self.segment_ms) + key
        transaction = self.transaction
        old = transaction.get(store_key)
        packed = _pack_record_head(timestamp, len(value)) + value
        transaction.put(store_key, packed if old is None else old + packed)

    def fetch(self, key: bytes, time_from: int, time_to: int) -> list[tuple[int, bytes]]:
        """The records of ``key`` with timestamps in [time_from, time_to] that are not
        expired, in time order (arrival order within one timestamp), as Kafka Streams'
        window store fetches them."""
        observed = self.observed.time
        time_from = max(time_from, observed - self.retention_ms + 1)
        # Nothing later than the latest timestamp put is stored: the segments after it are
        # not looked up (a record at the head of the stream reads one segment less).
        time_to = min(time_to, observed)
        if time_to < time_from:
            return []
        found: list[tuple[int, bytes]] = []
        get, segment_ms = self.transaction.get, self.segment_ms
        for segment in range(time_from // segment_ms, time_to // segment_ms + 1):
            raw = get(_RECORD_PREFIX + _pack_time(segment) + key)
            if raw is None:
                continue
            records = []
            position, size = 0, len(raw)
            while position < size:
                timestamp, length = _unpack_record_head(raw, position)
                position += 12 + length
                if time_from <= timestamp <= time_to:
                    records.append((timestamp, raw[position - length : position]))
            if len(records) > 1:
                records.sort(key=itemgetter(0))  # stable: arrival order within a timestamp
            found += records
        return found

    def _drop_expired_segments(self) -> None:
        live = max(0, (self.observed.time - self.retention_ms) // self.segment_ms)
        self.next_drop_at = (live + 1) * self.segment_ms + self.retention_ms
        if live <= self.dropped_below:
            return
        low = _RECORD_PREFIX + _TIME.pack(self.dropped_below)
        self.transaction.delete_range(low, _RECORD_PREFIX + _TIME.pack(live))
        self.dropped_below = live


class _OuterRecords:
    """Left (outer) join records that found no partner yet, by timestamp, side and key."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.transaction = store.transaction  # as _WindowSide takes it
        self.stream_time = KeptStreamTime(store)  # the join's stream time
        # The smallest timestamp that may be waiting (None: not known, look); a hint that
        # saves looking at the store on every record, kept as Kafka Streams keeps it.
        self.min_time: int | None = None

    @staticmethod
    def store_key(timestamp: int, side: bytes, key: bytes) -> bytes:
        return _OUTER_PREFIX + _TIME.pack(timestamp) + side + key

    def add(self, timestamp: int, side: bytes, key: bytes, value: bytes) -> None:
        store_key = self.store_key(timestamp, side, key)
        transaction = self.transaction
        old = transaction.get(store_key)
        packed = _LENGTH.pack(len(value)) + value
        transaction.put(store_key, packed if old is None else old + packed)
        self.min_time = timestamp if self.min_time is None else min(self.min_time, timestamp)

    def remove(self, timestamp: int, side: bytes, key: bytes) -> None:
        """A waiting record found its partner: it (and any other of its key, side and
        timestamp) no longer waits."""
        store_key = self.store_key(timestamp, side, key)
        transaction = self.transaction
        if transaction.get(store_key) is not None:
            transaction.delete(store_key)

    def records(self) -> Iterator[tuple[bytes, int, bytes, bytes, bytes]]:
        """(store key, timestamp, side, key, value) of each waiting record, in the store's
        order (a store key's records in their arrival order)."""
        for store_key, raw in self.transaction.prefix(_OUTER_PREFIX):
            timestamp = _TIME.unpack_from(store_key, 1)[0]
            for value in _unpack_values(raw):
                yield store_key, timestamp, store_key[9:10], store_key[10:], value


class _JoinState:
    """What the two sides of one join share in one task: both window stores and the outer
    records (left and outer joins)."""

    def __init__(self, context: ProcessorContext, stores: JoinStores, retention_ms: int) -> None:
        self.left = _WindowSide(engine_store(context, stores.left), retention_ms)
        self.right = _WindowSide(engine_store(context, stores.right), retention_ms)
        self.outer = (
            None if stores.outer is None else _OuterRecords(engine_store(context, stores.outer))
        )

    def save(self) -> None:
        self.left.observed.save()
        self.right.observed.save()
        if self.outer is not None:
            self.outer.stream_time.save()


@dataclass(frozen=True)
class JoinStores:
    """The store names of one join: each side's window store, the outer records' store."""

    left: str
    right: str
    outer: str | None

    def names(self) -> tuple[str, ...]:
        return (self.left, self.right) + (() if self.outer is None else (self.outer,))


@dataclass(frozen=True)
class JoinSpec:
    """One stream-stream join, as both of its sides' processors need it."""

    stores: JoinStores
    windows: JoinWindows
    joiner: Callable[[Any, Any, Any], Any]  # (key, left value, right value)
    key_serde: Serde
    left_serde: Serde
    right_serde: Serde
    left_outer: bool  # left records with no partner go on with None
    right_outer: bool  # right records with no partner go on with None


class StreamStreamJoinSide(Processor):
    """One side of a stream-stream join: joins each of its records with the other side's
    stored ones, then stores it for the other side's records to come."""

    dropped_records: int = 0

    def __init__(self, spec: JoinSpec, left: bool) -> None:
        self.spec = spec
        self.is_left = left
        windows = spec.windows
        # The other side's records that join this side's record at t: [t - before, t + after].
        if left:
            self.join_before, self.join_after = windows.before_ms, windows.after_ms
            self.outer, self.side, self.serde = spec.left_outer, _LEFT, spec.left_serde
        else:
            self.join_before, self.join_after = windows.after_ms, windows.before_ms
            self.outer, self.side, self.serde = spec.right_outer, _RIGHT, spec.right_serde
        self.other_side = _RIGHT if left else _LEFT
        self.serialize_key = spec.key_serde.serialize
        self.other_serde = spec.right_serde if left else spec.left_serde
        self._core: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.forward = single_forward(context)
        # Both sides' processors of one task share the join's state: the first creates it.
        found = engine(context)
        task = None if found is None else found.task
        shared: dict[str, Any] = task.shared if task is not None else {}
        name = self.spec.stores.left
        if name not in shared:
            shared[name] = _JoinState(context, self.spec.stores, self.spec.windows.retention_ms)
        self.state: _JoinState = shared[name]
        self.own = self.state.left if self.is_left else self.state.right
        self.others = self.state.right if self.is_left else self.state.left
        self._core = self._native_core()
        if self._core is not None:  # the task calls it: no Python frame per record
            self.process = self._core.process  # type: ignore[method-assign]

    def _native_core(self) -> Any:
        """The C core doing what ``process`` does, or None (not built, or switched off by a
        test)."""
        if _native is None or not NATIVE_CORE:
            return None
        spec, windows, outer = self.spec, self.spec.windows, self.state.outer
        return _native.Core(
            processor=self, own=self.own, outer=outer, own_observed=self.own.observed,
            others_observed=self.others.observed,
            stream_time=None if outer is None else outer.stream_time,
            own_get=self.own.transaction.get, own_put=self.own.transaction.put,
            others_get=self.others.transaction.get,
            outer_get=None if outer is None else outer.transaction.get,
            outer_put=None if outer is None else outer.transaction.put,
            outer_delete=None if outer is None else outer.transaction.delete,
            outer_prefix=None if outer is None else outer.transaction.prefix,
            key_serialize=self.serialize_key, key_deserialize=spec.key_serde.deserialize,
            value_serialize=self.serde.serialize,
            other_deserialize=self.other_serde.deserialize,
            left_deserialize=spec.left_serde.deserialize,
            right_deserialize=spec.right_serde.deserialize, joiner=spec.joiner,
            forward=self.forward, record_type=Record, key_kind=_serde_kind(spec.key_serde),
            value_kind=_serde_kind(self.serde), other_kind=_serde_kind(self.other_serde),
            left_kind=_serde_kind(spec.left_serde), right_kind=_serde_kind(spec.right_serde),
            join_before=self.join_before, join_after=self.join_after,
            before=windows.before_ms, after=windows.after_ms, grace=windows.grace_ms,
            retention=self.own.retention_ms, segment=self.own.segment_ms,
            is_left=self.is_left, outer_side=self.outer,
        )  # fmt: skip

    def flush(self) -> None:
        self.state.save()

    def task_metrics(self) -> dict[str, int]:
        return {"dropped_records": self.dropped_records}

    def _joined(self, key: Any, this: Any, other: Any) -> Any:
        joiner = self.spec.joiner
        return joiner(key, this, other) if self.is_left else joiner(key, other, this)

    def process(self, record: Record) -> None:
        if self._core is not None:  # a delivery function taken before init() comes here
            self._core.process(record)
            return
        timestamp, outer = record[2], self.state.outer
        if outer is not None and timestamp > outer.stream_time.time:
            outer.stream_time.time = timestamp
        if record[0] is None or record[1] is None:
            if self.outer and record.key is None and record.value is not None:
                self.context.forward(
                    record._replace(value=self._joined(record.key, record.value, None))
                )
            else:
                self.dropped_records += 1
            return
        key = self.serialize_key(record[0]) or b""
        if outer is not None and timestamp == outer.stream_time.time:
            self._emit_closed(record)
        time_from = timestamp - self.join_before
        time_to = timestamp + self.join_after
        partners = self.others.fetch(key, time_from if time_from > 0 else 0,
                                     time_to if time_to > 0 else 0)  # fmt: skip
        if partners:
            deserialize, forward = self.other_serde.deserialize, self.forward
            for other_timestamp, other_raw in partners:
                if outer is not None:
                    outer.remove(other_timestamp, self.other_side, key)
                joined = self._joined(record[0], record[1], deserialize(other_raw))
                later = timestamp if timestamp >= other_timestamp else other_timestamp
                forward(_new_record(Record, (record[0], joined, later, record[3])))
        value = self.serde.serialize(record[1]) or b""
        if self.outer and not partners:
            if outer is None or time_to < outer.stream_time.time:
                self.context.forward(
                    record._replace(value=self._joined(record.key, record.value, None))
                )
            else:
                outer.add(timestamp, self.side, key, value)
        self.own.put(key, timestamp, value)

    def _emit_closed(self, record: Record) -> None:
        """Forward, with None, the waiting records whose windows have closed."""
        outer = self.state.outer
        assert outer is not None
        windows, stream_time = self.spec.windows, outer.stream_time.time
        if outer.min_time is not None and \
                outer.min_time + self.join_after + windows.grace_ms >= stream_time:  # fmt: skip
            return  # nothing waiting can have closed yet
        outer.min_time = None
        left_open = right_open = False
        emitted: list[bytes] = []
        # One step per waiting record (several may share a store key), as Kafka Streams
        # iterates its list-valued store: the hint ends at the record it stopped at.
        for store_key, timestamp, side, key, raw in outer.records():
            outer.min_time = timestamp
            if left_open and right_open:
                break
            # A left record waits for right records up to `after` later, a right one for
            # left records up to `before` later.
            look = windows.after_ms if side == _LEFT else windows.before_ms
            if timestamp + look + windows.grace_ms >= stream_time:
                if side == _LEFT:
                    left_open = True
                else:
                    right_open = True
                continue
            key_value = self.spec.key_serde.deserialize(key)
            if side == _LEFT:
                joined = self.spec.joiner(key_value, self.spec.left_serde.deserialize(raw), None)
            else:
                joined = self.spec.joiner(key_value, None, self.spec.right_serde.deserialize(raw))
            self.context.forward(record._replace(key=key_value, value=joined, timestamp=timestamp))
            if not emitted or emitted[-1] != store_key:
                emitted.append(store_key)
        transaction = outer.transaction
        for store_key in emitted:
            transaction.delete(store_key)
