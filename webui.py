"""Driving the Dagster UI from Python: `dagster dev` and headless chromium, each in a process
group of its own, the webserver's GraphQL API, and chromium over the DevTools protocol.

Shared by the UI test (``tests/dagster/test_dagster_ui.py``) and the README's screenshots
(``docs/screenshots.py``); ``python webui.py dev ARGS`` is what `make ui` runs (:func:`dev`).
The browser parts need the dev extras (``requests``, ``websockets``) and Debian's
``/usr/bin/chromium``. Every process started here leads a process group of its
own, and the whole group is stopped on the way out, also on errors: `dagster dev` leaves
children behind when only its own pid is signalled.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

CHROMIUM = Path("/usr/bin/chromium")
DAGSTER = Path(sys.executable).with_name("dagster")
WEBSERVER = Path(sys.executable).with_name("dagster-webserver")
LOCATIONS = """
{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def live_members(group_id: int, session: bool = False) -> list[int]:
    """Processes of a process group still running (zombies waiting to be reaped excluded);
    ``session=True``: of a session instead. From psutil, on Linux and macOS alike (as
    ``streamplatform``'s own process helpers find theirs)."""
    which = os.getsid if session else os.getpgid
    members = []
    for process in psutil.process_iter(["status"]):
        if process.pid <= 0 or process.info["status"] in (None, psutil.STATUS_ZOMBIE):
            continue  # macOS lists the kernel as pid 0; None: exited, or not to be looked at
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if which(process.pid) == group_id:
                members.append(process.pid)
    return sorted(members)


def end_session(session_id: int, timeout_s: float = 20.0) -> None:
    """SIGTERM every process left in the session, then SIGKILL what outlives ``timeout_s``."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in live_members(session_id, session=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + timeout_s
        while live_members(session_id, session=True) and time.monotonic() < deadline:
            time.sleep(0.2)


def dev(args: list[str]) -> int:
    """`dagster dev ARGS` in a session of its own, ended as a whole (what `make ui` runs).

    Ctrl-C reaches this process, which passes it on to dagster dev (which stops its webserver,
    daemon and code servers) and then ends whatever is left of the session: a run's worker,
    and the run's Spark JVM, which PySpark starts ignoring SIGINT and which would otherwise
    outlive everything."""
    process = subprocess.Popen([str(DAGSTER), "dev", *args], start_new_session=True)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        return process.wait()
    except KeyboardInterrupt:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(60)
        return 130
    finally:
        end_session(process.pid)


def stop_group(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
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


@contextlib.contextmanager
def group(command: list[str], log: Path, **kwargs: Any) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` leading a new process group, output to ``log``; the group is stopped at the
    end of the block."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, **kwargs)  # fmt: skip
        try:
            yield process
        finally:
            stop_group(process)


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, log: Path | None = None) -> Any:
    """Poll ``check`` every second until it returns something true (HTTP errors count as not
    yet); TimeoutError with the tail of ``log`` when ``timeout_s`` passes first."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            result = check()
            if result:
                return result
        time.sleep(1)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}; log tail:\n{tail}")


class GraphQL:
    """The webserver's GraphQL endpoint; a response with errors raises."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        import requests

        response = requests.post(self.url, json={"query": query, "variables": variables},
                                 timeout=30)  # fmt: skip
        response.raise_for_status()
        body = response.json()
        if "errors" in body:
            raise RuntimeError(f"GraphQL errors: {body['errors']}")
        return dict(body["data"])


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
                if "error" in message:
                    raise RuntimeError(f"DevTools {method}: {message['error']}")
                return dict(message["result"])

    def text(self) -> str:
        result = self.call("Runtime.evaluate", expression="document.body.innerText",
                           returnByValue=True)  # fmt: skip
        return str(result["result"].get("value") or "")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """The viewport as a PNG at ``path``."""
        shot = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot))
        return path


@contextlib.contextmanager
def chromium(workdir: Path, window: str = "1600,1200") -> Iterator[Browser]:
    """Headless ``/usr/bin/chromium`` with its profile and log in ``workdir``, one page."""
    from websockets.sync.client import connect

    if not CHROMIUM.exists():
        raise FileNotFoundError(f"{CHROMIUM} is absent: install Debian's chromium "
                                "(apt-get install -y chromium, or `make browser`)")  # fmt: skip
    import requests

    port, log = free_port(), workdir / "chromium.log"
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--hide-scrollbars", f"--window-size={window}",
               f"--user-data-dir={workdir / 'chrome'}", f"--remote-debugging-port={port}",
               "about:blank"]  # fmt: skip
    with group(command, log) as process:

        def page() -> str | None:
            if process.poll() is not None:
                raise RuntimeError(f"chromium exited with {process.returncode}")
            targets = requests.get(f"http://127.0.0.1:{port}/json", timeout=5).json()
            pages = [t for t in targets if t.get("type") == "page"]
            return pages[0]["webSocketDebuggerUrl"] if pages else None

        endpoint = wait_for("chromium's DevTools endpoint", page, 30, log)
        with connect(endpoint, max_size=None) as socket:
            browser = Browser(socket)
            browser.call("Page.enable")
            yield browser


@contextlib.contextmanager
def dagster_dev(
    root: Path,
    env: Mapping[str, str],
    log: Path,
    port: int | None = None,
    daemon: bool = True,
    workspace: str | Path = "workspace.yaml",
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`dagster dev` on 127.0.0.1 serving ``root/workspace.yaml`` (or ``workspace``) with ``env``
    (DAGSTER_HOME, resources' variables), in its own process group; yields it and its base URL
    once every code location has loaded. ``daemon=False``: the webserver alone
    (`dagster-webserver`, the UI part of `dagster dev`), so that no schedule or sensor launches a
    run meanwhile; the daemon is also what takes queued runs off the run queue."""
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    server = [str(DAGSTER), "dev"] if daemon else [str(WEBSERVER)]
    command = [*server, "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)]
    with group(command, log, cwd=root, env=dict(env)) as process:
        graphql = GraphQL(f"{base}/graphql")

        def location_loaded() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"dagster dev exited with {process.returncode}")
            entries = graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
            errors = [e["locationOrLoadError"] for e in entries
                      if e["locationOrLoadError"]["__typename"] == "PythonError"]  # fmt: skip
            if errors:
                raise RuntimeError(f"the code location failed to load: {errors}")
            return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)

        wait_for("the code location to load", location_loaded, 120, log)
        yield process, base


if __name__ == "__main__":
    if sys.argv[1:2] != ["dev"]:
        sys.exit("usage: python webui.py dev [dagster dev arguments]")
    sys.exit(dev(sys.argv[2:]))
