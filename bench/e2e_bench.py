"""End to end: Kafka -> dedup -> Delta, ours (exactly once) against Spark's native streaming.

Same run, same data: N records (default 2M) in a 3-partition topic on the local broker, 20%
duplicates (same key and id within the interval), 3% out of order. Both on ``local[2]``:

- ours: ``StreamingJob`` running ``deduplicate_by_key_value(id, 10 min)`` with a Delta sink,
  ``processing.guarantee=exactly_once_v2``, everything in one micro-batch, as ``availableNow``
  does;
- native: Structured Streaming Kafka source -> ``withWatermark`` ->
  ``dropDuplicatesWithinWatermark([key, id])`` -> Delta sink, ``trigger(availableNow=True)``.

Both run once on other data of the same size first (``--warmup-records``, default
``--records``): the JVM's class loading and JIT are then charged to neither. After a 500k
warm-up the first timed run, whichever path it was, still spent several seconds more JVM CPU
than the later ones and warmed the code both paths share (the Kafka reader, the parquet and
Delta writers) for the next. Then ``--repeats`` times each in alternating order on
the same data. Prints records/s of both
(median, spread) and the ratio; then our batch latency p50/p99 with 10k-record batches
(``--latency-records`` records), and the peak RSS of the Python workers during our runs (summed
over Spark's Python worker processes, sampled every 0.2 s) and of the driver process.

    .venv/bin/python bench/e2e_bench.py [--records 2000000] [--repeats 5] [--latency-records 100000]

``--sink kafka``: the same job writing its output to a Kafka topic instead, three ways on the
same data in the same run: ours exactly_once_v2 (a Kafka transaction per task and batch, the
offsets in the consumer group), ours at_least_once (idempotent producers, acknowledged), and
Spark's native Kafka sink (at least once) behind ``dropDuplicatesWithinWatermark``. Prints
records/s of each and the price of exactly once: EOS time / ALOS time (target at most 1.10).

    .venv/bin/python bench/e2e_bench.py --sink kafka [--records 2000000] [--repeats 5]

``--before <git revision>``: our job also runs on that revision's library, on the same topics
of the same broker in the same run, so that a regression shows: a git worktree of the revision
with this checkout's built C cores, in a child process of its own (its own Spark session, its
own warm-up run, then ``--repeats`` runs). The summary adds its records/s, its path and the
ratio now/before. The child runs after this process's runs, while this process's Spark session
idles; ``--before-first`` runs it first instead, to tell the order's effect from the code's.

    .venv/bin/python bench/e2e_bench.py --records 2000000 --repeats 3 --before 39e16e6

``--alternate <git revision>``: our job only, without native, on this checkout's library and
on the revision's (a worktree as for ``--before``), each in a child process of its own on the
same broker and topics: ``--rounds`` rounds (default 4) of both children in turn, the first
of a round alternating, each child a warm-up then 2 runs. On this machine the speed drifts
over minutes by more than a change of a few percent, so a comparison of one block of runs
before or after another (``--before``) can show a regression where there is none, or hide
one; children in turn spread the drift over both.

    .venv/bin/python bench/e2e_bench.py --records 2000000 --alternate 663a564 --rounds 4

``--cache-mb``: our ``statestore.cache.max.bytes``; a small one (1) puts the ids past the
tasks' shares, so that the dedup hands them to its store and reads misses back from it, as a
long interval with many ids does. Each of our runs prints its hand-overs (``dedup_spills``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from streamplatform import StreamingJob, StreamsBuilder, Topology
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics, producer
from streamplatform.serdes import Serdes
from streamplatform.spark import spark_session

REPO = Path(__file__).resolve().parents[1]

INTERVAL_MS = 10 * 60 * 1000
PARTITIONS = 3


def bench_records(records: int, seed: int = 5) -> Iterator[tuple[str, str, int]]:
    """The bench's records as (key, JSON value, timestamp): 20% repeat a (key, id) of the last
    500 new ones, 3% are up to half an interval out of order."""
    rng = random.Random(seed)
    recent: list[tuple[str, str]] = []
    start = 1_767_225_600_000
    for index in range(records):
        if recent and rng.random() < 0.20:
            key, tx_id = rng.choice(recent[-500:])
        else:
            key, tx_id = f"acct-{rng.randrange(1000):04d}", f"tx-{index:08d}"
            recent.append((key, tx_id))
        timestamp = start + index * 10
        if rng.random() < 0.03:
            timestamp -= rng.randrange(INTERVAL_MS // 2)
        yield key, json.dumps({"id": tx_id, "amount": index % 997}), timestamp


def produce_all(settings: dict, records: Iterable[tuple[str, Any, Any, int]]) -> None:
    """``(topic, key, value, timestamp)`` records through one batching producer, waiting out a
    full local queue; every record acknowledged at the end."""
    out = producer(settings, **{"linger.ms": 50, "batch.size": 1_000_000})
    for index, (topic, key, value, timestamp) in enumerate(records):
        while True:
            try:
                out.produce(topic, key=key, value=value, timestamp=timestamp)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                out.poll(0.1)
        if index % 20_000 == 0:
            out.poll(0)
    assert out.flush(120) == 0


def produce(settings: dict, topic: str, records: int, seed: int = 5) -> None:
    produce_all(settings, ((topic, key, value, timestamp)
                           for key, value, timestamp in bench_records(records, seed)))  # fmt: skip


def dedup_topology(topic: str, sink: str = "deduplicated") -> Topology:
    """The bench's job: deduplicate_by_key_value(id, 10 min) into ``sink``."""
    b = StreamsBuilder()
    stream = b.stream(topic, Serdes.string(), Serdes.json())
    stream.deduplicate_by_key_value(lambda k, v: v["id"], INTERVAL_MS).to(sink)
    return b.build()


class WorkerMemory:
    """Samples the summed RSS of Spark's Python worker processes, and this (the driver's)
    process's own; keeps the peaks."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self.peak_driver_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            total = 0
            for status in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    if (
                        b"pyspark.daemon" in status.read_bytes()
                        or b"pyspark/worker" in status.read_bytes()
                    ):
                        for line in (status.parent / "status").read_text().splitlines():
                            if line.startswith("VmRSS:"):
                                total += int(line.split()[1])
                except OSError:
                    continue
            self.peak_mb = max(self.peak_mb, total / 1024)
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.peak_driver_mb = max(self.peak_driver_mb, int(line.split()[1]) / 1024)
            time.sleep(0.2)

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def job_config(settings: dict, tmp: Path, name: str, per_partition_cap: int, **extra) -> dict:
    """The settings of a bench job named ``name`` (exactly once, state and Delta under
    ``tmp``); ``extra``: more settings."""
    return {
        "application.id": name,
        "bootstrap.servers": settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(tmp / name / "state"),
        "platform.delta.root": str(tmp / "delta"),
        "platform.max.records.per.batch": per_partition_cap,
    } | extra


# Settings every run of our job gets (``--cache-mb``), the --before child's too.
OURS_SETTINGS: dict[str, Any] = {}


def ours_job(spark, settings, topic, tmp: Path, per_partition_cap: int, name: str, **extra):
    """Our dedup job on ``topic`` (exactly once, Delta sink); ``extra``: more settings."""
    config = job_config(settings, tmp, name, per_partition_cap, **OURS_SETTINGS, **extra)
    return StreamingJob(dedup_topology(topic), config, spark=spark, delta_sinks=["deduplicated"])


def run_to_the_end(job) -> tuple[float, list]:
    """``job`` (a StreamingJob) run until caught up, then closed: its seconds and results."""
    started = time.perf_counter()
    results = job.run_until_caught_up()
    elapsed = time.perf_counter() - started
    job.close()
    return elapsed, results


# A batch's phases, from its metrics: planning, the tasks (with the sink rows they return),
# the side or spill files, the sinks' writes, the commit.
PHASES = ("plan_ms", "tasks_and_sink_ms", "side_files_ms", "writes_ms", "commit_ms")


def phases(results: list) -> dict[str, float]:
    """Seconds per phase summed over a run's batches, and the batches' total."""
    out = {p: sum(r.metrics.get(p, 0) for r in results) / 1000 for p in PHASES}
    out["batch total"] = sum(r.duration_ms for r in results) / 1000
    return out


def format_phases(seconds: dict[str, float]) -> str:
    return ", ".join(f"{p.removesuffix('_ms')} {s:.1f} s" for p, s in seconds.items())


def print_ratio(peer: str, ours: list[float], theirs: list[float]) -> None:
    """The ratio of records/s, ours over the peer's, from the runs' seconds (medians), and
    per pair of runs."""
    ratios = sorted(t / o for o, t in zip(ours, theirs, strict=True))
    print(f"ratio ours / {peer}: {statistics.median(theirs) / statistics.median(ours):.2f}x "
          f"(per pair: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip


def run_ours(spark, settings, topic, tmp: Path, per_partition_cap: int, name: str):
    elapsed, results = run_to_the_end(ours_job(spark, settings, topic, tmp, per_partition_cap,
                                               name))  # fmt: skip
    rows = spark.read.format("delta").load(str(tmp / "delta" / name / "deduplicated")).count()
    return elapsed, rows, results


def bench_master(stack: contextlib.ExitStack, tmp: Path, cluster: bool) -> str:
    """``local[2]``, or with ``cluster`` the master of a two-worker standalone cluster
    (streamplatform.local_cluster; the local-master shortcuts off) entered into ``stack``."""
    if not cluster:
        return "local[2]"
    from streamplatform.local_cluster import LocalCluster

    started = stack.enter_context(LocalCluster(
        tmp / "cluster", workers=2, env={"PYTHONPATH": str(REPO / "platform")},
        start_timeout_s=120))  # fmt: skip
    return started.master_url


def alternating(repeats: int) -> Iterator[tuple[int, str]]:
    """``(repeat, "ours" | "native")`` for each run, alternating which goes first: load from
    other processes drifts."""
    for repeat in range(repeats):
        for which in ("ours", "native") if repeat % 2 == 0 else ("native", "ours"):
            yield repeat, which


def print_median(name: str, records: int, runs: list[float], written: set[int], unit: str,
                 path: str) -> None:  # fmt: skip
    """One line of a bench's summary: the median run's records/s, its rows and its path."""
    median = statistics.median(runs)
    counts = " or ".join(f"{count:,}" for count in sorted(written))
    counted = f"; {counts} {unit}" if written else ""  # a child's rows are not counted
    print(f"{name}: {records / median:>9,.0f} records/s ({median:.1f} s, runs "
          f"{min(runs):.1f}-{max(runs):.1f} s{counted}; path {path})")  # fmt: skip


def kafka_stream(spark, settings: dict, topic: str, max_offsets_per_trigger: int | None = None):
    """Spark's own Kafka source over the whole of ``topic`` (at most ``max_offsets_per_trigger``
    records per micro-batch when given)."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings["bootstrap.servers"])
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()


def native_to_delta(spark, frame, tmp: Path, name: str) -> tuple[float, int]:
    """Write a streaming ``frame`` into the Delta table ``tmp/name`` in append mode,
    ``availableNow`` (Spark's own engine end to end); its seconds and the rows written."""
    path = str(tmp / name)
    started = time.perf_counter()
    query = (
        frame.writeStream.format("delta").outputMode("append")
        .option("checkpointLocation", str(tmp / f"{name}-checkpoint"))
        .trigger(availableNow=True).start(path)
    )  # fmt: skip
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed, spark.read.format("delta").load(path).count()


def run_native(spark, settings, topic, tmp: Path, name: str = "native"):
    from pyspark.sql import functions as F

    stream = (
        kafka_stream(spark, settings, topic)
        .select(
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
            "timestamp",
            "partition",
            "offset",
        )  # fmt: skip
        .withColumn("id", F.get_json_object("value", "$.id"))
        .withWatermark("timestamp", f"{INTERVAL_MS // 1000} seconds")
        .dropDuplicatesWithinWatermark(["key", "id"])
    )
    return run_available_now(spark, stream, tmp, name)


def run_available_now(spark, stream, tmp: Path, name: str) -> tuple[float, int]:
    """A native streaming query into the Delta table ``tmp/name``, run with ``availableNow``
    to the end of its input: its seconds and the rows it wrote."""
    path = str(tmp / name)
    started = time.perf_counter()
    query = (
        stream.writeStream.format("delta")
        .option("checkpointLocation", str(tmp / f"{name}-checkpoint"))
        .trigger(availableNow=True)
        .start(path)
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed, spark.read.format("delta").load(path).count()


def run_ours_to_kafka(spark, settings, topic, tmp: Path, name: str, guarantee: str):
    """Ours into the Kafka topic ``name``: seconds and the records a read_committed reader
    counts there."""
    create_topics(settings, [TopicSpec(name, PARTITIONS)])
    config = {
        "application.id": name,
        "bootstrap.servers": settings["bootstrap.servers"],
        "processing.guarantee": guarantee,
        "state.dir": str(tmp / name / "state"),
        "platform.delta.root": str(tmp / "delta"),
        "platform.max.records.per.batch": 10**9,
    }
    job = StreamingJob(dedup_topology(topic, name), config, spark=spark)
    started = time.perf_counter()
    results = job.run_until_caught_up()
    elapsed = time.perf_counter() - started
    job.close()
    PATHS.setdefault(guarantee, set()).update(paths_of(results))
    return elapsed, count_committed(settings, name)


# The execution paths our runs took, per guarantee (runtime/paths/; "cached" for code from
# before BatchResult named it, where every Kafka sink took the cached path).
PATHS: dict[str, set[str]] = {}


def paths_of(results) -> set[str]:
    return {getattr(result, "path", "") or "cached" for result in results}


def run_native_to_kafka(spark, settings, topic, tmp: Path, name: str):
    from pyspark.sql import functions as F

    create_topics(settings, [TopicSpec(name, PARTITIONS)])
    stream = (
        kafka_stream(spark, settings, topic)
        .withColumn("id", F.get_json_object(F.col("value").cast("string"), "$.id"))
        .withWatermark("timestamp", f"{INTERVAL_MS // 1000} seconds")
        .dropDuplicatesWithinWatermark(["key", "id"])
        .select("key", "value")
    )
    started = time.perf_counter()
    query = (
        stream.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", settings["bootstrap.servers"])
        .option("topic", name)
        .option("checkpointLocation", str(tmp / f"{name}-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed, count_committed(settings, name)


def count_committed(settings: dict, topic: str) -> int:
    """Records a read_committed reader sees in ``topic``, read to the end of each partition
    (the end event comes past transaction markers and aborted records too)."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    from streamplatform.kafka import consumer

    reader = consumer(settings, f"count-{topic}", **{"isolation.level": "read_committed",
                                                     "enable.partition.eof": True})  # fmt: skip
    total = 0
    try:
        for partition in range(PARTITIONS):
            reader.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            at_end = False
            while not at_end:
                for message in reader.consume(10_000, 1.0):
                    if message.error() is None:
                        total += 1
                    elif message.error().code() == KafkaError._PARTITION_EOF:
                        at_end = True
                    else:
                        raise RuntimeError(f"reading {topic}: {message.error()}")
    finally:
        reader.close()
    return total


@contextlib.contextmanager
def bench_topics(tmp: Path, args: argparse.Namespace) -> Iterator[dict]:
    """A local broker with the bench's "bench" and "warmup" topics filled: its settings."""
    with LocalBroker(tmp / "broker") as broker:
        settings = {"bootstrap.servers": broker.bootstrap_servers}
        create_topics(settings, [TopicSpec(t, PARTITIONS) for t in ("bench", "warmup")])
        produce(settings, "bench", args.records)
        produce(settings, "warmup", args.warmup_records, seed=11)
        yield settings


def kafka_sink(args: argparse.Namespace) -> None:
    """The ``--sink kafka`` variant (module docstring)."""
    runs: dict[str, list[float]] = {"eos": [], "alos": [], "native": []}
    rows: dict[str, set[int]] = {which: set() for which in runs}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with bench_topics(tmp, args) as settings:
            spark = spark_session(master="local[2]", app_name="e2e-bench-kafka")

            def run(which: str, topic: str, name: str) -> tuple[float, int]:
                if which == "native":
                    return run_native_to_kafka(spark, settings, topic, tmp, name)
                guarantee = "exactly_once_v2" if which == "eos" else "at_least_once"
                return run_ours_to_kafka(spark, settings, topic, tmp, name, guarantee)

            for which in runs:  # warm-up, on other data
                run(which, "warmup", f"warmup-{which}")
            orders = [
                ("eos", "alos", "native"),
                ("native", "alos", "eos"),
                ("alos", "eos", "native"),
            ]
            for repeat in range(args.repeats):
                for which in orders[repeat % len(orders)]:  # load from other processes drifts
                    seconds, written = run(which, "bench", f"out-{which}-{repeat}")
                    runs[which].append(seconds)
                    rows[which].add(written)
                    print(f"  run {repeat} {which:6s}: {args.records / seconds:>9,.0f} records/s "
                          f"({seconds:.1f} s, {written:,} records)", flush=True)  # fmt: skip
            spark.stop()
    n = args.records
    print(f"{n:,} records, {PARTITIONS} partitions, local[2], median of {args.repeats} runs each, "
          "output to a 3-partition Kafka topic")  # fmt: skip
    path_of = {
        "eos": ", ".join(sorted(PATHS.get("exactly_once_v2", ()))),
        "alos": ", ".join(sorted(PATHS.get("at_least_once", ()))),
        "native": "Structured Streaming, availableNow",
    }
    for which, label in (
        ("eos", "ours   exactly_once_v2 -> Kafka (transactions)"),
        ("alos", "ours   at_least_once   -> Kafka (idempotent)  "),
        ("native", "native Spark Kafka sink (at least once)       "),
    ):
        median = statistics.median(runs[which])
        counts = " or ".join(f"{count:,}" for count in sorted(rows[which]))
        print(f"{label}: {n / median:>9,.0f} records/s ({median:.1f} s, runs "
              f"{min(runs[which]):.1f}-{max(runs[which]):.1f} s; {counts} records; "
              f"path {path_of[which]})")  # fmt: skip
    price = statistics.median(runs["eos"]) / statistics.median(runs["alos"])
    pairs = sorted(e / a for e, a in zip(runs["eos"], runs["alos"], strict=True))
    print(f"price of exactly once: EOS time / ALOS time = {price:.3f} "
          f"(per run: {', '.join(f'{r:.3f}' for r in pairs)}; target <= 1.10)")  # fmt: skip
    native = statistics.median(runs["native"]) / statistics.median(runs["eos"])
    print(f"ratio ours EOS / native (records/s): {native:.2f}x")


@contextlib.contextmanager
def revision_worktree(revision: str) -> Iterator[Path]:
    """A git worktree of ``revision`` with its own C cores built (a core missing would run its
    Python reference instead) and this checkout's JVM jars (not committed); removed at the
    end."""
    worktree = Path(tempfile.mkdtemp(prefix="e2e-before-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree),
                    revision], check=True, capture_output=True)  # fmt: skip
    try:
        (worktree / ".jvm").symlink_to(REPO / ".jvm")
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=worktree,
                       check=True, capture_output=True)  # fmt: skip
        yield worktree
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
                       check=False, capture_output=True)  # fmt: skip


def run_child(args: argparse.Namespace, bootstrap: str, library: Path, repeats: int,
              name: str = "before") -> dict:  # fmt: skip
    """Our job on the library under ``library`` (a ``platform`` directory), in a child process
    on this run's topics (a warm-up, then ``repeats`` runs): its seconds per run and paths.
    ``name`` prefixes its application ids: each child needs its own consumer groups, or it
    would find the last one's offsets committed and take the replay's path."""
    env = os.environ | {"PYTHONPATH": str(library), "PYSPARK_PYTHON": sys.executable}
    child = subprocess.run(
        [sys.executable, __file__, "--child-of", bootstrap, "--child-name", name,
         "--records", str(args.records), "--repeats", str(repeats),
         *(["--cache-mb", str(args.cache_mb)] if args.cache_mb is not None else [])],
        env=env, check=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return json.loads(child.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_revision_child(args: argparse.Namespace, bootstrap: str) -> dict:
    """Our job on ``args.before``'s library, in a child process on this run's topics: its
    seconds per run and paths (see the module's docstring)."""
    with revision_worktree(args.before) as worktree:
        return run_child(args, bootstrap, worktree / "platform", args.repeats)


def alternate(args: argparse.Namespace) -> None:
    """``--alternate``: our job only, on this checkout's library and on the revision's, in
    child processes taken in turn on one broker (see the module's docstring)."""
    seconds: dict[str, list[float]] = {"now": [], "then": []}
    paths: dict[str, set[str]] = {"now": set(), "then": set()}
    with tempfile.TemporaryDirectory() as directory, \
            revision_worktree(args.alternate) as worktree:  # fmt: skip
        tmp = Path(directory)
        with bench_topics(tmp, args) as settings:
            bootstrap = settings["bootstrap.servers"]
            libraries = {"now": REPO / "platform", "then": worktree / "platform"}
            for round_ in range(args.rounds):
                # Alternate which goes first: the machine's speed drifts over minutes.
                for which in ("now", "then") if round_ % 2 == 0 else ("then", "now"):
                    result = run_child(args, bootstrap, libraries[which], 2,
                                       f"{which}{round_}")  # fmt: skip
                    seconds[which] += result["seconds"]
                    paths[which].update(result["paths"])
                    runs = ", ".join(f"{s:.1f} s" for s in result["seconds"])
                    print(f"  round {round_} {which:4s}: {runs}", flush=True)
    n = args.records
    print(f"{n:,} records, {PARTITIONS} partitions, local[2]; {args.rounds} rounds of two child "
          "processes in turn, each a warm-up and 2 runs")  # fmt: skip
    for which, name in (("now", "this checkout"), ("then", args.alternate)):
        print_median(f"{name:<13s}", n, seconds[which], set(), "rows",
                     ", ".join(sorted(paths[which])))  # fmt: skip
    ratio = statistics.median(seconds["then"]) / statistics.median(seconds["now"])
    print(f"ratio now / {args.alternate}: {ratio:.2f}x (records/s, medians)")


def child_runs(args: argparse.Namespace) -> None:
    """``--child-of``: our job only, on the parent's broker and topics (a warm-up, then
    ``--repeats`` runs); prints its library's location on stderr, then JSON."""
    import streamplatform

    print(f"  {args.child_name}: library {Path(streamplatform.__file__).parent}", file=sys.stderr)
    settings = {"bootstrap.servers": args.child_of}
    seconds: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        spark = spark_session(master="local[2]", app_name="e2e-bench-before")
        run_ours(spark, settings, "warmup", tmp, args.records, f"warmup-{args.child_name}")
        for repeat in range(args.repeats):
            elapsed, written, results = run_ours(spark, settings, "bench", tmp, args.records,
                                                 f"{args.child_name}-{repeat}")  # fmt: skip
            seconds.append(elapsed)
            PATHS.setdefault("delta", set()).update(paths_of(results))
            print(f"  run {repeat} {args.child_name}: {args.records / elapsed:>9,.0f} records/s "
                  f"({elapsed:.1f} s, {written:,} rows)", file=sys.stderr, flush=True)  # fmt: skip
        spark.stop()
    print(json.dumps({"seconds": seconds, "paths": sorted(PATHS.get("delta", ()))}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--latency-records", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each, alternating")
    parser.add_argument("--warmup-records", type=int, help="default: --records")
    parser.add_argument("--sink", choices=("delta", "kafka"), default="delta")
    parser.add_argument("--cluster", action="store_true",
                        help="Delta sink on a standalone master with two one-core workers "
                             "(streamplatform.local_cluster) instead of local[2]: the "
                             "local-master shortcuts are off")  # fmt: skip
    parser.add_argument("--before", help="a git revision whose library also runs our job, in "
                        "the same run (Delta sink, local[2])")  # fmt: skip
    parser.add_argument("--alternate", metavar="REVISION",
                        help="our job only, this checkout and REVISION's library in child "
                             "processes taken in turn on one broker (--rounds)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=4, help="with --alternate")
    parser.add_argument("--before-first", action="store_true",
                        help="run the --before revision before this checkout")  # fmt: skip
    parser.add_argument("--cache-mb", type=float,
                        help="our statestore.cache.max.bytes in MB (default: the platform's); "
                             "a small one puts the ids past the tasks' shares, so that the "
                             "dedup hands them to its store and reads them back")  # fmt: skip
    parser.add_argument("--child-of", help=argparse.SUPPRESS)  # the --before child's broker
    parser.add_argument("--child-name", default="before", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cache_mb is not None:
        OURS_SETTINGS["statestore.cache.max.bytes"] = int(args.cache_mb * 1024 * 1024)
    if args.child_of:
        child_runs(args)
        return
    if args.warmup_records is None:
        args.warmup_records = args.records
    if args.sink == "kafka":
        kafka_sink(args)
        return
    if args.alternate:
        alternate(args)
        return
    ours: list[float] = []
    native: list[float] = []
    before: dict = {}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker, contextlib.ExitStack() as stack:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            topics = [TopicSpec(t, PARTITIONS) for t in ("bench", "latency", "warmup")]
            create_topics(settings, topics)
            produce(settings, "bench", args.records)
            produce(settings, "latency", args.latency_records, seed=9)
            produce(settings, "warmup", args.warmup_records, seed=11)
            if args.before and args.before_first:
                before = run_revision_child(args, broker.bootstrap_servers)
            master = bench_master(stack, tmp, args.cluster)
            spark = spark_session(master=master, app_name="e2e-bench")
            # Both paths once on other data first: the JVM's class loading and JIT would
            # otherwise be charged to whichever runs first.
            run_ours(spark, settings, "warmup", tmp, args.warmup_records, "warmup-ours")
            run_native(spark, settings, "warmup", tmp, "warmup-native")
            rows: dict[str, set[int]] = {"ours": set(), "native": set()}
            with WorkerMemory() as memory:
                for repeat in range(args.repeats):
                    # Alternate which goes first: load from other processes drifts.
                    for which in ("ours", "native") if repeat % 2 == 0 else ("native", "ours"):
                        if which == "ours":
                            seconds, written, results = run_ours(
                                spark, settings, "bench", tmp, args.records, f"ours-{repeat}"
                            )
                            ours.append(seconds)
                            PATHS.setdefault("delta", set()).update(paths_of(results))
                        else:
                            seconds, written = run_native(
                                spark, settings, "bench", tmp, f"native-{repeat}"
                            )
                            native.append(seconds)
                        rows[which].add(written)
                        rate = args.records / seconds
                        spills = (f", {sum(r.metrics.get('dedup_spills', 0) for r in results)} "
                                  "hand-overs" if which == "ours" else "")  # fmt: skip
                        print(f"  run {repeat} {which:6s}: {rate:>9,.0f} records/s "
                              f"({seconds:.1f} s, {written:,} rows{spills})",
                              flush=True)  # fmt: skip
            _, _, batches = run_ours(
                spark, settings, "latency", tmp, 10_000 // PARTITIONS, "latency"
            )
            if args.before and not args.before_first:
                before = run_revision_child(args, broker.bootstrap_servers)
            spark.stop()
    n = args.records
    where = "a standalone master, 2 workers of 1 core" if args.cluster else "local[2]"
    print(f"{n:,} records, {PARTITIONS} partitions, {where}, median of {args.repeats} runs each "
          "(alternating order, after a warm-up of both)")  # fmt: skip
    ours_paths = ", ".join(sorted(PATHS.get("delta", ())))
    for name, runs, written, path in (
        ("ours   StreamingJob exactly_once_v2 -> Delta ", ours, rows["ours"], ours_paths),
        ("native dropDuplicatesWithinWatermark -> Delta", native, rows["native"], "Structured "
         "Streaming, availableNow"),
    ):  # fmt: skip
        print_median(name, n, runs, written, "rows", path)
    if len(rows["ours"]) > 1:
        print("WARNING: our runs wrote different row counts from the same data")
    print_ratio("native", ours, native)
    if args.before:
        then = before["seconds"]
        print_median(f"before {args.before:<38s}", n, then, set(), "rows",
                     ", ".join(before["paths"]))  # fmt: skip
        ratio = statistics.median(then) / statistics.median(ours)
        order = "before" if args.before_first else "after"
        print(f"ratio now / {args.before}: {ratio:.2f}x (its runs {order} this checkout's)")
    latencies = sorted(b.duration_ms for b in batches)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(
        f"batch latency, ~10k-record batches ({len(latencies)} batches): "
        f"p50 {statistics.median(latencies):.0f} ms, p99 {p99} ms"
    )
    print(f"peak RSS during our runs: Python workers {memory.peak_mb:.0f} MB, driver "
          f"{memory.peak_driver_mb:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
