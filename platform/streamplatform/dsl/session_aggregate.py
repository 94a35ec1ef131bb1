"""count / reduce / aggregate of a grouped stream per session (``SessionWindows``), as Kafka
Streams' ``KStreamSessionWindowAggregate`` computes them.

A record at t joins every session of its key that ends at or after t - gap and starts at or
before t + gap: they merge (``merger(key, aggregate1, aggregate2)``, in the order of their ends,
starting from ``initializer()``) into one session spanning them all and t, and the record is
aggregated into it. The sessions merged away are deleted, each forwarded as a tombstone, then
the new session goes on (also when it keeps the window of the one session it absorbed: Kafka
Streams deletes and writes it again; its record cache keeps only the last of the two). Each
update carries the session's end as its timestamp.

A record with a None key is dropped and counted; a None value is aggregated, as Kafka Streams
does. A record is dropped and counted when the session it would make ends before stream time
- gap - grace. Sessions whose end is more than gap + grace behind the latest session end written
are no longer seen (Kafka Streams' retention), and leave the store.

``SessionWindowAggregate.process`` (with ``_emit_final``) below is the reference.
``_session_core.Core`` (C, built with the package where a C compiler is available) does the
same per record, and ``tests/dsl/test_session_core.py`` holds the two to the same results. What
C saves is the interpreter's work around the same Python objects (the record cache's
OrderedDict, its entries and its index of a key's sessions, the store's transaction, the
aggregation's helpers), and reads of the store: it keeps each key's sessions between records
(results no aggregator can change in place only), and on window close the sessions not yet
emitted, so that a record's final results need no scan of the store's time index; both within
the task's cache share (docs/memory.md), read again from the store when dropped. On window
close it also holds the writes of kept keys' sessions back from the store's transaction until
the flush (``KeyedWindowAggregation.flush`` calls ``write_held``): a session merged away, or
created and expired within one commit, is never staged, as it would be put and deleted again.
A count's final results into a sink that takes them as they come (``_writes_windowed_key``,
the long serde) are written into the sink's rows by the core itself
(``_Aggregation._direct_sink``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamplatform.dsl.aggregate import (
    _LATEST,
    _TIMESTAMP,
    KeyedWindowAggregation,
    _cache_bytes,
    is_count,
    keyed_prefix,
)
from streamplatform.dsl.processor import ProcessorContext, single_forward
from streamplatform.dsl.windows import (
    EmitStrategy,
    SessionWindowedSerde,
    SessionWindows,
    Window,
    Windowed,
)
from streamplatform.records import Record
from streamplatform.serdes import Serdes

try:  # the C per-record path, built with the package where a C compiler is available
    from streamplatform.dsl import _session_core as _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]
# Tests set this to False to run the Python reference where the C core would run.
NATIVE_CORE = True


class SessionWindowAggregate(KeyedWindowAggregation):
    """A grouped stream aggregated per session: a KTable keyed by ``Windowed(key,
    Window(start, end))``, both ends inclusive."""

    suffix_tail = 8  # a session's suffix is its end, then its start

    def __init__(
        self,
        windows: SessionWindows,
        emit: EmitStrategy,
        merger: Callable[[Any, Any, Any], Any],
        *aggregation: Any,
    ) -> None:
        """``aggregation``: what ``StreamAggregate`` takes; ``merger(key, agg1, agg2)``."""
        super().__init__(*aggregation)
        self.windows = windows
        self.merger = merger
        self.retention_ms = windows.retention_ms
        self.emit_final = emit == EmitStrategy.on_window_close()
        self._core: Any = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._core = self._native_core(context)
        if self._core is not None:
            self.process = self._core.process  # type: ignore[method-assign]

    def _native_core(self, context: ProcessorContext) -> Any:
        """The C core doing what ``process`` does, or None (not built, or switched off by a
        test)."""
        if _native is None or not NATIVE_CORE:
            return None
        from streamplatform.dsl.grouped import _add  # grouped.py imports this module

        return _native.Core(
            aggregation=self, cache=self.cache, store=self.store, stream_time=self.stream_time,
            store_time=self.store_time, emitted_to=self.emitted_to, task=self.cache.task,
            key_serialize=self.key_serde.serialize, key_deserialize=self.key_serde.deserialize,
            string_keys=self.key_serde is Serdes.string(),
            result_deserialize=self.result_serde.deserialize, initializer=self.initializer,
            aggregator=self.aggregator, merger=self.merger,
            # count(): C counts and adds merged counts (its merger is grouped._add) itself
            count=is_count(self.initializer, self.aggregator) and self.merger is _add,
            gap=self.windows.inactivity_gap_ms, grace=self.windows.grace_ms,
            retention=self.retention_ms, emit_final=self.emit_final,
            forward=single_forward(context), record_type=Record, windowed_type=Windowed,
            window_type=Window, result_serialize=self.result_serde.serialize,
            long_results=self.result_serde is Serdes.long(),
            # a key's sessions kept between records, within the task's cache share
            memory_bytes=_cache_bytes(context),
            **self._sink_arguments(context if self.emit_final else None),  # final results only
        )  # fmt: skip

    def _writes_windowed_key(self, serde: Any) -> bool:
        """Kafka Streams' session-windowed serde of the key serde: the key's bytes, then the
        session's end and start, as the store keys' suffix holds them."""
        return isinstance(serde, SessionWindowedSerde) and serde.inner is self.key_serde

    def process(self, record: Record) -> None:
        if record.key is None:
            self.dropped_records += 1
            return
        timestamp, gap = record.timestamp, self.windows.inactivity_gap_ms
        if timestamp > self.stream_time.time:
            self.stream_time.time = timestamp
        close = self.stream_time.time - self.windows.grace_ms - gap
        prefix = keyed_prefix(self.key_serde.serialize(record.key) or b"")
        merged: list[tuple[bytes, Window]] = []
        start = end = timestamp
        aggregate = None if self.initializer is None else self.initializer()
        for store_key, result, _ in self._key_windows(prefix, timestamp - gap, _LATEST):
            session = _session(store_key, len(prefix))
            if session.start > timestamp + gap:
                continue
            merged.append((store_key, session))
            aggregate = self.merger(record.key, aggregate, result)
            start, end = min(start, session.start), max(end, session.end)
        if end < close:
            self.dropped_records += 1  # the session it would make has closed: too late
        else:
            if (start, end) != (timestamp, timestamp):
                for store_key, session in merged:
                    self._put(store_key, session.end, None, session.end, record, session)
            if aggregate is None and self.initializer is None:
                aggregate = record.value  # a reduce's first value is its result
            else:
                aggregate = self.aggregator(record.key, record.value, aggregate)
            store_key = prefix + _TIMESTAMP.pack(end) + _TIMESTAMP.pack(start)
            self._put(store_key, end, aggregate, end, record, Window(start, end))
        if self.emit_final:
            self._emit_final(record, close)

    def _emit_final(self, record: Record, close: int) -> None:
        """On window close: the sessions that ended before ``close`` since the last time,
        each with its end as timestamp (Kafka Streams' ``maybeForwardFinalResult``)."""
        emitted = self.emitted_to.time
        if emitted != -1 and emitted >= close:
            return
        upper = close - 1  # a session [start, end] ends before close
        lower = max(0, emitted)
        if upper < 0 or upper < lower:
            return
        for key, suffix, result, _ in self._closed_windows(lower, upper):
            session = _session(suffix, 0)
            self._forward(record._replace(key=self.key_serde.deserialize(key)), session, result,
                          session.end)  # fmt: skip
        self.emitted_to.time = close


def _session(data: bytes, at: int) -> Window:
    """The session whose end and start are at ``at`` in ``data``."""
    end, start = _TIMESTAMP.unpack_from(data, at)[0], _TIMESTAMP.unpack_from(data, at + 8)[0]
    return Window(start, end)
