"""The lag sensor: launches a catch-up run of a streaming asset when its job falls behind.

Lag = records in the job's source topics (brokers' end offsets, from KafkaResource) beyond the
offsets the asset's latest materialization reports as consumed (``consumed_offsets``); no Spark
in the sensor. Above ``STREAMPLATFORM_LAG_THRESHOLD`` records (default 1000) it requests a run
of that asset, once per materialization (run key ``catch-up:<asset>:<storage id>``): a run still
going or failed is not piled on, the next materialization re-arms it. Off by default (turn it on
in the UI): on a laptop a sensor that starts Spark runs unasked surprises more than it helps.
"""

import os

import dagster as dg

import pipelines
from assets import fx_rate_versions, transactions_deduplicated
from assets.streams import parse_offsets
from resources import KafkaResource


def lag_threshold() -> int:
    return int(os.environ.get("STREAMPLATFORM_LAG_THRESHOLD", "1000"))


def _sources() -> dict[dg.AssetKey, list[str]]:
    return {
        transactions_deduplicated.key: [pipelines.TRANSACTIONS],
        fx_rate_versions.key: [pipelines.DEDUPLICATED, pipelines.FX_RATES],
    }


def asset_lag(context: dg.SensorEvaluationContext, kafka: KafkaResource, key: dg.AssetKey,
              topics: list[str]) -> tuple[int, int]:  # fmt: skip
    """``(lag, storage id of the latest materialization or 0)``."""
    records = context.instance.fetch_materializations(key, limit=1).records
    record = records[0] if records else None
    materialization = None if record is None else record.asset_materialization
    consumed = {}
    if materialization is not None and "consumed_offsets" in materialization.metadata:
        consumed = parse_offsets(materialization.metadata["consumed_offsets"].value)
    lag = 0
    for topic in topics:
        for partition, (low, high) in kafka.end_offsets(topic).items():
            lag += max(0, high - max(consumed.get((topic, partition), low), low))
    return lag, 0 if record is None else int(record.storage_id)


@dg.sensor(
    name="stream_lag",
    target=[transactions_deduplicated, fx_rate_versions],
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Launches catch-up runs of the streaming assets when their lag passes "
    "STREAMPLATFORM_LAG_THRESHOLD records.",
)
def stream_lag_sensor(context: dg.SensorEvaluationContext, kafka: KafkaResource) -> dg.SensorResult:
    threshold = lag_threshold()
    requests, lags = [], {}
    for key, topics in _sources().items():
        try:
            lag, storage_id = asset_lag(context, kafka, key, topics)
        except (LookupError, ConnectionError) as error:
            return dg.SensorResult(
                skip_reason=f"cannot measure lag of {key.to_user_string()}: {error}"
            )
        lags[key.to_user_string()] = lag
        if lag > threshold:
            requests.append(
                dg.RunRequest(
                    run_key=f"catch-up:{key.to_user_string()}:{storage_id}",
                    asset_selection=[key],
                    tags={"streamplatform/catch-up-lag": str(lag)},
                )
            )
    if not requests:
        return dg.SensorResult(skip_reason=f"lag {lags} within {threshold} records")
    context.log.info(f"lag {lags} over {threshold}: catching up {[r.run_key for r in requests]}")
    return dg.SensorResult(run_requests=requests)
