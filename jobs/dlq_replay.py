"""The scheduled DLQ replay: every 15 minutes, on by default.

For each job's DLQ (deduplication, enrichment) :class:`streamplatform.dlq.DlqReplayer`
re-publishes to its source topic what the current topology now processes without an error and
parks in ``_dlq_parked`` what fails again, each DLQ record exactly once (see
``streamplatform/dlq/replay.py`` for how a crash at any step neither loses nor doubles one).
The running streaming jobs pick the re-published records up at their next materialization.

Each job's replay is an op of its own in the job's pool (``streamplatform/<application.id>``):
it waits for a materialization of that job, or another replay of it, to end. The graph
``replay_dead_letters`` takes the run config (``jobs``, ``max_attempts``, ``retry_parked``), hands
it to each job's op, and returns the totals.
"""

import dagster as dg
from pydantic import Field

from assets import dlq_records
from assets.streams import DEDUP_POOL, ENRICHMENT_POOL, JobSpec, dedup_job, enrichment_job
from resources import (
    DeltaRootResource,
    KafkaResource,
    SparkResource,
    StateDirResource,
    StreamsResource,
)
from streamplatform.dagster.factory import DlqReplayConfig as ReplayConfig
from streamplatform.dlq import DlqReplayer

JOBS = {"dedup": dedup_job, "enrichment": enrichment_job}
POOLS = {"dedup": DEDUP_POOL, "enrichment": ENRICHMENT_POOL}


class DlqReplayConfig(ReplayConfig):
    """The library's replay settings (max_attempts, retry_parked), and whose DLQs."""

    jobs: list[str] = Field(
        default_factory=lambda: list(JOBS), description=f"Whose DLQ to replay: {list(JOBS)}."
    )


def replay_op(name: str) -> dg.OpDefinition:
    """The DLQ replay of one job, in that job's pool: it writes the job's runtime tables
    (``_dlq_replayed``, ``_dlq_parked``, ``_dlq_replay_log``), so it waits for a running
    materialization of the job, and another replay of the same job waits for it."""

    @dg.op(
        name=f"replay_{name}_dead_letters",
        pool=POOLS[name],
        description=f"Replay the {name} job's DLQ records through its current topology "
        "(re-publish what passes, park what fails again), each exactly once.",
    )
    def replay(
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
        if name not in config.jobs:
            return {}
        spec: JobSpec = JOBS[name](streams, kafka, delta_root, state_dir)
        replayer = DlqReplayer(spec.topology, spec.settings, spark.spark_session,
                               max_attempts=config.max_attempts)  # fmt: skip
        report = replayer.replay(retry_parked=config.retry_parked)
        context.log.info(
            f"{spec.application_id}: {report.candidates} DLQ records to replay, "
            f"{report.republished} re-published, {report.parked} parked "
            f"(replay batch {report.replay_batch}, position {report.position})"
        )
        return {
            "application_id": spec.application_id,
            "candidates": report.candidates,
            "republished": report.republished,
            "parked": report.parked,
            "exhausted": report.exhausted,
            "replay_batch": report.replay_batch,
            "parked_by_exception": report.parked_by_exception,
            "recovered_batch": report.recovered_batch,
        }

    return replay


REPLAY_OPS = {name: replay_op(name) for name in JOBS}


@dg.op(description="The replays' totals, observed on dlq_records.")
def replay_totals(context: dg.OpExecutionContext, reports: list[dict]) -> dict:
    totals = {"candidates": 0, "republished": 0, "parked": 0, "exhausted": 0, "recovered": 0}
    per_job: dict[str, dict] = {}
    for report in filter(None, reports):
        for name in ("candidates", "republished", "parked", "exhausted"):
            totals[name] += report[name]
        totals["recovered"] += report["recovered_batch"] is not None
        per_job[report["application_id"]] = {
            name: report[name]
            for name in ("replay_batch", "republished", "parked", "parked_by_exception",
                         "recovered_batch")
        }  # fmt: skip
    metadata = {**totals, "by_job": dg.MetadataValue.json(per_job)}
    context.log_event(dg.AssetObservation(asset_key=dlq_records.key, metadata=metadata))
    context.add_output_metadata(metadata)
    return totals


@dg.config_mapping
def replay_config(config: DlqReplayConfig) -> dict:
    """One config for the whole replay (``ops: replay_dead_letters: config: ...``), the same for
    each job's op: which DLQs, attempts, whether to retry parked records."""
    return {op.name: {"config": config.model_dump()} for op in REPLAY_OPS.values()}


@dg.graph(
    config=replay_config,
    description="Replay the jobs' DLQ records through the current topologies, one op per job in "
    "the job's pool, and sum up.",
)
def replay_dead_letters() -> dict:
    return replay_totals([op() for op in REPLAY_OPS.values()])


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
