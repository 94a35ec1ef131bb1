"""Operate any streamplatform topology from Dagster: declare a job once, get its definitions.

In Python::

    import dagster as dg
    from streamplatform.dagster import (
        StreamingJobSpec, StreamplatformResource, streaming_definitions)

    defs = streaming_definitions(
        [StreamingJobSpec(name="orders_deduplicated", topology="my_project.topologies:orders",
                          dlq_topic="orders-dlq", delta_sinks=["orders-clean"])],
        resource=StreamplatformResource(),
    )

or in YAML with :class:`StreamingJobComponent` (a Dagster ``Component``; one ``defs.yaml`` per
job). Either gives, per job: the streaming asset with its checks, a versioned snapshot asset
per versioned store (with late-version reports and a backfill sensor for a declared
:class:`AsOfJoin`), the DLQ replay job and schedule, and the lag sensor (see
:mod:`streamplatform.dagster.factory`), all on one :class:`StreamplatformResource` bound under
the key ``streamplatform``.

Runs of one job are kept apart by its pool ``streamplatform/<application.id>``: give the
instance ``concurrency: {pools: {default_limit: 1}}`` in ``dagster.yaml`` so that a second
launch waits in the queue (:func:`pools` lists a definitions' pools).

A job run as a service (``streamplatform run --dagster-asset <name>``, or
:class:`ContinuousJobReporter` from Python) reports itself to the instance without a run, and
:func:`continuous_job_definitions` gives it its Delta sinks as assets (:func:`delta_sink_key`),
checks on its reports and a sensor that fails them when it stalls or loses its claim.

A project's own assets beside a job's (a daily recomputation, an audit of its output) read
where the job has got to with :func:`consumed_offsets`, and exactly that input with
:func:`streamplatform.read_kafka_ranges`.
"""

from __future__ import annotations

import dagster as dg

from streamplatform.dagster.component import StreamingJobComponent
from streamplatform.dagster.continuous import continuous_job_definitions, delta_sink_key
from streamplatform.dagster.factory import (
    RESOURCE_KEY,
    job_pool,
    late_version_backfill_sensor,
    snapshot_asset_name,
    snapshot_path,
    streaming_definitions,
    topic_key,
)
from streamplatform.dagster.reporting import ContinuousJobReporter
from streamplatform.dagster.resource import (
    KafkaConnection,
    SchemaRegistryConnection,
    StreamplatformResource,
    platform_pyspark,
)
from streamplatform.dagster.spec import AsOfJoin, StreamingJobSpec
from streamplatform.runtime.logs import CommitLog


def pools(definitions: dg.Definitions) -> set[str]:
    """Every pool an op of ``definitions`` runs in."""
    return {
        op.pool
        for job in definitions.resolve_all_job_defs()
        for op in job.graph.iterate_op_defs()
        if op.pool
    }


def consumed_offsets(
    resource: StreamplatformResource, job: StreamingJobSpec
) -> dict[tuple[str, int], int]:
    """Where ``job`` has consumed its sources up to, on ``resource``: ``{(topic, partition):
    next offset to read}`` as of its newest committed batch, ``{}`` before its first.

    Read from the job's commit log (``<app_root>/_commits``) and nothing else: it starts no
    Spark and changes nothing. Everything before these offsets has been processed and its
    outputs committed, so ``{topic: {partition: (start, offset)}}`` read with
    :func:`streamplatform.read_kafka_ranges` is exactly the input the job has processed (start at
    the partition's low offset, ``resource.end_offsets(topic)``, when its log has been
    truncated)."""
    last = CommitLog(f"{resource.app_root(job)}/_commits", job.app_id).last()
    return {} if last is None else dict(last.consumed)


__all__ = [
    "RESOURCE_KEY",
    "AsOfJoin",
    "ContinuousJobReporter",
    "KafkaConnection",
    "SchemaRegistryConnection",
    "StreamingJobComponent",
    "StreamingJobSpec",
    "StreamplatformResource",
    "consumed_offsets",
    "continuous_job_definitions",
    "delta_sink_key",
    "job_pool",
    "late_version_backfill_sensor",
    "platform_pyspark",
    "pools",
    "snapshot_asset_name",
    "snapshot_path",
    "streaming_definitions",
    "topic_key",
]
