"""Continuous mode (`streamplatform run`, StreamingJob.run_forever): SIGTERM in the middle of a
batch lets that batch finish and commit, the process exits 0, a second driver started meanwhile
is refused with exit code 3, and a restart goes on with nothing lost or doubled."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from streamplatform.runtime.logs import CommitLog, OffsetLog
from streamplatform.runtime.microbatch import StreamingJob

from .support import (
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    job_config,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]
TESTS = Path(__file__).resolve().parents[1]
JOB_MODULE = """
from runtime.support import dedup_topology


def topology():
    return dedup_topology({source!r}, "deduplicated")
"""


def _run_command(config: dict, tmp_path: Path, *options: str) -> list[str]:
    settings = [arg for key, value in config.items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "streamplatform.cli", "run", "--topology", "cli_job:topology",
            *settings, "--delta-sink", "deduplicated", *options]  # fmt: skip


@pytest.mark.slow  # ~50 s: a driver process with its own Spark, a refused one, the restart
@pytest.mark.child_process
def test_sigterm_mid_batch_finishes_the_batch_and_a_restart_loses_and_doubles_nothing(
    spark, kafka_settings, source_topic, tmp_path
):
    source, sent = source_topic
    app = f"continuous-{uuid.uuid4().hex[:4]}"
    config = job_config(kafka_settings, tmp_path, app, source)
    (tmp_path / "cli_job.py").write_text(JOB_MODULE.format(source=source))
    pause = tmp_path / "pause"
    pause.mkdir()
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(tmp_path)]),
        "STREAMPLATFORM_PAUSE": "after_outputs:1",  # batch 1 held before its commit
        "STREAMPLATFORM_PAUSE_DIR": str(pause),
    }
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(_run_command(config, tmp_path), env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_for("batch 1 to reach its pause", (pause / "paused").exists, log)
        # A second driver of the same job is refused at once, with the exit code for it.
        second = subprocess.run(_run_command(config, tmp_path), env=env, capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert second.returncode == 3, second.stderr[-3000:]
        assert "the job is held by" in second.stderr and app in second.stderr
        driver.send_signal(signal.SIGTERM)  # mid-batch: outputs written, not committed
        wait_for("the driver to take the SIGTERM", lambda: "SIGTERM received" in
                  log.read_text(), log)  # fmt: skip
        (pause / "resume").touch()
        code = driver.wait(120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # its Spark JVM
        driver.wait(60)
    output = log.read_text()
    assert code == 0, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("batch ")]
    assert [line.split(":")[0] for line in lines] == ["batch 0", "batch 1"], lines
    root = f"{tmp_path}/delta/{app}"
    last = CommitLog(f"{root}/_commits", app).last()
    assert last is not None and last.batch_id == 1  # the batch in flight committed
    assert OffsetLog(f"{root}/_offsets", app).planned(2) is None  # and no other started

    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    results = job.run_until_caught_up()
    job.close()
    assert results and results[0].batch_id == 2 and not results[0].replayed
    rows = delta_rows(spark, f"{root}/deduplicated")
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows), "a record written twice"
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
