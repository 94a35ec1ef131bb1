"""streamplatform.dagster on a project that is not the demo: a throwaway Dagster project in a
temp dir with its own topology (orders deduplicated by order id, into Delta), declared once with
the Python factory and once with YAML (the component). Checked with `dagster definitions
validate`, then materialized, its DLQ replayed and its lag sensor ticked on the real broker,
Spark and Delta."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest
from dagster_pyspark import LazyPySparkResource

from streamplatform.config import ConfigError
from streamplatform.dagster import (
    AsOfJoin,
    StreamingJobComponent,
    StreamingJobSpec,
    StreamplatformResource,
    job_pool,
    pools,
    snapshot_asset_name,
    streaming_definitions,
)
from streamplatform.kafka import TopicSpec, create_topics, end_offsets, group_offsets, producer
from streamplatform.runtime.logs import CommitLog

TOPOLOGY = '''
from datetime import timedelta

from streamplatform import StreamsBuilder
from streamplatform.serdes import Serdes

RAW, CLEAN = {raw!r}, {clean!r}


def orders_topology():
    """Orders deduplicated by order id within an hour, into the table topic CLEAN."""
    b = StreamsBuilder()
    orders = b.stream(RAW, Serdes.string(), Serdes.json())
    orders.deduplicate_by_key_value(lambda k, v: v["order_id"], timedelta(hours=1)).to(
        CLEAN, Serdes.string(), Serdes.json())
    return b.build()
'''
# The factory declaration and the YAML one: the same job, in the project's own words.
FACTORY_DEFINITIONS = """
from orders_project.topologies import CLEAN
from streamplatform.dagster import StreamingJobSpec, StreamplatformResource, streaming_definitions

defs = streaming_definitions(
    [StreamingJobSpec(name="orders_clean", topology="orders_project.topologies:orders_topology",
                      application_id={app!r}, delta_sinks=[CLEAN], dlq_topic={dlq!r},
                      settings={{"platform.max.records.per.batch": 50}})],
    resource=StreamplatformResource(),  # KAFKA_BOOTSTRAP_SERVERS, STREAMPLATFORM_DATA or local
    lag_threshold=10,
)
"""
COMPONENT_YAML = """
type: streamplatform.dagster.StreamingJobComponent
attributes:
  name: orders_clean
  topology: orders_project.topologies:orders_topology
  application_id: {app}
  delta_sinks: [{clean}]
  dlq_topic: {dlq}
  settings:
    platform.max.records.per.batch: 50
  freshness_minutes: 60
  lag_threshold: 10
  resource: {{}}  # KAFKA_BOOTSTRAP_SERVERS, STREAMPLATFORM_DATA or local
"""
COMPONENT_DEFINITIONS = """
from pathlib import Path

import dagster as dg

defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""
PYPROJECT = """
[project]
name = "orders-project"
version = "0.0.1"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "orders_project"
defs_module = "orders_project.defs"
"""


def write_project(root: Path, names: dict[str, str], with_yaml: bool) -> Path:
    """The throwaway project: ``orders_project`` with its topology and its definitions."""
    package = root / "orders_project"
    (package / "defs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "topologies.py").write_text(TOPOLOGY.format(**names))
    (root / "pyproject.toml").write_text(PYPROJECT)
    if with_yaml:
        (package / "defs" / "orders").mkdir()
        (package / "defs" / "orders" / "defs.yaml").write_text(COMPONENT_YAML.format(**names))
        (package / "definitions.py").write_text(COMPONENT_DEFINITIONS)
    else:
        (package / "definitions.py").write_text(FACTORY_DEFINITIONS.format(**names))
    return root


def load(root: Path) -> dg.Definitions:
    """The project's definitions, imported as `dagster` would (its root on sys.path)."""
    sys.path.insert(0, str(root))
    try:
        for name in [m for m in sys.modules if m.startswith("orders_project")]:
            del sys.modules[name]
        module = __import__("orders_project.definitions", fromlist=["defs"])
        return module.defs
    finally:
        sys.path.remove(str(root))


def names_for(tag: str) -> dict[str, str]:
    return {"raw": f"orders-{tag}", "clean": f"orders-clean-{tag}", "dlq": f"orders-dlq-{tag}",
            "app": f"orders-{tag}"}  # fmt: skip


@pytest.mark.slow  # ~5-12 s each: a child process (make test validates in-process)
@pytest.mark.parametrize("with_yaml", [False, True], ids=["factory", "yaml"])
def test_a_project_of_its_own_validates_with_the_dagster_cli(tmp_path, with_yaml):
    root = write_project(tmp_path, names_for("v"), with_yaml)
    validated = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m",
         "orders_project.definitions", "-d", str(root)],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert validated.returncode == 0, validated.stdout[-3000:] + validated.stderr[-3000:]
    assert "Validation successful" in validated.stdout + validated.stderr

    defs = load(root)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"orders_clean", "kafka/orders-v"} <= keys
    assert pools(defs) == {job_pool("orders-v")}
    assert defs.resolve_job_def("orders_clean_dlq_replay") is not None
    assert defs.resolve_sensor_def("orders_clean_lag") is not None
    asset = defs.resolve_assets_def("orders_clean")
    checks = {key.name for key in asset.check_keys}
    assert checks == {"caught_up", "dlq_ratio", "offsets_contiguous"}
    (spec,) = [s for s in asset.specs if s.key == dg.AssetKey("orders_clean")]
    if with_yaml:  # freshness_minutes: 60
        assert spec.freshness_policy.fail_window.to_timedelta().total_seconds() == 3600
    assert spec.metadata["application_id"] == "orders-v"


def test_the_components_resource_attribute_binds_the_resource():
    from streamplatform.dagster import StreamingJobComponent

    component = StreamingJobComponent(
        name="orders", topology="tests.dagster.test_integration:_tiny_topology",
        resource={"kafka": {"bootstrap_servers": "kafka-1:9092", "settings": {
            "security.protocol": "SASL_SSL"}}, "spark": {"master": "spark://m:7077", "conf": {
            "spark.executor.memory": "8g"}, "stop_after_run": False},
            "delta_root": "s3a://bucket/streams", "state_dir": "/mnt/state"},
    )  # fmt: skip
    defs = dg.build_defs_for_component(component)
    resource = defs.resources["streamplatform"]
    assert resource.kafka_settings() == {"bootstrap.servers": "kafka-1:9092",
                                         "security.protocol": "SASL_SSL"}  # fmt: skip
    assert (resource.delta_root_path(), resource.state_dir_path()) == (
        "s3a://bucket/streams", "/mnt/state")  # fmt: skip
    # Spark: dagster-pyspark's lazy resource, the platform's settings and the declared ones.
    assert isinstance(resource.spark, LazyPySparkResource)
    conf = resource.spark.spark_config
    assert (conf["spark.master"], conf["spark.executor.memory"]) == ("spark://m:7077", "8g")
    assert conf["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
    assert resource.stop_spark_after_run is False


def test_a_wrong_declaration_stops_loading_with_the_setting_named(tmp_path):
    topology = _tiny_topology
    with pytest.raises(ConfigError, match="orders: settings.bootstrap.servers comes from"):
        StreamingJobSpec(name="orders", topology=topology, settings={"bootstrap.servers": "x"})
    with pytest.raises(ConfigError, match="(?s)orders: .*processing.guarantee='maybe'"):
        StreamingJobSpec(name="orders", topology=topology,
                         settings={"processing.guarantee": "maybe"})  # fmt: skip
    with pytest.raises(ConfigError, match="no.such.setting: unknown setting"):
        StreamingJobSpec(name="orders", topology=topology, settings={"no.such.setting": 1})
    with pytest.raises(ConfigError, match=r"delta_sinks \['elsewhere'\] are not sink topics"):
        StreamingJobSpec(name="orders", topology=topology, delta_sinks=["elsewhere"])
    with pytest.raises(ConfigError, match="cannot import no_such_module"):
        StreamingJobSpec(name="orders", topology="no_such_module:orders")
    with pytest.raises(ValueError, match="unique"):
        spec = StreamingJobSpec(name="orders", topology=topology)
        streaming_definitions([spec, spec])


def test_a_job_reading_another_jobs_kafka_topic_is_downstream_of_it():
    """Each job materializes the Kafka topics it writes (kafka/<topic>): the dedup -> Kafka
    -> enrichment chain is one lineage in the asset graph, declared job by job."""
    first = StreamingJobSpec(name="first", topology=_tiny_topology)  # in -> out
    second = StreamingJobSpec(name="second", topology=lambda: _tiny_topology("out", "final"),
                              delta_sinks=["final"])  # fmt: skip
    defs = streaming_definitions([first, second], resource=StreamplatformResource())
    graph = defs.resolve_asset_graph()
    out = dg.AssetKey(["kafka", "out"])
    assert graph.get(dg.AssetKey("second")).parent_keys == {out}
    assert graph.get(out).parent_keys == {dg.AssetKey("first")}
    assert graph.get(dg.AssetKey("first")).parent_keys == {dg.AssetKey(["kafka", "in"])}
    assert graph.get(out).is_materializable  # by the job `first`, not an external stub
    assert dg.AssetKey(["kafka", "final"]) not in graph.get_all_asset_keys()  # a Delta sink


def _second_writer():
    """Another job writing the topic `out` (from `other`)."""
    return _tiny_topology("other", "out")


TWO_WRITERS = (
    r"Kafka topic 'out' is written by the streaming jobs 'first' and 'second'.*shared_sinks"
)


def test_two_jobs_writing_one_topic_are_refused_at_load_saying_what_to_do():
    first = StreamingJobSpec(name="first", topology=_tiny_topology)  # in -> out
    second = StreamingJobSpec(name="second", topology=_second_writer)  # other -> out
    with pytest.raises(ConfigError, match=TWO_WRITERS):
        streaming_definitions([first, second])
    with pytest.raises(ConfigError, match="two streaming jobs are named 'first'"):
        streaming_definitions([first, StreamingJobSpec(name="first", topology=_second_writer)])
    with pytest.raises(ConfigError, match=r"shared_sinks \['nope'\] are not Kafka sink topics"):
        StreamingJobSpec(name="second", topology=_second_writer, shared_sinks=["nope"])

    # What the message says to do: the second writer shares the topic, the first owns its asset.
    sharing = StreamingJobSpec(name="second", topology=_second_writer, shared_sinks=["out"])
    defs = streaming_definitions([first, sharing], resource=StreamplatformResource())
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    out = dg.AssetKey(["kafka", "out"])
    assert graph.get(out).parent_keys == {dg.AssetKey("first")}
    assert defs.resolve_assets_def("second").keys == {dg.AssetKey("second")}
    assert "Kafka topic `out`" in (graph.get(dg.AssetKey("second")).description or "")


def test_two_component_files_writing_one_topic_are_refused_when_the_project_loads(tmp_path):
    """Each defs.yaml builds its own definitions; the load names both jobs and what to do,
    not Dagster's bare duplicate asset key."""
    package = f"two_writers_{uuid.uuid4().hex[:6]}"
    (tmp_path / "dg.toml").write_text(f'directory_type = "project"\n\n[project]\n'
                                      f'root_module = "{package}"\n')  # fmt: skip
    for name, topology in (("first", "_tiny_topology"), ("second", "_second_writer")):
        folder = tmp_path / package / "defs" / name
        folder.mkdir(parents=True)
        (folder / "defs.yaml").write_text(
            "type: streamplatform.dagster.StreamingJobComponent\nattributes:\n"
            f"  name: {name}\n  topology: tests.dagster.test_integration:{topology}\n"
            + ("  resource: {}\n" if name == "first" else "")  # bound once per project
        )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(Exception) as raised:
            dg.load_from_defs_folder(path_within_project=tmp_path)
        causes = [raised.value]
        while causes[-1].__cause__ is not None:
            causes.append(causes[-1].__cause__)
        assert any(isinstance(e, ConfigError) and re.search(TWO_WRITERS, str(e)) for e in causes)

        second = tmp_path / package / "defs" / "second" / "defs.yaml"
        second.write_text(second.read_text() + "  shared_sinks: [out]\n")
        for module in [m for m in sys.modules if m.startswith(package)]:
            del sys.modules[module]
        defs = dg.load_from_defs_folder(path_within_project=tmp_path)
        graph = defs.resolve_asset_graph()
        assert graph.get(dg.AssetKey(["kafka", "out"])).parent_keys == {dg.AssetKey("first")}
    finally:
        sys.path.remove(str(tmp_path))


def test_the_asset_description_states_the_jobs_guarantee():
    def description(**settings: str) -> str:
        spec = StreamingJobSpec(name="orders", topology=_tiny_topology, settings=settings)
        graph = streaming_definitions(
            [spec], resource=StreamplatformResource()
        ).resolve_asset_graph()
        return graph.get(dg.AssetKey("orders")).description or ""

    exactly_once = description()
    assert "processing.guarantee=exactly_once_v2" in exactly_once
    assert "read_committed reader sees each Kafka output once" in exactly_once
    at_least_once = description(**{"processing.guarantee": "at_least_once"})
    assert "processing.guarantee=at_least_once" in at_least_once
    assert "may hold repeats" in at_least_once and "exactly_once" not in at_least_once


def _join_topology():
    """Orders joined as-of with a versioned customers table into the sink `enriched`."""
    from streamplatform import StreamsBuilder
    from streamplatform.serdes import Serdes
    from streamplatform.state import Stores

    b = StreamsBuilder()
    customers = b.table(
        "customers",
        Serdes.string(),
        Serdes.json(),
        store=Stores.persistent_versioned_key_value_store("customers", 86_400_000),
    )
    b.stream("orders", Serdes.string(), Serdes.json()).join(
        customers, lambda order, customer: {**order, **customer}
    ).to("enriched")
    return b.build()  # fmt: skip


def test_an_as_of_join_is_checked_and_gets_its_backfill_sensor():
    join = AsOfJoin(store="customers", sink="enriched", backfill_job="orders_backfill")
    with pytest.raises(
        ConfigError, match=r"store 'nope' is not a versioned store.*\['customers'\]"
    ):
        StreamingJobSpec(name="orders", topology=_join_topology, delta_sinks=["enriched"],
                         as_of_joins=[AsOfJoin(store="nope", sink="enriched")])  # fmt: skip
    with pytest.raises(ConfigError, match="sink 'enriched' is not one of its delta_sinks"):
        StreamingJobSpec(name="orders", topology=_join_topology, as_of_joins=[join])
    spec = StreamingJobSpec(name="orders", topology=_join_topology, delta_sinks=["enriched"],
                            as_of_joins=[join])  # fmt: skip
    defs = streaming_definitions([spec])
    assert snapshot_asset_name(spec, "customers") == "orders_customers_versions"
    [sensor] = [s for s in defs.sensors if s.name == "orders_customers_versions_late_backfill"]
    assert sensor.job_name == "orders_backfill"
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    # The YAML declaration gives the same sensor.
    component = StreamingJobComponent(
        name="orders", topology="test_integration:_join_topology", delta_sinks=["enriched"],
        as_of_joins=[{"store": "customers", "sink": "enriched", "backfill_job": "orders_backfill"}],
    )  # fmt: skip
    assert component.spec().as_of_joins == (join,)


def _tiny_topology(source: str = "in", sink: str = "out"):
    from streamplatform import StreamsBuilder
    from streamplatform.serdes import Serdes

    b = StreamsBuilder()
    b.stream(source, Serdes.string(), Serdes.json()).to(sink)
    return b.build()


def produce_orders(settings: dict, topic: str) -> int:
    """60 orders, 15 of them sent twice, and one record that is not JSON: 60 distinct."""
    out = producer(settings)
    for n in range(60):
        value = json.dumps({"order_id": f"o-{n}", "amount": n}).encode()
        out.produce(topic, key=f"c{n % 4}", value=value, timestamp=1_000_000 + n * 1_000)
        if n % 4 == 0:
            out.produce(topic, key=f"c{n % 4}", value=value, timestamp=1_000_500 + n * 1_000)
    out.produce(topic, key="c1", value=b"{not json", timestamp=1_100_000)
    assert out.flush(60) == 0
    return 60


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.slow  # ~60 s: two materializations, a DLQ replay, sensor ticks
@pytest.mark.parametrize("with_yaml", [False, True], ids=["factory", "yaml"])
def test_the_project_materializes_replays_its_dlq_and_ticks_its_sensor(
    spark, kafka_settings, tmp_path, monkeypatch, with_yaml
):
    tag = uuid.uuid4().hex[:6]
    names = names_for(tag)
    create_topics(kafka_settings, [TopicSpec(names["raw"], 2), TopicSpec(names["dlq"], 1)])
    # The project's resource as a deployment sets it: from the environment.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_settings["bootstrap.servers"])
    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path / "data"))
    defs = load(write_project(tmp_path / "project", names, with_yaml))
    resources = {"streamplatform": StreamplatformResource()}
    instance = dg.DagsterInstance.ephemeral()
    asset = defs.resolve_assets_def("orders_clean")
    sensor = defs.resolve_sensor_def("orders_clean_lag")

    def tick():
        with dg.build_sensor_context(instance=instance, resources=resources) as context:
            return sensor(context)

    distinct = produce_orders(kafka_settings, names["raw"])
    request = tick()  # nothing materialized yet: the whole topic is lag
    assert isinstance(request, dg.RunRequest), request
    assert request.asset_selection == [asset.key]

    result = dg.materialize([asset], instance=instance)
    assert result.success
    (materialization,) = result.asset_materializations_for_node("orders_clean")
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["rows_in"] == distinct + 15 + 1
    assert metadata["duplicates_dropped"] == 15
    assert metadata["dlq_records"] == 1
    assert metadata["lag"] == 0
    assert metadata["records_per_second"] > 0
    assert (metadata["late_records"], metadata["join_misses"]) == (0, 0)
    # The largest event time read: order 59's. The poison record after it (1,100,000 ms) was
    # never deserialized, so it does not move stream time (as in Kafka Streams).
    assert metadata["event_time_watermark_ms"] == 1_059_000
    assert metadata["event_time_watermark"] == "1970-01-01T00:17:39.000+00:00"
    # What Kafka tools see of the job (its consumer group, through the admin API) is what the
    # asset reports: the offsets consumed, and the lag from them.
    group = group_offsets(kafka_settings, names["app"])
    assert {f"{t}/{p}": o for (t, p), o in group.items()} == metadata["consumed_offsets"]
    ends = end_offsets(kafka_settings, names["raw"])
    assert sum(ends[p][1] - o for (_, p), o in group.items()) == metadata["lag"]
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    # 1 DLQ record in 76 is above the default 1%: the check warns.
    assert checks == {"caught_up": True, "dlq_ratio": False, "offsets_contiguous": True}
    table = spark.read.format("delta").load(
        f"{tmp_path}/data/delta/{names['app']}/{names['clean']}"
    )
    assert table.count() == distinct

    skipped = tick()
    assert isinstance(skipped, dg.SkipReason) and "lag 0 within 10" in skipped.skip_message

    replay_job = defs.resolve_job_def("orders_clean_dlq_replay")
    replay = replay_job.execute_in_process(instance=instance)
    assert replay.success
    (observed,) = [e for e in replay.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    report = observed.event_specific_data.asset_observation.metadata
    assert report["dlq_replay_candidates"].value == 1
    assert report["dlq_replay_parked"].value == 1  # still not JSON: parked, not re-published
    again = replay_job.execute_in_process(instance=instance)
    (observed,) = [e for e in again.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert observed.event_specific_data.asset_observation.metadata[
        "dlq_replay_candidates"].value == 0  # each DLQ record replayed once  # fmt: skip

    # The maintenance job maintains this job's tables, up to its last committed batch.
    maintenance = defs.resolve_job_def("orders_clean_maintenance").execute_in_process(
        instance=instance,
        run_config={"ops": {"maintain_orders_clean_tables": {
            "config": {"min_changelog_files": 2}}}},
    )  # fmt: skip
    assert maintenance.success
    (observed,) = [e for e in maintenance.all_events
                   if e.event_type_value == "ASSET_OBSERVATION"]  # fmt: skip
    report = observed.event_specific_data.asset_observation.metadata
    last = CommitLog(f"{tmp_path}/data/delta/{names['app']}/_commits", names["app"]).last()
    assert report["maintenance_snapshot_batch"].value == last.batch_id
    assert report["maintenance_changelog_rows_after"].value <= report[
        "maintenance_changelog_rows_before"].value  # fmt: skip
    assert table.count() == distinct  # the sink is untouched
