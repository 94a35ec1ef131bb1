"""Continuous jobs in Dagster: a running job reports itself to the instance without a run
(ContinuousJobReporter, `streamplatform run --dagster-asset`), and continuous_job_definitions'
checks and stall sensor fail once it stops reporting or loses its claim.

The quick tests drive the reporter with a stand-in job on a real instance; the slow ones run a
real job (in this process, and as `streamplatform run` in a child process) on the test broker,
Spark and Delta."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import dagster as dg
import pytest
from runtime.support import dedup_topology, job_config, make_input
from test_cli import console_command, env_without_pythonpath, five_records, team_module

from streamplatform import JobClaimedError, JobFencedError, cli
from streamplatform.dagster import (
    ContinuousJobReporter,
    StreamingJobSpec,
    StreamplatformResource,
    continuous_job_definitions,
    delta_sink_key,
    streaming_definitions,
)
from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime.logs import CommitLog
from streamplatform.runtime.microbatch import BatchResult, StreamingJob

APP = "orders-app"
KEY = dg.AssetKey("orders")
SINK_KEY = delta_sink_key(APP, "out")
SPEC = StreamingJobSpec(name="orders", topology=dedup_topology("in", "out"), application_id=APP,
                        delta_sinks=["out"])  # fmt: skip


def batch(batch_id: int, records_in: int = 5, lag: int = 0) -> BatchResult:
    return BatchResult(batch_id=batch_id, records_in=records_in, records_out=records_in - 1,
                       dlq_records=0, duplicates_dropped=1, restored_records=0, lag=lag,
                       duration_ms=10, replayed=False, guarantee="exactly_once_v2")  # fmt: skip


@dataclass
class Claim:
    run: str = "run-1"
    epoch: int | None = 1


class NoCommitLog:
    def last(self) -> None:
        return None


@dataclass
class FakeJob:
    """What the reporter reads of a StreamingJob."""

    claim: Claim = field(default_factory=Claim)
    config: dict[str, Any] = field(default_factory=lambda: {
        "application.id": APP, "processing.guarantee": "exactly_once_v2"})  # fmt: skip
    root: str = f"/delta/{APP}"
    delta_sinks: set[str] = field(default_factory=lambda: {"out"})
    commit_log: NoCommitLog = field(default_factory=NoCommitLog)


def values(event: Any) -> dict[str, Any]:
    return {name: value.value for name, value in event.metadata.items()}


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None = None) -> Any:
    """One evaluation of the stall sensor, as the daemon makes it."""
    sensor = defs.resolve_sensor_def(f"{SPEC.name}_stalled")
    with dg.build_sensor_context(instance=instance, cursor=cursor) as context:
        return sensor.evaluate_tick(context)


def running_check(result: Any) -> dg.AssetCheckEvaluation:
    [evaluation] = [e for e in result.asset_events if e.check_name == "continuous_running"]
    return evaluation


def test_a_lost_claim_fails_the_running_check_at_once_a_clean_stop_only_after_the_threshold():
    defs = continuous_job_definitions(SPEC, stall_after=timedelta(hours=1))
    with dg.DagsterInstance.ephemeral() as instance:
        assert running_check(tick(defs, instance)).passed is False  # nothing reported yet
        with ContinuousJobReporter(FakeJob(), "orders", every_batches=1, every_seconds=None,
                                   instance=instance) as reporter:  # fmt: skip
            reporter.on_batch(batch(0))
            assert reporter.flush()  # sent from the reporter's thread
            while_running = tick(defs, instance)
        assert running_check(while_running).passed is True
        # Stopped on request: within the hour, no alarm (a restart is not an incident).
        assert running_check(tick(defs, instance)).passed is True
        # Unchanged results are not recorded again: the cursor keeps the last ones.
        assert tick(defs, instance, cursor=while_running.cursor).asset_events == []

        # The next driver commits a batch, then finds another one holding the job.
        with pytest.raises(JobFencedError), ContinuousJobReporter(
            FakeJob(Claim("run-2", 2)), "orders", every_batches=1, every_seconds=None,
            instance=instance,
        ) as reporter:  # fmt: skip
            reporter.on_batch(batch(1))
            raise JobFencedError("orders-app: run-3 on host-b claimed the job")
        lost = running_check(tick(defs, instance, cursor=while_running.cursor))
        assert lost.passed is False and lost.severity == dg.AssetCheckSeverity.ERROR
        assert "lost its claim" in str(lost.description)
        assert "run-3 on host-b claimed the job" in str(lost.description)


def test_reports_the_instance_refuses_never_stop_the_job_and_warn_once(caplog):
    class Flaky:
        """The instance with its database down until ``up``."""

        def __init__(self, instance: dg.DagsterInstance) -> None:
            self.instance, self.up, self.refused = instance, False, 0

        def report_runless_asset_event(self, event: Any) -> None:
            if not self.up:
                self.refused += 1
                raise ConnectionError("database is down")
            self.instance.report_runless_asset_event(event)

    caplog.set_level(logging.INFO, logger="streamplatform.dagster.reporting")
    with dg.DagsterInstance.ephemeral() as instance:
        flaky = Flaky(instance)
        reporter = ContinuousJobReporter(FakeJob(), "orders", every_batches=1,
                                         every_seconds=None, instance=flaky)  # type: ignore[arg-type]  # fmt: skip
        for batch_id in range(3):
            reporter.on_batch(batch(batch_id))  # does not raise
        assert flaky.refused == 3
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "database is down" in warnings[0].getMessage()
        flaky.up = True
        reporter.on_batch(batch(3))
        [record] = instance.fetch_materializations(KEY, limit=10).records
        # The batches the instance refused come with the next report that gets through.
        assert values(record.asset_materialization)["rows_in"] == 4 * 5
        assert values(record.asset_materialization)["committed_batch_id"] == 3
        assert "reporting to Dagster again" in caplog.text
        reporter.finish()


def test_a_slow_dagster_never_holds_up_the_batches():
    """Started, the reporter sends its reports from a thread of its own: while the instance
    is stuck in a report (its database slow), the job's next batches go on, and every batch
    reaches Dagster once it answers, in order, one report each (before, on_batch waited)."""

    class Stuck:
        def __init__(self, instance: dg.DagsterInstance) -> None:
            self.instance, self.entered = instance, threading.Event()
            self.release = threading.Event()

        def report_runless_asset_event(self, event: Any) -> None:
            self.entered.set()
            assert self.release.wait(60), "never released"
            self.instance.report_runless_asset_event(event)

    with dg.DagsterInstance.ephemeral() as instance:
        stuck = Stuck(instance)
        reporter = ContinuousJobReporter(FakeJob(), "orders", every_batches=1,
                                         every_seconds=None, instance=stuck).start()  # type: ignore[arg-type]  # fmt: skip
        reporter.on_batch(batch(0))
        assert stuck.entered.wait(30)  # the report of batch 0 is stuck in Dagster
        for batch_id in (1, 2):
            reporter.on_batch(batch(batch_id))  # returns: the batches are not held up
        assert not stuck.release.is_set()  # proven while the instance was still stuck
        stuck.release.set()
        reporter.finish()
        records = instance.fetch_materializations(KEY, limit=10).records
        committed = sorted(values(r.asset_materialization)["committed_batch_id"] for r in records)
        assert committed == [0, 1, 2]


def test_an_idle_job_reports_observations_to_show_it_is_alive():
    with dg.DagsterInstance.ephemeral() as instance:
        reporter = ContinuousJobReporter(FakeJob(), "orders", every_seconds=0.05,
                                         instance=instance).start()  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while not instance.fetch_observations(KEY, limit=1).records:
                assert time.monotonic() < deadline, "no heartbeat reported"
                time.sleep(0.02)
        finally:
            reporter.finish()
        records = instance.fetch_observations(KEY, limit=100).records
        assert not instance.fetch_materializations(KEY, limit=1).records  # no batch, no data
        assert all(record.run_id == "" for record in records)
        heartbeat = values(records[-1].asset_observation)  # the first one
        last = values(records[0].asset_observation)
        assert (heartbeat["job_state"], heartbeat["batches"]) == ("running", 0)
        assert last["job_state"] == "stopped"


def test_the_definitions_load_alone_and_merged_with_streaming_definitions():
    alone = continuous_job_definitions(SPEC, stall_after=timedelta(minutes=2))
    merged = dg.Definitions.merge(
        streaming_definitions([SPEC], resource=StreamplatformResource()),
        continuous_job_definitions(SPEC, streaming_asset=False),
    )
    for defs in (alone, merged):
        dg.Definitions.validate_loadable(defs)
        graph = defs.resolve_asset_graph()
        assert {KEY, SINK_KEY} <= graph.get_all_asset_keys()
        assert graph.get(SINK_KEY).parent_keys == {KEY}
        assert {c.name for c in graph.get_check_keys_for_assets({KEY})} >= {
            "continuous_running", "continuous_lag"}  # fmt: skip
        assert defs.resolve_sensor_def("orders_stalled") is not None


class StandInJob(FakeJob):
    """`streamplatform run`'s job: two batches, then ``fail``."""

    fail: BaseException | None = None

    def run_forever(self, trigger_interval_ms, idle_interval_ms, on_batch, stop=None,
                    until_caught_up=False):  # fmt: skip
        for batch_id in range(2):
            on_batch(batch(batch_id))
        if self.fail is not None:
            raise self.fail
        return 2

    def close(self) -> None:
        pass


def test_run_reports_to_the_instance_and_ends_with_its_exit_code_s_state(monkeypatch, capsys):
    # DAGSTER_HOME's instance, in memory (the child process test below has a real one).
    instance = dg.DagsterInstance.ephemeral()
    monkeypatch.setattr(dg.DagsterInstance, "get", staticmethod(lambda: instance))
    monkeypatch.setattr(instance, "dispose", lambda: None)  # the reporter's, at its end
    job = StandInJob()
    job.fail = JobClaimedError("orders-app: the job is held by run-9")
    monkeypatch.setattr(cli, "_job", lambda args: job)
    run = ["run", "--topology", "unused:x", "--dagster-asset", "orders"]
    assert cli.main([*run, "--dagster-report-every-batches", "1"]) == cli.EXIT_CLAIMED
    batches = instance.fetch_materializations(KEY, limit=10).records
    assert [values(r.asset_materialization)["committed_batch_id"] for r in batches] == [1, 0]
    assert len(instance.fetch_materializations(SINK_KEY, limit=10).records) == 2
    [last] = instance.fetch_observations(KEY, limit=1).records
    assert values(last.asset_observation)["job_state"] == "claim_lost"

    assert cli.main(["run", "--topology", "unused:x", "--dagster-report-every-seconds", "5"]) == (
        cli.EXIT_BAD_SETTINGS)  # fmt: skip
    assert "give --dagster-asset" in capsys.readouterr().err
    assert cli.main([*run, "--dagster-report-every-batches", "0"]) == cli.EXIT_BAD_SETTINGS


# With Kafka, Spark and Delta ----------------------------------------------------------------


@pytest.mark.slow  # ~30 s: three batches, then waiting out the stall threshold
@pytest.mark.spark
@pytest.mark.broker
def test_a_running_job_reports_without_a_run_and_its_check_and_sensor_fail_once_it_stops(
    spark, kafka_settings, topic_name, tmp_path
):
    source = topic_name
    create_topics(kafka_settings, [TopicSpec(source, 3), TopicSpec(f"{source}-dlq", 1)])
    sent = make_input(kafka_settings, source)
    app = f"continuous-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source)  # 30 records per batch
    topology = dedup_topology(source, "deduplicated")
    spec = StreamingJobSpec(name="orders", topology=topology, application_id=app,
                            delta_sinks=["deduplicated"])  # fmt: skip
    stall_after = timedelta(seconds=3)
    defs = continuous_job_definitions(spec, stall_after=stall_after)
    sink_key, spec_key = delta_sink_key(app, "deduplicated"), dg.AssetKey("orders")

    with dg.instance_for_test() as instance:
        job = StreamingJob(topology, config, spark=spark, delta_sinks=["deduplicated"])
        stop = threading.Event()
        results: list[BatchResult] = []
        while_running: list[Any] = []
        try:
            with ContinuousJobReporter(job, spec.name, every_batches=1, every_seconds=None,
                                       instance=instance) as reporter:  # fmt: skip

                def on_batch(result: BatchResult) -> None:
                    reporter.on_batch(result)
                    results.append(result)
                    if result.lag == 0 or len(results) >= 20:
                        while_running.append(tick(defs, instance))  # just after a report
                        stop.set()

                job.run_forever(on_batch=on_batch, stop=stop)
        finally:
            job.close()
        stopped_at = time.time()

        assert len(results) >= 3 and results[-1].lag == 0
        committed = CommitLog(f"{tmp_path}/delta/{app}/_commits", app).last()
        assert committed is not None and committed.batch_id == results[-1].batch_id
        # One materialization of the job's asset per batch, none of them in a run.
        reports = instance.fetch_materializations(spec_key, limit=100).records
        assert [r.run_id for r in reports] == [""] * len(results)
        numbers = [values(r.asset_materialization) for r in reversed(reports)]
        assert sum(n["rows_in"] for n in numbers) == len(sent) == sum(r.records_in for r in results)
        assert [n["rows_out"] for n in numbers] == [r.records_out for r in results]
        assert [n["dlq_records"] for n in numbers] == [r.dlq_records for r in results]
        assert sum(n["dlq_records"] for n in numbers) == 3  # the poison records
        assert numbers[-1]["committed_batch_id"] == committed.batch_id
        assert numbers[-1]["lag"] == 0
        assert numbers[-1]["processing.guarantee"] == "exactly_once_v2"
        assert numbers[-1]["consumed_offsets"] == {
            f"{t}/{p}": offset for (t, p), offset in sorted(committed.consumed.items())}  # fmt: skip
        rows = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/deduplicated").count()
        assert sum(n["rows_out"] for n in numbers) == rows
        sinks = instance.fetch_materializations(sink_key, limit=100).records
        assert [r.run_id for r in sinks] == [""] * len(results)
        assert values(sinks[0].asset_materialization)["committed_batch_id"] == committed.batch_id
        [end] = instance.fetch_observations(spec_key, limit=1).records
        assert values(end.asset_observation)["job_state"] == "stopped"

        # While it ran, the check passed; once stopped for longer than the threshold, the
        # check in a run and the sensor both fail it.
        assert running_check(while_running[0]).passed is True
        time.sleep(max(0.0, stopped_at + stall_after.total_seconds() + 0.5 - time.time()))
        checked = dg.materialize([*defs.assets, *defs.asset_checks], instance=instance,
                                 selection=dg.AssetSelection.checks_for_assets(spec_key))  # fmt: skip
        [ran] = [e for e in checked.get_asset_check_evaluations()
                 if e.check_name == "continuous_running"]  # fmt: skip
        assert ran.passed is False and "stalled" in str(ran.description)
        fired = running_check(tick(defs, instance, cursor=while_running[0].cursor))
        assert fired.passed is False and "stalled: no report for" in str(fired.description)
        assert values(fired)["job_state"] == "stopped"


@pytest.mark.slow  # ~40 s: a driver process with its own Spark
@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.child_process
def test_streamplatform_run_reports_to_the_instance_of_dagster_home(
    kafka_settings, topic_name, tmp_path
):
    source, sink = five_records(kafka_settings, topic_name)
    app = f"cli-dagster-{uuid.uuid4().hex[:6]}"
    settings = {"application.id": app, "bootstrap.servers": kafka_settings["bootstrap.servers"],
                "platform.delta.root": str(tmp_path / "delta"),
                "state.dir": str(tmp_path / "state"), "platform.spark.master": "local[1]",
                "platform.max.records.per.batch": 2}  # fmt: skip
    home = tmp_path / "dagster_home"
    home.mkdir()
    command = console_command("run", team_module(tmp_path, source, sink), settings,
                              "--delta-sink", sink, "--until-caught-up",
                              "--dagster-asset", "upper", "--dagster-report-every-batches", "2",
                              "--dagster-report-every-seconds", "600")  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=env_without_pythonpath()
                          | {"DAGSTER_HOME": str(home)}, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reporting to Dagster failed" not in done.stderr

    key = dg.AssetKey("upper")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        reports = [values(r.asset_materialization) for r in reversed(
            instance.fetch_materializations(key, limit=10).records)]  # fmt: skip
        # Batches 0-1, then batch 2 with the last report: 5 records, 2 per batch.
        assert [r["committed_batch_id"] for r in reports] == [1, 2]
        assert [r["batches"] for r in reports] == [2, 1]
        assert sum(r["rows_in"] for r in reports) == 5 == sum(r["rows_out"] for r in reports)
        assert reports[-1]["lag"] == 0 and reports[-1]["application_id"] == app
        assert reports[-1]["job_state"] == "stopped"
        sinks = instance.fetch_materializations(delta_sink_key(app, sink), limit=10).records
        assert [values(r.asset_materialization)["committed_batch_id"] for r in sinks] == [2, 1]
        assert all(r.run_id == "" for r in sinks)
        [end] = instance.fetch_observations(key, limit=1).records
        assert end.run_id == "" and values(end.asset_observation)["job_state"] == "stopped"
