"""The sliding-window aggregation's per-record path exists twice:
``SlidingWindowAggregate.process`` (Python, the reference, sliding_aggregate.py) and
``_sliding_core.Core`` (C, built with the package). They must be indistinguishable: the same
output records in order (keys, windows, values, timestamps, as bytes), the same DLQ records
and counters, the same record cache (its entries, their order, its index of a key's windows,
its byte count), the same kept times and the same committed store, across commits, evictions,
expiry and a reopen. And the C one must be the one that runs where it was built, free its task
once closed, and leave no reference behind."""

from __future__ import annotations

import gc
import os
import sys
import weakref
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamplatform import EmitStrategy, StreamsBuilder
from streamplatform.dsl import SlidingWindows, sliding_aggregate
from streamplatform.records import ConsumedRecord
from streamplatform.serdes import Serdes
from tests.dsl.cores import DIRECT_SINK_CASES, core_task, final_counts_written, only_processor

NO_C_CORE = os.environ.get("STREAMPLATFORM_NO_C_CORE", "").strip().lower() in {"1", "true", "yes"}
needs_c_core = pytest.mark.skipif(
    sliding_aggregate._native is None,
    reason="the C core is not built here (test_the_c_core_is_built_unless_opted_out says why)",
)


def test_the_c_core_is_built_unless_opted_out():
    """setup.py fails an install whose C build fails, unless STREAMPLATFORM_NO_C_CORE=1: a
    build that was never run must not pass here as the slow path."""
    if NO_C_CORE:
        pytest.skip("STREAMPLATFORM_NO_C_CORE=1: the pure-Python core runs, as asked")
    assert sliding_aggregate._native is not None, (
        "The C sliding-window core (streamplatform.dsl._sliding_core, from "
        "platform/streamplatform/dsl/_sliding_core.c) is not built: rebuild it with `make "
        "setup` or `.venv/bin/python setup.py build_ext --inplace`"
    )


@needs_c_core
def test_the_c_core_in_the_source_tree_is_not_older_than_its_source():
    """An editable install imports the core built next to its source: a change to the source
    is not run until it is built again."""
    built = Path(sliding_aggregate._native.__file__)
    source = built.parent / "_sliding_core.c"
    if not source.exists():
        pytest.skip("the core was installed from a wheel: no source next to it")
    assert built.stat().st_mtime >= source.stat().st_mtime, (
        f"{built.name} is older than {source.name}: rebuild it (`.venv/bin/python setup.py "
        "build_ext --inplace`)"
    )


def _concatenated(key, value, aggregate):
    if value == "boom":
        raise ValueError("the aggregator refuses boom")  # a processing error: to the DLQ
    if value == "drop":
        return None  # a None result deletes the window
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


def _state(processor):
    cache = processor.cache
    entries = [(key, entry[0], entry[1], entry[3], entry[4], entry[2] is not None)
               for key, entry in cache.entries.items()]  # fmt: skip
    index = sorted((prefix, sorted(keys)) for prefix, keys in cache.by_prefix.items())
    times = (processor.stream_time.time, processor.store_time.time, processor.emitted_to.time)
    return entries, index, cache.bytes, processor.dropped_records, times


# Keys: a few, and None (dropped and counted). Values: mostly letters, now and then "boom"
# (the aggregator raises: a processing error), "drop" (its result is None: the window is
# deleted) or None (dropped and counted). Timestamps: a
# small range, so that records fall at the very edges of one another's windows (a window
# ending at a record, a right window starting just after one), come out of order, early
# (before the time difference) and late (their windows closed).
events = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"b", b"c", None]),
        st.sampled_from(["x", "y", "boom", "drop", None]),
        st.integers(0, 12) | st.integers(0, 40),  # often before the time difference
        st.booleans(),
    ),
    max_size=60,
)


def _run(directory, topology, cache_bytes, rows, native):
    """``rows`` through a task with the C core on or off; a commit after each row marked so,
    and a reopen after the first of those. Returns everything the two must agree on."""
    seen = []
    with patch.object(sliding_aggregate, "NATIVE_CORE", native):
        task = core_task(directory, topology, cache_bytes)
        reopened = False
        try:
            expected = sliding_aggregate._native.Core if native else type(None)
            assert type(only_processor(task)._core) is expected
            for offset, (key, value, timestamp, commit) in enumerate(rows):
                raw = None if value is None else value.encode()
                task.process(ConsumedRecord("in", 0, offset, timestamp, key, raw, []))
                seen.append(_state(only_processor(task)))
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
@pytest.mark.slow  # the differential property test: make test-all (~15 s)
@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["count", "reduce", "aggregate"]),
    difference=st.sampled_from([0, 2, 5, 10]),
    grace=st.sampled_from([0, 3, 20]),
    final=st.booleans(),
    string_keys=st.booleans(),
    cache_bytes=st.sampled_from([0, 1_800, 10_000_000]),
    rows=events,
)
# Write-back past the budget: three keys' windows outgrow 1,800 bytes, so that the kept
# windows, dirty ones among them, leave memory between commits (and for good at last).
@example(kind="count", difference=10, grace=20, final=True, string_keys=True, cache_bytes=1_800,
         rows=[(key, "x", time, time == 30) for time in range(0, 40, 3) for key in (b"a", b"b", b"c")])  # fmt: skip
def test_the_c_core_and_the_python_reference_are_indistinguishable(
    tmp_path_factory, kind, difference, grace, final, string_keys, cache_bytes, rows
):
    """count, reduce, aggregate; on update and on window close; string keys (C's own UTF-8)
    and bytes keys (the serde's); the record cache off, a few entries (evictions at most
    records) and ample; a time difference of 0 too."""
    windows = SlidingWindows.of_time_difference_and_grace(difference, grace)
    topology = _topology(kind, windows, final, string_keys)
    python = _run(tmp_path_factory.mktemp("python"), topology, cache_bytes, rows, native=False)
    native = _run(tmp_path_factory.mktemp("native"), topology, cache_bytes, rows, native=True)
    assert native == python


# One key (and None), its records dense in time: every way a record can fall against the
# windows of the ones before it (at the end of one, just past its right window, inside two)
# comes up within a few examples.
dense_events = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"a", b"a", None]),
        st.sampled_from(["x", "x", "boom", "drop", None]),
        st.integers(0, 16),
        st.booleans(),
    ),
    max_size=30,
)


def _one_key(*times: int) -> list[tuple[bytes, str, int, bool]]:
    return [(b"a", "x", time, False) for time in times]


@needs_c_core
@pytest.mark.slow  # the differential property test: make test-all (~15 s)
@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["count", "aggregate"]),
    difference=st.sampled_from([1, 2, 3, 5]),
    grace=st.sampled_from([0, 2]),
    final=st.booleans(),
    cache_bytes=st.sampled_from([0, 10_000_000]),
    rows=dense_events,
)
# Cases random inputs rarely make. The previous record's right window is the record's left
# window: both made, the update forwarded twice, as Kafka Streams forwards it.
@example(kind="count", difference=2, grace=0, final=False, cache_bytes=0,
         rows=_one_key(5, 7, 10))  # fmt: skip
# An early record before a later early one: its right window copies [0, d].
@example(kind="aggregate", difference=5, grace=0, final=False, cache_bytes=0,
         rows=_one_key(4, 2, 1, 3))  # fmt: skip
# A record whose left window and the previous one's right window exist: nothing is made.
@example(kind="count", difference=3, grace=2, final=True, cache_bytes=0,
         rows=_one_key(3, 5, 7, 6, 6, 12, 20))  # fmt: skip
# On window close with a count's results the core keeps a key's updates in memory until the
# commit (write-back): final results emitted from there, before any commit; windows created
# and expired within a commit, and others still open at it; past a commit, after its expiry.
@example(kind="count", difference=3, grace=0, final=True, cache_bytes=10_000_000,
         rows=_one_key(3, 5, 7, 12, 20))  # fmt: skip
@example(kind="count", difference=3, grace=2, final=True, cache_bytes=10_000_000,
         rows=[*_one_key(3, 5, 7), (b"a", "x", 12, True), *_one_key(13, 14, 30, 31)])  # fmt: skip
def test_the_c_core_and_the_python_reference_agree_on_one_dense_key(
    tmp_path_factory, kind, difference, grace, final, cache_bytes, rows
):
    windows = SlidingWindows.of_time_difference_and_grace(difference, grace)
    topology = _topology(kind, windows, final, True)
    python = _run(tmp_path_factory.mktemp("python"), topology, cache_bytes, rows, native=False)
    native = _run(tmp_path_factory.mktemp("native"), topology, cache_bytes, rows, native=True)
    assert native == python


@needs_c_core
@pytest.mark.parametrize("final", [False, True])
def test_the_c_core_gives_the_windowed_keys_the_reference_gives(tmp_path, final):
    """The windows' keys, whose Window and Windowed C builds without calling their
    dataclasses' __init__, are equal to, hash as, and print as those Python builds."""
    out: dict[bool, list] = {False: [], True: []}
    for native in (False, True):
        builder = StreamsBuilder()
        windowed = (builder.stream("in", Serdes.string(), Serdes.string()).group_by_key()
                    .windowed_by(SlidingWindows.of_time_difference_with_no_grace(10)))  # fmt: skip
        if final:
            windowed = windowed.emit_strategy(EmitStrategy.on_window_close())
        windowed.count().to_stream().peek(
            lambda key, value, seen=out[native]: seen.append((key, value))
        )
        with patch.object(sliding_aggregate, "NATIVE_CORE", native):
            task = core_task(tmp_path / str(native), builder.build(), 0)
        try:
            for offset, timestamp in enumerate([3, 12, 15, 40, 70]):
                task.process(ConsumedRecord("in", 0, offset, timestamp, "ké".encode(), b"x", []))
        finally:
            task.close()
    assert out[True] == out[False] and out[True]
    assert [hash(key) for key, _ in out[True]] == [hash(key) for key, _ in out[False]]
    assert [str(key) for key, _ in out[True]] == [str(key) for key, _ in out[False]]
    assert str(out[True][0][0]) == "[ké@0/10]"


@needs_c_core
@pytest.mark.parametrize(("kind", "final", "string_keys", "direct"), DIRECT_SINK_CASES)
def test_closed_counts_are_written_by_the_core_where_the_sink_allows(
    tmp_path, kind, final, string_keys, direct
):
    """Final counts into a sink with the windowed key serde and the long serde are written by
    the core itself, as the sink would write them; other results are forwarded to the sink.
    The differential tests above hold the bytes written so to the reference's."""
    topology = _topology(
        kind, SlidingWindows.of_time_difference_with_no_grace(10), final, string_keys
    )
    written_directly, written = final_counts_written(tmp_path, topology, [3, 12, 15, 40])
    assert written_directly is direct
    if direct:  # the second window closed, [2, 12], holds the records at 3 and 12
        assert written[1] == (b"k" + (2).to_bytes(8, "big"), (2).to_bytes(8, "big"), 12)


@needs_c_core
def test_a_closed_task_with_the_c_core_is_freed(tmp_path):
    """The core refers to the aggregation, its cache and the task, which refer back to it:
    only the cycle collector can free them, so the core must show it its references."""
    windows = SlidingWindows.of_time_difference_with_no_grace(5_000)
    task = core_task(tmp_path, _topology("count", windows, False, True), 10_000_000)
    for offset in range(100):
        task.process(ConsumedRecord("in", 0, offset, 1_000 * offset, b"k", b"x", []))
    task.commit()
    processor = only_processor(task)
    assert type(processor._core) is sliding_aggregate._native.Core
    task_ref, processor_ref = weakref.ref(task), weakref.ref(processor)
    task.close()
    del task, processor
    gc.collect()
    assert task_ref() is None and processor_ref() is None


@pytest.mark.parametrize("core", ["c", "python"])
@pytest.mark.parametrize("kind", ["count", "aggregate"])
@pytest.mark.parametrize("final", [False, True])
def test_the_core_leaves_no_reference_behind(tmp_path, core, kind, final, held_serde):
    """300 records whose keys and values are objects held here; once every window expired
    and was committed, the core may hold no reference to any of them. A core that leaked one
    reference per record or per window shows here."""
    if core == "c" and sliding_aggregate._native is None:
        pytest.skip("the C core is not built here")
    keys = {f"k{n}".encode(): "".join(["key-", str(n)]) for n in range(3)}
    values = {f"v{n}".encode(): "".join(["value-", str(n)]) for n in range(4)}
    held = [*keys.values(), *values.values()]
    builder = StreamsBuilder()
    windowed = (builder.stream("in", held_serde(keys), held_serde(values)).group_by_key()
                .windowed_by(SlidingWindows.of_time_difference_and_grace(5_000, 2_000)))  # fmt: skip
    if final:
        windowed = windowed.emit_strategy(EmitStrategy.on_window_close())
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
    with patch.object(sliding_aggregate, "NATIVE_CORE", core == "c"):
        task = core_task(tmp_path, topology, 10_000_000)
    try:
        assert (only_processor(task)._core is not None) is (core == "c")
        for offset in range(300):
            key, value = f"k{offset % 3}".encode(), f"v{offset % 4}".encode()
            task.process(ConsumedRecord("in", 0, offset, 1_000 * offset, key, value, []))
            if offset == 150:
                task.commit()
        task.process(ConsumedRecord("in", 0, 300, 1_000_000, b"k0", b"v0", []))
        task.commit()  # every earlier window expired
        task.take_output()
        task.process(ConsumedRecord("in", 0, 301, 2_000_000, b"k1", b"v1", []))
        task.commit()
        task.take_output()
        left = [now - count for now, count in zip(references(), counts, strict=True)]
        assert all(n <= 0 for n in left), f"references left behind, per object: {left}"
    finally:
        task.close()
