"""continuous_job_definitions: a job run as a service (``streamplatform run``) seen from Dagster.

A continuous job is not run by Dagster: a supervisor keeps ``streamplatform run`` going, and the
job reports to the Dagster instance itself, without a run (:mod:`streamplatform.dagster.reporting`,
``--dagster-asset``). What Dagster needs to show it, per :class:`StreamingJobSpec`:

- its **assets**: each Delta sink ``delta/<application.id>/<topic>`` (the table's place under
  the Delta root), downstream of the streaming asset ``<name>``; with ``streaming_asset=True``
  also the streaming asset itself, as an external asset the reports materialize (leave it to
  :func:`streaming_definitions` when both are merged: ``streaming_asset=False``). A declared
  ``freshness`` gives each of them the freshness policy ``FreshnessPolicy.time_window`` (Dagster's
  freshness daemon marks them failed once nothing materialized them for that long: no batch);
- two **asset checks** on the streaming asset, on the job's latest report:
  ``continuous_running`` (an error: no report within ``stall_after``, so the job is stopped or
  stalled, or its last report says it lost its claim to another driver or needs a person,
  ``ReplayRefused``) and ``continuous_lag`` (a warning: the reported lag is over ``max_lag``);
- the **stall sensor** ``<name>_stalled`` (on by default; it reads the instance only): every
  ``sensor_interval_seconds`` it evaluates both checks and records them, without a run, when
  they change, so the asset shows a failed check within one interval of the threshold, and
  logs the failure at error level on the tick.

The checks can also be executed in a run (the UI's "Execute"); they read the instance only.
"""

# No `from __future__ import annotations`: Dagster reads the decorated functions' annotations.

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from streamplatform.dagster.factory import topic_key
from streamplatform.dagster.spec import StreamingJobSpec

RUNNING_CHECK = "continuous_running"
LAG_CHECK = "continuous_lag"
# The metadata every report of `streamplatform run` carries (reporting.py), which tells its
# reports apart from the observations a Dagster run makes on the same asset (a DLQ replay's).
JOB_STATE = "job_state"
# Final states that need someone at once: waiting out the stall threshold would only delay it.
ALERT_AT_ONCE = {
    "claim_lost": "lost its claim: another driver holds the job, or took it over",
    "replay_refused": "stopped: a person must decide (ReplayRefused; docs/guarantees.md)",
}
_SCANNED = 20  # newest events of each kind looked at for the newest report


def delta_sink_key(application_id: str, topic: str) -> dg.AssetKey:
    """The asset key of a job's Delta sink: ``delta/<application.id>/<topic>``, as the table
    lies under the Delta root (``<root>/<application.id>/<topic>``)."""
    return dg.AssetKey(["delta", application_id, topic])


@dataclass(frozen=True)
class Report:
    """The newest report of a continuous job found in the instance."""

    timestamp: float  # when the instance stored it (seconds since the epoch)
    metadata: dict[str, Any]  # its metadata values
    materialized: bool  # a materialization (batches committed) or an observation


def latest_report(instance: dg.DagsterInstance, key: dg.AssetKey) -> Report | None:
    """The newest runless event of ``key`` that a ``streamplatform run`` reported."""
    records = [
        *instance.fetch_materializations(key, limit=_SCANNED).records,
        *instance.fetch_observations(key, limit=_SCANNED).records,
    ]
    newest = None
    for record in records:
        event = record.asset_materialization or record.asset_observation
        if record.run_id or event is None or JOB_STATE not in event.metadata:
            continue  # a Dagster run's event, not a report
        if newest is None or record.storage_id > newest.storage_id:
            newest = record
    if newest is None:
        return None
    event = newest.asset_materialization or newest.asset_observation
    assert event is not None
    return Report(
        timestamp=newest.timestamp,
        metadata={name: value.value for name, value in event.metadata.items()},
        materialized=newest.asset_materialization is not None,
    )


@dataclass(frozen=True)
class Outcome:
    """One check's result, for a run (AssetCheckResult) or a sensor (AssetCheckEvaluation)."""

    check_name: str
    passed: bool
    severity: dg.AssetCheckSeverity
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def result(self) -> dg.AssetCheckResult:
        return dg.AssetCheckResult(
            check_name=self.check_name, passed=self.passed, severity=self.severity,
            description=self.description, metadata=self.metadata,
        )  # fmt: skip

    def evaluation(self, key: dg.AssetKey) -> dg.AssetCheckEvaluation:
        return dg.AssetCheckEvaluation(
            asset_key=key, check_name=self.check_name, passed=self.passed,
            severity=self.severity, description=self.description, metadata=self.metadata,
        )  # fmt: skip


def evaluate(
    job: StreamingJobSpec, report: Report | None, now: float, stall_after: timedelta,
    max_lag: int,
) -> list[Outcome]:  # fmt: skip
    """The two checks of ``job`` on its newest ``report``, at ``now``."""
    threshold = stall_after.total_seconds()
    if report is None:
        return [
            Outcome(RUNNING_CHECK, False, dg.AssetCheckSeverity.ERROR,
                    f"{job.app_id}: no report from `streamplatform run --dagster-asset "
                    f"{job.name}` yet"),
            Outcome(LAG_CHECK, False, dg.AssetCheckSeverity.WARN,
                    f"{job.app_id}: no lag reported yet"),
        ]  # fmt: skip
    age = max(0.0, now - report.timestamp)
    state = str(report.metadata[JOB_STATE])
    when = datetime.fromtimestamp(report.timestamp, UTC).isoformat(timespec="seconds")
    metadata = {
        "last_report": dg.MetadataValue.timestamp(report.timestamp),
        "seconds_since_report": round(age, 1),
        "stall_after_seconds": threshold,
        JOB_STATE: state,
    }
    error = report.metadata.get("error")
    if state in ALERT_AT_ONCE:
        passed = False
        text = f"{job.app_id} {ALERT_AT_ONCE[state]} (reported {when})" + (
            f": {error}" if error else "")  # fmt: skip
    elif age > threshold:
        passed = False
        text = (f"{job.app_id} stalled: no report for {age:.0f} s (threshold "
                f"{threshold:.0f} s); its last one, {when}, said {state!r}"
                + (f": {error}" if error else ""))  # fmt: skip
    else:
        passed = True
        text = f"{job.app_id} reported {age:.0f} s ago ({state})"
    running = Outcome(RUNNING_CHECK, passed, dg.AssetCheckSeverity.ERROR, text, metadata)
    lag = report.metadata.get("lag")
    if lag is None:
        lagging = Outcome(LAG_CHECK, False, dg.AssetCheckSeverity.WARN,
                          f"{job.app_id}: its last report has no lag")  # fmt: skip
    else:
        lagging = Outcome(
            LAG_CHECK, int(lag) <= max_lag, dg.AssetCheckSeverity.WARN,
            f"{job.app_id}: lag {lag} records as of its report of {when} (max {max_lag})",
            {"lag": int(lag), "max_lag": max_lag, "last_report": metadata["last_report"]},
        )  # fmt: skip
    return [running, lagging]


def continuous_job_definitions(
    job: StreamingJobSpec,
    *,
    stall_after: timedelta = timedelta(minutes=5),
    max_lag: int = 1000,
    streaming_asset: bool = True,
    sensor_interval_seconds: int = 30,
) -> dg.Definitions:
    """The assets, checks and stall sensor of ``job`` run by ``streamplatform run`` (module
    docstring). ``stall_after``: how long without a report before the job counts as stalled;
    keep it well above the reports' interval (``--dagster-report-every-seconds``, 30 s by
    default). ``streaming_asset``: declare the streaming asset here; False when
    :func:`streaming_definitions` of the same job is merged with these."""
    key = dg.AssetKey(job.name)
    policy = (
        None if job.freshness is None else dg.FreshnessPolicy.time_window(fail_window=job.freshness)
    )
    specs = [
        dg.AssetSpec(
            delta_sink_key(job.app_id, topic),
            deps=[key],
            group_name=job.group_name,
            kinds={"delta"},
            freshness_policy=policy,
            description=f"Delta table `{topic}` of `{job.app_id}`, written by the continuous "
            f"job and reported by it as it commits batches.",
        )
        for topic in dict.fromkeys([*job.delta_sinks, *job.delta_state_tables])
    ]
    if streaming_asset:
        specs.insert(0, dg.AssetSpec(
            key,
            deps=[topic_key(topic) for topic in job.source_topics()],
            group_name=job.group_name,
            kinds={"spark", "kafka", "delta"},
            freshness_policy=policy,
            metadata={"application_id": job.app_id},
            description=job.description or f"The continuous job `{job.app_id}` "
            "(`streamplatform run`), materialized by its own reports as it commits batches.",
        ))  # fmt: skip
    return dg.Definitions(
        assets=specs,
        asset_checks=[continuous_checks(job, stall_after, max_lag)],
        sensors=[stall_sensor(job, stall_after, max_lag, sensor_interval_seconds)],
    )


def continuous_checks(
    job: StreamingJobSpec, stall_after: timedelta, max_lag: int
) -> dg.AssetChecksDefinition:
    key = dg.AssetKey(job.name)

    @dg.multi_asset_check(
        name=f"{job.name}_continuous_checks",
        specs=[
            dg.AssetCheckSpec(
                RUNNING_CHECK,
                asset=key,
                description=f"`streamplatform run` reported within {stall_after} and holds its "
                "claim.",
            ),
            dg.AssetCheckSpec(
                LAG_CHECK,
                asset=key,
                description=f"The lag in the job's last report is at most {max_lag} records.",
            ),
        ],
        can_subset=True,
    )
    def _checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        report = latest_report(context.instance, key)
        for outcome in evaluate(job, report, time.time(), stall_after, max_lag):
            if dg.AssetCheckKey(key, outcome.check_name) in context.selected_asset_check_keys:
                yield outcome.result()

    return _checks


def stall_sensor(
    job: StreamingJobSpec, stall_after: timedelta, max_lag: int, interval_seconds: int = 30
) -> dg.SensorDefinition:
    """Records the continuous checks of ``job`` without a run whenever one changes (the cursor
    keeps the last recorded results), and logs a failure at error level."""
    key = dg.AssetKey(job.name)

    @dg.sensor(
        name=f"{job.name}_stalled",
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Fails the check {RUNNING_CHECK} of {job.name} when its `streamplatform "
        f"run` has not reported for {stall_after} or lost its claim, and {LAG_CHECK} when its "
        f"lag passes {max_lag} records.",
    )
    def _stalled(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        outcomes = evaluate(job, latest_report(context.instance, key), time.time(), stall_after,
                            max_lag)  # fmt: skip
        recorded: Mapping[str, bool] = json.loads(context.cursor) if context.cursor else {}
        changed = [o for o in outcomes if recorded.get(o.check_name) != o.passed]
        for outcome in changed:
            if not outcome.passed and outcome.severity == dg.AssetCheckSeverity.ERROR:
                context.log.error(outcome.description)
        return dg.SensorResult(
            asset_events=[outcome.evaluation(key) for outcome in changed],
            cursor=json.dumps({o.check_name: o.passed for o in outcomes}),
            skip_reason="; ".join(o.description for o in outcomes),
        )

    return _stalled
