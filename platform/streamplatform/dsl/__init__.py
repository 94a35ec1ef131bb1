"""The topology DSL: StreamsBuilder, KStream, KTable, Topology and the Processor API."""

from streamplatform.dsl.builder import StreamsBuilder
from streamplatform.dsl.global_table import GlobalKTable
from streamplatform.dsl.graph import RecordContext, TopicNameExtractor
from streamplatform.dsl.grouped import KGroupedStream, SessionWindowedKStream, TimeWindowedKStream
from streamplatform.dsl.grouped_table import KGroupedTable
from streamplatform.dsl.kstream import KStream, KTable
from streamplatform.dsl.printing import Printed
from streamplatform.dsl.processor import Processor, ProcessorContext, PunctuationType
from streamplatform.dsl.stream_join import JoinWindows
from streamplatform.dsl.suppress import BufferConfig, Suppressed
from streamplatform.dsl.topology import SubTopology, TaskId, Topology
from streamplatform.dsl.windows import (
    EmitStrategy,
    SessionWindowedSerde,
    SessionWindows,
    SlidingWindows,
    TimeWindowedSerde,
    TimeWindows,
    Window,
    Windowed,
)

__all__ = [
    "BufferConfig",
    "EmitStrategy",
    "GlobalKTable",
    "JoinWindows",
    "KGroupedStream",
    "KGroupedTable",
    "KStream",
    "KTable",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "RecordContext",
    "SessionWindowedKStream",
    "SessionWindowedSerde",
    "SessionWindows",
    "SlidingWindows",
    "StreamsBuilder",
    "SubTopology",
    "Printed",
    "Suppressed",
    "TaskId",
    "TimeWindowedKStream",
    "TimeWindowedSerde",
    "TimeWindows",
    "TopicNameExtractor",
    "Topology",
    "Window",
    "Windowed",
]
