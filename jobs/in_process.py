"""The code location run in-process against a Dagster instance, the way the daemon would run it.

`make demo` (``demo.py``) tells the whole story with these, and the tests use them
too: materialize assets through the code location's asset job (their asset checks included),
evaluate a sensor or a schedule with the instance and the code location, and execute the runs
it requests with their partition keys and run config (the job's own for the partition when the
request has none), tagged as the daemon tags them (``dagster/sensor_name`` and
``dagster/run_key``, or ``dagster/schedule_name``): the UI shows who launched them, a daemon
started later on the same instance (`make ui`) sees those run keys as launched and does not
launch them again, and :func:`execute_run_request` skips a run key that already has a run, as
the daemon does.

``log_level`` sets the console logger's level of a run (Dagster's default is DEBUG: every
event); the instance stores every event whatever it is, and the UI shows them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg

Selection = dg.AssetsDefinition | dg.AssetKey | str
# The tags the daemon gives the runs it launches (Dagster's system tags, documented with run
# tags; the UI shows them as who launched a run).
RUN_KEY_TAG = "dagster/run_key"
SCHEDULE_NAME_TAG = "dagster/schedule_name"
SENSOR_NAME_TAG = "dagster/sensor_name"


def asset_keys(selection: Iterable[Selection]) -> list[dg.AssetKey]:
    """Asset keys of assets definitions, keys, or "a/b" strings."""
    keys: list[dg.AssetKey] = []
    for item in selection:
        if isinstance(item, dg.AssetsDefinition):
            keys.extend(item.keys)
        elif isinstance(item, dg.AssetKey):
            keys.append(item)
        else:
            keys.append(dg.AssetKey.from_user_string(item))
    return keys


def run_config_for(
    job: dg.JobDefinition,
    partition_key: str | None = None,
    run_config: Mapping[str, Any] | None = None,
    log_level: str | None = None,
) -> dict[str, Any] | None:
    """``run_config``, or else the job's own (for ``partition_key`` when it is partitioned),
    with the console logger at ``log_level``."""
    config = dict(run_config or {})
    if not config and partition_key is not None and job.partitioned_config is not None:
        config = dict(job.get_run_config_for_partition_key(partition_key))
    elif not config and job.run_config:
        config = dict(job.run_config)
    if log_level is not None:
        console = {"console": {"config": {"log_level": log_level}}}
        config["loggers"] = {**config.get("loggers", {}), **console}
    return config or None


def execute(
    job: dg.JobDefinition,
    instance: dg.DagsterInstance,
    *,
    partition_key: str | None = None,
    run_config: Mapping[str, Any] | None = None,
    asset_selection: Iterable[Selection] | None = None,
    tags: Mapping[str, str] | None = None,
    log_level: str | None = None,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """One run of ``job`` in this process (its resources are the code location's)."""
    return job.execute_in_process(
        run_config=run_config_for(job, partition_key, run_config, log_level),
        instance=instance,
        partition_key=partition_key,
        asset_selection=None if asset_selection is None else asset_keys(asset_selection),
        tags=tags,
        raise_on_error=raise_on_error,
    )


def materialize(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    selection: Iterable[Selection],
    **kwargs: Any,
) -> dg.ExecuteInProcessResult:
    """One run of the code location's asset job over ``selection``, with their asset checks;
    ``kwargs`` as :func:`execute`. An asset of a multi-asset brings the other assets of it (a
    streaming job's asset brings the Kafka topics it writes, as materializing its whole group
    in the UI does): a job that reads one of those topics, selected too, runs after it (Dagster
    orders the steps of a run by the selected assets' dependencies only). To run one asset of a
    multi-asset alone, :func:`execute` the asset job with that asset selected."""
    job = defs.resolve_implicit_global_asset_job_def()
    keys = set(asset_keys(selection))
    keys |= {other for key in set(keys) for other in defs.resolve_assets_def(key).keys}
    return execute(job, instance, asset_selection=sorted(keys), **kwargs)


def materialization_metadata(result: dg.ExecuteInProcessResult, asset: Selection) -> dict[str, Any]:
    """The metadata values of the asset's materialization in ``result`` (the last, if several)."""
    [key] = asset_keys([asset])
    events = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    if not events:
        raise LookupError(f"run {result.run_id} did not materialize {key.to_user_string()}")
    return {name: value.value for name, value in events[-1].materialization.metadata.items()}


def check_evaluations(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    """The asset checks the run evaluated, by check name."""
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def tick(
    defs: dg.Definitions, instance: dg.DagsterInstance, name: str, cursor: str | None = None
) -> Any:
    """One evaluation of the sensor or schedule ``name`` (now): its run requests, cursor and
    skip message (``SensorExecutionData`` or ``ScheduleExecutionData``)."""
    if name in _sensor_names(defs):
        sensor = defs.resolve_sensor_def(name)
        with dg.build_sensor_context(
            instance=instance, cursor=cursor, definitions=defs, sensor_name=name,
            resources=defs.resources,
        ) as context:  # fmt: skip
            return sensor.evaluate_tick(context)
    schedule = defs.resolve_schedule_def(name)
    with dg.build_schedule_context(instance=instance) as context:
        return schedule.evaluate_tick(context)


def existing_run(
    instance: dg.DagsterInstance, sensor_name: str, run_key: str
) -> dg.DagsterRun | None:
    """The run the sensor already launched for ``run_key``, if any."""
    tags = {RUN_KEY_TAG: run_key, SENSOR_NAME_TAG: sensor_name}
    runs = instance.get_runs(filters=dg.RunsFilter(tags=tags), limit=1)
    return runs[0] if runs else None


def execute_run_request(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    name: str,
    request: dg.RunRequest,
    log_level: str | None = None,
) -> dg.ExecuteInProcessResult | None:
    """Execute a run the sensor or schedule ``name`` requested, in-process, tagged as the daemon
    tags it; None when a sensor's run key already ran. A failed run is returned (``success``
    False), not raised, as the daemon would record it."""
    sensor = name in _sensor_names(defs)
    if sensor and request.run_key and existing_run(instance, name, request.run_key) is not None:
        return None
    tags = {**request.tags, (SENSOR_NAME_TAG if sensor else SCHEDULE_NAME_TAG): name}
    if request.run_key:
        tags[RUN_KEY_TAG] = request.run_key
    if request.asset_selection is not None:
        job = defs.resolve_implicit_global_asset_job_def()
    else:
        origin = defs.resolve_sensor_def(name) if sensor else defs.resolve_schedule_def(name)
        job = defs.resolve_job_def(request.job_name or origin.job_name)
    return execute(job, instance, partition_key=request.partition_key,
                   run_config=request.run_config, asset_selection=request.asset_selection,
                   tags=tags, log_level=log_level, raise_on_error=False)  # fmt: skip


def _sensor_names(defs: dg.Definitions) -> set[str]:
    return {sensor.name for sensor in defs.sensors or []}
