"""Warm standbys (KIP-708 placement) on the real runtime: after an instance is lost, a task
promoted to its warm standby replays only the tail of the changelog; without a standby it
replays all of it. Both end with the same, correct output."""

from __future__ import annotations

import time
import uuid

import pytest

from streamplatform.placement import plan_standbys
from streamplatform.runtime.changelog import TASK_OFFSETS
from streamplatform.runtime.microbatch import StreamingJob

from .support import dedup_topology, delta_rows, expected_with_the_test_driver, job_config

pytestmark = [pytest.mark.broker, pytest.mark.spark]

INSTANCES = {"i0": {"zone": "a"}, "i1": {"zone": "b"}, "i2": {"zone": "c"}}
ACTIVE = {"0_0": "i0", "0_1": "i1", "0_2": "i2"}


def _changelog_rows(spark, root, app, task, up_to_batch, after_batch=-1):
    """The task's store writes in the changelog (restored_records counts these; the rows of
    the task's stream time and schedule are applied as offsets)."""
    changelog = spark.read.format("delta").load(f"{root}/{app}/_changelog")
    return changelog.where(
        f"task = '{task}' AND batch_id > {after_batch} AND batch_id <= {up_to_batch} "
        f"AND column_family != '{TASK_OFFSETS}'"
    ).count()


@pytest.fixture(params=["local", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.slow])])
def root(request, tmp_path) -> dict:
    """The Delta root: a local directory, or the local S3 server (the standbys, on Spark's
    workers, read the changelog's files from there)."""
    if request.param == "local":
        return {"platform.delta.root": f"{tmp_path}/delta"}
    server = request.getfixturevalue("s3_server")
    return {"platform.delta.root": f"s3://{server.bucket}/standby-{uuid.uuid4().hex[:6]}",
            **server.settings}  # fmt: skip


def _fail_over(spark, kafka_settings, source_topic, tmp_path, standbys: int, root: dict):
    source, sent = source_topic
    app = f"failover-{standbys}-{uuid.uuid4().hex[:4]}"
    placement = plan_standbys(INSTANCES, ACTIVE, standbys, ["zone"])
    config = (
        job_config(kafka_settings, tmp_path, app, source, **{"platform.max.records.per.batch": 20})
        | root
    )
    job = StreamingJob(dedup_topology(source, "out"), config, spark=spark, delta_sinks=["out"],
                       placement=placement)  # fmt: skip
    job.run(max_batches=2)  # batches 0 and 1; standbys replay each after its commit
    job.keep_standbys_warm = False
    job.run(max_batches=1)  # batch 2 commits, and i0 is lost before its standby sees it
    moved = job.fail_instance("i0")
    started = time.perf_counter()
    after = job.run_until_caught_up()
    elapsed = time.perf_counter() - started
    job.close()
    rows = delta_rows(spark, f"{root['platform.delta.root']}/{app}/out")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    return app, moved, after, elapsed


def test_a_warm_standby_replays_only_the_tail_a_cold_move_replays_everything(
    spark, kafka_settings, source_topic, tmp_path, root
):
    warm_app, warm_moved, warm_after, warm_seconds = _fail_over(
        spark, kafka_settings, source_topic, tmp_path, standbys=1, root=root
    )
    assert warm_moved["0_0"][1] is True  # promoted to its standby
    tables = root["platform.delta.root"]
    tail = _changelog_rows(spark, tables, warm_app, "0_0", up_to_batch=2, after_batch=1)
    assert warm_after[0].restored_records == tail > 0

    cold_app, cold_moved, cold_after, cold_seconds = _fail_over(
        spark, kafka_settings, source_topic, tmp_path, standbys=0, root=root
    )
    assert cold_moved["0_0"][1] is False  # no standby: moved to an empty instance
    everything = _changelog_rows(spark, tables, cold_app, "0_0", up_to_batch=2)
    assert cold_after[0].restored_records == everything > tail
    print(
        f"\nfailover of task 0_0 at batch 3: warm standby replayed {tail} changelog rows "
        f"(first batch after failover {warm_after[0].duration_ms} ms, catch-up {warm_seconds:.1f} s); "
        f"cold move replayed {everything} rows ({cold_after[0].duration_ms} ms, {cold_seconds:.1f} s)"
    )
