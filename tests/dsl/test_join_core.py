"""The stream-stream join's per-record path exists twice: ``StreamStreamJoinSide.process``
(Python, the reference, stream_join.py) and ``_join_core.Core`` (C, built with the package).
They must be indistinguishable: the same output records in order (keys, values, timestamps, as
bytes), the same DLQ records and counters, the same join state after every record (stream
times, expiry hints, the outer records' hint), the same committed stores, across commits and a
reopen. And the C one must be the one that runs where it was built, free its task once closed,
and leave no reference behind."""

from __future__ import annotations

import gc
import sys
import weakref
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamplatform import JoinWindows, StreamsBuilder
from streamplatform.config import StreamsConfig
from streamplatform.dsl import stream_join
from streamplatform.dsl.stream_join import StreamStreamJoinSide
from streamplatform.records import ConsumedRecord
from streamplatform.runtime.task import Task
from streamplatform.serdes import Serdes

MINUTE = 60_000
needs_c_core = pytest.mark.skipif(
    stream_join._native is None,
    reason="the C core is not built here (test_dedup_core.py's build test says why)",
)


class _CalledSerde:
    """The string serde, but not the built-in one: the core calls it instead of doing its
    work in C."""

    name = "called-string"

    def serialize(self, value):
        return Serdes.string().serialize(value)

    def deserialize(self, data):
        return Serdes.string().deserialize(data)


_SERDES = {"string": Serdes.string(), "bytes": Serdes.bytes(), "called": _CalledSerde()}


def _joiner(key, left, right):
    if left == "boom" or right == "boom":
        raise ValueError("the joiner refuses boom")  # a processing error: to the DLQ
    return f"{key!r}:{left}+{right}"


def _topology(kind, windows, key_serde, left_serde, right_serde):
    builder = StreamsBuilder()
    left = builder.stream("left", _SERDES[key_serde], _SERDES[left_serde])
    right = builder.stream("right", _SERDES[key_serde], _SERDES[right_serde])
    join = {"inner": left.join, "left": left.left_join, "outer": left.outer_join}[kind]
    join(right, _joiner, windows).to("out", _SERDES[key_serde], Serdes.string())
    return builder.build()


def _task(directory, topology):
    config = StreamsConfig({
        "application.id": "core", "processing.guarantee": "exactly_once_v2",
        "errors.dead.letter.queue.topic.name": "dlq",
        "processing.exception.handler": "log_and_continue",
    })  # fmt: skip
    return Task(topology, topology.subtopologies[0], 0, config, directory, lambda topic: 1)


def _sides(task):
    sides = [p for p in task.processors.values() if isinstance(p, StreamStreamJoinSide)]
    assert len(sides) == 2
    return sides


def _join_state(task):
    """What the two sides keep between records, besides their stores."""
    left, right = _sides(task)
    state = left.state
    seen = [left.dropped_records, right.dropped_records]
    for side in (state.left, state.right):
        seen += [side.observed.time, side.observed.saved, side.dropped_below, side.next_drop_at]
    if state.outer is not None:
        seen += [state.outer.stream_time.time, state.outer.min_time]
    return seen


# Sides; keys: a few, and None (dropped, or alone at once for an outer side); values: mostly
# letters, None (dropped), now and then "boom" (the joiner raises: a processing error).
# Timestamps: a stream time that moves on in steps (mostly on a grid of 10 s, the windows
# being multiples of 30 s, so that records fall exactly on the bounds of windows, of their
# closing and of the retention), and records behind it by up to several windows and
# retentions: late, expired, joined with several records of a key, waiting for partners,
# and in order often enough to emit the waiting records whose windows closed.
events = st.lists(
    st.tuples(
        st.sampled_from(["left", "right"]),
        st.sampled_from([b"a", b"b", b"c", None]),
        st.sampled_from([b"x", b"y", b"z", b"boom", None]),
        st.sampled_from([0, 10_000, 20_000, 30_000, 60_000, 7_001]),  # the step
        st.sampled_from([0, 0, 0, 10_000, 30_000, 60_000, 150_000, 400_000]),  # behind by
        st.booleans(),
    ),
    max_size=60,
)


# (before, after): symmetric, one-sided, asymmetric, and negative on one side.
_BEFORE_AFTER = [(MINUTE, MINUTE), (0, 2 * MINUTE), (3 * MINUTE, 30_000),
                 (-30_000, 2 * MINUTE), (2 * MINUTE, -MINUTE)]  # fmt: skip


def _timed(events_drawn):
    """The events with their timestamps: (topic, key, value, timestamp, commit)."""
    rows, now = [], 0
    for topic, key, value, step, behind, commit in events_drawn:
        now += step
        rows.append((topic, key, value, max(0, now - behind), commit))
    return rows


def _run(directory, topology, rows, native):
    """``rows`` through a task with the C core on or off; a commit after each row marked so,
    and a reopen after the first of those. Returns everything the two must agree on."""
    seen = []
    with patch.object(stream_join, "NATIVE_CORE", native):
        task = _task(directory, topology)
        reopened = False
        try:
            expected = stream_join._native.Core if native else type(None)
            assert [type(side._core) for side in _sides(task)] == [expected, expected]
            for offset, (topic, key, value, timestamp, commit) in enumerate(rows):
                task.process(ConsumedRecord(topic, 0, offset, timestamp, key, value, []))
                seen.append(_join_state(task))
                if commit:
                    seen.append(("commit", task.commit(), task.metrics()))
                    if not reopened:
                        task.close()
                        task, reopened = _task(directory, topology), True
            seen.append(("end", task.commit(), task.metrics()))
            seen.append([(r.topic, r.key, r.value, r.timestamp) for r in task.take_output()])
            seen.append({name: list(store.prefix(b"")) for name, store in task.stores.items()})
            return seen
        finally:
            task.close()


@needs_c_core
@pytest.mark.slow  # the differential property test: make test-all (~15 s)
@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["inner", "left", "outer"]),
    before_after=st.sampled_from(_BEFORE_AFTER),
    grace=st.sampled_from([0, 30_000, 2 * MINUTE]),
    key_serde=st.sampled_from(["string", "bytes", "called"]),
    left_serde=st.sampled_from(["string", "called"]),
    right_serde=st.sampled_from(["string", "called"]),
    rows=events,
)
def test_the_c_core_and_the_python_reference_are_indistinguishable(
    tmp_path_factory, kind, before_after, grace, key_serde, left_serde, right_serde, rows
):
    """Inner, left and outer joins; symmetric, asymmetric and one-sided negative windows;
    grace or none; the built-in string and bytes serdes (done in C) and a serde the core
    calls."""
    before, after = before_after
    windows = JoinWindows(before, after, grace)
    topology = _topology(kind, windows, key_serde, left_serde, right_serde)
    rows = _timed(rows)
    python = _run(tmp_path_factory.mktemp("python"), topology, rows, native=False)
    native = _run(tmp_path_factory.mktemp("native"), topology, rows, native=True)
    assert native == python


def _some_rows():
    """Records of both sides that join, wait, close and expire (as the property test's)."""
    rows = []
    for offset in range(200):
        topic = "left" if offset % 3 else "right"
        key = f"k{offset % 4}".encode()
        rows.append((topic, key, b"v%d" % offset, 10_000 * offset - 25_000 * (offset % 5 == 0)))
    return rows


@needs_c_core
@pytest.mark.parametrize("kind", ["inner", "left", "outer"])
def test_the_c_core_runs_where_it_was_built(tmp_path, kind):
    """With the core built and not switched off, the task calls the core's process itself
    (no Python frame of the join per record), and a delivery function taken before init
    reaches it too; both give the reference's output."""
    windows = JoinWindows.of_time_difference_and_grace(MINUTE, 10_000)
    topology = _topology(kind, windows, "string", "string", "string")
    outputs = []
    for native in (True, False):
        with patch.object(stream_join, "NATIVE_CORE", native):
            task = _task(tmp_path / str(native), topology)
        try:
            for side in _sides(task):
                if native:
                    assert type(side._core) is stream_join._native.Core
                    assert side.process == side._core.process  # what the task takes
                else:
                    assert side._core is None
            for offset, (topic, key, value, timestamp) in enumerate(_some_rows()):
                task.process(ConsumedRecord(topic, 0, offset, timestamp, key, value, []))
            task.commit()
            outputs.append([(r.key, r.value, r.timestamp) for r in task.take_output()])
        finally:
            task.close()
    assert outputs[0] == outputs[1] and outputs[0]


@needs_c_core
def test_a_closed_task_with_the_c_core_is_freed(tmp_path):
    """The cores refer to their processors and the join's state and stores, which refer back
    to them: only the cycle collector can free them, so the core must show it its
    references."""
    windows = JoinWindows.of_time_difference_and_grace(MINUTE, 10_000)
    task = _task(tmp_path, _topology("outer", windows, "string", "string", "string"))
    for offset, (topic, key, value, timestamp) in enumerate(_some_rows()):
        task.process(ConsumedRecord(topic, 0, offset, timestamp, key, value, []))
    task.commit()
    sides = _sides(task)
    assert all(type(side._core) is stream_join._native.Core for side in sides)
    task_ref, side_refs = weakref.ref(task), [weakref.ref(side) for side in sides]
    task.close()
    del task, sides
    gc.collect()
    assert task_ref() is None and all(ref() is None for ref in side_refs)


@pytest.mark.parametrize("core", ["c", "python"])
@pytest.mark.parametrize("kind", ["inner", "outer"])
def test_the_core_leaves_no_reference_behind(tmp_path, core, kind, held_serde):
    """300 records whose keys and values are objects held here, joined, waiting, emitted
    alone and expired; once every window closed and was committed, the core may hold no
    reference to any of them. A core that leaked one reference per record, per partner or
    per waiting record shows here."""
    if core == "c" and stream_join._native is None:
        pytest.skip("the C core is not built here")
    keys = {f"k{n}".encode(): "".join(["key-", str(n)]) for n in range(3)}
    values = {f"v{n}".encode(): "".join(["value-", str(n)]) for n in range(4)}
    held = [*keys.values(), *values.values()]
    builder = StreamsBuilder()
    left = builder.stream("left", held_serde(keys), held_serde(values))
    right = builder.stream("right", held_serde(keys), held_serde(values))
    join = left.join if kind == "inner" else left.outer_join
    join(right, lambda one, two: len(one or "") + len(two or ""),
         JoinWindows.of_time_difference_and_grace(5_000, 1_000)).to(
        "out", held_serde(keys), Serdes.long())  # fmt: skip
    topology = builder.build()

    def references() -> list[int]:
        return [sys.getrefcount(obj) for obj in held]

    counts = references()
    with patch.object(stream_join, "NATIVE_CORE", core == "c"):
        task = _task(tmp_path, topology)
    try:
        for offset in range(300):
            topic = "left" if offset % 3 else "right"
            key, value = f"k{offset % 3}".encode(), f"v{offset % 4}".encode()
            timestamp = 1_000 * offset - 3_000 * (offset % 7 == 0)  # some out of order
            task.process(ConsumedRecord(topic, 0, offset, timestamp, key, value, []))
            if offset == 150:
                task.commit()
        for offset, topic in ((300, "left"), (301, "right")):  # every window closes
            task.process(ConsumedRecord(topic, 0, offset, 100 * MINUTE, b"k0", b"v0", []))
        task.commit()
        task.take_output()
        left_refs = [now - count for now, count in zip(references(), counts, strict=True)]
        assert all(n <= 0 for n in left_refs), f"references left behind, per object: {left_refs}"
    finally:
        task.close()
