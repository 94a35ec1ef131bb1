"""Every execution path, the temporal join, the DLQ replay and a Dagster materialization against
a secured broker, in each security mode (SASL_SSL with SCRAM-SHA-512, mutual TLS, SASL_PLAINTEXT
with Kafka's unsecured OAUTHBEARER tokens): the settings in the Java client's names reach
librdkafka (tasks, planner, offsets, repartition hand-off, replay) and Spark's Java Kafka source
and sink (``cached``, ``grouped``, ``delta-write``, ``stages``) alike, each run giving the test
driver's answer. ``test_secured_jobs.py`` covers the three security modes on the direct and
cached paths; the two-worker cluster's case is in ``runtime/test_on_a_cluster.py``."""

from __future__ import annotations

import functools
import json
import uuid

import dagster as dg
import pytest
from pyspark import cloudpickle
from runtime import event_time_jobs
from runtime.event_time_jobs import clicks_after_impressions, pages_per_minute
from runtime.support import (
    amounts_topology,
    dedup_topology,
    delta_rows,
    expected_with_the_test_driver,
    job_config,
    join_input,
    join_tables,
    join_topology,
    make_input,
    read_topic,
)
from runtime.test_event_time_on_spark import NOON, _produce, _through_the_test_driver, _topics

from streamplatform import StreamsBuilder
from streamplatform.dagster import (
    KafkaConnection,
    StreamingJobSpec,
    StreamplatformResource,
    streaming_definitions,
)
from streamplatform.dlq import DlqReplayer
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # a broker per mode, ~2 min per mode
cloudpickle.register_pickle_by_value(event_time_jobs)  # Spark's workers get the jobs by value
MINUTE = 60_000


@pytest.fixture(scope="module", params=[
    ("sasl_ssl", "SCRAM-SHA-512"), ("ssl", None), ("sasl_plaintext", "OAUTHBEARER"),
], ids=["sasl_ssl-scram", "mtls", "sasl_plaintext-oauthbearer"])  # fmt: skip
def secured(request, tmp_path_factory):
    """A broker of its own per security mode, and its client settings in Java's names."""
    mode, mechanism = request.param
    with LocalBroker(tmp_path_factory.mktemp("secured") / "broker", security=mode) as broker:
        yield broker.client_settings(*(m for m in [mechanism] if m))


def _run(topology, config, spark, delta_sinks=()):
    job = StreamingJob(topology, config, spark=spark, delta_sinks=delta_sinks)
    try:
        return job.run_until_caught_up()
    finally:
        job.close()


def _clicks(topic: str, count: int = 60) -> list[tuple]:
    """Clicks on two partitions in event-time order, then one per partition that closes every
    window: (topic, partition, key, value, timestamp)."""
    records = [(topic, n % 2, f"u{n % 2}", {"page": "abc"[n % 3], "id": n}, NOON + n * 7_000)
               for n in range(count)]  # fmt: skip
    end = NOON + count * 7_000 + 30 * MINUTE
    return records + [(topic, p, f"u{p}", {"page": "z", "id": -1}, end) for p in range(2)]


@pytest.mark.parametrize("path", ["direct-stages-driver", "stages"])
def test_a_rekeyed_count_on_a_secured_broker(spark, secured, tmp_path, path):
    """The repartitioned records go through the driver's hand-off (``direct-stages``) or
    Spark's shuffle between stages whose sources are Spark's Kafka reader (``stages``)."""
    topics = _topics(secured, clicks=2, out=1)
    records = _clicks(topics["clicks"])
    _produce(secured, records)
    topology = pages_per_minute(topics["clicks"], topics["out"])
    want = _through_the_test_driver(topology, records, topics["out"], Serdes.long())
    overrides = {"platform.max.records.per.batch": 25}
    if path == "stages":
        overrides["platform.sink.driver.max.records"] = 0
    config = job_config(secured, tmp_path, f"pages-{uuid.uuid4().hex[:6]}", topics["clicks"],
                        **overrides) | secured  # fmt: skip
    results = _run(pages_per_minute(topics["clicks"], topics["out"]), config, spark)
    assert {r.path for r in results} == {path}
    got = read_topic(secured, topics["out"])
    assert sorted((r.key, r.value) for r in got) == sorted(
        (r.key, r.value.to_bytes(8, "big", signed=True)) for r in want
    )


def test_two_topics_joined_on_the_grouped_path_of_a_secured_broker(spark, secured, tmp_path):
    """Two topics read by Spark's Kafka source into one grouped task per partition."""
    topics = _topics(secured, impressions=2, clicks=2, out=1)
    records = []
    for n in range(30):
        key, partition = f"u{n % 4}", n % 2  # u0 and u2 on partition 0, u1 and u3 on 1
        records.append((topics["impressions"], partition, key, {"id": f"i{n}"}, NOON + n * 20_000))
        records.append((topics["clicks"], partition, key, {"id": f"c{n}"}, NOON + n * 20_000 + 5))
    _produce(secured, records)
    topology = clicks_after_impressions(topics["impressions"], topics["clicks"], topics["out"])
    want = _through_the_test_driver(topology, records, topics["out"], Serdes.json())
    assert want  # the reference joins something
    config = job_config(secured, tmp_path, f"join-{uuid.uuid4().hex[:6]}", topics["clicks"],
                        **{"platform.sink.driver.max.records": 0}) | secured  # fmt: skip
    results = _run(
        clicks_after_impressions(topics["impressions"], topics["clicks"], topics["out"]),
        config, spark,
    )  # fmt: skip
    assert {r.path for r in results} == {"grouped"}
    got = read_topic(secured, topics["out"])
    assert sorted((r.key, json.dumps(json.loads(r.value), sort_keys=True)) for r in got) == sorted(
        (r.key, json.dumps(r.value, sort_keys=True)) for r in want
    )


@pytest.mark.parametrize("path", ["delta-write", "direct-spilled"])
def test_a_dedup_into_delta_on_a_secured_broker(spark, secured, tmp_path, path):
    """``delta-write``: Spark's Kafka source streams into the Delta sink; ``direct-spilled``:
    the tasks in Spark, their outputs spilled to staging files and committed from there."""
    source = f"in-{uuid.uuid4().hex[:8]}"
    create_topics(secured, [TopicSpec(source, 3), TopicSpec(f"{source}-dlq", 1)])
    sent = make_input(secured, source)
    app = f"dedup-{uuid.uuid4().hex[:6]}"
    limit = 0 if path == "delta-write" else 10  # below the batch: spilled
    config = job_config(secured, tmp_path, app, source, **{
        "platform.max.records.per.batch": 100_000, "platform.sink.driver.max.records": limit,
    }) | secured  # fmt: skip
    results = _run(dedup_topology(source, "out"), config, spark, delta_sinks=["out"])
    assert {r.path for r in results} == {path}
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/out")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len(read_topic(secured, f"{source}-dlq")) == 3  # the poison values, in the DLQ


def test_the_temporal_join_on_a_secured_broker_equals_the_same_job_in_the_clear(
    spark, secured, kafka_settings, tmp_path
):
    """The dedup job's companion: transactions joined as-of their time with a versioned table
    of rates (two co-partitioned topics, a poison value), run against the secured broker and
    against a plaintext one with the same topics and records: the same output, DLQ and
    versions."""
    name = f"join-{uuid.uuid4().hex[:6]}"
    tables = {}
    for where, settings in (("clear", kafka_settings), ("secured", secured)):
        transactions, rates = join_input(settings, name)
        config = job_config(settings, tmp_path / where, name, transactions,
                            **{"platform.max.records.per.batch": 6}) | settings  # fmt: skip
        _run(join_topology(transactions, rates, "enriched"), config, spark, ["enriched"])
        tables[where] = join_tables(spark, tmp_path / where / "delta" / name)
    assert all(tables["clear"].values())
    assert tables["secured"] == tables["clear"]


def test_the_dlq_replay_republishes_through_a_secured_broker(spark, secured, tmp_path):
    """A record the strict topology rejects goes to the DLQ; the replay (its watermark probe,
    its transactional producer, its check) republishes it for the fixed topology."""
    name = f"replay-{uuid.uuid4().hex[:6]}"
    source, sink, dlq = f"{name}-tx", f"{name}-out", f"{name}-dlq"
    create_topics(secured, [TopicSpec(source, 2), TopicSpec(dlq, 1)])
    config = job_config(secured, tmp_path, name, source, **{
        "errors.dead.letter.queue.topic.name": dlq,
        "processing.exception.handler": "log_and_continue",
    }) | secured  # fmt: skip
    writer = producer(secured)
    for n, amount in enumerate([5, -2, 7]):
        writer.produce(source, key=b"k", value=json.dumps({"amount": amount}).encode(),
                       partition=n % 2, timestamp=1_000 + n)  # fmt: skip
    assert writer.flush(30) == 0

    _run(amounts_topology(source, sink, strict=True), config, spark, delta_sinks=[sink])
    assert len(read_topic(secured, dlq)) == 1
    report = DlqReplayer(amounts_topology(source, sink, strict=False), config, spark).replay()
    assert (report.candidates, report.republished, report.parked) == (1, 1, 0)
    _run(amounts_topology(source, sink, strict=False), config, spark, delta_sinks=[sink])
    rows = spark.read.format("delta").load(f"{tmp_path}/delta/{name}/{sink}").collect()
    assert sorted(json.loads(r.value)["amount"] for r in rows) == [-2, 5, 7]


def _copy(source: str, sink: str):
    b = StreamsBuilder()
    b.stream(source, Serdes.string(), Serdes.json()).to(sink)
    return b.build()


def test_a_dagster_materialization_reads_and_writes_a_secured_broker(
    spark, secured, tmp_path, monkeypatch
):
    """The password reaches the job from an EnvVar of the resource's KafkaConnection; the
    materialization's numbers and checks are those of the run, and its metadata holds no
    secret."""
    tag = uuid.uuid4().hex[:6]
    source, out = f"in-{tag}", f"out-{tag}"
    create_topics(secured, [TopicSpec(source, 2), TopicSpec(out, 2)])
    writer = producer(secured)
    for n in range(20):
        writer.produce(source, key=f"k{n % 5}", value=json.dumps({"n": n}).encode())
    assert writer.flush(30) == 0

    # The mode's secrets (the JAAS line, store passwords) from EnvVars, the rest as settings.
    secret_keys = [k for k in ("sasl.jaas.config", "ssl.keystore.password", "ssl.key.password",
                               "ssl.truststore.password") if k in secured]  # fmt: skip
    secrets = {}
    for key in secret_keys:
        variable = "TEST_KAFKA_" + key.upper().replace(".", "_")
        monkeypatch.setenv(variable, secured[key])
        secrets[key.replace(".", "_")] = dg.EnvVar(variable)
    shared = {k: v for k, v in secured.items() if k != "bootstrap.servers" and k not in secret_keys}
    connection = KafkaConnection(bootstrap_servers=secured["bootstrap.servers"], settings=shared,
                                 **secrets)  # fmt: skip
    resource = StreamplatformResource(kafka=connection, delta_root=str(tmp_path / "delta"),
                                      state_dir=str(tmp_path / "state"))  # fmt: skip
    spec = StreamingJobSpec(name="copy", application_id=f"copy-{tag}",
                            topology=functools.partial(_copy, source, out))  # fmt: skip
    defs = streaming_definitions([spec], resource=resource)
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("copy")])
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events()
               if e.asset_key == dg.AssetKey("copy")]  # fmt: skip
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (metadata["rows_in"], metadata["rows_out"], metadata["lag"]) == (20, 20, 0)
    assert all(e.passed for e in result.get_asset_check_evaluations())
    for key in secret_keys:
        shown = secured[key].split('password="')[-1].split('"')[0]  # the password, or the whole
        assert shown not in repr(metadata) and shown not in repr(resource)
    assert len(read_topic(secured, out)) == 20
