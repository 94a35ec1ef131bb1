"""A real Spark standalone cluster from the pyspark wheel (streamplatform.local_cluster): a job
from a separate driver process runs on both workers' executors, each executor's Python workers
see their own worker's environment, killing a worker takes its whole process tree with it and
the master notices, and stopping the cluster leaves no process behind."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from streamplatform.local_cluster import LocalCluster

from .support import running_pids

pytestmark = [pytest.mark.slow]

# The driver runs in a process of its own: the pytest process may already host a local
# SparkSession, and a process has only one JVM. It answers commands on stdin with one JSON line
# each: "probe" runs a job of 8 partitions and reports what each partition's Python worker saw.
DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    from pyspark.sql import SparkSession
    from streamplatform.spark import spark_conf

    master, executors = sys.argv[1], int(sys.argv[2])
    extra = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.python": sys.executable,
        "spark.ui.enabled": "false",
    }
    builder = SparkSession.builder
    for key, value in spark_conf(master=master, app_name="local-cluster-test", extra=extra).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    # A standalone application runs tasks as soon as one executor is up: wait for all of them
    # (the block managers' count includes the driver's).
    deadline = time.monotonic() + 120
    while sc._jsc.sc().getExecutorMemoryStatus().size() < executors + 1:
        if time.monotonic() > deadline:
            raise SystemExit("executors did not register")
        time.sleep(0.1)

    def probe(_):
        time.sleep(0.3)  # long enough that one executor cannot take every task
        yield {
            "state_dir": os.environ.get("STREAMPLATFORM_STATE_DIR"),
            "executor_dirs": os.environ.get("SPARK_EXECUTOR_DIRS"),
        }

    print(json.dumps({"ready": True}), flush=True)
    for command in sys.stdin:
        if command.strip() == "probe":
            rows = sc.parallelize(range(8), 8).mapPartitions(probe).collect()
            print(json.dumps({"rows": rows}), flush=True)
        else:
            break
    spark.stop()
    """
)


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _running_in(folder: Path) -> set[int]:
    """Processes whose working directory is ``folder`` (every daemon of a cluster runs in its
    work_dir)."""
    found = set()
    for process in psutil.process_iter():
        try:
            if Path(process.cwd()) == folder:
                found.add(process.pid)
        except psutil.Error:
            continue
    return running_pids(found)


def _eventually(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.2)


class _Driver:
    """The driver subprocess: commands in on stdin, JSON answers out on stdout."""

    def __init__(self, tmp_path: Path, master_url: str, executors: int) -> None:
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        env = dict(os.environ, STREAMPLATFORM_DATA=str(tmp_path / "data"))
        env.pop("STREAMPLATFORM_STATE_DIR", None)
        self.log = tmp_path / "driver.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(script), master_url, str(executors)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)

    def answer(self, timeout_s: float = 180) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=1)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if line.startswith("{"):
                return json.loads(line)
        tail = self.log.read_text(errors="replace")[-4000:]
        pytest.fail(f"no answer from the driver (exit code {self.process.poll()}):\n{tail}")

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send("stop")
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


@pytest.mark.cluster
@pytest.mark.child_process
def test_two_workers_env_kill_and_stop(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", workers=2, start_timeout_s=120)
    seen: set[int] = set()
    with cluster:
        assert cluster.master_url.startswith("spark://127.0.0.1:")
        assert cluster.alive_workers() == 2
        states = [str(folder / "state") for folder in cluster.worker_dirs]
        locals_ = [str(folder / "local") for folder in cluster.worker_dirs]

        driver = _Driver(tmp_path, cluster.master_url, executors=2)
        try:
            assert driver.answer() == {"ready": True}
            driver.send("probe")
            rows = driver.answer()["rows"]
            # Both executors ran tasks, and each partition's Python worker saw the environment
            # of the worker that launched its executor (not the driver's: it has none).
            assert {row["state_dir"] for row in rows} == set(states)
            executor_dirs = {row["executor_dirs"] for row in rows}
            assert len(executor_dirs) == 2
            for row in rows:
                worker = states.index(row["state_dir"])
                assert row["executor_dirs"].startswith(locals_[worker] + os.sep)

            # While the application runs, worker 0's tree holds the worker JVM, its executor JVM
            # and pyspark's Python daemon (which leads a process group of its own).
            seen |= cluster.pids()
            worker0 = cluster.pids(0)
            assert any("pyspark.daemon" in _cmdline(pid) for pid in worker0), worker0
            assert any("CoarseGrainedExecutorBackend" in _cmdline(pid) for pid in worker0)

            cluster.kill_worker(0)
            assert not running_pids(worker0), "kill_worker left processes of worker 0"
            _eventually(lambda: cluster.alive_workers() == 1, 60, "the master to drop worker 0")

            # The application goes on with the executor of worker 1.
            driver.send("probe")
            rows = driver.answer()["rows"]
            assert {row["state_dir"] for row in rows} == {states[1]}
            seen |= cluster.pids()
        finally:
            driver.close()
        seen |= cluster.pids()
    assert not running_pids(seen), "processes of the cluster left after stop()"
    assert not _running_in(cluster.work_dir)
    cluster.stop()  # a second stop is harmless
    assert "spark://127.0.0.1:" in (tmp_path / "cluster" / "worker-1.log").read_text()


@pytest.mark.cluster
def test_a_worker_that_cannot_start_stops_the_cluster(tmp_path):
    """A worker that exits during start-up fails start() with its log, and the master and the
    workers already started are stopped."""
    cluster = LocalCluster(tmp_path / "cluster", workers=2, memory_per_worker="lots")
    with pytest.raises(RuntimeError, match="exited with code") as failure:
        cluster.start()
    assert "worker-" in str(failure.value) and "master.log" in str(failure.value)
    assert not _running_in(cluster.work_dir)
    cluster.stop()
