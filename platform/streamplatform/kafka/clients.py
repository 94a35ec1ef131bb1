"""Thin helpers over confluent-kafka: admin, producer and consumer from one settings dict.

Settings are Kafka Streams-style (``bootstrap.servers``, ``security.protocol``, ``sasl.*``,
``ssl.*``, ...), security included in the Java client's names (kafka/security.py): librdkafka
gets them translated, Spark's Kafka source and sink as they are. Streams settings
(``application.id``, ``processing.guarantee``, ...) stay behind, so one dict can configure the
whole job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streamplatform.exceptions import StreamPlatformError
from streamplatform.kafka.security import is_security_key, librdkafka_security

_librdkafka_log = logging.getLogger("streamplatform.librdkafka")

# Connection settings passed through to every client, besides the security ones.
_CONNECTION_KEYS = ("bootstrap.servers", "client.id")


def connection_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The connection part of a settings dict, in the Java client's names (what Spark's Kafka
    source and sink take as ``kafka.*``; ``librdkafka_settings`` for confluent-kafka)."""
    if not settings.get("bootstrap.servers"):
        raise ValueError("bootstrap.servers is not set: give the Kafka broker address(es).")
    return {
        key: value
        for key, value in settings.items()
        if key in _CONNECTION_KEYS or is_security_key(key)
    }


def librdkafka_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The connection part of a settings dict as librdkafka takes it: security translated."""
    connection = connection_settings(settings)
    plain = {key: value for key, value in connection.items() if key in _CONNECTION_KEYS}
    return plain | librdkafka_security(connection)


def _client_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    # librdkafka's own log lines go through Python logging instead of raw stderr.
    return librdkafka_settings(settings) | {"logger": _librdkafka_log}


def admin_client(settings: Mapping[str, Any]) -> AdminClient:
    return AdminClient(_client_settings(settings))


def producer(settings: Mapping[str, Any], **overrides: Any) -> Producer:
    """A producer; ``overrides`` use librdkafka names (``transactional.id``, ``linger.ms``...).

    Keys are partitioned with murmur2, as Java clients, Kafka Streams and Spark's Kafka sink do
    (librdkafka's own default, CRC32, would put a key elsewhere and break co-partitioning).
    Idempotent, as Java clients are by default since Kafka 3.0: without it librdkafka's
    retries (a topic whose leader is not known yet) can write a partition's records out of the
    order they were produced in, and tasks merge partitions by timestamp.
    """
    defaults = {"partitioner": "murmur2_random", "enable.idempotence": True}
    return Producer(_client_settings(settings) | defaults | overrides)


def consumer(settings: Mapping[str, Any], group_id: str, **overrides: Any) -> Consumer:
    """A consumer that commits only when told to (``enable.auto.commit`` off by default)."""
    base = {"group.id": group_id, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    return Consumer(_client_settings(settings) | base | overrides)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    replication_factor: int = 1
    config: Mapping[str, str] | None = None


class TopicAdminError(StreamPlatformError, RuntimeError):
    """A topic the broker would not create or delete: the message names it and why (and the
    ACL to ask for when the principal may not)."""


def _admin_failure(verb: str, name: str, error: Any) -> TopicAdminError:
    message = f"Could not {verb} topic {name!r}: {error.str()}"
    if "AUTHORIZATION" in error.name():
        operation = "CREATE" if verb == "create" else "DELETE"
        message += f" (the principal needs ALLOW {operation} on topic {name} or on the cluster)"
    return TopicAdminError(message)


def create_topics(
    settings: Mapping[str, Any], topics: Iterable[TopicSpec], timeout_s: float = 30.0
) -> list[str]:
    """Create topics and wait for the broker to confirm; existing topics are left alone.

    Returns the names that were created. Any other failure raises, naming the topic.
    """
    specs = list(topics)
    if not specs:
        return []
    new_topics = [
        NewTopic(t.name, t.partitions, t.replication_factor, config=dict(t.config or {}))
        for t in specs
    ]
    admin = admin_client(settings)  # must outlive the futures: its destruction cancels them
    futures = admin.create_topics(new_topics, operation_timeout=timeout_s)
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            error = exc.args[0]
            if error.name() != "TOPIC_ALREADY_EXISTS":
                raise _admin_failure("create", name, error) from exc
    return created


def delete_topics(
    settings: Mapping[str, Any], names: Iterable[str], timeout_s: float = 30.0
) -> None:
    """Delete topics and wait for the broker to confirm; a missing topic is an error naming
    it."""
    admin = admin_client(settings)  # must outlive the futures
    for name, future in admin.delete_topics(list(names), operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise _admin_failure("delete", name, exc.args[0]) from exc


class TopicNotAuthorizedError(StreamPlatformError, LookupError):
    """Topics the principal may not see: Kafka lists only the topics one may DESCRIBE, so
    without the ACL a topic that exists looks missing; asked for by name, the broker says.
    Raised by ``describe_topics`` (public); a ``LookupError`` as a missing topic is."""


def _not_authorized(settings: Mapping[str, Any], names: list[str], timeout_s: float) -> list[str]:
    from confluent_kafka import KafkaError

    hidden: list[str] = []
    if not names:
        return hidden
    admin = admin_client(settings)
    for name in names:
        try:
            metadata = admin.list_topics(topic=name, timeout=timeout_s)
        except KafkaException:
            continue
        meta = metadata.topics.get(name)
        if (
            meta is not None
            and meta.error is not None
            and (meta.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED)
        ):
            hidden.append(name)
    return hidden


def describe_topics(
    settings: Mapping[str, Any], names: Iterable[str] | None = None, timeout_s: float = 10.0
) -> dict[str, int]:
    """Partition counts of the named topics (all non-internal topics when ``names`` is None).

    A named topic that does not exist is an error naming it.
    """
    metadata = admin_client(settings).list_topics(timeout=timeout_s)
    topics = {
        name: len(meta.partitions)
        for name, meta in metadata.topics.items()
        if meta.error is None and not name.startswith("__")
    }
    if names is None:
        return topics
    wanted = list(names)
    missing = [name for name in wanted if name not in topics]
    hidden = _not_authorized(settings, missing, timeout_s)
    if hidden:
        raise TopicNotAuthorizedError(
            f"not authorized to DESCRIBE topic(s) {', '.join(hidden)} on "
            f"{settings['bootstrap.servers']}: the principal needs the ACL ALLOW DESCRIBE on "
            "each (and READ on a source, WRITE on a sink or the DLQ)"
        )
    if missing:
        raise LookupError(
            f"Topic(s) {', '.join(missing)} do not exist on {settings['bootstrap.servers']}."
        )
    return {name: topics[name] for name in wanted}


def end_offsets(
    settings: Mapping[str, Any], topic: str, timeout_s: float = 10.0
) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` watermarks of a topic; ``high`` is the next offset to write."""
    partitions = describe_topics(settings, [topic], timeout_s)[topic]
    probe = consumer(settings, group_id="streamplatform-watermarks")
    try:
        return {
            p: probe.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=timeout_s)
            for p in range(partitions)
        }
    finally:
        probe.close()


def group_offsets(
    settings: Mapping[str, Any], group: str, timeout_s: float = 30.0
) -> dict[tuple[str, int], int]:
    """``{(topic, partition): offset}`` the consumer group ``group`` has committed, as Kafka's
    admin API lists them (what consumer-group tools show; a streaming job's group is its
    ``application.id``)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = admin_client(settings)  # kept alive until the answer is in
    (future,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    listed = future.result(timeout=timeout_s)
    return {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions}
