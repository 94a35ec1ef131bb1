"""Batch time of the dedup job on a real two-worker Spark cluster against ``local[2]`` on the
same machine, for the code before restores in place (a git revision) and the current code.

A standalone master and two workers of one core each (streamplatform.local_cluster), every
executor keeping its task state on its own disk (a relative ``state.dir`` resolves in the
executor's working directory, for old and new code alike), against ``local[2]``. Same input
(60,000 records over 3 partitions, 20% duplicates), same batches (2,000 records per partition
and batch: 10 batches). For each of the four runs it prints the batches' p50 and total time,
the failed task attempts (Spark's REST API, every executor counted) and the changelog rows
restored, and per code version the ratio cluster / local[2].

    .venv/bin/python bench/cluster_bench.py [--before 9ae384b]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

from streamplatform.kafka import LocalBroker, TopicSpec, create_topics, producer
from streamplatform.local_cluster import LocalCluster, free_port

RECORDS = 60_000
PARTITIONS = 3
REPO = Path(__file__).resolve().parents[1]

DRIVER = textwrap.dedent("""
    import json, sys, time, urllib.request
    sys.path.insert(0, sys.argv[2])  # the code under test: <checkout>/platform
    from streamplatform import StreamsBuilder
    from streamplatform.runtime.microbatch import StreamingJob
    from streamplatform.serdes import Serdes
    from streamplatform.spark import spark_session

    spec = json.loads(sys.argv[1])
    spark = spark_session(master=spec["master"], extra=spec["spark"])
    sc = spark.sparkContext
    if not spec["master"].startswith("local"):
        deadline = time.monotonic() + 120
        while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:
            assert time.monotonic() < deadline, "the executors did not register"
            time.sleep(0.1)
    b = StreamsBuilder()
    stream = b.stream(spec["source"], Serdes.string(), Serdes.json())
    stream.deduplicate_by_key_value(lambda k, v: v["id"], 600_000).to("deduplicated")
    job = StreamingJob(b.build(), spec["config"], spark=spark, delta_sinks=["deduplicated"])
    results = job.run_until_caught_up()
    job.close()
    failed = None
    if sc.uiWebUrl:
        url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/allexecutors"
        failed = sum(e["failedTasks"] for e in json.load(urllib.request.urlopen(url))
                     if e["id"] != "driver")
    print(json.dumps({"durations": [r.duration_ms for r in results],
                      "records_in": sum(r.records_in for r in results),
                      "restored": sum(r.restored_records for r in results),
                      "failed_attempts": failed}), flush=True)
""")


def produce(settings: dict, topic: str) -> None:
    create_topics(settings, [TopicSpec(topic, PARTITIONS)])
    writer = producer(settings, **{"enable.idempotence": True, "linger.ms": 20})
    for index in range(RECORDS):
        tx = index - 6 if index % 5 == 0 and index >= 6 else index
        writer.produce(topic, key=f"k{index % PARTITIONS}",
                       value=json.dumps({"id": f"tx-{tx}", "n": index}).encode(),
                       partition=index % PARTITIONS, timestamp=1_000_000 + index)  # fmt: skip
        if index % 10_000 == 0:
            writer.poll(0)
    assert writer.flush(120) == 0


def run(code: Path, master: str, settings: dict, source: str, work: Path) -> dict:
    app = f"cluster-bench-{uuid.uuid4().hex[:6]}"
    spark = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    if not master.startswith("local"):
        spark |= {"spark.ui.port": str(free_port()), "spark.executor.memory": "1g"}
    config = {
        "application.id": app, "bootstrap.servers": settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2", "platform.delta.root": str(work / "delta"),
        "state.dir": "task-state",  # relative: in each executor's own working directory
        "platform.max.records.per.batch": 2_000,
    }  # fmt: skip
    spec = {"master": master, "spark": spark, "config": config, "source": source}
    log = work / f"{app}.log"
    with open(log, "w") as errors:
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, json.dumps(spec), str(code / "platform")],
            env=os.environ | {"SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(code / "platform"),
                              "STREAMPLATFORM_HOME": str(REPO)},  # its jars: .jvm/ here
            cwd=work, stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            out, _ = driver.communicate(timeout=1800)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
    if driver.returncode != 0:
        raise SystemExit(f"{code} on {master} failed:\n{log.read_text()[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def checkout(revision: str, work: Path) -> Path:
    folder = work / f"code-{revision}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), revision],
                   check=True, capture_output=True)  # fmt: skip
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="9ae384b", help="the revision to compare against")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    before = checkout(args.before, work)
    rows = []
    try:
        with LocalBroker(work / "broker") as broker:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            source = "cluster-bench-source"
            produce(settings, source)
            for name, code in ((f"before ({args.before})", before), ("now", REPO)):
                local = run(code, "local[2]", settings, source, work)
                # A cluster per code version: its executors import that code (PYTHONPATH).
                with LocalCluster(work / f"cluster-{code.name}", workers=2,
                                  env={"PYTHONPATH": str(code / "platform"),
                                       "STREAMPLATFORM_HOME": str(REPO)},
                                  start_timeout_s=120) as cluster:  # fmt: skip
                    started = time.monotonic()
                    remote = run(code, cluster.master_url, settings, source, work)
                    remote["wall_s"] = time.monotonic() - started
                rows.append((name, local, remote))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)],
                       capture_output=True)  # fmt: skip
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {RECORDS} records, "
          f"10 batches of 2,000 per partition")  # fmt: skip
    print(f"{'code':18} {'master':10} {'p50 ms':>8} {'total s':>8} {'failed':>7} {'restored':>9}")
    for name, local, remote in rows:
        for master, result in (("local[2]", local), ("cluster", remote)):
            assert result["records_in"] == RECORDS, result
            print(f"{name:18} {master:10} {statistics.median(result['durations']):>8.0f} "
                  f"{sum(result['durations']) / 1000:>8.1f} "
                  f"{'-' if result['failed_attempts'] is None else result['failed_attempts']:>7} "
                  f"{result['restored']:>9}")  # fmt: skip
        ratio = statistics.median(remote["durations"]) / statistics.median(local["durations"])
        print(f"{name:18} cluster / local[2] at p50: {ratio:.2f}x")


if __name__ == "__main__":
    main()
