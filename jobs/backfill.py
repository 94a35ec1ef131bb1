"""Backfills of ``transactions_enriched`` triggered by late FX-rate versions.

Each ``fx_rate_versions`` materialization reports ``late_days``: the days whose transactions
the streaming join had joined before a rate version valid for them arrived (``lateness.py``).
The sensor reads the materializations after its cursor (their storage ids), and requests one
run of ``enriched_backfill`` per affected day — a batch as-of join over the versioned snapshot
— with the run key ``late-fx-rates:<storage id>:<day>``. Re-evaluating the same materialization
yields the same run keys, which Dagster launches once: idempotent. Days outside the daily
partitions (before 2026-01-01, or in the future) are skipped and named in the log.
"""

import dagster as dg

from assets import DAILY, fx_rate_versions, transactions_enriched
from assets.enriched import BATCH_AS_OF

BACKFILL_TAG = "streamplatform/backfill"

enriched_backfill_job = dg.define_asset_job(
    name="enriched_backfill",
    selection=[transactions_enriched],
    config={"ops": {"transactions_enriched": {"config": {"mode": BATCH_AS_OF}}}},
    executor_def=dg.in_process_executor,
    description="Recompute a day of transactions_enriched with a batch as-of join.",
)


@dg.sensor(
    name="late_fx_rates_backfill",
    job=enriched_backfill_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Backfills the days of transactions_enriched that late FX-rate versions affect.",
)
def late_fx_rates_backfill_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    after = int(context.cursor) if context.cursor else None
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=fx_rate_versions.key, after_storage_id=after),
        limit=100,
        ascending=True,
    ).records
    if not records:
        return dg.SensorResult(skip_reason="no new fx_rate_versions materialization")
    latest: dict[str, int] = {}  # day -> newest materialization naming it in this tick
    outside: set[str] = set()
    for record in records:
        materialization = record.asset_materialization
        metadata = {} if materialization is None else materialization.metadata
        for day in metadata["late_days"].value if "late_days" in metadata else []:
            if DAILY.has_partition_key(day):
                latest[day] = record.storage_id
            else:
                outside.add(day)
    requests = [
        dg.RunRequest(
            run_key=f"late-fx-rates:{storage_id}:{day}",
            partition_key=day,
            tags={
                BACKFILL_TAG: "late-fx-rates",
                "streamplatform/fx_rate_versions_storage_id": str(storage_id),
            },
        )  # fmt: skip
        for day, storage_id in sorted(latest.items())
    ]
    if outside:
        context.log.info(f"late rate versions touch days outside the partitions: {sorted(outside)}")
    cursor = str(records[-1].storage_id)
    if not requests:
        return dg.SensorResult(cursor=cursor, skip_reason="no day needs recomputing")
    context.log.info(f"backfilling {[r.partition_key for r in requests]}")
    return dg.SensorResult(run_requests=requests, cursor=cursor)
