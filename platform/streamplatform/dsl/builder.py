"""StreamsBuilder: where a topology starts (``stream``, ``table``) and ends (``build``).

>>> from streamplatform import StreamsBuilder
>>> from streamplatform.serdes import Serdes
>>> b = StreamsBuilder()
>>> b.stream("in", Serdes.string(), Serdes.json()).filter(lambda k, v: v["ok"]).to("out")
>>> print(b.build().describe())
Topologies:
   Sub-topology: 0
    Source: KSTREAM-SOURCE-0000000000 (topics: [in])
      --> KSTREAM-FILTER-0000000001
    Processor: KSTREAM-FILTER-0000000001 (stores: [])
      --> KSTREAM-SINK-0000000002
      <-- KSTREAM-SOURCE-0000000000
    Sink: KSTREAM-SINK-0000000002 (topic: out)
      <-- KSTREAM-FILTER-0000000001
<BLANKLINE>
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamplatform.dsl.global_table import GlobalKTable, GlobalTableSpec
from streamplatform.dsl.graph import Node, ProcessorNode, SinkNode, SourceNode, as_extractor
from streamplatform.dsl.join import TableSource
from streamplatform.dsl.kstream import KStream, KTable
from streamplatform.dsl.topology import Topology
from streamplatform.records import ConsumedRecord
from streamplatform.serdes import Serde, Serdes
from streamplatform.state import Stores, StoreSpec

if TYPE_CHECKING:
    # For type checkers and editors only: a source's key and value types, from its serdes
    # (``Serdes.string()`` is a ``Serde[str]``); Any for a serde not given (PEP 696 defaults).
    from typing_extensions import TypeVar

    K = TypeVar("K", default=Any)
    V = TypeVar("V", default=Any)


class StreamsBuilder:
    """Records a graph of sources, processors, stores and sinks; ``build()`` freezes it."""

    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self._stores: dict[str, StoreSpec] = {}
        self._topics: dict[str, str] = {}  # source topic -> node that reads it
        self._counter = 0
        # Every name new_name made: a store or an internal topic named after one of them
        # changes when an operator is added upstream (dsl/naming.py, KIP-1111).
        self._generated: set[str] = set()
        # What each store holds, for the layout a job's commits record (runtime/upgrade.py).
        self._store_serdes: dict[str, tuple[Serde | None, Serde | None]] = {}
        # The global tables (not nodes of the graph: no sub-topology reads their topics), and
        # the names of their source and table-source nodes by store, for describe().
        self._global_tables: list[GlobalTableSpec] = []
        self._global_nodes: dict[str, tuple[str, str]] = {}

    def new_name(self, kind: str) -> str:
        """Kafka Streams' generated names: ``KSTREAM-<KIND>-<10-digit index>``."""
        name = f"KSTREAM-{kind}-{self._counter:010d}"
        self._counter += 1
        self._generated.add(name)
        return name

    def add_node(self, node: Node, parents: list[str]) -> None:
        if node.name in self._nodes:
            raise ValueError(f"A node named {node.name!r} already exists in this topology")
        if isinstance(node, SourceNode):
            if node.topic in self._topics:
                raise ValueError(
                    f"Topic {node.topic!r} is already read by {self._topics[node.topic]}; "
                    "a topic can be a source only once"
                )
            self._topics[node.topic] = node.name
        for parent_name in parents:
            parent = self._nodes[parent_name]
            if isinstance(parent, SinkNode):
                raise ValueError(f"{parent_name} is a sink; nothing can follow it")
            parent.children.append(node.name)
            if not isinstance(node, SourceNode):
                node.parents.append(parent_name)
        self._nodes[node.name] = node

    def add_store(
        self, spec: StoreSpec, key_serde: Serde | None = None, value_serde: Serde | None = None
    ) -> str:
        """``key_serde``/``value_serde``: what a DSL operator keeps in the store (its spec has
        none: the operator serializes itself); recorded with each commit, so that a change of
        them is seen at the next start (runtime/upgrade.py)."""
        if spec.name in self._stores:
            raise ValueError(f"A store named {spec.name!r} already exists in this topology")
        self._stores[spec.name] = spec
        self._store_serdes[spec.name] = (
            getattr(spec, "key_serde", None) if key_serde is None else key_serde,
            getattr(spec, "value_serde", None) if value_serde is None else value_serde,
        )
        return spec.name

    def add_state_store(self, spec: StoreSpec) -> StreamsBuilder:
        """Register a store for user processors (``KStream.process(supplier, name)``)."""
        self.add_store(spec)
        return self

    def require_store(self, name: str) -> None:
        if name not in self._stores:
            raise ValueError(f"No store named {name!r}: add it with add_state_store() first")

    def stream(
        self,
        topic: str,
        key_serde: Serde[K] | None = None,
        value_serde: Serde[V] | None = None,
        timestamp_extractor: Callable[[ConsumedRecord, int], int] | None = None,
    ) -> KStream[K, V]:
        """Records of ``topic``; serdes default to bytes. ``timestamp_extractor(record,
        partition_time)`` gives a record's event time (Kafka Streams' TimestampExtractor; the
        record's key and value deserialized); by default its Kafka timestamp."""
        # Serde[Any] here: the serdes' types are the caller's K and V.
        keys: Serde = key_serde or Serdes.bytes()
        values: Serde = value_serde or Serdes.bytes()
        source = SourceNode(self.new_name("SOURCE"), topic, keys, values,
                            timestamp_extractor=as_extractor(timestamp_extractor))  # fmt: skip
        self.add_node(source, parents=[])
        return KStream(self, source.name, keys, values)

    def table(
        self,
        topic: str,
        key_serde: Serde[K] | None = None,
        value_serde: Serde[V] | None = None,
        store: StoreSpec | None = None,
        timestamp_extractor: Callable[[ConsumedRecord, int], int] | None = None,
    ) -> KTable[K, V]:
        """``topic`` as a table, kept in ``store`` (a plain key-value store when not given;
        ``Stores.persistent_versioned_key_value_store`` makes joins temporal);
        ``timestamp_extractor`` as for ``stream``."""
        # Serde[Any] here: the serdes' types are the caller's K and V.
        keys: Serde = key_serde or Serdes.bytes()
        values: Serde = value_serde or Serdes.bytes()
        source = SourceNode(self.new_name("SOURCE"), topic, keys, values,
                            timestamp_extractor=as_extractor(timestamp_extractor))  # fmt: skip
        self.add_node(source, parents=[])
        # The default store's name comes from the topic, not from a position in the
        # topology: it does not change when operators are added (dsl/naming.py).
        spec = store or Stores.persistent_key_value_store(f"{topic}-STATE-STORE")
        store_name = self.add_store(spec, keys, values)
        node = ProcessorNode(
            self.new_name("TABLE-SOURCE"),
            lambda: TableSource(store_name, keys, values),
            (store_name,),
        )
        self.add_node(node, parents=[source.name])
        return KTable(self, node.name, store_name, keys, values)

    def global_table(
        self,
        topic: str,
        key_serde: Serde[K] | None = None,
        value_serde: Serde[V] | None = None,
        name: str | None = None,
    ) -> GlobalKTable[K, V]:
        """``topic``, every partition of it, as a table each task that joins it holds whole
        (Kafka Streams' ``globalTable``): ``KStream.join(global_table, key_selector, joiner)``
        joins on a key derived from each record, with no repartition. Its store is a plain
        key-value store named ``name``, or ``<topic>-STATE-STORE`` (named after its topic, as
        ``table``'s: it keeps its name whatever is added around it), with no changelog (the
        topic is its changelog). Serdes default to bytes. See dsl/global_table.py."""
        # Serde[Any] here: the serdes' types are the caller's K and V.
        keys: Serde = key_serde or Serdes.bytes()
        values: Serde = value_serde or Serdes.bytes()
        if topic in self._topics:
            raise ValueError(
                f"Topic {topic!r} is already read by {self._topics[topic]}; "
                "a topic can be a source only once"
            )
        # Names as Kafka Streams' (a source, then the table source that writes the store),
        # for describe(); neither is a node of the graph.
        source_name, processor_name = self.new_name("SOURCE"), self.new_name("TABLE-SOURCE")
        self._topics[topic] = source_name
        spec = Stores.persistent_key_value_store(name or f"{topic}-STATE-STORE")
        # Typed for get_state_store; marked global: no changelog, not committed with a task.
        spec = dataclasses.replace(spec, key_serde=keys, value_serde=values,
                                   global_topic=topic)  # fmt: skip
        store_name = self.add_store(spec, keys, values)
        table = GlobalTableSpec(topic, store_name, keys, values)
        self._global_tables.append(table)
        self._global_nodes[store_name] = (source_name, processor_name)
        return GlobalKTable(self, table)

    def build(self) -> Topology:
        """The topology, cut into sub-topologies (see Topology)."""
        if not self._nodes:
            raise ValueError("The topology is empty: add a stream or a table first")
        return Topology(self._nodes, self._stores, generated_names=self._generated,
                        store_serdes=self._store_serdes, global_tables=self._global_tables,
                        global_nodes=self._global_nodes)  # fmt: skip
