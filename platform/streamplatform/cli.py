"""The ``streamplatform`` console script.

streamplatform broker start [--fresh] | stop | status
streamplatform topics create NAME [--partitions N] | list   (against --bootstrap-servers
                                                             or the local broker)
streamplatform placement plan --instances FILE [--standbys N] [--awareness zone,cluster]
                              [--tasks N] [--strict]
"""

from __future__ import annotations

import argparse
import logging
import sys

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


def _discard_batch(args: argparse.Namespace) -> int:
    """StreamingJob.discard_uncommitted_batch() for a job given by import path and settings."""
    from streamplatform.config import load_object
    from streamplatform.runtime.microbatch import StreamingJob

    topology = load_object(args.topology)
    if callable(topology):
        topology = topology()
    settings = dict(setting.split("=", 1) for setting in args.set)
    job = StreamingJob(topology, settings, delta_sinks=args.delta_sink)
    try:
        batch = job.discard_uncommitted_batch()
    finally:
        job.close()
    print(f"Batch {batch} discarded; the next run plans it anew." if batch is not None
          else "Every planned batch is committed: nothing to discard.")  # fmt: skip
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

    discard = commands.add_parser(
        "discard-batch",
        help="drop the uncommitted batch's Delta outputs and plan, so that a changed job "
        "plans it anew (the way on after ReplayRefused; docs/guarantees.md)",
    )
    discard.add_argument(
        "--topology", required=True, metavar="IMPORT.PATH",
        help="package.module:name of the Topology, or of a function that builds it",
    )  # fmt: skip
    discard.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a job setting (application.id, bootstrap.servers, platform.delta.root, ...)",
    )  # fmt: skip
    discard.add_argument("--delta-sink", action="append", default=[], metavar="TOPIC")
    discard.set_defaults(run=_discard_batch)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if args.command == "topics" and args.action == "create" and not args.name:
        build_parser().error("topics create needs a topic NAME")
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
