"""`make demo`: the whole Dagster story in-process, against the test run's broker and Spark, on a
real Dagster instance under a temporary ``STREAMPLATFORM_DATA``; and the demo's own broker,
stopped whether the demo finishes, fails or is interrupted."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from live_processes import group_members

import demo
import pipelines
from jobs import in_process
from streamplatform.kafka.local_broker import read_state, running_broker

pytestmark = [pytest.mark.broker]

STORY_ASSETS = {"transactions_deduplicated", "transactions_enrichment", demo.SNAPSHOT_ASSET,
                "transactions_enriched", "standby_placements"}  # fmt: skip
STREAMING_CHECKS = {"caught_up", "dlq_ratio", "offsets_contiguous"}


@pytest.fixture(scope="module")
def story(kafka_settings, spark, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """One run of the demo (800 transactions) on the test broker; what it returned and printed,
    the code location it ran and its instance, reopened."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STREAMPLATFORM_DATA", str(tmp_path_factory.mktemp("demo")))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            numbers = demo.run(count=800, bootstrap_servers=kafka_settings["bootstrap.servers"])
        sys.stdout.write(printed.getvalue())
        defs = demo.code_location(kafka_settings["bootstrap.servers"])
        with demo.open_instance() as instance:
            yield {"numbers": numbers, "out": printed.getvalue(), "defs": defs,
                   "instance": instance}  # fmt: skip


def by_asset(numbers: dict[str, Any], asset: str) -> list[dict[str, Any]]:
    return [e["metadata"] for e in numbers["materializations"] if e["asset"] == asset]


@pytest.mark.spark
@pytest.mark.slow
def test_every_asset_is_materialized_in_the_instance_and_every_check_passes(story):
    numbers, instance, defs = story["numbers"], story["instance"], story["defs"]
    graph = defs.resolve_asset_graph()
    materializable = {key.to_user_string() for key in graph.materializable_asset_keys}
    assert materializable == STORY_ASSETS | {"kafka/transactions-deduplicated"}
    for key in graph.materializable_asset_keys:
        assert instance.get_latest_materialization_event(key) is not None, key
    # transactions_enriched: every daily partition with data, the event days of the demo data.
    assert numbers["enriched_days"] == ["2026-01-01", "2026-01-02"]
    enriched = instance.get_materialized_partitions(dg.AssetKey("transactions_enriched"))
    assert enriched == set(numbers["enriched_days"])
    assert all(run["status"] == "SUCCESS" for run in numbers["runs"]), numbers["runs"]
    assert set(numbers["checks"]) == {
        *{f"transactions_deduplicated.{name}" for name in STREAMING_CHECKS},
        *{f"transactions_enrichment.{name}" for name in STREAMING_CHECKS},
        "transactions_deduplicated.no_duplicates_within_interval",
        "transactions_enriched.stream_equals_batch_join",
    }
    assert all(check["passed"] for check in numbers["checks"].values()), numbers["checks"]


@pytest.mark.spark
@pytest.mark.slow
def test_the_streaming_assets_account_for_every_record(story):
    numbers = story["numbers"]
    data = numbers["data"]
    assert data.duplicates > 0 and data.poison > 0 and data.late_corrections > 0
    [dedup] = by_asset(numbers, "transactions_deduplicated")
    assert dedup["rows_in"] == data.transactions + data.duplicates + data.poison
    assert dedup["duplicates_dropped"] == data.duplicates
    assert dedup["dlq_records"] == data.poison
    assert dedup["rows_out"] == data.transactions and dedup["lag"] == 0
    rates_only, joined, corrected = by_asset(numbers, "transactions_enrichment")
    assert rates_only["rows_in"] == data.rate_updates + data.late_corrections
    assert rates_only["rows_out"] == 0  # no transaction yet: every rate is known before them
    # Every unique transaction met the FX rate valid at its time (rates start a day earlier),
    # and the generator's late corrections, known before any transaction, are not late.
    assert joined["rows_in"] == joined["rows_out"] == data.transactions
    assert corrected["rows_in"] == 1
    snapshots = by_asset(numbers, demo.SNAPSHOT_ASSET)
    assert [s["late_versions"] for s in snapshots] == [0, 0, 1]
    assert snapshots[0]["versions"] == data.rate_updates + data.late_corrections
    stream_rows = [m["rows"] for m in by_asset(numbers, "transactions_enriched")
                   if m["computed_by"] == "stream"]  # fmt: skip
    assert sum(stream_rows) == data.transactions


@pytest.mark.spark
@pytest.mark.slow
def test_the_dlq_replay_parks_the_poison_once_and_replays_nothing_the_second_time(story):
    numbers, defs, instance = story["numbers"], story["defs"], story["instance"]
    poison = numbers["data"].poison
    dedup_schedule, enrichment_schedule = demo.REPLAY_SCHEDULES
    assert numbers["dlq_replay"] == {
        dedup_schedule: {"candidates": poison, "republished": 0, "parked": poison, "exhausted": 0},
        enrichment_schedule: {"candidates": 0, "republished": 0, "parked": 0, "exhausted": 0},
    }
    replays = [run for run in numbers["runs"] if run["step"] == "dlq replay"]
    assert [r["tags"]["dagster/schedule_name"] for r in replays] == list(demo.REPLAY_SCHEDULES)
    job = defs.resolve_job_def("transactions_deduplicated_dlq_replay")
    again = in_process.execute(job, instance, log_level="WARNING")
    assert demo._replay_report(again) == {
        "candidates": 0, "republished": 0, "parked": 0, "exhausted": 0}  # fmt: skip


@pytest.mark.spark
@pytest.mark.slow
def test_the_sensor_backfills_exactly_the_day_the_late_correction_changed(story):
    numbers, defs, instance = story["numbers"], story["defs"], story["instance"]
    correction = numbers["correction"]
    assert correction["day"] == "2026-01-01"  # valid from 10:30 until the next rate at 12:00
    assert numbers["sensor"]["requested"] == [correction["day"]]
    [backfill] = numbers["backfills"].values()
    assert backfill["success"] and backfill["job"] == "enriched_backfill"
    recomputed = backfill["metadata"]
    streamed = [m for m in by_asset(numbers, "transactions_enriched")
                if m["day"] == correction["day"] and m["computed_by"] == "stream"]  # fmt: skip
    assert recomputed["computed_by"] == "batch_as_of"
    assert recomputed["rows"] == streamed[0]["rows"] > 0
    assert recomputed["amount_eur_total"] != pytest.approx(streamed[0]["amount_eur_total"])
    run = instance.get_run_by_id(backfill["run_id"])
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert run.tags["dagster/sensor_name"] == demo.BACKFILL_SENSOR
    assert run.tags["dagster/run_key"] == numbers["sensor"]["run_keys"][0]
    assert run.tags["dagster/partition"] == correction["day"]
    # The daemon would launch nothing more: the cursor moved on, and the run key has its run.
    assert not in_process.tick(defs, instance, demo.BACKFILL_SENSOR,
                               cursor=numbers["sensor"]["cursor"]).run_requests  # fmt: skip
    [request] = in_process.tick(defs, instance, demo.BACKFILL_SENSOR).run_requests
    assert in_process.execute_run_request(defs, instance, demo.BACKFILL_SENSOR, request) is None


@pytest.mark.spark
@pytest.mark.slow
def test_the_demo_prints_its_progress_and_the_summary(story):
    out = story["out"]
    for step in range(1, demo.STEPS + 1):
        assert f"[{step}/{demo.STEPS}]" in out
    for asset in STORY_ASSETS:
        assert asset in out
    assert "transactions_enriched[2026-01-01]" in out and "batch_as_of" in out
    assert f"{demo.BACKFILL_SENSOR} sensor requested: ['2026-01-01']" in out
    assert "enriched_backfill 2026-01-01: SUCCESS" in out
    assert "no_duplicates_within_interval" in out and "FAILED" not in out
    assert f"Dagster instance: {demo.dagster_home()}" in out


def _end(how: str) -> None:
    if how == "ctrl-c":
        raise KeyboardInterrupt
    if how == "error":
        raise RuntimeError("a step failed")
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)  # the demo turns it into an interrupt


@pytest.mark.slow  # ~6-10 s each: a broker of the demo's own
@pytest.mark.parametrize("how", ["finishes", "error", "ctrl-c", "sigterm"])
def test_the_demos_own_broker_is_stopped_whatever_happens(how, tmp_path, monkeypatch, capsys):
    """Without --bootstrap-servers the demo starts a broker (a process group of its own) and
    stops the whole group at the end. The story itself is replaced here: the test above runs it."""
    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path))
    seen: dict[str, Any] = {}

    def story(settings: dict[str, Any], say: Any) -> dict[str, Any]:
        seen["state"] = running_broker(demo.demo_dir() / "broker")
        _end(how)
        return {}

    monkeypatch.setattr(demo, "_story", story)
    monkeypatch.setattr(pipelines, "generate", lambda settings, **kwargs: "no data")
    expected = {"finishes": contextlib.nullcontext(), "error": pytest.raises(RuntimeError),
                "ctrl-c": pytest.raises(KeyboardInterrupt),
                "sigterm": pytest.raises(KeyboardInterrupt)}[how]  # fmt: skip
    previous = signal.getsignal(signal.SIGTERM)
    with expected:
        numbers = demo.run(count=10)
        assert numbers["broker"]["bootstrap_servers"] == seen["state"].bootstrap_servers
    state = seen["state"]
    assert state is not None, "the demo did not start its broker"
    assert running_broker(demo.demo_dir() / "broker") is None
    assert read_state(demo.demo_dir() / "broker") is None
    assert group_members(state.pid) == [], "the broker's process group outlived the demo"
    assert signal.getsignal(signal.SIGTERM) == previous  # the demo's handler is gone again
    assert "Stopping the local broker" in capsys.readouterr().out


def test_data_only_produces_the_demo_data_into_a_running_broker(kafka_settings, monkeypatch):
    """`python demo.py --data-only`: topics and data for `make ui`, nothing else, into the topics
    of the code location's configuration (here: behind a prefix of the test's own)."""
    from streamplatform.kafka import end_offsets

    prefix = f"data-only-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("STREAMPLATFORM_TOPIC_PREFIX", prefix)
    topics = pipelines.Topics.prefixed(prefix)
    servers = kafka_settings["bootstrap.servers"]
    args = ["--data-only", "--records", "50", "--bootstrap-servers", servers]
    assert demo.main(args) == 0
    sent = {topic: sum(high for _, high in end_offsets(kafka_settings, topic).values())
            for topic in (topics.transactions, topics.fx_rates)}  # fmt: skip
    assert sent[topics.fx_rates] == 6 * 24 + 12  # every 3 hours over 3 days, 2 corrections
    assert sent[topics.transactions] >= 50
    assert sum(end_offsets(kafka_settings, topics.deduplicated)[p][1] for p in range(3)) == 0


def test_the_demo_leaves_an_instance_in_use_alone(tmp_path, monkeypatch):
    """A fresh instance must not be pulled from under a running `make ui` (dagster dev)."""
    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path))
    home = demo.dagster_home()
    env = os.environ | {"DAGSTER_HOME": str(home)}
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "dagster", "dev"]
    process = subprocess.Popen(sleeper, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30  # until the child has exec'd (its command line)
        while demo.dagster_processes(home) != [process.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert demo.dagster_processes(home) == [process.pid]
        with pytest.raises(RuntimeError, match="make ui"):
            demo.open_instance(fresh=True)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    assert demo.dagster_processes(home) == []
    with demo.open_instance(fresh=True) as instance:
        assert instance.is_persistent and not instance.get_runs()
