"""Schema Registry serdes: Avro, Protobuf and JSON Schema in Confluent's wire format.

Built on ``confluent_kafka.schema_registry``'s serializers. A serde takes the registry's
settings from the job (``schema.registry.url``, ``basic.auth.*``, the subject name strategies,
``auto.register.schemas``, ... in the names Confluent's clients use) through ``configure``,
which the runtime calls for the serdes of every source, sink and store before their first
record; ``registry={...}`` given to the serde (same names) takes precedence, for a serde used
outside a job or one only a processor knows.

Each process (a Spark Python worker, the driver, a test) creates one registry client per set
of registry settings, at the first record that needs it, and shares it between the serdes:
schemas and ids are cached there, so a worker asks the registry once per schema. A serde
pickled to Spark's workers travels without its client and serializers.

Where the schema id goes:

- with a topic (sources and sinks), by ``key.schema.id.serializer`` /
  ``value.schema.id.serializer`` (or ``schema_id_format=``): the payload prefix (magic byte 0
  and a 4-byte id, Confluent's classic format) or the ``__key_schema_id`` /
  ``__value_schema_id`` header (the schema's GUID, the newer format). Both are always read; a
  record's old schema-id header for the same field is dropped when it is written again, so it
  never points at another schema than the one its bytes were written with;
- in a store (no topic, no headers): the prefix, under the record-name subject (the record's
  full name; a JSON schema's ``title``), auto-registered. Kafka Streams registers a store's
  schemas under its changelog topic's subject (``<application.id>-<store>-changelog-value``).

Errors: bytes that cannot be read (no magic byte, an id the registry does not know, a payload
the schema does not fit) raise :class:`~streamplatform.serdes.SerializationError` with the
raw bytes, so the deserialization handler sends the record to the dead letter queue untouched.
A registry that cannot be reached (connection refused, a 5xx) is no fault of the record: it
raises :class:`RegistryUnavailableError`, which fails the task without committing (the batch
is retried) instead of sending every record to the DLQ.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import schemaless_reader, schemaless_writer

from streamplatform.config import REGISTRY_SETTINGS, ConfigError, StreamsConfig
from streamplatform.errors.exceptions import StreamsError
from streamplatform.serdes import SerdeContext, SerializationError

__all__ = [
    "AvroSerde",
    "JsonSchemaSerde",
    "ProtobufSerde",
    "RegistrySerde",
    "RegistryUnavailableError",
    "registry_client",
]

KEY_SCHEMA_ID_HEADER = "__key_schema_id"
VALUE_SCHEMA_ID_HEADER = "__value_schema_id"

# HTTP statuses from the registry that say something about the record (its schema id is
# unknown, its schema refused), not about the registry being unavailable.
_RECORD_STATUSES = frozenset({400, 404, 409, 422})


# The registry settings given to a serde (registry=) that change what it writes.
_OUTPUT_OPTIONS = frozenset(
    name for name in REGISTRY_SETTINGS if not name.startswith(("schema.registry.", "basic.auth."))
)


_NOT_FAST = object()  # RegistrySerde._fast_read: no fast path for these bytes

try:  # the compiled Avro reader (avro_program.py), built with the package where a C compiler is
    from streamplatform.registry import _avro_core
except ImportError:  # pragma: no cover - depends on the build; fastavro then reads every value
    _avro_core = None  # type: ignore[assignment]
# What a registry serde creates where it is used (the registry's client inside): never
# pickled, and no part of the job's fingerprint.
_CACHES = ("_serializers", "_deserializer", "_fast", "_checked_ids", "_verdicts")


class RegistryUnavailableError(StreamsError):
    """The Schema Registry could not be reached or failed (not a fault of the record): the
    task fails without committing, and the batch is retried."""


_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _client_conf(settings: Mapping[str, Any]) -> dict[str, Any]:
    url = settings.get("schema.registry.url")
    if not url:
        raise ConfigError(
            "schema.registry.url: required by the registry serdes (Serdes.avro, "
            "Serdes.protobuf, Serdes.json_schema), not set. Set it in the job's settings, "
            "or give the serde registry={'schema.registry.url': ...}"
        )
    conf: dict[str, Any] = {"url": url}
    for setting, key in (
        ("basic.auth.credentials.source", "basic.auth.credentials.source"),
        ("basic.auth.user.info", "basic.auth.user.info"),
        ("schema.registry.ssl.ca.location", "ssl.ca.location"),
        ("schema.registry.ssl.certificate.location", "ssl.certificate.location"),
        ("schema.registry.ssl.key.location", "ssl.key.location"),
        ("sasl.username", "sasl.username"),
        ("sasl.password", "sasl.password"),
        ("sasl.mechanism", "sasl.mechanism"),
    ):
        if settings.get(setting) is not None:
            conf[key] = settings[setting]
    return conf


def registry_client(settings: Mapping[str, Any]) -> Any:
    """The process's ``SchemaRegistryClient`` for these settings (job setting names), created
    at the first call: one per registry, shared by every serde that uses it. A ``mock://``
    URL gives an in-process mock, one per URL, so a test's serdes and the job's share it."""
    conf = _client_conf(settings)
    key = tuple(sorted(conf.items()))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            client = _CLIENTS[key] = SchemaRegistryClient.new_client(conf)
        return client


def _registry_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The registry settings (and the Kafka clients' SASL ones, for SASL_INHERIT) of a job."""
    chosen = {name: settings[name] for name in REGISTRY_SETTINGS if name in settings}
    passthrough = getattr(settings, "client_settings", settings)
    jaas = passthrough.get("sasl.jaas.config")
    if jaas:  # SASL_INHERIT: the Kafka clients' user and password (kafka/security.py)
        from streamplatform.kafka.security import librdkafka_security

        mechanism = passthrough.get("sasl.mechanism")
        inherited = librdkafka_security({"sasl.jaas.config": jaas, "sasl.mechanism": mechanism})
        for name in ("sasl.username", "sasl.password"):
            if name in inherited:
                chosen[name] = inherited[name]
    if passthrough.get("sasl.mechanism") is not None:
        chosen["sasl.mechanism"] = passthrough["sasl.mechanism"]
    return chosen


def _validated(registry: Mapping[str, Any]) -> dict[str, Any]:
    """``registry=`` given to a serde: registry settings only, parsed as the job's are."""
    unknown = sorted(set(registry) - set(REGISTRY_SETTINGS))
    if unknown:
        raise ConfigError(
            f"registry=: {', '.join(unknown)}: not a registry setting (one of "
            f"{', '.join(REGISTRY_SETTINGS)})"
        )
    parsed = StreamsConfig({"application.id": "registry-serde", **registry})
    return {name: parsed[name] for name in registry}


def _strategies() -> dict[str, Callable]:
    from confluent_kafka.schema_registry import (
        record_subject_name_strategy,
        topic_record_subject_name_strategy,
        topic_subject_name_strategy,
    )

    return {
        "TopicNameStrategy": topic_subject_name_strategy,
        "RecordNameStrategy": record_subject_name_strategy,
        "TopicRecordNameStrategy": topic_record_subject_name_strategy,
    }


def _deserializer_conf() -> dict[str, Any]:
    """A deserializer finds the schema by the id the record carries; its subject only matters
    with use.latest.version. The topic strategy names it without asking the registry (the
    default, AssociatedNameStrategy, would ask it)."""
    from confluent_kafka.schema_registry import topic_subject_name_strategy

    return {"subject.name.strategy": topic_subject_name_strategy}


def _store_subject(ctx: Any, record_name: str | None) -> str:
    """The subject of a store's data (no topic): the record's full name."""
    if not record_name:
        raise SerializationError(
            "a registry serde writing to a store needs a record name for its subject (an "
            "Avro record's name, a Protobuf message's, a JSON schema's title)"
        )
    return record_name


def _is_unavailable(exception: BaseException) -> bool:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exception, SchemaRegistryError):
        return exception.http_status_code not in _RECORD_STATUSES
    module = type(exception).__module__
    return isinstance(exception, OSError) or module.startswith(("httpx", "httpcore"))


class RegistrySerde:
    """The common part of the registry serdes: settings, the shared client, the subject and
    schema-id format per key or value, and error translation."""

    uses_context = True
    name = "registry"

    def __init__(
        self,
        *,
        subject_name_strategy: str | None = None,
        auto_register: bool | None = None,
        use_latest_version: bool | None = None,
        normalize_schemas: bool | None = None,
        schema_id_format: str | None = None,
        registry: Mapping[str, Any] | None = None,
    ) -> None:
        # Options of this serde override the job's settings, key or value alike.
        options = {
            "subject.name.strategy": subject_name_strategy,
            "auto.register.schemas": auto_register,
            "use.latest.version": use_latest_version,
            "normalize.schemas": normalize_schemas,
            "schema.id.serializer": schema_id_format,
        }
        self._options = {name: value for name, value in options.items() if value is not None}
        for name in ("subject.name.strategy", "schema.id.serializer"):
            if name in self._options:  # parsed as the job's settings are
                setting = f"value.{name}"
                self._options[name] = _validated({setting: self._options[name]})[setting]
        self._explicit = _validated(registry or {})
        self._job: dict[str, Any] = {}
        self._reset()

    def _reset(self) -> None:
        self._serializers: dict[Any, Any] = {}
        self._deserializer: Any = None
        for name in _CACHES[2:]:  # the fast paths' state (the subclasses')
            self.__dict__.pop(name, None)

    def configure(self, settings: Mapping[str, Any]) -> None:
        """The job's settings (``registry=`` given to the serde wins over them)."""
        job = _registry_settings(settings)
        if job != self._job:
            self._job = job
            self._reset()

    def column_type(self) -> Any:
        """The Arrow type of the values as a Delta state table's typed column (a struct from
        the schema, registry/columns.py); None: no schema to take it from (the column keeps
        the bytes)."""
        return None

    def column_value(self, value: Any) -> Any:
        """``value`` (deserialized) as ``column_type()``'s column holds it."""
        from streamplatform.registry.columns import fitted

        return fitted(self.column_type(), value)

    def __fingerprint__(self) -> dict[str, Any]:
        """What decides the bytes this serde writes and the values it reads (the job's
        fingerprint, runtime/fingerprint.py): its schemas and options, not its client, caches
        or the registry's address and credentials."""
        kept = {name: value for name, value in vars(self).items()
                if name not in _CACHES + ("_job", "_explicit")}  # fmt: skip
        kept["_explicit"] = {name: value for name, value in self._explicit.items()
                             if name in _OUTPUT_OPTIONS}  # fmt: skip
        return kept

    def __getstate__(self) -> dict[str, Any]:
        # Without the client, serializers and caches: created again where it is used.
        state = {name: value for name, value in self.__dict__.items() if name not in _CACHES}
        state["_serializers"], state["_deserializer"] = {}, None
        return state

    # Settings ----------------------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        return self._job | self._explicit

    def _setting(self, name: str, is_key: bool) -> Any:
        """A serializer setting: this serde's option, else the job's key./value. or plain
        setting, else the default."""
        if name in self._options:
            return self._options[name]
        settings = self._settings()
        field = f"{'key' if is_key else 'value'}.{name}"
        for candidate in (field, name):
            if candidate in settings:
                return settings[candidate]
        defaults = StreamsConfig({"application.id": "defaults"})
        return defaults[field] if field in REGISTRY_SETTINGS else defaults[name]

    def client(self) -> Any:
        return registry_client(self._settings())

    def _serializer_conf(self, is_key: bool | None) -> dict[str, Any]:
        from confluent_kafka.schema_registry import (
            header_schema_id_serializer,
            prefix_schema_id_serializer,
        )

        if is_key is None:  # a store's data: see the module's docstring
            return {"auto.register.schemas": True, "subject.name.strategy": _store_subject}
        use_latest = bool(self._setting("use.latest.version", is_key))
        header = self._setting("schema.id.serializer", is_key) == "header"
        return {
            "auto.register.schemas": bool(self._setting("auto.register.schemas", is_key))
            and not use_latest,
            "use.latest.version": use_latest,
            "normalize.schemas": bool(self._setting("normalize.schemas", is_key)),
            "subject.name.strategy": _strategies()[self._setting("subject.name.strategy", is_key)],
            "schema.id.serializer": header_schema_id_serializer
            if header
            else prefix_schema_id_serializer,
        }

    # The format's serializer and deserializer (subclasses) -------------------------------

    def _new_serializer(self, conf: dict[str, Any]) -> Callable[[Any, Any], bytes]:
        raise NotImplementedError

    def _new_deserializer(self) -> Callable[[bytes, Any], Any]:
        raise NotImplementedError

    # Serde -------------------------------------------------------------------------------

    def _fast_read(self, data: bytes, context: SerdeContext | None) -> Any:
        """The value of ``data`` read without confluent's serializers, or ``_NOT_FAST``."""
        return _NOT_FAST

    def _fast_write(self, value: Any, is_key: bool | None, topic: str | None) -> bytes | None:
        """``value``'s bytes written without confluent's serializers, or None."""
        return None

    def _read_all(self, datas: list[Any], headers: list | None, is_key: bool) -> list | None:
        """What ``deserialize`` gives for each of ``datas`` (with its record's ``headers``; None:
        the records have none), read in bulk (``serdes.deserialize_all``), or None: the caller
        reads them one by one, which raises a failure at its record."""
        return None

    def serialize(self, value: Any, context: SerdeContext | None = None) -> bytes | None:
        if value is None:
            return None
        is_key = None if context is None or context.topic is None else context.is_key
        if is_key is not None and context.headers:  # type: ignore[union-attr]
            # A schema id header of the record's old bytes would name another schema.
            stale = KEY_SCHEMA_ID_HEADER if is_key else VALUE_SCHEMA_ID_HEADER
            context.headers[:] = [h for h in context.headers if h[0] != stale]  # type: ignore[union-attr]
        try:
            fast = self._fast_write(value, is_key, None if context is None else context.topic)
        except Exception as exception:
            raise self._translated(exception, "serialize", None, context) from exception
        if fast is not None:
            return fast
        serializer = self._serializers.get(is_key)
        if serializer is None:
            serializer = self._serializers[is_key] = self._new_serializer(
                self._serializer_conf(is_key)
            )
        if is_key is None:  # a store's data: no topic, no headers (the subject is by name)
            ctx = SerializationContext("", MessageField.VALUE, None)
        else:
            assert context is not None
            field = MessageField.KEY if is_key else MessageField.VALUE
            ctx = SerializationContext(context.topic or "", field, context.headers)  # type: ignore[arg-type]
        try:
            data = serializer(value, ctx)
            return data if type(data) is bytes else bytes(data)
        except Exception as exception:
            raise self._translated(exception, "serialize", None, context) from exception

    def deserialize(self, data: bytes | None, context: SerdeContext | None = None) -> Any:
        if data is None:
            return None
        if type(data) is not bytes:
            data = bytes(data)
        try:
            value = self._fast_read(data, context)
            if value is not _NOT_FAST:
                return value
            if self._deserializer is None:
                self._deserializer = self._new_deserializer()
            # A store's data has no context; the deserializers want one all the same.
            is_key = context is not None and context.is_key
            topic, headers = ("", None) if context is None else (context.topic or "",
                                                                 context.headers)  # fmt: skip
            field = MessageField.KEY if is_key else MessageField.VALUE
            ctx = SerializationContext(topic, field, headers)  # type: ignore[arg-type]
            return self._deserializer(data, ctx)
        except Exception as exception:
            raise self._translated(exception, "deserialize", data, context) from exception

    def _translated(
        self, exception: Exception, action: str, raw: bytes | None, context: SerdeContext | None
    ) -> Exception:
        where = "a store's data" if context is None or context.topic is None else (
            f"the {'key' if context.is_key else 'value'} of topic {context.topic!r}"
        )  # fmt: skip
        if isinstance(exception, ConfigError | StreamsError):
            return exception
        message = f"{self.name}: cannot {action} {where}: {type(exception).__name__}: {exception}"
        if action == "serialize" and getattr(exception, "http_status_code", None) == 404:
            message += (
                " (with auto.register.schemas=false or use.latest.version=true the subject "
                "must already hold the schema)"
            )
        if _is_unavailable(exception):
            url = self._settings().get("schema.registry.url")
            return RegistryUnavailableError(f"{message} (schema registry {url})")
        return SerializationError(message, raw=raw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._options or ''})"

    def _same_registry(self, other: RegistrySerde) -> bool:
        """Whether ``other`` reaches the same registry (so a schema id means the same schema
        to both)."""
        url = "schema.registry.url"
        return self._settings().get(url) == other._settings().get(url)


class AvroSerde(RegistrySerde):
    """Avro values (dicts, or your objects through ``to_dict``/``from_dict``).

    ``schema``: the writer schema (Avro JSON); records are read into it too, so records
    written with older compatible schemas come out in its shape (fields added with defaults
    filled in). ``reader_schema``: another schema to read into. With neither, records are read
    with their writer's schema, and writing needs ``use_latest_version=True``."""

    name = "avro"

    def __init__(
        self,
        schema: str | None = None,
        *,
        reader_schema: str | None = None,
        to_dict: Callable[[Any, Any], dict] | None = None,
        from_dict: Callable[[dict, Any], Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.schema, self.reader_schema = schema, reader_schema or schema
        self._to_dict, self._from_dict = to_dict, from_dict
        if schema is not None:  # a schema that does not parse fails here, not at a record
            import fastavro

            fastavro.parse_schema(_json_loads(schema, "schema"))
            fastavro.parse_schema(_json_loads(self.reader_schema, "reader_schema"))

    def column_type(self) -> Any:
        if self.reader_schema is None or self._from_dict is not None:
            return None
        from streamplatform.registry.columns import avro_type_of

        return avro_type_of(self.reader_schema)

    def _new_serializer(self, conf: dict[str, Any]) -> Callable[[Any, Any], bytes]:
        from confluent_kafka.schema_registry import prefix_schema_id_serializer
        from confluent_kafka.schema_registry.avro import AvroSerializer

        if self.schema is None and not conf.get("use.latest.version"):
            raise ConfigError(
                "Serdes.avro() without a schema can only read; to write, give it the writer "
                "schema or use_latest_version=True"
            )
        serializer = AvroSerializer(self.client(), self.schema, self._to_dict, conf)
        # The fast path (_AvroPlans): what confluent's serializer wrote first for a topic
        # gives the prefix of the next ones. Not for the header format or the subject's
        # latest schema.
        learns = (
            self.schema is not None and self._to_dict is None
            and conf.get("schema.id.serializer") is prefix_schema_id_serializer
            and not conf.get("use.latest.version")
        )  # fmt: skip
        plans = self._plans() if learns else None

        def serialize(value: Any, ctx: Any) -> bytes:
            data: bytes = serializer(value, ctx)
            if plans is not None:
                plans.learn_prefix((ctx.field, ctx.topic), data)
            return data

        return serialize

    def _new_deserializer(self) -> Callable[[bytes, Any], Any]:
        from confluent_kafka.schema_registry import dual_schema_id_deserializer
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        # confluent-kafka's AvroDeserializer (2.16) refuses a payload of 5 bytes or less
        # before it looks for the schema id in the headers, so a small record written in
        # the header format could not be read. Such a payload is padded to get past that
        # check, and the padding is cut off again where the schema id is taken from it.
        def schema_id_from(payload: bytes, ctx: Any, schema_id: Any) -> Any:
            padding = getattr(ctx, "streamplatform_padding", 0)
            return dual_schema_id_deserializer(payload[: len(payload) - padding], ctx, schema_id)

        deserializer = AvroDeserializer(
            self.client(), self.reader_schema, self._from_dict,
            conf=_deserializer_conf() | {"schema.id.deserializer": schema_id_from},
        )  # fmt: skip

        def deserialize(data: bytes, ctx: Any) -> Any:
            if len(data) <= 5 and _has_schema_id_header(ctx):
                ctx.streamplatform_padding = 6
                data += bytes(6)
            return deserializer(data, ctx)

        return deserialize

    def _fast_read(self, data: bytes, context: SerdeContext | None) -> Any:
        if len(data) <= 5 or data[0] != 0 or self._from_dict is not None:
            return _NOT_FAST
        if context is not None and context.headers:
            name = KEY_SCHEMA_ID_HEADER if context.is_key else VALUE_SCHEMA_ID_HEADER
            if any(header[0] == name for header in context.headers):
                return _NOT_FAST
        plan = self._plans().readers(data[1:5])
        if plan is None:
            return _NOT_FAST
        source = io.BytesIO(data)
        source.seek(5)
        return schemaless_reader(source, *plan)

    def _read_all(self, datas: list[Any], headers: list | None, is_key: bool) -> list | None:
        # The compiled reader, where every value would take _fast_read's path (the schema id
        # in its prefix, none in a header) to a schema it reads; else None (record by record).
        # It is strict (see _avro_core.c): a value it refuses makes the whole chunk go record
        # by record, where fastavro gives that value what it gives it today.
        if _avro_core is None or self._from_dict is not None:
            return None
        if headers is not None:
            name = KEY_SCHEMA_ID_HEADER if is_key else VALUE_SCHEMA_ID_HEADER
            for record_headers in headers:
                if record_headers and any(header[0] == name for header in record_headers):
                    return None
        first = next((data for data in datas if data is not None), None)
        if first is None:
            return [None] * len(datas)
        if type(first) is not bytes:
            return None
        plans = self._plans()
        prefix = first[:5]
        reader = plans.compiled(prefix)
        if reader is None:
            return None
        values = reader.read_all(datas, 5, prefix)
        if values is not None:
            return values
        # Values of several schemas (a producer moving to a new version): read by schema.
        at: dict[bytes, list[int]] = {}
        for index, data in enumerate(datas):
            if data is not None:
                if type(data) is not bytes:
                    return None
                at.setdefault(data[:5], []).append(index)
        values = [None] * len(datas)
        for prefix, indexes in at.items():
            reader = plans.compiled(prefix)
            if reader is None:
                return None
            read = reader.read_all([datas[index] for index in indexes], 5)
            for index, value in zip(indexes, read, strict=True):
                values[index] = value
        return values

    def _fast_write(self, value: Any, is_key: bool | None, topic: str | None) -> bytes | None:
        plans = self.__dict__.get("_fast")
        if plans is None:
            return None
        field = MessageField.KEY if is_key else MessageField.VALUE
        prefix = plans.prefixes.get((field, "" if is_key is None else topic))
        if prefix is None:
            return None
        out = io.BytesIO()
        out.write(prefix)
        schemaless_writer(out, plans.writer, value)
        return out.getvalue()

    def written_prefix(self, topic: str, is_key: bool) -> bytes | None:
        """The 5 bytes this serde writes before each of its values to ``topic`` (the magic
        byte and the schema id), once it has written one there on the fast path; else None.
        A sink writes a value as read when it starts with them (runtime/sink_writers.py)."""
        plans = self.__dict__.get("_fast")
        if plans is None:
            return None
        field = MessageField.KEY if is_key else MessageField.VALUE
        return plans.prefixes.get((field, topic))

    def writes_back_reads_of(self, other: Any) -> bool:
        """Whether what ``other`` reads, this serde writes back as it was read under the same
        schema id: both Avro with the same schema, read as written (no reader schema of
        another shape), and no conversion to or from objects of yours."""
        return (
            type(other) is AvroSerde and self.schema is not None
            and self.schema == self.reader_schema == other.schema == other.reader_schema
            and self._to_dict is None and other._from_dict is None
            and self._same_registry(other)
        )  # fmt: skip

    def _plans(self) -> _AvroPlans:
        plans = self.__dict__.get("_fast")
        if plans is None:
            plans = self.__dict__["_fast"] = _AvroPlans(
                self.client(), self.schema, self.reader_schema
            )
        return plans


class _AvroPlans:
    """The Avro serde's fast path: fastavro called directly, as confluent's serializers call
    it, without what they add around it for each record (schema expansion and tag lookups for
    data-contract rules, subject names, contexts: about 75% of their time, bench/RESULTS.md).
    Taken per schema id, for a plain Avro schema: no references, no rule set, not the bare
    ``bytes`` type (which confluent frames without Avro). Anything else, and the first record
    written to each topic, go through confluent's serializers. An id the registry does not
    know still raises at its record (``client.get_schema``)."""

    def __init__(self, client: Any, schema: str | None, reader_schema: str | None) -> None:
        import fastavro

        self.client = client
        self.writer = None if schema is None else fastavro.parse_schema(_json_loads(schema, ""))
        self.reader = (
            None if reader_schema is None
            else fastavro.parse_schema(_json_loads(reader_schema, "reader_schema"))
        )  # fmt: skip
        # (field, topic) -> the 5 bytes before each record written there; None: not plain.
        self.prefixes: dict[tuple[Any, str], bytes | None] = {}
        self._readers: dict[bytes, tuple[Any, Any] | None] = {}
        self._plain: dict[bytes, bool] = {}
        self._compiled: dict[bytes, Any] = {}  # prefix -> _avro_core.Reader or None

    def learn_prefix(self, where: tuple[Any, str], data: bytes) -> None:
        """What confluent's serializer wrote first to ``where``: its prefix for the next."""
        if where not in self.prefixes:
            self.prefixes[where] = data[:5] if self.plain(data[1:5]) else None

    def plain(self, schema_id: bytes) -> bool:
        """Whether the schema of ``schema_id`` (its 4 bytes) is a plain Avro schema."""
        known = self._plain.get(schema_id)
        if known is None:
            registered = self.client.get_schema(int.from_bytes(schema_id, "big"))
            text = registered.schema_str or ""
            known = self._plain[schema_id] = (
                registered.schema_type in (None, "AVRO") and not registered.references
                and not registered.rule_set and _json_loads(text, "schema") != "bytes"
            )  # fmt: skip
        return known

    def readers(self, schema_id: bytes) -> tuple[Any, Any] | None:
        """``(writer schema, reader schema or None)`` for fastavro, None: not plain."""
        if schema_id in self._readers:
            return self._readers[schema_id]
        plan = None
        if self.plain(schema_id):
            import fastavro
            from fastavro.schema import to_parsing_canonical_form

            registered = self.client.get_schema(int.from_bytes(schema_id, "big"))
            writer = fastavro.parse_schema(_json_loads(registered.schema_str, "schema"))
            reader = self.reader
            if reader is not None and (
                to_parsing_canonical_form(writer) == to_parsing_canonical_form(reader)
            ):
                reader = None  # the same schema: no resolution to do per record
            plan = (writer, reader)
        self._readers[schema_id] = plan
        return plan

    def compiled(self, prefix: bytes) -> Any:
        """The compiled reader (``_avro_core.Reader``) of the values that start with
        ``prefix`` (the magic byte and the schema id), or None: fastavro reads them (not the
        prefix format, a schema that is not plain, one read into another reader schema, or one
        avro_program does not compile). Raises what the registry raises for the id."""
        reader = self._compiled.get(prefix, _NOT_FAST)
        if reader is not _NOT_FAST:
            return reader
        reader = None
        if _avro_core is not None and len(prefix) == 5 and prefix[0] == 0:
            plan = self.readers(prefix[1:5])
            if plan is not None and plan[1] is None:
                from streamplatform.registry.avro_program import program

                compiled = program(plan[0])
                reader = None if compiled is None else _avro_core.Reader(compiled)
        self._compiled[prefix] = reader
        return reader


def _past_message_indexes(data: bytes, at: int) -> int | None:
    """Where a Protobuf payload's message starts: past the message indexes at ``at`` (a
    zigzag varint count, then that many varints; a lone 0 stands for [0]), or None when they
    run past the end or their count is out of confluent's bounds (0 to 100,000: its
    deserializer refuses the rest)."""
    count, at = _varint(data, at)
    if count is None:
        return None
    count = (count >> 1) ^ -(count & 1)  # zigzag-decoded
    if not 0 <= count <= 100_000:
        return None
    for _ in range(count):
        index, at = _varint(data, at)
        if index is None:
            return None
    return at


def _varint(data: bytes, at: int) -> tuple[int | None, int]:
    """The unsigned varint at ``at`` and where it ends; (None, at) past the end or beyond 64
    bits."""
    value = shift = 0
    while at < len(data) and shift < 64:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    return None, at


def _has_schema_id_header(ctx: Any) -> bool:
    name = KEY_SCHEMA_ID_HEADER if ctx.field == MessageField.KEY else VALUE_SCHEMA_ID_HEADER
    return any(header[0] == name for header in ctx.headers or ())


class ProtobufSerde(RegistrySerde):
    """Protobuf messages of the generated class ``message_type`` (its ``_pb2`` module must be
    importable where the job runs: Spark's workers unpickle the class by its module)."""

    name = "protobuf"

    def __init__(self, message_type: type, **options: Any) -> None:
        super().__init__(**options)
        if not hasattr(message_type, "DESCRIPTOR"):
            raise TypeError(
                f"Serdes.protobuf takes a generated message class, got {message_type!r}"
            )
        self.message_type: Any = message_type

    def __fingerprint__(self) -> dict[str, Any]:
        described = super().__fingerprint__()
        descriptor = self.message_type.DESCRIPTOR  # type: ignore[attr-defined]
        described["message_type"] = (descriptor.full_name, descriptor.file.serialized_pb)
        return described

    def column_type(self) -> Any:
        from streamplatform.registry.columns import protobuf_type_of

        return protobuf_type_of(self.message_type)

    def column_value(self, value: Any) -> Any:
        from streamplatform.registry.columns import protobuf_values

        return protobuf_values(value)

    def _new_serializer(self, conf: dict[str, Any]) -> Callable[[Any, Any], bytes]:
        from confluent_kafka.schema_registry import prefix_schema_id_serializer
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        serializer = ProtobufSerializer(self.message_type, self.client(), conf)
        # The fast path (_fast_write): confluent's serializer writes the framing (magic byte,
        # schema id, message indexes), then the message's own bytes. Without the subject's
        # latest schema (whose rules could change the message) the framing is the same for
        # every message to a subject, so the first one written to a topic gives it for the
        # next. Not for the header format.
        learns = (
            conf.get("schema.id.serializer") is prefix_schema_id_serializer
            and not conf.get("use.latest.version")
        )  # fmt: skip
        prefixes = self._prefixes()

        def serialize(message: Any, ctx: Any) -> bytes:
            if not isinstance(message, self.message_type):
                raise TypeError(
                    f"expected a {self.message_type.__name__}, got {type(message).__name__}"
                )
            data: bytes = serializer(message, ctx)
            where = (ctx.field, ctx.topic)
            if learns and where not in prefixes:
                body = message.SerializeToString()
                framed = data.endswith(body) and len(data) > len(body)
                prefixes[where] = data[: len(data) - len(body)] if framed else None
            return data

        return serialize

    def _prefixes(self) -> dict[tuple[Any, str], bytes | None]:
        """(field, topic) -> the framing confluent's serializer wrote before the first message
        there (None: no fast path there)."""
        prefixes = self.__dict__.get("_fast")
        if prefixes is None:
            prefixes = self.__dict__["_fast"] = {}
        return prefixes  # type: ignore[no-any-return]

    def _fast_write(self, value: Any, is_key: bool | None, topic: str | None) -> bytes | None:
        prefixes = self.__dict__.get("_fast")
        if not prefixes or type(value) is not self.message_type:
            return None
        field = MessageField.KEY if is_key else MessageField.VALUE
        prefix = prefixes.get((field, "" if is_key is None else topic))
        return None if prefix is None else prefix + value.SerializeToString()

    def _fast_read(self, data: bytes, context: SerdeContext | None) -> Any:
        # What the deserializer below does for a record with its schema id in the payload
        # (the message type reads it), without confluent's wrapper: past the framing, the
        # message's bytes. The id is checked with the registry once, as below.
        if len(data) < 6 or data[0] != 0:
            return _NOT_FAST
        if context is not None and context.headers:
            name = KEY_SCHEMA_ID_HEADER if context.is_key else VALUE_SCHEMA_ID_HEADER
            if any(header[0] == name for header in context.headers):
                return _NOT_FAST
        checked = self.__dict__.get("_checked_ids")
        if checked is None:
            checked = self.__dict__["_checked_ids"] = set()
        schema_id = data[1:5]
        if schema_id not in checked:
            self.client().get_schema(int.from_bytes(schema_id, "big"))  # unknown: 404
            checked.add(schema_id)
        start = _past_message_indexes(data, 5)
        if start is None:
            return _NOT_FAST  # confluent's deserializer says what is wrong
        message = self.message_type()
        try:
            message.ParseFromString(data[start:])
        except Exception:  # noqa: BLE001 - the deserializer below raises it as confluent does
            return _NOT_FAST
        return message

    def written_prefix(self, topic: str, is_key: bool) -> bytes | None:
        """The framing this serde writes before each message to ``topic``, once it has
        written one there; else None (runtime/sink_writers.py writes a value as read when it
        starts with it)."""
        prefixes = self.__dict__.get("_fast")
        if not prefixes:
            return None
        return prefixes.get((MessageField.KEY if is_key else MessageField.VALUE, topic))

    def writes_back_reads_of(self, other: Any) -> bool:
        """Whether a message ``other`` reads is one this serde writes under the same framing:
        both read and write messages of the same generated class."""
        return (
            type(other) is ProtobufSerde and other.message_type is self.message_type
            and self._same_registry(other)
        )  # fmt: skip

    def _new_deserializer(self) -> Callable[[bytes, Any], Any]:
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        # A record with its id in the payload carries its message indexes too: the message
        # type alone reads it, without fetching the writer's schema in the "serialized"
        # format, which Apicurio's registry cannot give (docs/schema-registry.md). The id is
        # still checked once against the registry, so that an unknown id is refused as
        # Confluent's deserializer refuses it. A record with its id in a header (a GUID)
        # needs the registry's schema.
        client = self.client()
        by_prefix = ProtobufDeserializer(self.message_type, _deserializer_conf())
        by_header: list[Any] = []
        known: set[int] = set()

        def deserialize(data: bytes, ctx: Any) -> Any:
            if _has_schema_id_header(ctx):
                if not by_header:
                    by_header.append(
                        ProtobufDeserializer(self.message_type, _deserializer_conf(), client)
                    )
                return by_header[0](data, ctx)
            if len(data) >= 5 and data[0] == 0:
                schema_id = int.from_bytes(data[1:5], "big")
                if schema_id not in known:
                    client.get_schema(schema_id)  # an unknown id: SchemaRegistryError 404
                    known.add(schema_id)
            return by_prefix(data, ctx)

        return deserialize


class JsonSchemaSerde(RegistrySerde):
    """JSON values checked against a JSON Schema when written and read (``schema``; None:
    read with the writer's schema, which needs the registry)."""

    name = "json_schema"

    def __init__(
        self,
        schema: str | None = None,
        *,
        to_dict: Callable[[Any, Any], dict] | None = None,
        from_dict: Callable[[dict, Any], Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if schema is not None:
            _json_loads(schema, "schema")
        self.schema = schema
        self._to_dict, self._from_dict = to_dict, from_dict

    def column_type(self) -> Any:
        if self.schema is None or self._from_dict is not None:
            return None
        from streamplatform.registry.columns import json_schema_type_of

        return json_schema_type_of(self.schema)

    def _new_serializer(self, conf: dict[str, Any]) -> Callable[[Any, Any], bytes]:
        from confluent_kafka.schema_registry import prefix_schema_id_serializer
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        if self.schema is None and not conf.get("use.latest.version"):
            raise ConfigError(
                "Serdes.json_schema() without a schema can only read; to write, give it the "
                "schema or use_latest_version=True"
            )
        serializer = JSONSerializer(self.schema, self.client(), self._to_dict, conf)
        # The fast path (_fast_write): without the subject's latest schema (whose rules could
        # change the value), confluent's serializer writes the same 5 bytes before every value
        # to a subject: the first one written to a topic gives them for the next. Not for the
        # header format, nor with your objects (to_dict).
        learns = (
            self._shapes() is not None and self._to_dict is None
            and conf.get("schema.id.serializer") is prefix_schema_id_serializer
            and not conf.get("use.latest.version")
        )  # fmt: skip
        prefixes = self._prefixes()

        def serialize(value: Any, ctx: Any) -> bytes:
            data: bytes = serializer(value, ctx)
            if learns:
                self._shapes().learn(value, True)  # type: ignore[union-attr]
                prefixes.setdefault((ctx.field, ctx.topic), data[:5])
            return data

        return serialize

    def _new_deserializer(self) -> Callable[[bytes, Any], Any]:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        deserializer = JSONDeserializer(
            self.schema, self._from_dict, self.client(), _deserializer_conf()
        )
        shapes = self._shapes() if self._from_dict is None else None

        def deserialize(data: bytes, ctx: Any) -> Any:
            # A value confluent's deserializer read (and validated) makes every value of its
            # shape valid (_ValueShapes): learnt here, for _fast_read.
            value = deserializer(data, ctx)
            if shapes is not None and _plain_prefix(self, data, ctx):
                shapes.learn(value, True)
            return value

        return deserialize

    def _shapes(self) -> _ValueShapes | None:
        """What the schema says of the values of each shape seen, when it constrains nothing
        but the shapes of values (None: it constrains more, or there is no schema)."""
        if "_verdicts" not in self.__dict__:
            self.__dict__["_verdicts"] = (
                None if self.schema is None else _ValueShapes.of(_json_loads(self.schema, ""))
            )
        return self.__dict__["_verdicts"]  # type: ignore[no-any-return]

    def _prefixes(self) -> dict[tuple[Any, str], bytes]:
        """(field, topic) -> the 5 bytes confluent's serializer wrote before the first value
        there."""
        prefixes = self.__dict__.get("_fast")
        if prefixes is None:
            prefixes = self.__dict__["_fast"] = {}
        return prefixes  # type: ignore[no-any-return]

    def _fast_write(self, value: Any, is_key: bool | None, topic: str | None) -> bytes | None:
        prefixes = self.__dict__.get("_fast")
        if not prefixes:
            return None
        field = MessageField.KEY if is_key else MessageField.VALUE
        prefix = prefixes.get((field, "" if is_key is None else topic))
        shapes = self.__dict__.get("_verdicts")
        if prefix is None or shapes is None or shapes.valid(value) is not True:
            return None  # confluent's serializer validates it (and learns its shape)
        return prefix + orjson.dumps(value)  # confluent-kafka's encoding (orjson)

    def _fast_read(self, data: bytes, context: SerdeContext | None) -> Any:
        # Confluent's deserializer decodes with orjson, then validates against the schema.
        # A value of a shape it found valid before is valid: decoded here, not validated
        # again. Any other value goes through it (and its shape is learnt).
        shapes = self.__dict__.get("_verdicts")
        if shapes is None or self._from_dict is not None or not _plain_prefix(self, data, context):
            return _NOT_FAST
        try:
            value = orjson.loads(data[5:])
        except orjson.JSONDecodeError:
            return _NOT_FAST
        return value if shapes.valid(value) is True else _NOT_FAST

    def written_prefix(self, topic: str, is_key: bool) -> bytes | None:
        """The 5 bytes this serde writes before each value to ``topic``, once it has written
        one there; else None (runtime/sink_writers.py writes a value as read when it starts
        with them)."""
        prefixes = self.__dict__.get("_fast")
        if not prefixes or self._to_dict is not None:
            return None
        return prefixes.get((MessageField.KEY if is_key else MessageField.VALUE, topic))

    def writes_back_reads_of(self, other: Any) -> bool:
        """Whether what ``other`` reads, this serde writes back as read under the same
        schema id: both JSON Schema with the same schema and no objects of yours (up to
        JSON's formatting, as the JSON serde's records written as read)."""
        return (
            type(other) is JsonSchemaSerde and self.schema is not None
            and other.schema == self.schema
            and self._to_dict is None and other._from_dict is None
            and self._same_registry(other)
        )  # fmt: skip


def _plain_prefix(serde: RegistrySerde, data: bytes, context: Any) -> bool:
    """Whether ``data`` is a prefix-framed value (magic byte 0, a schema id) of a plain schema
    (no references, no rule set: nothing but the schema decides), its id in no header. The id
    is checked with the registry once (an unknown one raises, as confluent's deserializer).
    ``context``: ours (SerdeContext) or confluent's (SerializationContext), or None."""
    if len(data) < 5 or data[0] != 0:
        return False
    is_key = False
    if context is not None:
        is_key = context.is_key if isinstance(context, SerdeContext) else (
            context.field == MessageField.KEY)  # fmt: skip
        if context.headers:
            name = KEY_SCHEMA_ID_HEADER if is_key else VALUE_SCHEMA_ID_HEADER
            if any(header[0] == name for header in context.headers):
                return False
    checked = serde.__dict__.get("_checked_ids")
    if checked is None:
        checked = serde.__dict__["_checked_ids"] = {}
    schema_id = data[1:5]
    plain = checked.get(schema_id)
    if plain is None:
        # Asked as confluent's deserializer asks it (with the topic's subject), so that the
        # client's cache answers it the second time.
        topic = None if context is None else context.topic
        subject = f"{topic}-{'key' if is_key else 'value'}" if topic else None
        registered = serde.client().get_schema(int.from_bytes(schema_id, "big"), subject)
        plain = checked[schema_id] = not registered.references and not registered.rule_set
    return plain  # type: ignore[no-any-return]


class _ValueShapes:
    """A JSON Schema's verdicts on the shapes of values, for a schema whose verdict depends on
    nothing but a value's shape: the keys of its objects, the lengths of its arrays and the
    JSON type of each leaf (a float that is a whole number apart, as "integer" takes it).
    Such a schema uses only the keywords in ``SHAPE_KEYWORDS``; ``enum``, ``pattern``,
    ``minimum``, ``$ref`` and the like look at values, and make ``of`` give None.

    The verdicts come from confluent-kafka's own validation of a value of each shape (its
    serializer's or deserializer's), learnt when it ran (``learn``); ``valid`` gives the
    verdict on a value's shape, or None when none is known. Bounded: past ``MAX_SHAPES``
    shapes, new ones are not kept (their values go through confluent's validation)."""

    SHAPE_KEYWORDS = frozenset({
        "type", "properties", "required", "additionalProperties", "patternProperties",
        "propertyNames", "minProperties", "maxProperties", "dependencies",
        "dependentRequired", "dependentSchemas", "items", "additionalItems", "prefixItems",
        "minItems", "maxItems", "contains", "allOf", "anyOf", "oneOf", "not", "if", "then",
        "else", "title", "description", "$schema", "$id", "$comment", "default",
        "examples", "readOnly", "writeOnly", "deprecated",
    })  # fmt: skip
    MAX_SHAPES = 4096

    def __init__(self) -> None:
        self._verdicts: dict[Any, bool] = {}

    @classmethod
    def of(cls, schema: Any) -> _ValueShapes | None:
        return cls() if _shape_only(schema) else None

    def valid(self, value: Any) -> bool | None:
        shape = _shape_of(value)
        return None if shape is None else self._verdicts.get(shape)

    def learn(self, value: Any, valid: bool) -> None:
        if len(self._verdicts) < self.MAX_SHAPES:
            shape = _shape_of(value)
            if shape is not None:
                self._verdicts[shape] = valid


def _shape_only(schema: Any) -> bool:
    """Whether ``schema`` (and every schema in it) uses only ``_ValueShapes.SHAPE_KEYWORDS``.
    Keyword values that are schemas are checked in turn; names (properties' keys) are not
    keywords."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not schema.keys() <= _ValueShapes.SHAPE_KEYWORDS:
        return False
    for keyword, value in schema.items():
        if keyword in ("properties", "patternProperties", "dependentSchemas"):
            subschemas = list(value.values()) if isinstance(value, dict) else [None]
        elif keyword == "dependencies":
            if not isinstance(value, dict):
                return False
            subschemas = [v for v in value.values() if not isinstance(v, list)]
        elif keyword in ("allOf", "anyOf", "oneOf", "prefixItems") or (
            keyword == "items" and isinstance(value, list)
        ):
            subschemas = list(value) if isinstance(value, list) else [None]
        elif keyword in ("additionalProperties", "propertyNames", "items", "additionalItems",
                         "contains", "not", "if", "then", "else"):  # fmt: skip
            subschemas = [value]
        elif keyword == "type":  # names only (draft 3 also allowed schemas in the list)
            names = value if isinstance(value, list) else [value]
            if not all(isinstance(name, str) for name in names):
                return False
            continue
        else:
            continue  # an annotation, a count, required names
        if not all(_shape_only(subschema) for subschema in subschemas):
            return False
    return True


class _Unshaped(Exception):
    """A value ``_shape`` gives no shape: not plain JSON, or too big to keep."""


_LEAF_KINDS = frozenset({str, int, float, bool, type(None)})
_MAX_SHAPE_NODES = 256  # a bigger value is validated by confluent's serializers each time


def _shape_of(value: Any) -> Any:
    """``_shape`` of ``value``, or None: it has none (its verdict is never kept)."""
    try:
        return _shape(value, [_MAX_SHAPE_NODES])
    except _Unshaped:
        return None


def _shape(value: Any, budget: list[int]) -> Any:
    """A JSON value's shape (``_ValueShapes``): hashable, equal for values no shape-only
    schema tells apart. Plain JSON values only (dict, list, str, int, float, bool, None, and
    not their subclasses, which validators and encoders may take differently), of at most
    ``budget`` nodes, which also bounds the depth; raises ``_Unshaped`` otherwise."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Unshaped
    kind = type(value)
    if kind is dict:
        return (dict, tuple((key, _shape(item, budget)) for key, item in value.items()))
    if kind is list:
        return (list, tuple(_shape(item, budget) for item in value))
    if kind is float and value.is_integer():
        return "whole float"  # JSON Schema's "integer" takes 1.0
    if kind not in _LEAF_KINDS:
        raise _Unshaped
    return kind


def _json_loads(text: str | None, what: str) -> Any:
    import json

    try:
        return json.loads(text or "null")
    except ValueError as exc:
        raise ValueError(f"{what}: not JSON: {exc}") from None


def configure_registry_serdes(serdes: Any, settings: Mapping[str, Any]) -> None:
    """``configure`` each of ``serdes`` that is a registry serde, and check, before any record,
    that each has a registry to go to."""
    for serde in serdes:
        if isinstance(serde, RegistrySerde):
            serde.configure(settings)
            _client_conf(serde._settings())  # raises ConfigError naming the setting
