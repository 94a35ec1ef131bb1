"""TopologyTestDriver: run a Topology in-process, no Kafka, no Spark — the same task code.

Input records get per-partition offsets counting from 0; each piped record is processed at
once and, by default, its task committed, as in Kafka Streams' driver. On Spark a task commits
once per micro-batch, after many records: ``commit_every=N`` commits after every N piped
records, and ``commit_every=None`` only at ``advance_wall_clock_time`` and ``commit()``, so
a processor whose results depend on commit boundaries shows it in a test. Records written to
topics the
topology also reads (repartition topics, or a user's own loop) are processed right away.
Every topic has one partition unless a record is piped with ``partition=``; repartition topics
have ``repartition_partitions`` (default 1). Stores are real RocksDB stores in a temporary
directory that ``close()`` removes (``state.dir`` in the config keeps them instead).

A record piped into a global table's topic (``StreamsBuilder.global_table``) updates at once,
before the next record, every open task's copy of the table's store, as Kafka Streams' driver
processes global records synchronously; the driver keeps the global records, and a task
created later catches its copies up with them before its processors start.

When a task fails (a ``log_and_fail`` handler, an error with no handler) ``pipe_input`` raises
it; output written before stays readable and the task restarts from its last commit: the state
written since is gone (as on Spark, where the batch is then replayed; the driver does not pipe
those records again).

    >>> from streamplatform import StreamsBuilder, TopologyTestDriver
    >>> from streamplatform.serdes import Serdes
    >>> b = StreamsBuilder()
    >>> b.stream("in", Serdes.string(), Serdes.long()).deduplicate_by_key(1_000).to("out")
    >>> with TopologyTestDriver(b.build(), {"application.id": "doc"}) as driver:
    ...     source = driver.create_input_topic("in", Serdes.string(), Serdes.long())
    ...     for timestamp in (0, 500, 1_000, 1_001):
    ...         source.pipe_input("k", timestamp, timestamp=timestamp)
    ...     driver.create_output_topic("out", Serdes.string(), Serdes.long()).read_values_to_list()
    [0, 1001]
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict, deque
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from streamplatform.config import StreamsConfig
from streamplatform.dsl.naming import check_explicit_naming
from streamplatform.dsl.topology import Topology
from streamplatform.errors.exceptions import StreamsError
from streamplatform.records import ConsumedRecord, Headers, ProducerRecord, TopicPartition
from streamplatform.runtime.global_tables import apply_global_records
from streamplatform.runtime.task import Task, add_metrics
from streamplatform.serdes import Serde, configure_serde, deserializer_for, serializer_for
from streamplatform.state.stores import duration_ms


class TestRecord(NamedTuple):
    key: Any
    value: Any
    timestamp: int
    headers: Headers


TestRecord.__test__ = False  # type: ignore[attr-defined]  # not a pytest test class


class TestInputTopic:
    __test__ = False  # not a pytest test class

    def __init__(self, driver: TopologyTestDriver, name: str, key_serde: Serde, value_serde: Serde):
        self._driver, self.name = driver, name
        self._key_serde, self._value_serde = driver._configured(key_serde, value_serde)
        self._serialize_key = serializer_for(key_serde, name, True)
        self._serialize_value = serializer_for(value_serde, name, False)

    def pipe_input(
        self,
        key: Any,
        value: Any,
        timestamp: int | None = None,
        headers: Headers | None = None,
        partition: int = 0,
    ) -> None:
        """Serialize and process one record (timestamp defaults to the driver's wall clock).
        A serde that uses a context (a registry serde) is given the topic and the headers,
        and may add a header (the schema id)."""
        headers_list = [(name, value) for name, value in (headers or [])]
        self._driver._pipe_raw(
            self.name,
            partition,
            self._serialize_key(key, headers_list),
            self._serialize_value(value, headers_list),
            self._driver.wall_clock_ms if timestamp is None else timestamp,
            headers_list,
        )

    def pipe_raw(
        self,
        key: bytes | None,
        value: bytes | None,
        timestamp: int | None = None,
        headers: Headers | None = None,
        partition: int = 0,
    ) -> None:
        """Process bytes as they would arrive from Kafka (e.g. a malformed record)."""
        timestamp = self._driver.wall_clock_ms if timestamp is None else timestamp
        self._driver._pipe_raw(self.name, partition, key, value, timestamp, list(headers or []))

    def pipe_key_value_list(self, pairs: list[tuple[Any, Any]], timestamp: int = 0) -> None:
        for key, value in pairs:
            self.pipe_input(key, value, timestamp=timestamp)


class TestOutputTopic:
    __test__ = False  # not a pytest test class

    """Reads consume: each record is returned once."""

    def __init__(self, driver: TopologyTestDriver, name: str, key_serde: Serde, value_serde: Serde):
        self._queue = driver._outputs[name]
        self.name = name
        self._key_serde, self._value_serde = driver._configured(key_serde, value_serde)
        self._deserialize_key = deserializer_for(key_serde, name, True)
        self._deserialize_value = deserializer_for(value_serde, name, False)

    def _read(self) -> TestRecord:
        raw = self._queue.popleft()
        headers = list(raw.headers)
        return TestRecord(
            self._deserialize_key(raw.key, headers),
            self._deserialize_value(raw.value, headers),
            raw.timestamp,
            headers,
        )

    def read_records_to_list(self) -> list[TestRecord]:
        return [self._read() for _ in range(len(self._queue))]

    def read_key_values_to_list(self) -> list[tuple[Any, Any]]:
        return [(r.key, r.value) for r in self.read_records_to_list()]

    def read_values_to_list(self) -> list[Any]:
        return [r.value for r in self.read_records_to_list()]

    def is_empty(self) -> bool:
        return not self._queue

    def get_queue_size(self) -> int:
        return len(self._queue)


class TopologyTestDriver:
    def __init__(
        self,
        topology: Topology,
        config: Mapping[str, Any] | StreamsConfig,
        initial_wall_clock_time_ms: int = 0,
        repartition_partitions: int = 1,
        commit_every: int | None = 1,
    ) -> None:
        if commit_every is not None and (
            isinstance(commit_every, bool) or not isinstance(commit_every, int) or commit_every < 1
        ):
            raise ValueError(f"commit_every must be None or an int >= 1, got {commit_every!r}")
        self.topology = topology
        self.config = config if isinstance(config, StreamsConfig) else StreamsConfig(config)
        # As the job does: a unit test catches stores and topics with generated names.
        check_explicit_naming(topology, self.config)
        self.application_id: str = self.config["application.id"]
        self.wall_clock_ms = initial_wall_clock_time_ms
        self.repartition_partitions = repartition_partitions
        self.commit_every = commit_every
        self._piped_since_commit = 0
        self._temporary = self.config["state.dir"] is None
        self.state_dir = Path(self.config["state.dir"] or tempfile.mkdtemp(prefix="sp-ttd-"))
        self._tasks: dict[tuple[int, int], Task] = {}
        self._next_offset: dict[tuple[str, int], int] = defaultdict(int)
        self._outputs: dict[str, deque[ProducerRecord]] = defaultdict(deque)
        self._repartition = set(topology.repartition_topics(self.application_id))
        self._global_tables = topology.global_tables()
        # Every record piped into each global table's topic, for the copies of tasks created
        # later (a task's copy is caught up from the offset it committed).
        self._global_records: dict[str, list[ConsumedRecord]] = {
            table.topic: [] for table in self._global_tables
        }

    # Topics ------------------------------------------------------------------------------------

    def _configured(self, *serdes: Serde) -> tuple[Serde, ...]:
        """A test topic's serdes with the driver's settings (a registry serde takes the
        registry from them, as the job's own serdes do)."""
        for serde in serdes:
            configure_serde(serde, self.config)
        return serdes

    def create_input_topic(self, name: str, key_serde: Serde, value_serde: Serde) -> TestInputTopic:
        if name in self._global_records:
            return TestInputTopic(self, name, key_serde, value_serde)
        if self.topology.subtopology_of_topic(name, self.application_id) is None:
            raise ValueError(f"The topology does not read topic {name!r}")
        return TestInputTopic(self, name, key_serde, value_serde)

    def create_output_topic(
        self, name: str, key_serde: Serde, value_serde: Serde
    ) -> TestOutputTopic:
        return TestOutputTopic(self, name, key_serde, value_serde)

    def advance_wall_clock_time(self, advance: timedelta | int) -> None:
        """Move the wall clock, fire the wall-clock punctuations that became due, and commit
        every task (a micro-batch ends on Spark when its wall-clock punctuations have run)."""
        self.wall_clock_ms += duration_ms(advance, "advance")
        for task in list(self._tasks.values()):
            self._run(task, lambda t: t.punctuate_wall_clock(self.wall_clock_ms))
        self.commit()

    def commit(self) -> None:
        """Commit every task's stores with its offsets, as the end of a micro-batch does."""
        for task in list(self._tasks.values()):
            self._run(task, Task.commit)
        self._piped_since_commit = 0

    def get_state_store(self, name: str, partition: int = 0) -> Any:
        """A task's store as its processors see it (``KeyValueStore`` / ``VersionedStore``:
        typed by the serdes it was declared with, uncommitted writes included), for
        assertions. Kafka Streams' ``getKeyValueStore`` / ``getVersionedKeyValueStore``."""
        is_global = any(table.store_name == name for table in self._global_tables)
        for (_, task_partition), task in self._tasks.items():
            if name in task.stores and task_partition == partition:
                return task.store_facade(name)
            if is_global and name in task.global_stores:  # every copy holds the whole table
                return task.store_facade(name)
        raise KeyError(f"No open task on partition {partition} has a store named {name!r}")

    def metrics(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for task in self._tasks.values():
            add_metrics(totals, task.metrics())
        return totals

    # Processing --------------------------------------------------------------------------------

    def _partitions_of(self, topic: str) -> int:
        return self.repartition_partitions if topic in self._repartition else 1

    def _task(self, subtopology_id: int, partition: int) -> Task:
        task = self._tasks.get((subtopology_id, partition))
        if task is None:
            subtopology = self.topology.subtopologies[subtopology_id]
            task = Task(
                self.topology, subtopology, partition, self.config, self.state_dir,
                self._partitions_of, lambda: self.wall_clock_ms,
                stores_opened=self._catch_up_global,
            )  # fmt: skip
            self._tasks[(subtopology_id, partition)] = task
            # With a kept state.dir, numbering goes on from the offsets committed with the stores.
            for store in [*task.stores.values(), *task.global_stores.values()]:
                for tp, offset in store.committed_offsets().items():
                    if tp.topic.startswith("__streamplatform."):
                        continue  # the task's stream time and schedule (Task.offsets)
                    current = self._next_offset[(tp.topic, tp.partition)]
                    self._next_offset[(tp.topic, tp.partition)] = max(current, offset)
        return task

    def _catch_up_global(self, task: Task) -> None:
        """Apply to ``task``'s copies of the global tables the records piped since the offsets
        each copy committed (all of them for a new copy), before its processors start."""
        for table in self._global_tables:
            store = task.global_stores.get(table.store_name)
            if store is None:
                continue  # a global table this task's sub-topology does not join
            by_partition: dict[int, list[ConsumedRecord]] = defaultdict(list)
            for record in self._global_records[table.topic]:
                by_partition[record.partition].append(record)
            for partition, records in by_partition.items():
                tp = TopicPartition(table.topic, partition)
                position = store.committed_offset(tp) or 0
                missing = [r for r in records if r.offset >= position]
                if missing:
                    apply_global_records(store, missing)
                    store.commit({tp: missing[-1].offset + 1})

    def _apply_global(self, record: ConsumedRecord) -> None:
        """A global table's record into every open task's copy of the table, committed at once
        with the offset it reached (a global store is not committed with its task)."""
        self._global_records[record.topic].append(record)
        tp = TopicPartition(record.topic, record.partition)
        for table in self._global_tables:
            if table.topic != record.topic:
                continue
            for task in self._tasks.values():
                store = task.global_stores.get(table.store_name)
                if store is not None:
                    apply_global_records(store, (record,))
                    store.commit({tp: record.offset + 1})

    def _pipe_raw(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers,
    ) -> None:
        pending = deque([(topic, partition, key, value, timestamp, headers)])
        while pending:
            topic, partition, key, value, timestamp, headers = pending.popleft()
            is_global = topic in self._global_records
            subtopology = self.topology.subtopology_of_topic(topic, self.application_id)
            if subtopology is None and not is_global:
                continue
            offset = self._next_offset[(topic, partition)]
            self._next_offset[(topic, partition)] = offset + 1
            record = ConsumedRecord(topic, partition, offset, timestamp, key, value, headers)
            if subtopology is None:
                self._apply_global(record)
                continue
            task = self._task(subtopology.id, partition)
            for out in self._run(task, lambda t, r=record: t.process(r)):
                if out.topic in self._global_records or self.topology.subtopology_of_topic(
                    out.topic, self.application_id
                ):
                    target = out.partition if out.partition is not None else 0
                    pending.append(
                        (out.topic, target, out.key, out.value, out.timestamp, out.headers)
                    )
        self._piped_since_commit += 1
        if self.commit_every is not None and self._piped_since_commit >= self.commit_every:
            self.commit()

    def _run(self, task: Task, step: Any) -> list[ProducerRecord]:
        """Run one step and route its output; on failure keep the output and restart the task
        (what it wrote since its last commit is gone)."""
        try:
            step(task)
        except StreamsError:
            self._route(task.take_output())
            self._restart(task)
            raise
        task.take_output_sources()
        task.take_versions()
        output = task.take_output()
        self._route(output)
        return output

    def _route(self, output: list[ProducerRecord]) -> None:
        for record in output:
            self._outputs[record.topic].append(record)

    def _restart(self, task: Task) -> None:
        """Like a crash and restart: uncommitted state is gone, the next record carries on."""
        key = (task.subtopology.id, task.task_id.partition)
        task.close()
        del self._tasks[key]

    def close(self) -> None:
        for task in self._tasks.values():
            task.close()
        self._tasks.clear()
        if self._temporary:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> TopologyTestDriver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
