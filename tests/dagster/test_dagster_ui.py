"""The UI end to end: `dagster dev` serves the code location, a materialization launched through
the GraphQL API succeeds, and headless Debian chromium renders the asset's page with the asset
names and the run's metadata.

`dagster dev` runs in a process group of its own (it leaves children behind on SIGTERM
otherwise) and the whole group is stopped at the end, also when the test fails; so is chromium.
The run materializes ``standby_placements``: a real run (its own process, its own SparkSession,
a Delta table under a temporary ``STREAMPLATFORM_DATA``) that needs no topic. Slow: ~1 minute.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from websockets.sync.client import connect

pytestmark = [pytest.mark.broker, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).with_name("dagster")
ASSET = "standby_placements"
LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
    ... on PipelineNotFoundError { message }
  }
}"""
STATUS = """
query Status($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run { status } } }"""
LOCATIONS = """
{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
METADATA = """
query Meta($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset {
  assetMaterializations(limit: 1) { runId metadataEntries { label
    ... on IntMetadataEntry { intValue } ... on PathMetadataEntry { path } } } } } }"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_group(process: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """SIGINT the process group (dagster dev shuts its services down on it; on SIGTERM it would
    leave children behind), SIGKILL whatever is left after ``timeout_s``, wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(5)
    deadline = time.monotonic() + 10
    while live_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)


def live_members(group_id: int) -> list[int]:
    """Processes of a process group still running (zombies waiting to be reaped excluded)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group_id and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


@contextlib.contextmanager
def group(command: list[str], log: Path, **kwargs: Any) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, **kwargs)  # fmt: skip
        try:
            yield process
        finally:
            stop_group(process)


class GraphQL:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        response = requests.post(self.url, json={"query": query, "variables": variables},
                                 timeout=30)  # fmt: skip
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body["errors"]
        return body["data"]


def wait_for(what: str, check: Any, timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            result = check()
            if result:
                return result
        time.sleep(1)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}; log tail:\n{tail}")


class Browser:
    """Headless chromium driven over the DevTools protocol (navigate, read the DOM, shoot)."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=30))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def text(self) -> str:
        result = self.call("Runtime.evaluate", expression="document.body.innerText",
                           returnByValue=True)  # fmt: skip
        return str(result["result"].get("value") or "")


@pytest.fixture
def chromium(tmp_path) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is absent: install Debian's chromium (apt-get install -y chromium)"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    port = free_port()
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--window-size=1600,1200", f"--user-data-dir={tmp_path / 'chrome'}",
               f"--remote-debugging-port={port}", "about:blank"]  # fmt: skip
    with group(command, tmp_path / "chromium.log") as process:
        log = tmp_path / "chromium.log"

        def page() -> str | None:
            assert process.poll() is None, "chromium exited"
            targets = requests.get(f"http://127.0.0.1:{port}/json", timeout=5).json()
            pages = [t for t in targets if t.get("type") == "page"]
            return pages[0]["webSocketDebuggerUrl"] if pages else None

        endpoint = wait_for("chromium's DevTools endpoint", page, 30, log)
        with connect(endpoint, max_size=None) as socket:
            yield Browser(socket)


def test_ui_materializes_through_graphql_and_renders_the_asset(chromium, kafka_settings, tmp_path):
    home, data = tmp_path / "dagster_home", tmp_path / "data"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = os.environ | {
        "DAGSTER_HOME": str(home),
        "STREAMPLATFORM_DATA": str(data),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings["bootstrap.servers"],
        "SPARK_MASTER": "local[1]",
    }
    port, log = free_port(), tmp_path / "dagster-dev.log"
    base = f"http://127.0.0.1:{port}"
    command = [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    with group(command, log, cwd=ROOT, env=env) as dagster_dev:
        graphql = GraphQL(f"{base}/graphql")

        def location_loaded() -> bool:
            assert dagster_dev.poll() is None, "dagster dev exited"
            entries = graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
            errors = [e["locationOrLoadError"] for e in entries
                      if e["locationOrLoadError"]["__typename"] == "PythonError"]  # fmt: skip
            assert not errors, errors
            return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)

        wait_for("the code location to load", location_loaded, 120, log)
        params = {"selector": {"repositoryLocationName": "streamplatform",
                               "repositoryName": "__repository__", "jobName": "__ASSET_JOB",
                               "assetSelection": [{"path": [ASSET]}]}}  # fmt: skip
        launched = graphql(LAUNCH, params=params)["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]

        def finished() -> str | None:
            status = graphql(STATUS, runId=run_id)["runOrError"]["status"]
            return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None

        assert wait_for(f"run {run_id}", finished, 240, log) == "SUCCESS"
        # The run's own process started a SparkSession and the Spark resource stopped it.
        wait_for("the Spark resource's teardown", lambda: "Stopped the SparkSession this run "
                 "started." in log.read_text(errors="replace"), 30, log)  # fmt: skip
        [event] = graphql(METADATA, path=[ASSET])["assetOrError"]["assetMaterializations"]
        assert event["runId"] == run_id
        metadata = {e["label"]: e.get("intValue", e.get("path")) for e in event["metadataEntries"]}
        assert metadata["generation"] == 1 and metadata["tasks"] == 6
        assert str(metadata["placements_table"]).startswith(str(data))

        chromium.call("Page.enable")
        chromium.call("Page.navigate", url=f"{base}/assets/{ASSET}")
        table = str(metadata["placements_table"])
        wanted = [ASSET, "Latest materialization", "placements_table", "level_absolute", table]

        seen = {"text": ""}

        def rendered() -> str | None:
            seen["text"] = text = chromium.text()
            return text if all(w in text for w in wanted) else None

        try:
            wait_for(f"the asset page to show {wanted}", rendered, 90, log)
        except pytest.fail.Exception:
            print(f"The asset page showed:\n{seen['text'][:5000]}")
            raise
        chromium.call("Page.navigate", url=f"{base}/runs/{run_id}")
        on_run_page = [run_id[:8], ASSET, "Materialized value standby_placements"]
        wait_for(f"the run page to show {on_run_page}",
                 lambda: all(w in chromium.text() for w in on_run_page), 90, log)  # fmt: skip
        chromium.call("Page.navigate", url=f"{base}/assets")
        names = ("transactions_deduplicated", "fx_rate_versions", "transactions_enriched",
                 "dlq_records", "stream_offsets", ASSET)  # fmt: skip
        seen["text"] = ""

        def catalog() -> bool:
            seen["text"] = chromium.text()
            return all(name in seen["text"] for name in names)

        try:
            wait_for(f"the asset catalog to list {names}", catalog, 90, log)
        except pytest.fail.Exception:
            print(f"The catalog showed:\n{seen['text'][:5000]}")
            raise
        shot = chromium.call("Page.captureScreenshot", format="png")["data"]
        (tmp_path / "asset-catalog.png").write_bytes(base64.b64decode(shot))
        assert (tmp_path / "asset-catalog.png").stat().st_size > 10_000
    assert dagster_dev.poll() is not None
    assert live_members(dagster_dev.pid) == [], "dagster dev's group outlived the test"
    shutil.rmtree(home, ignore_errors=True)
