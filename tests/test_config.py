"""StreamsConfig: Kafka Streams' names and aliases, typed, validated, errors naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamplatform.config import ConfigError, StreamsConfig, reference_markdown


def test_defaults_and_types():
    config = StreamsConfig({"application.id": "app", "commit.interval.ms": "250"})
    assert config["commit.interval.ms"] == 250
    assert config["processing.guarantee"] == "exactly_once_v2"  # the platform's default
    assert config["default.deserialization.exception.handler"] == "log_and_fail"
    assert config["processing.exception.handler"] == "log_and_fail"
    with_dlq = StreamsConfig({"application.id": "app", "errors.dead.letter.queue.topic.name": "d"})
    assert with_dlq["default.deserialization.exception.handler"] == "log_and_continue"
    assert with_dlq["processing.exception.handler"] == "log_and_continue"
    assert with_dlq["default.production.exception.handler"] == "log_and_fail"
    chosen = StreamsConfig({"application.id": "app", "errors.dead.letter.queue.topic.name": "d",
                            "processing.exception.handler": "log_and_fail"})  # fmt: skip
    assert chosen["processing.exception.handler"] == "log_and_fail"
    assert config["errors.dead.letter.queue.topic.name"] is None
    assert config["statestore.uncommitted.max.records"] is None
    assert config["rack.aware.assignment.tags"] == ()


def test_commit_interval_default_follows_the_guarantee():
    alos = StreamsConfig({"application.id": "a", "processing.guarantee": "at_least_once"})
    assert alos["commit.interval.ms"] == 30_000
    assert not alos.exactly_once
    eos = StreamsConfig({"application.id": "a"})
    assert eos["commit.interval.ms"] == 100
    assert eos.exactly_once


def test_kip_draft_aliases_are_accepted():
    config = StreamsConfig(
        {
            "application.id": "a",
            "errors.deadletterqueue.topic.name": "dlq",
            "instance.tag.zone": "eu-1a",
            "standby.task.assignment.awareness": "zone, cluster",
        }
    )
    assert config["errors.dead.letter.queue.topic.name"] == "dlq"
    assert config["errors.deadletterqueue.topic.name"] == "dlq"
    assert config.client_tags == {"zone": "eu-1a"}
    assert config["rack.aware.assignment.tags"] == ("zone", "cluster")


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"commit.intervall.ms": 5}, "commit.intervall.ms: unknown setting (did you mean commit.interval.ms?)"),
        ({"commit.interval.ms": "soon"}, "commit.interval.ms='soon': expected an integer >= 0"),
        ({"commit.interval.ms": -1}, "commit.interval.ms=-1"),
        ({"num.standby.replicas": True}, "num.standby.replicas=True"),
        ({"processing.guarantee": "exactly_once"}, "processing.guarantee='exactly_once': expected one of"),
        ({"processing.exception.handler": "no.such.Module"}, "processing.exception.handler='no.such.Module': cannot import"),
        ({"client.tag.zone": "x" * 31}, "client.tag.zone: tag values are at most 30"),
        ({"client.tag." + "k" * 21: "v"}, "tag keys are at most 20"),
        ({"errors.dead.letter.queue.topic.name": "a", "errors.deadletterqueue.topic.name": "b"}, "given twice"),
        ({"statestore.uncommitted.max.bytes": 0}, "statestore.uncommitted.max.bytes=0"),
        ({"rocksdb.config.setter": "no.such.Setter"}, "rocksdb.config.setter='no.such.Setter': cannot import"),
        ({"rocksdb.config.setter": "collections.OrderedDict"}, "'collections.OrderedDict' is not a class with a set_config("),
        ({"rocksdb.config.setter": "tests.state.test_state_rocksdb_settings.NeedsArguments"}, "cannot be instantiated without arguments"),
        ({"rocksdb.config.setter": 5}, "rocksdb.config.setter=5: expected a non-empty string"),
        ({"platform.rocksdb.block.cache.bytes": 0}, "platform.rocksdb.block.cache.bytes=0: expected an integer >= 1"),
        ({"platform.rocksdb.write.buffer.bytes": "16MB"}, "platform.rocksdb.write.buffer.bytes='16MB'"),
        ({"platform.versioned.history.cache.bytes": -1}, "platform.versioned.history.cache.bytes=-1"),
        ({"platform.rocksdb.block.cache.bytes": 1 << 20, "platform.rocksdb.write.buffer.manager.bytes": 2 << 20}, "platform.rocksdb.write.buffer.manager.bytes=2097152 is more than platform.rocksdb.block.cache.bytes=1048576"),
    ],
)  # fmt: skip
def test_bad_settings_stop_start_up_naming_the_setting(settings, named):
    with pytest.raises(ConfigError) as error:
        StreamsConfig({"application.id": "a", **settings})
    assert named in str(error.value)


def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as error:
        StreamsConfig({"num.standby.replicas": -2, "nope": 1})
    message = str(error.value)
    assert "application.id: required" in message
    assert "num.standby.replicas=-2" in message
    assert "nope: unknown setting" in message


def test_at_most_five_client_tags():
    tags = {f"client.tag.t{i}": "v" for i in range(6)}
    with pytest.raises(ConfigError, match="at most 5 tags"):
        StreamsConfig({"application.id": "a", **tags})


def test_store_option_settings_default_to_store_options_defaults():
    from streamplatform.config import STORE_OPTION_SETTINGS
    from streamplatform.state import StoreOptions

    config = StreamsConfig({"application.id": "a"})
    defaults = StoreOptions()
    for name, field in STORE_OPTION_SETTINGS.items():
        assert config[name] == getattr(defaults, field), name
    assert config["rocksdb.config.setter"] is None
    given = StreamsConfig({"application.id": "a", "platform.rocksdb.block.cache.bytes": "1048576",
                           "platform.rocksdb.write.buffer.manager.bytes": "524288"})  # fmt: skip
    assert given["platform.rocksdb.block.cache.bytes"] == 1 << 20  # typed from a --set string
    assert StreamsConfig(given.to_dict()) == given
    small = StreamsConfig({"application.id": "a", "platform.rocksdb.block.cache.bytes": 1 << 20})
    assert small["platform.rocksdb.write.buffer.manager.bytes"] == 1 << 19  # half the cache


def test_custom_handler_import_path_is_checked_at_start():
    config = StreamsConfig(
        {"application.id": "a", "processing.exception.handler": "collections.OrderedDict"}
    )
    assert config["processing.exception.handler"] == "collections.OrderedDict"


def test_kafka_client_settings_pass_through_per_client():
    config = StreamsConfig(
        {
            "application.id": "a",
            "bootstrap.servers": "b:9092",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "producer.linger.ms": 5,
            "consumer.fetch.min.bytes": 10,
        }
    )
    assert config.kafka_settings("producer") == {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "linger.ms": 5,
    }
    assert "fetch.min.bytes" in config.kafka_settings("consumer")
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        StreamsConfig({"application.id": "a"}).kafka_settings()


def test_config_is_frozen():
    config = StreamsConfig({"application.id": "a"})
    with pytest.raises(TypeError):
        config["application.id"] = "b"  # type: ignore[index]


def test_reference_doc_is_generated_from_the_settings():
    doc = Path(__file__).parents[1] / "docs" / "configuration.md"
    assert doc.read_text() == reference_markdown(), (
        "docs/configuration.md is stale: run `.venv/bin/python -m streamplatform.config "
        "> docs/configuration.md`"
    )


def test_auto_offset_reset_takes_kafkas_values_and_refuses_others_naming_the_setting():
    from streamplatform.config import iso_duration_ms

    def reset(value):
        return StreamsConfig({"application.id": "a", "auto.offset.reset": value})[
            "auto.offset.reset"
        ]

    assert StreamsConfig({"application.id": "a"})["auto.offset.reset"] == "earliest"
    assert [reset(v) for v in ("earliest", "LATEST", "none")] == ["earliest", "latest", "none"]
    assert reset("by_duration:pt1h30m") == "by_duration:PT1H30M"
    assert iso_duration_ms("P1DT2H30M") == 95_400_000 and iso_duration_ms("PT0.5S") == 500
    for bad in ("smallest", "by_duration:1h", "by_duration:P", "by_duration:PT"):
        with pytest.raises(ConfigError, match="auto.offset.reset"):
            reset(bad)
