"""A registry setting means the same from Python, the CLI (``--set KEY=VALUE``: strings) and
Dagster (the resource's ``schema_registry``), and reaches the serdes of the job's sources,
sinks and stores."""

from __future__ import annotations

from streamplatform import StreamsConfig
from streamplatform.dagster import (
    SchemaRegistryConnection,
    StreamingJobSpec,
    StreamplatformResource,
)
from streamplatform.registry.serdes import registry_client
from streamplatform.serdes import Serdes
from tests.registry.formats import AVRO, AVRO_ENRICHED, enrich_topology

NAMES = ("schema.registry.url", "auto.register.schemas", "value.subject.name.strategy",
         "value.schema.id.serializer", "basic.auth.credentials.source", "basic.auth.user.info")  # fmt: skip


def test_registry_settings_mean_the_same_from_python_the_cli_and_dagster(monkeypatch) -> None:
    python = StreamsConfig({
        "application.id": "a", "schema.registry.url": "http://registry:8081",
        "auto.register.schemas": False, "value.subject.name.strategy": "RecordNameStrategy",
        "value.schema.id.serializer": "header", "basic.auth.credentials.source": "USER_INFO",
        "basic.auth.user.info": "me:secret",
    })  # fmt: skip
    cli = StreamsConfig(dict(setting.split("=", 1) for setting in [
        "application.id=a", "schema.registry.url=http://registry:8081",
        "auto.register.schemas=false",
        "value.subject.name.strategy=io.confluent.kafka.serializers.subject.RecordNameStrategy",
        "value.schema.id.serializer="
        "io.confluent.kafka.serializers.schema.id.HeaderSchemaIdSerializer",
        "basic.auth.credentials.source=USER_INFO", "basic.auth.user.info=me:secret",
    ]))  # fmt: skip
    resource = StreamplatformResource(
        schema_registry=SchemaRegistryConnection(
            url="http://registry:8081",
            settings={
                "auto.register.schemas": "false",
                "value.subject.name.strategy": "RecordNameStrategy",
                "value.schema.id.serializer": "header",
                "basic.auth.credentials.source": "USER_INFO",
                "basic.auth.user.info": "me:secret",
            },
        ),  # fmt: skip
    )
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker:9092")
    spec = StreamingJobSpec(name="a", topology=lambda: enrich_topology(AVRO))
    dagster = StreamsConfig(resource.job_settings(spec))
    for name in NAMES:
        assert python[name] == cli[name] == dagster[name], name
    # The serdes of the job take them: the same subject and id format from each.
    conf = []
    for config in (python, cli, dagster):
        serde = Serdes.avro(AVRO_ENRICHED)
        serde.configure(config)
        made = serde._serializer_conf(False)
        conf.append((made["auto.register.schemas"], made["subject.name.strategy"].__name__,
                     made["schema.id.serializer"].__name__))  # fmt: skip
    assert (
        conf[0]
        == conf[1]
        == conf[2]
        == (False, "record_subject_name_strategy", "header_schema_id_serializer")
    )


def test_dagster_takes_the_registry_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", "mock://from-env")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker:9092")
    spec = StreamingJobSpec(name="a", topology=lambda: enrich_topology(AVRO))
    settings = StreamplatformResource().job_settings(spec)
    assert settings["schema.registry.url"] == "mock://from-env"
    assert registry_client(settings).get_subjects() == []  # a mock: nothing registered yet
