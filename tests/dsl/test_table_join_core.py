"""The table-table join's per-record path exists twice: ``TableJoinSide.process`` (Python, the
reference, table_join.py) and ``_table_join_core.Core`` (C, built with the package). They must
be indistinguishable: the same output records in order (keys, values, timestamps, as bytes),
the same DLQ records and counters, the same committed stores, across commits and a reopen.
And the C one must be the one that runs where it can (not for a versioned or windowed side),
free its task once closed, and leave no reference behind."""

from __future__ import annotations

import gc
import sys
import weakref
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamplatform import StreamsBuilder
from streamplatform.config import StreamsConfig
from streamplatform.dsl import table_join
from streamplatform.dsl.table_join import TableJoinSide
from streamplatform.records import ConsumedRecord
from streamplatform.runtime.task import Task
from streamplatform.serdes import Serdes

needs_c_core = pytest.mark.skipif(
    table_join._native is None,
    reason="the C core is not built here (test_dedup_core.py's build test says why)",
)


class _CalledSerde:
    """The string serde, but a value "" serializes to b"" (stored as no bytes, read back as
    ""), and b"bad" does not deserialize: a serde error on a read."""

    name = "called-string"

    def serialize(self, value):
        return None if value is None else value.encode()

    def deserialize(self, data):
        if data == b"bad":
            raise ValueError("the serde refuses bad")  # a processing error: to the DLQ
        return None if data is None else data.decode()


_SERDES = {"string": Serdes.string(), "called": _CalledSerde()}


def _joiner(left, right):
    if left == "boom" or right == "boom":
        raise ValueError("the joiner refuses boom")  # a processing error: to the DLQ
    return f"{left}+{right}"


def _topology(kind, key_serde, value_serde, filtered):
    builder = StreamsBuilder()
    left = builder.table("left", _SERDES[key_serde], _SERDES[value_serde])
    right = builder.table("right", _SERDES[key_serde], _SERDES[value_serde])
    if filtered:  # a filter before the join: its side drops updates from no value to none
        left = left.filter(lambda key, value: value != "z")
    join = {"inner": left.join, "left": left.left_join, "outer": left.outer_join}[kind]
    join(right, _joiner, value_serde=Serdes.string()).to_stream().to(
        "out", _SERDES[key_serde], Serdes.string()
    )
    return builder.build()


def _task(directory, topology):
    config = StreamsConfig({
        "application.id": "core", "processing.guarantee": "exactly_once_v2",
        "errors.dead.letter.queue.topic.name": "dlq",
        "processing.exception.handler": "log_and_continue",
    })  # fmt: skip
    return Task(topology, topology.subtopologies[0], 0, config, directory, lambda topic: 1)


def _sides(task):
    sides = [p for p in task.processors.values() if isinstance(p, TableJoinSide)]
    assert len(sides) == 2
    return sides


# Sides; keys: a few, and None (dropped and counted); values: letters, "" (no bytes), None (a
# tombstone), "z" (filtered out when the left side is filtered), "boom" (the joiner raises),
# b"bad" (the called serde cannot read it back); timestamps up and down.
events = st.lists(
    st.tuples(
        st.sampled_from(["left", "right"]),
        st.sampled_from([b"a", b"b", b"c", None]),
        st.sampled_from([b"x", b"y", b"z", b"", b"boom", b"bad", None]),
        st.sampled_from([0, 5, 10, 20, 7, 1 << 40]),
        st.booleans(),
    ),
    max_size=50,
)


def _run(directory, topology, rows, native):
    """``rows`` through a task with the C core on or off; a commit after each row marked so,
    and a reopen after the first of those. Returns everything the two must agree on."""
    seen = []
    with patch.object(table_join, "NATIVE_CORE", native):
        task = _task(directory, topology)
        reopened = False
        try:
            expected = table_join._native.Core if native else type(None)
            assert [type(side._core) for side in _sides(task)] == [expected, expected]
            for offset, (topic, key, value, timestamp, commit) in enumerate(rows):
                task.process(ConsumedRecord(topic, 0, offset, timestamp, key, value, []))
                seen.append([side.dropped_records for side in _sides(task)])
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
@pytest.mark.slow  # the differential property test: make test-all (~40 s)
@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["inner", "left", "outer"]),
    key_serde=st.sampled_from(["string", "called"]),
    value_serde=st.sampled_from(["string", "called"]),
    filtered=st.booleans(),
    rows=events,
)
def test_the_c_core_and_the_python_reference_are_indistinguishable(
    tmp_path_factory, kind, key_serde, value_serde, filtered, rows
):
    """Inner, left and outer joins, from either side; tombstones of keys with and without a
    value; a filtered side; the built-in string serde and a serde of the test's own."""
    topology = _topology(kind, key_serde, value_serde, filtered)
    python = _run(tmp_path_factory.mktemp("python"), topology, rows, native=False)
    native = _run(tmp_path_factory.mktemp("native"), topology, rows, native=True)
    assert native == python


def _some_rows():
    """Updates and tombstones of both sides, keys with and without partners."""
    rows = []
    for offset in range(120):
        topic = "left" if offset % 3 else "right"
        key = f"k{offset % 5}".encode()
        value = None if offset % 7 == 0 else b"v%d" % offset
        rows.append((topic, key, value, 1_000 * offset - 2_500 * (offset % 4 == 0)))
    return rows


@needs_c_core
@pytest.mark.parametrize("kind", ["inner", "left", "outer"])
def test_the_c_core_runs_where_it_was_built(tmp_path, kind):
    """With the core built and not switched off, the task calls the core's process itself
    (no Python frame of the join per record); both give the reference's output."""
    topology = _topology(kind, "string", "string", filtered=False)
    outputs = []
    for native in (True, False):
        with patch.object(table_join, "NATIVE_CORE", native):
            task = _task(tmp_path / str(native), topology)
        try:
            for side in _sides(task):
                if native:
                    assert type(side._core) is table_join._native.Core
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
def test_a_versioned_side_runs_the_python_reference(tmp_path):
    """A versioned side (KIP-914: updates not the key's latest are dropped) stays in Python;
    the other side, not versioned, runs the core."""
    from streamplatform.state import Stores

    builder = StreamsBuilder()
    left = builder.table("left", Serdes.string(), Serdes.string(),
                         Stores.persistent_versioned_key_value_store("left-versions", 60_000))  # fmt: skip
    right = builder.table("right", Serdes.string(), Serdes.string())
    left.join(right, _joiner).to_stream().to("out", Serdes.string(), Serdes.string())
    task = _task(tmp_path, builder.build())
    try:
        left_side, right_side = sorted(_sides(task), key=lambda side: side.side)
        assert left_side.versioned and left_side._core is None
        assert type(right_side._core) is table_join._native.Core
    finally:
        task.close()


@needs_c_core
def test_a_closed_task_with_the_c_core_is_freed(tmp_path):
    """The cores refer to their processors, which refer back to them (their process): only
    the cycle collector can free them, so the core must show it its references."""
    task = _task(tmp_path, _topology("outer", "string", "string", filtered=False))
    for offset, (topic, key, value, timestamp) in enumerate(_some_rows()):
        task.process(ConsumedRecord(topic, 0, offset, timestamp, key, value, []))
    task.commit()
    sides = _sides(task)
    assert all(type(side._core) is table_join._native.Core for side in sides)
    task_ref, side_refs = weakref.ref(task), [weakref.ref(side) for side in sides]
    task.close()
    del task, sides
    gc.collect()
    assert task_ref() is None and all(ref() is None for ref in side_refs)


@pytest.mark.parametrize("core", ["c", "python"])
def test_the_core_leaves_no_reference_behind(tmp_path, core):
    """300 updates whose keys and values are objects held here, joined and deleted; the core
    may hold no reference to any of them afterwards. A core that leaked one reference per
    update, per key or per joined value shows here."""
    if core == "c" and table_join._native is None:
        pytest.skip("the C core is not built here")
    keys = {f"k{n}".encode(): "".join(["key-", str(n)]) for n in range(3)}
    values = {f"v{n}".encode(): "".join(["value-", str(n)]) for n in range(4)}
    held = [*keys.values(), *values.values()]

    class Held:  # the serde giving the held objects themselves
        name = "held"

        def __init__(self, objects):
            self.objects, self.back = objects, {v: k for k, v in objects.items()}

        def serialize(self, value):
            return None if value is None else self.back[value]

        def deserialize(self, data):
            return None if data is None else self.objects[data]

    builder = StreamsBuilder()
    left = builder.table("left", Held(keys), Held(values))
    right = builder.table("right", Held(keys), Held(values))
    left.outer_join(right, lambda one, two: len(one or "") + len(two or ""),
                    value_serde=Serdes.long()).to_stream().to(
        "out", Held(keys), Serdes.long())  # fmt: skip
    topology = builder.build()

    def references() -> list[int]:
        return [sys.getrefcount(obj) for obj in held]

    with patch.object(table_join, "NATIVE_CORE", core == "c"):
        task = _task(tmp_path, topology)
    try:
        before = references()
        for offset in range(300):
            topic = "left" if offset % 2 else "right"
            key = f"k{offset % 3}".encode()
            value = None if offset % 5 == 0 else f"v{offset % 4}".encode()
            task.process(ConsumedRecord(topic, 0, offset, offset, key, value, []))
            task.take_output()
        task.commit()
        task.take_output()
        gc.collect()
        assert references() == before
    finally:
        task.close()


@needs_c_core
@pytest.mark.parametrize("kind", ["left", "outer"])
def test_a_filtered_out_update_of_a_key_without_a_value_forwards_nothing(tmp_path, kind):
    """Kafka Streams' filter sends no update from no value to no value once a left or outer
    join asks for old values. Here b has a right value and its left update is filtered out:
    nothing goes on for it, in C as in Python; a's, which had a left value, goes on as a
    tombstone (left) or right-only (outer)."""
    topology = _topology(kind, "string", "string", filtered=True)
    rows = [("right", b"b", b"x", 1, False), ("left", b"b", b"z", 2, False),
            ("left", b"a", b"y", 3, False), ("right", b"a", b"w", 4, False),
            ("left", b"a", b"z", 5, False)]  # fmt: skip
    python = _run(tmp_path / "python", topology, rows, native=False)
    native = _run(tmp_path / "native", topology, rows, native=True)
    assert native == python
    outputs = [(key, value, timestamp) for _, key, value, timestamp in python[-2]]
    last_a = None if kind == "left" else b"None+w"
    expected_b = [(b"b", b"None+x", 1)] if kind == "outer" else []
    assert outputs == [*expected_b, (b"a", b"y+None", 3), (b"a", b"y+w", 4), (b"a", last_a, 5)]
