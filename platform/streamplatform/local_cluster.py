"""A real multi-process Spark standalone cluster on this machine, for tests and for trying one.

The pyspark wheel ships Spark's own launcher (``<pyspark>/bin/spark-class``) and all its jars,
so one master and N workers run without a Spark download::

    with LocalCluster(Path(".data/cluster"), workers=2) as cluster:
        spark = spark_session(master=cluster.master_url, extra={
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})

or from a shell, until Ctrl-C::

    python -m streamplatform.local_cluster --workers 2 --dir .data/cluster

Processes. The master and every worker are ``spark-class`` JVMs (the script execs the JVM, so
the pid is the JVM's), each started in a session and process group of its own, with stdout and
stderr in ``<work_dir>/master.log`` and ``<work_dir>/worker-<i>.log``. Everything listens on
127.0.0.1 only (``--host`` and ``SPARK_LOCAL_IP``); ports are free ones found by binding
127.0.0.1:0. A worker starts its executor JVMs as children in its own process group, but
pyspark's Python daemon (``pyspark/daemon.py``) moves itself and the Python workers it forks into
a group of their own (``os.setpgid(0, 0)``). Killing a worker's group alone would therefore
leave the daemon and its Python workers behind until they notice that their executor is gone, so
:meth:`LocalCluster.kill_worker` and :meth:`LocalCluster.stop` signal every process of the
worker's *session* (which ``setpgid`` does not leave), and each of their groups, found with
psutil (:mod:`streamplatform.processes`: Linux and macOS alike).

Worker directories. Worker ``i`` has ``<work_dir>/worker-<i>/`` with ``work/`` (``--work-dir``:
each application's jars and the executors' stdout/stderr), ``local/`` (``SPARK_LOCAL_DIRS``:
shuffle and spill files) and ``state/`` (``STREAMPLATFORM_STATE_DIR``: the executors' local
task state, read by :func:`streamplatform.home.default_state_dir` on the executors).

Environment. Every process gets ``os.environ`` plus ``SPARK_LOCAL_IP=127.0.0.1``,
``SPARK_HOME`` (the pyspark package), ``JAVA_HOME`` (from the ``java`` on ``PATH`` when unset)
and the ``env`` argument; each worker also gets its own ``SPARK_LOCAL_DIRS`` and
``STREAMPLATFORM_STATE_DIR``. Checked empirically (tests/runtime/test_local_cluster.py): a
worker's environment reaches the executors it launches and their Python workers. The worker
starts an executor with a ``ProcessBuilder`` whose environment is a copy of the worker JVM's own,
with the application's ``spark.executorEnv.*`` settings put over it, and the executor does the
same for its Python daemon and workers. So no ``spark.executorEnv`` is needed for per-worker
values, and a driver that sets ``spark.executorEnv.STREAMPLATFORM_STATE_DIR`` overrides them
(with one value for every executor). ``SPARK_LOCAL_DIRS`` is the exception: the worker hands
each executor ``SPARK_EXECUTOR_DIRS``, a directory under its own ``SPARK_LOCAL_DIRS``, and
pyspark points the Python workers' ``SPARK_LOCAL_DIRS`` at the executor's block manager directory
below that.

Resources. Each worker offers ``cores_per_worker`` cores and ``memory_per_worker`` memory to
executors; an application's executor takes every core of its worker by default, and
``spark.executor.memory`` (1g by default) must fit in ``memory_per_worker`` or the application
waits forever for executors. The master and worker daemons themselves run with Spark's default
1 GB maximum heap (``SPARK_DAEMON_MEMORY``). A driver should wait for its executors before
counting on them (a standalone application starts running tasks as soon as one executor has
registered).

Spark Connect. :class:`LocalConnectServer` runs a Spark Connect server from the same wheel
(``bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``) with the
:func:`streamplatform.spark.spark_conf` settings (Delta, the Kafka connector's jars, Java
options) as ``--conf``, gRPC on a free port of 127.0.0.1, and log in
``<work_dir>/connect-server.log``::

    with LocalConnectServer(Path(".data/connect"), env={"PYTHONPATH": "..."}) as server:
        job = StreamingJob(topology, config | {"platform.spark.master": server.url})

A job whose ``platform.spark.master`` (or ``$SPARK_REMOTE``) is ``sc://...`` is then only a
client, as on Databricks serverless and shared clusters: the server owns the JVM, its jars and
static settings (a client cannot change ``spark.jars`` or ``spark.pyspark.python``), and the
Python workers that run the tasks. Those workers get the *server's* environment and interpreter,
not the client's: streamplatform (and any module a topology imports by name) must be installed
where the server runs. The server is stopped like a worker: SIGTERM, then SIGKILL, to every
process of its session (the JVM and pyspark's Python daemon and workers).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from streamplatform.processes import ProcessInfo, live, snapshot

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

# Attempts at starting the master when the free ports found were taken before it bound them.
_MASTER_ATTEMPTS = 3
_BIND_FAILURE = ("BindException", "Address already in use", "Failed to bind")
# The master's web UI answers on loopback: never through an HTTP proxy from the environment.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def spark_home() -> Path:
    """The pyspark package directory: a Spark home with ``bin/spark-class`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _java_home() -> str | None:
    """``JAVA_HOME`` when set, else the home of the ``java`` on ``PATH`` (``.../bin/java``)."""
    if os.environ.get("JAVA_HOME"):
        return None  # already in the environment every process inherits
    java = shutil.which("java")
    if java is None:
        raise FileNotFoundError("No `java` found: install Java 17+ or set JAVA_HOME.")
    return str(Path(java).resolve().parents[1])


def _base_env(extra: Mapping[str, str]) -> dict[str, str]:
    """``os.environ`` plus loopback only, ``SPARK_HOME`` and ``JAVA_HOME``, then ``extra``."""
    env = dict(os.environ)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_HOME"] = str(spark_home())
    java_home = _java_home()
    if java_home is not None:
        env["JAVA_HOME"] = java_home
    return env | dict(extra)


def _log_tail(log_file: Path, lines: int = 20) -> str:
    try:
        text = log_file.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        text = ["(no output)"]
    return f"--- {log_file.name} (last {lines} lines) ---\n" + "\n".join(text)


# --- The process table: which processes belong to the cluster. ------------------------------
#
# Every master and worker is started with start_new_session=True, so it leads a session whose id
# is its pid. Whatever it starts stays in that session (executor JVMs, pyspark's Python daemon
# and workers: setpgid changes the process group, not the session), even after its parent died
# and it was reparented to init. So a daemon's processes are the members of its session (plus,
# to be thorough, their descendants). POSIX systems do not hand out a pid that is still some
# live process's session or group id, so this never matches an unrelated process while any
# member is alive.


def _members(leaders: Iterable[int], table: Mapping[int, ProcessInfo]) -> set[int]:
    """The live (non-zombie) processes of the sessions led by ``leaders``, and their
    descendants."""
    sessions = set(leaders)
    found = {pid for pid, proc in table.items() if proc.sid in sessions}
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid for pid in found if not table[pid].zombie}


def _alive(pids: Iterable[int]) -> set[int]:
    """Those of ``pids`` still running (zombies count as gone: they only wait to be reaped)."""
    return live(pids)


def _signal(leaders: Iterable[int], pids: Iterable[int], sig: signal.Signals) -> None:
    """Send ``sig`` to the process groups of ``leaders`` and of each of ``pids`` (pyspark's
    Python daemon leads a group of its own), and to each of ``pids`` itself."""
    table = snapshot()
    pids = set(pids)
    groups = set(leaders) | {table[pid].pgid for pid in pids if pid in table}
    for group in groups:
        if group > 1:  # never 0 (our own group) or 1 (init)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# --- The cluster. ---------------------------------------------------------------------------


@dataclass
class _Daemon:
    """One ``spark-class`` process (master or worker), leader of its own session and group."""

    name: str
    process: subprocess.Popen[bytes]
    log_file: Path
    gone: bool = False  # stopped or killed, every process of its session seen gone

    def members(self, table: Mapping[int, ProcessInfo] | None = None) -> set[int]:
        """The daemon's live processes now (itself, executors, Python daemons and workers)."""
        if self.gone:
            return set()
        return _members([self.process.pid], table if table is not None else snapshot())


def _spawn(name: str, command: list[str], env: Mapping[str, str], work_dir: Path) -> _Daemon:
    """Start ``command`` in ``work_dir`` as the leader of a new session and process group, with
    stdout and stderr in ``<work_dir>/<name>.log`` (the command line first)."""
    log_file = work_dir / f"{name}.log"
    with log_file.open("wb") as out:
        out.write(f"$ {shlex.join(command)}\n".encode())
        out.flush()
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            cwd=work_dir,
            start_new_session=True,  # a process group of its own, led by this pid
        )
    return _Daemon(name, process, log_file)


def _stop_daemons(daemons: list[_Daemon], grace_s: float, sig: signal.Signals) -> None:
    """Send ``sig`` to every process of ``daemons``; when that is SIGTERM, SIGKILL whatever is
    left after ``grace_s``. Then reap the daemons and wait until all their processes are gone
    (their descendants are reaped by init)."""
    daemons = [daemon for daemon in daemons if not daemon.gone]
    leaders = [daemon.process.pid for daemon in daemons]
    table = snapshot()
    pids = set().union(set(), *(daemon.members(table) for daemon in daemons))
    _signal(leaders, pids, sig)
    if sig != signal.SIGKILL:
        deadline = time.monotonic() + grace_s
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        # Also anything that started in the meantime.
        _signal(leaders, _alive(pids) | _members(leaders, snapshot()), signal.SIGKILL)
    for daemon in daemons:
        try:
            daemon.process.wait(timeout=10)  # reap our children: no zombies
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.process.pid, signal.SIGKILL)
            daemon.process.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for daemon in daemons:
        daemon.gone = True


class LocalCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1, files under ``work_dir``.

    A context manager: ``__enter__`` starts the cluster (and waits until every worker is ALIVE
    at the master), ``__exit__`` stops every process it started.
    """

    def __init__(
        self,
        work_dir: Path,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory_per_worker: str = "2g",
        env: Mapping[str, str] | None = None,
        *,
        start_timeout_s: float = 60.0,
        stop_grace_s: float = 5.0,
    ) -> None:
        if workers < 1:
            raise ValueError("A cluster needs at least one worker.")
        self.work_dir = Path(work_dir).resolve()
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.worker_dirs = [self.work_dir / f"worker-{i}" for i in range(workers)]
        self._master: _Daemon | None = None
        self._workers: list[_Daemon] = []
        self._master_port: int | None = None
        self._webui_port: int | None = None

    # --- Addresses. --------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: the ``spark.master`` of applications on this cluster."""
        if self._master_port is None:
            raise RuntimeError("The local cluster is not running: call start() first.")
        return f"spark://127.0.0.1:{self._master_port}"

    @property
    def webui_url(self) -> str:
        """The master's web UI (its JSON status is at ``<webui_url>/json/``)."""
        if self._webui_port is None:
            raise RuntimeError("The local cluster is not running: call start() first.")
        return f"http://127.0.0.1:{self._webui_port}"

    # --- Life cycle. -------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start the master and the workers; return when every worker is ALIVE at the master.

        Raises (after stopping whatever it started) when a process exits or the workers are not
        all ALIVE within ``start_timeout_s``; the error includes the tail of the logs.
        """
        if self._master is not None:
            raise RuntimeError("The local cluster is already running.")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            deadline = time.monotonic() + self.start_timeout_s
            self._start_master(deadline)
            for index in range(self.workers):
                self._workers.append(self._start_worker(index))
            self._wait(deadline, lambda: self.alive_workers() >= self.workers, "workers ALIVE")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process of the cluster (workers and their executors and Python workers
        first, then the master): SIGTERM, then SIGKILL after ``stop_grace_s``. Safe to call
        twice, and after a failed or partial start."""
        daemons, self._workers = self._workers, []
        _stop_daemons(daemons, self.stop_grace_s, signal.SIGTERM)
        if self._master is not None:
            master, self._master = self._master, None
            _stop_daemons([master], self.stop_grace_s, signal.SIGTERM)
        self._master_port = self._webui_port = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- Failures and status. ----------------------------------------------------------------

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and everything it started (executor JVMs, pyspark's Python
        daemon and workers), as a machine that dies would. The master notices the lost
        connection and marks the worker DEAD within a few seconds; the driver loses the
        executor and reruns its tasks elsewhere."""
        _stop_daemons([self._workers[index]], self.stop_grace_s, signal.SIGKILL)

    def alive_workers(self) -> int:
        """How many workers the master counts as ALIVE (from its JSON status)."""
        workers = self.master_status().get("workers", [])
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def master_status(self) -> dict[str, Any]:
        """The master's JSON status (``<webui_url>/json/``): workers, applications, ..."""
        with _HTTP.open(f"{self.webui_url}/json/", timeout=5) as response:
            status: dict[str, Any] = json.load(response)
        return status

    def pids(self, worker: int | None = None) -> set[int]:
        """The live processes of the cluster now (or of worker ``worker`` only): daemons,
        executors, Python daemons and workers. For tests that check nothing is left behind."""
        table = snapshot()
        if worker is not None:
            return self._workers[worker].members(table)
        daemons = [*self._workers, *([self._master] if self._master else [])]
        return set().union(set(), *(daemon.members(table) for daemon in daemons))

    # --- Internals. --------------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        return _base_env(self.env)

    def _spawn(self, name: str, main_class: str, args: list[str], env: dict[str, str]) -> _Daemon:
        # spark-class runs Spark's launcher, then execs the JVM: the pid stays the same.
        command = [str(spark_home() / "bin" / "spark-class"), main_class, *args]
        return _spawn(name, command, env, self.work_dir)

    def _start_master(self, deadline: float) -> None:
        env = self._base_env()
        # Fail on a taken port instead of silently moving to the next one (Spark's default is
        # to try 16 more): the workers and the caller must know the port it listens on. And no
        # REST submission server: nothing here uses it, and it would listen on the fixed port
        # 6066, which a second cluster on the machine could not bind.
        options = "-Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false"
        env["SPARK_MASTER_OPTS"] = f"{env.get('SPARK_MASTER_OPTS', '')} {options}".strip()
        for attempt in range(1, _MASTER_ATTEMPTS + 1):
            self._master_port, self._webui_port = free_port(), free_port()
            args = ["--host", "127.0.0.1", "--port", str(self._master_port)]
            args += ["--webui-port", str(self._webui_port)]
            self._master = self._spawn("master", MASTER_CLASS, args, env)
            try:
                self._wait(deadline, self._master_ready, "the master's web UI")
                return
            except RuntimeError:
                log = self._master.log_file.read_text(errors="replace")
                if attempt == _MASTER_ATTEMPTS or not any(s in log for s in _BIND_FAILURE):
                    raise
                master, self._master = self._master, None  # a port was taken: new ports
                _stop_daemons([master], self.stop_grace_s, signal.SIGTERM)

    def _master_ready(self) -> bool:
        try:
            return self.master_status().get("status") == "ALIVE"
        except (OSError, ValueError):  # not listening yet / not answering yet
            return False

    def _start_worker(self, index: int) -> _Daemon:
        folder = self.worker_dirs[index]
        for sub in ("work", "local", "state"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        env = self._base_env() | {
            "SPARK_LOCAL_DIRS": str(folder / "local"),
            "STREAMPLATFORM_STATE_DIR": str(folder / "state"),
        }
        args = [
            self.master_url,
            "--host", "127.0.0.1",
            "--cores", str(self.cores_per_worker),
            "--memory", self.memory_per_worker,
            "--work-dir", str(folder / "work"),
            "--webui-port", str(free_port()),
        ]  # fmt: skip
        return self._spawn(f"worker-{index}", WORKER_CLASS, args, env)

    def _wait(self, deadline: float, ready: Callable[[], bool], what: str) -> None:
        """Poll ``ready()`` until true; fail early when a process exits, or at ``deadline``."""
        while True:
            for daemon in [*([self._master] if self._master else []), *self._workers]:
                code = daemon.process.poll()
                if code is not None:
                    raise RuntimeError(
                        f"Spark {daemon.name} exited with code {code} while waiting for "
                        f"{what}; logs in {self.work_dir}:\n{self._log_tails()}"
                    )
            if ready():
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"Timed out after {self.start_timeout_s:.0f} s waiting for {what} of the "
                    f"local Spark cluster; logs in {self.work_dir}:\n{self._log_tails()}"
                )
            time.sleep(0.25)

    def _log_tails(self, lines: int = 20) -> str:
        daemons = [*([self._master] if self._master else []), *self._workers]
        return "\n".join(_log_tail(daemon.log_file, lines) for daemon in daemons)


# --- A Spark Connect server. -----------------------------------------------------------------


class LocalConnectServer:
    """A Spark Connect server on 127.0.0.1 running applications on ``master`` (``local[2]`` by
    default, or a :class:`LocalCluster`'s ``master_url``), files under ``work_dir``.

    A context manager: ``__enter__`` starts the server and waits until its gRPC port accepts
    connections, ``__exit__`` stops every process it started. Clients connect to :attr:`url`.
    ``env`` is added to the server's environment, which its Python workers inherit (for
    example ``PYTHONPATH`` for modules that a job's functions import by name); ``conf`` is put
    over the :func:`streamplatform.spark.spark_conf` settings.
    """

    def __init__(
        self,
        work_dir: Path,
        master: str = "local[2]",
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 120.0,
        *,
        conf: Mapping[str, str] | None = None,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.master = master
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.conf = dict(conf or {})
        self.stop_grace_s = stop_grace_s
        self.log_file = self.work_dir / "connect-server.log"
        self._server: _Daemon | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("The Spark Connect server is not running: call start() first.")
        return self._port

    @property
    def url(self) -> str:
        """``sc://127.0.0.1:<port>``: a ``platform.spark.master`` or ``SPARK_REMOTE``."""
        return f"sc://127.0.0.1:{self.port}"

    def command(self, port: int) -> list[str]:
        """The ``spark-submit`` command line of a server listening on ``port``."""
        from streamplatform.spark import spark_conf

        conf = spark_conf(master=self.master, app_name="streamplatform-connect-server")
        conf |= {
            # Loopback only, whatever the master (spark_conf sets these for local ones only).
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.connect.grpc.port.maxRetries": "0",  # fail on a taken port: start() retries
        } | self.conf
        command = [str(spark_home() / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS]
        for key, value in conf.items():
            # In client mode the launcher reads spark.driver.extraJavaOptions and
            # spark.driver.memory from --conf and puts them on the JVM's command line.
            command += ["--conf", f"{key}={value}"]
        return [*command, "spark-internal"]  # the main class is in Spark's own jars

    def start(self) -> LocalConnectServer:
        """Start the server; return when its port accepts connections.

        Raises (after stopping whatever it started) when the server exits or does not listen
        within ``start_timeout_s``; the error includes the tail of its log.
        """
        if self._server is not None:
            raise RuntimeError("The Spark Connect server is already running.")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = _base_env({"PYSPARK_PYTHON": sys.executable} | self.env)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            for attempt in range(1, _MASTER_ATTEMPTS + 1):
                self._port = free_port()
                # spark-submit execs spark-class, which execs the JVM: the pid stays the same.
                command = self.command(self._port)
                self._server = _spawn("connect-server", command, env, self.work_dir)
                try:
                    self._wait(deadline)
                    return self
                except RuntimeError:
                    log = self.log_file.read_text(errors="replace")
                    if attempt == _MASTER_ATTEMPTS or not any(s in log for s in _BIND_FAILURE):
                        raise
                    self.stop()  # the port was taken before the server bound it: a new one
        except BaseException:
            self.stop()
            raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop every process of the server (the JVM, pyspark's Python daemon and workers):
        SIGTERM, then SIGKILL after ``stop_grace_s``. Safe to call twice, and after a failed
        start."""
        if self._server is not None:
            server, self._server = self._server, None
            _stop_daemons([server], self.stop_grace_s, signal.SIGTERM)
        self._port = None

    def pids(self) -> set[int]:
        """The live processes of the server now (for tests that check nothing is left)."""
        return self._server.members() if self._server is not None else set()

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait(self, deadline: float) -> None:
        assert self._server is not None and self._port is not None
        while True:
            code = self._server.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"The Spark Connect server exited with code {code} before listening on "
                    f"127.0.0.1:{self._port}:\n{_log_tail(self.log_file, 40)}"
                )
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self._port), timeout=1).close()
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"Timed out after {self.start_timeout_s:.0f} s waiting for the Spark "
                    f"Connect server to listen on 127.0.0.1:{self._port}:\n"
                    f"{_log_tail(self.log_file, 40)}"
                )
            time.sleep(0.25)


# --- python -m streamplatform.local_cluster ---------------------------------------------------


def main(argv: list[str] | None = None, out: IO[str] = sys.stdout) -> int:
    from streamplatform.home import data_dir

    parser = argparse.ArgumentParser(
        prog="python -m streamplatform.local_cluster",
        description="Run a Spark standalone cluster (master + workers) on 127.0.0.1 until "
        "Ctrl-C or SIGTERM.",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    parser.add_argument("--memory", default="2g", help="memory per worker (default 2g)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="work directory (default <data dir>/cluster)"
    )
    args = parser.parse_args(argv)

    stopping = threading.Event()
    # SIGTERM ends the run like Ctrl-C does: the cluster is stopped before exiting.
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    cluster = LocalCluster(
        args.dir or data_dir() / "cluster", args.workers, args.cores, args.memory
    )
    try:
        with cluster:
            print(
                f"Spark master: {cluster.master_url} (web UI {cluster.webui_url}), "
                f"{args.workers} workers x {args.cores} cores, {args.memory}; "
                f"logs in {cluster.work_dir}\n"
                f"Use it from another shell:\n"
                f"  export SPARK_MASTER={cluster.master_url}\n"
                "  (spark_session() and spark_conf() read SPARK_MASTER; also set "
                "spark.driver.host and spark.driver.bindAddress to 127.0.0.1)\n"
                "Ctrl-C stops the cluster.",
                file=out,
                flush=True,
            )
            while not stopping.wait(1.0):
                master = cluster._master
                if master is not None and master.process.poll() is not None:
                    print("The Spark master exited; stopping.", file=out, flush=True)
                    return 1
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("Stopped.", file=out, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
