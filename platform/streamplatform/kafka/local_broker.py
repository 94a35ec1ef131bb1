"""A single-node Apache Kafka broker (KRaft, broker+controller in one JVM) for local runs and tests.

The broker runs from the jars Maven fetched into ``.jvm/kafka/``, listens on free 127.0.0.1
ports, and keeps everything (config, logs, the broker's own output, a state file) in one data
directory. It runs in a process group of its own, so stopping it stops everything it started.

Leaks are prevented in two ways: ``stop()`` signals the whole group and kills it if it does not
exit in time, and ``start()`` first stops any broker an earlier, killed process left running on
the same data directory (found through the state file ``broker.json`` and checked against the
process's command line, so an unrelated process that reused the pid is never touched).

    with LocalBroker() as broker:
        settings = {"bootstrap.servers": broker.bootstrap_servers}

``security="sasl_ssl"`` (or ``"sasl_plaintext"``, ``"ssl"`` for mutual TLS) secures the
clients' listener (local_security.py: a CA, certificates and a SCRAM user generated into the
data directory); ``broker.client_settings()`` then gives what a client needs, in the Java
client's names. The broker itself talks to itself on a second, plaintext listener on
127.0.0.1, which is also how the readiness check reaches it.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamplatform.home import data_dir, jars_in
from streamplatform.kafka import local_security
from streamplatform.processes import LocalServer, ServerRecord, log_tail, reap, start_mark

log = logging.getLogger(__name__)

STATE_FILE = "broker.json"
CLIENT_PROPERTIES = "client.properties"  # a secured broker's client settings (secrets: 0600)
_MARKER = "-Dstreamplatform.broker.dir="

_LOG4J2 = """\
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = stdout
appender.stdout.type = Console
appender.stdout.name = stdout
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = warn
logger.apache.name = org.apache.kafka
logger.apache.level = warn
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
"""


@dataclass(frozen=True)
class BrokerState:
    """What ``broker.json`` records about a running broker."""

    pid: int
    bootstrap_servers: str
    controller_port: int
    data_dir: str
    security: str | None = None  # the clients' listener's: None (plaintext) or a MODE
    internal_servers: str | None = None  # the broker's own plaintext listener, when secured
    acls: bool = False  # an authorizer: the clients' user may do only what was granted
    started: str = ""  # the process's start mark (processes.start_mark): not a reused pid


def default_data_dir() -> Path:
    return data_dir() / "broker"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cluster_id() -> str:
    """A Kafka Uuid string: URL-safe base64 of 16 random bytes, without padding.

    Like Kafka's ``Uuid.randomUuid()``, never one starting with "-": the storage tool's argument
    parser would take it for an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise FileNotFoundError("No `java` found: install Java 17+ or set JAVA_HOME.")
    return java


RECORD = ServerRecord("Broker", STATE_FILE, _MARKER, BrokerState, default_data_dir)
read_state = RECORD.read  # the broker recorded in a directory (default .data/broker), or None
running_broker = RECORD.running  # ... if it is still running
stop_broker = RECORD.stop  # SIGTERM to its group, SIGKILL after timeout_s: True if one ran


def grant(state: BrokerState, resource_type: str, name: str, *operations: str,
          principal: str | None = None, prefixed: bool = False) -> None:  # fmt: skip
    """Allow ``principal`` (default: the generated client user, ``User:<user>``, or the client
    certificate's name under mutual TLS) ``operations`` ("READ", "WRITE", "DESCRIBE", "ALL",
    ...) on ``resource_type`` ("TOPIC", "GROUP", "TRANSACTIONAL_ID", "BROKER") ``name`` ("*":
    any; ``prefixed``: names starting with it), on the running broker of ``state`` started with
    ACLs. Sent through the broker's own listener, whose principal is a super user."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    if not state.acls or state.internal_servers is None:
        raise ValueError("This broker was started without ACLs (--security and --acls).")
    if principal is None:
        user = local_security.prepare(Path(state.data_dir) / "security").user
        ssl = state.security == "ssl"
        principal = "User:CN=streamplatform-client" if ssl else f"User:{user}"
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    bindings = [
        AclBinding(
            ResourceType[resource_type],
            name,
            pattern,
            principal,
            "*",
            AclOperation[operation],
            AclPermissionType.ALLOW,
        )  # fmt: skip
        for operation in operations
    ]
    settings: dict[str, Any] = {"bootstrap.servers": state.internal_servers, "logger": log}
    admin = AdminClient(settings)
    for future in admin.create_acls(bindings).values():  # admin outlives its futures
        future.result(timeout=30)


class LocalBroker(LocalServer):
    """A KRaft broker in ``directory`` (default ``.data/broker``).

    ``fresh=True`` wipes the directory before starting (tests); ``fresh=False`` keeps topics
    and data across restarts, like a real broker (the CLI's ``broker start``).
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        fresh: bool = True,
        heap_mb: int = 512,
        ready_timeout_s: float = 90.0,
        properties: Mapping[str, str] | None = None,
        security: str | None = None,
        acls: bool = False,
        system_properties: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            directory or default_data_dir(), fresh=fresh, heap_mb=heap_mb,
            ready_timeout_s=ready_timeout_s, properties=properties,
        )  # fmt: skip
        if security is not None and security not in local_security.MODES:
            raise ValueError(f"security={security!r}: one of {', '.join(local_security.MODES)}")
        if acls and security is None:
            raise ValueError("acls=True needs a secured clients' listener (security=...): "
                             "plaintext clients are the broker's own, super user")  # fmt: skip
        self.security = security
        self.acls = acls
        # The JVM's -D options, e.g. org.apache.kafka.sasl.oauthbearer.allowed.urls for a JWKS
        # endpoint (Kafka 4 allows none by default).
        self.system_properties = dict(system_properties or {})
        self._client_port: int | None = None
        if acls:  # the broker's own listeners (ANONYMOUS) stay super users; clients need ACLs
            self.properties = {
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": "User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
            } | self.properties

    def grant(self, resource_type: str, name: str, *operations: str,
              principal: str | None = None, prefixed: bool = False) -> None:  # fmt: skip
        """``grant(self.state, ...)``: an ACL for this broker's clients (``acls=True``)."""
        assert self.state is not None
        grant(self.state, resource_type, name, *operations, principal=principal,
              prefixed=prefixed)  # fmt: skip

    def _own_admin(self) -> Any:
        """An admin client on the broker's own plaintext listener (a super user there)."""
        from confluent_kafka.admin import AdminClient

        settings: dict[str, Any] = self.admin_settings | {"logger": log}
        return AdminClient(settings)

    @property
    def admin_settings(self) -> dict[str, Any]:
        """Settings that reach the broker through its own plaintext listener, as a super user
        (a secured broker's setup in tests: topics, ACLs, input)."""
        assert self.state is not None
        return {"bootstrap.servers": self.state.internal_servers or self.state.bootstrap_servers}

    def write_client_properties(self) -> Path:
        """``client_settings()`` as a properties file in the broker's data, readable by its
        owner only (it holds the password): what `streamplatform topics` and
        ``--command-config`` read."""
        path = self.directory / CLIENT_PROPERTIES
        lines = "".join(f"{key}={value}\n" for key, value in self.client_settings().items())
        local_security.write_private(path, lines.encode())
        return path

    def client_settings(self, mechanism: str = local_security.MECHANISM) -> dict[str, Any]:
        """What a client needs to reach this broker: ``bootstrap.servers`` and, when secured,
        the security settings in the Java client's names (``mechanism``: SCRAM-SHA-512,
        SCRAM-SHA-256 or OAUTHBEARER with Kafka's unsecured tokens)."""
        settings: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        if self.security is None:
            return settings
        material = local_security.prepare(self.directory / "security")
        return settings | local_security.client_settings(material, self.security, mechanism)

    @property
    def bootstrap_servers(self) -> str:
        if self.state is None:
            raise RuntimeError("The local broker is not running: call start() first.")
        return self.state.bootstrap_servers

    @property
    def log_file(self) -> Path:
        return self.directory / "broker.out"

    def start(self) -> str:
        """Start the broker and wait until it serves metadata; returns ``bootstrap.servers``."""
        classpath = f"{jars_in('kafka')[0].parent}/*"
        if stop_broker(self.directory):
            log.warning("Stopped a stale broker left running in %s", self.directory)
        if self.fresh and self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)

        port, controller_port = self._ports or (_free_port(), _free_port())
        self._ports = (port, controller_port)
        if self.security is not None and self._client_port is None:
            self._client_port = _free_port()
        config = self._write_config(port, controller_port)
        if not (self.directory / "logs" / "meta.properties").exists():
            self._format_storage(classpath, config)

        java_options = [
            f"-Xmx{self.heap_mb}m",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            f"{_MARKER}{self.directory}",
            *(f"-D{key}={value}" for key, value in self.system_properties.items()),
        ]
        with self.log_file.open("ab") as out:
            self._process = subprocess.Popen(
                [_java(), *java_options, "-cp", classpath, "kafka.Kafka", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        internal = f"127.0.0.1:{port}"
        clients = internal if self.security is None else f"127.0.0.1:{self._client_port}"
        self.state = BrokerState(
            pid=self._process.pid,
            bootstrap_servers=clients,
            controller_port=controller_port,
            data_dir=str(self.directory),
            security=self.security,
            internal_servers=None if self.security is None else internal,
            acls=self.acls,
            started=start_mark(self._process.pid),
        )
        RECORD.record(self.directory, self.state)
        try:
            self._wait_ready()
            self._add_user()
        except BaseException:
            self.stop()
            raise
        return self.state.bootstrap_servers

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the broker and its whole process group; safe to call twice."""
        stop_broker(self.directory, timeout_s)
        reap(self._process)
        self._process = None
        self.state = None

    def _write_config(self, port: int, controller_port: int) -> Path:
        logs = self.directory / "logs"
        listeners = {"PLAINTEXT": port}
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        secured: dict[str, str] = {}
        if self.security is not None:  # the clients' listener, beside the broker's own
            material = local_security.prepare(self.directory / "security")
            assert self._client_port is not None
            listeners["CLIENT"] = self._client_port
            protocols += f",CLIENT:{self.security.upper()}"
            secured = local_security.broker_properties(material, self.security, "client")
        advertised = ",".join(f"{name}://127.0.0.1:{p}" for name, p in listeners.items())
        settings = (
            {
                "process.roles": "broker,controller",
                "node.id": "1",
                "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
                "listeners": f"{advertised},CONTROLLER://127.0.0.1:{controller_port}",
                "advertised.listeners": advertised,
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": protocols,
                "log.dirs": str(logs),
                "num.partitions": "1",
                # One node: every internal topic has one replica.
                "offsets.topic.replication.factor": "1",
                "offsets.topic.num.partitions": "4",
                "transaction.state.log.replication.factor": "1",
                "transaction.state.log.min.isr": "1",
                "transaction.state.log.num.partitions": "4",
                "share.coordinator.state.topic.replication.factor": "1",
                "share.coordinator.state.topic.min.isr": "1",
                "group.initial.rebalance.delay.ms": "0",
                # Topics are created on purpose: a typo in a topic name is an error, not a topic.
                "auto.create.topics.enable": "false",
                "log.flush.interval.messages": "100000",
                # Keep everything: tests and demos write records with timestamps far in the past,
                # which time-based retention would delete within minutes.
                "log.retention.ms": "-1",
            }
            | secured
            | self.properties
        )
        path = self.directory / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        (self.directory / "log4j2.properties").write_text(_LOG4J2)
        return path

    def _format_storage(self, classpath: str, config: Path) -> None:
        result = subprocess.run(
            [_java(), "-Xmx256m", "-cp", classpath, "kafka.tools.StorageTool", "format",
             f"--cluster-id={_cluster_id()}", f"--config={config}"],
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(
                f"Formatting Kafka storage in {self.directory} failed:\n"
                f"{result.stdout}{result.stderr}"
            )

    def _add_user(self) -> None:
        """A SASL-secured broker's SCRAM user, created (or its password set again) through
        the broker's own listener: also on data formatted before the broker was secured."""
        if self.security is None or not self.security.startswith("sasl"):
            return
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        assert self.state is not None and self.state.internal_servers is not None
        material = local_security.prepare(self.directory / "security")
        admin = self._own_admin()
        for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256):
            # One request per mechanism: the broker refuses two changes of a user in one.
            upsert = UserScramCredentialUpsertion(material.user,
                                                  ScramCredentialInfo(mechanism, 4096),
                                                  material.password.encode())  # fmt: skip
            for future in admin.alter_user_scram_credentials([upsert]).values():
                future.result(timeout=30)

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        assert self._process is not None and self.state is not None
        # Silent: "connection refused" is the expected answer until the broker listens.
        quiet: dict[str, Any] = {"log_level": 0, "logger": log}
        admin = AdminClient(self.admin_settings | quiet)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"The Kafka broker exited with code {self._process.returncode} during "
                    f"start-up; its output is in {self.log_file}:\n{log_tail(self.log_file)}"
                )
            try:
                if admin.list_topics(timeout=1.0).brokers:
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
        raise TimeoutError(
            f"The Kafka broker did not serve metadata within {self.ready_timeout_s:.0f} s; "
            f"its output is in {self.log_file}:\n{log_tail(self.log_file)}"
        )
