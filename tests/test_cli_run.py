"""`streamplatform run` with Spark, as a supervisor runs it: a second SIGTERM in the middle of a
batch ends the process with exit 130 and one line (no traceback), and the next run replays the
batch; the topology comes from a module in the working directory, without PYTHONPATH."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid

import pytest
from runtime.support import wait_for
from test_cli import console_command, env_without_pythonpath, five_records, team_module

from streamplatform import cli

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


@pytest.mark.timeout(600)
@pytest.mark.child_process
def test_a_second_sigterm_mid_batch_is_exit_130_in_one_line_and_the_batch_is_replayed(
    kafka_settings, topic_name, tmp_path
):
    source, sink = five_records(kafka_settings, topic_name)
    topology = team_module(tmp_path, source, sink)
    app = f"cli-run-{uuid.uuid4().hex[:6]}"
    settings = {
        "application.id": app,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        # No processing.guarantee: the run is exactly once by default, and says so below.
        "platform.delta.root": str(tmp_path / "delta"),
        "state.dir": str(tmp_path / "state"),
        "platform.spark.master": "local[1]",
    }
    command = console_command("run", topology, settings, "--delta-sink", sink)
    pause = tmp_path / "pause"
    pause.mkdir()
    env = env_without_pythonpath()
    held = env | {"STREAMPLATFORM_PAUSE": "after_outputs:0",  # outputs written, not committed
                  "STREAMPLATFORM_PAUSE_DIR": str(pause)}  # fmt: skip
    out, err = tmp_path / "driver.out", tmp_path / "driver.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        driver = subprocess.Popen(command, cwd=tmp_path, env=held, stdout=stdout, stderr=stderr,
                                  start_new_session=True)  # fmt: skip
    try:
        wait_for("batch 0 to reach its pause", (pause / "paused").exists, err)
        driver.send_signal(signal.SIGTERM)
        wait_for("the first SIGTERM", lambda: "SIGTERM received" in err.read_text(), err)
        driver.send_signal(signal.SIGTERM)
        code = driver.wait(120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # its Spark JVM
        driver.wait(60)
    stderr_text = err.read_text()
    assert code == cli.EXIT_INTERRUPTED == 130, stderr_text[-3000:]
    assert out.read_text().splitlines()[:2] == [
        "topology built",
        f"streamplatform run: {app}, processing.guarantee=exactly_once_v2",
    ]
    ours = [line for line in stderr_text.splitlines() if line.startswith("streamplatform run:")]
    assert ours == [
        "streamplatform run: interrupted by a second SIGTERM during batch 0; nothing of it is "
        "committed, the next run replays it (exit 130)"
    ], stderr_text[-3000:]
    assert "Traceback" not in stderr_text, stderr_text[-5000:]

    again = subprocess.run([*command, "--until-caught-up"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    progress = [line for line in again.stdout.splitlines() if line.startswith("batch ")]
    assert progress[0].startswith("batch 0: 5 in, 5 out, ")
    assert progress[0].endswith(" ms, exactly_once_v2 (replayed)")


@pytest.mark.timeout(600)
@pytest.mark.child_process
@pytest.mark.parametrize(
    "point",
    ["start_claimed:start", "start_spark_ready:start", "after_plan:0", "during_tasks:0",
     "after_outputs:0"],
)  # fmt: skip
def test_one_sigterm_at_any_moment_of_the_start_or_a_batch_exits_0_and_loses_nothing(
    spark, kafka_settings, topic_name, tmp_path, point
):
    """The driver is held at ``point`` (its claim taken, Spark not started; Spark started, no
    batch planned; batch 0 planned; half-way through a task; outputs written, not committed),
    gets one SIGTERM there, and is let go: it finishes what is in flight (or starts nothing)
    and exits 0. Before, a SIGTERM during the start interrupted it (exit 130). A second run
    then gives each record once."""
    from delta.tables import DeltaTable

    source, sink = five_records(kafka_settings, topic_name)
    topology = team_module(tmp_path, source, sink)
    app = f"cli-stop-{uuid.uuid4().hex[:6]}"
    settings = {"application.id": app, "bootstrap.servers": kafka_settings["bootstrap.servers"],
                "platform.delta.root": str(tmp_path / "delta"),
                "state.dir": str(tmp_path / "state"), "platform.spark.master": "local[1]"}  # fmt: skip
    command = console_command("run", topology, settings, "--delta-sink", sink)
    pause = tmp_path / "pause"
    pause.mkdir()
    env = env_without_pythonpath()
    held = env | {"STREAMPLATFORM_PAUSE": point, "STREAMPLATFORM_PAUSE_DIR": str(pause)}
    err = tmp_path / "driver.err"
    with err.open("w") as stderr:
        driver = subprocess.Popen(command, cwd=tmp_path, env=held, stdout=subprocess.DEVNULL,
                                  stderr=stderr, start_new_session=True)  # fmt: skip
    try:
        wait_for(f"the driver to reach {point}", (pause / "paused").exists, err)
        driver.send_signal(signal.SIGTERM)
        wait_for("the SIGTERM", lambda: "SIGTERM received" in err.read_text(), err)
        (pause / "resume").touch()
        code = driver.wait(180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # its Spark JVM
        driver.wait(60)
    assert code == cli.EXIT_STOPPED == 0, err.read_text()[-3000:]
    assert "Traceback" not in err.read_text()

    again = subprocess.run([*command, "--until-caught-up"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    table = str(tmp_path / "delta" / app / sink)
    assert DeltaTable.isDeltaTable(spark, table)
    rows = spark.read.format("delta").load(table).collect()
    assert sorted((r.key, r.value) for r in rows) == [
        (f"k{n}".encode(), f"V{n}".encode()) for n in range(5)
    ]
