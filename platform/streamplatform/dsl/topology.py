"""Topology: the built graph, cut into sub-topologies; one task per sub-topology and partition.

Nodes connected by an edge or sharing a state store belong to one sub-topology; a repartition
topic is the only link between two sub-topologies (its sink ends one, its source starts the
next). Sub-topologies are numbered in the order their first node was added, and a task id is
``"<sub-topology>_<partition>"``, as in Kafka Streams.

A global table (``StreamsBuilder.global_table``) is no node of the graph: its topic is read by
no sub-topology and its store links none (each sub-topology that joins it keeps a copy of it).
``global_tables()`` lists them for whoever feeds their copies (dsl/global_table.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from streamplatform.dsl.global_table import GlobalTableSpec
from streamplatform.dsl.graph import Node, ProcessorNode, SinkNode, SourceNode, topic_name
from streamplatform.state import StoreSpec


@dataclass(frozen=True)
class SubTopology:
    id: int
    nodes: tuple[str, ...]  # in the order they were added
    stores: tuple[str, ...]

    def sources(self, topology: Topology) -> list[SourceNode]:
        return [n for n in map(topology.nodes.__getitem__, self.nodes) if isinstance(n, SourceNode)]

    def source_topics(self, topology: Topology, application_id: str) -> list[str]:
        return [topic_name(s.topic, s.internal, application_id) for s in self.sources(topology)]


class TaskId(NamedTuple):
    """A task: one sub-topology on one partition; written ``"<sub-topology>_<partition>"``."""

    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        subtopology, _, partition = text.partition("_")
        return cls(int(subtopology), int(partition))


class Topology:
    """Immutable result of ``StreamsBuilder.build()``."""

    def __init__(
        self,
        nodes: Mapping[str, Node],
        stores: Mapping[str, StoreSpec],
        *,
        generated_names: Iterable[str] | None = None,
        store_serdes: Mapping[str, tuple[Any, Any]] | None = None,
        global_tables: Iterable[GlobalTableSpec] = (),
        global_nodes: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        """``generated_names``: the names the builder generated (``KSTREAM-<KIND>-<index>``),
        which the stores and internal topics named after them inherit (dsl/naming.py); None:
        any name of that form counts as generated. ``store_serdes``: each store's (key serde,
        value serde), for the layout a job's commits record (runtime/upgrade.py).
        ``global_tables``: the global tables, in the order they were added; ``global_nodes``:
        the names of each one's source and table-source nodes by store, for describe()."""
        self.nodes: dict[str, Node] = dict(nodes)
        self.stores: dict[str, StoreSpec] = dict(stores)
        self._global_tables = list(global_tables)
        self._global_nodes = dict(global_nodes or {})
        global_stores = {table.store_name for table in self._global_tables}
        self.subtopologies: list[SubTopology] = _cut(self.nodes, global_stores)
        # (Not walked by the job's fingerprint, which covers nodes and stores only.)
        self.generated_names: frozenset[str] | None = (
            None if generated_names is None else frozenset(generated_names)
        )
        self.store_serdes: dict[str, tuple[Any, Any]] = dict(store_serdes or {})

    def global_tables(self) -> list[GlobalTableSpec]:
        """Each global table: its topic (read whole, from every partition), its store's name
        (in each task's ``global_stores``: a copy per task whose sub-topology joins it) and
        its topic's key and value serdes. Feed a copy with
        ``runtime.global_tables.apply_global_records``."""
        return list(self._global_tables)

    def global_topics(self) -> list[str]:
        """The topics of the global tables (no sub-topology reads them)."""
        return [table.topic for table in self._global_tables]

    def subtopology_of_topic(self, topic: str, application_id: str) -> SubTopology | None:
        for subtopology in self.subtopologies:
            if topic in subtopology.source_topics(self, application_id):
                return subtopology
        return None

    def source_topics(self, application_id: str) -> list[str]:
        return [t for s in self.subtopologies for t in s.source_topics(self, application_id)]

    def repartition_topics(self, application_id: str) -> list[str]:
        return [
            topic_name(n.topic, True, application_id)
            for n in self.nodes.values()
            if isinstance(n, SourceNode) and n.internal
        ]

    def sink_topics(self, application_id: str) -> list[str]:
        """The topics the sinks name (a sink whose extractor chooses its topics names none)."""
        return [
            topic_name(n.topic, n.internal, application_id)
            for n in self.nodes.values()
            if isinstance(n, SinkNode) and n.topic_extractor is None
        ]

    def has_dynamic_sinks(self) -> bool:
        """Whether a sink's topics are chosen per record (``KStream.to(extractor)``)."""
        return any(isinstance(n, SinkNode) and n.topic_extractor is not None
                   for n in self.nodes.values())  # fmt: skip

    def serdes(
        self, nodes: Iterable[str] | None = None, stores: Iterable[str] | None = None
    ) -> list[Any]:
        """The serdes of the sources, sinks and stores (all, or those named): the ones the
        runtime configures with the job's settings (``Serde.configure``)."""
        found: list[Any] = []
        for name in self.nodes if nodes is None else nodes:
            node = self.nodes[name]
            if isinstance(node, SourceNode | SinkNode):
                found += [node.key_serde, node.value_serde]
        for name in self.stores if stores is None else stores:
            spec = self.stores[name]
            found += [getattr(spec, "key_serde", None), getattr(spec, "value_serde", None)]
        return [serde for serde in found if serde is not None]

    def task_ids(self, partitions: Mapping[str, int], application_id: str) -> list[TaskId]:
        """Task ids given each source topic's partition count (a sub-topology has as many tasks
        as its widest source topic, as in Kafka Streams)."""
        ids = []
        for subtopology in self.subtopologies:
            topics = subtopology.source_topics(self, application_id)
            count = max(partitions.get(topic, 1) for topic in topics)
            ids += [TaskId(subtopology.id, p) for p in range(count)]
        return ids

    def describe(self) -> str:
        """The graph in Kafka Streams' ``Topology#describe()`` layout."""
        lines = ["Topologies:"]
        for subtopology in self.subtopologies:
            lines.append(f"   Sub-topology: {subtopology.id}")
            for name in subtopology.nodes:
                node = self.nodes[name]
                if isinstance(node, SourceNode):
                    lines.append(f"    Source: {name} (topics: [{_shown(node)}])")
                elif isinstance(node, ProcessorNode):
                    lines.append(f"    Processor: {name} (stores: [{', '.join(node.stores)}])")
                else:
                    lines.append(f"    Sink: {name} (topic: {_shown(node)})")
                if not isinstance(node, SinkNode):
                    lines.append(f"      --> {', '.join(node.children) or 'none'}")
                if not isinstance(node, SourceNode):
                    lines.append(f"      <-- {', '.join(node.parents) or 'none'}")
            lines.append("")
        # Kafka Streams' layout of a global store, numbered after the sub-topologies here.
        for index, table in enumerate(self._global_tables, start=len(self.subtopologies)):
            source, processor = self._global_nodes.get(table.store_name, ("?", "?"))
            lines += [
                f"   Sub-topology: {index} for global store (will not generate tasks)",
                f"    Source: {source} (topics: [{table.topic}])",
                f"      --> {processor}",
                f"    Processor: {processor} (stores: [{table.store_name}])",
                "      --> none",
                f"      <-- {source}",
                "",
            ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _shown(node: SourceNode | SinkNode) -> str:
    return f"<application.id>-{node.topic}" if node.internal else node.topic


def _cut(nodes: Mapping[str, Node], global_stores: set[str]) -> list[SubTopology]:
    """Connected components over edges and shared stores (union-find). A global table's store
    links nothing: each sub-topology that joins it has a copy of its own."""
    leader = {name: name for name in nodes}

    def find(name: str) -> str:
        while leader[name] != name:
            leader[name] = leader[leader[name]]
            name = leader[name]
        return name

    def union(a: str, b: str) -> None:
        leader[find(a)] = find(b)

    store_users: dict[str, str] = {}
    for name, node in nodes.items():
        for parent in getattr(node, "parents", ()):
            union(name, parent)
        for store in getattr(node, "stores", ()):
            if store in global_stores:
                continue
            if store in store_users:
                union(name, store_users[store])
            store_users[store] = name

    groups: dict[str, list[str]] = {}
    for name in nodes:  # dicts keep insertion order: groups are ordered by their first node
        groups.setdefault(find(name), []).append(name)
    subtopologies = []
    for index, members in enumerate(groups.values()):
        stores = dict.fromkeys(s for m in members for s in getattr(nodes[m], "stores", ()))
        subtopologies.append(SubTopology(index, tuple(members), tuple(stores)))
    return subtopologies
