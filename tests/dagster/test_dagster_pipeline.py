"""The code location's assets materialized in-process against the run's broker, Spark and Delta.

One flow, shared by the tests of this module (module-scoped fixtures, in this order):

1. rates only: ``fx_rate_versions`` runs the enrichment job while no transaction is
   deduplicated yet, so the versioned store knows every rate before the first transaction;
2. ``transactions_deduplicated``, then ``fx_rate_versions`` again: the join;
3. a late correction of the USD rate from 2026-01-01T10:30, then ``fx_rate_versions``: the
   backfill sensor must ask for exactly 2026-01-01.
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
    produce_correction,
    produce_rates,
    produce_transactions,
    rename_topics,
    unique_prefix,
)

import pipelines
from assets import (
    dlq_records,
    fx_rate_versions,
    standby_placements,
    stream_offsets,
    transactions_deduplicated,
    transactions_enriched,
)
from assets.checks import all_asset_checks
from assets.enriched import ENRICHED_TABLE, batch_rows, stream_rows
from assets.streams import enrichment_job
from assets.topics import topic_specs
from jobs import dlq_replay_job, late_fx_rates_backfill_sensor, stream_lag_sensor
from jobs.in_process import check_evaluations as checks
from jobs.in_process import materialization_metadata as metadata
from streamplatform.dlq import read_topic

# Slow: the module's flow runs the streaming jobs 5 times and materializes every asset (~1-2 min,
# of which ~20 s is the SparkSession's warm-up when this module runs first).
pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

ASSETS = [transactions_deduplicated, fx_rate_versions, transactions_enriched, dlq_records,
          stream_offsets, standby_placements]  # fmt: skip


@pytest.fixture(scope="module")
def env(kafka_settings, spark, tmp_path_factory) -> Any:
    """Renamed topics with data, resources on a fresh data dir, a Dagster instance."""
    prefix = unique_prefix("dg")
    with pytest.MonkeyPatch.context() as patch, dg.instance_for_test() as instance:
        rename_topics(patch, prefix)
        create_pipeline_topics(kafka_settings)
        rates = produce_rates(kafka_settings)
        data = produce_transactions(kafka_settings)
        resources = make_resources(kafka_settings, tmp_path_factory.mktemp("dagster"), prefix)
        yield {"instance": instance, "resources": resources, "data": data, "rates": rates,
               "kafka": kafka_settings, "spark": spark}  # fmt: skip


def materialize(
    env: dict, *selection: Any, checks: bool = True, **kwargs: Any
) -> dg.ExecuteInProcessResult:
    """Materialize ``selection`` with its asset checks (unless ``checks=False``)."""
    chosen = dg.AssetSelection.assets(*selection)
    result = dg.materialize(
        [*topic_specs, *ASSETS, *all_asset_checks],
        selection=chosen if checks else chosen.without_checks(),
        instance=env["instance"],
        resources=env["resources"],
        **kwargs,
    )
    assert result.success
    return result


@pytest.fixture(scope="module")
def first_load(env) -> dict[str, dict[str, Any]]:
    rates_only = metadata(materialize(env, fx_rate_versions), fx_rate_versions)
    dedup = materialize(env, transactions_deduplicated)
    joined = metadata(materialize(env, fx_rate_versions), fx_rate_versions)
    return {"rates_only": rates_only, "dedup": metadata(dedup, transactions_deduplicated),
            "dedup_checks": checks(dedup), "joined": joined}  # fmt: skip


def test_dedup_reports_its_numbers_and_passes_the_interval_check(env, first_load):
    data, numbers = env["data"], first_load["dedup"]
    assert numbers["rows_in"] == data.records
    assert numbers["duplicates_dropped"] == data.duplicates
    assert numbers["dlq_records"] == data.poison
    assert numbers["rows_out"] == data.transactions
    assert numbers["lag"] == 0 and numbers["batches"] >= 1
    assert numbers["last_batch_id"] == numbers["batch_ids"][-1]
    check = first_load["dedup_checks"]["no_duplicates_within_interval"]
    assert check.passed, check.metadata
    assert check.metadata["output_records"].value == data.transactions
    dead = read_topic(env["kafka"], pipelines.TRANSACTIONS_DLQ)  # the DLQ topic, decoded
    assert [(r.value, r.error.exception) for r in dead] == [(b"{not json", "SerializationError")
                                                            ] * data.poison  # fmt: skip
    assert {r.source.topic for r in dead} == {pipelines.TRANSACTIONS}


def test_versioned_snapshot_knows_every_rate_and_nothing_is_late(env, first_load):
    rates_only, joined = first_load["rates_only"], first_load["joined"]
    assert rates_only["rows_in"] == env["rates"] and rates_only["rows_out"] == 0
    assert rates_only["versions"] == env["rates"] and rates_only["keys"] == 3
    assert joined["rows_in"] == env["data"].transactions
    assert joined["rows_out"] == env["data"].transactions  # every one met a rate
    assert joined["late_versions"] == 0 and joined["late_days"] == []


def test_a_day_recomputed_by_the_batch_as_of_join_equals_the_streaming_join(env, first_load):
    spark = env["spark"]
    spec = enrichment_job(*(env["resources"][k] for k in ("streams", "kafka", "delta_root",
                                                          "state_dir")))  # fmt: skip
    sink = spark.read.format("delta").load(spec.table(pipelines.ENRICHED))
    days = Counter(
        r.day for r in sink.selectExpr("date_format(timestamp_millis(timestamp), 'yyyy-MM-dd') day")
        .collect()
    )  # fmt: skip
    day = max(days, key=days.get)  # the day with most rows (event days once Kafka sinks keep
    # record timestamps; the day of the run while they are stamped at write time)

    def rows(frame: Any) -> Counter:
        return Counter((r.source_partition, r.source_offset, bytes(r.key), bytes(r.value))
                       for r in frame.collect())  # fmt: skip

    streamed = rows(stream_rows(spark, spec, day))
    assert sum(streamed.values()) == days[day]
    assert rows(batch_rows(spark, spec, day)) == streamed

    stream = metadata(materialize(env, transactions_enriched, partition_key=day, checks=False),
                      transactions_enriched)  # fmt: skip
    batch_config = {"ops": {"transactions_enriched": {"config": {"mode": "batch_as_of"}}}}
    batch = materialize(env, transactions_enriched, partition_key=day, run_config=batch_config)
    recomputed = metadata(batch, transactions_enriched)
    assert stream["rows"] == recomputed["rows"] == days[day]
    assert (stream["computed_by"], recomputed["computed_by"]) == ("stream", "batch_as_of")
    assert stream["amount_eur_total"] == pytest.approx(recomputed["amount_eur_total"])
    check = checks(batch)["stream_equals_batch_join"]
    assert check.passed, check.metadata
    table = spark.read.format("delta").load(env["resources"]["delta_root"].table(*ENRICHED_TABLE))
    assert table.where(f"day = '{day}'").count() == days[day]  # replaced, not appended


@pytest.fixture(scope="module")
def late_correction(env, first_load) -> dict[str, Any]:
    produce_correction(env["kafka"], "USD", JAN_1 + 10 * HOUR + 30 * 60_000)
    return metadata(materialize(env, fx_rate_versions), fx_rate_versions)


def test_a_late_correction_is_reported_with_the_day_it_changes(late_correction):
    assert late_correction["rows_in"] == 1
    assert late_correction["late_versions"] == 1
    assert late_correction["late_days"] == ["2026-01-01"]  # valid 10:30 -> 12:00 that day
    [version] = late_correction["late_version_list"]
    assert version["key"] == "USD" and version["valid_from"] == JAN_1 + 10 * HOUR + 30 * 60_000


def test_backfill_sensor_requests_exactly_the_affected_partition_once(env, late_correction):
    instance = env["instance"]
    with dg.build_sensor_context(instance=instance) as context:
        result = late_fx_rates_backfill_sensor(context)
    assert [r.partition_key for r in result.run_requests] == ["2026-01-01"]
    [request] = result.run_requests
    assert request.run_key.startswith("late-fx-rates:") and request.run_key.endswith(":2026-01-01")
    # Idempotent: the same cursor gives the same run key; the returned cursor gives nothing new.
    with dg.build_sensor_context(instance=instance) as again:
        assert [r.run_key for r in late_fx_rates_backfill_sensor(again).run_requests] == [
            request.run_key
        ]
    with dg.build_sensor_context(instance=instance, cursor=result.cursor) as later:
        assert not late_fx_rates_backfill_sensor(later).run_requests

    backfill_config = {"ops": {"transactions_enriched": {"config": {"mode": "batch_as_of"}}}}
    run = materialize(env, transactions_enriched, partition_key=request.partition_key,
                      run_config=backfill_config, checks=False)  # fmt: skip
    assert metadata(run, transactions_enriched)["computed_by"] == "batch_as_of"


def test_operational_assets_report_and_their_checks_pass(env, first_load):
    result = materialize(env, dlq_records, stream_offsets, standby_placements)
    dlq = metadata(result, dlq_records)
    assert dlq["dlq_records"] == env["data"].poison
    assert dlq["by_exception"] == {"SerializationError": env["data"].poison}
    assert 0 < dlq["dlq_ratio"] < 0.05
    offsets = metadata(result, stream_offsets)
    assert offsets["partitions"] == 9 and offsets["lag"] >= 0
    placements = metadata(result, standby_placements)
    assert placements["generation"] == 1 and placements["tasks"] == 6
    assert placements["standbys"] == 6 and placements["level_absolute"] == 6
    found = checks(result)
    assert {"offsets_contiguous", "dlq_below_threshold"} <= set(found)
    assert all(check.passed for check in found.values()), {
        name: check.metadata for name, check in found.items()
    }


def test_dlq_replay_job_parks_the_poison_and_replays_nothing_the_second_time(env, first_load):
    runs = [
        dlq_replay_job.execute_in_process(instance=env["instance"], resources=env["resources"])
        for _ in range(2)
    ]
    first, second = (run.output_for_node("replay_dead_letters") for run in runs)
    poison = env["data"].poison
    assert first == {"candidates": poison, "republished": 0, "parked": poison, "exhausted": 0,
                     "recovered": 0}  # fmt: skip
    assert second == {"candidates": 0, "republished": 0, "parked": 0, "exhausted": 0,
                      "recovered": 0}  # fmt: skip
    observations = [e for e in runs[0].all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert observations and observations[0].asset_key == dlq_records.key


def test_lag_sensor_asks_for_a_catch_up_when_a_job_falls_behind(env, first_load, monkeypatch):
    monkeypatch.setenv("STREAMPLATFORM_LAG_THRESHOLD", "5")
    resources = {"kafka": env["resources"]["kafka"]}
    with dg.build_sensor_context(instance=env["instance"], resources=resources) as context:
        quiet = stream_lag_sensor(context)
    assert not quiet.run_requests
    produce_transactions(env["kafka"], count=10, seed=3)
    with dg.build_sensor_context(instance=env["instance"], resources=resources) as context:
        behind = stream_lag_sensor(context)
    assert [r.asset_selection for r in behind.run_requests] == [[transactions_deduplicated.key]]
