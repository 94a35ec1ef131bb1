"""The windowed count on Kafka Streams itself against ours, same machine, same input, same run.

window_bench.py's topology (views per key per 5-minute tumbling window, 1-minute grace, final
counts on window close) into a Kafka topic, exactly_once_v2, on the same records (10,000 keys,
10 ms apart, 3% out of order):

- Kafka Streams 4.4.0 (bench/jvm/WindowedCountOnKafkaStreams.java, compiled here with the jars
  ``make setup`` fetched), ``num.stream.threads`` 2 (one per core), its defaults otherwise
  (10 MB record cache, commits every 100 ms); timed from its first RUNNING state (its group's
  first rebalance is not counted: that favours Kafka Streams) until its committed offsets
  reach the input's end;
- ours: ``StreamingJob`` on ``local[2]``, one batch, into a Kafka sink; timed around
  ``run_until_caught_up``.

Median of ``--repeats`` runs, alternating which goes first, after a warm-up of both; the
execution path of ours is printed.

    .venv/bin/python bench/kafka_streams_bench.py --records 2000000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import PARTITIONS, job_config, print_ratio, run_to_the_end  # noqa: E402
from window_bench import produce  # noqa: E402

from streamplatform import EmitStrategy, StreamingJob, StreamsBuilder, TimeWindows  # noqa: E402
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics  # noqa: E402
from streamplatform.serdes import Serdes  # noqa: E402
from streamplatform.spark import spark_session  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JARS = ROOT / ".jvm" / "streams"
PROGRAM = Path(__file__).resolve().parent / "jvm" / "WindowedCountOnKafkaStreams.java"
WINDOW_MS, GRACE_MS = 5 * 60 * 1000, 60 * 1000


def topology(source: str, sink: str):
    b = StreamsBuilder()
    (b.stream(source, Serdes.string(), Serdes.bytes()).group_by_key()
     .windowed_by(TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS))
     .emit_strategy(EmitStrategy.on_window_close()).count()
     .to_stream().to(sink))  # fmt: skip
    return b.build()


def run_ours(spark, settings, source: str, tmp: Path, name: str) -> tuple[float, set[str]]:
    sink = f"{name}-counts"
    create_topics(settings, [TopicSpec(sink, PARTITIONS)])
    config = job_config(settings, tmp, name, 10_000_000) | {"errors.dead.letter.queue.topic.name":
                                                            None}  # fmt: skip
    elapsed, results = run_to_the_end(StreamingJob(topology(source, sink), config, spark=spark))
    return elapsed, {r.path for r in results}


def run_kafka_streams(settings, source: str, tmp: Path, classes: Path, name: str) -> float:
    sink = f"{name}-counts"
    create_topics(settings, [TopicSpec(sink, PARTITIONS)])
    done = subprocess.run(
        ["java", "-cp", f"{classes}:{JARS}/*", PROGRAM.stem, settings["bootstrap.servers"],
         source, sink, name, str(tmp / name), "2"],
        capture_output=True, text=True, timeout=1800, check=True,
    )  # fmt: skip
    seconds, start_up = done.stdout.strip().splitlines()[-1].split()
    print(f"  (Kafka Streams started up in {float(start_up):.1f} s, not counted)")
    return float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ours: list[float] = []
    theirs: list[float] = []
    paths: set[str] = set()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        classes = tmp / "classes"
        subprocess.run(["javac", "-cp", f"{JARS}/*", "-d", str(classes), str(PROGRAM)],
                       check=True)  # fmt: skip
        with LocalBroker(tmp / "broker") as broker:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            create_topics(settings, [TopicSpec(t, PARTITIONS) for t in ("views", "warmup")])
            produce(settings, "views", args.records, args.keys, seed=5)
            produce(settings, "warmup", args.records // 4, args.keys, seed=11)
            spark = spark_session(master="local[2]", app_name="kafka-streams-bench")
            run_ours(spark, settings, "warmup", tmp, "warmup-ours")
            run_kafka_streams(settings, "warmup", tmp, classes, "warmup-ks")
            for repeat in range(args.repeats):
                order = ("ours", "ks") if repeat % 2 == 0 else ("ks", "ours")
                for which in order:
                    if which == "ours":
                        seconds, used = run_ours(spark, settings, "views", tmp, f"ours-{repeat}")
                        ours.append(seconds)
                        paths |= used
                    else:
                        seconds = run_kafka_streams(settings, "views", tmp, classes,
                                                    f"ks-{repeat}")  # fmt: skip
                        theirs.append(seconds)
                    print(f"  run {repeat} {which:4s}: {args.records / seconds:>9,.0f} records/s "
                          f"({seconds:.1f} s)", flush=True)  # fmt: skip
            spark.stop()
    print(f"{args.records:,} records, {args.keys:,} keys, {PARTITIONS} partitions, windowed "
          "count on window close into Kafka, exactly_once_v2, median of "
          f"{args.repeats} runs")  # fmt: skip
    print(f"ours          local[2], one batch: {args.records / statistics.median(ours):>9,.0f} "
          f"records/s (path {', '.join(sorted(paths))})")  # fmt: skip
    print(f"Kafka Streams 4.4.0, 2 threads:    {args.records / statistics.median(theirs):>9,.0f} "
          "records/s")  # fmt: skip
    print_ratio("Kafka Streams", ours, theirs)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
