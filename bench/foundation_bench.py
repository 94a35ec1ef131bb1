"""Start-up costs of the local parts: broker start to ready, SparkSession start.

Each trial runs in a fresh directory (broker) or a fresh Python process (Spark: JVM-start
settings apply only to a process's first session). Prints the median and range of each.

    .venv/bin/python bench/foundation_bench.py [--trials 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from streamplatform.kafka import LocalBroker

SPARK_START = """
import time
t = time.perf_counter()
from streamplatform.spark import spark_session
spark = spark_session(app_name="bench")
spark.range(1).count()
print(time.perf_counter() - t)
spark.stop()
"""


def broker_start_seconds() -> float:
    with tempfile.TemporaryDirectory() as directory:
        broker = LocalBroker(Path(directory) / "broker")
        started = time.perf_counter()
        broker.start()
        elapsed = time.perf_counter() - started
        broker.stop()
        return elapsed


def spark_start_seconds() -> float:
    result = subprocess.run(
        [sys.executable, "-c", SPARK_START], capture_output=True, text=True, check=True
    )
    return float(result.stdout.strip().splitlines()[-1])


def report(name: str, samples: list[float]) -> None:
    print(
        f"{name:<34} median {statistics.median(samples):6.2f} s   "
        f"min {min(samples):6.2f} s   max {max(samples):6.2f} s   (n={len(samples)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    trials = parser.parse_args().trials
    report("broker start to ready", [broker_start_seconds() for _ in range(trials)])
    report("SparkSession start (+ first job)", [spark_start_seconds() for _ in range(trials)])


if __name__ == "__main__":
    main()
