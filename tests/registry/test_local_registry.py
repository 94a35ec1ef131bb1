"""The local Schema Registry (Apicurio Registry with Confluent's API): confluent_kafka's client
and serializers against it, what it differs in from Confluent's registry (docs/schema-registry.md,
each difference pinned by a test, so that an Apicurio upgrade that changes one shows), and its
process: ready on loopback, stopped with its whole group, never a stranger killed.

The tests marked ``registry`` share the run's registry (the ``schema_registry`` fixture, ~4 s
to start); those that start registries of their own are ``slow``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
import requests
from confluent_kafka.schema_registry import (
    ConfigCompatibilityLevel,
    Schema,
    SchemaRegistryClient,
    ServerConfig,
    header_schema_id_serializer,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from live_processes import group_members

from streamplatform import processes
from streamplatform.kafka.pytest_fixtures import RUN_FILE
from streamplatform.registry import local_registry
from streamplatform.registry.local_registry import (
    STATE_FILE,
    LocalRegistry,
    RegistryState,
    read_state,
    running_registry,
    stop_registry,
)
from streamplatform.registry.pytest_fixtures import remove_registries_of_ended_runs

uses_registry = pytest.mark.registry

USER = {"type": "record", "name": "User", "namespace": "shop",
        "fields": [{"name": "name", "type": "string"}]}  # fmt: skip
# v2: a field added with a default (BACKWARD-compatible); "bad": one added without (not).
USER_V2 = USER | {"fields": [*USER["fields"], {"name": "age", "type": "int", "default": 0}]}
USER_BAD = USER | {"fields": [*USER["fields"], {"name": "city", "type": "string"}]}
ORDER_JSON = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {"id": {"type": "integer"}, "item": {"type": "string"}}, "required": ["id"],
}  # fmt: skip

# Protobuf wire type numbers of descriptor_pb2.FieldDescriptorProto.
_STRING, _INT64, _MESSAGE, _OPTIONAL = 9, 3, 11, 1


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _client(registry: LocalRegistry, **conf: object) -> SchemaRegistryClient:
    """A client of its own, with empty caches (as another process would have)."""
    return SchemaRegistryClient({"url": registry.url} | conf)


def _avro(schema: dict) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def _value(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE, headers=[])


def _schema_id(payload: bytes) -> int:
    assert payload[0] == 0, "Confluent's wire format: magic byte 0, then the 4-byte schema id"
    return int.from_bytes(payload[1:5], "big")


def _order_message_type(tag: str) -> type:
    """A Protobuf ``Order`` in ``order_<tag>.proto`` that imports ``money_<tag>.proto`` (a file
    of ours: a schema reference) and google/protobuf/timestamp.proto (a well-known type)."""
    money = descriptor_pb2.FileDescriptorProto(
        name=f"money_{tag}.proto", package=f"money{tag}", syntax="proto3"
    )
    message = money.message_type.add(name="Money")
    message.field.add(name="cents", number=1, type=_INT64, label=_OPTIONAL)
    order = descriptor_pb2.FileDescriptorProto(
        name=f"order_{tag}.proto", package=f"shop{tag}", syntax="proto3",
        dependency=[money.name, "google/protobuf/timestamp.proto"],
    )  # fmt: skip
    message = order.message_type.add(name="Order")
    message.field.add(name="id", number=1, type=_STRING, label=_OPTIONAL)
    message.field.add(name="price", number=2, type=_MESSAGE, label=_OPTIONAL,
                      type_name=f".money{tag}.Money")  # fmt: skip
    message.field.add(name="at", number=3, type=_MESSAGE, label=_OPTIONAL,
                      type_name=".google.protobuf.Timestamp")  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(money)
    pool.Add(order)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"shop{tag}.Order"))


# --- the run's registry: Confluent's clients and serializers ---------------------------------


@uses_registry
def test_the_registry_serves_confluents_api_on_loopback_only(schema_registry):
    assert schema_registry.url.startswith("http://127.0.0.1:")
    assert schema_registry.url.endswith("/apis/ccompat/v7")
    assert requests.get(f"{schema_registry.url}/subjects", timeout=10).status_code == 200
    assert set(_client(schema_registry).get_schema_types()) == {"AVRO", "JSON", "PROTOBUF"}
    listening = [
        connection.laddr
        for connection in psutil.Process(schema_registry.state.pid).net_connections("inet")
        if connection.status == psutil.CONN_LISTEN
    ]
    ports = {address.port for address in listening}
    assert {schema_registry.state.port, schema_registry.state.management_port} <= ports
    # (A Java socket on IPv6 shows 127.0.0.1 IPv4-mapped.)
    addresses = {address.ip.removeprefix("::ffff:") for address in listening}
    assert addresses == {"127.0.0.1"}, listening


@uses_registry
def test_avro_records_round_trip_through_the_registry(schema_registry):
    topic = _unique("avro")
    serializer = AvroSerializer(_client(schema_registry), json.dumps(USER))
    payload = serializer({"name": "ada"}, _value(topic))
    registered = _client(schema_registry).get_latest_version(f"{topic}-value")
    assert registered.schema_id == _schema_id(payload) and registered.version == 1
    # A consumer elsewhere: its client fetches the writer's schema by the id in the record.
    assert AvroDeserializer(_client(schema_registry))(payload, _value(topic)) == {"name": "ada"}


@uses_registry
def test_json_schema_records_round_trip_through_the_registry(schema_registry):
    topic = _unique("json")
    serializer = JSONSerializer(json.dumps(ORDER_JSON), _client(schema_registry))
    payload = serializer({"id": 7, "item": "pen"}, _value(topic))
    schema = _client(schema_registry).get_schema(_schema_id(payload))
    assert schema.schema_type == "JSON" and json.loads(schema.schema_str) == ORDER_JSON
    deserializer = JSONDeserializer(None, schema_registry_client=_client(schema_registry))
    assert deserializer(payload, _value(topic)) == {"id": 7, "item": "pen"}
    with pytest.raises(SerializationError):  # the schema is enforced when writing
        serializer({"item": "no id"}, _value(topic))


@uses_registry
def test_protobuf_records_round_trip_with_a_schema_reference(schema_registry):
    tag = uuid.uuid4().hex[:8]
    order_type = _order_message_type(tag)
    topic = _unique("proto")
    order = order_type(id="o-1")
    order.price.cents = 250
    order.at.seconds = 1_700_000_000
    serializer = ProtobufSerializer(
        order_type, _client(schema_registry), {"use.deprecated.format": False}
    )
    payload = serializer(order, _value(topic))

    client = _client(schema_registry)
    registered = client.get_latest_version(f"{topic}-value")
    assert registered.schema_id == _schema_id(payload)
    # The imported file of ours was registered under its own subject (the reference); the
    # well-known type was not (skip.known.types).
    assert [(r.name, r.subject, r.version) for r in registered.schema.references] == [
        (f"money_{tag}.proto", f"money_{tag}.proto", 1)
    ]
    assert f"money_{tag}.proto" in client.get_subjects()
    assert "google/protobuf/timestamp.proto" not in client.get_subjects()
    # Read with the message class alone (no registry client: see the next test).
    read = ProtobufDeserializer(order_type, {"use.deprecated.format": False})(
        payload, _value(topic)
    )
    assert read == order


@uses_registry
def test_protobuf_schemas_are_not_served_in_confluents_serialized_format(schema_registry):
    """Apicurio differs: Python's ProtobufSerializer registers a schema as a base64
    FileDescriptorProto, which Apicurio keeps as given (Confluent's registry turns it into
    .proto text), and ``GET /schemas/ids/{id}?format=serialized``, which Python's Protobuf
    serdes ask for, fails for it (HTTP 500); for a schema registered as .proto text it answers
    raw bytes where Confluent's answers base64. So a ProtobufDeserializer given a registry
    client, and a ProtobufSerializer with ``use.latest.version``, fail against Apicurio."""
    tag = uuid.uuid4().hex[:8]
    order_type = _order_message_type(tag)
    topic = _unique("proto-fmt")
    config = {"use.deprecated.format": False}
    payload = ProtobufSerializer(order_type, _client(schema_registry), config)(
        order_type(id="o-2"), _value(topic)
    )
    stored = _client(schema_registry).get_schema(_schema_id(payload))
    assert "syntax" not in stored.schema_str  # base64 of the descriptor, not .proto text
    once = _client(schema_registry, **{"max.retries": 0})  # a 500 is retried otherwise
    with pytest.raises(SchemaRegistryError) as refused:
        ProtobufDeserializer(order_type, config, schema_registry_client=once)(
            payload, _value(topic)
        )
    assert refused.value.http_status_code == 500

    latest = ProtobufSerializer(
        order_type, _client(schema_registry, **{"max.retries": 0}),
        config | {"auto.register.schemas": False, "use.latest.version": True},
    )  # fmt: skip
    with pytest.raises(Exception, match="base64|Syntax error|500"):
        latest(order_type(id="o-3"), _value(topic))


# --- schema ids --------------------------------------------------------------------------


@uses_registry
def test_a_schema_has_one_id_under_every_subject_and_in_any_layout(schema_registry):
    """As in Confluent's registry: ids are global, the same schema (also laid out otherwise)
    gets the same id under every subject, and registering it again adds no version."""
    client = _client(schema_registry)
    user = USER | {"namespace": f"ns{uuid.uuid4().hex[:8]}"}  # a schema no other test has
    first, second = _unique("ids-a"), _unique("ids-b")
    schema_id = client.register_schema(first, _avro(user))
    assert client.register_schema(second, _avro(user)) == schema_id
    pretty = Schema(json.dumps(user, indent=4), "AVRO")
    assert client.register_schema(first, pretty) == schema_id
    assert client.get_versions(first) == [1]
    assert client.lookup_schema(second, pretty).schema_id == schema_id
    other = client.register_schema(first, _avro(USER_V2 | {"namespace": user["namespace"]}))
    assert other != schema_id and client.get_versions(first) == [1, 2]

    by_id = requests.get(f"{schema_registry.url}/schemas/ids/{schema_id}", timeout=10).json()
    # Avro without "schemaType", as Confluent's; the schema in Avro's compact form.
    assert by_id == {"schema": json.dumps(user, separators=(",", ":"))}
    assert sorted(client.get_subjects_by_schema_id(schema_id)) == sorted([first, second])
    versions = client.get_schema_versions(schema_id)
    assert sorted((v.subject, v.version) for v in versions) == sorted([(first, 1), (second, 1)])
    with pytest.raises(SchemaRegistryError) as missing:
        client.get_schema(987_654_321)
    assert (missing.value.http_status_code, missing.value.error_code) == (404, 40403)


# --- compatibility and validation -----------------------------------------------------------


@uses_registry
def test_incompatible_schemas_are_refused_as_by_confluents_registry(schema_registry):
    """LocalRegistry sets Confluent's default, BACKWARD, for every subject (Apicurio's own
    default is no check at all); a subject's own level overrides it."""
    client = _client(schema_registry)
    assert client.get_config().compatibility_level == ConfigCompatibilityLevel.BACKWARD
    subject = _unique("compat")
    client.register_schema(subject, _avro(USER))
    assert client.test_compatibility(subject, _avro(USER_BAD)) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, _avro(USER_BAD))
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    assert client.test_compatibility(subject, _avro(USER_V2)) is True
    client.register_schema(subject, _avro(USER_V2))

    relaxed = _unique("compat-none")
    client.register_schema(relaxed, _avro(USER))
    # The enum: ServerConfig(compatibility="NONE") fails inside confluent_kafka itself.
    client.set_config(relaxed, ServerConfig(compatibility=ConfigCompatibilityLevel.NONE))
    assert client.get_config(relaxed).compatibility_level == ConfigCompatibilityLevel.NONE
    client.register_schema(relaxed, _avro(USER_BAD))
    assert client.get_versions(relaxed) == [1, 2]

    strict = _unique("compat-full")
    client.register_schema(strict, _avro(USER))
    client.set_config(strict, ServerConfig(compatibility=ConfigCompatibilityLevel.FULL))
    with pytest.raises(SchemaRegistryError):  # a field added with a default is not FORWARD
        client.register_schema(strict, _avro(USER | {"fields": []}))


@uses_registry
def test_invalid_schemas_are_refused(schema_registry):
    """As Confluent's (LocalRegistry sets Apicurio's validity rule): 422, error code 42201."""
    client = _client(schema_registry)
    invalid = [
        Schema(json.dumps({"type": "record", "name": "X"}), "AVRO"),
        Schema(json.dumps({"type": "objectx", "properties": 5}), "JSON"),
        Schema(
            'syntax = "proto3";\nimport "nowhere.proto";\nmessage M { Gone g = 1; }', "PROTOBUF"
        ),
    ]
    for schema in invalid:
        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema(_unique("invalid"), schema)
        assert (refused.value.http_status_code, refused.value.error_code) == (422, 42201)


# --- serializer settings -------------------------------------------------------------------


@uses_registry
def test_use_latest_version_normalize_and_auto_register_off(schema_registry):
    client = _client(schema_registry)
    topic = _unique("latest")
    subject = f"{topic}-value"
    v1 = client.register_schema(subject, _avro(USER))
    v2 = client.register_schema(subject, _avro(USER_V2))
    latest = AvroSerializer(
        client, None, conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    payload = latest({"name": "ada", "age": 36}, _value(topic))
    assert _schema_id(payload) == v2
    own = AvroSerializer(client, json.dumps(USER), conf={"auto.register.schemas": False})
    assert _schema_id(own({"name": "ada"}, _value(topic))) == v1  # looked up, not registered
    normalized = AvroSerializer(
        _client(schema_registry), json.dumps(USER, indent=2), conf={"normalize.schemas": True}
    )
    assert _schema_id(normalized({"name": "ada"}, _value(topic))) == v1
    missing = AvroSerializer(client, json.dumps(USER), conf={"auto.register.schemas": False})
    with pytest.raises(SchemaRegistryError) as unknown:
        missing({"name": "ada"}, _value(_unique("unregistered")))
    assert unknown.value.error_code == 40401


@uses_registry
def test_record_and_topic_record_subject_name_strategies(schema_registry):
    client = _client(schema_registry)
    topic = _unique("strategies")
    namespace = f"ns{uuid.uuid4().hex[:8]}"
    schema = json.dumps(USER | {"namespace": namespace})
    for strategy in (record_subject_name_strategy, topic_record_subject_name_strategy):
        serializer = AvroSerializer(client, schema, conf={"subject.name.strategy": strategy})
        serializer({"name": "ada"}, _value(topic))
    subjects = set(client.get_subjects())
    assert {f"{namespace}.User", f"{topic}-{namespace}.User"} <= subjects
    assert f"{topic}-value" not in subjects


# --- deleting ------------------------------------------------------------------------------


@uses_registry
def test_deleting_subjects_soft_then_permanently(schema_registry):
    client = _client(schema_registry)
    kept, dropped = _unique("delete-kept"), _unique("delete")
    schema_id = client.register_schema(kept, _avro(USER))
    assert client.register_schema(dropped, _avro(USER)) == schema_id

    with pytest.raises(SchemaRegistryError) as not_soft:
        client.delete_subject(dropped, permanent=True)
    assert not_soft.value.error_code == 40405  # soft-delete first, as Confluent's
    assert client.delete_subject(dropped) == [1]
    client = _client(schema_registry)  # reads after deletes: no cached answers
    assert dropped not in client.get_subjects()
    assert dropped in client.get_subjects(deleted=True)
    assert client.get_schema(schema_id).schema_str  # ids stay readable
    assert client.delete_subject(dropped, permanent=True) == [1]
    assert dropped not in client.get_subjects(deleted=True)
    # Registered again: the same id (the schema is the same), from version 1.
    assert client.register_schema(dropped, _avro(USER)) == schema_id
    assert client.get_versions(dropped) == [1]

    version_subject = _unique("delete-version")
    client.register_schema(version_subject, _avro(USER))
    client.register_schema(version_subject, _avro(USER_V2))
    assert client.delete_version(version_subject, 2) == 2
    client = _client(schema_registry)
    assert client.get_versions(version_subject) == [1]
    assert client.get_latest_version(version_subject).version == 1


@uses_registry
def test_a_referenced_subject_cannot_be_deleted(schema_registry):
    client = _client(schema_registry)
    tag = uuid.uuid4().hex[:8]
    order_type = _order_message_type(tag)
    topic = _unique("referenced")
    ProtobufSerializer(order_type, client, {"use.deprecated.format": False})(
        order_type(id="o"), _value(topic)
    )
    with pytest.raises(SchemaRegistryError) as refused:
        client.delete_subject(f"money_{tag}.proto")
    assert (refused.value.http_status_code, refused.value.error_code) == (422, 42206)
    referenced_by = requests.get(
        f"{schema_registry.url}/subjects/money_{tag}.proto/versions/1/referencedby", timeout=10
    ).json()
    assert referenced_by == [client.get_latest_version(f"{topic}-value").schema_id]


# --- what Confluent's registry has and Apicurio's ccompat API does not ---------------------


@uses_registry
def test_what_apicurio_lacks_guids_metadata_prefixes_modes_deleted_versions(schema_registry):
    """Apicurio differs (docs/schema-registry.md): no schema GUIDs (so no header schema ids),
    no data-contract metadata, ``subjectPrefix`` ignored, READONLY not enforced, soft-deleted
    versions unreadable."""
    client = _client(schema_registry)
    topic = _unique("lacks")
    ctx = _value(topic)
    serializer = AvroSerializer(
        client, json.dumps(USER), conf={"schema.id.serializer": header_schema_id_serializer}
    )
    with pytest.raises(SerializationError, match="GUID"):
        serializer({"name": "ada"}, ctx)
    registered = client.get_latest_version(f"{topic}-value")  # registered all the same
    assert registered.guid is None

    # Metadata (data contracts) is accepted and dropped.
    subject = _unique("metadata")
    answer = requests.post(
        f"{schema_registry.url}/subjects/{subject}/versions", timeout=10,
        json={"schema": json.dumps(USER), "metadata": {"properties": {"owner": "team-a"}}},
    )  # fmt: skip
    assert answer.status_code == 200
    assert client.get_latest_version(subject).schema.metadata is None
    # Confluent's GET /subjects/{subject}/metadata finds the version; Apicurio answers 204.
    found = requests.get(
        f"{schema_registry.url}/subjects/{subject}/metadata",
        params={"key": "owner", "value": "team-a"}, timeout=10,
    )  # fmt: skip
    assert found.status_code == 204

    # subjectPrefix is ignored: every subject is listed.
    assert set(client.get_subjects(subject_prefix=subject)) > {subject}

    # A subject's READONLY mode is recorded but not enforced (Confluent's refuses writes).
    readonly = _unique("readonly")
    client.register_schema(readonly, _avro(USER))
    mode = requests.put(
        f"{schema_registry.url}/mode/{readonly}", json={"mode": "READONLY"}, timeout=10
    )
    assert mode.json() == {"mode": "READONLY"}
    assert client.register_schema(readonly, _avro(USER_V2)) > 0
    assert _client(schema_registry).get_versions(readonly) == [1, 2]

    # A soft-deleted version cannot be read, not even with ?deleted=true.
    client.delete_subject(subject)
    with pytest.raises(SchemaRegistryError) as gone:
        _client(schema_registry).get_version(subject, 1, deleted=True)
    assert gone.value.error_code == 40401


# --- the process ---------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    return processes.is_running(pid)


@pytest.mark.slow  # ~15 s: two registries of its own
def test_stop_ends_the_whole_process_group_and_a_stale_registry_is_stopped(tmp_path):
    directory = tmp_path / "registry"
    first = LocalRegistry(directory)
    first.start()
    first_pid = first.state.pid
    assert group_members(first_pid) == [first_pid], "the registry leads a group of its own"
    subject = _unique("kept")
    schema_id = _client(first).register_schema(subject, _avro(USER))
    url = first.restart()  # the same port and schemas
    assert url == first.url and not _alive(first_pid)
    assert _client(first).get_latest_version(subject).schema_id == schema_id
    first_pid = first.state.pid

    # The owner "dies" without stopping its registry; the next start on that directory finds
    # it and stops it (fresh=False keeps the schemas).
    second = LocalRegistry(directory, fresh=False)
    second.start()
    second_pid = second.state.pid
    try:
        assert not _alive(first_pid)
        assert group_members(first_pid) == []
        assert running_registry(directory).pid == second_pid
        assert _client(second).get_latest_version(subject).schema_id == schema_id
    finally:
        second.stop()
    assert not _alive(second_pid)
    assert group_members(second_pid) == []
    assert running_registry(directory) is None
    assert read_state(directory) is None
    first.stop()  # nothing left to stop: safe


def _stand_in(marker_dir: Path | None, session: bool = True) -> subprocess.Popen[bytes]:
    """A sleeping process, with the registry's marker for ``marker_dir`` in its command line
    if given (a stand-in for a registry JVM)."""
    marker = [f"-Dstreamplatform.registry.dir={marker_dir}"] if marker_dir else []
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", *marker],
        start_new_session=session,
    )
    # Right after the exec, /proc/<pid>/cmdline may still read empty for a moment: wait until
    # the command line shows, as a registry's does long before anything looks for it.
    assert processes.wait_until(lambda: bool(processes.command_line(process.pid)), 10)
    return process


def _record(directory: Path, pid: int, started: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    state = RegistryState(
        pid=pid, started=started, url="http://127.0.0.1:1/apis/ccompat/v7", port=1,
        management_port=2, data_dir=str(directory),
    )  # fmt: skip
    (directory / STATE_FILE).write_text(json.dumps(state.__dict__))


def test_a_stale_state_file_never_kills_another_process(tmp_path):
    """The state file's pid is signalled only while it runs the registry that was started:
    the same start mark and the registry's marker for that directory in its command line."""
    directory = (tmp_path / "registry").resolve()
    strangers = {
        "an unrelated process with that pid": _stand_in(None),
        "a later process with that pid (another start)": _stand_in(directory),
        "the marker of another directory": _stand_in(tmp_path / "other"),
    }
    try:
        for what, process in strangers.items():
            mark = processes.start_mark(process.pid)
            started = str(int(mark) - 1) if "later" in what else mark
            _record(directory, process.pid, started)
            assert running_registry(directory) is None, what
            assert stop_registry(directory, timeout_s=2) is False, what
            assert process.poll() is None, f"{what} was signalled"
            assert not (directory / STATE_FILE).exists(), "the stale file is removed"
        # The control: the process that was recorded, with its marker, is stopped.
        ours = _stand_in(directory)
        _record(directory, ours.pid, processes.start_mark(ours.pid))
        assert running_registry(directory).pid == ours.pid
        assert stop_registry(directory, timeout_s=10) is True
        assert ours.wait(10) == -signal.SIGTERM
    finally:
        for process in strangers.values():
            process.kill()
            process.wait(10)


def test_registries_of_runs_that_are_provably_gone_are_stopped_and_removed(tmp_path):
    """The fixture's clean-up after a SIGKILLed run (stand-ins for the registries)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    ended = tmp_path / f"{gone.pid}-abc"
    (ended / "registry").mkdir(parents=True)
    (ended / RUN_FILE).write_text(json.dumps({"pid": gone.pid, "started": "12345"}))
    left_running = _stand_in((ended / "registry").resolve())
    _record(
        (ended / "registry").resolve(), left_running.pid, processes.start_mark(left_running.pid)
    )
    going = tmp_path / f"{os.getpid()}-def"
    (going / "registry").mkdir(parents=True)
    (going / RUN_FILE).write_text(
        json.dumps({"pid": os.getpid(), "started": processes.start_mark(os.getpid())})
    )
    try:
        assert remove_registries_of_ended_runs(tmp_path) == [ended]
        assert left_running.wait(10) == -signal.SIGTERM
        assert not ended.exists() and going.is_dir()
    finally:
        left_running.kill()
        left_running.wait(10)


@pytest.mark.slow  # ~10 s: a child pytest and a registry of its own
def test_the_registry_of_a_sigkilled_test_run_is_stopped_by_the_next_run(tmp_path):
    pid_file = tmp_path / "pid"
    test_file = tmp_path / "test_killed.py"
    test_file.write_text(
        textwrap.dedent(f"""
        import time

        pytest_plugins = ["streamplatform.registry.pytest_fixtures"]

        def test_uses_the_registry_then_hangs(schema_registry):
            open({str(pid_file)!r}, "w").write(str(schema_registry.state.pid))
            time.sleep(300)
        """)
    )
    data = tmp_path / "data"
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        env=os.environ | {"STREAMPLATFORM_DATA": str(data)},
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert child.poll() is None and time.monotonic() < deadline, "no registry started"
            time.sleep(0.2)
        registry_pid = int(pid_file.read_text())
        child.kill()  # SIGKILL: no finalizer runs
        child.wait(10)
        assert _alive(registry_pid), "a registry in its own session outlives its run"
        [run] = (data / "test-registries").iterdir()
        assert remove_registries_of_ended_runs(data / "test-registries") == [run]
        assert not _alive(registry_pid) and group_members(registry_pid) == []
        assert not run.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


@pytest.mark.slow  # ~10 s: a registry of its own through the CLI
def test_cli_start_status_stop(tmp_path):
    env = os.environ | {"STREAMPLATFORM_DATA": str(tmp_path)}
    cli = [sys.executable, "-m", "streamplatform.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, env=env, timeout=180)

    assert run("registry", "status").returncode == 3
    started = run("registry", "start")
    try:
        assert started.returncode == 0, started.stderr
        assert "schema.registry.url=http://127.0.0.1:" in started.stdout
        url = started.stdout.split("schema.registry.url=")[1].split(",")[0]
        assert url.endswith("/apis/ccompat/v7")
        status = run("registry", "status")
        assert status.returncode == 0 and f"schema.registry.url={url}" in status.stdout
        assert "Already running" in run("registry", "start").stdout
        assert SchemaRegistryClient({"url": url}).register_schema("cli", _avro(USER)) > 0
        pid = read_state(tmp_path / "registry").pid
    finally:
        stopped = run("registry", "stop")
    assert "Stopped." in stopped.stdout
    assert run("registry", "status").returncode == 3
    assert "No Schema Registry was running." in run("registry", "stop").stdout
    assert not _alive(pid) and group_members(pid) == []


def test_without_java_21_the_error_says_what_was_found_and_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv(local_registry.JAVA_HOME_VARIABLE, str(tmp_path))
    with pytest.raises(local_registry.NoSuitableJava, match="not a Java home.*Java 21"):
        local_registry.registry_java()
    monkeypatch.delenv(local_registry.JAVA_HOME_VARIABLE)
    with pytest.raises(
        local_registry.NoSuitableJava, match="needs Java 999\\+.*Install a JDK 999\\+"
    ):
        local_registry.registry_java(minimum=999)
