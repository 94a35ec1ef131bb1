"""The Dagster code location: one Definitions object built from assets/, resources/ and jobs/.

Every job runs with the in-process executor: a run is one process with one SparkSession (the
JVM starts once, and the Spark resource stops it at the end), instead of a JVM per step.
``workspace.yaml`` points `dagster dev` here; `make ui` starts it with a local broker.
:func:`build_definitions` gives the same definitions on other resources (`make demo` runs them
in-process on its own broker). :func:`pools` lists the pools its ops run in: one per streaming
job (``streamplatform/<application.id>``), each limited to one run at a time by the instance.
"""

from collections.abc import Mapping
from typing import Any

import dagster as dg

from assets import all_asset_checks, all_assets
from jobs import all_jobs, all_schedules, all_sensors
from resources import all_resources
from streamplatform.dagster import pools  # noqa: F401 (definitions.pools, for the demo)


def build_definitions(resources: Mapping[str, Any] | None = None) -> dg.Definitions:
    """The code location; ``resources`` (default: from the environment) replace its resources."""
    return dg.Definitions(
        assets=all_assets,
        asset_checks=all_asset_checks,
        resources=dict(all_resources if resources is None else resources),
        jobs=all_jobs,
        schedules=all_schedules,
        sensors=all_sensors,
        executor=dg.in_process_executor,
    )


defs = build_definitions()
