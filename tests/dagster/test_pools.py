"""Runs of the same streaming job queue instead of colliding: pools, their limits, the run queue.

Every op that runs a streaming job or writes its runtime tables is in the pool of its
application id (``streamplatform/<application.id>``), and the instance this project writes
limits each pool to one run at a time, at run granularity (``demo.py``'s
``INSTANCE_CONFIG``). Three tests, from cheap to real:

- the definitions: which op is in which pool;
- the run queue's own decision (the daemon's dequeue pass, without a daemon process) on an
  instance set up by ``demo.prepare_instance``: of two queued runs of one pool it lets one through
  and holds the other until the first has ended;
- what `dagster dev` runs, the webserver and the daemon, with two materializations of
  ``transactions_deduplicated`` launched through GraphQL as the UI does, both queued before the
  daemon's first pass (a fresh pool, two runs at once): one runs while the other is QUEUED on
  the pool, they never run the job at the same time, both succeed, and the output holds every
  transaction exactly once. Slow (~2 minutes: two runs, each with its JVM, one after the other).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from dagster_support import (
    LAUNCH,
    create_pipeline_topics,
    mission,
    produce_transactions,
    unique_prefix,
)

import definitions
import demo
import webui
from streamplatform.dagster import job_pool
from webui import GraphQL

ROOT = Path(__file__).resolve().parents[2]
DAEMON = Path(sys.executable).with_name("dagster-daemon")
LOCATION = "streamplatform"
DEDUP_POOL = job_pool("transactions-dedup")  # the code location's default application ids
ENRICHMENT_POOL = job_pool("transactions-enrichment")
# Every op that runs a streaming job or writes its runtime tables, and its job's pool.
POOLED_OPS = {
    "transactions_deduplicated": DEDUP_POOL,
    "transactions_enrichment": ENRICHMENT_POOL,
    "transactions_enrichment_fx_rates_versions": ENRICHMENT_POOL,
    "replay_transactions_deduplicated_dead_letters": DEDUP_POOL,
    "replay_transactions_enrichment_dead_letters": ENRICHMENT_POOL,
    "maintain_transactions_deduplicated_tables": DEDUP_POOL,
    "maintain_transactions_enrichment_tables": ENRICHMENT_POOL,
}
DEDUPLICATED = dg.AssetKey("transactions_deduplicated")
ENRICHMENT = dg.AssetKey("transactions_enrichment")


def test_each_streaming_op_is_in_the_pool_of_its_application_id():
    assert job_pool("transactions-dedup") == "streamplatform/transactions-dedup"
    defs = definitions.defs
    seen = {}
    for job in defs.resolve_all_job_defs():
        for op in job.graph.iterate_op_defs():
            assert op.pool == POOLED_OPS.get(op.name), (job.name, op.name, op.pool)
            seen[op.name] = op.pool
    assert {name: seen.get(name) for name in POOLED_OPS} == POOLED_OPS
    assert definitions.pools(defs) == {DEDUP_POOL, ENRICHMENT_POOL}
    graph = defs.resolve_asset_graph()  # what the asset's page in the UI shows
    assert graph.get(DEDUPLICATED).pools == {DEDUP_POOL}
    assert graph.get(ENRICHMENT).pools == {ENRICHMENT_POOL}


def test_the_instance_limits_every_pool_to_one_run(tmp_path):
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: true\n")  # an older file
    demo.prepare_instance(tmp_path)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        config = instance.get_concurrency_config()
        assert config.pool_config.pool_granularity.value == "run"
        assert config.pool_config.default_pool_limit == 1
        assert config.run_queue_config.should_block_op_concurrency_limited_runs
        assert instance.telemetry_enabled  # the file's own setting stays
        for pool in (DEDUP_POOL, ENRICHMENT_POOL):
            info = instance.event_log_storage.get_concurrency_info(pool)
            assert (info.limit, info.using_default_limit) == (1, True), pool


def test_the_run_queue_holds_a_second_run_of_a_pool_until_the_first_ends(tmp_path, monkeypatch):
    # A started run counts for the queue's op granularity only for this many seconds before its
    # step claims the slot; ours start Spark first. 0: as if that had taken long (the run
    # granularity does not care, which is why the instance uses it).
    monkeypatch.setenv("DAGSTER_OP_CONCURRENCY_KEYS_ALLOTTED_FOR_STARTED_RUN_SECONDS", "0")
    demo.prepare_instance(tmp_path)
    defs = definitions.defs
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        first, second = (queued(instance, defs, [DEDUPLICATED]) for _ in range(2))
        other_pool = queued(instance, defs, [ENRICHMENT])
        replay = queued(instance, defs, job="transactions_deduplicated_dlq_replay")
        assert second.run_op_concurrency.all_pools == {DEDUP_POOL}
        assert replay.run_op_concurrency.all_pools == {DEDUP_POOL}
        names = {first.run_id: "first", second.run_id: "second",
                 other_pool.run_id: "other pool", replay.run_id: "replay"}  # fmt: skip

        def dequeued() -> list[str]:
            daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
            runs = daemon._get_runs_to_dequeue(instance, instance.get_concurrency_config(), None)
            return [names[run.run_id] for run in runs]

        # A fresh pool, two runs queued together: one goes (init_pools is what makes this so).
        assert dequeued() == ["first", "other pool"]
        report(instance, first, DagsterEventType.PIPELINE_START)
        assert dequeued() == ["other pool"]
        report(instance, first, DagsterEventType.PIPELINE_SUCCESS)
        assert dequeued() == ["second", "other pool"]


def queued(
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    assets: list[dg.AssetKey] | None = None,
    job: str | None = None,
) -> dg.DagsterRun:
    """A QUEUED run of the code location's asset job over ``assets``, or of ``job``, as a launch
    from the UI leaves it (its pools computed from its execution plan)."""
    definition = defs.resolve_job_def(job) if job else defs.resolve_implicit_global_asset_job_def()
    if assets:
        definition = definition.get_subset(asset_selection=set(assets))
    repository = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin(LOCATION), "__repository__")
    return instance.create_run_for_job(
        job_def=definition,
        status=dg.DagsterRunStatus.QUEUED,
        asset_selection=frozenset(assets) if assets else None,
        remote_job_origin=RemoteJobOrigin(repository, definition.name),
    )


def report(instance: dg.DagsterInstance, run: dg.DagsterRun, event: DagsterEventType) -> None:
    """What the run worker reports when the run starts or ends."""
    instance.report_dagster_event(
        DagsterEvent(event_type_value=event.value, job_name=run.job_name), run_id=run.run_id
    )


# What the run page's "View queue criteria" dialog reads (QueuedRunCriteriaQuery), plus status.
QUEUE = """
query Queue($a: ID!, $b: ID!, $pool: String!) {
  instance { poolConfig { poolGranularity defaultPoolLimit }
             runQueueConfig { isOpConcurrencyAware }
             concurrencyLimit(concurrencyKey: $pool) { limit usingDefaultLimit } }
  a: runOrError(runId: $a) { ... on Run { runId status allPools rootConcurrencyKeys } }
  b: runOrError(runId: $b) { ... on Run { runId status allPools rootConcurrencyKeys } }
}"""
TIMES = """
query Times($runId: ID!) { runOrError(runId: $runId) { ... on Run {
  status creationTime startTime endTime stepStats { stepKey status startTime endTime } } } }"""
MATERIALIZATIONS = """
query Materializations($path: [String!]!) { assetOrError(assetKey: {path: $path}) {
  ... on Asset { assetMaterializations(limit: 10) { runId
    metadataEntries { label ... on IntMetadataEntry { intValue } } }
                 assetObservations(limit: 10) { runId
    metadataEntries { label ... on IntMetadataEntry { intValue } } } } } }"""
CHECKS = """
query Checks($path: [String!]!, $name: String!) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: $name, limit: 10) {
    runId status evaluation { metadataEntries { label ... on IntMetadataEntry { intValue } } } } }"""
ACTIVE = ("STARTING", "STARTED", "CANCELING")
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
CHECK = "no_duplicates_within_interval"
# Every check of the asset: the integration's and the example's.
CHECKS_OF_ASSET = (CHECK, "caught_up", "dlq_ratio", "offsets_contiguous")


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.dagster_dev
def test_two_materializations_of_one_job_through_the_ui_queue_one_behind_the_other(
    kafka_settings, tmp_path
):
    began = time.monotonic()
    prefix = unique_prefix("pools")
    topics = mission(prefix).topics  # the code location's, with the same prefix (env below)
    create_pipeline_topics(kafka_settings, topics)
    data = produce_transactions(kafka_settings, topics)
    home = demo.prepare_instance(tmp_path / "dagster_home")
    workspace = write_workspace(tmp_path / "workspace.yaml")
    env = os.environ | {
        "DAGSTER_HOME": str(home),
        "STREAMPLATFORM_DATA": str(tmp_path / "data"),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings["bootstrap.servers"],
        "SPARK_MASTER": "local[1]",
        "STREAMPLATFORM_TOPIC_PREFIX": prefix,
    }
    logs = {name: tmp_path / f"{name}.log" for name in ("webserver", "daemon")}
    costs: dict[str, float] = {}
    # The webserver first, the daemon once both runs are queued: its first pass meets both.
    webserver = webui.dagster_dev(ROOT, env, logs["webserver"], daemon=False, workspace=workspace)
    daemon = [str(DAEMON), "run", "-w", str(workspace)]
    with webserver as (_, base):
        costs["webserver up"] = time.monotonic() - began
        graphql = GraphQL(f"{base}/graphql")
        a, b = launch(graphql, topics.deduplicated), launch(graphql, topics.deduplicated)
        queued = graphql(QUEUE, a=a, b=b, pool=DEDUP_POOL)
        started = time.monotonic()
        with webui.group(daemon, logs["daemon"], cwd=ROOT, env=env):
            seen = watch(graphql, a, b, logs["daemon"])
        costs["daemon, both runs"] = time.monotonic() - started
        times = {run: graphql(TIMES, runId=run)["runOrError"] for run in (a, b)}
        materializations = graphql(MATERIALIZATIONS, path=DEDUPLICATED.path)
        checks = graphql(CHECKS, path=DEDUPLICATED.path, name=CHECK)["assetCheckExecutions"]
    costs["total"] = time.monotonic() - began
    before, after = sorted(times, key=lambda run: times[run]["startTime"])
    costs["second run queued"] = times[after]["startTime"] - times[after]["creationTime"]
    print("cost (s): " + ", ".join(f"{name} {seconds:.0f}" for name, seconds in costs.items()))

    # Both in the queue before the daemon's first pass: a fresh pool, two runs at once.
    assert statuses(queued) == {"QUEUED"}, queued
    assert queued["a"]["allPools"] == queued["b"]["allPools"] == [DEDUP_POOL]
    # While one ran, the other waited in the queue, on the pool: what the UI shows for it.
    waiting = [s for s in seen if statuses(s) in ({"QUEUED", "STARTING"}, {"QUEUED", "STARTED"})]
    assert waiting, [statuses(s) for s in seen]
    for snapshot in waiting:
        [held] = [snapshot[run] for run in ("a", "b") if snapshot[run]["status"] == "QUEUED"]
        assert held["allPools"] == [DEDUP_POOL] and held["rootConcurrencyKeys"] == [DEDUP_POOL]
        instance = snapshot["instance"]
        assert instance["poolConfig"] == {"poolGranularity": "run", "defaultPoolLimit": 1}
        assert instance["runQueueConfig"] == {"isOpConcurrencyAware": True}
        assert instance["concurrencyLimit"] == {"limit": 1, "usingDefaultLimit": True}
    # Never both at once: not by status, not by the job's step.
    assert not [s for s in seen if statuses(s) <= set(ACTIVE)]
    assert all(t["status"] == "SUCCESS" for t in times.values()), times
    steps = {run: step_times(times[run], DEDUPLICATED.path[-1]) for run in (a, b)}
    assert times[before]["endTime"] <= times[after]["startTime"], times
    assert steps[before][1] <= steps[after][0], steps

    # The right data: the first run read everything once and materialized the asset; the
    # second found nothing new and observed it (its latest materialization keeps the first
    # run's numbers). After the first the output held every (currency, id) exactly as often as
    # KIP-655 allows; the second changed nothing, so the example's check was skipped with it.
    asset = materializations["assetOrError"]
    by_run = {event["runId"]: metadata(event) for event in asset["assetMaterializations"]}
    assert set(by_run) == {before}
    assert by_run[before]["rows_in"] == data.records
    assert by_run[before]["rows_out"] == data.transactions
    assert by_run[before]["duplicates_dropped"] == data.duplicates
    assert by_run[before]["dlq_records"] == data.poison
    observed = {event["runId"]: metadata(event) for event in asset["assetObservations"]}
    assert set(observed) == {after}
    assert (observed[after]["rows_in"], observed[after]["batches"], observed[after]["lag"]) == (
        0, 0, 0)  # fmt: skip
    assert observed[after]["committed_batch_id"] == by_run[before]["committed_batch_id"]
    evaluations = {execution["runId"]: execution for execution in checks}
    statuses_by_run = {run: execution["status"] for run, execution in evaluations.items()}
    assert statuses_by_run == {before: "SUCCEEDED", after: "SKIPPED"}, evaluations
    found = metadata(evaluations[before]["evaluation"])
    assert (found["output_records"], found["missing"]) == (data.transactions, 0), found


def write_workspace(path: Path) -> Path:
    """A workspace with ``definitions.py`` as the ``streamplatform`` code location."""
    location = ROOT / "definitions.py"
    path.write_text(
        "load_from:\n  - python_file:\n"
        f"      relative_path: {location}\n      working_directory: {ROOT}\n"
        f"      location_name: {LOCATION}\n"
    )
    return path


def launch(graphql: GraphQL, output_topic: str) -> str:
    """A materialization of ``transactions_deduplicated`` (with the topic it writes, as
    "Materialize" selects them) and its checks."""
    params = {
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": "__repository__",
            "jobName": "__ASSET_JOB",
            "assetSelection": [{"path": DEDUPLICATED.path}, {"path": ["kafka", output_topic]}],
            "assetCheckSelection": [
                {"assetKey": {"path": DEDUPLICATED.path}, "name": name} for name in CHECKS_OF_ASSET
            ],
        }
    }
    launched = graphql(LAUNCH, params=params)["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return str(launched["run"]["runId"])


def watch(graphql: GraphQL, a: str, b: str, log: Path, timeout_s: float = 420) -> list[dict]:
    """What GraphQL says about both runs and the pool, every half second (a QUEUED phase of a
    few seconds is not missed) until both have ended."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while not seen or not statuses(seen[-1]) <= set(FINISHED):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:]
            raise TimeoutError(f"runs {a}, {b} still {statuses(seen[-1])}; log tail:\n{tail}")
        seen.append(graphql(QUEUE, a=a, b=b, pool=DEDUP_POOL))
        time.sleep(0.5)
    return seen


def statuses(snapshot: dict[str, Any]) -> set[str]:
    return {snapshot["a"]["status"], snapshot["b"]["status"]}


def step_times(run: dict[str, Any], step: str) -> tuple[float, float]:
    [stats] = [s for s in run["stepStats"] if s["stepKey"] == step]
    assert stats["status"] == "SUCCESS", stats
    return float(stats["startTime"]), float(stats["endTime"])


def metadata(event: dict[str, Any]) -> dict[str, int]:
    return {e["label"]: e["intValue"] for e in event["metadataEntries"] if "intValue" in e}
