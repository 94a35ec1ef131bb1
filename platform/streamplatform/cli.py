"""The ``streamplatform`` console script.

streamplatform broker start [--fresh] | stop | status
streamplatform topics create NAME [--partitions N] | list   (against --bootstrap-servers
                                                             or the local broker)
streamplatform placement plan --instances FILE [--standbys N] [--awareness zone,cluster]
                              [--tasks N] [--strict]
streamplatform run --topology pkg.module:name --set KEY=VALUE ... [--delta-sink TOPIC]
                   [--trigger-interval-ms MS] [--until-caught-up]
streamplatform discard-batch --topology pkg.module:name --set KEY=VALUE ... [--delta-sink TOPIC]
streamplatform maintain --application-id ID [--delta-root URI] [--min-changelog-files N]
                        [--retention-hours H]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

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


def _broker(args: argparse.Namespace) -> int:
    if args.action == "start":
        state = local_broker.running_broker()
        if state is not None:
            print(f"Already running: pid {state.pid}, bootstrap.servers={state.bootstrap_servers}")
            return 0
        broker = local_broker.LocalBroker(fresh=args.fresh)
        servers = broker.start()
        print(f"Started: pid {broker.state.pid if broker.state else '?'}, "
              f"bootstrap.servers={servers}, data in {broker.directory}")  # fmt: skip
        return 0
    if args.action == "stop":
        stopped = local_broker.stop_broker()
        print("Stopped." if stopped else "No broker was running.")
        return 0
    state = local_broker.running_broker()
    if state is None:
        print("Not running.")
        return 3  # like `service status`: non-zero when stopped
    print(f"Running: pid {state.pid}, bootstrap.servers={state.bootstrap_servers}, "
          f"data in {state.data_dir}")  # fmt: skip
    return 0


def _topics(args: argparse.Namespace) -> int:
    from streamplatform.kafka import TopicSpec, create_topics, describe_topics

    settings = {"bootstrap.servers": _bootstrap(args)}
    if args.action == "create":
        created = create_topics(settings, [TopicSpec(args.name, args.partitions)])
        print(f"Created {args.name}." if created else f"{args.name} already exists.")
        return 0
    for name, partitions in sorted(describe_topics(settings).items()):
        print(f"{name}\t{partitions}")
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


def _job(args: argparse.Namespace) -> Any:
    """The StreamingJob of ``--topology``, ``--set`` and ``--delta-sink``."""
    from streamplatform.config import load_object
    from streamplatform.runtime.microbatch import StreamingJob

    topology = load_object(args.topology)
    if callable(topology):
        topology = topology()
    settings = dict(setting.split("=", 1) for setting in args.set)
    return StreamingJob(topology, settings, delta_sinks=args.delta_sink)


# Exit codes of `streamplatform run`, for a supervisor (systemd, Kubernetes) to act on.
EXIT_STOPPED = 0  # stopped on request (SIGTERM/SIGINT), or caught up with --until-caught-up
EXIT_BATCH_FAILED = 1  # a batch failed, nothing of it committed: restart, it is replayed
EXIT_BAD_SETTINGS = 2  # a wrong setting or topology: fix the command, restarting will not help
EXIT_CLAIMED = 3  # another driver holds the job (or took it over): do not start a second one


def _run(args: argparse.Namespace) -> int:
    """A job in continuous mode (StreamingJob.run_forever), one progress line per batch."""
    from streamplatform.config import ConfigError
    from streamplatform.runtime.claim import JobClaimedError, JobFencedError

    def progress(batch: Any) -> None:
        print(f"batch {batch.batch_id}: {batch.records_in} in, {batch.records_out} out, "
              f"{batch.duplicates_dropped} duplicates dropped, {batch.dlq_records} to the DLQ, "
              f"lag {batch.lag}, {batch.duration_ms} ms" + (" (replayed)" if batch.replayed
                                                           else ""), flush=True)  # fmt: skip

    try:
        job = _job(args)
    except (ConfigError, ImportError, AttributeError, ValueError) as error:
        print(f"streamplatform run: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        if args.until_caught_up:
            for batch in job.run_until_caught_up():
                progress(batch)
        else:
            job.run_forever(args.trigger_interval_ms, args.idle_interval_ms, on_batch=progress)
    except (JobClaimedError, JobFencedError) as error:
        print(f"streamplatform run: {error}", file=sys.stderr)
        return EXIT_CLAIMED
    except ConfigError as error:
        print(f"streamplatform run: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except Exception:
        logging.getLogger("streamplatform.cli").exception(
            "streamplatform run: a batch failed; nothing of it is committed, and the next run "
            "replays it"
        )
        return EXIT_BATCH_FAILED
    finally:
        job.close()
    return EXIT_STOPPED


def _discard_batch(args: argparse.Namespace) -> int:
    """StreamingJob.discard_uncommitted_batch() for a job given by import path and settings."""
    job = _job(args)
    try:
        batch = job.discard_uncommitted_batch()
    finally:
        job.close()
    print(f"Batch {batch} discarded; the next run plans it anew." if batch is not None
          else "Every planned batch is committed: nothing to discard.")  # fmt: skip
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

    broker = commands.add_parser("broker", help="the local single-node Kafka broker (KRaft)")
    broker.add_argument("action", choices=["start", "stop", "status"])
    broker.add_argument("--fresh", action="store_true", help="wipe the broker's data first")
    broker.set_defaults(run=_broker)

    topics = commands.add_parser("topics", help="create or list topics")
    topics.add_argument("action", choices=["create", "list"])
    topics.add_argument("name", nargs="?")
    topics.add_argument("--partitions", type=int, default=1)
    topics.add_argument("--bootstrap-servers")
    topics.set_defaults(run=_topics)

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
        "finishes); exit 0 stopped, 1 a batch failed, 2 wrong settings, 3 claimed elsewhere",
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
    run.set_defaults(run=_run)

    discard = commands.add_parser(
        "discard-batch",
        help="drop the uncommitted batch's Delta outputs and plan, so that a changed job "
        "plans it anew (the way on after ReplayRefused; docs/guarantees.md)",
    )
    _job_arguments(discard)
    discard.set_defaults(run=_discard_batch)

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


def _job_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--topology", required=True, metavar="IMPORT.PATH",
        help="package.module:name of the Topology, or of a function that builds it",
    )  # fmt: skip
    command.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a job setting (application.id, bootstrap.servers, platform.delta.root, ...)",
    )  # fmt: skip
    command.add_argument(
        "--delta-sink",
        action="append",
        default=[],
        metavar="TOPIC",
        help="a sink topic written to a Delta table instead of Kafka",
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if args.command == "topics" and args.action == "create" and not args.name:
        build_parser().error("topics create needs a topic NAME")
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
