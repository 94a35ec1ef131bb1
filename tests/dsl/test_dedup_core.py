"""The dedup's per-record path exists twice: ``dedup._DedupCore`` (Python, the reference) and
``_dedup_core.Core`` (C, built with the package, run for buffered writes in the runtime's
tasks). They must be indistinguishable: the same outputs and DLQ records in order, the same
counters, the same writes waiting for the commit (the uncommitted limits read them), the same
committed store, across commits and a reopen. And the C one must really be the one that runs
where it was built, hold no task alive after it closed, and be built wherever a compiler is."""

from __future__ import annotations

import gc
import json
import shutil
import sys
import weakref
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamplatform import StreamsBuilder
from streamplatform.config import StreamsConfig
from streamplatform.dsl import dedup
from streamplatform.records import ConsumedRecord
from streamplatform.runtime.task import Task
from streamplatform.serdes import Serdes
from streamplatform.state import IsolationLevel

MINUTE = 60_000
needs_c_core = pytest.mark.skipif(
    dedup._native is None, reason="the C core was not built here (no C compiler at install)"
)


def _id_of(key, value):
    return value["id"]  # KeyError for a value without an id: a processing error


def _topology(interval):
    builder = StreamsBuilder()
    stream = builder.stream("in", Serdes.string(), Serdes.json())
    stream.deduplicate_by_key_value(_id_of, interval).to("out")
    return builder.build()


def _task(state_dir, interval):
    topology = _topology(interval)
    config = StreamsConfig({
        "application.id": "core", "processing.guarantee": "exactly_once_v2",
        "errors.dead.letter.queue.topic.name": "dlq",
        "processing.exception.handler": "log_and_continue",
    })  # fmt: skip
    return Task(topology, topology.subtopologies[0], 0, config, state_dir, lambda topic: 1)


def _core(task):
    (processor,) = task.processors.values()
    return processor._core


# Ids: mostly repeated strs (the pair fast path), None (forwarded, no trace), ints and lists
# (memory_key's store-key path), and no id at all (id_of raises). Timestamps: out of order
# within a few intervals, and now and then the largest int64, where the rule's differences
# overflow 64 bits.
ids = st.one_of(
    st.integers(0, 6).map(lambda n: f"tx-{n}"),
    st.none(),
    st.integers(0, 3),
    st.just([1, "x"]),
    st.just("__missing__"),
)
timestamps = st.integers(0, 4 * MINUTE) | st.just(2**63 - 1)
rows = st.lists(
    st.tuples(st.sampled_from([b"a", b"b", None]), ids, timestamps, st.booleans()), max_size=60
)


def _record(offset, key, identity, timestamp):
    value = {} if identity == "__missing__" else {"id": identity}
    return ConsumedRecord("in", 0, offset, timestamp, key, json.dumps(value).encode(), [])


def _run(directory, interval, events, native):
    """``events`` through a task with the C core on or off; a commit after each event marked
    so, and a reopen after the first of those. Returns everything the two must agree on."""
    seen = []
    with patch.object(dedup, "NATIVE_CORE", native):
        task = _task(directory, interval)
        reopened = False
        try:
            for offset, (key, identity, timestamp, commit) in enumerate(events):
                task.process(_record(offset, key, identity, timestamp))
                core = _core(task)
                seen.append((core.pending_entries, core.pending_bytes, len(core.entries)))
                if commit:
                    seen.append(("commit", task.commit(), task.metrics()))
                    if not reopened:
                        task.close()
                        task, reopened = _task(directory, interval), True
            seen.append(("end", task.commit(), task.metrics()))
            seen.append([tuple(record)[:4] for record in task.take_output()])
            (store,) = task.stores.values()
            seen.append(list(store.prefix(b"")))
            return seen
        finally:
            task.close()


@needs_c_core
@settings(max_examples=150, deadline=None)
@given(interval=st.integers(0, 2 * MINUTE), events=rows, fraction=st.sampled_from([1, 4, 64]))
def test_the_c_core_and_the_python_core_are_indistinguishable(
    tmp_path_factory, interval, events, fraction
):
    with patch.object(dedup, "_PURGE_SLACK_FRACTION", fraction):  # purges mid-batch, often
        python = _run(tmp_path_factory.mktemp("python"), interval, events, native=False)
        native = _run(tmp_path_factory.mktemp("native"), interval, events, native=True)
    assert native == python


@needs_c_core
def test_buffered_tasks_run_the_c_core_and_others_the_python_core(tmp_path):
    task = _task(tmp_path / "eos", MINUTE)
    try:
        assert type(_core(task)) is dedup._native.Core
    finally:
        task.close()
    topology = _topology(MINUTE)
    config = StreamsConfig({"application.id": "alos", "processing.guarantee": "at_least_once"})
    task = Task(topology, topology.subtopologies[0], 0, config, tmp_path / "alos", lambda t: 1)
    try:  # under either guarantee a task's writes wait for its commit
        assert type(_core(task)) is dedup._native.Core
    finally:
        task.close()
    task = Task(topology, topology.subtopologies[0], 0, config, tmp_path / "through", lambda t: 1,
                isolation_level=IsolationLevel.READ_UNCOMMITTED)  # fmt: skip
    try:
        assert type(_core(task)) is dedup._DedupCore  # writes go through at once
    finally:
        task.close()


@needs_c_core
def test_a_closed_task_with_the_c_core_is_freed(tmp_path):
    """The core refers to the task (stream time) and its forward function, which refer back
    to the processor and the core: only the cycle collector can free them, so the core must
    show it its references."""
    task = _task(tmp_path, MINUTE)
    for offset in range(100):
        task.process(_record(offset, b"a", f"tx-{offset % 7}", 1_000 * offset))
    task.commit()
    (processor,) = task.processors.values()
    task_ref, processor_ref = weakref.ref(task), weakref.ref(processor)
    task.close()
    del task, processor
    gc.collect()
    assert task_ref() is None and processor_ref() is None


@needs_c_core
def test_the_c_core_leaves_no_reference_behind(tmp_path):
    """A key object kept by the caller: once its id has expired and been committed, the C
    core must hold no reference to it (no leak per record)."""
    task = _task(tmp_path, MINUTE)
    try:
        key = "k" * 40
        before = sys.getrefcount(key)
        for offset in range(200):
            value = json.dumps({"id": f"tx-{offset % 5}"}).encode()
            task.process(ConsumedRecord("in", 0, offset, 1_000 * offset, key.encode(), value, []))
        task.process(ConsumedRecord("in", 0, 200, 10 * MINUTE, b"z", b'{"id": "z"}', []))
        task.commit()
        task.take_output()
        assert sys.getrefcount(key) == before
        assert len(_core(task).entries) == 1  # only z's id is live
    finally:
        task.close()


def test_the_c_core_is_built_wherever_a_compiler_is():
    """The extension is optional so that an install without a compiler still works; on a
    machine with one (CI's), a failed build must not pass silently as the slow path."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the pure-Python core runs, as documented")
    assert dedup._native is not None, "platform/streamplatform/dsl/_dedup_core.c did not build"
