"""Registry serdes in the TopologyTestDriver, against the in-process mock registry
(``mock://<scope>``): what a user's job does with Avro, Protobuf and JSON Schema topics.
The same topologies against the real local registry and on Spark: test_registry_on_spark.py."""

from __future__ import annotations

import pickle
import socket
from typing import Any

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.config import ConfigError
from streamplatform.errors.exceptions import StreamsError
from streamplatform.registry.serdes import RegistryUnavailableError, registry_client
from streamplatform.serdes import SerdeContext, Serdes, SerializationError
from tests.registry.formats import (
    AVRO,
    AVRO_ENRICHED,
    AVRO_TX,
    AVRO_TX_V2,
    FORMATS,
    START,
    Format,
    enrich_topology,
    expected_enriched,
    inputs,
    poison_values,
)


def _settings(scope: str, **more: Any) -> dict[str, Any]:
    return {"application.id": "registry-test", "schema.registry.url": f"mock://{scope}",
            "errors.dead.letter.queue.topic.name": "dlq", **more}  # fmt: skip


def _run(fmt: Format, settings: dict[str, Any], raw: list[bytes] = ()) -> tuple[list, list]:
    """The enrich job on the formats' inputs (and raw transaction values): its output as
    (key, plain value, timestamp), and the DLQ's values."""
    rates, txs = inputs(fmt)
    with TopologyTestDriver(enrich_topology(fmt), settings) as driver:
        rate_topic = driver.create_input_topic("fx-rates", Serdes.string(), fmt.rate_serde())
        for key, value, timestamp in rates:
            rate_topic.pipe_input(key, value, timestamp=timestamp)
        tx_topic = driver.create_input_topic("transactions", Serdes.string(), fmt.tx_serde())
        for key, value, timestamp in txs:
            tx_topic.pipe_input(key, value, timestamp=timestamp)
        for value in raw:
            tx_topic.pipe_raw(b"alice", value, timestamp=START + 50_000)
        out = driver.create_output_topic("enriched", Serdes.string(), fmt.enriched_serde())
        enriched = [(r.key, fmt.plain(r.value), r.timestamp) for r in out.read_records_to_list()]
        dlq = driver.create_output_topic("dlq", Serdes.bytes(), Serdes.bytes())
        return enriched, [r.value for r in dlq.read_records_to_list()]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_dedup_and_temporal_join_job_runs_on_registry_formats(fmt: Format) -> None:
    enriched, dlq = _run(fmt, _settings(f"job-{fmt.name}"))
    assert enriched == expected_enriched(fmt)
    assert dlq == []
    # The sink's records went through the registry: its subject holds the output schema.
    client = registry_client({"schema.registry.url": f"mock://job-{fmt.name}"})
    assert "enriched-value" in client.get_subjects()
    assert "transactions-value" in client.get_subjects()


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_poison_records_reach_the_dlq_once_with_their_raw_bytes(fmt: Format) -> None:
    scope = f"poison-{fmt.name}"
    poison = poison_values(fmt, f"mock://{scope}")
    enriched, dlq = _run(fmt, _settings(scope, **{"processing.guarantee": "exactly_once_v2"}),
                         raw=poison)  # fmt: skip
    assert dlq == poison  # each once, in order, untouched
    assert enriched == expected_enriched(fmt)  # the good records are all there, once


def test_records_written_with_v1_and_v2_read_with_the_v2_reader_schema() -> None:
    settings = _settings("evolution")
    b = StreamsBuilder()
    b.stream("tx", Serdes.string(), Serdes.avro(AVRO_TX_V2)).to(
        "out", Serdes.string(), Serdes.avro(AVRO_TX_V2)
    )
    with TopologyTestDriver(b.build(), settings) as driver:
        v1 = driver.create_input_topic("tx", Serdes.string(), Serdes.avro(AVRO_TX))
        v2 = driver.create_input_topic("tx", Serdes.string(), Serdes.avro(AVRO_TX_V2))
        v1.pipe_input("a", {"id": 1, "amount": 1.0}, timestamp=1)
        v2.pipe_input("a", {"id": 2, "amount": 2.0, "currency": "USD"}, timestamp=2)
        v1.pipe_input("a", {"id": 3, "amount": 3.0}, timestamp=3)
        out = driver.create_output_topic("out", Serdes.string(), Serdes.avro(AVRO_TX_V2))
        assert out.read_values_to_list() == [
            {"id": 1, "amount": 1.0, "currency": "EUR"},  # the v2 default filled in
            {"id": 2, "amount": 2.0, "currency": "USD"},
            {"id": 3, "amount": 3.0, "currency": "EUR"},
        ]
    # Both versions were registered under the topic's subject.
    client = registry_client({"schema.registry.url": "mock://evolution"})
    assert sorted(client.get_versions("tx-value")) == [1, 2]
    # A v1 reader reads v2 records too (the added field dropped): reader_schema=.
    old_reader = Serdes.avro(AVRO_TX_V2, reader_schema=AVRO_TX,
                             registry={"schema.registry.url": "mock://evolution"})  # fmt: skip
    data = old_reader.serialize({"id": 4, "amount": 4.0, "currency": "CHF"},
                                SerdeContext("tx", False, []))  # fmt: skip
    assert old_reader.deserialize(data, SerdeContext("tx", False, [])) == {"id": 4, "amount": 4.0}


def test_header_schema_ids_are_written_and_read_and_an_old_one_replaced() -> None:
    """Both id formats: the source written with ids in headers, the sink in the classic
    prefix; a record whose old bytes came with a schema-id header does not keep it (it would
    name the wrong schema for the new bytes). Small records too (confluent-kafka's Avro
    deserializer refuses 5 bytes or less before it looks at the headers)."""
    small = '{"type": "record", "name": "S", "fields": [{"name": "n", "type": "int"}]}'
    settings = _settings("headers")
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.avro(small)).map_values(lambda v: v).to(
        "out", Serdes.string(), Serdes.avro(small)
    )
    b.stream("in2", Serdes.string(), Serdes.avro(small)).to(
        "out2", Serdes.string(), Serdes.avro(small, schema_id_format="header")
    )
    with TopologyTestDriver(b.build(), settings) as driver:
        written = Serdes.avro(small, schema_id_format="header")
        source = driver.create_input_topic("in", Serdes.string(), written)
        source.pipe_input("k", {"n": 5}, timestamp=1, headers=[("trace", b"1")])
        out = driver.create_output_topic("out", Serdes.string(), Serdes.avro(small))
        [record] = out.read_records_to_list()
        assert record.value == {"n": 5}
        assert record.headers == [("trace", b"1")]  # the source's schema-id header is gone
        driver.create_input_topic("in2", Serdes.string(), Serdes.avro(small)).pipe_input(
            "k", {"n": 6}, timestamp=2
        )
        [raw] = driver.create_output_topic("out2", Serdes.bytes(), Serdes.bytes())\
            .read_records_to_list()  # fmt: skip
        assert [name for name, _ in raw.headers] == ["__value_schema_id"]
        assert raw.value == b"\x0c"  # the bare Avro int 6: the id is in the header
        reader = Serdes.avro(small)
        reader.configure(settings)
        assert reader.deserialize(raw.value, SerdeContext("out2", False, raw.headers)) == {"n": 6}


def test_a_truncated_small_header_format_record_fails_instead_of_reading_padding() -> None:
    small = '{"type": "record", "name": "S", "fields": [{"name": "a", "type": "int"},' \
            ' {"name": "b", "type": "int"}]}'  # fmt: skip
    serde = Serdes.avro(small, schema_id_format="header",
                        registry={"schema.registry.url": "mock://small"})  # fmt: skip
    headers: list = []
    data = serde.serialize({"a": 1, "b": 2}, SerdeContext("t", False, headers))
    assert data == b"\x02\x04"
    assert serde.deserialize(data, SerdeContext("t", False, headers)) == {"a": 1, "b": 2}
    with pytest.raises(SerializationError) as failure:
        serde.deserialize(data[:1], SerdeContext("t", False, headers))
    assert failure.value.raw == b"\x02"


@pytest.mark.parametrize(
    ("strategy", "subject"),
    [("TopicNameStrategy", "out-value"), ("RecordNameStrategy", "payments.Enriched"),
     ("io.confluent.kafka.serializers.subject.TopicRecordNameStrategy",
      "out-payments.Enriched")],
)  # fmt: skip
def test_subject_name_strategies(strategy: str, subject: str) -> None:
    scope = f"strategy-{strategy.rsplit('.', 1)[-1]}"
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.json()).to(
        "out", Serdes.string(), Serdes.avro(AVRO_ENRICHED)
    )
    settings = _settings(scope, **{"value.subject.name.strategy": strategy})
    with TopologyTestDriver(b.build(), settings) as driver:
        driver.create_input_topic("in", Serdes.string(), Serdes.json()).pipe_input(
            "k", {"id": 1, "amount": 2.0, "eur": 1.0}
        )
    assert registry_client({"schema.registry.url": f"mock://{scope}"}).get_subjects() == [subject]


def test_without_auto_registration_the_subject_must_hold_the_schema() -> None:
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.json()).to(
        "out", Serdes.string(), Serdes.avro(AVRO_ENRICHED)
    )
    settings = _settings("no-auto", **{"auto.register.schemas": "false"})
    value = {"id": 1, "amount": 2.0, "eur": 1.0}
    with TopologyTestDriver(b.build(), settings) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.json())
        with pytest.raises(
            StreamsError, match="auto.register.schemas=false"
        ):  # log_and_fail: production
            source.pipe_input("k", value)
        assert driver.create_output_topic("out", Serdes.bytes(), Serdes.bytes()).is_empty()
    from confluent_kafka.schema_registry import Schema

    client = registry_client({"schema.registry.url": "mock://no-auto"})
    client.register_schema("out-value", Schema(AVRO_ENRICHED, "AVRO"))
    with TopologyTestDriver(b.build(), settings) as driver:
        driver.create_input_topic("in", Serdes.string(), Serdes.json()).pipe_input("k", value)
        out = driver.create_output_topic("out", Serdes.string(), Serdes.avro(AVRO_ENRICHED))
        assert out.read_values_to_list() == [value]
    assert client.get_subjects() == ["out-value"]  # nothing registered by the job


def test_an_unreachable_registry_fails_the_task_and_sends_nothing_to_the_dlq() -> None:
    """A registry that is down is not the record's fault: the task fails (the batch is
    retried on Spark) instead of every record going to the DLQ."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    settings = {"application.id": "down", "schema.registry.url": url,
                "errors.dead.letter.queue.topic.name": "dlq"}  # fmt: skip
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.avro(AVRO_TX)).to("out", Serdes.string(), Serdes.json())
    with TopologyTestDriver(b.build(), settings) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.bytes())
        with pytest.raises(RegistryUnavailableError, match=url):
            source.pipe_input("k", b"\x00\x00\x00\x00\x01\x02\x00")
        assert driver.create_output_topic("dlq", Serdes.bytes(), Serdes.bytes()).is_empty()


def test_a_registry_serde_without_a_registry_stops_the_job_naming_the_setting() -> None:
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.avro(AVRO_TX)).to("out")
    with (
        pytest.raises(ConfigError, match="schema.registry.url"),
        TopologyTestDriver(b.build(), {"application.id": "no-url"}) as driver,
    ):
        driver.create_input_topic("in", Serdes.string(), Serdes.bytes()).pipe_input("k", b"x")


def test_wrong_registry_settings_are_refused_at_start() -> None:
    from streamplatform import StreamsConfig

    with pytest.raises(ConfigError, match="value.subject.name.strategy"):
        StreamsConfig({"application.id": "a", "value.subject.name.strategy": "Nope"})
    with pytest.raises(ConfigError, match="auto.register.schemas"):
        StreamsConfig({"application.id": "a", "auto.register.schemas": "maybe"})
    with pytest.raises(ConfigError, match="registry="):
        Serdes.avro(AVRO_TX, registry={"bootstrap.servers": "x"})
    with pytest.raises(ConfigError, match="schema.id.serializer"):
        Serdes.avro(AVRO_TX, schema_id_format="trailer")
    with pytest.raises(ValueError, match="not JSON"):
        Serdes.avro("{not a schema")
    with pytest.raises(TypeError, match="generated message class"):
        Serdes.protobuf(dict)
    shown = repr(StreamsConfig({"application.id": "a", "basic.auth.user.info": "me:secret"}))
    assert "secret" not in shown


def test_a_users_serde_gets_its_context_and_the_jobs_settings() -> None:
    """The serde interface's context, for users' own serdes: the topic, key or value, and
    the headers (which a serializer may add to); ``configure`` gets the job's settings."""

    class Tagged:
        name = "tagged"
        uses_context = True

        def __init__(self) -> None:
            self.seen: list[tuple] = []
            self.settings: dict = {}

        def configure(self, settings: Any) -> None:
            self.settings = dict(settings)

        def serialize(self, value: Any, context: SerdeContext | None = None) -> bytes | None:
            assert context is not None
            self.seen.append(("ser", context.topic, context.is_key, list(context.headers or [])))
            if context.headers is not None:
                context.headers.append(("tag", context.topic.encode()))
            return None if value is None else value.encode()

        def deserialize(self, data: bytes | None, context: SerdeContext | None = None) -> Any:
            assert context is not None
            self.seen.append(("de", context.topic, context.is_key, list(context.headers or [])))
            return None if data is None else data.decode()

    key_serde, value_serde = Tagged(), Tagged()
    b = StreamsBuilder()
    b.stream("in", key_serde, value_serde).to("out", key_serde, value_serde)
    with TopologyTestDriver(b.build(), {"application.id": "ctx", "commit.interval.ms": 7}) as d:
        d.create_input_topic("in", Serdes.string(), Serdes.string()).pipe_input(
            "k", "v", headers=[("h", b"1")]
        )
        [record] = d.create_output_topic("out", Serdes.string(), Serdes.string())\
            .read_records_to_list()  # fmt: skip
    assert value_serde.settings["commit.interval.ms"] == 7
    assert key_serde.seen == [("de", "in", True, [("h", b"1")]),
                              ("ser", "out", True, [("h", b"1")])]  # fmt: skip
    assert value_serde.seen == [("de", "in", False, [("h", b"1")]),
                                ("ser", "out", False, [("h", b"1"), ("tag", b"out")])]  # fmt: skip
    assert record.headers == [("h", b"1"), ("tag", b"out"), ("tag", b"out")]


def test_a_registry_serde_pickles_without_its_client() -> None:
    serde = AVRO.tx_serde()
    serde.configure({"schema.registry.url": "mock://pickle"})
    data = serde.serialize({"id": 1, "amount": 1.0}, SerdeContext("t", False, []))
    copy = pickle.loads(pickle.dumps(serde))
    assert copy._serializers == {} and copy._deserializer is None
    assert copy.deserialize(data, SerdeContext("t", False, [])) == {"id": 1, "amount": 1.0}


def test_the_job_fingerprint_covers_a_registry_serdes_schema_not_its_client() -> None:
    """A replay is refused when the job changed (runtime/fingerprint.py): a registry serde
    counts by its schema and options; its client, caches and the registry's address do not
    (they change once it has run, and between environments)."""
    from streamplatform.runtime.fingerprint import job_fingerprint

    def topology(schema: str, serde: Any = None) -> Any:
        b = StreamsBuilder()
        b.stream("in", Serdes.string(), serde or Serdes.avro(schema)).to("out")
        return b.build()

    settings = {"application.id": "fp"}
    used = Serdes.avro(AVRO_TX)
    before = job_fingerprint(topology(AVRO_TX, used), settings)
    used.configure({"schema.registry.url": "mock://fingerprint"})
    used.serialize({"id": 1, "amount": 1.0}, SerdeContext("in", False, []))
    assert job_fingerprint(topology(AVRO_TX, used), settings) == before
    assert job_fingerprint(topology(AVRO_TX_V2), settings) != before
    header = settings | {"value.schema.id.serializer": "header"}
    assert job_fingerprint(topology(AVRO_TX), header) != before
    assert job_fingerprint(topology(AVRO_TX), settings | {"schema.registry.url": "x"}) == before


def test_registry_keys_and_reading_with_the_writers_schema() -> None:
    """A registry serde on keys (subject ``<topic>-key``); a serde without a schema reads
    with the writer's and writes with the subject's latest schema (use_latest_version)."""
    key_schema = '{"type": "record", "name": "Account", "fields": [{"name": "n", "type": "long"}]}'
    settings = _settings("keys")
    b = StreamsBuilder()
    b.stream("in", Serdes.avro(key_schema), Serdes.avro()).to(
        "out", Serdes.avro(key_schema), Serdes.avro(use_latest_version=True)
    )
    client = registry_client({"schema.registry.url": "mock://keys"})
    from confluent_kafka.schema_registry import Schema

    client.register_schema("out-value", Schema(AVRO_TX, "AVRO"))
    with TopologyTestDriver(b.build(), settings) as driver:
        source = driver.create_input_topic("in", Serdes.avro(key_schema), Serdes.avro(AVRO_TX))
        source.pipe_input({"n": 1}, {"id": 5, "amount": 2.5}, timestamp=START)
        out = driver.create_output_topic("out", Serdes.avro(key_schema), Serdes.avro(AVRO_TX))
        assert out.read_key_values_to_list() == [({"n": 1}, {"id": 5, "amount": 2.5})]
    assert sorted(client.get_subjects()) == ["in-key", "in-value", "out-key", "out-value"]
    assert client.get_versions("out-value") == [1]  # written with it, nothing registered
    with pytest.raises(ConfigError, match="without a schema can only read"):
        Serdes.avro(registry={"schema.registry.url": "mock://keys"}).serialize(
            {"id": 1}, SerdeContext("t", False, [])
        )


@pytest.mark.registry
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_process_asks_the_registry_once_per_schema(
    fmt: Format, schema_registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One client per registry in a process, shared by its serdes, caching schemas: records
    of one schema cost one request to the (real) registry, however many serdes and records,
    as in a Spark worker."""
    settings = {"schema.registry.url": schema_registry.url}
    topic = f"once-{fmt.name}"
    writer = fmt.tx_serde()
    writer.configure(settings)
    data = [writer.serialize(fmt.tx(i, float(i)), SerdeContext(topic, False, []))
            for i in range(50)]  # fmt: skip
    client = registry_client(settings)
    client._cache = type(client._cache)()  # a fresh process: nothing known yet
    requests: list = []
    rest = client._rest_client
    original = rest.send_request

    def counted(*args: Any, **kwargs: Any) -> Any:
        requests.append(args[:2])
        return original(*args, **kwargs)

    monkeypatch.setattr(rest, "send_request", counted)
    readers = [fmt.tx_serde() for _ in range(3)]
    for reader in readers:
        reader.configure(settings)
        for raw in data:
            reader.deserialize(raw, SerdeContext(topic, False, []))
    assert all(reader.client() is client for reader in readers)
    assert len(requests) == 1, requests  # the schema by its id, once


def test_the_avro_fast_path_writes_and_reads_what_confluents_serdes_do() -> None:
    """After a topic's first record, the Avro serde calls fastavro itself (registry/serdes.py,
    _AvroPlans): the bytes are confluent-kafka's AvroSerializer's, and its AvroDeserializer
    reads the same values from them."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    settings = {"schema.registry.url": "mock://fast"}
    ours = Serdes.avro(AVRO_TX_V2, registry=settings)
    client = registry_client(settings)
    theirs = AvroSerializer(client, AVRO_TX_V2)
    ctx = SerializationContext("fast", MessageField.VALUE, [])
    values = [{"id": i, "amount": i / 3, "currency": "é" * i} for i in range(5)]
    written = [ours.serialize(v, SerdeContext("fast", False, [])) for v in values]
    assert written == [theirs(v, ctx) for v in values]
    assert [ours.deserialize(d, SerdeContext("fast", False, [])) for d in written] == values
    assert [AvroDeserializer(client)(d, ctx) for d in written] == values
    with pytest.raises(SerializationError, match="cannot serialize"):  # the schema refuses it
        ours.serialize({"id": 1, "amount": "x", "currency": "a"}, SerdeContext("fast", False, []))
