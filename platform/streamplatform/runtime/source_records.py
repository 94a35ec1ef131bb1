"""A task's source records: their keys and values decoded (in bulk where the serdes can), and
their event time as the sources' timestamp extractors give it, for processing and for ordering
a task's input queues (partition_group.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import orjson

from streamplatform.dsl.graph import SourceNode
from streamplatform.records import ConsumedRecord
from streamplatform.serdes import Serdes, deserialize_all, deserializer_for, uses_context

_MAX_TIME = 2**63 - 1  # Kafka's timestamps are int64
UNDECODED = object()  # decoded: a record whose key and value process_all decodes
# Records decoded at once by decoded. Small: a slice's decoded values are still in the
# CPU's cache when the loop reaches them. Decoding a 10k-record chunk at once cost more than it
# saved (measured per record, same task: 128 → −0.4 µs, 1,024 → −0.2 µs, 10,000 → +0.5 µs).
DECODE_SLICE = 128

try:  # a slice decoded in one pass in C (runtime/_task_loop.c), where the package was built so
    from streamplatform.runtime._task_loop import decode_slice as _native_decode_slice
except ImportError:  # pragma: no cover - depends on the build
    _native_decode_slice = None  # type: ignore[assignment]
# The serdes whose decoding _native_decode_slice knows (_task_loop.c, DECODE_*), by type: the
# built-in string, bytes and JSON serdes, as deserialize_all decodes them.
_NATIVE_KINDS = {type(Serdes.string()): 1, type(Serdes.bytes()): 2, type(Serdes.json()): 3}
# Tests set this to False to hold the C decoding to deserialize_all.
NATIVE_DECODE = True


def decode_slice(source: Any, records: list, start: int) -> Iterator[tuple[Any, Any, Any]]:
    """Records ``[start, start + DECODE_SLICE)`` of ``records`` for ``decoded``."""
    if _native_decode_slice is not None and NATIVE_DECODE:
        key_kind = _NATIVE_KINDS.get(type(source.key_serde))
        value_kind = _NATIVE_KINDS.get(type(source.value_serde))
        if key_kind is not None and value_kind is not None:
            triples = _native_decode_slice(records, start, DECODE_SLICE, key_kind, value_kind,
                                           orjson.loads)  # fmt: skip
            if triples is not None:
                return iter(triples)
            part = records[start : start + DECODE_SLICE]
            return zip(part, repeat(UNDECODED), repeat(UNDECODED))
    part = records[start : start + DECODE_SLICE]
    # The records' headers, for serdes that read them (a registry serde's schema id).
    headers = (
        list(map(itemgetter(6), part))
        if uses_context(source.key_serde) or uses_context(source.value_serde) else None
    )  # fmt: skip
    keys = deserialize_all(source.key_serde, list(map(itemgetter(4), part)), headers, True)
    if keys is not None:
        values = deserialize_all(source.value_serde, list(map(itemgetter(5), part)), headers)
        if values is not None:
            return zip(part, keys, values, strict=True)
    return zip(part, repeat(UNDECODED), repeat(UNDECODED))


def undecoded_values(
    sources: Mapping[str, SourceNode],
    processors: Mapping[str, Any],
    default_extractor: Callable | None,
) -> dict[str, SourceNode]:
    """``sources``, where a repartition topic's values are read by no processor (only
    count()s, which look at whether a value is None) taken as bytes instead of decoded:
    the task writes them itself, so they decode without error, and a null value stays
    None either way. Not when a timestamp extractor may read the value."""
    result = dict(sources)
    for topic, source in sources.items():
        readers = [processors.get(child) for child in source.children]
        if (
            source.internal and source.timestamp_extractor is None and default_extractor is None
            and readers and all(r is not None and not r.reads_values() for r in readers)
        ):  # fmt: skip
            result[topic] = dataclasses.replace(source, value_serde=Serdes.bytes())
    return result


def deserializers(source: SourceNode, topic: str) -> tuple[Callable, Callable, bool]:
    """A source's key and value deserializers, and whether they take the record's headers as
    well: a serde that uses a context gets the topic, key or value, and the headers."""
    key_serde, value_serde = source.key_serde, source.value_serde
    if not (uses_context(key_serde) or uses_context(value_serde)):
        return key_serde.deserialize, value_serde.deserialize, False
    return (
        deserializer_for(key_serde, topic, True),
        deserializer_for(value_serde, topic, False),
        True,
    )


def ordering_time(
    sources: Mapping[str, SourceNode],
    default_extractor: Callable | None,
    partition_times: Mapping[tuple[str, int], int],
) -> Callable[[Any], int] | None:
    """Each input record's timestamp as Kafka Streams' record queues stamp it when it
    enters the task: the extracted one (``timestamp_extractor=`` or
    ``default.timestamp.extractor``), for ordering the task's input queues
    (partition_group.py); None when no source has an extractor (the record's own).

    Called once per record, in each partition's order, ahead of processing: it keeps its
    own partition times. A record whose key, value or time cannot be had is ordered by its
    own timestamp; processing then hands it to the deserialization handler."""
    extractors = {
        topic: source.timestamp_extractor or default_extractor for topic, source in sources.items()
    }
    if not any(extractors.values()):
        return None
    decoders = {topic: deserializers(source, topic) for topic, source in sources.items()}
    times = dict(partition_times)

    def time_of(record: Any) -> int:
        extract = extractors.get(record[0])
        if extract is None:
            return record[3]  # type: ignore[no-any-return]
        key_of, value_of, contextual = decoders[record[0]]
        partition = (record[0], record[1])
        partition_time = times.get(partition, -1)
        try:
            if contextual:
                key, value = key_of(record[4], record[6]), value_of(record[5], record[6])
            else:
                key, value = key_of(record[4]), value_of(record[5])
            given = ConsumedRecord(record[0], record[1], record[2], record[3], key, value,
                                   record[6])  # fmt: skip
            timestamp = extract(given, partition_time)
        except Exception:
            return record[3]  # type: ignore[no-any-return]
        if type(timestamp) is not int or timestamp < 0:
            return record[3]  # type: ignore[no-any-return]
        if timestamp > partition_time:
            times[partition] = timestamp
        return timestamp

    return time_of


def extracted(
    partition_times: dict[tuple[str, int], int],
    extract: Callable,
    record: Any,
    key: Any,
    value: Any,
) -> int:
    """``record``'s event time by ``extract(record, partition_time)`` (the record with
    its key and value deserialized; partition time: the largest event time extracted on
    its partition so far, -1 before any). A negative or missing time raises (the
    deserialization handler takes the record, as Kafka Streams' would)."""
    partition = (record[0], record[1])
    partition_time = partition_times.get(partition, -1)
    given = ConsumedRecord(record[0], record[1], record[2], record[3], key, value, record[6])
    timestamp = extract(given, partition_time)
    if type(timestamp) is not int or timestamp < 0 or timestamp > _MAX_TIME:
        raise ValueError(
            f"the timestamp extractor gave {timestamp!r} for {record[0]}-{record[1]} "
            f"offset {record[2]}: an event time must be an int >= 0 (ms) that fits Kafka's "
            "int64"
        )
    if timestamp > partition_time:
        partition_times[partition] = timestamp
    return timestamp


def decoded(
    sources: Mapping[str, SourceNode], records: Iterable[ConsumedRecord]
) -> Iterator[tuple[Any, Any, Any]]:
    """``(record, key, value)`` for each of ``records``. A list of records of one source
    topic, or of several whose sources share both serdes, whose serdes decode in bulk
    (``deserialize_all``) comes with its keys and values decoded, a slice at a time, as
    the loop reaches it; anything else (or a slice with a value that fails) with
    ``UNDECODED`` for both, and ``process_all`` decodes each record itself (and hands a
    failure to the handler at its record)."""
    if type(records) is list and len(records) > 1:
        topics = list(map(itemgetter(0), records))
        source = sources.get(topics[0])
        if source is not None and topics.count(topics[0]) != len(topics):
            # Several topics (a join's or a merge's, read merged): decoded together when
            # their sources share both serdes.
            others = [sources.get(topic) for topic in set(topics)]
            if not all(
                other is not None
                and other.key_serde is source.key_serde
                and other.value_serde is source.value_serde
                for other in others
            ):
                source = None
        if source is not None:
            return chain.from_iterable(
                map(
                    partial(decode_slice, source, records),
                    range(0, len(records), DECODE_SLICE),
                )
            )
    return zip(records, repeat(UNDECODED), repeat(UNDECODED))
