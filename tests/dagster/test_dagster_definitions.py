"""The example code location loads and holds what the UI shows; its configuration and resources
come from the environment; the schedule and the late-version backfill sensor evaluate (no
broker, no Spark: the sensor reads materialization metadata only)."""

from __future__ import annotations

import doctest
import sys

import dagster as dg
import pytest
from dagster_pyspark import LazyPySparkResource

import assets.dedup_audit
import definitions
import streamplatform.dagster.lateness
from jobs import in_process
from resources import MissionConfig, build_resources
from streamplatform.dagster import StreamplatformResource

SNAPSHOT = "transactions_enrichment_fx_rates_versions"
BACKFILL_SENSOR = f"{SNAPSHOT}_late_backfill"


def test_definitions_load_and_validate():
    defs = definitions.defs
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == {
        "kafka/transactions", "kafka/fx-rates", "kafka/transactions-deduplicated",
        "transactions_deduplicated", "transactions_enrichment", SNAPSHOT,
        "transactions_enriched", "standby_placements",
    }  # fmt: skip
    assert {key.to_user_string() for key in graph.external_asset_keys} == {
        "kafka/transactions",
        "kafka/fx-rates",
    }
    # The dedup job writes the topic the enrichment reads: one lineage.
    assert graph.get(dg.AssetKey("transactions_enrichment")).parent_keys == {
        dg.AssetKey(["kafka", "fx-rates"]), dg.AssetKey(["kafka", "transactions-deduplicated"])
    }  # fmt: skip
    checks = {(key.asset_key.to_user_string(), key.name) for key in graph.asset_check_keys}
    streaming = {"caught_up", "dlq_ratio", "offsets_contiguous"}
    assert checks == {
        *{("transactions_deduplicated", name) for name in streaming},
        *{("transactions_enrichment", name) for name in streaming},
        ("transactions_deduplicated", "no_duplicates_within_interval"),
        ("transactions_enriched", "stream_equals_batch_join"),
    }
    streaming_jobs = ("transactions_deduplicated", "transactions_enrichment")
    assert {job.name for job in defs.jobs} == {
        "transactions_deduplicated_dlq_replay", "transactions_enrichment_dlq_replay",
        "transactions_deduplicated_maintenance", "transactions_enrichment_maintenance",
        "enriched_backfill",
    }  # fmt: skip
    schedules = {s.name: s for s in defs.schedules}
    assert set(schedules) == {f"{job}_{kind}_schedule" for job in streaming_jobs
                              for kind in ("dlq_replay", "maintenance")}  # fmt: skip
    for name, schedule in schedules.items():
        assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
        daily = name.endswith("_maintenance_schedule")
        assert schedule.cron_schedule == ("0 3 * * *" if daily else "*/15 * * * *")
    sensors = {s.name: s for s in defs.sensors}
    assert set(sensors) == {"transactions_deduplicated_lag", "transactions_enrichment_lag",
                            BACKFILL_SENSOR}  # fmt: skip
    assert sensors[BACKFILL_SENSOR].default_status == dg.DefaultSensorStatus.RUNNING
    assert sensors["transactions_deduplicated_lag"].default_status == dg.DefaultSensorStatus.STOPPED


def test_every_job_runs_in_one_process():
    """One JVM per run: the in-process executor everywhere."""
    defs = definitions.defs
    for job in defs.resolve_all_job_defs():
        assert job.executor_def is dg.in_process_executor, job.name


def test_topics_and_application_ids_are_configuration(monkeypatch):
    monkeypatch.setenv("STREAMPLATFORM_TOPIC_PREFIX", "team-a")
    monkeypatch.setenv("STREAMPLATFORM_DEDUP_APPLICATION_ID", "team-a-dedup")
    monkeypatch.setenv("STREAMPLATFORM_MAX_RECORDS_PER_BATCH", "500")
    mission = MissionConfig.from_env()
    assert mission.topics.transactions == "team-a-transactions"
    assert mission.topics.enriched == "team-a-transactions-enriched"
    defs = definitions.build_definitions(mission)
    dedup, enrichment = definitions.mission_jobs(mission)
    assert (dedup.app_id, enrichment.app_id) == ("team-a-dedup", "transactions-enrichment")
    assert dedup.source_topics() == ["team-a-transactions"]
    assert dedup.settings["platform.max.records.per.batch"] == 500
    assert definitions.pools(defs) == {"streamplatform/team-a-dedup",
                                       "streamplatform/transactions-enrichment"}  # fmt: skip
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"kafka/team-a-transactions", "kafka/team-a-transactions-deduplicated"} <= keys


def test_resources_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-1:9092,broker-2:9092")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SPARK_MASTER", "spark://cluster:7077")
    monkeypatch.setenv("STREAMPLATFORM_DELTA_ROOT", "s3a://bucket/streams")
    resource = build_resources()["streamplatform"]
    assert isinstance(resource, StreamplatformResource)
    assert resource.kafka_settings() == {
        "bootstrap.servers": "broker-1:9092,broker-2:9092",
        "security.protocol": "SASL_SSL",
    }
    # Spark: dagster-pyspark's lazy resource on that master, with the platform's settings.
    assert isinstance(resource.spark, LazyPySparkResource)
    conf = resource.spark.spark_config
    assert conf["spark.master"] == "spark://cluster:7077"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert "delta-spark" in conf["spark.jars"] and "spark-sql-kafka" in conf["spark.jars"]
    assert conf["spark.pyspark.python"] == sys.executable
    [dedup, _] = definitions.mission_jobs(MissionConfig())
    assert resource.app_root(dedup) == "s3a://bucket/streams/transactions-dedup"


def test_no_broker_anywhere_is_a_readable_error(monkeypatch, tmp_path):
    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path))
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(ConnectionError, match="KAFKA_BOOTSTRAP_SERVERS"):
        StreamplatformResource().kafka_settings()


def test_the_schedules_evaluate_to_dlq_replay_runs():
    defs = definitions.defs
    with dg.instance_for_test() as instance:
        for job in ("transactions_deduplicated", "transactions_enrichment"):
            tick = in_process.tick(defs, instance, f"{job}_dlq_replay_schedule")
            [request] = tick.run_requests
            assert request.run_config == {}  # defaults: 3 attempts, parked records stay
            assert defs.resolve_schedule_def(f"{job}_dlq_replay_schedule").job_name == (
                f"{job}_dlq_replay"
            )


def test_backfill_sensor_turns_late_days_into_partition_runs_once():
    defs = definitions.defs
    with dg.instance_for_test() as instance:
        for days in (["2026-01-03", "2025-12-30"], [], ["2026-01-03", "2026-01-04"]):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    asset_key=SNAPSHOT, metadata={"late_days": dg.MetadataValue.json(days)}
                )
            )
        result = in_process.tick(defs, instance, BACKFILL_SENSOR)
        # 2025-12-30 is before the first partition: skipped, not requested.
        # A day named twice in one tick is recomputed once, by the newest materialization.
        assert [r.partition_key for r in result.run_requests] == ["2026-01-03", "2026-01-04"]
        assert len({r.run_key for r in result.run_requests}) == 2
        assert defs.resolve_sensor_def(BACKFILL_SENSOR).job_name == "enriched_backfill"
        again = in_process.tick(defs, instance, BACKFILL_SENSOR, cursor=result.cursor)
        assert not again.run_requests


@pytest.mark.parametrize("module", [streamplatform.dagster.lateness, assets.dedup_audit])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def test_kafka_secrets_come_from_envvars_and_reach_the_jobs_settings_only(monkeypatch):
    """docs/security.md: the non-secret settings in KafkaConnection.settings, the secrets in
    fields of their own, from EnvVar; they reach the job's settings, in the Java names."""
    import dagster as dg

    from streamplatform.dagster import KafkaConnection, StreamingJobSpec

    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="app" '
            'password="from-the-environment";')  # fmt: skip
    monkeypatch.setenv("KAFKA_SASL_JAAS_CONFIG", jaas)
    monkeypatch.setenv("KAFKA_TRUSTSTORE_PASSWORD", "tp")
    resource = StreamplatformResource(kafka=KafkaConnection(
        bootstrap_servers="broker-1:9093",
        settings={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                  "ssl.truststore.type": "PKCS12", "ssl.truststore.location": "/etc/trust.p12"},
        sasl_jaas_config=dg.EnvVar("KAFKA_SASL_JAAS_CONFIG"),
        ssl_truststore_password=dg.EnvVar("KAFKA_TRUSTSTORE_PASSWORD"),
    ))  # fmt: skip
    with resource.process_config_and_initialize_cm() as initialized:
        settings = initialized.job_settings(
            StreamingJobSpec(name="j", topology="pipelines:deduplication_topology")
        )
    assert settings["sasl.jaas.config"] == jaas
    assert settings["ssl.truststore.password"] == "tp"
    assert settings["ssl.truststore.location"] == "/etc/trust.p12"
    # The resource's config, as Dagster shows it, holds the variables' names, not the secrets.
    shown = repr(resource)
    assert "from-the-environment" not in shown and "KAFKA_SASL_JAAS_CONFIG" in shown


def test_an_inline_private_key_comes_from_an_envvar_like_the_passwords(monkeypatch):
    """Mutual TLS with the key inline (ssl.keystore.key, a PEM body: as secret as a password,
    kafka/security.py's SECRET_KEYS): a field of its own, given as an EnvVar; it reaches the
    job's settings under its Kafka name, and Dagster's view of the resource names the variable
    only."""
    import dagster as dg

    from streamplatform.dagster import KafkaConnection, StreamingJobSpec
    from streamplatform.kafka.security import SECRET_KEYS, redacted

    key = "-----BEGIN PRIVATE KEY-----\nMIIEvQ-not-a-real-key-body\n-----END PRIVATE KEY-----\n"
    chain = "-----BEGIN CERTIFICATE-----\nMIIC-public\n-----END CERTIFICATE-----\n"
    monkeypatch.setenv("KAFKA_SSL_KEY_PEM", key)
    resource = StreamplatformResource(kafka=KafkaConnection(
        bootstrap_servers="broker-1:9093",
        settings={"security.protocol": "SSL", "ssl.keystore.type": "PEM",
                  "ssl.keystore.certificate.chain": chain},
        ssl_keystore_key=dg.EnvVar("KAFKA_SSL_KEY_PEM"),
    ))  # fmt: skip
    with resource.process_config_and_initialize_cm() as initialized:
        settings = initialized.job_settings(
            StreamingJobSpec(name="j", topology="pipelines:deduplication_topology")
        )
    assert "ssl.keystore.key" in SECRET_KEYS  # the field's setting is one the platform hides
    assert settings["ssl.keystore.key"] == key
    assert settings["ssl.keystore.certificate.chain"] == chain
    assert "not-a-real-key-body" not in repr(redacted(settings))
    shown = repr(resource)
    assert "not-a-real-key-body" not in shown and "KAFKA_SSL_KEY_PEM" in shown
