"""A task's inputs merged in Kafka Streams' order and cut at a batch's edge
(runtime/partition_group.py), without a broker or Spark."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from streamplatform.runtime.partition_group import FROM_LAST, InputQueue, MergeResult, merge
from streamplatform.runtime.repartition_buffer import UPSTREAM_BITS, upstream_of
from streamplatform.runtime.rows import table_queues


def _record(topic, partition, offset, timestamp):
    return (topic, partition, offset, timestamp, b"k", b"v", [])


def _queue(topic, times, limit=None, chunk=2, partition=0):
    records = [_record(topic, partition, offset, t) for offset, t in enumerate(times)]
    chunks = iter([records[i : i + chunk] for i in range(0, len(records), chunk)])
    return InputQueue(chunks, (topic, partition, -1), limit)


def _taken(queues, **options):
    result = MergeResult()
    records = [r for chunk in merge(queues, result=result, **options) for r in chunk]
    return [(r[0], r[3]) for r in records], result


def test_the_lowest_head_goes_first_and_ties_go_to_the_lower_key():
    taken, result = _taken([_queue("b", [1, 5, 5]), _queue("a", [2, 5, 9])])
    assert taken == [("b", 1), ("a", 2), ("a", 5), ("b", 5), ("b", 5), ("a", 9)]
    assert not result.stopped and result.bound is None and result.taken == 6


def test_a_queue_keeps_its_own_order_even_out_of_time_order():
    taken, _ = _taken([_queue("a", [5, 1, 7]), _queue("b", [2, 6])])
    assert taken == [("b", 2), ("a", 5), ("a", 1), ("b", 6), ("a", 7)]


def test_a_bounded_queue_that_runs_empty_holds_later_records_of_the_others_back():
    """The issue's second reproduction: impressions i1@0, i2@1140; clicks c1@30, c2@40 in a
    batch capped at two records a partition: c3@50 may come after c2, so i2 waits."""
    clicks = _queue("clicks", [30, 40], FROM_LAST)
    impressions = _queue("impressions", [0, 1140], FROM_LAST)
    taken, result = _taken([clicks, impressions])
    assert taken == [("impressions", 0), ("clicks", 30), ("clicks", 40)]
    assert result.stopped and result.bound == 40
    assert [r[3] for r in impressions.rest()] == [1140]  # read again by the next batch


def test_a_complete_queue_holds_nothing_back():
    taken, result = _taken([_queue("a", [1, 2]), _queue("b", [0, 9])])
    assert taken == [("b", 0), ("a", 1), ("a", 2), ("b", 9)] and result.bound is None


def test_the_cap_is_per_task_and_its_last_record_is_the_bound():
    taken, result = _taken([_queue("a", [1, 3, 5]), _queue("b", [2, 4, 6])], cap=4)
    assert taken == [("a", 1), ("b", 2), ("a", 3), ("b", 4)]
    assert result.stopped and result.bound == 4


def test_an_upstream_bound_holds_back_later_records_even_with_no_record_of_it():
    upstream = InputQueue(iter([]), ("rep", 0, 1), 10)  # bounded at 10, sent nothing here
    taken, result = _taken([upstream, _queue("rep", [5, 10, 11])])
    assert taken == [("rep", 5), ("rep", 10)] and result.stopped and result.bound == 10


def test_records_equal_to_a_bound_are_taken():
    taken, _ = _taken([_queue("a", [3], FROM_LAST), _queue("b", [3, 3, 4])])
    assert taken == [("a", 3), ("b", 3), ("b", 3)]


@pytest.mark.parametrize("seed", range(30))
def test_any_cut_of_live_traffic_is_a_prefix_of_the_uncut_order(seed):
    """Records in time order across queues (live traffic), cut by random caps and ranges
    batch after batch: the records taken, batch after batch, are the uncut merge's order."""
    rng = random.Random(seed)
    clock = iter(range(10**6))
    times = {name: [] for name in "abc"}
    for _ in range(rng.randint(1, 60)):
        times[rng.choice("abc")].append(next(clock) // 2)  # some ties across queues
    whole, _ = _taken([_queue(name, t, chunk=3) for name, t in times.items()])
    done = {name: 0 for name in times}
    taken_all = []
    for _ in range(500):
        if all(done[n] == len(t) for n, t in times.items()):
            break
        cap = rng.randint(1, 7)
        queues = []
        for name, t in times.items():
            start = done[name]
            end = min(len(t), start + cap)
            records = [_record(name, 0, o, t[o]) for o in range(start, end)]
            queue = InputQueue(
                iter([records]), (name, 0, -1), FROM_LAST if end - start >= cap else None
            )
            queues.append(queue)
        taken, _ = _taken(queues, cap=cap)
        for name, _t in taken:
            done[name] += 1
        taken_all += taken
    assert taken_all == whole


def test_repartitioned_rows_form_one_queue_per_upstream_task():
    base = 3 << 40
    rows = [("rep", 1, base + (2 << UPSTREAM_BITS) + 1, 7), ("rep", 1, base + (2 << UPSTREAM_BITS), 9),
            ("rep", 1, base + 5, 8), ("in", 1, 4, 1)]  # fmt: skip
    table = pa.table({
        "topic": [r[0] for r in rows], "partition": [r[1] for r in rows],
        "offset": [r[2] for r in rows], "timestamp": [r[3] for r in rows],
        "key": [b"k"] * 4, "value": [b"v"] * 4, "headers": [None] * 4,
    })  # fmt: skip
    queues = table_queues(table, frozenset({"rep"}))
    assert {key: [r.timestamp for r in records] for key, records in queues.items()} == {
        ("rep", 1, 2): [9, 7], ("rep", 1, 0): [8], ("in", 1, -1): [1]}  # fmt: skip
    assert upstream_of(base + (4095 << UPSTREAM_BITS) + 12) == 4095
