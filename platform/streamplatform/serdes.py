"""Serdes: how keys and values become bytes and back.

As in Kafka, ``None`` (a null key, a tombstone) passes through both ways untouched. A failure
raises :class:`SerializationError`, which carries the raw bytes so an exception handler can put
them in the dead letter queue.

A serde that needs to know what it is (de)serializing, as Kafka's
``serialize(topic, headers, data)`` does, sets ``uses_context = True`` and takes a
:class:`SerdeContext` as a second argument: the topic, whether it is the key or the value, and
the record's headers (a list it may append to when serializing). The registry serdes
(``Serdes.avro``, ``Serdes.protobuf``, ``Serdes.json_schema``) are such serdes. The job's
settings reach a serde that has a ``configure(settings)`` method before its first record.
Serdes without either keep working as they are.

    >>> Serdes.json().serialize({"id": 1})
    b'{"id":1}'
    >>> Serdes.long().deserialize(Serdes.long().serialize(-5))
    -5
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import orjson

from streamplatform.exceptions import StreamPlatformError

if TYPE_CHECKING:
    from streamplatform.registry.serdes import RegistrySerde

__all__ = ["Serde", "SerdeContext", "SerializationError", "Serdes"]

# Contravariant: a serde of ``T`` serializes any ``T``; what ``deserialize`` returns stays Any.
T_contra = TypeVar("T_contra", contravariant=True)


class SerializationError(StreamPlatformError):
    """A value could not be (de)serialized; ``raw`` holds the bytes involved, if any."""

    def __init__(self, message: str, raw: bytes | None = None) -> None:
        super().__init__(message)
        self.raw = raw


@runtime_checkable
class Serde(Protocol[T_contra]):
    """Turns values into bytes and back; both directions map None to None.

    Generic in the type of the values it serializes, for type checkers only: ``Serdes.string()``
    is a ``Serde[str]``, so ``builder.stream(topic, Serdes.string(), Serdes.json())`` is a
    ``KStream[str, Any]``. A bare ``Serde`` is a ``Serde[Any]``."""

    name: str

    def serialize(self, value: T_contra) -> bytes | None: ...

    def deserialize(self, data: bytes | None) -> Any: ...


class SerdeContext(NamedTuple):
    """What a serde with ``uses_context = True`` is given with each key or value.

    ``topic``: the topic the bytes come from or go to (a store's data has none: ``None``).
    ``is_key``: the key (True) or the value. ``headers``: the record's headers as a list of
    ``(name, bytes)``; when serializing, a serde may append to it (the schema-id header), and
    the record is written with what the list holds; ``None`` where a record has no headers to
    carry (store data)."""

    topic: str | None
    is_key: bool
    headers: list[tuple[str, bytes | None]] | None = None


def uses_context(serde: Any) -> bool:
    """Whether ``serde`` takes a :class:`SerdeContext` with each call."""
    return bool(getattr(serde, "uses_context", False))


def configure_serde(serde: Any, settings: Mapping[str, Any]) -> None:
    """Give ``serde`` the job's settings, if it takes them (Kafka's ``Serde.configure``)."""
    configure = getattr(serde, "configure", None)
    if configure is not None:
        configure(settings)


def serializer_for(
    serde: Any, topic: str | None, is_key: bool
) -> Callable[[Any, list | None], bytes | None]:
    """``serialize(value, headers)`` for ``serde`` writing to ``topic``: with a context for a
    serde that uses one, the plain call otherwise."""
    if uses_context(serde):
        serialize = serde.serialize
        return lambda value, headers: serialize(value, SerdeContext(topic, is_key, headers))
    plain = serde.serialize
    return lambda value, headers: plain(value)


def deserializer_for(
    serde: Any, topic: str | None, is_key: bool
) -> Callable[[Any, list | None], Any]:
    """``deserialize(data, headers)`` for ``serde`` reading from ``topic``, as
    :func:`serializer_for`."""
    if uses_context(serde):
        deserialize = serde.deserialize
        return lambda data, headers: deserialize(data, SerdeContext(topic, is_key, headers))
    plain = serde.deserialize
    return lambda data, headers: plain(data)


class _StringSerde:
    name = "string"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _shared_serde, ("string",)

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise SerializationError(f"string serde got {type(value).__name__}, not str")
        return value.encode()

    def deserialize(self, data: bytes | None) -> str | None:
        if data is None:
            return None
        try:
            return data.decode() if type(data) is bytes else bytes(data).decode()
        except UnicodeDecodeError as exc:
            raise SerializationError(f"not UTF-8: {exc}", raw=bytes(data)) from exc


class _BytesSerde:
    name = "bytes"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _shared_serde, ("bytes",)

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if not isinstance(value, bytes | bytearray | memoryview):
            raise SerializationError(f"bytes serde got {type(value).__name__}, not bytes")
        return bytes(value)

    def deserialize(self, data: bytes | None) -> bytes | None:
        return None if data is None else bytes(data)


class _LongSerde:
    """Kafka's LongSerializer: 8 bytes, big-endian, signed."""

    name = "long"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _shared_serde, ("long",)

    _format = struct.Struct(">q")

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise SerializationError(f"long serde got {type(value).__name__}, not int")
        try:
            return self._format.pack(value)
        except struct.error as exc:
            raise SerializationError(f"{value} does not fit in 64 bits") from exc

    def deserialize(self, data: bytes | None) -> int | None:
        if data is None:
            return None
        if len(data) != 8:
            raise SerializationError(f"a long needs 8 bytes, got {len(data)}", raw=bytes(data))
        return int(self._format.unpack(data)[0])


# A run of 19 digits: the only way JSON text holds an integer beyond 64 bits. Found by mapping
# digits to "0" and everything else to " " (two C-speed passes, half the cost of a regex).
_DIGITS_AS_ZEROS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_NINETEEN_DIGITS = b"0" * 19


class _JsonSerde:
    """Compact UTF-8 JSON, by orjson (about ten times faster than the standard library, which
    is kept as the fallback for what orjson refuses: integers beyond 64 bits)."""

    name = "json"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _shared_serde, ("json",)

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        try:
            data = orjson.dumps(value)
        except TypeError:  # dict keys that are not str, say, or a type orjson does not know
            try:
                data = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)  # slower: not first
            except TypeError:
                data = b"null"  # the standard library decides below
        # orjson writes infinity and NaN as null, silently; the standard library refuses them
        # (JSON has neither). Values with a null take that slower, strict path. (``find`` is
        # cheaper than ``in`` here, and this runs once per record.)
        if data.find(b"null") < 0:
            # A copy: orjson returns its whole 4 KiB output buffer (orjson 3.13), whatever the
            # length of the JSON, and a sink keeps its records until the batch's output is
            # taken. Kept, each would fault in a fresh page (2.4 us a record, 4 KiB of memory);
            # the right-sized copy costs a tenth of that and frees the buffer for the next.
            return memoryview(data).tobytes()
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"not JSON-serializable: {exc}") from exc
        return text.encode()

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            if type(data) is not bytes:
                data = bytes(data)
            if data.translate(_DIGITS_AS_ZEROS).find(_NINETEEN_DIGITS) < 0:
                return orjson.loads(data)
            # orjson would turn integers beyond 64 bits into floats, silently losing digits.
            return json.loads(data)
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise SerializationError(f"not JSON: {exc}", raw=bytes(data)) from exc


def deserialize_all(
    serde: Serde, datas: list[Any], headers: list | None = None, is_key: bool = False
) -> list[Any] | None:
    """``[serde.deserialize(d) for d in datas]`` in one pass, for the built-in string, bytes and
    JSON serdes (pure functions, so decoding ahead of processing changes nothing). None for any
    other serde, and whenever a value fails or needs the slow path: the caller then
    deserializes record by record, which reports a failure at its record, in order.

    A task decodes a chunk of source records this way. For JSON it saves a call per record
    and checks the whole chunk for integers beyond 64 bits at once (one scan of the joined
    values instead of one per record): together about half of the per-record decoding cost.

    The Avro registry serde too (``_read_all``: its compiled reader, registry/avro_program.py),
    given each value's record ``headers`` (None: the records have none) and whether they are
    keys: a schema id in a header takes the record-by-record path."""
    kind = type(serde)
    try:
        if kind is _StringSerde:
            return [None if data is None else data.decode() for data in datas]
        if kind is _BytesSerde:  # bytes(data) of bytes is data itself
            return [data if data is None or type(data) is bytes else bytes(data)
                    for data in datas]  # fmt: skip
        if kind is _JsonSerde:
            present = [data for data in datas if data is not None]
            if not all(type(data) is bytes for data in present):
                return None
            # b"," is no digit: a run of digits cannot span two values.
            if b",".join(present).translate(_DIGITS_AS_ZEROS).find(_NINETEEN_DIGITS) >= 0:
                return None  # some value needs the standard library (see deserialize)
            if len(present) == len(datas):
                return list(map(orjson.loads, datas))
            loads = orjson.loads
            return [None if data is None else loads(data) for data in datas]
        read_all = getattr(serde, "_read_all", None)  # the registry serdes
        if read_all is not None:
            return read_all(datas, headers, is_key)  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - the record-by-record path reports it at its record
        return None
    return None


def _shared_serde(name: str) -> Serde[Any]:
    """The shared instance of a built-in serde, by name: what one unpickles as (a job's
    topology reaches Spark's executors pickled), so that ``serde is Serdes.long()`` holds
    there too. The C cores' fast paths (a count's results, string keys) are chosen so."""
    return getattr(Serdes, name)()  # type: ignore[no-any-return]


class Serdes:
    """The built-in serdes (stateless; each call returns a shared instance, pickled as it)."""

    _string = _StringSerde()
    _bytes = _BytesSerde()
    _long = _LongSerde()
    _json = _JsonSerde()

    @staticmethod
    def string() -> Serde[str]:
        return Serdes._string

    @staticmethod
    def bytes() -> Serde[bytes]:
        return Serdes._bytes

    @staticmethod
    def long() -> Serde[int]:
        return Serdes._long

    @staticmethod
    def json() -> Serde[Any]:
        return Serdes._json

    # Schema Registry serdes (Confluent's wire format, on confluent_kafka.schema_registry):
    # each call returns a new serde. See streamplatform.registry.serdes for the arguments.

    @staticmethod
    def avro(schema: str | None = None, **options: Any) -> RegistrySerde:
        """Avro records as dicts. ``schema``: the writer schema, and the reader schema that
        records written with older compatible schemas are resolved to (None: read with the
        writer's schema; writing then needs ``use_latest_version=True``)."""
        from streamplatform.registry.serdes import AvroSerde

        return AvroSerde(schema, **options)

    @staticmethod
    def protobuf(message_type: type, **options: Any) -> RegistrySerde:
        """Protobuf messages of the generated class ``message_type``."""
        from streamplatform.registry.serdes import ProtobufSerde

        return ProtobufSerde(message_type, **options)

    @staticmethod
    def json_schema(schema: str | None = None, **options: Any) -> RegistrySerde:
        """JSON values validated against a JSON Schema (``schema``; None: read with the
        writer's schema and do not validate)."""
        from streamplatform.registry.serdes import JsonSchemaSerde

        return JsonSchemaSerde(schema, **options)


# The serdes whose encoding of a decoded value gives the bytes it was decoded from: a sink
# with the same serdes as its source writes an unchanged record's bytes as read (Task). For
# JSON that holds up to formatting (whitespace, escapes, number spelling): the text is kept.
# By class, not instance: they are stateless, and a topology pickled to Spark's workers
# arrives with copies of the shared instances.
AS_READ_SERDES: frozenset[type] = frozenset({_StringSerde, _BytesSerde, _LongSerde, _JsonSerde})
