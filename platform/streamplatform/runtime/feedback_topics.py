"""Internal topics that close a cycle between sub-topologies: real Kafka topics of the job.

A batch runs its sub-topologies in order, and a repartition topic carries its records from one
sub-topology's tasks to a later one's inside the batch (paths/direct_stages.py, stages.py). A
foreign-key table join (dsl/fk_join.py) makes a cycle: the left table's sub-topology writes the
subscriptions the right table's reads, and reads the answers the right table's writes. Such an
internal topic, read by a sub-topology that does not come after every one writing it, is kept
in Kafka as Kafka Streams keeps every internal topic: the job creates it (as many partitions as
the sub-topology reading it has tasks), its writers produce to it as to a Kafka sink (in their
transactions under exactly_once_v2), and its reader plans and reads it as a source, the next
batch: answers written in batch N are joined in batch N + 1. Runs until caught up go on while
it holds records, so a job's end state is the test driver's; the updates on the way may be
fewer (an answer to a value that changed before it came back is stale and dropped, as in Kafka
Streams when its answer comes late).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamplatform.dsl.graph import SinkNode, topic_name
from streamplatform.dsl.topology import Topology


def feedback_topics(topology: Topology, app: str) -> dict[str, int]:
    """``{topic: the id of the sub-topology reading it}`` of the internal topics a
    sub-topology reads before a later one (or itself) writes them."""
    written_before: set[str] = set()
    found: dict[str, int] = {}
    internal = set(topology.repartition_topics(app))
    for subtopology in topology.subtopologies:
        for topic in subtopology.source_topics(topology, app):
            if topic in internal and topic not in written_before:
                found[topic] = subtopology.id
        for name in subtopology.nodes:
            node = topology.nodes[name]
            if isinstance(node, SinkNode) and node.internal:
                written_before.add(topic_name(node.topic, True, app))
    return found


def partitions_of_feedback(
    topology: Topology, app: str, feedback: Mapping[str, int], partitions: Mapping[str, int]
) -> dict[str, int]:
    """The partitions each feedback topic needs: as many as its reading sub-topology's widest
    Kafka source (``partitions``: theirs), so that its records meet the tasks that keyed them.
    A sub-topology that reads no Kafka topic but feedback ones cannot size them."""
    sizes: dict[str, int] = {}
    for topic, reader in feedback.items():
        sources = topology.subtopologies[reader].source_topics(topology, app)
        widths = [partitions[t] for t in sources if t in partitions and t not in feedback]
        if not widths:
            raise NotImplementedError(
                f"{app}: sub-topology {reader} reads {topic}, written by a later sub-topology, "
                "and no Kafka topic that would give it its number of partitions"
            )
        sizes[topic] = max(widths)
    return sizes


def create(settings: Mapping[str, Any], sizes: Mapping[str, int]) -> None:
    """Create the feedback topics that do not exist; one of another size stops the start."""
    from streamplatform.config import ConfigError
    from streamplatform.kafka import TopicSpec, create_topics, describe_topics

    # Kept until read, whatever the broker's default retention (Kafka Streams' internal
    # topics are not deleted by time either).
    kept = {"retention.ms": "-1"}
    create_topics(settings, [TopicSpec(t, n, config=kept) for t, n in sizes.items()])
    found = describe_topics(settings, list(sizes))
    wrong = {t: (found[t], n) for t, n in sizes.items() if found[t] != n}
    if wrong:
        raise ConfigError(
            "internal topics with the wrong number of partitions (has, needs): "
            f"{wrong}; delete them (streamplatform topics delete) to have them created anew"
        )
