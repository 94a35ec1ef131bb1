"""streamplatform: Kafka Streams' newest stateful features for PySpark pipelines run from Dagster.

The public API is re-exported here; everything not listed in ``__all__`` is internal.
Every error the platform raises is here too, with their root, ``StreamPlatformError``, which
each derives from: those of a running job (``JobClaimedError``, ``JobFencedError``,
``ReplayRefused``, ``MissingTaskOutputs``, ``KafkaInputError``, ``KafkaOutputError``,
``MaintenanceError``, ``RegistryUnavailableError``, ``UpgradeRefused``, ``TopologyNamingError``,
``ResetUnfinishedError``, ``RewindUnfinishedError``), of processing (``StreamsError``,
``TaskFailedError``, ``HandlerError``, ``SerializationError``, ``StateStoreError``,
``StoreLockedError``), of the tools (``QueryError``, ``TopicAdminError``,
``TopicNotAuthorizedError``, ``NoSuitableJava``) and ``ConfigError``. Serdes live in
``streamplatform.serdes``, stores in ``streamplatform.state``, error handling
in ``streamplatform.errors``, dead letter queues in ``streamplatform.dlq``, queries of a job's
committed state in ``streamplatform.state_query`` and the Dagster integration in
``streamplatform.dagster``. The Spark-side names (``StreamingJob``,
``BatchResult``, ``DlqReplayer``, ``read_versioned_snapshot``, ``batch_as_of_join``,
``read_kafka_ranges``, ``spark_session``, ``JobMetrics``) load on first use, so that
``import streamplatform`` stays light for a topology and its tests. ``data_dir()`` is the local
data folder (``.data/``, ``STREAMPLATFORM_DATA`` when set) where everything local lives by
default.

The README's first example, executed as a test: deduplicate transactions by id within 10 minutes,
then join each with the FX rate valid at its time.

>>> from datetime import timedelta
>>> from streamplatform import StreamsBuilder, TopologyTestDriver
>>> from streamplatform.serdes import Serdes
>>> from streamplatform.state import Stores
>>> b = StreamsBuilder()
>>> tx = b.stream("transactions", key_serde=Serdes.string(), value_serde=Serdes.json())
>>> rates = b.table("fx-rates", key_serde=Serdes.string(), value_serde=Serdes.json(),
...                 store=Stores.persistent_versioned_key_value_store("rates", timedelta(days=1)))
>>> (tx.deduplicate_by_key_value(lambda k, v: v["id"], timedelta(minutes=10))
...    .join(rates, lambda t, r: {**t, "eur": t["amount"] * r["rate"]})
...    .to("enriched", key_serde=Serdes.string(), value_serde=Serdes.json()))
>>> topology = b.build()
>>> with TopologyTestDriver(topology, {"application.id": "demo",
...                                    "errors.dead.letter.queue.topic.name": "demo-dlq"}) as d:
...     d.create_input_topic("fx-rates", Serdes.string(), Serdes.json()).pipe_input(
...         "k", {"rate": 0.5}, timestamp=0)
...     inp = d.create_input_topic("transactions", Serdes.string(), Serdes.json())
...     inp.pipe_input("k", {"id": 1, "amount": 3}, timestamp=1_000, headers=[("h", b"x")])
...     inp.pipe_input("k", {"id": 1, "amount": 3}, timestamp=2_000)  # a duplicate
...     inp.pipe_raw(b"k", b"not json", timestamp=3_000)  # to the DLQ; the task goes on
>>> d.create_output_topic("enriched", Serdes.string(), Serdes.json()).read_key_values_to_list()
[('k', {'id': 1, 'amount': 3, 'eur': 1.5})]
>>> [r.value for r in d.create_output_topic("demo-dlq", Serdes.bytes(), Serdes.bytes())
...     .read_records_to_list()]
[b'not json']
"""

from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.dsl import (
    BufferConfig,
    EmitStrategy,
    GlobalKTable,
    JoinWindows,
    KGroupedStream,
    KGroupedTable,
    KStream,
    KTable,
    Printed,
    Processor,
    ProcessorContext,
    PunctuationType,
    RecordContext,
    SessionWindowedKStream,
    SessionWindowedSerde,
    SessionWindows,
    SlidingWindows,
    StreamsBuilder,
    Suppressed,
    TimeWindowedKStream,
    TimeWindowedSerde,
    TimeWindows,
    TopicNameExtractor,
    Topology,
    Window,
    Windowed,
)
from streamplatform.errors.exceptions import HandlerError, StreamsError, TaskFailedError
from streamplatform.exceptions import StreamPlatformError
from streamplatform.home import data_dir
from streamplatform.records import Headers, ProducerRecord, Record, TopicPartition
from streamplatform.runtime.errors import (
    JobClaimedError,
    JobFencedError,
    MissingTaskOutputs,
    ReplayRefused,
)
from streamplatform.serdes import SerializationError
from streamplatform.state.errors import StateStoreError, StoreLockedError
from streamplatform.testing import TopologyTestDriver

__all__ = [
    "BufferConfig",
    "ConfigError",
    "EmitStrategy",
    "GlobalKTable",
    "HandlerError",
    "Headers",
    "JobClaimedError",
    "JobFencedError",
    "JoinWindows",
    "KGroupedStream",
    "KGroupedTable",
    "KStream",
    "KTable",
    "MissingTaskOutputs",
    "Processor",
    "ProcessorContext",
    "ProducerRecord",
    "PunctuationType",
    "Record",
    "RecordContext",
    "ReplayRefused",
    "SerializationError",
    "SessionWindowedKStream",
    "SessionWindowedSerde",
    "SessionWindows",
    "SlidingWindows",
    "StateStoreError",
    "StoreLockedError",
    "StreamPlatformError",
    "StreamsBuilder",
    "StreamsConfig",
    "StreamsError",
    "Printed",
    "Suppressed",
    "TaskFailedError",
    "TimeWindowedKStream",
    "TimeWindowedSerde",
    "TimeWindows",
    "TopicNameExtractor",
    "TopicPartition",
    "Topology",
    "TopologyTestDriver",
    "Window",
    "Windowed",
    "data_dir",
]
__version__ = "0.1.0"

# Loaded on first use (PEP 562): name -> module.
_LAZY = {
    "StreamingJob": "streamplatform.runtime.microbatch",
    "BatchResult": "streamplatform.runtime.microbatch",
    "DlqReplayer": "streamplatform.dlq.replay",
    "read_versioned_snapshot": "streamplatform.versioned_snapshot",
    "batch_as_of_join": "streamplatform.versioned_snapshot",
    "read_kafka_ranges": "streamplatform.spark",
    "spark_session": "streamplatform.spark",
    # Errors of modules that load the Kafka or registry clients.
    "KafkaInputError": "streamplatform.runtime.kafka_input",
    "KafkaOutputError": "streamplatform.runtime.kafka_output",
    "MaintenanceError": "streamplatform.runtime.maintenance",
    "RegistryUnavailableError": "streamplatform.registry.serdes",
    "TopologyNamingError": "streamplatform.dsl.naming",
    "UpgradeRefused": "streamplatform.runtime.upgrade",
    "ResetUnfinishedError": "streamplatform.runtime.reset",
    "RewindUnfinishedError": "streamplatform.runtime.rewind",
    "QueryError": "streamplatform.state_query.views",
    "TopicAdminError": "streamplatform.kafka.clients",
    "TopicNotAuthorizedError": "streamplatform.kafka.clients",
    "NoSuitableJava": "streamplatform.registry.local_registry",
    "JobMetrics": "streamplatform.metrics",
}
__all__ += sorted(_LAZY)


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'streamplatform' has no attribute {name!r}")
