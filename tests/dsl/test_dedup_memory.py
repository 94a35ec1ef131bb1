"""A deduplication's memory is bounded by its budget (``statestore.cache.max.bytes``), however
many ids are live: past the budget its ids live in the store (RocksDB) only, and what it
decides does not change. The KIP-655 rules themselves are in test_dedup.py, the C core against
the Python one in test_dedup_core.py; here the same checks run with ids out of memory."""

from __future__ import annotations

import random
import struct
import tracemalloc
from collections import deque
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform import StreamsBuilder
from streamplatform.config import StreamsConfig
from streamplatform.dsl import dedup
from streamplatform.dsl.dedup_store import ID_PREFIX, INDEX_PREFIX, pack_entry
from streamplatform.runtime.task import Task
from streamplatform.serdes import Serdes
from streamplatform.state import IsolationLevel, TransactionalKeyValueStore
from tests.dsl.test_dedup import EVENTS, INTERVALS, model_with_store, run_tasks
from tests.dsl.test_dedup_core import _run, needs_c_core, rows

MINUTE, HOUR = 60_000, 3_600_000
STORE = "KSTREAM-DEDUPLICATE-0000000001-store"
# A budget of 1 byte: every commit empties memory, so every later lookup goes to the store.
OUT_OF_MEMORY = {"statestore.cache.max.bytes": 1}


def _committed_ids(store: dict[bytes, bytes]) -> dict[str, tuple[int, int]]:
    return {
        key[2:].decode(): struct.unpack(">qq", value)
        for key, value in store.items()
        if key.startswith(b"i")
    }


@settings(max_examples=examples(60), deadline=None)
@given(
    interval=INTERVALS,
    events=EVENTS,
    commit_every=st.integers(min_value=1, max_value=12),
    reopen_at=st.integers(min_value=0, max_value=40),
)
def test_ids_kept_in_the_store_only_give_the_models_output_and_store(
    tmp_path_factory, interval, events, commit_every, reopen_at
):
    """test_dedup's model check, with memory emptied at every commit: lookups of the store
    decide as the in-memory entries did, the store's index expires exactly the expired ids,
    and exactly once and at least once leave the same store, index included."""
    schedule = (interval, events, commit_every, reopen_at)
    held = run_tasks(tmp_path_factory.mktemp("held"), *schedule[:2], "exactly_once_v2",
                     *schedule[2:], settings=OUT_OF_MEMORY)  # fmt: skip
    through = run_tasks(tmp_path_factory.mktemp("through"), *schedule[:2], "at_least_once",
                        *schedule[2:], settings=OUT_OF_MEMORY)  # fmt: skip
    out, model_store = model_with_store(interval, events)
    assert held[0] == through[0] == out
    assert held[1] == through[1]
    assert _committed_ids(held[1]) == model_store
    # One index key per stored id, for its timestamp, and none left below the horizon.
    indexed = {key[9:] for key in held[1] if key.startswith(INDEX_PREFIX)}
    assert indexed >= {key[1:] for key in held[1] if key.startswith(ID_PREFIX)}


@settings(max_examples=examples(60), deadline=None)
@given(interval=INTERVALS, events=EVENTS, commit_every=st.integers(min_value=1, max_value=12))
def test_ids_moved_out_of_memory_between_commits_change_nothing(
    tmp_path_factory, interval, events, commit_every
):
    """With a budget of 1 byte the task asks after every record, and the processor hands its
    held writes to the store's transaction and empties memory each time (a spill), between
    commits: output and store are still the model's, under both guarantees alike."""
    _check_asked_after_every_record(tmp_path_factory, interval, events, commit_every, 1)


def _check_asked_after_every_record(tmp_path_factory, interval, events, commit_every, budget):
    """``events`` through a task with ``budget``, the limits asked after every record as the
    runtime asks them, a commit every ``commit_every`` records: output and store are the
    model's, under exactly once and at least once alike."""
    results = {}
    for guarantee in ("exactly_once_v2", "at_least_once"):
        task = _task(tmp_path_factory.mktemp(guarantee), interval, budget, guarantee)
        try:
            forwarded = []
            for offset, (key, timestamp) in enumerate(events):
                raw_key = None if key is None else key.encode()
                record = ("in", 0, offset, timestamp, raw_key, b"v", ())
                if task.process_all([record], stop_early=True):
                    task.commit()  # the store's own uncommitted limits: not reached here
                if (offset + 1) % commit_every == 0:
                    task.commit()
                    forwarded += _forwarded_offsets(task)
            task.commit()
            forwarded += _forwarded_offsets(task)
            results[guarantee] = forwarded, dict(task.stores[STORE].prefix(b""))
        finally:
            task.close()
    out, model_store = model_with_store(interval, events)
    assert results["exactly_once_v2"][0] == results["at_least_once"][0] == out
    assert results["exactly_once_v2"][1] == results["at_least_once"][1]
    assert _committed_ids(results["exactly_once_v2"][1]) == model_store


@settings(max_examples=examples(60), deadline=None)
@given(
    interval=INTERVALS,
    events=EVENTS,
    commit_every=st.integers(min_value=1, max_value=12),
    budget=st.sampled_from([600, 1_200, 2_500, 5_000]),
)
def test_ids_let_go_and_memory_complete_again_change_nothing(
    tmp_path_factory, interval, events, commit_every, budget
):
    """Budgets of a few ids: memory lets its ids go at some commits and spills, keeps them
    at others, and stops asking the store once stream time has passed what it let go by
    more than the interval. Output and store are still the model's, under both guarantees,
    with the limits asked after every record as the runtime asks them."""
    _check_asked_after_every_record(tmp_path_factory, interval, events, commit_every, budget)


def test_misses_stop_asking_the_store_once_what_memory_let_go_has_expired(tmp_path):
    """Memory lets its ids go at a commit (stream time 7 s); an id let go is still a
    duplicate when stream time is exactly an interval past it (both ends inclusive), so the
    store is asked until stream time passes 7 s + the interval, and not after."""
    task = _task(tmp_path, MINUTE, budget=4_096)  # let go above 2 KiB at a commit
    try:
        processor = _processor(task)
        record = lambda offset, key, ts: ("in", 0, offset, ts, key, b"v", ())  # noqa: E731
        task.process_all([record(n, b"id-%d" % n, n * 1_000) for n in range(8)], stop_early=True)
        task.commit()
        core = processor._core
        assert len(core.entries) == 0 and core.lookup is not None  # let go
        # The limits are asked after every record (the budget is under 1 MiB).
        task.process_all([record(8, b"z", 67_000)], stop_early=True)
        assert core.lookup is not None  # stream time 67 s: id-7 (7 s) is still live
        task.process_all([record(9, b"id-7", 67_000)], stop_early=True)  # a duplicate
        task.process_all([record(10, b"y", 67_001)], stop_early=True)
        assert core.lookup is None  # everything let go is past the interval now
        task.process_all([record(11, b"id-7", 67_002), record(12, b"y", 67_003)], stop_early=True)
        task.commit()
        assert _forwarded_offsets(task) == [*range(9), 10, 11]
        stored = _committed_ids(dict(task.stores[STORE].prefix(b"")))
        assert stored == {"z": (67_000, 8), "y": (67_001, 10), "id-7": (67_002, 11)}
    finally:
        task.close()


@needs_c_core
@settings(max_examples=examples(100), deadline=None)
@given(interval=st.integers(0, 2 * MINUTE), events=rows)
def test_with_ids_out_of_memory_the_c_and_python_cores_are_indistinguishable(
    tmp_path_factory, interval, events
):
    python = _run(tmp_path_factory.mktemp("python"), interval, events, False, OUT_OF_MEMORY)
    native = _run(tmp_path_factory.mktemp("native"), interval, events, True, OUT_OF_MEMORY)
    assert native == python


def _topology(interval):
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.string()).deduplicate_by_key(interval).to("out")
    return b.build()


def _task(directory, interval, budget, guarantee="exactly_once_v2"):
    topology = _topology(interval)
    config = StreamsConfig({
        "application.id": "memory", "processing.guarantee": guarantee,
        "statestore.cache.max.bytes": budget,
    })  # fmt: skip
    return Task(topology, topology.subtopologies[0], 0, config, directory, lambda topic: 1)


def _processor(task):
    (processor,) = task.processors.values()
    return processor


def _records(ids: int, duplicates: int, seed: int = 7):
    """``ids`` distinct ids 50 ms apart (3% up to a minute out of order), and ``duplicates``
    repeats of earlier ids mixed in: all within a 24-hour interval, so every repeat is a
    duplicate and every id stays live to the end."""
    rng = random.Random(seed)
    start = 1_767_225_600_000
    repeat_at = set(rng.sample(range(1, ids + duplicates), duplicates))
    seen = 0
    for offset in range(ids + duplicates):
        if offset in repeat_at and seen:
            key = b"id-%08d" % rng.randrange(seen)
        else:
            key, seen = b"id-%08d" % seen, seen + 1
        timestamp = start + offset * 50 - (rng.randrange(MINUTE) if rng.random() < 0.03 else 0)
        yield ("in", 0, offset, timestamp, key, b"v", ())


def _forwarded_offsets(task):
    offsets = [source[2] for source in task.take_output_sources()]
    task.take_output()
    return offsets


def _run_bounded(directory, records, budget, native=True):
    """``records`` through one task the way the runtime drives it: committing whenever the
    task asks for an early commit. Returns the forwarded offsets, the processor's largest
    accounted memory between two records it was asked about, and how often it moved its ids
    out of memory between two commits."""
    with patch.object(dedup, "NATIVE_CORE", native):
        task = _task(directory, 24 * HOUR, budget)
    try:
        processor = _processor(task)
        remaining, forwarded, largest = iter(records), [], 0
        while True:
            cut = task.process_all(remaining, stop_early=True)
            largest = max(largest, processor.memory_bytes())
            task.commit()
            forwarded += _forwarded_offsets(task)
            if not cut:
                peak = max(largest, processor.peak_memory_bytes)
                return forwarded, peak, processor.spills, task.metrics()
    finally:
        task.close()


@pytest.mark.parametrize(
    "ids, budget",
    [
        (100_000, 1024 * 1024),
        pytest.param(1_000_000, 8 * 1024 * 1024, marks=pytest.mark.slow),
    ],
)
def test_a_million_live_ids_stay_within_a_small_budget_and_decide_as_the_reference(
    tmp_path, ids, budget
):
    """The issue's check: 1M distinct ids through a 24-hour deduplication with an 8 MB budget
    (the fast tier: 100k ids, 1 MB). The processor's own accounting never passes the budget,
    and what it forwards equals the Python reference core's with every id in memory."""
    duplicates = ids // 10
    records = list(_records(ids, duplicates))
    bounded, largest, spills, metrics = _run_bounded(tmp_path / "bounded", records, budget)
    assert largest <= budget
    assert spills > 5, "the budget must have moved the ids out of memory several times"
    assert metrics["dedup_forwarded"] == ids and metrics["dedup_dropped"] == duplicates
    reference, reference_largest, _, _ = _run_bounded(
        tmp_path / "reference", records, 2**40, native=False
    )
    assert bounded == reference
    assert reference_largest > 10 * budget  # what the same ids take when all are in memory


def test_forgotten_ids_are_still_found_in_the_store_and_expire_from_it(tmp_path):
    task = _task(tmp_path, MINUTE, budget=1)
    try:
        processor = _processor(task)
        record = lambda offset, key, ts: ("in", 0, offset, ts, key, b"v", ())  # noqa: E731
        task.process_all([record(0, b"a", 0), record(1, b"b", 1_000)])
        task.commit()
        core = processor._core
        assert len(core.entries) == 0 and core.lookup is not None  # memory emptied
        task.process_all([record(2, b"a", 2_000), record(3, b"c", 3_000)])  # a: a duplicate
        task.commit()
        assert _forwarded_offsets(task) == [0, 1, 3]
        task.process_all([record(4, b"d", 62_500)])  # a (0 s) and b (1 s) are now expired
        task.commit()
        stored = dict(task.stores[STORE].prefix(b""))
        assert _committed_ids(stored) == {"c": (3_000, 3), "d": (62_500, 4)}
        assert sorted(k[9:] for k in stored if k.startswith(INDEX_PREFIX)) == [b"sc", b"sd"]
    finally:
        task.close()


def test_a_store_bigger_than_the_budget_is_not_loaded_at_open(tmp_path):
    task = _task(tmp_path, HOUR, budget=10 * 1024 * 1024)
    try:
        task.process_all([("in", 0, n, n, b"id-%d" % n, b"v", ()) for n in range(5_000)])
        task.commit()
    finally:
        task.close()
    task = _task(tmp_path, HOUR, budget=64 * 1024)  # 5,000 ids take ~1.6 MB
    try:
        processor = _processor(task)
        assert len(processor._core.entries) == 0 and processor._core.lookup is not None
        # The limits asked after every record, as the runtime asks them: the stored ids
        # stay live for an hour of stream time, so misses keep asking the store.
        task.process_all([("in", 0, 5_000, 5_000, b"id-17", b"v", ())], stop_early=True)
        task.process_all([("in", 0, 5_001, 5_001, b"id-new", b"v", ())], stop_early=True)
        task.process_all([("in", 0, 5_002, 5_002, b"id-18", b"v", ())], stop_early=True)
        assert _forwarded_offsets(task) == [5_001]
        assert processor._core.lookup is not None
    finally:
        task.close()


def test_a_store_written_before_the_index_gets_one_at_open(tmp_path):
    """Stores written by an earlier version hold ids without index keys: the first open
    indexes them, so that they expire from the store even when memory does not hold them."""
    directory = tmp_path / "memory" / "0_0" / STORE
    store = TransactionalKeyValueStore(directory, IsolationLevel.READ_COMMITTED)
    with store:
        for n in range(3):
            store.transaction.put(b"is" + b"old-%d" % n, pack_entry(n * 1_000, n))
        store.transaction.put(b"m", pack_entry(2_000, 0))
        store.commit()
    task = _task(tmp_path, MINUTE, budget=1)
    try:
        task.process_all([("in", 0, 10, 100_000, b"new", b"v", ())])  # the old ids expire
        task.commit()
        stored = dict(task.stores[STORE].prefix(b""))
        assert _committed_ids(stored) == {"new": (100_000, 10)}
    finally:
        task.close()


def test_the_accounting_matches_what_python_allocates():
    """memory_bytes() counts per object (dedup_store.py's constants): within 25% of what
    tracemalloc sees the same entries, index and held writes take."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        entries, in_order, pending = {}, deque(), {}
        for n in range(50_000):
            key = f"user-{n:010d}"
            entry = (1_767_225_600_000 + n, 1_000_000 + n)
            entries[key] = pending[key] = entry
            in_order.append((entry[0], key, entry))
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    processor = dedup.DeduplicationProcessor("s", MINUTE, lambda k, v: k)
    processor._core = type("Core", (), {})()
    processor._core.entries, processor._core.in_order, processor._core.pending = (
        entries, in_order, pending,
    )  # fmt: skip
    processor._core.expiry, processor._core.in_store, processor._written = [], set(), {}
    processor._key_bytes = dedup.mean_key_bytes(entries)
    assert 0.75 * traced <= processor.memory_bytes() <= 1.25 * traced


def test_the_processors_that_keep_state_in_memory_share_the_tasks_budget(tmp_path):
    """statestore.cache.max.bytes bounds the task: a deduplication and an aggregation in one
    task get half each; a filter gets nothing."""
    b = StreamsBuilder()
    (b.stream("in", Serdes.string(), Serdes.string()).deduplicate_by_key(MINUTE)
     .filter(lambda k, v: True).group_by_key().count())  # fmt: skip
    topology = b.build()
    config = StreamsConfig({"application.id": "share", "statestore.cache.max.bytes": 1_000_000})
    task = Task(topology, topology.subtopologies[0], 0, config, tmp_path, lambda topic: 1)
    try:
        kinds = {type(p).__name__: p for p in task.processors.values()}
        assert kinds["DeduplicationProcessor"].budget == 500_000
        assert kinds["StreamAggregate"].cache.max_bytes == 500_000
        assert not kinds["Filter"].uses_record_cache()
    finally:
        task.close()
