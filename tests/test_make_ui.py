"""`make ui`, a run launched from it, then Ctrl-C: nothing of the session is left running — not
dagster dev, its code server, the daemon, the run's worker process or the run's Spark JVM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import demo
from streamplatform.kafka import LocalBroker
from webui import GraphQL, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) { __typename ... on LaunchRunSuccess { run { runId } } } }"""
STATUS = "query S($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"


def descendants(root: int) -> dict[int, str]:
    """``{pid: command line}`` of every live process under ``root`` (zombies left out)."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for process in psutil.process_iter(["ppid", "status", "cmdline"]):
        if process.info["status"] in (psutil.STATUS_ZOMBIE, None) or process.info["ppid"] is None:
            continue
        children.setdefault(process.info["ppid"], []).append(process.pid)
        commands[process.pid] = " ".join(process.info["cmdline"] or [])
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = commands.get(child, "")
            todo.append(child)
    return found


def alive(pids) -> list[int]:
    """Those of ``pids`` still running (a zombie only waits to be reaped: gone)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            continue
    return running


@pytest.mark.slow  # ~60 s: make ui, a run that starts Spark, Ctrl-C
@pytest.mark.dagster_dev
def test_ctrl_c_on_make_ui_leaves_no_process_of_the_session(tmp_path):
    port = free_port()
    with LocalBroker(tmp_path / "broker") as broker:
        demo.produce_data(2_000, broker.bootstrap_servers)
        env = os.environ | {
            "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "STREAMPLATFORM_DATA": str(tmp_path / "data"),
            "SPARK_MASTER": "local[1]",
        }
        log = (tmp_path / "make-ui.log").open("wb")
        make = subprocess.Popen(
            ["make", "--no-print-directory", "ui", f"UI_PORT={port}",
             f"UI_HOME={tmp_path / 'dagster'}"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            graphql = GraphQL(f"http://127.0.0.1:{port}/graphql")
            wait_for("the code location", lambda: graphql(
                "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus } } } }"
            )["workspaceOrError"]["locationEntries"][0]["loadStatus"] == "LOADED", 180,
                tmp_path / "make-ui.log")  # fmt: skip
            params = {"selector": {"repositoryLocationName": "streamplatform",
                                   "repositoryName": "__repository__", "jobName": "__ASSET_JOB",
                                   "assetSelection": [  # the job's asset and the topic it writes
                                       {"path": ["transactions_deduplicated"]},
                                       {"path": ["kafka", "transactions-deduplicated"]}]}}  # fmt: skip
            launched = graphql(LAUNCH, params=params)["launchRun"]
            assert launched["__typename"] == "LaunchRunSuccess", launched
            run_id = launched["run"]["runId"]

            def spark_jvm() -> dict[int, str]:
                return {p: c for p, c in descendants(make.pid).items()
                        if "java" in c and "SparkSubmit" in c}  # fmt: skip

            wait_for("the run's Spark JVM", spark_jvm, 180, tmp_path / "make-ui.log")
            # The run is in flight when Ctrl-C comes. Its status may trail its worker on a
            # loaded machine (seen: QUEUED with the run's JVM up): wait for it to say so.
            wait_for("the run's status STARTED", lambda: graphql(STATUS, id=run_id)[
                "runOrError"]["status"] == "STARTED", 60, tmp_path / "make-ui.log")  # fmt: skip
            session = descendants(make.pid)
            # Ctrl-C in a terminal: SIGINT to the foreground process group.
            os.killpg(make.pid, signal.SIGINT)
            make.wait(180)  # dagster dev up to 60 s, then SIGTERM and SIGKILL up to 20 s each
            deadline = time.monotonic() + 30
            while alive(session) and time.monotonic() < deadline:
                time.sleep(0.5)
            left = {pid: session[pid] for pid in alive(session)}
            assert left == {}, f"left running after Ctrl-C: {left}"
        finally:
            # Listed before make goes: its descendants are then re-parented, out of reach.
            session = descendants(make.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(make.pid, signal.SIGKILL)
            for pid in alive(session):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            log.close()
