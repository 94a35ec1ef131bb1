"""Topologies with a repartition (``deduplicate`` by id, a key change before a stateful step)
on Spark: the repartition topic becomes a shuffle inside the micro-batch, so a batch is still
one atomic unit. The output equals the TopologyTestDriver's, also after a crash and restart."""

from __future__ import annotations

import uuid

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import PARTITIONS, RECORDS, delta_rows, job_config

pytestmark = [pytest.mark.broker, pytest.mark.spark]
# One batch (the test driver is fed the records in the order they arrived; see expected()).
ONE_BATCH = {"platform.max.records.per.batch": 1000}


def global_dedup_topology(source: str, sink: str):
    """Deduplicate by id across keys: repartitioned by the id first (two sub-topologies)."""
    b = StreamsBuilder()
    stream = b.stream(source, Serdes.string(), Serdes.json())
    stream.deduplicate(lambda k, v: v["id"], 60_000).to(sink)
    return b.build()


def rekeyed_dedup_topology(source: str, sink: str):
    """A key change, then a dedup by key: repartitioned, then deduplicated, then a filter."""
    b = StreamsBuilder()
    stream = b.stream(source, Serdes.string(), Serdes.json())
    rekeyed = stream.select_key(lambda k, v: v["id"])
    rekeyed.deduplicate_by_key(60_000).filter(lambda k, v: v["n"] % 7 != 3).to(sink)
    return b.build()


def expected(topology, source, sent):
    config = {
        "application.id": "expected",
        "default.deserialization.exception.handler": "log_and_continue",
    }
    with TopologyTestDriver(topology, config, repartition_partitions=PARTITIONS) as driver:
        topic = driver.create_input_topic(source, Serdes.string(), Serdes.bytes())
        # In the order they arrived (in time order): the downstream task merges what the
        # upstream tasks wrote by timestamp, as a live repartition topic would give it.
        for p, key, value, timestamp in sorted(sent, key=lambda s: s[3]):
            topic.pipe_raw(key.encode(), value, timestamp=timestamp, partition=p)
        out = driver.create_output_topic("out", Serdes.bytes(), Serdes.bytes())
        return sorted((r.key, r.value) for r in out.read_records_to_list())


@pytest.mark.parametrize(
    # ~15 s each: the rekeyed topology in make test-all
    "make_topology",
    [global_dedup_topology, pytest.param(rekeyed_dedup_topology, marks=pytest.mark.slow)],
)
def test_a_repartitioned_topology_equals_the_test_driver(
    spark, kafka_settings, source_topic, tmp_path, make_topology
):
    source, sent = source_topic
    app = f"rep-{uuid.uuid4().hex[:6]}"
    topology = make_topology(source, "out")
    assert len(topology.subtopologies) == 2
    config = job_config(kafka_settings, tmp_path, app, source, **ONE_BATCH)
    job = StreamingJob(topology, config, spark=spark, delta_sinks=["out"])
    results = job.run_until_caught_up()
    job.close()
    assert sum(r.records_in for r in results) == RECORDS  # the source topic's records
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/out")
    want = expected(make_topology(source, "out"), source, sent)
    assert sorted((k, v) for _, _, k, v in rows) == want
    # Each output row names the repartitioned record it came from, once.
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3
    # The second sub-topology's state is in the changelog, per task.
    tasks = {r.task for r in spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_changelog")
             .select("task").distinct().collect()}  # fmt: skip
    assert tasks == {f"1_{p}" for p in range(PARTITIONS)}


@pytest.mark.slow  # ~15 s: a crashed batch, then the job again
def test_a_repartitioned_job_killed_after_its_outputs_resumes_to_the_clean_output(
    spark, kafka_settings, source_topic, tmp_path, monkeypatch
):
    from streamplatform.runtime import faults

    source, sent = source_topic
    app = f"repcrash-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source, **ONE_BATCH)

    class Crash(Exception):
        pass

    def crash(step, batch_id):  # the driver dies between its outputs and the commit log
        if step == "after_outputs" and batch_id == 0:
            raise Crash(step)

    monkeypatch.setattr("streamplatform.runtime.microbatch.crash_point", crash)
    job = StreamingJob(global_dedup_topology(source, "out"), config, spark=spark,
                       delta_sinks=["out"])  # fmt: skip
    with pytest.raises(Crash):
        job.run_until_caught_up()
    job.close()
    monkeypatch.setattr("streamplatform.runtime.microbatch.crash_point", faults.crash_point)
    job = StreamingJob(global_dedup_topology(source, "out"), config, spark=spark,
                       delta_sinks=["out"])  # fmt: skip
    rest = job.run_until_caught_up()
    job.close()
    assert rest[0].replayed and rest[0].batch_id == 0
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/out")
    assert sorted((k, v) for _, _, k, v in rows) == expected(
        global_dedup_topology(source, "out"), source, sent
    )
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)
