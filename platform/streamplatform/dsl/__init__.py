"""The topology DSL: StreamsBuilder, KStream, KTable, Topology and the Processor API."""

from streamplatform.dsl.builder import StreamsBuilder
from streamplatform.dsl.kstream import KStream, KTable
from streamplatform.dsl.processor import Processor, ProcessorContext, PunctuationType
from streamplatform.dsl.topology import SubTopology, TaskId, Topology

__all__ = [
    "KStream",
    "KTable",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "StreamsBuilder",
    "SubTopology",
    "TaskId",
    "Topology",
]
