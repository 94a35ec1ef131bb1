"""The time-windowed aggregation's per-record path exists twice: ``WindowedAggregate.process``
and ``_close_windows`` (Python, the reference, window_aggregate.py) and ``_window_core.Core``
(C, built with the package). They must be indistinguishable: the same output records in
order (keys, windows, values, timestamps, as bytes), the same DLQ records and counters, the
same record cache (its entries, their order, its byte count), the same committed store,
across commits, evictions and a reopen. And the C one must be the one that runs where it was
built, free its task once closed, and leave no reference behind."""

from __future__ import annotations

import gc
import sys
import weakref
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform import EmitStrategy, StreamsBuilder, TimeWindows
from streamplatform.dsl import window_aggregate
from streamplatform.records import ConsumedRecord
from streamplatform.serdes import Serdes
from tests.dsl.cores import core_task, only_processor

MINUTE = 60_000
needs_c_core = pytest.mark.skipif(
    window_aggregate._native is None,
    reason="the C core is not built here (test_dedup_core.py's build test says why)",
)


def _concatenated(key, value, aggregate):
    if value == "boom":
        raise ValueError("the aggregator refuses boom")  # a processing error: to the DLQ
    return aggregate + value


def _topology(kind, windows, final, string_keys):
    builder = StreamsBuilder()
    key_serde = Serdes.string() if string_keys else Serdes.bytes()
    grouped = builder.stream("in", key_serde, Serdes.string()).group_by_key()
    windowed = grouped.windowed_by(windows)
    if final:
        windowed = windowed.emit_strategy(EmitStrategy.on_window_close())
    if kind == "count":
        table = windowed.count()
    elif kind == "reduce":
        table = windowed.reduce(lambda one, two: _concatenated(None, two, one))
    else:
        table = windowed.aggregate(lambda: "", _concatenated, Serdes.string())
    table.to_stream().to("out")
    return builder.build()


def _cache_state(processor):
    cache = processor.cache
    entries = [(key, entry[0], entry[1], entry[3], entry[4], entry[2] is not None)
               for key, entry in cache.entries.items()]  # fmt: skip
    return entries, cache.bytes, processor.dropped_records, processor.next_end


# Keys: a few, and None (dropped and counted). Values: mostly letters, now and then "boom"
# (the aggregator raises: a processing error). Timestamps: out of order by up to a few
# windows, so that records are late, windows close mid-batch, and hopping windows overlap.
events = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"b", b"c", None]),
        st.sampled_from(["x", "y", "boom"]),
        st.integers(0, 12 * MINUTE),
        st.booleans(),
    ),
    max_size=60,
)


def _run(directory, topology, cache_bytes, rows, native):
    """``rows`` through a task with the C core on or off; a commit after each row marked so,
    and a reopen after the first of those. Returns everything the two must agree on."""
    seen = []
    with patch.object(window_aggregate, "NATIVE_CORE", native):
        task = core_task(directory, topology, cache_bytes)
        reopened = False
        try:
            expected = window_aggregate._native.Core if native else type(None)
            assert type(only_processor(task)._core) is expected
            for offset, (key, value, timestamp, commit) in enumerate(rows):
                task.process(ConsumedRecord("in", 0, offset, timestamp, key,
                                            value.encode(), []))  # fmt: skip
                seen.append(_cache_state(only_processor(task)))
                if commit:
                    seen.append(("commit", task.commit(), task.metrics()))
                    if not reopened:
                        task.close()
                        task, reopened = core_task(directory, topology, cache_bytes), True
            seen.append(("end", task.commit(), task.metrics()))
            seen.append([(r.topic, r.key, r.value, r.timestamp) for r in task.take_output()])
            (store,) = task.stores.values()
            seen.append(list(store.prefix(b"")))
            return seen
        finally:
            task.close()


@needs_c_core
@settings(max_examples=examples(120), deadline=None)
@given(
    kind=st.sampled_from(["count", "reduce", "aggregate"]),
    size=st.sampled_from([MINUTE, 3 * MINUTE]),
    hops=st.sampled_from([1, 3]),
    grace=st.sampled_from([0, MINUTE, 2 * MINUTE]),
    final=st.booleans(),
    string_keys=st.booleans(),
    cache_bytes=st.sampled_from([0, 1_800, 10_000_000]),
    rows=events,
)
def test_the_c_core_and_the_python_reference_are_indistinguishable(
    tmp_path_factory, kind, size, hops, grace, final, string_keys, cache_bytes, rows
):
    """Tumbling and hopping windows; count, reduce, aggregate; on update and on window close;
    string keys (C's own UTF-8) and bytes keys (the serde's); the record cache off, a few
    entries (evictions at most records) and ample."""
    windows = TimeWindows.of_size_and_grace(size, grace).advance_by(size // hops)
    topology = _topology(kind, windows, final, string_keys)
    python = _run(tmp_path_factory.mktemp("python"), topology, cache_bytes, rows, native=False)
    native = _run(tmp_path_factory.mktemp("native"), topology, cache_bytes, rows, native=True)
    assert native == python


@needs_c_core
def test_the_c_core_gives_the_windowed_keys_the_reference_gives(tmp_path):
    """The closed windows' keys, which C builds without calling their dataclasses' __init__,
    are equal to, hash as, and print as those Python builds."""
    out: dict[bool, list] = {False: [], True: []}
    for native in (False, True):
        builder = StreamsBuilder()
        (builder.stream("in", Serdes.string(), Serdes.string()).group_by_key()
         .windowed_by(TimeWindows.of_size_with_no_grace(MINUTE))
         .emit_strategy(EmitStrategy.on_window_close()).count()
         .to_stream().peek(lambda key, value, seen=out[native]: seen.append((key, value))))  # fmt: skip
        with patch.object(window_aggregate, "NATIVE_CORE", native):
            task = core_task(tmp_path / str(native), builder.build(), 10_000_000)
        try:
            for offset, timestamp in enumerate([0, 10, 70_000, 130_000]):
                task.process(ConsumedRecord("in", 0, offset, timestamp, "ké".encode(), b"x", []))
        finally:
            task.close()
    assert out[True] == out[False] == [(out[True][0][0], 2), (out[True][1][0], 1)]
    assert [hash(key) for key, _ in out[True]] == [hash(key) for key, _ in out[False]]
    assert [str(key) for key, _ in out[True]] == ["[ké@0/60000]", "[ké@60000/120000]"]


@needs_c_core
@pytest.mark.parametrize(
    ("kind", "string_keys", "direct"),
    [("count", True, True), ("count", False, True), ("reduce", True, False),
     ("aggregate", False, False)],
)  # fmt: skip
def test_closed_counts_are_written_by_the_core_where_the_sink_allows(
    tmp_path, kind, string_keys, direct
):
    """A count into a sink with the windowed key serde and the long serde is written by the
    core itself (the indistinguishability test above holds its bytes to the sink's); other
    results are forwarded to the sink."""
    windows = TimeWindows.of_size_with_no_grace(MINUTE)
    task = core_task(tmp_path, _topology(kind, windows, True, string_keys), 10_000_000)
    try:
        processor = only_processor(task)
        assert (processor._direct_sink(processor.context) is not None) is direct
    finally:
        task.close()


@needs_c_core
def test_a_closed_task_with_the_c_core_is_freed(tmp_path):
    """The core refers to the aggregation, its cache and the task, which refer back to it:
    only the cycle collector can free them, so the core must show it its references."""
    topology = _topology("count", TimeWindows.of_size_with_no_grace(MINUTE), True, True)
    task = core_task(tmp_path, topology, 10_000_000)
    for offset in range(100):
        task.process(ConsumedRecord("in", 0, offset, 1_000 * offset, b"k", b"x", []))
    task.commit()
    processor = only_processor(task)
    assert type(processor._core) is window_aggregate._native.Core
    task_ref, processor_ref = weakref.ref(task), weakref.ref(processor)
    task.close()
    del task, processor
    gc.collect()
    assert task_ref() is None and processor_ref() is None


@pytest.mark.parametrize("core", ["c", "python"])
@pytest.mark.parametrize("kind", ["count", "aggregate"])
def test_the_core_leaves_no_reference_behind(tmp_path, core, kind, held_serde):
    """300 records whose keys and values are objects held here; once every window closed and
    was committed, the core may hold no reference to any of them. A core that leaked one
    reference per record or per window shows here."""
    if core == "c" and window_aggregate._native is None:
        pytest.skip("the C core is not built here")
    keys = {f"k{n}".encode(): "".join(["key-", str(n)]) for n in range(3)}
    values = {f"v{n}".encode(): "".join(["value-", str(n)]) for n in range(4)}
    held = [*keys.values(), *values.values()]
    builder = StreamsBuilder()
    windowed = (builder.stream("in", held_serde(keys), held_serde(values)).group_by_key()
                .windowed_by(TimeWindows.of_size_and_grace(MINUTE, 10_000).advance_by(30_000))
                .emit_strategy(EmitStrategy.on_window_close()))  # fmt: skip
    table = (
        windowed.count()
        if kind == "count"
        else windowed.aggregate(lambda: 0, lambda k, v, agg: agg + len(v), Serdes.long())
    )
    table.to_stream().to("out")
    topology = builder.build()

    def references() -> list[int]:
        return [sys.getrefcount(obj) for obj in held]

    counts = references()
    with patch.object(window_aggregate, "NATIVE_CORE", core == "c"):
        task = core_task(tmp_path, topology, 10_000_000)
    try:
        for offset in range(300):
            key, value = f"k{offset % 3}".encode(), f"v{offset % 4}".encode()
            task.process(ConsumedRecord("in", 0, offset, 1_000 * offset, key, value, []))
            if offset == 150:
                task.commit()
        task.process(ConsumedRecord("in", 0, 300, 100 * MINUTE, b"k0", b"v0", []))
        task.commit()  # every earlier window closed
        task.take_output()
        task.process(ConsumedRecord("in", 0, 301, 200 * MINUTE, b"k1", b"v1", []))
        task.commit()
        task.take_output()
        left = [now - count for now, count in zip(references(), counts, strict=True)]
        assert all(n <= 0 for n in left), f"references left behind, per object: {left}"
    finally:
        task.close()
