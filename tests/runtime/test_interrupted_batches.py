"""A team's own job in continuous mode (`streamplatform run`), interrupted by two SIGTERMs in
the middle of a batch at each step — planning, the tasks, the outputs, before the commit — then
run again: under both guarantees the store's counts and the dedup's decisions are those of an
uninterrupted run, and under exactly_once_v2 (and, idempotent by batch, in Delta under both)
every output is there once.

The steps are reached deterministically: the driver (or, for the tasks, each Spark task) holds
at the step (``STREAMPLATFORM_PAUSE``) until both signals were sent, then goes on into them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pyspark import cloudpickle

from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime.logs import CommitLog
from streamplatform.runtime.microbatch import StreamingJob

from . import pageviews as pageviews_module
from .pageviews import (
    PARTITIONS,
    counts_per_user,
    duplicates_in,
    expected_counts,
    make_views,
    pageviews,
    produce_views,
)
from .support import read_topic, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]
cloudpickle.register_pickle_by_value(pageviews_module)  # see test_users_own_job.py
TESTS = Path(__file__).resolve().parents[1]
VIEWS = 120  # 60 per partition, 20 per batch and partition: batches 0, 1, 2
JOB_MODULE = """
from runtime.pageviews import pageviews


def topology():
    return pageviews({views!r}, {counts!r}, "deduplicated")
"""


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
@pytest.mark.parametrize("step", ["after_plan", "during_tasks", "during_outputs", "after_outputs"])
@pytest.mark.child_process
def test_two_sigterms_mid_batch_then_a_run_again_equal_an_uninterrupted_run(
    spark, kafka_settings, tmp_path, guarantee, step
):
    suffix = uuid.uuid4().hex[:6]
    views_topic, counts_topic = f"views-{suffix}", f"counts-{suffix}"
    create_topics(kafka_settings, [TopicSpec(views_topic, PARTITIONS),
                                   TopicSpec(counts_topic, PARTITIONS)])  # fmt: skip
    views = make_views(VIEWS)
    produce_views(kafka_settings, views_topic, views)
    app = f"interrupted-{suffix}"
    config = {
        "application.id": app,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": guarantee,
        "state.dir": str(tmp_path / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        "platform.max.records.per.batch": 20,
    }
    (tmp_path / "cli_job.py").write_text(JOB_MODULE.format(views=views_topic, counts=counts_topic))
    pause = tmp_path / "pause"
    pause.mkdir()
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(tmp_path)]),
        "STREAMPLATFORM_PAUSE": f"{step}:1",  # batch 0 commits; batch 1 is interrupted
        "STREAMPLATFORM_PAUSE_DIR": str(pause),
    }
    settings = [arg for key, value in config.items() for arg in ("--set", f"{key}={value}")]
    command = [sys.executable, "-m", "streamplatform.cli", "run", "--topology",
               "cli_job:topology", *settings, "--delta-sink", "deduplicated"]  # fmt: skip
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_for(f"batch 1 to reach {step}", (pause / "paused").exists, log)
        driver.send_signal(signal.SIGTERM)
        wait_for("the first SIGTERM", lambda: "SIGTERM received" in log.read_text(), log)
        driver.send_signal(signal.SIGTERM)  # interrupts the batch where it is held
        wait_for("the second SIGTERM", lambda: "interrupted" in log.read_text(), log)
        (pause / "resume").touch()  # what was held at the step ends (or is abandoned)
        code = driver.wait(180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # its Spark JVM and Python workers
        driver.wait(60)
    output = log.read_text()
    assert code == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    root = f"{tmp_path}/delta/{app}"
    assert CommitLog(f"{root}/_commits", app).last().batch_id == 0  # batch 1 never committed

    job = StreamingJob(pageviews(views_topic, counts_topic, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert [(r.batch_id, r.replayed) for r in results] == [(1, True), (2, False)]

    expected = expected_counts(views)
    counts = counts_per_user(read_topic(kafka_settings, counts_topic))
    if guarantee == "exactly_once_v2":
        assert counts == expected  # each count once, in order
    else:
        # Counts may repeat (the interrupted attempt's sends), but they are the uninterrupted
        # run's numbers: the replay started from the state of batch 0's commit.
        for user, seen in counts.items():
            assert sorted(set(seen)) == expected[user], user
            assert seen[-1] == expected[user][-1], user
    # The dedup's decisions: every batch's drops, batch 0's from its commit-log row.
    commits = spark.read.format("delta").load(f"{root}/_commits").where("batch_id = 0").collect()
    dropped = commits[0].duplicates_dropped + sum(r.duplicates_dropped for r in results)
    assert dropped == duplicates_in(views)
    rows = spark.read.format("delta").load(f"{root}/deduplicated").collect()
    assert len({(r.source_partition, r.source_offset) for r in rows}) == len(rows)
    assert len(rows) == sum(len(v) for v in expected.values())
