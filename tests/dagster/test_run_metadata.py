"""The streaming assets' run metadata sums the batches' numbers (no Spark, no Kafka)."""

from __future__ import annotations

from streamplatform.dagster.factory import run_metadata
from streamplatform.runtime.microbatch import BatchResult


def result(batch_id: int, **metrics: int) -> BatchResult:
    return BatchResult(batch_id, 10, 9, 0, 1, 0, 0, 100, False, "exactly_once_v2", metrics)


def test_offset_gaps_and_skipped_offsets_are_summed_into_the_metadata():
    metadata = run_metadata(
        [result(0, offset_gaps=6, offsets_skipped=0), result(1, offset_gaps=2, offsets_skipped=3)],
        2.0,
        {("t", 0): 20},
        {"t/0": 0},
    )
    assert (metadata["offset_gaps"], metadata["offsets_skipped"]) == (8, 3)
    assert metadata["batch_ids"].value == [0, 1] and metadata["rows_in"] == 20


def test_kept_tasks_and_tasks_run_in_the_driver_are_summed_into_the_metadata():
    metadata = run_metadata(
        [result(0, tasks_reused=0, tasks_in_driver=3), result(1, tasks_reused=3, tasks_in_driver=3),
         result(2, tasks_reused=1, tasks_in_driver=0)],
        3.0,
        {("t", 0): 30},
        {"t/0": 0},
    )  # fmt: skip
    assert (metadata["tasks_reused"], metadata["tasks_in_driver"]) == (4, 6)


def test_the_metadata_counts_the_batches_of_each_execution_path():
    def on(batch_id: int, path: str) -> BatchResult:
        return BatchResult(batch_id, 1, 1, 0, 0, 0, 0, 10, False, "exactly_once_v2", path=path)

    metadata = run_metadata(
        [on(0, "direct-spark"), on(1, "direct-driver"), on(2, "direct-driver")],
        1.0, {("t", 0): 3}, {"t/0": 0},
    )  # fmt: skip
    assert metadata["execution_paths"].value == {"direct-driver": 2, "direct-spark": 1}


def test_records_dropped_by_aggregations_are_summed_into_the_metadata():
    metadata = run_metadata([result(0, dropped_records=4), result(1), result(2, dropped_records=1)],
                            1.0, {("t", 0): 30}, {"t/0": 0})  # fmt: skip
    assert metadata["dropped_records"] == 5


def test_dedup_spills_are_summed_into_the_metadata():
    metadata = run_metadata([result(0, dedup_spills=2), result(1), result(2, dedup_spills=1)],
                            1.0, {("t", 0): 30}, {"t/0": 0})  # fmt: skip
    assert metadata["dedup_spills"] == 3
