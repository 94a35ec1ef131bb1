"""The runtime tests' input: one 3-partition topic (and its DLQ), produced once per run."""

from __future__ import annotations

import uuid

import pytest

from streamplatform.kafka import TopicSpec, create_topics

from .support import PARTITIONS, make_input


@pytest.fixture(scope="session")
def source_topic(kafka_settings):
    name = f"rt-source-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(name, PARTITIONS), TopicSpec(f"{name}-dlq", 1)])
    return name, make_input(kafka_settings, name)
