"""Dagster jobs, schedules (DLQ replay) and sensors (backfills, lag)."""

all_jobs: list = []
all_schedules: list = []
all_sensors: list = []
