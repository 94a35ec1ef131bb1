"""The direct-stages path's hand-off of repartitioned records, without Spark: the driver numbers
the rows every upstream task wrote (paths/direct_stages.number_repartitioned) and each
downstream task builds its input queues from its partition's rows
(repartition_buffer.queues_of). Each upstream task's records keep the order it wrote them in,
whatever order the tasks' rows came back in; the offsets say batch, upstream task and place."""

from __future__ import annotations

import pickle

import pyarrow as pa

from streamplatform.records import NO_HEADERS
from streamplatform.runtime.paths.direct_stages import number_repartitioned
from streamplatform.runtime.repartition_buffer import queues_of, upstream_of
from streamplatform.runtime.rows import OUTPUT_ARROW, output_batch

REPARTITION = "app-KSTREAM-COUNT-0000000002-repartition"


def written(task: str, records: list[tuple[int, bytes, int]], headers=None) -> pa.RecordBatch:
    """Task ``task``'s rows for the repartition topic: (partition, key, timestamp) each."""
    return output_batch(
        len(records), kind="sink", topic=REPARTITION, task=task,
        partition=[p for p, _, _ in records], key=[k for _, k, _ in records],
        value=[b"v-" + k for _, k, _ in records], timestamp=[t for _, _, t in records],
        headers=headers or [[] for _ in records],
    )  # fmt: skip


def test_each_upstream_tasks_records_keep_their_order_and_are_numbered_by_batch_and_task():
    # The tasks' rows come back interleaved and out of task order (as Spark returns them).
    rows = pa.Table.from_batches([
        written("0_2", [(1, b"c1", 30), (0, b"c0", 10)]),
        written("0_0", [(0, b"a0", 50), (1, b"a1", 5), (0, b"a2", 7)]),
        written("0_2", [(0, b"c2", 1)]),
    ], OUTPUT_ARROW)  # fmt: skip
    tables = number_repartitioned(rows, batch_id=3)
    assert set(tables) == {REPARTITION} and set(tables[REPARTITION]) == {0, 1}

    partition_0 = queues_of(tables[REPARTITION][0])
    assert list(partition_0) == [(REPARTITION, 0, 0), (REPARTITION, 0, 2)]
    keys = {queue: [r[4] for r in records] for queue, records in partition_0.items()}
    assert keys == {(REPARTITION, 0, 0): [b"a0", b"a2"], (REPARTITION, 0, 2): [b"c0", b"c2"]}
    a0, a2 = partition_0[(REPARTITION, 0, 0)]
    base = 3 << 40
    assert [a0[2], a2[2]] == [base, base + 1]  # n counts within the task's queue
    c0, c2 = partition_0[(REPARTITION, 0, 2)]
    assert [c0[2], c2[2]] == [base + (2 << 28), base + (2 << 28) + 1]
    assert [upstream_of(r[2]) for r in (a0, c2)] == [0, 2]
    assert a0 == (REPARTITION, 0, base, 50, b"a0", b"v-a0", NO_HEADERS)  # ConsumedRecord's layout

    partition_1 = queues_of(tables[REPARTITION][1])
    assert {q: [r[4] for r in rs] for q, rs in partition_1.items()} == {
        (REPARTITION, 1, 0): [b"a1"], (REPARTITION, 1, 2): [b"c1"],
    }  # fmt: skip


def test_headers_cross_and_a_partitions_rows_ship_alone():
    rows = pa.Table.from_batches([
        written("0_1", [(0, b"h", 1), (1, b"n", 2)],
                headers=[[{"key": "trace", "value": b"x"}], []]),
        written("0_0", [(1, b"m", 3)] * 5000),
    ], OUTPUT_ARROW)  # fmt: skip
    tables = number_repartitioned(rows, batch_id=0)
    (record,) = queues_of(tables[REPARTITION][0])[(REPARTITION, 0, 1)]
    assert record[6] == [("trace", b"x")]
    assert queues_of(tables[REPARTITION][1])[(REPARTITION, 1, 1)][0][6] == NO_HEADERS
    # A copy, not a slice of the stage's rows: partition 0's task is not sent partition 1's.
    assert len(pickle.dumps(tables[REPARTITION][0])) < 10_000


def test_no_rows_no_queues():
    assert number_repartitioned(OUTPUT_ARROW.empty_table(), batch_id=0) == {}
    assert queues_of(None) == {}
