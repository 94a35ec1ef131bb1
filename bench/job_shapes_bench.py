"""Job shapes beyond "one Kafka source, one Delta sink": before and after, in one run.

Two jobs a team brings first, each on the same records, timed in steady state (after a warm-up
run on other data), the median of ``--repeats`` runs:

- ``kafka+delta``: page views, deduplicated by event id within 10 minutes, to a Delta table,
  and counted per user by a processor with a typed store, the counts to a Kafka topic
  (exactly_once_v2);
- ``temporal-join``: transactions joined with the FX rate valid at their time (a versioned
  table, KIP-889), to a Delta table;
- ``repartition``: page views deduplicated by event id across users (KIP-655's
  ``deduplicate``: a repartition by id, two sub-topologies), to a Delta table.

``--shapes`` picks some of them (comma-separated).

``--before <git revision>``: the same bench also runs on that revision's library (a git
worktree of it, on the PYTHONPATH of a child process, with this checkout's built C core), and
the ratio after/before is printed per shape, with the execution path each run took
(``BatchResult.path``; "cached" for code from before it was named). Usage::

    .venv/bin/python bench/job_shapes_bench.py --records 300000 --before ea41ea4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTITIONS = 3
USERS = 1000
REPO = Path(__file__).resolve().parents[1]


def build_views(topic: str, counts: str, deduplicated: str):
    from streamplatform import Processor, StreamsBuilder
    from streamplatform.serdes import Serdes
    from streamplatform.state import Stores

    class CountViews(Processor):
        def init(self, context):
            super().init(context)
            self.counts = context.get_state_store("view-counts")

        def process(self, record):
            count = (self.counts.get(record.key) or 0) + 1
            self.counts.put(record.key, count)
            self.context.forward(record._replace(value=count))

    b = StreamsBuilder()
    b.add_state_store(
        Stores.key_value_store_builder(
            Stores.persistent_key_value_store("view-counts"), Serdes.string(), Serdes.long()
        )
    )
    real = b.stream(topic, Serdes.string(), Serdes.json()).deduplicate_by_key_value(
        lambda user, view: view["event_id"], 10 * 60 * 1000
    )
    real.to(deduplicated)
    real.process(CountViews, "view-counts").to(counts, value_serde=Serdes.long())
    return b.build()


def build_join(transactions: str, rates: str, enriched: str):
    from datetime import timedelta

    from streamplatform import StreamsBuilder
    from streamplatform.serdes import Serdes
    from streamplatform.state import Stores

    b = StreamsBuilder()
    table = b.table(
        rates, Serdes.string(), Serdes.json(),
        store=Stores.persistent_versioned_key_value_store("rates", timedelta(days=1)),
    )  # fmt: skip
    (
        b.stream(transactions, Serdes.string(), Serdes.json())
        .join(table, lambda tx, rate: {**tx, "eur": tx["amount"] * rate["rate"]})
        .to(enriched)
    )
    return b.build()


def build_repartition(topic: str, deduplicated: str):
    from streamplatform import StreamsBuilder
    from streamplatform.serdes import Serdes

    b = StreamsBuilder()
    b.stream(topic, Serdes.string(), Serdes.json()).deduplicate(
        lambda user, view: view["event_id"], 10 * 60 * 1000
    ).to(deduplicated)
    return b.build()


def produce(settings: dict, topic: str, records: int, kind: str, seed: int) -> None:
    from streamplatform.kafka import producer

    out = producer(settings, **{"linger.ms": 50, "batch.size": 1_000_000})
    start = 1_767_225_600_000 + seed
    for index in range(records):
        user = f"u{(index * 7919 + seed) % USERS:04d}"
        if kind == "views":
            event = index - 3 if index % 5 == 0 and index >= 3 else index  # 20% duplicates
            value = {"event_id": f"e{seed}-{event}", "page": f"/p{index % 13}"}
        elif kind == "rates":
            value = {"rate": 1 + (index % 50) / 100}
            user = f"c{index % 20}"
        else:
            value = {"amount": index % 997}
            user = f"c{index % 20}"
        out.produce(topic, key=user, value=json.dumps(value), timestamp=start + index * 10,
                    partition=index % PARTITIONS)  # fmt: skip
        if index % 20_000 == 0:
            out.poll(0)
    assert out.flush(120) == 0


def run_shapes(args: argparse.Namespace) -> dict:
    """This process's library on both shapes: ``{shape: {"seconds": [...], "paths": [...]}}``."""
    from streamplatform import StreamingJob
    from streamplatform.kafka import LocalBroker, TopicSpec, create_topics
    from streamplatform.spark import spark_session

    found: dict = {}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            spark = spark_session(master="local[2]", app_name="job-shapes-bench")
            create_topics(settings, [TopicSpec(t, PARTITIONS) for t in
                                     ("views-w", "views", "tx-w", "tx", "rates")])  # fmt: skip
            produce(settings, "views-w", args.records // 4, "views", seed=7)
            produce(settings, "views", args.records, "views", seed=1)
            produce(settings, "rates", 200, "rates", seed=-10_000)  # before every transaction
            produce(settings, "tx-w", args.records // 4, "tx", seed=7)
            produce(settings, "tx", args.records, "tx", seed=1)

            def run(shape: str, name: str, source: str) -> tuple[float, set[str]]:
                config = {
                    "application.id": name,
                    "bootstrap.servers": settings["bootstrap.servers"],
                    "processing.guarantee": "exactly_once_v2",
                    "state.dir": str(tmp / name / "state"),
                    "platform.delta.root": str(tmp / "delta"),
                    "platform.max.records.per.batch": args.batch // PARTITIONS,
                }
                if shape == "kafka+delta":
                    create_topics(settings, [TopicSpec(f"{name}-counts", PARTITIONS)])
                    topology = build_views(source, f"{name}-counts", "deduplicated")
                    sinks = ["deduplicated"]
                elif shape == "repartition":
                    topology = build_repartition(source, "deduplicated")
                    sinks = ["deduplicated"]
                else:
                    topology = build_join(source, "rates", "enriched")
                    sinks = ["enriched"]
                job = StreamingJob(topology, config, spark=spark, delta_sinks=sinks)
                started = time.perf_counter()
                results = job.run_until_caught_up()
                seconds = time.perf_counter() - started
                job.close()
                return seconds, {getattr(r, "path", "") or "cached" for r in results}

            sources = {"kafka+delta": "views", "temporal-join": "tx", "repartition": "views"}
            for shape in args.shapes.split(","):
                source = sources[shape]
                run(shape, f"{shape.replace('+', '-')}-warmup", f"{source}-w")
                seconds, paths = [], set()
                for repeat in range(args.repeats):
                    elapsed, used = run(shape, f"{shape.replace('+', '-')}-{repeat}", source)
                    seconds.append(elapsed)
                    paths |= used
                    print(f"  {shape:13s} run {repeat}: {args.records / elapsed:>9,.0f} records/s "
                          f"({elapsed:.1f} s, path {', '.join(sorted(used))})",
                          file=sys.stderr, flush=True)  # fmt: skip
                found[shape] = {"seconds": seconds, "paths": sorted(paths)}
            spark.stop()
    return found


def run_before(args: argparse.Namespace, revision: str) -> dict:
    """The same bench on ``revision``'s library, in a child process."""
    worktree = Path(tempfile.mkdtemp(prefix="bench-before-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree),
                    revision], check=True, capture_output=True)  # fmt: skip
    try:
        # The JVM jars and the C cores are not committed: this checkout's (every one of
        # them: a core missing there would run its Python reference instead).
        (worktree / ".jvm").symlink_to(REPO / ".jvm")
        for built in (REPO / "platform").rglob("_*.so"):
            shutil.copy(built, worktree / built.relative_to(REPO))
        library = str(worktree / "platform")
        env = os.environ | {"PYTHONPATH": library, "PYSPARK_PYTHON": sys.executable}
        child = subprocess.run(
            [sys.executable, __file__, "--records", str(args.records), "--batch",
             str(args.batch), "--repeats", str(args.repeats), "--shapes", args.shapes,
             "--json"],
            env=env, check=True, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        return json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
                       check=False, capture_output=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=60_000, help="records per batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="a git revision to compare with, in the same run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--shapes", default="kafka+delta,temporal-join,repartition")
    parser.add_argument("--now-first", action="store_true",
                        help="run this checkout before the --before revision")  # fmt: skip
    args = parser.parse_args()
    if args.json:
        print(json.dumps(run_shapes(args)))
        return
    # Which goes first matters on a small machine (a warm page cache, a broker's grown log):
    # --now-first swaps the order, to tell that from a real difference.
    if args.now_first:
        after = run_shapes(args)
        before = run_before(args, args.before) if args.before else None
    else:
        before = run_before(args, args.before) if args.before else None
        after = run_shapes(args)
    print(f"{args.records:,} records a run, batches of {args.batch:,}, {PARTITIONS} partitions, "
          f"local[2], exactly_once_v2, median of {args.repeats} runs")  # fmt: skip
    for shape, figures in after.items():
        median = statistics.median(figures["seconds"])
        line = (f"{shape:13s} now: {args.records / median:>9,.0f} records/s ({median:.1f} s; "
                f"path {', '.join(figures['paths'])})")  # fmt: skip
        if before is not None:
            then = statistics.median(before[shape]["seconds"])
            paths = ", ".join(before[shape]["paths"])
            line += (f"; {args.before}: {args.records / then:>9,.0f} records/s ({then:.1f} s; "
                     f"path {paths}); now/before {then / median:.2f}x")  # fmt: skip
        print(line)


if __name__ == "__main__":
    main()
