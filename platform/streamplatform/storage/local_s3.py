"""A local S3-compatible server for tests and trying things out: moto's S3 API on 127.0.0.1.

Why moto: it installs from PyPI with the dev tools (no Go build, no download of a server
binary), speaks the S3 REST API that delta-rs, pyarrow and Hadoop's S3A use (path-style
requests, multipart uploads, listing v2), and honours the conditional-write headers
``If-None-Match: *`` and ``If-Match`` that Delta commits on S3 rely on. Its own server answers
requests on several threads and checks a condition before it writes, so two conditional puts of
one key could both pass the check; this module runs moto's application behind one lock for
every request that changes objects, so that a conditional put is atomic, as on S3.

Like the local broker and registry, the server listens on a free 127.0.0.1 port, keeps what it
writes (its objects' bytes above a few KB, its output, a state file) in one data directory, and
runs in a process group of its own: ``stop()`` signals the whole group, and ``start()`` first
stops a server an earlier, killed process left running on the same directory (found through
``s3.json``, which records its pid and start, so a reused pid is never signalled).

The objects live as long as the server: moto keeps its index in memory, so a restarted server
starts empty (a fresh bucket). That suits tests and demos; it is not a store to keep data in.

    with LocalS3() as s3:
        config = {"platform.delta.root": f"s3://{s3.bucket}/streams", **s3.settings}
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamplatform.home import data_dir
from streamplatform.kafka.local_broker import _free_port
from streamplatform.processes import LocalServer, ServerRecord, log_tail, reap, start_mark

log = logging.getLogger(__name__)

STATE_FILE = "s3.json"
DEFAULT_BUCKET = "streamplatform"
# moto accepts any credentials; these are what clients are given.
ACCESS_KEY_ID = "streamplatform"
SECRET_ACCESS_KEY = "streamplatform-local-secret"
REGION = "us-east-1"
_MARKER = "--streamplatform-s3-dir="
_WRITES = frozenset({"PUT", "POST", "DELETE"})


@dataclass(frozen=True)
class S3State:
    """What ``s3.json`` records about a running server."""

    pid: int
    started: str  # streamplatform.processes.start_mark(pid)
    endpoint: str  # http://127.0.0.1:<port>
    port: int
    data_dir: str


def default_data_dir() -> Path:
    return data_dir() / "s3"


class LocalS3(LocalServer):
    """moto's S3 server in ``directory`` (default ``.data/s3``) on 127.0.0.1, with
    ``buckets`` created once it answers. ``fresh=True`` wipes the directory first."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        fresh: bool = True,
        buckets: Iterable[str] = (DEFAULT_BUCKET,),
        ready_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(
            directory or default_data_dir(), fresh=fresh, heap_mb=0,
            ready_timeout_s=ready_timeout_s, properties=None,
        )  # fmt: skip
        self.buckets = tuple(buckets)

    @property
    def endpoint(self) -> str:
        if self.state is None:
            raise RuntimeError("The local S3 server is not running: call start() first.")
        return str(self.state.endpoint)

    @property
    def bucket(self) -> str:
        return self.buckets[0]

    @property
    def settings(self) -> dict[str, Any]:
        """The job settings that reach this server (platform.storage.s3.*)."""
        return {
            "platform.storage.s3.endpoint": self.endpoint,
            "platform.storage.s3.region": REGION,
            "platform.storage.s3.access.key.id": ACCESS_KEY_ID,
            "platform.storage.s3.secret.access.key": SECRET_ACCESS_KEY,
        }

    @property
    def environment(self) -> dict[str, str]:
        """The same as the standard AWS environment variables (what the settings fall back
        to), for tools that read only those."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        }

    @property
    def log_file(self) -> Path:
        return self.directory / "s3.out"

    def start(self) -> str:
        """Start the server, wait until it answers, create the buckets; returns the endpoint."""
        if stop_s3(self.directory):
            log.warning("Stopped a stale local S3 server left running in %s", self.directory)
        if self.fresh and self.directory.exists():
            shutil.rmtree(self.directory)
        tmp = self.directory / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        port = self._ports[0] if self._ports else _free_port()
        self._ports = (port, 0)
        environment = os.environ | {
            # moto keeps an object's bytes in a spooled temporary file: in memory up to this
            # size, then in the data directory (TMPDIR), so big tables do not fill memory.
            "TMPDIR": str(tmp),
            "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(64 * 1024),
        }
        with self.log_file.open("ab") as out:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "streamplatform.storage.local_s3", str(port),
                 f"{_MARKER}{self.directory}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.directory, env=environment, start_new_session=True,
            )  # fmt: skip
        self.state = S3State(
            pid=self._process.pid,
            started=start_mark(self._process.pid),
            endpoint=f"http://127.0.0.1:{port}",
            port=port,
            data_dir=str(self.directory),
        )
        RECORD.record(self.directory, self.state)
        try:
            self._wait_ready()
            for bucket in self.buckets:
                self._create_bucket(bucket)
        except BaseException:
            self.stop()
            raise
        return self.endpoint

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server and its whole process group; safe to call twice."""
        stop_s3(self.directory, timeout_s)
        reap(self._process)
        self._process = None
        self.state = None

    def _request(self, method: str, path: str) -> int:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no http_proxy
        request = urllib.request.Request(f"{self.endpoint}{path}", method=method)
        try:
            with direct.open(request, timeout=5) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    def _create_bucket(self, bucket: str) -> None:
        status = self._request("PUT", f"/{bucket}")
        if status not in (200, 409):  # 409: it is there already (a restart on the same data)
            raise RuntimeError(f"The local S3 server refused to create bucket {bucket!r} "
                               f"(HTTP {status})")  # fmt: skip

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"The local S3 server exited with code {self._process.returncode} during "
                    f"start-up; its output is in {self.log_file}:\n{log_tail(self.log_file)}"
                )
            try:
                if self._request("GET", "/") == 200:
                    return
            except OSError:  # not listening yet
                pass
            time.sleep(0.1)
        raise TimeoutError(
            f"The local S3 server did not answer on {self.endpoint} within "
            f"{self.ready_timeout_s:.0f} s; its output is in {self.log_file}:\n"
            f"{log_tail(self.log_file)}"
        )


RECORD = ServerRecord("local S3 server", STATE_FILE, _MARKER, S3State, default_data_dir)
read_state = RECORD.read  # the server recorded in a directory (default .data/s3), or None
running_s3 = RECORD.running  # ... if it is still running
stop_s3 = RECORD.stop  # SIGTERM to its group, SIGKILL after timeout_s: True if one ran


def _serialized_writes(app: Any) -> Any:
    """moto's WSGI application with one request at a time among those that change objects:
    a conditional put's check and write are then one step, as S3 makes them."""
    lock = threading.Lock()

    def application(environ: Mapping[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") not in _WRITES:
            return app(environ, start_response)
        with lock:
            # The whole answer is made under the lock (moto builds it before returning).
            return list(app(environ, start_response))

    return application


def main(argv: list[str]) -> None:
    """``python -m streamplatform.storage.local_s3 <port> --streamplatform-s3-dir=<dir>``."""
    from moto.moto_server.werkzeug_app import (  # type: ignore[import-untyped]
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    app = create_backend_app("s3")  # S3 only: every request is an S3 request
    run_simple("127.0.0.1", int(argv[0]), _serialized_writes(app), threaded=True,
               request_handler=MotoRequestHandler)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
