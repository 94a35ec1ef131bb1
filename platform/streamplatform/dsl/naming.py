"""Internal resources and whether a person named them (Kafka Streams' KIP-1111).

An operator given no ``name=`` gets a generated one, ``KSTREAM-<KIND>-<index>``, the index
counting every operator built before it. The stores and internal topics of a stateful operator
are named after it, so adding or removing an operator upstream renames them, and the job then
starts their state empty. Kafka Streams' ``ensure.explicit.internal.resource.naming`` makes
such a topology an error; here too (``check_explicit_naming``: StreamingJob and the
TopologyTestDriver call it).

What counts, as in Kafka Streams: state stores, their changelog topics and repartition topics.
A processor's own name does not (it names no state). Unlike Kafka Streams, ``builder.table``'s
default store (``<topic>-STATE-STORE``) is named after its topic, not a position, so it is not
flagged: it keeps its name whatever is added around it. Here the changelog of a store is its
rows in the job's ``_changelog`` Delta table; it is reported under Kafka Streams' topic name,
``<application.id>-<store>-changelog`` (the subject a registry serde in the store uses).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.dsl.graph import REPARTITION_SUFFIX, ProcessorNode, SourceNode, topic_name
from streamplatform.dsl.topology import Topology

log = logging.getLogger(__name__)

SETTING = "ensure.explicit.internal.resource.naming"
STATE_STORE = "state store"
CHANGELOG_TOPIC = "changelog topic"
REPARTITION_TOPIC = "repartition topic"
# Kafka Streams' order in its error: changelog topics, state stores, repartition topics.
_ORDER = (CHANGELOG_TOPIC, STATE_STORE, REPARTITION_TOPIC)
# A generated name at the start of a resource's name: the operator it was named after.
_GENERATED = re.compile(r"KSTREAM-(?P<kind>[A-Z]+(?:-[A-Z]+)*)-\d{10}")

# How to name the operator of each generated kind (the DSL call that takes the name).
_HOW_TO_NAME = {
    "COUNT": "count(name=...)",
    "REDUCE": "reduce(reducer, name=...)",
    "AGGREGATE": "aggregate(initializer, aggregator, ..., name=...)",
    "KTABLE-COUNT": "KGroupedTable.count(name=...)",
    "KTABLE-REDUCE": "KGroupedTable.reduce(adder, subtractor, name=...)",
    "KTABLE-AGGREGATE": "KGroupedTable.aggregate(initializer, adder, subtractor, name=...)",
    "KTABLE-SELECT": "KTable.group_by(selector, name=...)",
    "DEDUPLICATE": "deduplicate...(..., name=...)",
    "REPARTITION": "repartition(name=...)",
    "JOIN": "join(table, joiner, name=...) / left_join(table, joiner, name=...)",
    "KTABLE-MERGE": "KTable.join(other, joiner, name=...) (left_join, outer_join)",
    "KTABLE-FK-JOIN": "KTable.join(other, foreign_key_extractor, joiner, name=...) (left_join)",
    "KTABLE-SUPPRESS": "suppress(Suppressed.until_window_closes().with_name(...))",
}
_STREAM_JOIN = "join(stream, joiner, windows, name=...) (left_join, outer_join)"
# Kinds whose name= sets the very base the generated name was: naming the operator with its
# old generated name keeps its stores and topics (a stream join's three bases cannot).
RENAMEABLE = frozenset(_HOW_TO_NAME)


class TopologyNamingError(ConfigError):
    """``ensure.explicit.internal.resource.naming`` is true and the topology has internal
    resources with generated names; the message lists each, its operator and how to name it."""


@dataclass(frozen=True)
class InternalResource:
    """A state store, changelog topic or repartition topic, and the operator it belongs to."""

    kind: str  # STATE_STORE | CHANGELOG_TOPIC | REPARTITION_TOPIC
    name: str  # the store's name; a topic's full name (with the application.id prefix)
    operator: str  # the node (or generated base name) it was named after, or that uses it
    generated: bool  # named after a generated name: renamed when operators are added upstream

    @property
    def how_to_name(self) -> str:
        return how_to_name(self.operator)


def how_to_name(operator: str) -> str:
    """The DSL call that names ``operator`` (a generated name), or a general hint."""
    kind = generated_kind(operator) or ""
    if kind.endswith(("JOINTHIS", "JOINOTHER")) or kind == "OUTERSHARED":
        return _STREAM_JOIN
    return _HOW_TO_NAME.get(kind, "the name= of the DSL call that made it")


def generated_kind(operator: str) -> str | None:
    """``COUNT`` of ``KSTREAM-COUNT-0000000002``; None for a name a person chose."""
    match = _GENERATED.fullmatch(operator)
    return match.group("kind") if match else None


def keeps_its_state_when_named_so(operator: str) -> bool:
    """Whether giving the operator its generated name as ``name=`` names its stores and
    topics exactly as before (a stream join's three generated bases cannot be given)."""
    return generated_kind(operator) in RENAMEABLE


def generated_base(name: str, topology: Topology) -> str | None:
    """The generated name ``name`` was made from (itself, or a prefix followed by ``-``), or
    None when a person chose it."""
    match = _GENERATED.match(name)
    if match is None or (len(name) > match.end() and name[match.end()] != "-"):
        return None
    base = match.group(0)
    known = topology.generated_names
    return base if known is None or base in known else None


def internal_resources(topology: Topology, application_id: str) -> list[InternalResource]:
    """Every store, its changelog topic and every repartition topic of ``topology``, in
    Kafka Streams' order (changelog topics, stores, repartition topics)."""
    found = []
    users: dict[str, str] = {}
    for node in topology.nodes.values():  # the first processor that uses each store
        if isinstance(node, ProcessorNode):
            for store in node.stores:
                users.setdefault(store, node.name)
    for store in topology.stores:
        base = generated_base(store, topology)
        operator = base or users.get(store, store)
        changelog = changelog_topic(application_id, store)
        found.append(InternalResource(STATE_STORE, store, operator, base is not None))
        # A global table's store has no changelog: its topic is one, as in Kafka Streams.
        if getattr(topology.stores[store], "global_topic", None) is None:
            found.append(InternalResource(CHANGELOG_TOPIC, changelog, operator, base is not None))
    for node in topology.nodes.values():
        if isinstance(node, SourceNode) and node.internal:
            base = generated_base(node.topic, topology)
            operator = base or node.topic.removesuffix(REPARTITION_SUFFIX)
            topic = topic_name(node.topic, True, application_id)
            found.append(InternalResource(REPARTITION_TOPIC, topic, operator, base is not None))
    return sorted(found, key=lambda r: _ORDER.index(r.kind))


def changelog_topic(application_id: str, store: str) -> str:
    """Kafka Streams' changelog topic name of ``store``."""
    return f"{application_id}-{store}-changelog"


def unnamed_resources(topology: Topology, application_id: str) -> list[InternalResource]:
    """The internal resources named after a generated name."""
    return [r for r in internal_resources(topology, application_id) if r.generated]


def check_explicit_naming(
    topology: Topology, settings: StreamsConfig, *, warn: bool = False
) -> list[InternalResource]:
    """Raise ``TopologyNamingError`` when ``ensure.explicit.internal.resource.naming`` is set
    and ``topology`` has internal resources with generated names; else return them (``warn``:
    and log them as a warning, as Kafka Streams does when the setting is off)."""
    application_id = settings["application.id"]
    unnamed = unnamed_resources(topology, application_id)
    if unnamed and settings[SETTING]:
        raise TopologyNamingError(naming_message(unnamed, application_id))
    if unnamed and warn:
        log.warning(
            "%s: %d internal resources have generated names, which change when an operator "
            "is added or removed upstream (%s is false; docs/upgrades.md): %s",
            application_id, len(unnamed), SETTING, ", ".join(r.name for r in unnamed),
        )  # fmt: skip
    return unnamed


def naming_message(unnamed: list[InternalResource], application_id: str) -> str:
    """The error: each unnamed resource, its operator and the call that names it, grouped by
    kind as Kafka Streams' error is."""
    lines = [
        f"Invalid topology of {application_id}: {SETTING} is true, and these internal "
        "resources have generated names. Adding or removing an operator upstream would rename "
        "them, and the job would start their state empty (docs/upgrades.md). Name their "
        "operators:"
    ]
    for kind in _ORDER:
        of_kind = [r for r in unnamed if r.kind == kind]
        if of_kind:
            lines.append(f"Following {kind}(s) have not been named:")
            lines += [f"  {r.name} (operator {r.operator}): {r.how_to_name}" for r in of_kind]
    return "\n".join(lines)
