"""The code location loads and holds what the UI shows; the schedule and the backfill sensor
evaluate (no broker, no Spark: the sensor reads materialization metadata only)."""

from __future__ import annotations

import doctest

import dagster as dg
import pytest

import assets.dedup_audit
import assets.lateness
import definitions
from assets import fx_rate_versions
from jobs import dlq_replay_schedule, late_fx_rates_backfill_sensor
from resources import KafkaResource, SparkResource, build_resources

ASSET_NAMES = {
    "transactions_deduplicated",
    "fx_rate_versions",
    "transactions_enriched",
    "dlq_records",
    "standby_placements",
    "stream_offsets",
}


def test_definitions_load_and_validate():
    defs = definitions.defs
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert ASSET_NAMES | {"kafka/transactions", "kafka/fx_rates"} <= keys
    assert {key.to_user_string() for key in graph.external_asset_keys} == {
        "kafka/transactions",
        "kafka/fx_rates",
    }
    checks = {key.name for key in graph.asset_check_keys}
    assert checks == {"no_duplicates_within_interval", "offsets_contiguous",
                      "dlq_below_threshold", "stream_equals_batch_join"}  # fmt: skip
    assert {job.name for job in defs.jobs} == {"dlq_replay", "enriched_backfill"}
    assert dlq_replay_schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert dlq_replay_schedule.cron_schedule == "*/15 * * * *"
    assert {s.name for s in defs.sensors} == {"late_fx_rates_backfill", "stream_lag"}


def test_every_job_runs_in_one_process():
    """One JVM per run: the in-process executor everywhere (see resources/spark.py)."""
    defs = definitions.defs
    for name in ("dlq_replay", "enriched_backfill", "__ASSET_JOB"):
        assert defs.resolve_job_def(name).executor_def is dg.in_process_executor, name


def test_resources_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-1:9092,broker-2:9092")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SPARK_MASTER", "spark://cluster:7077")
    monkeypatch.setenv("STREAMPLATFORM_DELTA_ROOT", "s3a://bucket/streams")
    resources = build_resources()
    kafka = resources["kafka"]
    assert isinstance(kafka, KafkaResource) and isinstance(resources["spark"], SparkResource)
    assert resources["spark"].spark_config["spark.master"] == "spark://cluster:7077"
    with dg.build_resources({"kafka": kafka, "delta_root": resources["delta_root"]}) as built:
        assert built.kafka.settings() == {
            "bootstrap.servers": "broker-1:9092,broker-2:9092",
            "security.protocol": "SASL_SSL",
        }
        assert built.delta_root.table("app", "_dlq") == "s3a://bucket/streams/app/_dlq"


def test_no_broker_anywhere_is_a_readable_error(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path))
    with pytest.raises(ConnectionError, match="KAFKA_BOOTSTRAP_SERVERS"):
        KafkaResource().settings()


def test_the_schedule_evaluates_to_a_dlq_replay_run():
    with dg.build_schedule_context() as context:
        [request] = dlq_replay_schedule.evaluate_tick(context).run_requests
    assert dlq_replay_schedule.job_name == "dlq_replay"
    assert request.run_config == {}  # defaults: both jobs' DLQs, 3 attempts


def test_backfill_sensor_turns_late_days_into_partition_runs_once():
    with dg.instance_for_test() as instance:
        for days in (["2026-01-03", "2025-12-30"], [], ["2026-01-03", "2026-01-04"]):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    asset_key=fx_rate_versions.key,
                    metadata={"late_days": dg.MetadataValue.json(days)},
                )
            )
        with dg.build_sensor_context(instance=instance) as context:
            result = late_fx_rates_backfill_sensor(context)
        # 2025-12-30 is before the first partition: skipped, not requested.
        # A day named twice in one tick is recomputed once, by the newest materialization.
        assert [r.partition_key for r in result.run_requests] == ["2026-01-03", "2026-01-04"]
        assert len({r.run_key for r in result.run_requests}) == 2
        assert all(r.job_name in (None, "enriched_backfill") for r in result.run_requests)
        with dg.build_sensor_context(instance=instance, cursor=result.cursor) as context:
            again = late_fx_rates_backfill_sensor(context)
        assert not again.run_requests


@pytest.mark.parametrize("module", [assets.lateness, assets.dedup_audit])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0
