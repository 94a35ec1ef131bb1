"""The Dagster code location: one Definitions object built from assets/, resources/ and jobs/.

Every job runs with the in-process executor: a run is one process with one SparkSession (the
JVM starts once, and the Spark resource stops it at the end), instead of a JVM per step.
``workspace.yaml`` points `dagster dev` here; `make ui` starts it with a local broker.
"""

import dagster as dg

from assets import all_asset_checks, all_assets
from jobs import all_jobs, all_schedules, all_sensors
from resources import all_resources

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_asset_checks,
    resources=all_resources,
    jobs=all_jobs,
    schedules=all_schedules,
    sensors=all_sensors,
    executor=dg.in_process_executor,
)
