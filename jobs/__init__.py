"""Dagster jobs, schedules and sensors.

- ``dlq_replay`` job on the ``dlq_replay_every_15_minutes`` schedule (running by default);
- ``enriched_backfill`` job, launched per late day by the ``late_fx_rates_backfill`` sensor;
- ``stream_lag`` sensor: catch-up runs of the streaming assets when they lag.
"""

from jobs.backfill import enriched_backfill_job, late_fx_rates_backfill_sensor
from jobs.dlq_replay import dlq_replay_job, dlq_replay_schedule
from jobs.lag import stream_lag_sensor

all_jobs = [dlq_replay_job, enriched_backfill_job]
all_schedules = [dlq_replay_schedule]
all_sensors = [late_fx_rates_backfill_sensor, stream_lag_sensor]

__all__ = [
    "all_jobs",
    "all_schedules",
    "all_sensors",
    "dlq_replay_job",
    "dlq_replay_schedule",
    "enriched_backfill_job",
    "late_fx_rates_backfill_sensor",
    "stream_lag_sensor",
]
