"""The driver's small Delta appends (delta-rs): once per (transaction id, version), readable back.

Spark honouring these transactions (a batch re-run on the cached path skipping what delta-rs
wrote) is covered by the crash tests in test_streaming_job.py, which re-run a streamed batch.
"""

from __future__ import annotations

import pyarrow as pa

from streamplatform.runtime import delta_direct
from streamplatform.runtime.logs import CommitLog, OffsetLog, PlannedBatch

SCHEMA = pa.schema([("task", pa.string()), ("batch_id", pa.int64()), ("value", pa.binary())])


def _rows(batch_id: int, *tasks: str) -> pa.Table:
    return pa.table(
        {"task": list(tasks), "batch_id": [batch_id] * len(tasks), "value": [b"v"] * len(tasks)},
        SCHEMA,
    )


def test_an_append_is_written_once_per_version_and_read_back(tmp_path):
    path = str(tmp_path / "table")
    assert delta_direct.transaction_version(path, "app-x") is None
    assert delta_direct.read(path).num_rows == 0  # no table yet

    assert delta_direct.append(path, _rows(0, "0_0", "0_1"), "app-x", 0, ["task"])
    assert not delta_direct.append(path, _rows(0, "0_0", "0_1"), "app-x", 0, ["task"])  # replay
    assert delta_direct.append(path, _rows(1, "0_1"), "app-x", 1, ["task"])
    assert not delta_direct.append(path, _rows(0, "0_0"), "app-x", 0, ["task"])  # older

    assert delta_direct.transaction_version(path, "app-x") == 1
    assert delta_direct.read(path).num_rows == 3
    assert delta_direct.read(path, [("batch_id", "=", 1)]).column("task").to_pylist() == ["0_1"]
    files = delta_direct.live_files(path)
    assert len(files) == 3 and all(
        "/task=0_" in file for file in files
    )  # a file per task and append


def test_the_offset_and_commit_logs_round_trip(tmp_path):
    offsets = OffsetLog(str(tmp_path / "_offsets"), "app")
    commits = CommitLog(str(tmp_path / "_commits"), "app")
    assert offsets.planned(0) is None and commits.last() is None

    assert offsets.append(0, {("t", 1): (0, 5), ("t", 0): (3, 9)}, "f1")
    # A second plan of a batch is not logged, and says so: the first one holds.
    assert not offsets.append(0, {("t", 0): (99, 100)}, "f2")
    assert offsets.planned(0) == PlannedBatch({("t", 0): (3, 9), ("t", 1): (0, 5)}, "f1")
    assert offsets.planned(1) is None

    metrics = {"records_in": 10, "dedup_dropped": 2}
    commits.append(0, {("t", 0): 9, ("t", 1): 4}, metrics, "at_least_once")
    commits.append(1, {("t", 0): 9, ("t", 1): 5}, {"records_in": 1}, "exactly_once_v2")
    last = commits.last()
    assert last is not None
    assert (last.batch_id, last.consumed, last.metrics, last.guarantee) == (
        1, {("t", 0): 9, ("t", 1): 5}, {"records_in": 1}, "exactly_once_v2"
    )  # fmt: skip


def test_a_commit_log_from_before_the_guarantee_column_gains_it(tmp_path):
    path = str(tmp_path / "_commits")
    old = pa.table({"batch_id": [0], "consumed": ["[]"], "metrics": ["{}"]})
    delta_direct.append(path, old, "app-commits", 0)
    commits = CommitLog(path, "app")
    assert commits.last().guarantee is None  # older rows read it as null
    commits.append(1, {("t", 0): 3}, {}, "at_least_once")
    assert commits.last().guarantee == "at_least_once"


def test_an_offset_log_from_before_fingerprints_gains_the_column(tmp_path):
    path = str(tmp_path / "_offsets")
    old = pa.table({"batch_id": [0], "topic": ["t"], "partition": pa.array([0], pa.int32()),
                    "start_offset": [0], "end_offset": [5]})  # fmt: skip
    delta_direct.append(path, old, "app-offsets", 0)
    offsets = OffsetLog(path, "app")
    assert offsets.planned(0) == PlannedBatch({("t", 0): (0, 5)}, None)  # replayable by any job
    assert offsets.append(1, {("t", 0): (5, 9)}, "f1")
    assert offsets.planned(1) == PlannedBatch({("t", 0): (5, 9)}, "f1")
