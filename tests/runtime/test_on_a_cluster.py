"""The dedup and join jobs on a real Spark standalone cluster (streamplatform.local_cluster):
a master and two workers, each worker's executor keeping task state on its own disk
(``STREAMPLATFORM_STATE_DIR``; ``state.dir`` unset), the driver in a process of its own.

- A healthy run equals the ``local[*]`` run of the same job, with zero failed task attempts
  (counted by Spark's REST API over every executor, dead ones included): a task Spark places
  on an executor without its state restores it there, inside the attempt.
- A worker SIGKILLed while it runs a batch's task (held at the task's half-way point, so the
  kill lands inside the batch, not before or after it): the output equals the clean run's, and
  the tasks that lived on the dead worker restore their state on the other one, counted in the
  batch results with the executor's state dir.

Cost: ~6 min (the cluster starts in ~20 s, each driver and its executors in ~15-30 s; a test
that runs several jobs runs them in one driver, one application, so its executors start once).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from streamplatform import storage
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics
from streamplatform.local_cluster import LocalCluster, free_port
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import (
    RECORDS,
    delta_rows,
    expected_with_the_test_driver,
    job_config,
    join_input,
    join_tables,
    join_topology,
    make_input,
    read_topic,
)

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

TESTS = str(Path(__file__).parents[1])

# The driver: runs its jobs one after the other to the end on the cluster (one application:
# its executors start once), then prints one JSON line with each job's batch results and the
# failed task attempts of the whole application.
DRIVER = textwrap.dedent("""
    import json, sys, time, urllib.request
    sys.path.insert(0, {tests!r})
    from runtime.support import dedup_topology, join_topology
    from streamplatform.runtime.microbatch import StreamingJob
    from streamplatform.spark import spark_session

    spec = json.loads(sys.argv[1])
    app_name = spec["runs"][0]["config"]["application.id"]
    spark = spark_session(master=spec["master"], app_name=app_name, extra=spec["spark"])
    sc = spark.sparkContext
    deadline = time.monotonic() + 120  # a standalone app starts with the first executor
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:  # 2 executors and the driver
        assert time.monotonic() < deadline, "the executors did not register"
        time.sleep(0.1)
    runs = []
    for run in spec["runs"]:
        if run["job"] == "dedup":
            topology, sinks = dedup_topology(run["source"], "deduplicated"), ["deduplicated"]
        elif run["job"] == "pages":  # a re-keyed windowed count into the Kafka topic "rates"
            from runtime.event_time_jobs import pages_per_minute
            topology, sinks = pages_per_minute(run["source"], run["rates"]), []
        else:
            topology = join_topology(run["source"], run["rates"], "enriched")
            sinks = ["enriched"]
        job = StreamingJob(topology, run["config"], spark=spark, delta_sinks=sinks)
        results = job.run_until_caught_up()
        job.close()
        runs.append([{{"batch_id": r.batch_id, "records_in": r.records_in,
                       "restored_records": r.restored_records, "restores": r.restores,
                       "tasks_reused": r.metrics.get("tasks_reused", 0), "path": r.path,
                       "buffered": r.metrics.get("repartition_buffered", 0)}}
                      for r in results])
    url = f"{{sc.uiWebUrl}}/api/v1/applications/{{sc.applicationId}}/allexecutors"
    executors = json.load(urllib.request.urlopen(url, timeout=30))
    print(json.dumps({{
        "runs": runs,
        "failed_attempts": sum(e["failedTasks"] for e in executors if e["id"] != "driver"),
        "executors": sorted(e["id"] for e in executors if e["id"] != "driver"),
        "tasks": sum(e["totalTasks"] for e in executors if e["id"] != "driver"),
    }}), flush=True)
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # The executors import the tests' topologies as the driver does (runtime.support).
    with LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2,
                      env={"PYTHONPATH": TESTS}, start_timeout_s=120) as cluster:  # fmt: skip
        yield cluster


def _run_on(cluster, job, config, source, rates=None, executor_env=None, during_run=None):
    """Run ``job`` on ``cluster`` from a driver process of its own; its JSON report, with the
    job's batches under ``batches``."""
    report = _run_all_on(cluster, [(job, config, source, rates)], executor_env, during_run)
    return report | {"batches": report["runs"][0]}


def _run_all_on(cluster, runs, executor_env=None, during_run=None):
    """Run each (job, config, source, rates) of ``runs`` in turn on ``cluster``, in one
    driver process of its own (one application); its JSON report: each run's batches under
    ``runs``, the application's executors and failed task attempts."""
    spark = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.port": str(free_port()),  # the REST API (on 127.0.0.1, bindAddress)
        "spark.executor.memory": "1g",
    } | {f"spark.executorEnv.{key}": value for key, value in (executor_env or {}).items()}
    spec = {"master": cluster.master_url, "spark": spark,
            "runs": [{"job": job, "config": config, "source": source, "rates": rates}
                     for job, config, source, rates in runs]}  # fmt: skip
    log = cluster.work_dir / f"driver-{runs[0][1]['application.id']}.log"
    with open(log, "w") as errors:  # a file: Spark's log lines must never fill a pipe
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER.format(tests=TESTS), json.dumps(spec)],
            env=os.environ | {"SPARK_LOCAL_IP": "127.0.0.1"},
            stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            if during_run is not None:
                during_run()
            out, _ = driver.communicate(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 0, log.read_text()[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def _cluster_config(kafka_settings, tmp_path, app, source, root=None, **overrides):
    """``root``: the Delta root's settings (``root`` fixture); by default a local directory."""
    config = job_config(kafka_settings, tmp_path, app, source, **overrides) | (root or {})
    del config["state.dir"]  # each executor's own: its worker's STREAMPLATFORM_STATE_DIR
    return config


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request, tmp_path) -> dict:
    """Where the jobs' tables live: a directory every worker shares (one machine), or the
    local S3 server's bucket (no shared disk: the executors reach it through S3A and pyarrow,
    with the settings the driver ships them)."""
    if request.param == "local":
        return {"platform.delta.root": str(tmp_path / "delta")}
    server = request.getfixturevalue("s3_server")
    settings = {"platform.delta.root": f"s3://{server.bucket}/cluster-{uuid.uuid4().hex[:6]}",
                **server.settings}  # fmt: skip
    # This process reads the tables the cluster's driver wrote: its session needs S3A too.
    storage.configure_spark(request.getfixturevalue("spark"), settings)
    return settings


@pytest.mark.cluster
@pytest.mark.child_process
def test_dedup_and_join_on_the_cluster_equal_local_with_no_failed_attempt(
    cluster, spark, kafka_settings, source_topic, tmp_path, root
):
    source, sent = source_topic
    app = f"cluster-dedup-{uuid.uuid4().hex[:6]}"
    tables = root["platform.delta.root"]
    transactions, rates = join_input(kafka_settings, f"cluster-join-{uuid.uuid4().hex[:6]}")
    settings = {"platform.max.records.per.batch": 6}
    local = job_config(kafka_settings, tmp_path, "join-local", transactions, **settings)
    job = StreamingJob(join_topology(transactions, rates, "enriched"), local, spark=spark,
                       delta_sinks=["enriched"])  # fmt: skip
    job.run_until_caught_up()
    job.close()
    # Both jobs in one application: its executors start once (~15-20 s a start).
    report = _run_all_on(cluster, [
        ("dedup", _cluster_config(kafka_settings, tmp_path, app, source, root), source, None),
        ("join", _cluster_config(kafka_settings, tmp_path, "join-cluster", transactions, root,
                                 **settings), transactions, rates),
    ])  # fmt: skip
    assert report["failed_attempts"] == 0, report
    assert len(report["executors"]) == 2 and report["tasks"] > 0
    dedup_batches, join_batches = report["runs"]
    assert sum(b["records_in"] for b in dedup_batches) == RECORDS
    rows = delta_rows(spark, f"{tables}/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)

    assert len(join_batches) >= 2
    clean = join_tables(spark, tmp_path / "delta" / "join-local")  # local[2], a local disk
    assert all(clean.values())
    assert join_tables(spark, f"{tables}/join-cluster") == clean


# On the S3 root only (~110 s a run): there the dead worker's tasks restore with nothing on a
# shared disk. The local root's cluster path runs in the healthy test above.
@pytest.mark.parametrize("root", [pytest.param("s3", marks=pytest.mark.s3)], indirect=True)
@pytest.mark.cluster
@pytest.mark.child_process
def test_a_worker_killed_during_a_batch_loses_nothing_and_its_tasks_restore_elsewhere(
    spark, kafka_settings, source_topic, tmp_path, root
):
    with LocalCluster(
        tmp_path / "cluster", workers=2, env={"PYTHONPATH": TESTS}, start_timeout_s=120
    ) as cluster:  # its own: a worker of it is killed
        _kill_a_worker_during_a_batch(cluster, spark, kafka_settings, source_topic, tmp_path,
                                      root)  # fmt: skip


def _kill_a_worker_during_a_batch(cluster, spark, kafka_settings, source_topic, tmp_path, root):
    source, sent = source_topic
    app = f"cluster-kill-{uuid.uuid4().hex[:6]}"
    held = tmp_path / "held"
    held.mkdir()

    def kill_worker_0_inside_batch_1():
        deadline = time.monotonic() + 300
        while not (held / "paused").exists():  # a task of batch 1 is half-way through
            assert time.monotonic() < deadline, "no task of batch 1 reached its half-way point"
            time.sleep(0.05)
        cluster.kill_worker(0)
        (held / "resume").touch()

    # Big batches' path too: the tasks run inside the sink's Delta write and leave their
    # other rows in side files.
    config = _cluster_config(kafka_settings, tmp_path, app, source, root,
                             **{"platform.sink.driver.max.records": 0})  # fmt: skip
    tables = root["platform.delta.root"]
    report = _run_on(
        cluster, "dedup", config, source,
        executor_env={"STREAMPLATFORM_PAUSE": "during_tasks:1",
                      "STREAMPLATFORM_PAUSE_DIR": str(held)},
        during_run=kill_worker_0_inside_batch_1,
    )  # fmt: skip
    assert cluster.alive_workers() == 1
    rows = delta_rows(spark, f"{tables}/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    dlq = spark.read.format("delta").load(f"{tables}/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3
    # The tasks that had lived on worker 0 restored on worker 1, counted where they did (a
    # task Spark moved from one executor to the other before the kill restored too).
    restores = [(b["batch_id"], *r) for b in report["batches"] for r in b["restores"]]
    state_dirs = [str(directory / "state") for directory in cluster.worker_dirs]
    assert all(where.split(":", 1)[1] in state_dirs for _, _, where, _ in restores), restores
    assert any(batch >= 1 and where.endswith(state_dirs[1])
               for batch, _, where, _ in restores), restores  # fmt: skip
    assert sum(b["restored_records"] for b in report["batches"]) == sum(n for *_, n in restores)


@pytest.mark.cluster
@pytest.mark.child_process
def test_a_rekeyed_windowed_count_on_the_cluster_counts_what_the_test_driver_counts(
    cluster, kafka_settings, tmp_path
):
    """Live clicks on two partitions, re-keyed by page and counted in 1-minute windows, a
    cap of 3 records per task: on the two-worker cluster (the tasks in the executors, the
    repartitioned records handed on by the driver, buffers in the executors' stores) the
    final counts are the test driver's."""
    import random

    from .test_event_time_on_spark import NOON, _produce, _through_the_test_driver, _topics

    topics = _topics(kafka_settings, clicks=2, out=1)
    rng = random.Random(8)
    records, time = [], NOON
    for n in range(40):
        time += rng.choice([0, 5_000, 20_000, 40_000])
        partition = rng.randrange(2)
        records.append((topics["clicks"], partition, f"u{partition}",
                        {"page": rng.choice("abc"), "n": n}, time))  # fmt: skip
    for partition in range(2):  # closes every window
        records.append((topics["clicks"], partition, f"u{partition}", {"page": "z", "n": 99},
                        time + 1_800_000))  # fmt: skip
    _produce(kafka_settings, records)
    from .event_time_jobs import pages_per_minute

    want = _through_the_test_driver(pages_per_minute(topics["clicks"], topics["out"]), records,
                                    topics["out"], Serdes.long())  # fmt: skip
    app = f"cluster-pages-{uuid.uuid4().hex[:6]}"
    config = _cluster_config(kafka_settings, tmp_path, app, topics["clicks"],
                             **{"platform.max.records.per.batch": 3})  # fmt: skip
    report = _run_on(cluster, "pages", config, topics["clicks"], topics["out"])
    assert report["failed_attempts"] == 0, report
    assert {b["path"] for b in report["batches"]} == {"direct-stages-spark"}
    assert any(b["buffered"] for b in report["batches"]), "nothing waited: proves nothing"
    got = read_topic(kafka_settings, topics["out"])
    assert sorted((r.key, r.value) for r in got) == sorted(
        (r.key, r.value.to_bytes(8, "big", signed=True)) for r in want
    )


@pytest.mark.cluster
@pytest.mark.child_process
@pytest.mark.parametrize("mode", ["sasl_ssl", "ssl"], ids=["sasl_ssl-scram", "mtls"])
def test_a_job_on_a_secured_broker_runs_in_the_clusters_executors(
    cluster, spark, tmp_path_factory, tmp_path, mode
):
    """SASL_SSL with SCRAM, and mutual TLS: the tasks' librdkafka clients in the executors
    (``direct-spark``) and Spark's Java Kafka source in the executors (``delta-write``) get the
    settings the driver ships them, trust and key stores by path, and give the test driver's
    answer."""
    directory = tmp_path_factory.mktemp("secured") / "broker"
    with LocalBroker(directory, security=mode) as broker:
        settings = broker.client_settings()
        source = f"in-{uuid.uuid4().hex[:8]}"
        create_topics(settings, [TopicSpec(source, 3), TopicSpec(f"{source}-dlq", 1)])
        sent = make_input(settings, source)
        paths = [  # (application id, the path its batches must take, its settings)
            (f"cluster-secured-{uuid.uuid4().hex[:6]}", "direct-spark", {}),
            (f"cluster-secured-{uuid.uuid4().hex[:6]}", "delta-write",
             {"platform.sink.driver.max.records": 0}),
        ]  # fmt: skip
        # Both paths in one application: its executors start once.
        report = _run_all_on(cluster, [
            ("dedup", _cluster_config(settings, tmp_path, app, source,
                                      **{"platform.max.records.per.batch": 100_000} | limit)
             | settings, source, None)
            for app, _, limit in paths
        ])  # fmt: skip
        assert report["failed_attempts"] == 0, report
        want = expected_with_the_test_driver(source, sent)
        for (app, path, _), batches in zip(paths, report["runs"], strict=True):
            assert {b["path"] for b in batches} == {path}
            rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
            assert sorted((k, v) for _, _, k, v in rows) == want
