"""A job with aggregations, declared through the existing factory (and the YAML component's
fields) with no new code: its run metadata counts the records dropped as late and the rows of
its Delta state tables (one per user and window, one per user)."""

from __future__ import annotations

import functools
import uuid

import dagster as dg
import pytest

from streamplatform.dagster import (
    KafkaConnection,
    StreamingJobComponent,
    StreamingJobSpec,
    StreamplatformResource,
    streaming_definitions,
)
from streamplatform.kafka import TopicSpec, create_topics
from tests.runtime.support import make_views
from tests.runtime.test_state_tables import views_and_spend_topology

TOPOLOGY = "tests.dagster.test_aggregation_job:views_topology"


def views_topology():
    """The job as a YAML component names it: an import path to a function of no arguments."""
    return views_and_spend_topology("views", "counts", "spend")


def test_the_yaml_components_fields_declare_state_tables():
    component = StreamingJobComponent.model_validate({
        "name": "views", "topology": TOPOLOGY, "delta_state_tables": ["counts"],
    })  # fmt: skip
    with pytest.raises(Exception, match="delta_state_tables \\['nope'\\] are not sink topics"):
        StreamingJobComponent.model_validate({
            "name": "views", "topology": TOPOLOGY, "delta_state_tables": ["nope"],
        }).spec()  # fmt: skip
    spec = component.spec()
    assert spec.delta_state_tables == ("counts",)
    assert spec.kafka_sink_topics() == ["spend"]  # counts is a Delta table, not a Kafka topic


@pytest.mark.slow  # ~1 min: a Dagster run of a Spark job
@pytest.mark.broker
@pytest.mark.spark
def test_an_aggregation_job_reports_dropped_records_and_its_state_tables_rows(
    spark, kafka_settings, tmp_path
):
    tag = uuid.uuid4().hex[:6]
    source, counts, spend = f"views-{tag}", f"counts-{tag}", f"spend-{tag}"
    create_topics(kafka_settings, [TopicSpec(source, 3), TopicSpec(spend, 3)])
    make_views(kafka_settings, source, 300)
    job = StreamingJobSpec(
        name="views_per_user", application_id=f"views-{tag}",
        topology=functools.partial(views_and_spend_topology, source, counts, spend),
        delta_state_tables=[counts],
    )  # fmt: skip
    resource = StreamplatformResource(
        kafka=KafkaConnection(bootstrap_servers=kafka_settings["bootstrap.servers"]),
        delta_root=str(tmp_path / "delta"), state_dir=str(tmp_path / "state"),
    )  # fmt: skip
    defs = streaming_definitions([job], resource=resource)
    with dg.instance_for_test() as instance:
        result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("views_per_user")]
        )
        assert result.success
        (event,) = [e for e in result.get_asset_materialization_events()
                    if e.asset_key == dg.AssetKey("views_per_user")]  # fmt: skip
        metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert metadata["rows_in"] == 300
    assert metadata["dropped_records"] > 0  # the late views (make_views sends some)
    # Six users, windows of 10 s over ~5 minutes of views: one row per user and window closed.
    assert 6 * 10 < metadata[f"{counts}_state_rows"] < 6 * 40
