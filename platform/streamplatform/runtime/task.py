"""A task: one sub-topology on one partition, as plain Python.

The task owns its processors and state stores, takes raw source records in offset order,
and collects what they produce (sink, repartition and DLQ records) as ``ProducerRecord``s. The
same code runs in ``TopologyTestDriver`` and in Spark executors; it knows nothing of either.

Errors follow KIP-1033/1034 (README, "Writing a topology"): a record that cannot be
deserialized goes to the deserialization handler, a processor or punctuator that raises to the
processing handler, a record that cannot be serialized to the production handler. ``resume``
drops the record and goes on, ``fail`` raises TaskFailedError; DLQ records are collected either
way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from streamplatform.config import StreamsConfig, load_object
from streamplatform.dsl.graph import ProcessorNode, SinkNode, as_extractor, topic_name
from streamplatform.dsl.processor import Processor, PunctuationType
from streamplatform.dsl.topology import SubTopology, TaskId, Topology
from streamplatform.errors.context import ErrorHandlerContext
from streamplatform.errors.exceptions import StreamsError, TaskFailedError
from streamplatform.errors.handlers import (
    DESERIALIZATION,
    PROCESSING,
    PRODUCTION,
    ExceptionHandler,
    call_handler,
    load_handler,
)
from streamplatform.errors.response import Action
from streamplatform.records import (
    NO_SOURCE,
    ConsumedRecord,
    ProducerRecord,
    Record,
    TopicPartition,
)
from streamplatform.registry.serdes import configure_registry_serdes
from streamplatform.runtime.node_context import NodeContext, Punctuation
from streamplatform.runtime.sink_writers import direct_sink, sink_writer
from streamplatform.runtime.source_records import (
    UNDECODED,
    decoded,
    deserializers,
    extracted,
    ordering_time,
    undecoded_values,
)
from streamplatform.serdes import (
    configure_serde,
)
from streamplatform.state import IsolationLevel
from streamplatform.state.facades import facade_for
from streamplatform.state.rocks import TaskStoreOptions
from streamplatform.state.store_metrics import timed

log = logging.getLogger(__name__)

UNKNOWN_TIME = -1  # stream time before the first record, as in Kafka Streams
# Committed with the stores' offsets, under pseudo-partitions, so that a task opened again
# (another Python worker, a restart) goes on with its stream time and its stream-time
# punctuation schedule instead of starting them over.
STREAM_TIME_MARKER = TopicPartition("__streamplatform.stream_time__", 0)
PUNCTUATION_MARKER_TOPIC = "__streamplatform.punctuation__"  # partition: the schedule's index
# The same for wall-clock schedules: a task opened again goes on with the schedule it
# committed, so that a replayed batch fires the punctuations its first attempt fired, whether
# its task was kept open in a worker or opened anew (docs/guarantees.md).
WALL_CLOCK_MARKER_TOPIC = "__streamplatform.wall_clock_punctuation__"
_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__

try:  # the task loop in C, built with the package where a C compiler is available
    from streamplatform.runtime import _task_loop as _native_loop
except ImportError:  # pragma: no cover - depends on the build
    _native_loop = None  # type: ignore[assignment]
else:
    _native_loop.configure(UNDECODED, ConsumedRecord, Record, StreamsError, DESERIALIZATION,
                           PROCESSING, PunctuationType.STREAM_TIME)  # fmt: skip
# Tests set this to False to run the Python reference where the C loop would run.
NATIVE_LOOP = True
# How process_all handles a topic's records (Task._route).
_Route = tuple[Any, Callable, Callable, bool, list[tuple[Callable, str | None]], Callable | None]


def _fresh_timing() -> dict[str, int]:
    """A batch's sums behind a task's record-lateness and record-e2e-latency metrics."""
    return {"lateness_sum_ms": 0, "lateness_max_ms": 0, "timestamp_sum_ms": 0,
            "timestamp_min": 2**62, "timestamped": 0}  # fmt: skip


def add_metrics(totals: dict[str, int], numbers: Mapping[str, int]) -> None:
    """Add ``numbers`` into ``totals``: counts are summed; a ``*_max`` (or ``*_max_ms``) value
    (a time, such as ``stream_time_max``: the largest record timestamp read) keeps the
    largest, a ``*_min_ms`` the smallest."""
    for name, value in numbers.items():
        if name.endswith(("_max", "_max_ms")):
            totals[name] = max(totals.get(name, value), int(value))
        elif name.endswith("_min_ms"):
            totals[name] = min(totals.get(name, value), int(value))
        else:
            totals[name] = totals.get(name, 0) + int(value)


class Task:
    """Runs ``subtopology`` for ``partition``; stores live under ``state_dir/<app>/<task id>``.

    ``partitions_of(topic)`` gives a topic's partition count, for records written to
    repartition topics (they get an explicit, murmur2-based partition); ``wall_clock()`` the
    time in ms for wall-clock punctuations.
    """

    def __init__(
        self,
        topology: Topology,
        subtopology: SubTopology,
        partition: int,
        config: StreamsConfig,
        state_dir: Path,
        partitions_of: Callable[[str], int],
        wall_clock: Callable[[], int] = lambda: int(time.time() * 1000),
        isolation_level: IsolationLevel | None = None,
        stores_opened: Callable[[Task], None] | None = None,
        runtime_stores: Mapping[str, Any] | None = None,
    ) -> None:
        self.topology = topology
        self.subtopology = subtopology
        self.config = config
        self.application_id: str = config["application.id"]
        self.task_id = TaskId(subtopology.id, partition)
        self.partitions_of = partitions_of
        self.wall_clock = wall_clock
        self.stream_time = UNKNOWN_TIME
        # Per batch: the sums behind record-lateness and record-e2e-latency (metrics()).
        self.timing = _fresh_timing()
        self.current: ConsumedRecord | None = None
        # Event time from the records' payload (timestamp extractors): the largest extracted
        # per source partition, and the extractor of sources without their own.
        self.partition_times: dict[tuple[str, int], int] = {}
        default_extractor = config["default.timestamp.extractor"]
        self._default_extractor = (
            None if default_extractor is None else as_extractor(load_object(default_extractor))
        )
        self.output: list[ProducerRecord] = []
        # Parallel to `output`: the source record behind each (a ConsumedRecord, or a tuple
        # in its layout: topic, partition and offset come first), NO_SOURCE for none.
        self.output_sources: list[tuple] = []
        # Versions written to versioned stores by table sources: (store, key, value, timestamp).
        self.versions: list[tuple[str, bytes, bytes | None, int]] = []
        self.dlq_topic: str | None = config["errors.dead.letter.queue.topic.name"]
        self.punctuations: list[Punctuation] = []
        self.consumed: dict[tuple[str, int], int] = {}  # next offset to read, per partition
        self.records_in = 0
        self.dlq_records = 0
        self.skipped = 0  # records a handler answered `resume` for
        self._output_taken = 0
        self._processor_base: dict[str, int] = {}  # start_batch(): the counters before it
        self._sources = {
            topic_name(s.topic, s.internal, self.application_id): s
            for s in subtopology.sources(topology)
        }
        self._handlers: dict[str, ExceptionHandler] = {
            setting: load_handler(config, setting)
            for setting in (DESERIALIZATION, PROCESSING, PRODUCTION)
        }
        self._configure_serdes()
        self.directory = state_dir / self.application_id / str(self.task_id)
        # Under either guarantee a task's writes stay in its stores' transactions until the
        # task commits them (with its offsets): a failed attempt leaves no state behind, and
        # a processor reads its own writes either way (KIP-892's isolation level is what
        # other readers see).
        isolation = isolation_level or IsolationLevel.READ_COMMITTED
        self.stores: dict[str, Any] = {}
        # The task's copies of the global tables it joins (global_tables.py): kept apart from
        # `stores`, which commit with the task and leave as changelog; a global table's topic
        # is its changelog, and its copy commits the offsets it was caught up to.
        self.global_stores: dict[str, Any] = {}
        self._facades: dict[str, Any] = {}
        # RocksDB options per store: platform.rocksdb.* settings, then rocksdb.config.setter.
        self._store_options = TaskStoreOptions(config)
        try:
            global_names = {table.store_name for table in topology.global_tables()}
            for name in subtopology.stores:
                opened = self.global_stores if name in global_names else self.stores
                opened[name] = topology.stores[name].open(
                    self.directory,
                    isolation,
                    options=self._store_options.options(name),
                    max_uncommitted_records=config["statestore.uncommitted.max.records"],
                    max_uncommitted_bytes=config["statestore.uncommitted.max.bytes"],
                )
            # The runtime's own stores (the repartition buffer, executor.py): transactional,
            # in the changelog and restored like the others, never seen by a processor.
            for name, spec in (runtime_stores or {}).items():
                self.stores[name] = spec.open(self.directory, isolation)
            if stores_opened is not None:
                # Before the processors see the stores: the Spark runtime settles and restores
                # them here, so that what a processor loads at init is already current.
                stores_opened(self)
            # What the built-in processors of this task instance share (the two sides of a
            # stream-stream join share its stores' times), by a name of theirs.
            self.shared: dict[str, Any] = {}
            self.processors: dict[str, Processor] = {}
            for name in subtopology.nodes:
                if isinstance(topology.nodes[name], ProcessorNode):
                    self.processors[name] = topology.nodes[name].supplier()  # type: ignore[union-attr]
            self._sources = undecoded_values(self._sources, self.processors,
                                             self._default_extractor)  # fmt: skip
            # statestore.cache.max.bytes is the task's memory budget: each processor that
            # keeps state in memory (the aggregations' record caches, the deduplications' ids)
            # gets an equal share of it, so that together they stay within it.
            users = sum(1 for p in self.processors.values() if p.uses_record_cache())
            self.cache_share = config["statestore.cache.max.bytes"] // max(1, users)
            # One delivery function per node, so a record's path costs no lookups.
            self._deliver = {name: self._deliverer(name) for name in subtopology.nodes}
            for name, processor in self.processors.items():
                processor.init(NodeContext(self, topology.nodes[name]))  # type: ignore[arg-type]
            self._restore_schedule()
            # Asked after every record: only the stores that have a limit, as bound methods.
            limited = (
                config["statestore.uncommitted.max.records"] is not None
                or config["statestore.uncommitted.max.bytes"] is not None
            )
            # A processor that holds writes for its store before handing them over answers
            # for that store (it counts them too).
            holders = {
                store: check
                for processor in self.processors.values()
                for store, check in processor.held_writes().items()
            }
            # A holder may have a limit of its own (a deduplication's memory budget).
            self._limit_checks = (
                [
                    holders.get(name, store.uncommitted_limit_exceeded)
                    for name, store in self.stores.items()
                ]
                if limited or holders
                else []
            )
            self._check_every = _limit_check_interval(config)
        except BaseException:
            self._close_stores()
            raise

    def _configure_serdes(self) -> None:
        """The job's settings to the serdes of this task's sources, sinks and stores (Kafka's
        ``Serde.configure``): registry serdes take the registry's settings from them, and a
        registry serde with no registry to go to fails the task here, before any record."""
        serdes = self.topology.serdes(self.subtopology.nodes, self.subtopology.stores)
        for serde in serdes:
            configure_serde(serde, self.config)
        configure_registry_serdes(serdes, self.config)

    # Processing --------------------------------------------------------------------------

    def process(self, record: ConsumedRecord) -> None:
        """One source record; the caller hands them over in offset order per partition. The
        same path as ``process_all`` (the TopologyTestDriver's and Spark's)."""
        self.process_all((record,))

    def process_all(self, records: Iterable[ConsumedRecord], stop_early: bool = False) -> bool:
        """``process`` each of ``records`` in order, in one loop that looks nothing up per
        record. A record may also be a plain tuple in ConsumedRecord's layout (cheaper to
        build in bulk). With ``stop_early``, stops right after the record that made
        ``needs_early_commit()`` true and returns True (the rest of ``records`` is left
        unread); otherwise returns False once every record is processed. The limits are asked
        every few records when they are far above what a record writes (see
        ``_limit_check_interval``), as Kafka Streams asks once per loop over polled records.

        The loop runs in C (``_task_loop``) where the package was built with it;
        ``_process_all`` is its reference, which runs otherwise."""
        checks = self._limit_checks if stop_early else ()
        if _native_loop is not None and NATIVE_LOOP:
            return _native_loop.process_all(  # type: ignore[no-any-return]
                self, self._decoded(records), checks, self._check_every
            )
        return self._process_all(records, checks)

    def _route(self, topic: str) -> _Route:
        """How ``process_all`` handles a record of ``topic``: its source, key and value
        deserializers, whether they take the headers, the source's children (``_entry``) and
        its timestamp extractor (None: the record's own time)."""
        source = self._sources.get(topic)
        if source is None:
            raise ValueError(f"Task {self.task_id} does not read topic {topic!r}")
        return (
            source, *deserializers(source, topic),
            [self._entry(child) for child in source.children],
            source.timestamp_extractor or self._default_extractor,
        )  # fmt: skip

    def _process_all(self, records: Iterable[ConsumedRecord], checks: Iterable[Callable]) -> bool:
        """``process_all`` in Python: the reference of the C loop."""
        routes: dict[str, _Route] = {}
        consumed, new_record = self.consumed, _new_tuple
        every = countdown = self._check_every
        # The consumed offset of a partition is written when the loop moves on to another
        # partition and when it ends (however it ends), not after every record: between
        # records nothing reads it. Likewise the record count, and `current` is reset at the end.
        last: ConsumedRecord | None = None
        processed = 0
        # Kafka Streams' task metrics, at the cost of a comparison per record: record-lateness
        # (how far behind the stream time a record came) and the timestamps behind
        # record-e2e-latency (the processing time minus the record's time), summed here.
        lateness_sum = lateness_max = timestamp_sum = timestamped = 0
        timestamp_min = self.timing["timestamp_min"]
        try:
            for record, key, value in self._decoded(records):
                topic = record[0]
                route = routes.get(topic)
                if route is None:
                    route = routes[topic] = self._route(topic)
                if last is not None and (record[1] != last[1] or topic != last[0]):
                    consumed[(last[0], last[1])] = last[2] + 1
                last = record
                source, key_of, value_of, contextual, children, extract = route
                self.current = record
                processed += 1
                try:
                    if key is UNDECODED:
                        if contextual:  # serdes given the topic and headers (SerdeContext)
                            key = key_of(record[4], record[6])
                            value = value_of(record[5], record[6])
                        else:
                            key = key_of(record[4])
                            value = value_of(record[5])
                    timestamp = record[3]
                    if extract is not None:  # event time from the record (Kafka Streams'
                        timestamp = self._extracted(extract, record, key, value)  # extractor)
                except StreamsError:
                    raise  # not the record's fault (the registry is down, say): fail the task
                except Exception as exception:
                    raw = record if type(record) is ConsumedRecord else ConsumedRecord(*record)
                    self._handle(DESERIALIZATION, source.name, raw, exception)
                else:
                    if timestamp > self.stream_time:
                        self.stream_time = timestamp
                    elif timestamp < self.stream_time:
                        late = self.stream_time - timestamp
                        lateness_sum += late
                        if late > lateness_max:
                            lateness_max = late
                    if timestamp < timestamp_min:
                        timestamp_min = timestamp
                    timestamp_sum += timestamp
                    timestamped += 1
                    typed = new_record(Record, (key, value, timestamp, record[6]))
                    for deliver, node in children:
                        # What _deliverer's wrapper does, without its call per record.
                        try:
                            deliver(typed)
                        except StreamsError:
                            raise
                        except Exception as exception:
                            if node is None:  # a sink: it handled what it could itself
                                raise
                            self._handle(PROCESSING, node, typed, exception)
                    if self.punctuations:
                        self._punctuate(PunctuationType.STREAM_TIME, self.stream_time)
                if checks:
                    countdown -= 1
                    if countdown == 0:
                        countdown = every
                        for exceeded in checks:
                            if exceeded():
                                return True
        finally:
            if last is not None:
                consumed[(last[0], last[1])] = last[2] + 1
            self.records_in += processed
            self.current = None
            timing = self.timing
            timing["lateness_sum_ms"] += lateness_sum
            timing["lateness_max_ms"] = max(timing["lateness_max_ms"], lateness_max)
            timing["timestamp_sum_ms"] += timestamp_sum
            timing["timestamp_min"] = timestamp_min
            timing["timestamped"] += timestamped
        return False

    def ordering_time(self) -> Callable[[Any], int] | None:
        """Each input record's timestamp for ordering the task's input queues
        (source_records.ordering_time); None when no source has an extractor."""
        return ordering_time(self._sources, self._default_extractor, self.partition_times)

    def _extracted(self, extract: Callable, record: Any, key: Any, value: Any) -> int:
        return extracted(self.partition_times, extract, record, key, value)

    def _decoded(self, records: Iterable[ConsumedRecord]) -> Iterator[tuple[Any, Any, Any]]:
        return decoded(self._sources, records)

    def store_facades(self) -> dict[str, Any]:
        """The processor-facing stores handed out so far, by store name."""
        return dict(self._facades)

    def store_facade(self, name: str) -> Any:
        """The processor-facing interface of store ``name`` (one per store and task)."""
        facade = self._facades.get(name)
        if facade is None:
            facade = facade_for(self.topology.stores[name], self.engine_store(name))
            if self.config["metrics.recording.level"] != "INFO":
                facade = timed(facade)  # Kafka Streams' store operation metrics (DEBUG)
            self._facades[name] = facade
        return facade

    def every_store(self) -> list[Any]:
        """The task's stores and its copies of global tables: what holds its directory."""
        return [*self.stores.values(), *self.global_stores.values()]

    def engine_store(self, name: str) -> Any:
        """Store ``name`` itself (a global table's copy included)."""
        store = self.stores.get(name)
        return self.global_stores[name] if store is None else store

    def dispatch(self, name: str, record: Record) -> None:
        """Hand ``record`` to node ``name``; its errors go to the matching handler."""
        self._deliver[name](record)

    def _entry(self, name: str) -> tuple[Callable[[Record], None], str | None]:
        """How ``process_all`` delivers a source's record to its child ``name``: a processor's
        ``process`` with its node name (process_all handles its errors, as ``_deliverer``'s
        wrapper would), or a sink's delivery function with None."""
        if name in self.processors:
            return self.processors[name].process, name
        return self._deliver[name], None

    def _deliverer(self, name: str) -> Callable[[Record], None]:
        node = self.topology.nodes[name]
        if isinstance(node, SinkNode):
            return self._writer(node)
        if not isinstance(node, ProcessorNode):
            return lambda record: None  # sources are entered through process()
        process = self.processors[name].process
        handle = self._handle

        def deliver(record: Record) -> None:
            try:
                process(record)
            except StreamsError:  # a failure decided further down: never handled twice
                raise
            except Exception as exception:
                handle(PROCESSING, name, record, exception)

        return deliver

    def punctuate_wall_clock(self, now_ms: int) -> None:
        """Fire wall-clock punctuators that are due at ``now_ms``."""
        self._punctuate(PunctuationType.WALL_CLOCK_TIME, now_ms)

    def _punctuate(self, kind: PunctuationType, now: int) -> None:
        for punctuation in self.punctuations:
            if punctuation.kind is not kind or now < punctuation.next_time:
                continue
            punctuation.advance(now)
            saved, self.current = self.current, None
            try:
                punctuation.call(now)
            except StreamsError:
                raise
            except Exception as exception:
                self._handle(PROCESSING, punctuation.node, None, exception)
            finally:
                self.current = saved

    def _writer(self, sink: SinkNode) -> Callable[[Record], None]:
        """The delivery function of a sink (sink_writers.py)."""
        return sink_writer(self, sink)

    def direct_sink(self, node: str) -> tuple[SinkNode, str, list, list] | None:
        """The sink a built-in processor may write to itself (sink_writers.direct_sink)."""
        return direct_sink(self, node)

    def _handle(
        self,
        setting: str,
        node: str,
        record: Any,
        exception: BaseException,
        topic: str | None = None,
    ) -> None:
        current = self.current
        production = setting == PRODUCTION
        context = ErrorHandlerContext(
            topic=current[0] if current else None,
            partition=current[1] if current else -1,
            offset=current[2] if current else -1,
            timestamp=record.timestamp if record is not None else self.stream_time,
            processor_node_name=node,
            task_id=str(self.task_id),
            headers=list(current[6]) if current else [],
            source_raw_key=None if production or current is None else current[4],
            source_raw_value=None if production or current is None else current[5],
        )
        response = call_handler(self._handlers[setting], setting, context, record, exception)
        self.output.extend(response.dlq_records)
        self.output_sources.extend([self._source_coordinates()] * len(response.dlq_records))
        self.dlq_records += len(response.dlq_records)
        if response.action is Action.RESUME:
            self.skipped += 1
            return
        reason = "failed the task"
        if response.action is Action.RETRY:
            reason = "answered retry, which only applies to sends; failing the task"
        raise TaskFailedError(
            f"Task {self.task_id}: {setting} {reason} on {type(exception).__name__}: {exception} "
            f"at {node} (source {context.topic}-{context.partition}@{context.offset})",
            str(self.task_id),
        ) from exception

    # Commit and close ------------------------------------------------------------------------

    def offsets(self) -> dict[TopicPartition, int]:
        """The consumed offsets to commit with the stores, with the task's stream time and
        stream-time punctuation schedule under pseudo-partitions (``_restore_schedule``)."""
        offsets = {TopicPartition(*tp): offset for tp, offset in self.consumed.items()}
        return offsets | self.time_offsets()

    def time_offsets(self) -> dict[TopicPartition, int]:
        """The task's stream time and stream-time punctuation schedule, as the offsets of
        pseudo-partitions (committed with the stores, and in the changelog)."""
        offsets = {}
        if self.stream_time >= 0:
            offsets[STREAM_TIME_MARKER] = self.stream_time
        for index, punctuation in enumerate(self.punctuations):
            if punctuation.next_time >= 0:
                offsets[TopicPartition(_MARKER_TOPICS[punctuation.kind], index)] = (
                    punctuation.next_time
                )
        return offsets

    def _restore_schedule(self) -> None:
        """Take back the stream time and stream-time schedule committed with the stores.

        Kafka Streams keeps a task's stream time in its committed offsets' metadata; its
        punctuation schedule lives as long as the task. Here a task may be opened again
        between two batches (by another Spark Python worker, or by the replay of a batch), so
        the schedules are committed too: an hourly punctuator fires once an hour of stream
        time, not at the first record of every opening, and a replayed batch fires the
        wall-clock punctuations its first attempt fired. A schedule committed before its
        processor's schedules changed (another number of them) is not taken."""
        store = next(iter(self.stores.values()), None)
        if store is None:
            return
        saved = store.committed_offsets()
        stream_time = saved.get(STREAM_TIME_MARKER)
        if stream_time is not None:
            self.stream_time = max(self.stream_time, stream_time)
        for kind, topic in _MARKER_TOPICS.items():
            expected = [
                index for index, punctuation in enumerate(self.punctuations)
                if punctuation.kind is kind
            ]  # fmt: skip
            found = sorted(tp.partition for tp in saved if tp.topic == topic)
            if not expected or found != expected:
                continue
            for index in expected:
                self.punctuations[index].next_time = saved[TopicPartition(topic, index)]

    def start_batch(self) -> None:
        """Begin another batch on a task kept open since its last one (a Spark Python worker
        keeps it, task_cache.py): the per-batch numbers start over; state, stream time and
        punctuation schedules go on."""
        self.consumed = {}
        self.records_in = self.dlq_records = self.skipped = self._output_taken = 0
        self.timing = _fresh_timing()
        self._processor_base = self._processor_metrics()

    def has_uncommitted_limits(self) -> bool:
        """False when no store can pass a limit: needs_early_commit() is then always False."""
        return bool(self._limit_checks)

    def needs_early_commit(self) -> bool:
        """True when a store passed statestore.uncommitted.max.records / .max.bytes (KIP-892)."""
        for exceeded in self._limit_checks:  # noqa: SIM110 (no generator per record)
            if exceeded():
                return True
        return False

    def flush(self) -> None:
        """Let processors forward what they hold until a commit (the aggregations' record
        cache), upstream first; call before the task's output is taken for a commit."""
        for processor in self.processors.values():
            self.current = None  # what they forward comes from no one source record
            processor.flush()

    def before_commit(self) -> None:
        """Let processors stage what they keep with a commit (the dedup's stream time); call
        before committing or preparing the stores."""
        for processor in self.processors.values():
            before_commit = getattr(processor, "before_commit", None)
            if before_commit is not None:
                before_commit()

    def commit(self) -> dict[TopicPartition, int]:
        """Commit every store with the task's consumed offsets; returns those offsets."""
        offsets = self.offsets()
        self.flush()
        self.before_commit()
        for store in self.stores.values():
            store.commit(offsets)
        return offsets

    def _source_coordinates(self) -> tuple:
        return self.current or NO_SOURCE

    def take_output_sources(self) -> list[tuple]:
        """Call before take_output(): the source records of the records it returns (their
        topic, partition and offset come first; NO_SOURCE for none)."""
        sources = self.output_sources[:]
        self.output_sources.clear()
        return sources

    def take_versions(self) -> list[tuple[str, bytes, bytes | None, int]]:
        versions, self.versions = self.versions, []
        return versions

    def take_output(self) -> list[ProducerRecord]:
        output = self.output[:]
        self.output.clear()  # in place: the sinks' delivery functions hold this list
        self._output_taken += len(output)
        return output

    def metrics(self) -> dict[str, int]:
        numbers = {
            "records_in": self.records_in,
            "records_out": self._output_taken + len(self.output) - self.dlq_records,
            "dlq_records": self.dlq_records,
            "skipped": self.skipped,
        }
        if self.stream_time != UNKNOWN_TIME:
            numbers["stream_time_max"] = self.stream_time
        timing = self.timing
        if timing["timestamped"]:  # Kafka Streams' record-lateness (e2e: e2e_latency())
            numbers["record_lateness_sum_ms"] = timing["lateness_sum_ms"]
            numbers["record_lateness_max"] = timing["lateness_max_ms"]
            numbers["records_timestamped"] = timing["timestamped"]
        base = self._processor_base
        for name, value in self._processor_metrics().items():
            numbers[name] = value - base.get(name, 0)
        return numbers

    def e2e_latency(self, now_ms: int) -> dict[str, int]:
        """Kafka Streams' record-e2e-latency of this batch's records at ``now_ms`` (the end of
        their processing): the sum over them and the largest, in ms. Apart from metrics(),
        which stays the same whenever it is read."""
        timing = self.timing
        if not timing["timestamped"]:
            return {}
        return {
            "record_e2e_latency_sum_ms": max(
                0, now_ms * timing["timestamped"] - timing["timestamp_sum_ms"]
            ),
            "record_e2e_latency_max_ms": max(0, now_ms - timing["timestamp_min"]),
            # The freshest record's: the stream time bounds the batch's newest timestamp.
            "record_e2e_latency_min_ms": max(0, now_ms - self.stream_time),
        }

    def _processor_metrics(self) -> dict[str, int]:
        """The built-in processors' counters, summed over the task's processors, since the
        task was opened."""
        numbers: dict[str, int] = {}
        for processor in self.processors.values():
            add_metrics(numbers, processor.task_metrics())
        return numbers

    def close(self) -> None:
        """Close processors and stores; uncommitted store writes are discarded."""
        for processor in getattr(self, "processors", {}).values():
            try:
                processor.close()
            except Exception:
                log.exception("Closing a processor of task %s failed", self.task_id)
        self._close_stores()

    def _close_stores(self) -> None:
        for store in self.every_store():
            store.close()
        self.global_stores = {}
        self._store_options.close()  # rocksdb.config.setter's close(store_name, options)
        self.stores = {}
        self._facades = {}


_MARKER_TOPICS = {
    PunctuationType.STREAM_TIME: PUNCTUATION_MARKER_TOPIC,
    PunctuationType.WALL_CLOCK_TIME: WALL_CLOCK_MARKER_TOPIC,
}


def _limit_check_interval(config: StreamsConfig) -> int:
    """Every how many records ``process_all`` asks the stores' uncommitted limits: every
    record for small limits (a limit of 25 records stops within one record of it), every 64th
    for the default 64 MiB, where 63 records of overshoot are nothing and asking costs about
    as much as the store write itself. The memory budget (``statestore.cache.max.bytes``,
    which a deduplication also asks about) counts like a byte limit."""
    every = 64
    max_records = config["statestore.uncommitted.max.records"]
    max_bytes = config["statestore.uncommitted.max.bytes"]
    cache_bytes = config["statestore.cache.max.bytes"]
    if max_records is not None:
        every = min(every, max(1, max_records // 1024))
    for limit in (max_bytes, cache_bytes or None):
        if limit is not None:
            every = min(every, max(1, limit // (1024 * 1024)))
    return every
