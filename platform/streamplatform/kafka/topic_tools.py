"""Produce to and read from a topic by hand: ``streamplatform topics produce`` / ``consume``.

Enough to look at a dead letter queue or an output topic, or to feed a job a few records:
``consume`` prints each record with its partition, offset, timestamp, key, value and headers
(the DLQ's ``__streams.errors.*`` headers included), and stops once it has read every partition
to its end (or follows the topic until SIGINT/SIGTERM); ``produce`` writes one record per
input line, ``key<TAB>value``.

Keys and values go through the serdes of :mod:`streamplatform.serdes`. What a serde cannot
decode is shown raw instead of ending the read: a DLQ holds exactly such records. Header values
are bytes in Kafka: shown as text when they are UTF-8, else as hex.

    >>> show_bytes(b"SerializationError")
    'SerializationError'
    >>> show_bytes(b"\\x00\\xff")
    'hex:00ff'
    >>> parse_line("k1\\t{\\"id\\": 1}", "\\t")
    ('k1', '{"id": 1}')
    >>> parse_line("no key here", "\\t")
    (None, 'no key here')
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from streamplatform.exceptions import StreamPlatformError
from streamplatform.serdes import Serde, Serdes, SerializationError

SERDES: dict[str, Callable[[], Serde]] = {
    "string": Serdes.string,
    "json": Serdes.json,
    "bytes": Serdes.bytes,
    "long": Serdes.long,
}
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_TIMESTAMP_TYPES = {1: "CreateTime", 2: "LogAppendTime"}


class TopicToolError(StreamPlatformError):
    """A wrong input or an unreachable topic, said in one line for the command line."""


def serde(name: str) -> Serde:
    try:
        return SERDES[name]()
    except KeyError:
        raise TopicToolError(f"unknown serde {name!r}: one of {', '.join(SERDES)}") from None


# Showing bytes ----------------------------------------------------------------------------------


def _printable(text: str) -> bool:
    return all(ch.isprintable() or ch in "\n\r\t" for ch in text)


def show_bytes(data: bytes | None) -> str:
    """Text when ``data`` is printable UTF-8, else ``hex:<digits>``; ``null`` for None."""
    if data is None:
        return "null"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"hex:{data.hex()}"
    return text if _printable(text) else f"hex:{data.hex()}"


def bytes_json(data: bytes | None) -> Any:
    """A JSON value for raw bytes: the text when printable UTF-8, else ``{"hex": ...}``."""
    if data is None:
        return None
    return data.decode("utf-8") if _is_text(data) else {"hex": data.hex()}


def _is_text(data: bytes) -> bool:
    try:
        return _printable(data.decode("utf-8"))
    except UnicodeDecodeError:
        return False


@dataclass(frozen=True)
class Decoded:
    """A key or value as its serde decoded it; ``error`` set (and ``value`` raw) when it could
    not, so a record a job could not read (a DLQ record's raw source) is still shown."""

    raw: bytes | None
    value: Any
    error: str | None = None

    def text(self, serde_name: str) -> str:
        if self.raw is None:
            return "null"
        if self.error is not None:
            return f"{show_bytes(self.raw)}  (not {serde_name}: {self.error})"
        if isinstance(self.value, bytes):
            return show_bytes(self.value)
        if serde_name == "json":
            return json.dumps(self.value, ensure_ascii=False)
        return str(self.value)

    def as_json(self) -> Any:
        if self.raw is None:
            return None
        if self.error is not None:
            return {"raw": bytes_json(self.raw), "error": self.error}
        if isinstance(self.value, bytes):
            return bytes_json(self.value)
        return self.value


def decode(serde_: Serde, data: bytes | None) -> Decoded:
    try:
        return Decoded(data, serde_.deserialize(data))
    except SerializationError as error:
        return Decoded(data, None, str(error))


# Consuming --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int | None
    timestamp_type: str | None
    key: Decoded
    value: Decoded
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "timestamp_type": self.timestamp_type,
            "key": self.key.as_json(),
            "value": self.value.as_json(),
            "headers": [_header_json(name, value) for name, value in self.headers],
        }

    def as_text(self, key_serde: str, value_serde: str, stacktrace: bool = False) -> str:
        """The record for a console. A header of several lines (a DLQ record's stack trace)
        is shown by its last line and how many there are, unless ``stacktrace``."""
        when = "no timestamp"
        if self.timestamp is not None:
            iso = datetime.fromtimestamp(self.timestamp / 1000, UTC).isoformat(
                timespec="milliseconds"
            )
            when = f"{iso.replace('+00:00', 'Z')} ({self.timestamp}, {self.timestamp_type})"
        lines = [
            f"partition {self.partition}  offset {self.offset}  timestamp {when}",
            _field("key", self.key.text(key_serde)),
            _field("value", self.value.text(value_serde)),
        ]
        if self.headers:
            lines.append("  headers:")
            lines += [_field(name, _header_text(show_bytes(value), stacktrace), indent=4)
                      for name, value in self.headers]  # fmt: skip
        else:
            lines.append("  headers: none")
        return "\n".join(lines)


def _header_text(text: str, whole: bool) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    if whole or len(lines) <= 1:
        return text
    return f"{lines[-1].strip()}  ({len(lines)} lines; --stacktrace shows them)"


def _header_json(name: str, value: bytes | None) -> dict[str, Any]:
    if value is None:
        return {"name": name, "value": None}
    if _is_text(value):
        return {"name": name, "value": value.decode("utf-8")}
    return {"name": name, "hex": value.hex()}


def _field(name: str, text: str, indent: int = 2) -> str:
    """``name: text``; the lines of a multi-line text (a stack trace) indented under it."""
    pad = " " * indent
    continuation = "\n" + pad + "  "
    return f"{pad}{name}: {continuation.join(text.splitlines()) if text else text}"


@dataclass
class ConsumeSummary:
    records: int = 0
    stopped_by: str = ""  # "end", "max-messages", "timeout", or a signal name
    partitions: int = 0


class _Stop:
    """SIGINT and SIGTERM (when installed from the main thread) end a read between polls."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal = ""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        self.signal = signal.Signals(signum).name
        self.event.set()


def consume(
    settings: Mapping[str, Any],
    topic: str,
    *,
    key_serde: str = "string",
    value_serde: str = "string",
    from_beginning: bool = True,
    partitions: Iterable[int] | None = None,
    max_messages: int | None = None,
    timeout_ms: int | None = None,
    follow: bool = False,
    isolation_level: str = "read_committed",
    on_record: Callable[[ConsumedRecord], None],
    stop: threading.Event | None = None,
) -> ConsumeSummary:
    """Read ``topic`` and call ``on_record`` for each record, in offset order per partition.

    Without ``follow`` the read ends once every partition was read to its end (under
    ``read_committed``, its last stable offset), or after ``timeout_ms`` (default 10 s)
    without a record or an end reached. With ``follow`` it goes on until SIGINT/SIGTERM,
    ``stop.set()``, or ``timeout_ms`` without a record when given. The consumer joins no group
    and commits nothing: reading a topic this way changes nothing for the jobs that read it.
    """
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from streamplatform.kafka.clients import consumer, describe_topics

    if isolation_level not in ISOLATION_LEVELS:
        raise TopicToolError(
            f"--isolation-level {isolation_level!r}: one of {', '.join(ISOLATION_LEVELS)}"
        )
    keys, values = serde(key_serde), serde(value_serde)
    count = _partitions(describe_topics, settings, topic)
    wanted = sorted(set(range(count) if partitions is None else partitions))
    if not wanted or any(not 0 <= p < count for p in wanted):
        raise TopicToolError(f"{topic} has partitions 0..{count - 1}; asked for {wanted}")
    if max_messages is not None and max_messages <= 0:
        return ConsumeSummary(0, "max-messages", len(wanted))
    idle_s = (None if follow else 10.0) if timeout_ms is None else timeout_ms / 1000
    reader = consumer(
        settings,
        f"streamplatform-cli-{os.getpid()}",  # never used: partitions are assigned, not joined
        **{
            "isolation.level": isolation_level,
            "enable.partition.eof": True,
            "enable.auto.offset.store": False,
        },
    )
    summary = ConsumeSummary(partitions=len(wanted))
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    at_end: set[int] = set()
    try:
        with _Stop() as signals:
            stopped = stop or threading.Event()
            reader.assign([KafkaTopicPartition(topic, p, start) for p in wanted])
            last_news = time.monotonic()
            while True:
                if stopped.is_set() or signals.event.is_set():
                    summary.stopped_by = signals.signal or "stop"
                    break
                if idle_s is not None and time.monotonic() - last_news > idle_s:
                    summary.stopped_by = "timeout"
                    break
                message: Any = reader.poll(0.2)  # confluent-kafka's types allow None fields
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        last_news = time.monotonic()
                        at_end.add(message.partition())
                        if not follow and at_end >= set(wanted):
                            summary.stopped_by = "end"
                            break
                        continue
                    if error.fatal() or not error.retriable():
                        raise TopicToolError(f"reading {topic}: {error.str()}")
                    continue
                last_news = time.monotonic()
                at_end.discard(message.partition())
                kind, stamp = message.timestamp()
                on_record(
                    ConsumedRecord(
                        topic=message.topic(),
                        partition=message.partition(),
                        offset=message.offset(),
                        timestamp=stamp if kind in _TIMESTAMP_TYPES else None,
                        timestamp_type=_TIMESTAMP_TYPES.get(kind),
                        key=decode(keys, message.key()),
                        value=decode(values, message.value()),
                        headers=list(message.headers() or []),
                    )
                )
                summary.records += 1
                if max_messages is not None and summary.records >= max_messages:
                    summary.stopped_by = "max-messages"
                    break
    finally:
        reader.close()
    return summary


def _partitions(describe: Callable[..., dict[str, int]], settings: Any, topic: str) -> int:
    try:
        return describe(settings, [topic])[topic]
    except LookupError as error:
        raise TopicToolError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - the broker cannot be reached: say so, in one line
        from streamplatform.kafka.security import why_unreachable

        raise TopicToolError(
            f"cannot reach Kafka at bootstrap.servers={settings.get('bootstrap.servers')}: {error}"
            f"{why_unreachable(settings)}"
        ) from None


# Producing --------------------------------------------------------------------------------------


def parse_line(line: str, key_separator: str | None) -> tuple[str | None, str]:
    """``key<separator>value`` -> (key, value); a line without the separator has no key (None).
    ``key_separator`` None: the whole line is the value."""
    if key_separator is None or key_separator not in line:
        return None, line
    key, value = line.split(key_separator, 1)
    return key, value


def encode(serde_name: str, text: str | None, what: str) -> bytes | None:
    """A key or value given as text, in the serde's bytes: ``string`` as is, ``json`` the JSON
    text (checked, written compact), ``long`` a decimal integer (8 bytes big-endian, as
    Kafka's LongSerializer), ``bytes`` hex digits."""
    if text is None:
        return None
    try:
        if serde_name == "json":
            return serde("json").serialize(json.loads(text))
        if serde_name == "long":
            return serde("long").serialize(int(text.strip()))
        if serde_name == "bytes":
            return bytes.fromhex(text.strip().removeprefix("hex:"))
        return serde(serde_name).serialize(text)
    except (ValueError, SerializationError) as error:
        raise TopicToolError(f"{what} {text!r} is not {serde_name}: {error}") from None


def parse_header(spec: str) -> tuple[str, bytes]:
    name, sep, value = spec.partition("=")
    if not sep or not name:
        raise TopicToolError(f"--header {spec!r}: give it as name=value")
    return name, value.encode("utf-8")


@dataclass(frozen=True)
class ProducedRecord:
    partition: int
    offset: int


def parse_timestamp(text: Any, what: str) -> int:
    """A record timestamp: milliseconds since the epoch, or an ISO-8601 date-time (UTC when
    it names no zone)."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    if isinstance(text, str):
        if text.strip().isdigit():
            return int(text.strip())
        try:
            moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            return int(moment.timestamp() * 1000)
    raise TopicToolError(f"{what}: {text!r} is not a timestamp (ms since the epoch, or an "
                         "ISO-8601 date-time such as 2026-01-01T12:00:00Z)")  # fmt: skip


@dataclass(frozen=True)
class _Outgoing:
    key: bytes | None
    value: bytes | None
    timestamp: int | None
    partition: int | None
    headers: list[tuple[str, bytes]]


def _json_line(line: str, number: int, key_serde: str, value_serde: str) -> _Outgoing:
    """One record of a JSON-lines input: ``{"key", "value", "timestamp", "partition",
    "headers": {name: text}}``, every field optional (a missing or null value: a tombstone).
    A JSON value given to the json serde is written as JSON; to the others, as text."""
    try:
        fields = json.loads(line)
    except ValueError as error:
        raise TopicToolError(f"line {number}: not JSON ({error})") from None
    if not isinstance(fields, dict):
        raise TopicToolError(f"line {number}: expected an object with key, value, timestamp, "
                             "partition, headers")  # fmt: skip
    unknown = sorted(set(fields) - {"key", "value", "timestamp", "partition", "headers"})
    if unknown:
        raise TopicToolError(f"line {number}: unknown field(s) {', '.join(unknown)}")

    def as_text(name: str, serde_name: str) -> str | None:
        given = fields.get(name)
        if given is None:
            return None
        if serde_name == "json" or not isinstance(given, str):
            return json.dumps(given)
        return given

    timestamp = fields.get("timestamp")
    partition = fields.get("partition")
    if partition is not None and (not isinstance(partition, int) or partition < 0):
        raise TopicToolError(f"line {number}: partition {partition!r} is not a partition number")
    headers = fields.get("headers") or {}
    if not isinstance(headers, dict):
        raise TopicToolError(f"line {number}: headers must be an object of name: text")
    return _Outgoing(
        encode(key_serde, as_text("key", key_serde), f"line {number}: key"),
        encode(value_serde, as_text("value", value_serde), f"line {number}: value"),
        None if timestamp is None else parse_timestamp(timestamp, f"line {number}: timestamp"),
        partition,
        [(str(name), str(value).encode()) for name, value in headers.items()],
    )


def produce(
    settings: Mapping[str, Any],
    topic: str,
    lines: Iterable[str],
    *,
    key_serde: str = "string",
    value_serde: str = "string",
    key_separator: str | None = "\t",
    headers: Iterable[str] = (),
    partition: int | None = None,
    null_value: str | None = None,
    timestamp: int | None = None,
    json_lines: bool = False,
) -> list[ProducedRecord]:
    """Write one record per line to ``topic`` (idempotent producer, keys partitioned as Java
    clients do unless ``partition`` is given); waits until the broker has every one, and
    returns where each went, in input order. A line equal to ``null_value`` is a tombstone.
    ``timestamp``: every record's (ms; default: the time it is sent). ``json_lines``: each line
    a JSON object with the record's own key, value, timestamp, partition and headers."""
    from streamplatform.kafka.clients import describe_topics, producer

    serde(key_serde), serde(value_serde)  # an unknown name fails before Kafka is asked
    record_headers = [parse_header(spec) for spec in headers]
    count = _partitions(describe_topics, settings, topic)
    records: list[_Outgoing] = []
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line and (null_value is None or json_lines):
            continue  # an empty line is no record (a trailing newline, a blank between)
        if json_lines:
            record = _json_line(line, number, key_serde, value_serde)
        else:
            key, value = parse_line(line, key_separator)
            record = _Outgoing(
                encode(key_serde, key, f"line {number}: key"),
                None if value == null_value else encode(value_serde, value,
                                                        f"line {number}: value"),
                None, None, [],
            )  # fmt: skip
        records.append(record)
    for number, record in enumerate(records, 1):
        chosen = record.partition if record.partition is not None else partition
        if chosen is not None and not 0 <= chosen < count:
            raise TopicToolError(f"{topic} has partitions 0..{count - 1}; record {number} asked "
                                 f"for {chosen}")  # fmt: skip
    writer = producer(settings, **{"enable.idempotence": True})
    delivered: dict[int, ProducedRecord] = {}
    failures: list[str] = []

    def report(index: int) -> Callable[[Any, Any], None]:
        def on_delivery(error: Any, message: Any) -> None:
            if error is not None:
                failures.append(f"record {index + 1}: {error.str()}")
            else:
                delivered[index] = ProducedRecord(message.partition(), message.offset())

        return on_delivery

    for index, record in enumerate(records):
        options: dict[str, Any] = {}
        chosen = record.partition if record.partition is not None else partition
        if chosen is not None:
            options["partition"] = chosen
        when = record.timestamp if record.timestamp is not None else timestamp
        if when is not None:
            options["timestamp"] = when
        all_headers: Any = record_headers + record.headers
        while True:
            try:
                writer.produce(topic, key=record.key, value=record.value,
                               headers=all_headers or None, on_delivery=report(index),
                               **options)  # fmt: skip
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                writer.poll(0.5)
        writer.poll(0)
    remaining = writer.flush(60)
    if remaining:
        failures.append(f"{remaining} records not acknowledged by the broker within 60 s")
    if failures:
        raise TopicToolError(f"writing to {topic}: " + "; ".join(failures[:5]))
    return [delivered[index] for index in range(len(records))]
