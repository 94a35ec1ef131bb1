"""The example code location materialized in-process against the run's broker, Spark and Delta.

Its definitions are built as a deployment builds them (``definitions.build_definitions``) on
topics and application ids of the test's own. One flow, shared by the tests of this module
(module-scoped fixtures, in this order):

1. rates only: ``transactions_enrichment`` runs the enrichment job while no transaction is
   deduplicated yet, so the versioned store knows every rate before the first transaction;
2. ``transactions_deduplicated``, then ``transactions_enrichment`` and the rates' snapshot: the
   join;
3. a late correction of the USD rate from 2026-01-01T10:30, then the enrichment and the snapshot
   again: the late-version backfill sensor must ask for exactly 2026-01-01.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import dagster as dg
import pytest
from dagster_support import (
    HOUR,
    JAN_1,
    create_pipeline_topics,
    make_resources,
    mission,
    produce_correction,
    produce_rates,
    produce_transactions,
    unique_prefix,
)

import definitions
from assets.enriched import Enrichment, batch_rows, stream_rows
from jobs import in_process
from jobs.in_process import check_evaluations as checks
from jobs.in_process import materialization_metadata as metadata
from streamplatform.dlq import read_topic

# Slow: the module's flow runs the streaming jobs 6 times and materializes every asset (~1-2 min,
# of which ~20 s is the SparkSession's warm-up when this module runs first).
pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

DEDUP, ENRICH = definitions.DEDUP, definitions.ENRICHMENT
SNAPSHOT = "transactions_enrichment_fx_rates_versions"
BACKFILL_SENSOR = f"{SNAPSHOT}_late_backfill"
ENRICHED = "transactions_enriched"


@pytest.fixture(scope="module")
def env(kafka_settings, spark, tmp_path_factory) -> Any:
    """Topics of its own with data, the definitions on them, a Dagster instance."""
    config = mission(unique_prefix("dg"))
    with dg.instance_for_test() as instance:
        create_pipeline_topics(kafka_settings, config.topics)
        rates = produce_rates(kafka_settings, config.topics)
        data = produce_transactions(kafka_settings, config.topics)
        resources = make_resources(kafka_settings, tmp_path_factory.mktemp("dagster"))
        defs = definitions.build_definitions(config, resources)
        yield {"instance": instance, "defs": defs, "resources": resources, "data": data,
               "rates": rates, "kafka": kafka_settings, "spark": spark,
               "mission": config}  # fmt: skip


def materialize(env: dict, *selection: str, **kwargs: Any) -> dg.ExecuteInProcessResult:
    """Materialize ``selection`` with its asset checks, as the UI's "Materialize" does."""
    result = in_process.materialize(env["defs"], env["instance"], selection, **kwargs)
    assert result.success
    return result


def enrichment(env: dict) -> Enrichment:
    [job] = [j for j in definitions.mission_jobs(env["mission"]) if j.name == ENRICH]
    return Enrichment(job, env["mission"].topics, env["resources"]["streamplatform"])


@pytest.fixture(scope="module")
def first_load(env) -> dict[str, Any]:
    rates_only = materialize(env, ENRICH, SNAPSHOT)
    dedup = materialize(env, DEDUP)
    joined = materialize(env, ENRICH, SNAPSHOT)
    return {"rates_only": metadata(rates_only, ENRICH),
            "rates_snapshot": metadata(rates_only, SNAPSHOT),
            "dedup": metadata(dedup, DEDUP), "dedup_checks": checks(dedup),
            "joined": metadata(joined, ENRICH), "joined_snapshot": metadata(joined, SNAPSHOT),
            "joined_checks": checks(joined)}  # fmt: skip


def test_dedup_reports_its_numbers_and_passes_its_checks(env, first_load):
    data, numbers = env["data"], first_load["dedup"]
    assert numbers["rows_in"] == data.records
    assert numbers["duplicates_dropped"] == data.duplicates
    assert numbers["dlq_records"] == data.poison
    assert numbers["rows_out"] == data.transactions
    assert numbers["lag"] == 0 and numbers["batches"] >= 1
    found = first_load["dedup_checks"]
    assert set(found) == {"no_duplicates_within_interval", "caught_up", "dlq_ratio",
                          "offsets_contiguous"}  # fmt: skip
    check = found["no_duplicates_within_interval"]
    assert check.passed, check.metadata
    assert check.metadata["output_records"].value == data.transactions
    assert found["offsets_contiguous"].passed and found["caught_up"].passed
    assert not found["dlq_ratio"].passed  # 2 poison of 134 records: above the 1% default
    topics = env["mission"].topics
    dead = read_topic(env["kafka"], topics.transactions_dlq)  # the DLQ topic, decoded
    assert [(r.value, r.error.exception) for r in dead] == [(b"{not json", "SerializationError")
                                                            ] * data.poison  # fmt: skip
    assert {r.source.topic for r in dead} == {topics.transactions}


def test_versioned_snapshot_knows_every_rate_and_nothing_is_late(env, first_load):
    rates_only, joined = first_load["rates_only"], first_load["joined"]
    assert rates_only["rows_in"] == env["rates"] and rates_only["rows_out"] == 0
    snapshot = first_load["rates_snapshot"]
    assert snapshot["versions"] == env["rates"] and snapshot["keys"] == 3
    assert joined["rows_in"] == env["data"].transactions
    assert joined["rows_out"] == env["data"].transactions  # every one met a rate
    assert first_load["joined_snapshot"]["late_versions"] == 0
    assert first_load["joined_snapshot"]["late_days"] == []
    assert all(c.passed for c in first_load["joined_checks"].values())
    # Every materialization of the integration names the guarantee (the code location's).
    for run in ("rates_only", "joined", "rates_snapshot", "joined_snapshot"):
        assert first_load[run]["processing.guarantee"] == "exactly_once_v2", run


def test_a_day_recomputed_by_the_batch_as_of_join_equals_the_streaming_join(env, first_load):
    spark, tables = env["spark"], enrichment(env)
    sink = spark.read.format("delta").load(tables.sink)
    days = Counter(
        r.day for r in sink.selectExpr("date_format(timestamp_millis(timestamp), 'yyyy-MM-dd') day")
        .collect()
    )  # fmt: skip
    day = max(days, key=days.get)  # the day with most rows

    def rows(frame: Any) -> Counter:
        return Counter((r.source_partition, r.source_offset, bytes(r.key), bytes(r.value))
                       for r in frame.collect())  # fmt: skip

    streamed = rows(stream_rows(spark, tables, day))
    assert sum(streamed.values()) == days[day]
    assert rows(batch_rows(spark, tables, day)) == streamed

    stream = metadata(materialize(env, ENRICHED, partition_key=day), ENRICHED)
    batch = materialize(
        env,
        ENRICHED,
        partition_key=day,
        run_config={"ops": {ENRICHED: {"config": {"mode": "batch_as_of"}}}},
    )
    recomputed = metadata(batch, ENRICHED)
    assert stream["rows"] == recomputed["rows"] == days[day]
    assert (stream["computed_by"], recomputed["computed_by"]) == ("stream", "batch_as_of")
    assert stream["amount_eur_total"] == pytest.approx(recomputed["amount_eur_total"])
    check = checks(batch)["stream_equals_batch_join"]
    assert check.passed, check.metadata
    table = spark.read.format("delta").load(tables.table)
    assert table.where(f"day = '{day}'").count() == days[day]  # replaced, not appended


@pytest.fixture(scope="module")
def late_correction(env, first_load) -> dict[str, Any]:
    produce_correction(env["kafka"], env["mission"].topics, "USD", JAN_1 + 10 * HOUR + 30 * 60_000)
    result = materialize(env, ENRICH, SNAPSHOT)
    return {"job": metadata(result, ENRICH), "snapshot": metadata(result, SNAPSHOT)}


def test_a_late_correction_is_reported_with_the_day_it_changes(late_correction):
    assert late_correction["job"]["rows_in"] == 1
    snapshot = late_correction["snapshot"]
    assert snapshot["late_versions"] == 1
    assert snapshot["late_days"] == ["2026-01-01"]  # valid 10:30 -> 12:00 that day
    [version] = snapshot["late_version_list"]
    assert version["key"] == "USD" and version["valid_from"] == JAN_1 + 10 * HOUR + 30 * 60_000


def test_backfill_sensor_requests_exactly_the_affected_partition_once(env, late_correction):
    defs, instance = env["defs"], env["instance"]
    first = in_process.tick(defs, instance, BACKFILL_SENSOR)
    assert [r.partition_key for r in first.run_requests] == ["2026-01-01"]
    [request] = first.run_requests
    assert request.run_key.startswith("late-versions:") and request.run_key.endswith(":2026-01-01")
    # Idempotent: the same cursor gives the same run key; the returned cursor gives nothing new.
    again = in_process.tick(defs, instance, BACKFILL_SENSOR)
    assert [r.run_key for r in again.run_requests] == [request.run_key]
    assert not in_process.tick(defs, instance, BACKFILL_SENSOR, cursor=first.cursor).run_requests

    run = in_process.execute_run_request(defs, instance, BACKFILL_SENSOR, request)
    assert run is not None and run.success and run.job_def.name == "enriched_backfill"
    assert metadata(run, ENRICHED)["computed_by"] == "batch_as_of"
    # The daemon would not launch the same run key twice; neither does the in-process runner.
    assert in_process.execute_run_request(defs, instance, BACKFILL_SENSOR, request) is None


def test_standby_placements_plan_every_task(env, first_load):
    placements = metadata(materialize(env, "standby_placements"), "standby_placements")
    assert placements["generation"] == 1 and placements["tasks"] == 6
    assert placements["standbys"] == 6 and placements["level_absolute"] == 6


def test_dlq_replay_schedule_parks_the_poison_and_replays_nothing_the_second_time(env, first_load):
    defs, instance = env["defs"], env["instance"]
    schedule = f"{DEDUP}_dlq_replay_schedule"
    reports = []
    for _ in range(2):
        [request] = in_process.tick(defs, instance, schedule).run_requests
        run = in_process.execute_run_request(defs, instance, schedule, request)
        assert run is not None and run.success
        [observation] = [e for e in run.all_events if e.event_type_value == "ASSET_OBSERVATION"]
        assert observation.asset_key == dg.AssetKey(DEDUP)
        reports.append(
            {
                k: v.value
                for k, v in observation.event_specific_data.asset_observation.metadata.items()
            }
        )
    poison = env["data"].poison
    assert (reports[0]["dlq_replay_candidates"], reports[0]["dlq_replay_parked"]) == (
        poison,
        poison,
    )
    assert reports[0]["dlq_replay_republished"] == 0
    assert (reports[1]["dlq_replay_candidates"], reports[1]["dlq_replay_parked"]) == (0, 0)


def test_lag_sensor_asks_for_a_catch_up_when_a_job_falls_behind(env, first_load):
    defs, instance = env["defs"], env["instance"]
    sensor = f"{DEDUP}_lag"
    assert not in_process.tick(defs, instance, sensor).run_requests
    produce_transactions(env["kafka"], env["mission"].topics, count=1_100, seed=3)
    [request] = in_process.tick(defs, instance, sensor).run_requests
    assert request.asset_selection and dg.AssetKey(DEDUP) in request.asset_selection
