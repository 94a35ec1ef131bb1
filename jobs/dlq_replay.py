"""The scheduled DLQ replay: every 15 minutes, on by default.

For each job's DLQ (deduplication, enrichment) :class:`streamplatform.dlq.DlqReplayer`
re-publishes to its source topic what the current topology now processes without an error and
parks in ``_dlq_parked`` what fails again, each DLQ record exactly once (see
``streamplatform/dlq/replay.py`` for how a crash at any step neither loses nor doubles one).
The running streaming jobs pick the re-published records up at their next materialization.
"""

import dagster as dg
from pydantic import Field

from assets import dlq_records
from assets.streams import JobSpec, dedup_job, enrichment_job
from resources import (
    DeltaRootResource,
    KafkaResource,
    SparkResource,
    StateDirResource,
    StreamsResource,
)
from streamplatform.dlq import DlqReplayer

JOBS = {"dedup": dedup_job, "enrichment": enrichment_job}


class DlqReplayConfig(dg.Config):
    jobs: list[str] = Field(
        default_factory=lambda: list(JOBS), description=f"Whose DLQ to replay: {list(JOBS)}."
    )
    max_attempts: int = Field(
        default=3, description="Replays a record may have before it stays parked."
    )
    retry_parked: bool = Field(
        default=False,
        description="Also retry parked records (after a fix), whatever their attempts.",
    )


@dg.op(
    description="Replay the jobs' DLQ records through the current topologies (re-publish what "
    "passes, park what fails again), each exactly once.",
)
def replay_dead_letters(
    context: dg.OpExecutionContext,
    config: DlqReplayConfig,
    spark: SparkResource,
    kafka: KafkaResource,
    delta_root: DeltaRootResource,
    state_dir: StateDirResource,
    streams: StreamsResource,
) -> dict:
    unknown = sorted(set(config.jobs) - set(JOBS))
    if unknown:
        raise dg.Failure(f"jobs: unknown {unknown}; expected some of {sorted(JOBS)}")
    totals = {"candidates": 0, "republished": 0, "parked": 0, "exhausted": 0, "recovered": 0}
    per_job: dict[str, dict] = {}
    for name in config.jobs:
        spec: JobSpec = JOBS[name](streams, kafka, delta_root, state_dir)
        replayer = DlqReplayer(spec.topology, spec.settings, spark.spark_session,
                               max_attempts=config.max_attempts)  # fmt: skip
        report = replayer.replay(retry_parked=config.retry_parked)
        context.log.info(
            f"{spec.application_id}: {report.candidates} DLQ records to replay, "
            f"{report.republished} re-published, {report.parked} parked "
            f"(replay batch {report.replay_batch}, position {report.position})"
        )
        totals["candidates"] += report.candidates
        totals["republished"] += report.republished
        totals["parked"] += report.parked
        totals["exhausted"] += report.exhausted
        totals["recovered"] += report.recovered_batch is not None
        per_job[spec.application_id] = {
            "replay_batch": report.replay_batch,
            "republished": report.republished,
            "parked": report.parked,
            "parked_by_exception": report.parked_by_exception,
            "recovered_batch": report.recovered_batch,
        }
    metadata = {**totals, "by_job": dg.MetadataValue.json(per_job)}
    context.log_event(dg.AssetObservation(asset_key=dlq_records.key, metadata=metadata))
    context.add_output_metadata(metadata)
    return totals


@dg.job(
    name="dlq_replay",
    executor_def=dg.in_process_executor,
    description="Replay dead-lettered records through the current topologies (scheduled).",
    tags={"streamplatform/kind": "dlq-replay"},
)
def dlq_replay_job() -> None:
    replay_dead_letters()


dlq_replay_schedule = dg.ScheduleDefinition(
    name="dlq_replay_every_15_minutes",
    job=dlq_replay_job,
    cron_schedule="*/15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Replays the DLQs every 15 minutes; a DLQ record is replayed at most once.",
)
