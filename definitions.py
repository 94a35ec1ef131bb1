"""The Dagster code location: one Definitions object built from assets/, resources/ and jobs/.

Assets, resources, schedules and sensors arrive with the runtime and Dagster issues; the
location already loads, so `dagster dev -w workspace.yaml` and the tests can find it.
"""

import dagster as dg

from assets import all_assets
from jobs import all_jobs, all_schedules, all_sensors
from resources import all_resources

defs = dg.Definitions(
    assets=all_assets,
    resources=all_resources,
    jobs=all_jobs,
    schedules=all_schedules,
    sensors=all_sensors,
)
