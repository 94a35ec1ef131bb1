"""The ``streamplatform`` console script.

streamplatform broker start [--fresh] [--security sasl_ssl|sasl_plaintext|ssl [--acls]] | stop
                      | status | grant (--topic|--group|--transactional-id NAME | --cluster)
                      --operation OP [--prefixed] [--principal P]
streamplatform registry start [--fresh] | stop | status   (a local Schema Registry)
streamplatform s3 start [--fresh] | stop | status         (a local S3-compatible server)
streamplatform new DIR     (a team's own project: a topology, its test, Dagster, a README)
streamplatform topics create NAME [--partitions N] | list | describe NAME | delete NAME
                              (against --bootstrap-servers [--command-config FILE] or the
                              local broker)
streamplatform topics produce TOPIC [--value V ...] [--header NAME=VALUE ...] [--partition P]
                              [--timestamp MS|ISO] [--json-lines]
                              (key<TAB>value lines, or JSON lines, from stdin)
streamplatform topics consume|tail TOPIC [--from-end] [--max-messages N] [--follow] [--json]
streamplatform placement plan --instances FILE [--standbys N] [--awareness zone,cluster]
                              [--tasks N] [--strict]
streamplatform rewind --topology pkg.module:name --set KEY=VALUE ... --to-batch N
                       [--accept-kafka-repeats]
streamplatform reset APPLICATION_ID --input-topics T[,T] --to-earliest|--to-latest
                     |--to-datetime ISO|--by-duration PT1H [--dry-run] [--set KEY=VALUE ...]
streamplatform run --topology pkg.module:name [--command-config FILE] --set KEY=VALUE ...
                   [--delta-sink TOPIC]
                    [--delta-state-table TOPIC]
                   [--trigger-interval-ms MS] [--until-caught-up]
                   [--metrics-port PORT [--metrics-host HOST]] [--otlp-endpoint URL]
                   [--dagster-asset KEY [--dagster-report-every-batches N]
                    [--dagster-report-every-seconds S]]
                   exit 0 stopped, 1 batch failed, 2 bad settings, 3 claimed elsewhere,
                   4 replay refused (a person must decide), 130 interrupted (batch replayed)
streamplatform discard-batch --topology pkg.module:name --set KEY=VALUE ... [--delta-sink TOPIC]
streamplatform query --topology pkg.module:name --set KEY=VALUE ... --store NAME
                     [--key K | --range A B | --prefix P | --all] [--batch N] [--as-of MS]
                     [--versions] [--from-time MS] [--to-time MS] [--partition P] [--limit N]
streamplatform maintain --application-id ID [--delta-root URI] [--min-changelog-files N]
                        [--retention-hours H]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamplatform.exceptions import StreamPlatformError
from streamplatform.kafka import local_broker


def _bootstrap(args: argparse.Namespace) -> str:
    if args.bootstrap_servers:
        return str(args.bootstrap_servers)
    state = local_broker.running_broker()
    if state is None:
        raise SystemExit(
            "No broker: pass --bootstrap-servers or start one with `streamplatform broker start`."
        )
    return state.bootstrap_servers


def read_properties(path: str) -> dict[str, str]:
    """A Java properties file of client settings (``--command-config``, as Kafka's own tools
    take it): ``key=value`` lines, ``#`` and ``!`` comments."""
    settings = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, separator, value = line.partition("=")
        if not separator:
            raise SystemExit(f"{path}:{number}: expected key=value")
        settings[key.strip()] = value.strip()
    return settings


def _local_broker_settings() -> dict[str, Any] | None:
    """The running local broker's client settings (its client.properties when secured), or
    None when none runs."""
    state = local_broker.running_broker()
    if state is None:
        return None
    if state.security is None:
        return {"bootstrap.servers": state.bootstrap_servers}
    return read_properties(str(Path(state.data_dir) / local_broker.CLIENT_PROPERTIES))


def _connection(args: argparse.Namespace) -> dict[str, Any]:
    """The Kafka settings of a tool: ``--command-config`` (security settings in the Java
    client's names), ``--bootstrap-servers``, else the local broker's, with its client
    settings when it is secured."""
    command_config = getattr(args, "command_config", None)
    settings = read_properties(command_config) if command_config else {}
    if getattr(args, "bootstrap_servers", None):
        return settings | {"bootstrap.servers": args.bootstrap_servers}
    if settings.get("bootstrap.servers"):
        return settings
    local = _local_broker_settings()
    if local is None:
        return settings | {"bootstrap.servers": _bootstrap(args)}  # says there is no broker
    return (
        local
        if not command_config
        else settings | {"bootstrap.servers": local["bootstrap.servers"]}
    )


@dataclass(frozen=True)
class _LocalServerCommand:
    """What differs between the local servers' ``start|stop|status`` commands (the broker,
    the registry, the S3 server); ``_local_server`` is the rest, the same for all."""

    name: str  # in messages: "broker", "Schema Registry", "local S3 server"
    running: Callable[[], Any]  # the running server's state, or None
    stop: Callable[[], bool]  # True when one was running
    start: Callable[[argparse.Namespace], tuple[Any, Path]]  # (its state, its data directory)
    address: Callable[[Any], str]  # how clients reach it, from its state
    after_start: Callable[[argparse.Namespace, Any], None] = lambda args, state: None


def _local_server(args: argparse.Namespace, command: _LocalServerCommand) -> int:
    if args.action == "start":
        state = command.running()
        if state is not None:
            print(f"Already running: pid {state.pid}, {command.address(state)}")
        else:
            state, directory = command.start(args)
            print(f"Started: pid {state.pid}, {command.address(state)}, data in {directory}")
        command.after_start(args, state)
        return 0
    if args.action == "stop":
        print("Stopped." if command.stop() else f"No {command.name} was running.")
        return 0
    state = command.running()
    if state is None:
        print("Not running.")
        return 3  # like `service status`: non-zero when stopped
    print(f"Running: pid {state.pid}, {command.address(state)}, data in {state.data_dir}")
    return 0


def _broker(args: argparse.Namespace) -> int:
    """``broker start|stop|status``: the local Kafka broker (KRaft, in .data/broker)."""

    if args.action == "grant":
        return _grant(args)
    if args.acls and not args.security:
        raise SystemExit("broker start --acls: needs --security (plaintext clients are the "
                         "broker's own, allowed everything)")  # fmt: skip

    def start(args: argparse.Namespace) -> tuple[Any, Path]:
        broker = local_broker.LocalBroker(fresh=args.fresh, security=args.security,
                                          acls=args.acls)  # fmt: skip
        broker.start()
        if args.security:
            from streamplatform.kafka.security import redacted

            properties = broker.write_client_properties()
            print(f"Clients' settings ({args.security}; secrets hidden here, in the file "
                  f"readable by you only): {properties}")  # fmt: skip
            for key, value in redacted(broker.client_settings()).items():
                print(f"  {key}={value}")
            print(f"`streamplatform topics` and `run` use them; elsewhere: --command-config "
                  f"{properties}")  # fmt: skip
        if args.acls:
            print("ACLs on: the clients' user may do nothing until granted, e.g. "
                  "`streamplatform broker grant --topic clicks --operation READ`")  # fmt: skip
        return broker.state, broker.directory

    return _local_server(args, _LocalServerCommand(
        "broker", local_broker.running_broker, local_broker.stop_broker, start,
        lambda state: f"bootstrap.servers={state.bootstrap_servers}",
    ))  # fmt: skip


_ACL_RESOURCES = {"topic": "TOPIC", "group": "GROUP", "transactional_id": "TRANSACTIONAL_ID"}


def _grant(args: argparse.Namespace) -> int:
    """``broker grant``: an ACL on the running local broker started with ``--acls``."""
    state = local_broker.running_broker()
    if state is None:
        print("No broker is running: `streamplatform broker start --security sasl_ssl --acls`.",
              file=sys.stderr)  # fmt: skip
        return 1
    given = [(kind, getattr(args, kind)) for kind in _ACL_RESOURCES if getattr(args, kind)]
    if args.cluster:
        given.append(("cluster", "kafka-cluster"))
    if len(given) != 1 or not args.operation:
        raise SystemExit("broker grant: one of --topic, --group, --transactional-id, --cluster "
                         "and at least one --operation")  # fmt: skip
    [(kind, name)] = given
    try:
        local_broker.grant(state, _ACL_RESOURCES.get(kind, "BROKER"), name, *args.operation,
                           principal=args.principal, prefixed=args.prefixed)  # fmt: skip
    except ValueError as error:
        print(f"broker grant: {error}", file=sys.stderr)
        return 1
    who = args.principal or "the clients' user"
    shown = "kafka-cluster" if kind == "cluster" else f"{kind.replace('_', '-')} {name}"
    print(f"Granted {who} {', '.join(args.operation)} on {shown}"
          f"{' (names starting with it)' if args.prefixed else ''}.")  # fmt: skip
    return 0


def _new(args: argparse.Namespace) -> int:
    """``new DIR``: a team's own small project (streamplatform/new_project.py)."""
    from streamplatform import new_project

    try:
        written = new_project.create(Path(args.directory))
    except FileExistsError as error:
        print(f"streamplatform new: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"  {path}")
    print(f"A project in {args.directory}: its README.md says how to test and run it.")
    return 0


def _s3(args: argparse.Namespace) -> int:
    """``s3 start|stop|status``: the local S3-compatible server (moto, in .data/s3), for a
    Delta root on object storage (docs/cluster.md)."""
    from streamplatform.storage import local_s3

    def start(args: argparse.Namespace) -> tuple[Any, Path]:
        server = local_s3.LocalS3(fresh=args.fresh)
        server.start()
        return server.state, server.directory

    def settings(args: argparse.Namespace, state: Any) -> None:
        bucket, region, key = local_s3.DEFAULT_BUCKET, local_s3.REGION, local_s3.ACCESS_KEY_ID
        print(f"A job's Delta root there: platform.delta.root=s3://{bucket}/<path> with "
              f"platform.storage.s3.endpoint={state.endpoint}, "
              f"platform.storage.s3.region={region}, platform.storage.s3.access.key.id={key} "
              "and any platform.storage.s3.secret.access.key (the server takes any)")  # fmt: skip

    return _local_server(args, _LocalServerCommand(
        "local S3 server", local_s3.running_s3, local_s3.stop_s3, start,
        lambda state: f"endpoint {state.endpoint}", settings,
    ))  # fmt: skip


def _registry(args: argparse.Namespace) -> int:
    """``registry start|stop|status``: the local Schema Registry (Apicurio, in .data/registry)."""
    from streamplatform.registry import local_registry

    def start(args: argparse.Namespace) -> tuple[Any, Path]:
        registry = local_registry.LocalRegistry(fresh=args.fresh)
        registry.start()
        return registry.state, registry.directory

    command = _LocalServerCommand(
        "Schema Registry", local_registry.running_registry, local_registry.stop_registry, start,
        lambda state: f"schema.registry.url={state.url}",
    )  # fmt: skip
    try:
        return _local_server(args, command)
    except local_registry.NoSuitableJava as error:
        print(f"streamplatform registry start: {error}", file=sys.stderr)
        return 1


def _topics(args: argparse.Namespace) -> int:
    from streamplatform.kafka import TopicSpec, create_topics, describe_topics

    if args.action in ("produce", "consume", "tail"):
        return _produce(args) if args.action == "produce" else _consume(args)
    settings = _connection(args)
    if args.action == "create":
        created = create_topics(settings, [TopicSpec(args.name, args.partitions)])
        print(f"Created {args.name}." if created else f"{args.name} already exists.")
        return 0
    if args.action == "delete":
        from streamplatform.kafka import delete_topics

        try:
            delete_topics(settings, [args.name])
        except RuntimeError as error:
            print(f"streamplatform topics delete: {error}", file=sys.stderr)
            return 1
        print(f"Deleted {args.name}.")
        return 0
    if args.action == "describe":
        from streamplatform.kafka import end_offsets

        try:
            offsets = end_offsets(settings, args.name)
        except LookupError as error:
            print(f"streamplatform topics describe: {error}", file=sys.stderr)
            return 1
        print(f"{args.name}: {len(offsets)} partition{'s' if len(offsets) != 1 else ''}, "
              f"{sum(high - low for low, high in offsets.values())} records")  # fmt: skip
        for partition, (low, high) in sorted(offsets.items()):
            print(f"  partition {partition}: offsets {low}..{high} ({high - low} records)")
        return 0
    for name, partitions in sorted(describe_topics(settings).items()):
        print(f"{name}\t{partitions}")
    return 0


def _consume(args: argparse.Namespace) -> int:
    """``topics consume``: each record of a topic, as text or JSON lines, on stdout; how many
    records were read, and why the read ended, on stderr."""
    from streamplatform.kafka import topic_tools

    def show(record: topic_tools.ConsumedRecord) -> None:
        if args.json:
            print(json.dumps(record.as_json(), ensure_ascii=False), flush=True)
        else:
            print(record.as_text(args.key_serde, args.value_serde, args.stacktrace), flush=True)

    try:
        summary = topic_tools.consume(
            _connection(args), args.name,
            key_serde=args.key_serde, value_serde=args.value_serde,
            from_beginning=not args.from_end, partitions=args.partition,
            max_messages=args.max_messages, timeout_ms=args.timeout_ms, follow=args.follow,
            isolation_level=args.isolation_level, on_record=show,
        )  # fmt: skip
    except topic_tools.TopicToolError as error:
        print(f"streamplatform topics {args.action}: {error}", file=sys.stderr)
        return 1
    ended = {
        "end": "read to the end of every partition",
        "max-messages": f"--max-messages {args.max_messages} reached",
        "timeout": f"nothing new for {args.timeout_ms or 10_000} ms (--timeout-ms)",
    }.get(summary.stopped_by, f"stopped by {summary.stopped_by}")
    plural = "" if summary.records == 1 else "s"
    print(f"{summary.records} record{plural} read from {args.name} ({args.isolation_level}; "
          f"{ended}).", file=sys.stderr, flush=True)  # fmt: skip
    return 0


def _produce(args: argparse.Namespace) -> int:
    """``topics produce``: one record per ``--value`` or per line of stdin."""
    from streamplatform.kafka import topic_tools

    separator = None if args.no_key else args.key_separator.replace("\\t", "\t")
    lines = args.value if args.value else sys.stdin
    try:
        produced = topic_tools.produce(
            _connection(args), args.name, lines,
            key_serde=args.key_serde, value_serde=args.value_serde, key_separator=separator,
            headers=args.header, partition=args.partition,
            null_value=args.null_value, json_lines=args.json_lines,
            timestamp=None if args.timestamp is None
            else topic_tools.parse_timestamp(args.timestamp, "--timestamp"),
        )  # fmt: skip
    except topic_tools.TopicToolError as error:
        print(f"streamplatform topics produce: {error}", file=sys.stderr)
        return 1
    for record in produced if args.json else ():
        print(json.dumps({"partition": record.partition, "offset": record.offset}))
    plural = "" if len(produced) == 1 else "s"
    print(f"{len(produced)} record{plural} written to {args.name}.", file=sys.stderr)
    return 0


def _placement(args: argparse.Namespace) -> int:
    from streamplatform.config import ConfigError
    from streamplatform.placement.planfile import format_plan, load_plan_file

    try:
        plan_file = load_plan_file(
            args.instances,
            num_standby_replicas=args.standbys,
            awareness=args.awareness,
            tasks=args.tasks,
        )
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    try:
        placement = plan_file.plan(strict=args.strict)
    except ConfigError as exc:
        raise SystemExit(f"{args.instances}: {exc}") from None
    print(format_plan(placement, plan_file.clients), end="")
    return 0


def topology_importable_from_cwd() -> None:
    """Let ``--topology`` name a module of the current directory, as ``python -m`` does: the
    current directory goes first on ``sys.path`` (a console script's own first entry is its
    bin directory), and first on ``PYTHONPATH``, which the Python workers of a local Spark
    master inherit (they import the topology's module to unpickle its functions)."""
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if entries[:1] != [cwd]:
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *entries])


def _job(args: argparse.Namespace) -> Any:
    """The StreamingJob of ``--topology``, ``--set``, ``--delta-sink`` and
    ``--delta-state-table``."""
    from streamplatform.runtime.microbatch import StreamingJob

    topology, settings = _topology_and_settings(args)
    if not settings.get("bootstrap.servers"):  # the local broker, as the topic tools use it
        settings = (_local_broker_settings() or {}) | settings
    return StreamingJob(topology, settings, delta_sinks=args.delta_sink,
                        delta_state_tables=args.delta_state_table)  # fmt: skip


def _topology_and_settings(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The Topology of ``--topology`` and the settings of ``--command-config`` and ``--set``."""
    from streamplatform.config import load_object

    topology_importable_from_cwd()
    topology = load_object(args.topology)
    if callable(topology):
        topology = topology()
    settings: dict[str, Any] = read_properties(args.command_config) if args.command_config else {}
    settings |= dict(setting.split("=", 1) for setting in args.set)
    return topology, settings


def _query(args: argparse.Namespace) -> int:
    """`streamplatform query`: a store as of a committed batch (state_query/command.py)."""
    from streamplatform.config import ConfigError
    from streamplatform.state_query import command

    try:
        topology, settings = _topology_and_settings(args)
        return command.run(args, topology, settings)
    except (ConfigError, ImportError, AttributeError) as error:
        print(f"streamplatform query: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS


def _built_job(args: argparse.Namespace, command: str) -> Any:
    """``_job(args)``; None after one line saying why it cannot be built (a setting, the
    topology's import): the command then exits EXIT_BAD_SETTINGS."""
    from streamplatform.config import ConfigError

    try:
        return _job(args)
    except (ConfigError, ImportError, AttributeError, ValueError) as error:
        print(f"streamplatform {command}: {error}", file=sys.stderr)
        return None


# Exit codes of `streamplatform run`, for a supervisor (systemd, Kubernetes) to act on.
EXIT_STOPPED = 0  # stopped on request (SIGTERM/SIGINT), or caught up with --until-caught-up
EXIT_BATCH_FAILED = 1  # a batch failed, nothing of it committed: restart, it is replayed
EXIT_BAD_SETTINGS = 2  # a wrong setting or topology: fix the command, restarting will not help
EXIT_CLAIMED = 3  # another driver holds the job (or took it over): do not start a second one
EXIT_REPLAY_REFUSED = 4  # a person must decide: the uncommitted batch was planned under other
#                          code or settings (ReplayRefused), the topology's stores changed
#                          (UpgradeRefused), or a reset is unfinished; restarting will not help
EXIT_INTERRUPTED = 130  # a signal interrupted the batch in flight (a second SIGTERM/SIGINT):
#                         nothing of it is committed; safe to restart, the batch is replayed

EXIT_CODES_HELP = (
    "exit codes: 0 stopped on request (or caught up); 1 a batch failed, nothing of it "
    "committed (restart: it is replayed); 2 a wrong setting or topology (fix the command); "
    "3 another driver holds the job (do not start a second one); 4 a person must decide: the "
    "uncommitted batch was planned under other code or settings (ReplayRefused; run the old "
    "code, or discard-batch), or an upgrade would start a store empty (UpgradeRefused; name "
    "the operator: docs/upgrades.md), or a reset is unfinished (run it again); 130 "
    "interrupted by a signal in the middle of a batch (a second SIGTERM/SIGINT): nothing of "
    "it is committed, safe to restart, the batch is replayed"
)


@dataclass
class _RunState:
    """Where `streamplatform run` is, for the one line an interrupt gets."""

    job: Any = None
    phase: str = "starting"  # starting | running | closing
    last_batch: int | None = None  # the last batch that committed in this run
    reporter: Any = None  # with --dagster-asset: the ContinuousJobReporter


def _run(args: argparse.Namespace) -> int:
    """A job in continuous mode (StreamingJob.run_forever), one progress line per batch.

    The signals are handled from the first moment: a first SIGTERM/SIGINT at any point —
    while the job starts (settings, claim, Spark), restores or runs a batch — lets the batch in
    flight commit, or starts none, and the process exits 0; a second one interrupts (130)."""
    from streamplatform.runtime.signals import StopOnSignals

    state = _RunState()
    stop = threading.Event()
    try:
        with StopOnSignals(stop, "streamplatform run"):
            code = _run_job(args, state, stop)
    except KeyboardInterrupt as interrupt:
        code = _interrupted(interrupt, state)
    if state.reporter is not None:  # the job's end, as Dagster is told (--dagster-asset)
        with _ignoring_signals():
            state.reporter.finish(_REPORTED_END.get(code, "failed"))
    return code


def _run_job(args: argparse.Namespace, state: _RunState, stop: threading.Event) -> int:
    from streamplatform import JobClaimedError, JobFencedError, ReplayRefused
    from streamplatform.config import ConfigError
    from streamplatform.runtime.reset import ResetUnfinishedError
    from streamplatform.runtime.rewind import RewindUnfinishedError
    from streamplatform.runtime.upgrade import UpgradeRefused

    problem = _dagster_options_problem(args)
    if problem:
        print(f"streamplatform run: {problem}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    job = state.job = _built_job(args, "run")
    if job is None:
        return EXIT_BAD_SETTINGS
    configured = job.config["processing.guarantee"]
    print(f"streamplatform run: {job.config['application.id']}, "
          f"processing.guarantee={configured}", flush=True)  # fmt: skip
    state.reporter = _dagster_reporter(args, job)
    metrics = _metrics_endpoint(args, job)

    def progress(batch: Any) -> None:
        state.last_batch = batch.batch_id
        guarantee = getattr(batch, "guarantee", None) or configured
        print(f"batch {batch.batch_id}: {batch.records_in} in, {batch.records_out} out, "
              f"{batch.duplicates_dropped} duplicates dropped, {batch.dlq_records} to the DLQ, "
              f"lag {batch.lag}, {batch.duration_ms} ms, {guarantee}"
              + (" (replayed)" if batch.replayed else ""), flush=True)  # fmt: skip
        if state.reporter is not None:
            state.reporter.on_batch(batch)
        if metrics is not None:
            metrics.record(batch, claim_epoch=getattr(job.claim, "epoch", None))

    state.phase = "running"
    try:
        if stop.is_set():  # a signal while the job was being built: start nothing
            print("streamplatform run: stopped before the first batch", file=sys.stderr)
        else:
            idle = (
                {}
                if metrics is None
                else {"on_idle": lambda: metrics.observe_lag(job.planner.last_partition_lag)}
            )  # the lag between batches, in the metrics
            job.run_forever(args.trigger_interval_ms, args.idle_interval_ms, on_batch=progress,
                            stop=stop, until_caught_up=args.until_caught_up, **idle)  # fmt: skip
        code = EXIT_STOPPED
    except KeyboardInterrupt as interrupt:
        return _interrupted(interrupt, state)  # its line first, then the job is closed
    except (JobClaimedError, JobFencedError) as error:
        print(f"streamplatform run: {error}", file=sys.stderr)
        code = EXIT_CLAIMED
    except (ReplayRefused, UpgradeRefused, ResetUnfinishedError, RewindUnfinishedError) as error:
        print(f"streamplatform run: a person must decide (exit {EXIT_REPLAY_REFUSED}; "
              f"restarting will not help): {error}", file=sys.stderr)  # fmt: skip
        code = EXIT_REPLAY_REFUSED
    except ConfigError as error:
        print(f"streamplatform run: {error}", file=sys.stderr)
        code = EXIT_BAD_SETTINGS
    except Exception as error:
        behind = _interrupt_behind(error)
        if behind is not None:  # a call into the JVM that the signal cut made its own error
            return _interrupted(behind, state)
        logging.getLogger("streamplatform.cli").exception(
            "streamplatform run: a batch failed; nothing of it is committed, and the next run "
            "replays it"
        )
        code = EXIT_BATCH_FAILED
    except BaseException:
        _close_quietly(job)
        raise
    state.phase = "closing"
    job.close()  # a KeyboardInterrupt here ends in _run's _interrupted, also in one line
    return code


# The job_state a run's last report to Dagster gives for its exit code (else "failed").
_REPORTED_END = {
    EXIT_STOPPED: "stopped",
    EXIT_CLAIMED: "claim_lost",
    EXIT_REPLAY_REFUSED: "replay_refused",
    EXIT_INTERRUPTED: "interrupted",
}


def _metrics_endpoint(args: argparse.Namespace, job: Any) -> Any:
    """With --metrics-port, the job's metrics (streamplatform/metrics.py) served on
    ``--metrics-host:--metrics-port`` for Prometheus; None without."""
    if args.metrics_port is None and not args.otlp_endpoint:
        return None
    from streamplatform.metrics import JobMetrics

    metrics = JobMetrics(job.config["application.id"])
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port, args.metrics_host)
        print(f"streamplatform run: metrics on http://{args.metrics_host}:{args.metrics_port}"
              "/metrics", flush=True)  # fmt: skip
    if args.otlp_endpoint:
        metrics.export_otlp(args.otlp_endpoint)
        print(f"streamplatform run: metrics to {args.otlp_endpoint} (OTLP)", flush=True)
    return metrics


def _dagster_options_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the --dagster-* options, checked before the job starts."""
    batches, seconds = args.dagster_report_every_batches, args.dagster_report_every_seconds
    if not args.dagster_asset and (batches is not None or seconds is not None):
        return "--dagster-report-every-batches/-seconds report to Dagster: give --dagster-asset"
    if batches is not None and batches < 1:
        return f"--dagster-report-every-batches must be at least 1, not {batches}"
    if seconds is not None and seconds <= 0:
        return f"--dagster-report-every-seconds must be positive, not {seconds}"
    return None


def _dagster_reporter(args: argparse.Namespace, job: Any) -> Any:
    """With --dagster-asset, the job's reporter to the instance of DAGSTER_HOME, started."""
    if not args.dagster_asset:
        return None
    from streamplatform.dagster.reporting import ContinuousJobReporter

    # Without an interval of its own, it reports every 30 s (the stall sensor's heartbeat),
    # and with --dagster-report-every-batches alone also then, idle or not.
    seconds = args.dagster_report_every_seconds or 30.0
    return ContinuousJobReporter(job, args.dagster_asset,
                                 every_batches=args.dagster_report_every_batches,
                                 every_seconds=seconds).start()  # fmt: skip


def _interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt among ``error``'s causes and contexts, if a signal is behind it."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _interrupted(interrupt: BaseException, state: _RunState) -> int:
    """The one line of an interrupted `streamplatform run`; EXIT_INTERRUPTED."""
    with _ignoring_signals():  # a third signal does not turn this into a traceback
        reason = str(interrupt.args[0]) if interrupt.args else ""
        name = reason.split()[0] if reason.startswith("SIG") else "SIGINT"
        again = " again:" in reason  # run_forever's: "SIGTERM again: the batch ... interrupted"
        by = f"a second {name}" if again else name
        if state.phase == "running":
            batch = _batch_in_flight(state)
            during = "the batch in flight" if batch is None else f"batch {batch}"
            line = (f"interrupted by {by} during {during}; nothing of it is committed, the "
                    "next run replays it")  # fmt: skip
        elif state.phase == "closing":
            done = "" if state.last_batch is None else f" (batch {state.last_batch} committed)"
            line = f"interrupted by {by} while closing the job{done}; safe to restart"
        else:
            line = f"interrupted by {by} while starting, before any batch ran; safe to restart"
        print(f"streamplatform run: {line} (exit {EXIT_INTERRUPTED})", file=sys.stderr,
              flush=True)  # fmt: skip
        if state.job is not None and state.phase == "running":
            _close_quietly(state.job)
    return EXIT_INTERRUPTED


def _batch_in_flight(state: _RunState) -> int | None:
    """The id of the batch an interrupt hit: the one after the last committed (in this run,
    else in the commit log); None when that cannot be told."""
    if state.last_batch is not None:
        return state.last_batch + 1
    try:
        last = state.job.commit_log.last()
    except Exception:  # noqa: BLE001 - only for the message: a fake job, an unreachable root
        return None
    return 0 if last is None else int(last.batch_id) + 1


def _close_quietly(job: Any) -> None:
    """job.close() after an interrupt, where its own finally did not run; what it raises is
    logged in one line (the claim expires with its lease anyway)."""
    try:
        job.close()
    except Exception as error:  # noqa: BLE001 - after an interrupt, one line is worth more
        logging.getLogger("streamplatform.cli").warning("closing the job: %s", error)


@contextmanager
def _ignoring_signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _discard_batch(args: argparse.Namespace) -> int:
    """StreamingJob.discard_uncommitted_batch() for a job given by import path and settings."""
    job = _built_job(args, "discard-batch")
    if job is None:
        return EXIT_BAD_SETTINGS
    try:
        batch = job.discard_uncommitted_batch()
    finally:
        job.close()
    print(f"Batch {batch} discarded; the next run plans it anew." if batch is not None
          else "Every planned batch is committed: nothing to discard.")  # fmt: skip
    return 0


def _rewind(args: argparse.Namespace) -> int:
    """``rewind --to-batch N``: StreamingJob.rewind for a job given by import path and
    settings (runtime/rewind.py)."""
    from streamplatform import JobClaimedError
    from streamplatform.config import ConfigError

    job = _built_job(args, "rewind")
    if job is None:
        return EXIT_BAD_SETTINGS
    try:
        report = job.rewind(args.to_batch, accept_kafka_repeats=args.accept_kafka_repeats)
    except ConfigError as error:
        print(f"streamplatform rewind: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except JobClaimedError as error:
        print(f"streamplatform rewind: refused, the job runs: {error}", file=sys.stderr)
        return EXIT_CLAIMED
    finally:
        job.close()
    for line in report.lines():
        print(line)
    return 0


def _reset(args: argparse.Namespace) -> int:
    """``reset APPLICATION_ID``: Kafka Streams' application reset tool (runtime/reset.py)."""
    from streamplatform import JobClaimedError
    from streamplatform.config import ConfigError, StreamsConfig
    from streamplatform.runtime.reset import apply_reset, plan_reset

    settings = read_properties(args.command_config) if args.command_config else {}
    settings |= dict(setting.split("=", 1) for setting in args.set)
    settings["application.id"] = args.application_id
    if args.bootstrap_servers:
        settings["bootstrap.servers"] = args.bootstrap_servers
    if not settings.get("bootstrap.servers"):
        settings = (_local_broker_settings() or {}) | settings
    target, value = (
        ("earliest", None) if args.to_earliest else ("latest", None) if args.to_latest
        else ("datetime", args.to_datetime) if args.to_datetime
        else ("duration", args.by_duration)
    )  # fmt: skip
    topics = [t for item in args.input_topics for t in item.split(",") if t]
    try:
        config = StreamsConfig(settings)
        plan = plan_reset(config, topics, target, value)
    except (ConfigError, LookupError) as error:
        print(f"streamplatform reset: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    for line in plan.lines():
        print(line)
    if args.dry_run:
        print("Dry run: nothing was changed.")
        return 0
    try:
        apply_reset(plan, config)
    except JobClaimedError as error:
        print(f"streamplatform reset: refused, the job runs: {error}", file=sys.stderr)
        return EXIT_CLAIMED
    print(f"Reset done: the next run of {args.application_id} starts at the offsets above.")
    return 0


def _maintain(args: argparse.Namespace) -> int:
    """runtime.maintenance.maintain for one application's runtime tables."""
    from streamplatform.home import data_dir
    from streamplatform.runtime.maintenance import maintain

    root = (args.delta_root or str(data_dir() / "delta")).rstrip("/")
    report = maintain(
        f"{root}/{args.application_id}", args.application_id,
        min_changelog_files=args.min_changelog_files, retention_hours=args.retention_hours,
    )  # fmt: skip
    print(json.dumps(report.metadata()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamplatform", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    broker = _server_parser(commands, "broker", _broker,
                            "the local single-node Kafka broker (KRaft)",
                            "wipe the broker's data first", more=("grant",))  # fmt: skip
    broker.add_argument(
        "--security", choices=["sasl_ssl", "sasl_plaintext", "ssl"],
        help="secure the clients' listener: SCRAM over TLS, SCRAM in the clear, or mutual "
        "TLS (a CA, certificates and a user are generated; the clients' settings are written "
        "to client.properties in the broker's data)",
    )  # fmt: skip
    broker.add_argument(
        "--acls", action="store_true",
        help="start: with an authorizer (needs --security): the clients' user may do only what "
        "`broker grant` allows",
    )  # fmt: skip
    grant = broker.add_argument_group("grant (an ACL on a broker started with --acls)")
    for option in ("--topic", "--group", "--transactional-id"):
        grant.add_argument(option, metavar="NAME", help="the resource ('*': any)")
    grant.add_argument("--cluster", action="store_true", help="the cluster resource")
    grant.add_argument("--operation", action="append", metavar="OP",
                       choices=["ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE",
                                "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE"],
                       help="READ, WRITE, DESCRIBE, CREATE, ALL, ... (repeatable)")  # fmt: skip
    grant.add_argument("--prefixed", action="store_true", help="names starting with NAME")
    grant.add_argument("--principal", help="default: the generated user (User:<name>)")

    _server_parser(commands, "registry", _registry,
                   "a local Schema Registry (Apicurio Registry with Confluent's API; "
                   "docs/schema-registry.md)", "wipe the registry's schemas first")  # fmt: skip

    new = commands.add_parser(
        "new", help="write a team's own small project into DIR: a topology, its test, a Dagster "
        "definitions.py and a README whose commands run it",
    )  # fmt: skip
    new.add_argument("directory", metavar="DIR")
    new.set_defaults(run=_new)

    _server_parser(commands, "s3", _s3,
                   "a local S3-compatible server (moto) for a Delta root on object storage; "
                   "its objects live as long as it runs",
                   "wipe the server's data first")  # fmt: skip

    topics = commands.add_parser(
        "topics", help="create, list, produce to or read topics (a DLQ, an output topic)"
    )
    topics.add_argument("--bootstrap-servers", help="default: the local broker")
    topics.set_defaults(run=_topics)
    _topic_commands(topics)

    from streamplatform.placement import planfile

    placement = commands.add_parser(
        "placement",
        help="KIP-708 rack-aware standby placement",
        description=planfile.PLAN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    placement.add_argument("action", choices=["plan"])
    placement.add_argument("--instances", required=True, metavar="FILE", help="instances YAML")
    placement.add_argument("--standbys", type=int, metavar="N", help="num.standby.replicas")
    placement.add_argument(
        "--awareness", metavar="KEYS", help="rack.aware.assignment.tags, e.g. zone,cluster"
    )
    placement.add_argument("--tasks", type=int, metavar="N", help="place tasks 0_0 .. 0_<N-1>")
    placement.add_argument("--strict", action="store_true", help="never break a tag rule")
    placement.set_defaults(run=_placement)

    run = commands.add_parser(
        "run",
        help="run a job in continuous mode until SIGTERM/SIGINT (the batch in flight "
        "finishes); exit 0 stopped, 1 a batch failed, 2 wrong settings, 3 claimed elsewhere, "
        "4 a person must decide (ReplayRefused), 130 interrupted mid-batch (replayed)",
        description="Run a job in continuous mode until SIGTERM/SIGINT: the batch in flight "
        "finishes and commits, then the job stops (a second signal interrupts the batch). "
        "One line at start names the job and its processing.guarantee, then one progress "
        "line per batch.",
        epilog=EXIT_CODES_HELP,
    )
    _job_arguments(run)
    run.add_argument(
        "--trigger-interval-ms", type=int, default=0, metavar="MS",
        help="start a batch at most this often (default 0: as soon as the previous one commits)",
    )  # fmt: skip
    run.add_argument(
        "--idle-interval-ms", type=int, default=1_000, metavar="MS",
        help="with nothing to read, look again after this long (default 1000)",
    )  # fmt: skip
    run.add_argument(
        "--until-caught-up", action="store_true", help="stop once every partition is read"
    )
    run.add_argument(
        "--metrics-port", type=int, metavar="PORT",
        help="serve the job's metrics (Kafka Streams' names) for Prometheus on this port "
        "(docs/operations.md)",
    )  # fmt: skip
    run.add_argument(
        "--otlp-endpoint", metavar="URL",
        help="also push the metrics to an OpenTelemetry collector over OTLP/HTTP, e.g. "
        "http://collector:4318/v1/metrics (needs streamplatform[otel])",
    )  # fmt: skip
    run.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                     help="the address the metrics endpoint listens on (default 127.0.0.1; "
                     "0.0.0.0 for every interface)")  # fmt: skip
    dagster = run.add_argument_group(
        'reporting to Dagster (off by default; docs/tutorial.md, "Continuous jobs")'
    )
    dagster.add_argument(
        "--dagster-asset", metavar="KEY",
        help="report the job, without a run, to the Dagster instance of DAGSTER_HOME: as the "
        "asset KEY (its StreamingJobSpec's name) and each Delta sink as "
        "delta/<application.id>/<topic>; a failed report never stops the job",
    )  # fmt: skip
    dagster.add_argument(
        "--dagster-report-every-batches", type=int, metavar="N",
        help="report after every N committed batches",
    )  # fmt: skip
    dagster.add_argument(
        "--dagster-report-every-seconds", type=float, metavar="S",
        help="report at least every S seconds, also when idle (default 30)",
    )  # fmt: skip
    run.set_defaults(run=_run)

    discard = commands.add_parser(
        "discard-batch",
        help="drop the uncommitted batch's Delta outputs and plan, so that a changed job "
        "plans it anew (the way on after ReplayRefused; docs/guarantees.md)",
    )
    _job_arguments(discard)
    discard.set_defaults(run=_discard_batch)

    query = commands.add_parser(
        "query",
        help="a store of a job as of a committed batch, from its Delta changelog, as JSON "
        "lines; the job may be running (docs/queries.md)",
    )
    _topology_arguments(query)
    from streamplatform.state_query import command as query_command

    query_command.add_arguments(query)
    query.set_defaults(run=_query)

    rewind = commands.add_parser(
        "rewind",
        help="put a stopped job back to just after a committed batch: its Delta sinks, logs, "
        "changelog, consumer group and stores (docs/operations.md)",
    )
    _job_arguments(rewind)
    rewind.add_argument("--to-batch", type=int, required=True, metavar="N",
                        help="the last batch to keep")  # fmt: skip
    rewind.add_argument(
        "--accept-kafka-repeats", action="store_true",
        help="rewind a job with Kafka sink topics: what the later batches wrote there stays, "
        "and the next run writes it again",
    )  # fmt: skip
    rewind.set_defaults(run=_rewind)

    reset = commands.add_parser(
        "reset",
        help="reset a job as Kafka Streams' reset tool does: its inputs to a position, its "
        "internal state and consumer group offsets removed, sinks untouched "
        "(docs/operations.md)",
    )
    reset.add_argument("application_id", metavar="APPLICATION_ID")
    reset.add_argument("--input-topics", action="append", default=[], required=True,
                       metavar="TOPIC[,TOPIC]", help="the job's input topics")  # fmt: skip
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true", help="each partition's first offset")
    where.add_argument("--to-latest", action="store_true", help="each partition's end")
    where.add_argument(
        "--to-datetime",
        metavar="ISO-8601",
        help="the first record at or after a time: 2026-11-28T12:00:00Z",
    )
    where.add_argument(
        "--by-duration",
        metavar="DURATION",
        help="the first record at or after that long ago: PT1H, P1D",
    )
    reset.add_argument(
        "--dry-run", action="store_true", help="list what would change, change nothing"
    )
    reset.add_argument("--bootstrap-servers", default="", help="default: the local broker")
    reset.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="the job's settings that say where its state is: platform.delta.root, state.dir, "
        "platform.storage.* (as the job runs with)",
    )  # fmt: skip
    reset.add_argument(
        "--command-config",
        metavar="FILE",
        help="settings from a properties file (security included)",
    )
    reset.set_defaults(run=_reset)

    maintenance = commands.add_parser(
        "maintain",
        help="snapshot each task's changelog, compact, checkpoint and vacuum a job's runtime "
        "tables (safe while the job runs; docs/cluster.md)",
    )
    maintenance.add_argument("--application-id", required=True)
    maintenance.add_argument(
        "--delta-root", default="", help="platform.delta.root (default .data/delta)"
    )
    maintenance.add_argument(
        "--min-changelog-files", type=int, default=10, metavar="N",
        help="snapshot a task's changelog once it has N files (default 10)",
    )  # fmt: skip
    maintenance.add_argument(
        "--retention-hours", type=float, default=168.0, metavar="H",
        help="vacuum only files removed longer ago than H hours (default 168, at least 1)",
    )  # fmt: skip
    maintenance.set_defaults(run=_maintain)
    return parser


def _server_parser(
    commands: Any, name: str, run: Callable[[argparse.Namespace], int], help: str, fresh: str,
    more: tuple[str, ...] = (),
) -> argparse.ArgumentParser:  # fmt: skip
    """The ``start|stop|status [--fresh]`` command of a local server (_local_server), and
    ``more`` actions of its own."""
    command = commands.add_parser(name, help=help)
    command.add_argument("action", choices=["start", "stop", "status", *more])
    command.add_argument("--fresh", action="store_true", help=fresh)
    command.set_defaults(run=run)
    return command  # type: ignore[no-any-return]


def _topic_commands(topics: argparse.ArgumentParser) -> None:
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        command = actions.add_parser(name, help=help, description=help, **kwargs)
        command.add_argument(
            "--bootstrap-servers", default=argparse.SUPPRESS, help="default: the local broker"
        )
        command.add_argument(
            "--command-config", default=argparse.SUPPRESS, metavar="FILE",
            help="client settings, security included, in a properties file (the Java client's "
            "names, as Kafka's tools take them; docs/security.md)",
        )  # fmt: skip
        return command

    create = action("create", "create a topic (nothing happens if it exists)")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--partitions", type=int, default=1)
    action("list", "the topics and their partition counts")
    delete = action("delete", "delete a topic and its records")
    delete.add_argument("name", metavar="NAME")
    describe = action("describe", "a topic's partitions and each one's offsets")
    describe.add_argument("name", metavar="NAME")

    serdes = ["string", "json", "bytes", "long"]
    produce = action(
        "produce",
        "write one record per line of stdin (or per --value): key<TAB>value, or a value alone "
        "when the line has no separator; bytes serde: hex digits",
    )
    produce.add_argument("name", metavar="TOPIC")
    produce.add_argument(
        "--value", action="append", metavar="LINE",
        help="a record, key<TAB>value or value, instead of stdin (repeatable)",
    )  # fmt: skip
    produce.add_argument(
        "--key-separator", default="\t", metavar="SEP", help="between key and value (default TAB)"
    )
    produce.add_argument("--no-key", action="store_true", help="the whole line is the value")
    produce.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE",
        help="a header on every record (repeatable; UTF-8)",
    )  # fmt: skip
    produce.add_argument(
        "--partition", type=int, metavar="P", help="all to partition P (default: by key)"
    )
    produce.add_argument(
        "--null-value", metavar="TEXT", help="a value equal to TEXT is sent as null (a tombstone)"
    )
    produce.add_argument(
        "--timestamp", metavar="MS|ISO",
        help="every record's timestamp: ms since the epoch or an ISO-8601 date-time (tasks "
        "merge their partitions by it; default: the time of sending)",
    )  # fmt: skip
    produce.add_argument(
        "--json-lines", action="store_true",
        help='each line a JSON object: {"key", "value", "timestamp", "partition", "headers"}, '
        "every field optional (a record's own timestamp and partition)",
    )  # fmt: skip
    produce.add_argument("--key-serde", choices=serdes, default="string")
    produce.add_argument("--value-serde", choices=serdes, default="string")
    produce.add_argument(
        "--json", action="store_true", help="print each record's partition and offset as JSON"
    )

    consume = action(
        "consume",
        "print a topic's records: partition, offset, timestamp, key, value, headers (as text "
        "when UTF-8, else hex). Ends at the end of every partition unless --follow; the count "
        "goes to stderr. Joins no consumer group, commits nothing.",
        aliases=["tail"],
    )
    consume.add_argument("name", metavar="TOPIC")
    start = consume.add_mutually_exclusive_group()
    start.add_argument(
        "--from-beginning", action="store_true", help="from the first record (the default)"
    )
    start.add_argument(
        "--from-end", action="store_true", help="only records written from now on (with --follow)"
    )
    consume.add_argument(
        "--partition", type=int, action="append", metavar="P", help="only P (repeatable)"
    )
    consume.add_argument("--max-messages", type=int, metavar="N", help="stop after N records")
    consume.add_argument(
        "--timeout-ms", type=int, metavar="MS",
        help="stop after MS without a record (default 10000; with --follow: never)",
    )  # fmt: skip
    consume.add_argument(
        "--follow", action="store_true",
        help="keep waiting for new records until Ctrl-C or SIGTERM (exit 0)",
    )  # fmt: skip
    consume.add_argument(
        "--isolation-level", choices=["read_committed", "read_uncommitted"],
        default="read_committed",
        help="read_committed (default) hides open and aborted transactions' records",
    )  # fmt: skip
    consume.add_argument("--key-serde", choices=serdes, default="string")
    consume.add_argument("--value-serde", choices=serdes, default="string")
    consume.add_argument("--json", action="store_true", help="one JSON object per record")
    consume.add_argument(
        "--stacktrace", action="store_true",
        help="show a header of several lines (a DLQ record's stack trace) whole, not by its "
        "last line",
    )  # fmt: skip


def _job_arguments(command: argparse.ArgumentParser) -> None:
    _topology_arguments(command)
    command.add_argument(
        "--delta-sink",
        action="append",
        default=[],
        metavar="TOPIC",
        help="a sink topic written to a Delta table instead of Kafka",
    )
    _delta_state_table_argument(command)


def _topology_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--topology", required=True, metavar="IMPORT.PATH",
        help="package.module:name of the Topology, or of a function that builds it",
    )  # fmt: skip
    command.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a job setting (application.id, bootstrap.servers, platform.delta.root, ...)",
    )  # fmt: skip
    command.add_argument(
        "--command-config", metavar="FILE",
        help="job settings from a properties file, before --set: keep secrets (sasl.jaas.config, "
        "store passwords) there rather than on the command line (docs/security.md)",
    )  # fmt: skip


def _delta_state_table_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--delta-state-table",
        action="append",
        default=[],
        metavar="TOPIC",
        help="a sink topic of a table's updates whose Delta table also keeps the table's "
        "current state, one row per key (<topic>_state)",
    )


def _quiet_py4j(record: logging.LogRecord) -> bool:
    """Drop py4j's own reports (some through the root logger) below WARNING, and the traceback
    it logs when a signal interrupts a call into the JVM: noise beside the one line an
    interrupted run prints. Failures still reach the user as the exceptions PySpark raises."""
    if not (record.name.startswith("py4j") or f"{os.sep}py4j{os.sep}" in record.pathname):
        return True
    if record.levelno < logging.WARNING:
        return False
    error = record.exc_info[1] if record.exc_info else None
    # The interrupt itself, or what closing the interrupted call raised, is not shown.
    return error is None or _interrupt_behind(error) is None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_quiet_py4j)
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except StreamPlatformError as error:
        if args.command == "run":  # its own exit codes and lines (_run)
            raise
        print(f"streamplatform {args.command}: {error}", file=sys.stderr)  # one line, no trace
        return 1
    except KeyboardInterrupt as interrupt:
        if args.command == "run":  # escaped _run's own handling: the same line and code
            return _interrupted(interrupt, _RunState(phase="starting"))
        print(f"streamplatform {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
