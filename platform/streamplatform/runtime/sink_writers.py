"""How a task writes to its sinks: a record serialized (or written as read), its partition
chosen for a repartition topic, and collected as the task's output with the source record
behind it. Functions of the task (runtime/task.py), which calls them when it builds its
delivery functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from streamplatform.dsl.graph import ProcessorNode, RecordContext, SinkNode, SourceNode, topic_name
from streamplatform.errors.exceptions import StreamsError
from streamplatform.errors.handlers import PROCESSING, PRODUCTION
from streamplatform.identity import canonical_bytes
from streamplatform.records import NO_SOURCE, ProducerRecord, Record
from streamplatform.runtime.partitioner import partition_for
from streamplatform.serdes import AS_READ_SERDES, Serdes, serializer_for, uses_context

_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__

try:  # a sink's write in C (runtime/_task_loop.c), built where a C compiler is available
    from streamplatform.runtime._task_loop import Writer as _native_writer
except ImportError:  # pragma: no cover - depends on the build
    _native_writer = None  # type: ignore[assignment,misc]
# Tests set this to False to build the Python reference where the C writer would be built.
NATIVE_WRITER = True


def sink_writer(task: Any, sink: SinkNode) -> Callable[[Record], None]:
    """The delivery function of a sink: serialize, choose the partition, collect."""
    if sink.topic_extractor is not None:
        return dynamic_writer(task, sink)
    topic = topic_name(sink.topic, sink.internal, task.application_id)
    serialize_key, serialize_value = sink.key_serde.serialize, sink.value_serde.serialize
    append, add_source = task.output.append, task.output_sources.append
    internal, new_record = sink.internal, _new_tuple
    as_read = written_as_read(task, sink)

    if uses_context(sink.key_serde) or uses_context(sink.value_serde):
        return context_writer(task, sink, topic)
    if not as_read and internal and sink.partition_by is None and sink.partitioner is None:
        return repartition_writer(task, sink, topic)
    if not internal and _native_writer is not None and NATIVE_WRITER:
        # `write` below in C, for a sink of a topic of its own (no partition to choose).
        return _native_writer(  # type: ignore[no-any-return]
            task=task, topic=topic, serialize_key=serialize_key,
            serialize_value=serialize_value, as_read=as_read, output=task.output,
            sources=task.output_sources, sink_name=sink.name, producer_record=ProducerRecord,
            no_source=NO_SOURCE, production=PRODUCTION, key_format=serde_format(sink.key_serde),
            value_format=serde_format(sink.value_serde, windowed=False),
            windowed_types=getattr(sink.key_serde, "windowed_types", None),
        )  # fmt: skip

    def write(record: Record) -> None:
        current = task.current
        if (
            current is not None and current[0] in as_read
            and record[1] is not None and record[0] is not None
        ):  # fmt: skip
            # The source record itself, unchanged: its bytes are what serializing its
            # key and value would give back (see written_as_read). A null stays null
            # (JSON's b"null" decodes to None, which serializes to no bytes at all).
            key, value = current[4], current[5]
        else:
            try:
                key = serialize_key(record[0])
                value = serialize_value(record[1])
            except Exception as exception:
                task._handle(PRODUCTION, sink.name, record, exception, topic=topic)
                return
        partition = internal_partition(task, sink, topic, record, key) if internal else None
        append(new_record(ProducerRecord, (topic, key, value, record[2], record[3], partition)))
        current = task.current
        add_source(current or NO_SOURCE)

    return write


# The layouts of windowed keys the C writer knows (_task_loop.c, FORMAT_*), as a windowed
# serde declares its own (dsl/windows.py: ``windowed_layout``, and the key types it writes).
_WINDOWED_LAYOUTS = {"time": 4, "session": 8}


def serde_format(serde: Any, windowed: bool = True) -> int:
    """What the C writer knows of ``serde`` (_task_loop.c, FORMAT_*): the built-in string,
    bytes and long serdes, and (``windowed``) the time- and session-windowed serdes of their
    keys, which it serializes itself as they would; 0 for any other serde, which it calls."""
    plain = {id(Serdes.string()): 1, id(Serdes.bytes()): 2, id(Serdes.long()): 3}
    # Declared by the serde's own class: a subclass (its own serialize, maybe) is called.
    declared = vars(type(serde)).get("windowed_layout", "")
    layout = _WINDOWED_LAYOUTS.get(declared) if windowed else None
    if layout is not None and getattr(serde, "windowed_types", None) is not None:
        inner = plain.get(id(getattr(serde, "inner", None)), 0)
        if inner:
            return inner | layout
    return plain.get(id(serde), 0)


def dynamic_writer(task: Any, sink: SinkNode) -> Callable[[Record], None]:
    """``sink_writer`` of a sink whose topic its extractor chooses per record (Kafka Streams'
    ``to(TopicNameExtractor)``): the extractor sees the record and its RecordContext; its
    failure is a processing error (the processing exception handler decides), as a
    processor's. Each record is serialized with the sink's serdes for its topic (nothing
    written as read: the checks of that are per topic); the runtime chooses the partition."""
    extract = sink.topic_extractor
    assert extract is not None
    contextual = uses_context(sink.key_serde) or uses_context(sink.value_serde)
    serializers: dict[str, tuple[Callable, Callable]] = {}  # topic -> (key, value) serializers

    def write(record: Record) -> None:
        current = task.current or NO_SOURCE
        context = RecordContext(current[0], current[1], current[2], record[2], record[3] or [])
        try:
            topic = extract(record[0], record[1], context)
            if not isinstance(topic, str) or not topic:
                raise TypeError(f"the topic name extractor returned {topic!r}, not a topic name")
        except StreamsError:
            raise
        except Exception as exception:
            task._handle(PROCESSING, sink.name, record, exception)
            return
        headers = list(record[3] or ()) if contextual else record[3]  # serdes may add to them
        try:
            if contextual:
                if topic not in serializers:
                    serializers[topic] = (
                        serializer_for(sink.key_serde, topic, True),
                        serializer_for(sink.value_serde, topic, False),
                    )
                serialize_key, serialize_value = serializers[topic]
                key, value = serialize_key(record[0], headers), serialize_value(record[1], headers)
            else:
                key = sink.key_serde.serialize(record[0])
                value = sink.value_serde.serialize(record[1])
        except StreamsError:
            raise
        except Exception as exception:
            task._handle(PRODUCTION, sink.name, record, exception, topic=topic)
            return
        task.output.append(ProducerRecord(topic, key, value, record[2], headers))
        task.output_sources.append(task.current or NO_SOURCE)

    return write


def repartition_writer(task: Any, sink: SinkNode, topic: str) -> Callable[[Record], None]:
    """``sink_writer`` of a repartition topic partitioned by key, nothing written as read: the
    per-record path of every re-keying, without the other sinks' checks."""
    serialize_key, serialize_value = sink.key_serde.serialize, sink.value_serde.serialize
    append, add_source = task.output.append, task.output_sources.append
    partitions_of, new_record = task.partitions_of, _new_tuple
    # A re-keying's value is the source record's: its bytes are written as read.
    values_as_read = written_as_read(task, sink, values_only=True)

    def write(record: Record) -> None:
        try:
            key = serialize_key(record[0])
            current = task.current
            if current is not None and current[0] in values_as_read and record[1] is not None:
                value = current[5]
            else:
                value = serialize_value(record[1])
        except Exception as exception:
            task._handle(PRODUCTION, sink.name, record, exception, topic=topic)
            return
        partition = 0 if key is None else partition_for(key, partitions_of(topic))
        append(new_record(ProducerRecord, (topic, key, value, record[2], record[3], partition)))
        add_source(task.current or NO_SOURCE)

    return write


def direct_sink(task: Any, node: str) -> tuple[SinkNode, str, list, list] | None:
    """The sink that is processor ``node``'s only child, when a built-in processor may
    write its output records itself, as the sink's delivery function would: an external
    topic (no partition to choose), serdes that take no context, and nothing written as
    read. Then (the sink, its topic, the task's output list, the list of their source
    records), else None."""
    processor = task.topology.nodes[node]
    children = processor.children if isinstance(processor, ProcessorNode) else []
    sink = task.topology.nodes[children[0]] if len(children) == 1 else None
    if (
        not isinstance(sink, SinkNode) or sink.internal or sink.topic_extractor is not None
        or uses_context(sink.key_serde) or uses_context(sink.value_serde)
        or written_as_read(task, sink)
    ):  # fmt: skip
        return None
    topic = topic_name(sink.topic, sink.internal, task.application_id)
    return sink, topic, task.output, task.output_sources


def context_writer(task: Any, sink: SinkNode, topic: str) -> Callable[[Record], None]:
    """``sink_writer`` for a sink whose serdes take a context (the topic, key or value, and
    the record's headers, which they may add to: the schema-id header)."""
    serialize_key = serializer_for(sink.key_serde, topic, True)
    serialize_value = serializer_for(sink.value_serde, topic, False)
    values_as_read = registry_values_as_read(task, sink)
    if values_as_read:
        from streamplatform.registry.serdes import VALUE_SCHEMA_ID_HEADER

        written_prefix = cast(Any, sink.value_serde).written_prefix

    def write(record: Record) -> None:
        headers = list(record[3] or ())  # the serdes may add to them: a copy
        current = task.current
        try:
            key = serialize_key(record[0], headers)
            value = None
            if (
                values_as_read and current is not None and current[0] in values_as_read
                and record[1] is not None
            ):  # fmt: skip
                # The value as read, when it starts with the framing this sink writes (the
                # magic byte, the schema id and for Protobuf the message indexes, learned
                # from its first record) and no schema-id header names another: an encoding
                # of the same value under the same schema, without encoding it again.
                read, prefix = current[5], written_prefix(topic, False)
                if (
                    prefix is not None and type(read) is bytes and read.startswith(prefix)
                    and not any(h[0] == VALUE_SCHEMA_ID_HEADER for h in headers)
                ):  # fmt: skip
                    value = read
            if value is None:
                value = serialize_value(record[1], headers)
        except StreamsError:
            raise
        except Exception as exception:
            task._handle(PRODUCTION, sink.name, record, exception, topic=topic)
            return
        append_output(task, sink, topic, record, key, value, headers)

    return write


def append_output(
    task: Any, sink: SinkNode, topic: str, record: Record, key: Any, value: Any, headers: Any
) -> None:
    partition = internal_partition(task, sink, topic, record, key) if sink.internal else None
    task.output.append(ProducerRecord(topic, key, value, record[2], headers, partition))
    task.output_sources.append(task.current or NO_SOURCE)


def written_as_read(task: Any, sink: SinkNode, values_only: bool = False) -> frozenset[str]:
    """The source topics whose records reach ``sink`` unchanged, so that the sink writes
    the bytes it read instead of serializing the key and value it decoded from them:
    every path into the sink comes from a source with the sink's kind of built-in serdes
    (``AS_READ_SERDES``: decoding and encoding give the bytes back, up to JSON's
    formatting) through processors that forward the record they are given or nothing
    (``Processor.forwards_unchanged``, declared by their class: deduplications). Any
    other processor on a path (a map, a filter, a user's processor) may change the
    record, and its records are serialized as usual.

    ``values_only``: the topics whose records reach the sink with the value they were read
    with, also through processors that change only the key
    (``Processor.forwards_value_unchanged``: a re-keying); only the value serdes count."""
    if sink.topic_extractor is not None:
        return frozenset()  # a dynamic sink serializes each record for its own topic
    key_serde, value_serde = type(sink.key_serde), type(sink.value_serde)
    if values_only:
        key_serde = next(iter(AS_READ_SERDES))  # any: the keys are not compared
    if key_serde not in AS_READ_SERDES or value_serde not in AS_READ_SERDES:
        return frozenset()

    def same_serdes(source: SourceNode) -> bool:
        source_key = key_serde if values_only else type(source.key_serde)
        return (source_key, type(source.value_serde)) == (key_serde, value_serde)

    return unchanged_sources(task, sink, same_serdes, values_only)


def registry_values_as_read(task: Any, sink: SinkNode) -> frozenset[str]:
    """The source topics whose values reach ``sink`` as read, where the sink's value serde is
    a registry serde that knows the bytes it writes before a value (``written_prefix``) and
    would write a value its source's serde decoded back as it was read
    (``writes_back_reads_of``: the same format and schema). For such a record the sink
    writes the bytes read when they start with the prefix it writes itself (the same schema
    id): they are an encoding of the same value under the same schema."""
    serde: Any = sink.value_serde
    if sink.topic_extractor is not None or not hasattr(serde, "written_prefix"):
        return frozenset()
    # Only along paths that do not branch: a decoded Avro dict or Protobuf message is mutable,
    # and a processor on another branch could change it in place before it reaches this sink.
    return unchanged_sources(
        task, sink, lambda source: serde.writes_back_reads_of(source.value_serde), True,
        unbranched=True,
    )  # fmt: skip


def unchanged_sources(
    task: Any, sink: SinkNode, same_serdes: Callable[[SourceNode], bool], values_only: bool,
    unbranched: bool = False,
) -> frozenset[str]:  # fmt: skip
    """The source topics of every path into ``sink``, when each path comes from a source
    ``same_serdes`` accepts through processors that forward their record unchanged (or, with
    ``values_only``, with its value unchanged); empty when any path does not. With
    ``unbranched``, also empty when a node on a path has another child."""
    topics: set[str] = set()
    pending, seen = list(sink.parents), set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        node = task.topology.nodes[name]
        if unbranched and len(node.children) != 1:
            return frozenset()
        if isinstance(node, SourceNode):
            if not same_serdes(node):
                return frozenset()
            topics.add(topic_name(node.topic, node.internal, task.application_id))
        elif _declares(task.processors.get(name), "forwards_unchanged") or (
            values_only and _declares(task.processors.get(name), "forwards_value_unchanged")
        ):
            pending.extend(node.parents)  # type: ignore[union-attr]
        else:
            return frozenset()
    return frozenset(topics)


def _declares(processor: Any, attribute: str) -> bool:
    """Whether ``processor``'s own class (not a base) declares ``attribute`` True."""
    return bool(type(processor).__dict__.get(attribute, False))


def internal_partition(task: Any, sink: SinkNode, topic: str, record: Record, key: Any) -> int:
    """The partition of an internal topic a record goes to: its sink's partitioner's choice,
    else murmur2 of ``partition_by``'s canonical bytes, else of the key's bytes (0: none)."""
    partitions = task.partitions_of(topic)
    if sink.partitioner is not None:
        chosen = sink.partitioner(record[0], record[1], partitions)
        if chosen is not None:
            return chosen
    by = key if sink.partition_by is None else partition_bytes(sink, record)
    return 0 if by is None else partition_for(by, partitions)


def partition_bytes(sink: SinkNode, record: Record) -> bytes | None:
    assert sink.partition_by is not None
    identity = sink.partition_by(record.key, record.value)
    return None if identity is None else canonical_bytes(identity)
