"""Kafka helpers: confluent-kafka clients from one settings dict, and a local KRaft broker."""

from streamplatform.kafka.clients import (
    TopicAdminError,
    TopicNotAuthorizedError,
    TopicSpec,
    admin_client,
    connection_settings,
    consumer,
    create_topics,
    delete_topics,
    describe_topics,
    end_offsets,
    group_offsets,
    librdkafka_settings,
    producer,
)
from streamplatform.kafka.local_broker import LocalBroker

__all__ = [
    "LocalBroker",
    "TopicAdminError",
    "TopicNotAuthorizedError",
    "TopicSpec",
    "admin_client",
    "connection_settings",
    "consumer",
    "create_topics",
    "delete_topics",
    "describe_topics",
    "end_offsets",
    "group_offsets",
    "librdkafka_settings",
    "producer",
]
