"""The dedup's per-record path exists twice: ``dedup._DedupCore`` (Python, the reference) and
``_dedup_core.Core`` (C, built with the package, run for buffered writes in the runtime's
tasks). They must be indistinguishable: the same outputs and DLQ records in order, the same
counters, the same writes waiting for the commit (the uncommitted limits read them), the same
committed store, across commits and a reopen. And the C one must really be the one that runs
where it was built, hold no task alive after it closed, leave no reference behind, and be built
unless STREAMPLATFORM_NO_C_CORE=1 says to go without it (setup.py)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform import StreamsBuilder
from streamplatform.config import StreamsConfig
from streamplatform.dsl import dedup, window_aggregate
from streamplatform.records import ConsumedRecord
from streamplatform.runtime import kafka_input
from streamplatform.runtime.task import Task
from streamplatform.serdes import Serdes
from streamplatform.state import IsolationLevel

MINUTE = 60_000
NO_C_CORE = os.environ.get("STREAMPLATFORM_NO_C_CORE", "").strip().lower() in {"1", "true", "yes"}
REBUILD = (
    "Rebuild it with `make setup` (which reinstalls when a core's .c or setup.py changed) or "
    "`.venv/bin/python setup.py build_ext --inplace`; to run without it on purpose (no C "
    "compiler), set STREAMPLATFORM_NO_C_CORE=1 for the install and the tests."
)
needs_c_core = pytest.mark.skipif(
    dedup._native is None,
    reason="the C core is not built here (test_the_c_core_is_built_unless_opted_out says why)",
)


def _id_of(key, value):
    return value["id"]  # KeyError for a value without an id: a processing error


def _topology(interval):
    builder = StreamsBuilder()
    stream = builder.stream("in", Serdes.string(), Serdes.json())
    stream.deduplicate_by_key_value(_id_of, interval).to("out")
    return builder.build()


def _task(state_dir, interval, settings=None):
    topology = _topology(interval)
    config = StreamsConfig({
        "application.id": "core", "processing.guarantee": "exactly_once_v2",
        "errors.dead.letter.queue.topic.name": "dlq",
        "processing.exception.handler": "log_and_continue", **(settings or {}),
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


def _run(directory, interval, events, native, settings=None):
    """``events`` through a task with the C core on or off; a commit after each event marked
    so, and a reopen after the first of those. Returns everything the two must agree on.
    ``settings``: more job settings."""
    seen = []
    with patch.object(dedup, "NATIVE_CORE", native):
        task = _task(directory, interval, settings)
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
                        task, reopened = _task(directory, interval, settings), True
            seen.append(("end", task.commit(), task.metrics()))
            seen.append([tuple(record)[:4] for record in task.take_output()])
            (store,) = task.stores.values()
            seen.append(list(store.prefix(b"")))
            return seen
        finally:
            task.close()


@needs_c_core
@settings(max_examples=examples(150), deadline=None)
@given(interval=st.integers(0, 2 * MINUTE), events=rows, fraction=st.sampled_from([1, 4, 64]))
def test_the_c_core_and_the_python_core_are_indistinguishable(
    tmp_path_factory, interval, events, fraction
):
    with patch.object(dedup, "_PURGE_SLACK_FRACTION", fraction):  # purges mid-batch, often
        python = _run(tmp_path_factory.mktemp("python"), interval, events, native=False)
        native = _run(tmp_path_factory.mktemp("native"), interval, events, native=True)
    assert native == python


def _counted_as_staged(core):
    """What the store would count for the held writes once staged: one entry per id, its
    key (``held_size``) and a put's 16-byte entry."""
    return len(core.pending), sum(
        dedup.held_size(key) + (0 if entry is None else 16) for key, entry in core.pending.items()
    )


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_c_core)])
@settings(max_examples=examples(100), deadline=None)
@given(interval=st.integers(0, 2 * MINUTE), events=rows, fraction=st.sampled_from([1, 4, 64]))
# An id forwarded again while its put is held (its entry expired, not yet purged); and one
# handed over at a commit, put again, then expired: its held put becomes a delete.
@example(1_000, [(b"a", "tx-0", 1_000, False), (b"a", "tx-1", 0, False),
                 (b"a", "tx-1", 1_500, False)], 1)  # fmt: skip
@example(1_000, [(b"a", "tx-0", 1_000, False), (b"a", "tx-1", 0, True),
                 (b"a", "tx-1", 1_500, False), (b"a", "tx-2", 3_000, False)], 1)  # fmt: skip
def test_the_held_writes_are_counted_as_the_store_counts_staged_writes(
    tmp_path_factory, native, interval, events, fraction
):
    """After every record the counters the uncommitted limits read equal the held writes'
    count as staged in the store: an id put and expired before the hand-over counts for
    nothing, a put turned into a delete counts its key only."""
    with patch.object(dedup, "_PURGE_SLACK_FRACTION", fraction), \
            patch.object(dedup, "NATIVE_CORE", native):  # fmt: skip
        task = _task(tmp_path_factory.mktemp("count"), interval)
    try:
        for offset, (key, identity, timestamp, commit) in enumerate(events):
            task.process(_record(offset, key, identity, timestamp))
            core = _core(task)
            assert (core.pending_entries, core.pending_bytes) == _counted_as_staged(core)
            if commit:
                task.commit()
    finally:
        task.close()


def test_a_batch_of_short_lived_ids_is_not_cut_for_writes_it_never_makes(tmp_path):
    """1,000 ids 100 ms apart through a 1-second deduplication under an uncommitted limit of
    100 records: each id expires long before the commit, so the batch is not cut; with an
    hour's interval every id stays held and the limit cuts it."""
    records = [
        ("in", 0, n, n * 100, b"k", json.dumps({"id": n}).encode(), ()) for n in range(1_000)
    ]
    limit = {"statestore.uncommitted.max.records": 100}
    short = _task(tmp_path / "short", 1_000, limit)
    try:
        assert short.process_all(records, stop_early=True) is False
        assert short.needs_early_commit() is False
    finally:
        short.close()
    long = _task(tmp_path / "long", 60 * MINUTE, limit)
    try:
        assert long.process_all(records, stop_early=True) is True
        assert 40 <= long.records_in <= 60  # two store writes a held id
    finally:
        long.close()


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


def _held(text: str) -> str:
    return "".join(["held-", text])  # a new str object, not the interned constant


@pytest.mark.parametrize("core", ["c", "python"])
@pytest.mark.parametrize("dedup_by", ["key and str id", "key and int id", "key"])
def test_the_core_leaves_no_reference_behind(tmp_path, core, dedup_by, held_serde):
    """200 records whose keys, values and ids are objects held here, each handed to the core
    ~40-70 times; once their ids have expired and been committed (one commit in between, so
    that some went to the store and left it again), the core may hold no reference to any
    of them. A core that leaked one reference per record shows here: to the record, its key,
    value or id (every case), or to the id's in-memory key or its index items (the cases
    whose in-memory key holds the key and id: str ids, and the key alone; an int id's is new
    bytes). Checked by building _dedup_core.c with each of those Py_DECREFs left out."""
    if core == "c" and dedup._native is None:
        pytest.skip("the C core is not built here (test_the_c_core_is_built_unless_opted_out)")
    keys = {f"k{n}".encode(): _held(f"key-{n}") for n in range(3)}
    ids = [_held(f"tx-{n}") if dedup_by != "key and int id" else 10**12 + n for n in range(5)]
    values = {f"v{n}".encode(): {"id": identity} for n, identity in enumerate(ids)}
    held = [*keys.values(), *values.values(), *ids]
    last_key, last_value = {b"z": _held("z")}, {b"z": {"id": _held("z")}}
    builder = StreamsBuilder()
    stream = builder.stream("in", held_serde(keys | last_key), held_serde(values | last_value))
    if dedup_by == "key":
        stream.deduplicate_by_key(MINUTE).to("out")
    else:
        stream.deduplicate_by_key_value(_id_of, MINUTE).to("out")
    topology = builder.build()
    config = StreamsConfig({"application.id": "leak", "processing.guarantee": "exactly_once_v2"})

    def references() -> list[int]:
        return [sys.getrefcount(obj) for obj in held]

    counts = references()
    also = list(held)  # the count sees a reference more (objects not immortal)
    assert references() == [count + 1 for count in counts]
    del also
    with patch.object(dedup, "NATIVE_CORE", core == "c"):
        task = Task(topology, topology.subtopologies[0], 0, config, tmp_path, lambda topic: 1)
    try:
        expected = dedup._native.Core if core == "c" else dedup._DedupCore
        assert type(_core(task)) is expected
        for offset in range(200):
            key, value = f"k{offset % 3}".encode(), f"v{offset % 5}".encode()
            task.process(ConsumedRecord("in", 0, offset, 1_000 * offset, key, value, []))
            if offset == 100:
                task.commit()
        assert _core(task).dropped > 0 and _core(task).forwarded > 0  # both paths ran
        task.process(ConsumedRecord("in", 0, 200, 10 * MINUTE, b"z", b"z", []))
        task.commit()  # every earlier id expired: handed over as deletes or dropped
        task.take_output()
        assert len(_core(task).entries) == 1  # only z's id is live
        left = [now - count for now, count in zip(references(), counts, strict=True)]
        assert left == [0] * len(held), f"references left behind, per object: {left}"
    finally:
        task.close()


# In-memory keys as memory_key gives them (strs, pairs of strs, store-key bytes), strs that
# UTF-8 cannot encode (lone surrogates), and what only the fallback builds (an int).
any_text = st.text(st.characters(blacklist_categories=()), max_size=4)  # surrogates too
memory_keys = st.one_of(
    any_text, st.tuples(any_text, any_text),
    st.binary(max_size=4).map(lambda raw: b"ib" + raw), st.integers(-2, 2),
)  # fmt: skip
held_entries = st.one_of(
    st.none(), st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-1, 2**63 - 1))
)


@needs_c_core
@settings(max_examples=examples(300), deadline=None)
@given(pending=st.dictionaries(memory_keys, held_entries, max_size=8),
       in_store=st.sets(memory_keys, max_size=4))  # fmt: skip
def test_the_c_hand_over_writes_what_the_python_one_writes(pending, in_store):
    """``_dedup_core.handed_over`` builds the commit's store writes as
    ``dedup_store.handed_over`` does: the same writes in the same order, the same in-store
    set afterwards, the same error for a key UTF-8 cannot encode."""
    from streamplatform.dsl import dedup_store

    def outcome(function):
        keys = set(in_store)
        try:
            return function(dict(pending), keys, dedup_store.store_key), keys
        except UnicodeEncodeError as error:
            return type(error), error.reason

    assert outcome(dedup._native.handed_over) == outcome(dedup_store.handed_over)


def test_the_c_core_is_built_unless_opted_out():
    """setup.py fails an install whose C build fails, unless STREAMPLATFORM_NO_C_CORE=1; an
    install from before that, or a build that was never run, must not pass here as the
    slow path."""
    if NO_C_CORE:
        pytest.skip("STREAMPLATFORM_NO_C_CORE=1: the pure-Python core runs, as asked")
    assert dedup._native is not None, (
        "The C dedup core (streamplatform.dsl._dedup_core, from "
        f"platform/streamplatform/dsl/_dedup_core.c) is not built: {REBUILD}"
    )
    assert window_aggregate._native is not None, (
        "The C windowed-aggregation core (streamplatform.dsl._window_core, from "
        f"platform/streamplatform/dsl/_window_core.c) is not built: {REBUILD}"
    )
    assert kafka_input._native_append_rows is not None, (
        "The C Kafka reader's rows (streamplatform.runtime._kafka_rows, from "
        f"platform/streamplatform/runtime/_kafka_rows.c) are not built: {REBUILD}"
    )


@needs_c_core
def test_the_c_core_in_the_source_tree_is_not_older_than_its_source():
    """An editable install imports the core built next to its source: a change to the source
    is not run until it is built again."""
    from streamplatform.runtime import _kafka_rows

    for native in (dedup._native, window_aggregate._native, _kafka_rows):
        built = Path(native.__file__)
        source = built.parent / f"{native.__name__.rsplit('.', 1)[-1]}.c"
        if not source.exists():
            pytest.skip("the core was installed from a wheel: no source next to it")
        assert built.stat().st_mtime >= source.stat().st_mtime, (
            f"{built.name} is older than {source.name}: the running core is not the source's. "
            f"{REBUILD}"
        )


@pytest.mark.parametrize("opted_out", [False, True])
def test_a_failed_c_build_fails_the_install_unless_opted_out(tmp_path, opted_out):
    """setup.py's build_ext with a compiler that fails (CC=false): an error naming the core
    and the way out; with STREAMPLATFORM_NO_C_CORE=1, no core and no error."""
    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"CC": "false"}
    env.pop("STREAMPLATFORM_NO_C_CORE", None)
    if opted_out:
        env["STREAMPLATFORM_NO_C_CORE"] = "1"
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "temp")],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    built = list(tmp_path.glob("lib/**/_dedup_core*"))
    if opted_out:
        assert build.returncode == 0, build.stderr
        assert built == []
    else:
        assert build.returncode != 0
        assert "Building the C core streamplatform.dsl._dedup_core" in build.stderr, build.stderr
        assert "STREAMPLATFORM_NO_C_CORE=1" in build.stderr
