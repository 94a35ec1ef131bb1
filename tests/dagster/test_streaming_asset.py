"""The streaming asset on a real Dagster instance, broker, Spark and Delta: it can be selected
alone, a run that read nothing observes it instead of materializing it (its latest
materialization keeps the numbers of the last run that did something), its metadata names the
guarantee the run had, and its session is dagster-pyspark's, one per run.

Two jobs: ``first`` reads ``in`` and writes the Kafka topic ``mid`` (its asset ``kafka/mid``),
``second`` reads ``mid`` into a Delta table, at_least_once."""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

import dagster as dg
import pytest

from streamplatform import StreamsBuilder
from streamplatform.dagster import (
    KafkaConnection,
    StreamingJobSpec,
    StreamplatformResource,
    streaming_definitions,
    topic_key,
)
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.serdes import Serdes

pytestmark = [pytest.mark.broker, pytest.mark.spark]

FIRST, SECOND = dg.AssetKey("first"), dg.AssetKey("second")
CHECKS = {"caught_up", "dlq_ratio", "offsets_contiguous"}


def copy_topology(source: str, sink: str):
    b = StreamsBuilder()
    b.stream(source, Serdes.string(), Serdes.json()).to(sink)
    return b.build()


def materializations(result: dg.ExecuteInProcessResult) -> dict[dg.AssetKey, dict[str, Any]]:
    return {
        event.asset_key: {k: v.value for k, v in event.materialization.metadata.items()}
        for event in result.get_asset_materialization_events()
    }


def observations(result: dg.ExecuteInProcessResult) -> dict[dg.AssetKey, dict[str, Any]]:
    found = {}
    for event in result.get_asset_observation_events():
        observation = event.event_specific_data.asset_observation
        found[observation.asset_key] = {k: v.value for k, v in observation.metadata.items()}
    return found


def checks_of(result: dg.ExecuteInProcessResult, key: dg.AssetKey) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()
            if e.asset_key == key}  # fmt: skip


@pytest.mark.slow  # 1-2 min on 2 busy cores: three runs of streaming jobs
def test_selected_alone_and_a_run_that_read_nothing_keeps_the_last_materialization(
    spark, kafka_settings, tmp_path
):
    tag = uuid.uuid4().hex[:6]
    source, mid, out = f"in-{tag}", f"mid-{tag}", f"out-{tag}"
    create_topics(kafka_settings, [TopicSpec(source, 2), TopicSpec(mid, 2)])
    first = StreamingJobSpec(name="first", application_id=f"first-{tag}",
                             topology=functools.partial(copy_topology, source, mid))  # fmt: skip
    second = StreamingJobSpec(name="second", application_id=f"second-{tag}",
                              topology=functools.partial(copy_topology, mid, out),
                              delta_sinks=[out],
                              settings={"processing.guarantee": "at_least_once"})  # fmt: skip
    resource = StreamplatformResource(
        kafka=KafkaConnection(bootstrap_servers=kafka_settings["bootstrap.servers"]),
        delta_root=str(tmp_path / "delta"), state_dir=str(tmp_path / "state"),
    )  # fmt: skip
    sessions: list[Any] = []

    @dg.asset
    def probe(streamplatform: StreamplatformResource) -> None:
        """What a step of the run gets: the run's session, from the nested dagster-pyspark
        resource."""
        sessions.extend([streamplatform.spark_session, streamplatform.spark.spark_session])

    defs = dg.Definitions.merge(
        streaming_definitions([first, second], resource=resource), dg.Definitions(assets=[probe])
    )
    job = defs.resolve_implicit_global_asset_job_def()
    out_producer = producer(kafka_settings)
    for n in range(30):
        out_producer.produce(source, key=f"k{n % 5}", value=json.dumps({"n": n}).encode(),
                             timestamp=1_000_000 + n)  # fmt: skip
    assert out_producer.flush(30) == 0

    with dg.instance_for_test() as instance:
        # 1. The streaming asset alone (not the topic it writes): what the UI's "Materialize"
        # on the asset launches. Before, the multi-asset could not be subset.
        alone = job.execute_in_process(instance=instance, asset_selection=[FIRST, probe.key])
        assert alone.success
        done = materializations(alone)
        assert set(done) == {FIRST, probe.key}  # kafka/mid was not selected
        assert (done[FIRST]["rows_in"], done[FIRST]["rows_out"], done[FIRST]["lag"]) == (30, 30, 0)
        assert done[FIRST]["processing.guarantee"] == "exactly_once_v2"  # StreamsConfig's default
        assert checks_of(alone, FIRST) == dict.fromkeys(CHECKS, True)
        # One session per run, dagster-pyspark's (the process's, left running for it).
        assert sessions == [spark, spark]
        assert not spark.sparkContext._jsc.sc().isStopped()

        # 2. Both jobs and the topic between them: `first` reads nothing, `second` reads what
        # `first` wrote in run 1.
        both = job.execute_in_process(instance=instance,
                                      asset_selection=[FIRST, topic_key(mid), SECOND])  # fmt: skip
        assert both.success
        done, seen = materializations(both), observations(both)
        assert FIRST not in done  # no zeros over run 1's numbers
        assert (seen[FIRST]["rows_in"], seen[FIRST]["batches"], seen[FIRST]["lag"]) == (0, 0, 0)
        assert seen[FIRST]["processing.guarantee"] == "exactly_once_v2"
        assert seen[FIRST]["committed_batch_id"] == 0
        assert checks_of(both, FIRST) == dict.fromkeys(CHECKS, True)  # evaluated all the same
        # The topic still counts as materialized: the job downstream of it ran.
        assert done[topic_key(mid)] == {"writer": f"first-{tag}",
                                        "processing.guarantee": "exactly_once_v2"}  # fmt: skip
        assert (done[SECOND]["rows_in"], done[SECOND]["rows_out"]) == (30, 30)
        assert done[SECOND]["processing.guarantee"] == "at_least_once"

        latest = instance.get_latest_materialization_event(FIRST)
        assert latest is not None and latest.run_id == alone.run_id
        kept = {k: v.value for k, v in latest.asset_materialization.metadata.items()}
        assert (kept["rows_in"], kept["rows_out"], kept["batches"]) == (30, 30, 1)
        [observed] = instance.fetch_observations(FIRST, limit=10).records
        assert observed.run_id == both.run_id

        # 3. New input: the next materialization of `first` has it.
        for n in range(30, 40):
            out_producer.produce(source, key=f"k{n % 5}", value=json.dumps({"n": n}).encode())
        assert out_producer.flush(30) == 0
        again = job.execute_in_process(instance=instance, asset_selection=[FIRST])
        assert materializations(again)[FIRST]["rows_in"] == 10
        assert instance.get_latest_materialization_event(FIRST).run_id == again.run_id
