"""Kafka sinks and the DLQ topic: each record with its own timestamp, exactly once under
exactly_once_v2.

Spark's Kafka writer (4.2) has no timestamp column: every record it writes gets the time of the
write. A job downstream would then see processing time instead of event time. Kafka Streams
forwards the record's timestamp to its sinks, so we do too: a batch's Kafka output is produced
by librdkafka producers with ``timestamp=`` the record's, its headers, and the partition the
task chose (internal topics) or murmur2 of the key, as Java clients do. Every sink record also
carries the header ``__streamplatform.source`` = ``<source topic>/<partition>/<offset>/<n>``:
the record its task was processing and the n-th output of that record.

**exactly_once_v2** (docs/guarantees.md): each task produces its Kafka records of batch N in
one Kafka transaction, with ``transactional.id`` = ``<application.id>-<task>``, stable across
batches, attempts and drivers. The same transaction commits the task's consumed offsets of
batch N to the consumer group ``application.id``, as Kafka Streams does. So:

- a second attempt of the task (a Spark retry, a speculative copy, the re-run of the batch
  after a driver crash) starts with ``init_transactions``: the broker aborts what an older
  attempt left open and fences it (it can no longer commit);
- then the attempt reads the group's committed offsets (``read_committed``: stable ones). If
  they already reach the task's consumed offsets of batch N, an earlier attempt committed this
  task's records: it produces nothing. Otherwise it produces them all and commits.

A task that reads no Kafka topic (after a repartition) has no offsets of its own: its
transaction commits offset N + 1 of a marker partition in a group of its own,
``<application.id>-task-<task>``, and the check reads that instead.

The driver appends batch N to its commit log after every task's transaction is committed. A
driver crash between the two leaves the Kafka records committed and the batch not: the re-run
skips them (above) and commits the rest. A crash before leaves open transactions: aborted by the
re-run's ``init_transactions`` (or by the broker after ``transaction.timeout.ms``).

**at_least_once**: one idempotent producer per Spark partition; a batch whose producing fails
raises, is not committed, and runs again, so a reader may see a record twice (the source
header tells the copies apart).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from streamplatform.config import ConfigError
from streamplatform.exceptions import StreamPlatformError
from streamplatform.runtime.faults import crash_point

PRODUCED_SCHEMA = "produced LONG, already_committed LONG"
COLUMNS = ("kind", "topic", "key", "value", "timestamp", "headers", "partition", "source_topic",
           "source_partition", "source_offset", "task")  # fmt: skip
SOURCE_HEADER = "__streamplatform.source"
_FLUSH_TIMEOUT_S = 120.0
_TRANSACTION_CALL_TIMEOUT_S = 60.0  # init, send offsets, commit, abort
# Producer settings the runtime sets itself under exactly_once_v2.
_RUNTIME_OWNED = ("transactional.id",)


_METADATA_TIMEOUT_S = 30  # how long a chosen topic's metadata may take


class KafkaOutputError(StreamPlatformError, RuntimeError):
    """Some records of a batch were not committed (or acknowledged) by the broker; the batch is
    not committed."""


@dataclass(frozen=True)
class Transactions:
    """What the tasks of batch ``batch_id`` need to commit their Kafka outputs exactly once.

    ``offsets``: per task, its consumed position on each Kafka partition it read, as
    ``(topic, partition, offset)``; ``marker``: the partition a task that read none commits
    its marker offset on (see the module docstring).
    """

    app: str
    batch_id: int
    offsets: Mapping[str, tuple[tuple[str, int, int], ...]]
    marker: tuple[str, int]

    def transactional_id(self, task: str) -> str:
        return f"{self.app}-{task}"

    def group_and_positions(self, task: str) -> tuple[str, list[tuple[str, int, int]]]:
        """The consumer group and the positions task ``task`` commits in its transaction."""
        positions = list(self.offsets.get(task, ()))
        if positions:
            return self.app, positions
        topic, partition = self.marker
        return f"{self.app}-task-{task}", [(topic, partition, self.batch_id + 1)]


def producer_for(settings: Mapping[str, Any], **fixed: Any) -> Any:
    """A producer from ``settings`` (``StreamsConfig.kafka_settings("producer")``: the
    connection and the ``producer.*`` settings, unprefixed) with ``fixed`` on top. A setting
    librdkafka does not take is a ConfigError naming it as given (``producer.<name>``)."""
    from confluent_kafka import KafkaException

    from streamplatform.kafka.clients import connection_settings, producer

    connection = connection_settings(settings)  # security in Java names: producer translates
    extra = {key: value for key, value in settings.items() if key not in connection}
    # linger.ms as Kafka Streams sets it for its producers (fewer, bigger requests).
    defaults = {"enable.idempotence": True, "linger.ms": 100}
    try:
        return producer(connection, **(defaults | extra | fixed))
    except KafkaException as error:
        raise ConfigError(
            f"producer.*: librdkafka refused a producer setting ({error.args[0].str()}); "
            f"given: {sorted('producer.' + key for key in extra)}"
        ) from error


def check_producer_settings(settings: Mapping[str, Any], exactly_once: bool) -> None:
    """Raise ConfigError, naming the setting, for producer settings that would break the
    guarantee (or that librdkafka does not know)."""
    if exactly_once:
        for key in _RUNTIME_OWNED:
            if key in settings:
                raise ConfigError(
                    f"producer.{key}: set by the runtime under exactly_once_v2 "
                    "(<application.id>-<task>, stable per task so that the broker fences "
                    "zombies); remove it"
                )
        if str(settings.get("enable.idempotence", "true")).lower() == "false":
            raise ConfigError(
                "producer.enable.idempotence=false: exactly_once_v2 needs idempotent, "
                "transactional producers; remove it or use processing.guarantee=at_least_once"
            )
    producer_for(settings).flush(0)  # librdkafka checks every setting here


def explain(error: Any, what: str, settings: Mapping[str, Any]) -> str:
    """A KafkaException's error from a transactional call, with what to do about it."""
    from confluent_kafka import KafkaError

    code = error.code()
    if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
        timeout = settings.get("transaction.timeout.ms", "60000 (librdkafka's default)")
        return (
            f"{what}: producer.transaction.timeout.ms={timeout} is above the broker's "
            f"transaction.max.timeout.ms: lower it ({error.str()})"
        )
    if code in (
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    ):
        return (
            f"{what}: the broker does not let this principal use transactions: "
            "processing.guarantee=exactly_once_v2 needs WRITE and DESCRIBE on the "
            "TransactionalId prefix <application.id>- and READ on the group "
            f"<application.id> ({error.str()})"
        )
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return not_authorized_to_write(what, []) + f" ({error.str()})"
    if code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
        return (
            f"{what}: fenced by a newer attempt with the same transactional.id (this one is a "
            f"zombie); its records are aborted, never visible to read_committed readers "
            f"({error.str()})"
        )
    if code in (KafkaError._TIMED_OUT, KafkaError.COORDINATOR_NOT_AVAILABLE):
        return (
            f"{what}: the broker's transaction coordinator did not answer within "
            f"{_TRANSACTION_CALL_TIMEOUT_S:g}s. processing.guarantee=exactly_once_v2 needs a "
            "broker that allows transactions (transaction.state.log.replication.factor and "
            "min.isr no higher than the brokers there are); at_least_once does not "
            f"({error.str()})"
        )
    return f"{what}: {error.str()}"


def not_authorized_to_write(what: str, topics: Sequence[str]) -> str:
    """The one line for a principal that may not write a batch's topics."""
    named = ", ".join(topics) or "a topic of the batch"
    return (f"{what}: not authorized to write to {named}: the principal needs the ACL "
            f"ALLOW WRITE (and DESCRIBE) on topic {named}; nothing of the batch is committed, "
            "and it runs again, whole, once the ACL is granted")  # fmt: skip


def _transactional_call(call: Callable[..., Any], what: str, settings: Mapping[str, Any],
                        *args: Any) -> Any:  # fmt: skip
    from confluent_kafka import KafkaException

    try:
        return call(*args, _TRANSACTION_CALL_TIMEOUT_S)
    except KafkaException as error:
        raise KafkaOutputError(explain(error.args[0], what, settings)) from error


class TaskOutput:
    """The Kafka records of one task (exactly_once_v2: in its transaction) or, at least once,
    of one Spark partition, for one batch.

    ``transactional_id``: produce in a transaction (``init_transactions`` first: it fences
    every older producer with that id and aborts what it left open). ``commit_to``: the
    consumer group and positions the transaction commits; if the group's committed offsets
    already reach them (``committed_if_any``: one of them), an earlier attempt committed these
    records: nothing is produced.
    """

    def __init__(
        self,
        settings: Mapping[str, Any],
        what: str,
        transactional_id: str | None = None,
        commit_to: tuple[str, list[tuple[str, int, int]]] | None = None,
        batch_id: int = -1,
        committed_if_any: bool = False,
    ) -> None:
        self.settings, self.what, self.batch_id = settings, what, batch_id
        self.failures: list[str] = []
        self._failed: dict[str, set[Any]] = {}  # topic -> the error codes of its failed records
        self.produced = 0
        self.already_committed = False
        self._last_source: Any = None
        self._nth = 0
        self._group: Any = None
        self._positions: list[tuple[str, int, int]] = []
        fixed: dict[str, Any] = {}
        if transactional_id is not None:
            fixed["transactional.id"] = transactional_id
        # Delivery reports of failed records only: a Python callback per record acknowledged
        # cost more than producing it (the transaction's commit, or flush, waits for all).
        fixed |= {"delivery.report.only.error": True, "on_delivery": self._delivered}
        self.out = producer_for(settings, **fixed)
        self._unpolled = 0
        self.transactional = transactional_id is not None
        if not self.transactional:
            return
        _transactional_call(self.out.init_transactions, what, settings)
        if commit_to is not None:
            group, self._positions = commit_to
            self._group = _group_client(settings, group)
            self.already_committed = _committed(self._group, self._positions, what,
                                                any_of=committed_if_any)  # fmt: skip
        if not self.already_committed:
            self.out.begin_transaction()

    def produce(self, row: tuple) -> None:
        """One row of ``COLUMNS`` (headers as Arrow gives them: dicts of key and value)."""
        headers = row[5]
        pairs = [(h["key"], h["value"]) for h in headers] if headers else None
        self.produce_record(row[0], row[1], row[2], row[3], row[4], pairs, row[6], row[7:10])

    def produce_record(
        self,
        kind: str,
        topic: str,
        key: Any,
        value: Any,
        timestamp: int | None,
        headers: list[tuple[str, Any]] | None,
        partition: int | None,
        source: tuple,
    ) -> None:
        """One record: ``kind`` "sink" or "dlq", ``headers`` as (name, value) pairs, ``source``
        the (topic, partition, offset) of the record its task was processing. At least once, a
        sink record gets the SOURCE_HEADER."""
        if self.already_committed:
            return
        pairs = headers or None
        if kind == "sink" and not self.transactional:
            pairs = self._stamped(headers, source)
        self._produce(topic, key, value, timestamp, pairs, partition)

    def produce_sink_records(self, records: Sequence[tuple], sources: Sequence[tuple]) -> None:
        """Sink records as a task makes them, (topic, key, value, timestamp, headers,
        partition) each, ``sources`` the source record behind each: ``produce_record`` for
        many. The hottest loop of a job into Kafka, so exactly_once_v2's (no header stamped)
        is written out here."""
        if self.already_committed:
            return
        if not self.transactional:
            for (topic, key, value, timestamp, headers, partition), source in zip(
                records, sources, strict=True
            ):
                self.produce_record("sink", topic, key, value, timestamp, headers or None,
                                    partition, source[:3])  # fmt: skip
            return
        produce, poll, unpolled = self.out.produce, self.out.poll, self._unpolled
        for topic, key, value, timestamp, headers, partition in records:
            partition = -1 if partition is None else partition
            timestamp = timestamp if timestamp is not None and timestamp > 0 else 0
            while True:
                try:
                    produce(topic, value, key, partition=partition, timestamp=timestamp,
                            headers=headers or None)  # fmt: skip
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    poll(0.1)
            unpolled += 1
            if unpolled >= 1_000:  # serve the error reports now and then, not per record
                poll(0)
                unpolled = 0
        self._unpolled = unpolled
        self.produced += len(records)

    def check_chosen_topic(self, topic: str) -> None:
        """A topic a topic name extractor chose must exist (as in Kafka Streams), else the
        task fails now, naming it: librdkafka would hold its records for the metadata
        propagation timeout (30 s) and then fail them with a less telling error."""
        metadata = self.out.list_topics(topic, timeout=_METADATA_TIMEOUT_S)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            raise KafkaOutputError(
                f"{self.what}: the topic name extractor chose topic {topic!r}, which does not "
                f"exist{'' if found is None else f' ({found.error.str()})'}: create it first"
            )

    def _stamped(self, headers: list[tuple[str, Any]] | None, source: tuple) -> list:
        """``headers`` with the SOURCE_HEADER of the ``source`` record's next output (a
        task's outputs of one source record come one after another)."""
        if source == self._last_source:
            self._nth += 1
        else:
            self._nth, self._last_source = 0, source
        stamp = f"{source[0]}/{source[1]}/{source[2]}/{self._nth}".encode()
        if not headers:
            return [(SOURCE_HEADER, stamp)]
        return [(k, v) for k, v in headers if k != SOURCE_HEADER] + [(SOURCE_HEADER, stamp)]

    def _produce(self, topic: str, key: Any, value: Any, timestamp: int | None,
                 headers: list | None, partition: int | None) -> None:  # fmt: skip
        # Keywords, no dict per record: -1 lets the producer partition by murmur2 of the key,
        # timestamp 0 stamps the record with the producer's clock.
        partition = -1 if partition is None else partition
        timestamp = timestamp if timestamp is not None and timestamp > 0 else 0
        while True:
            try:
                self.out.produce(topic, value, key, partition=partition, timestamp=timestamp,
                                 headers=headers)  # fmt: skip
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self.out.poll(0.1)
        self.produced += 1
        self._unpolled += 1
        if self._unpolled >= 1_000:  # serve the error reports now and then, not per record
            self.out.poll(0)
            self._unpolled = 0

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.failures.append(f"{message.topic()}[{message.partition()}]: {error}")
            self._failed.setdefault(message.topic(), set()).add(error.code())

    def commit(self, positions: list[tuple[str, int, int]] | None = None) -> int:
        """Wait for every record's acknowledgement; in a transaction, add the task's offsets
        (``positions`` when given: known only once the task is done) and commit it. Returns
        how many records were produced."""
        if self.already_committed:
            return 0
        if positions is not None:
            self._positions = positions
        unsent = self.out.flush(_FLUSH_TIMEOUT_S)
        if self.failures or unsent:
            raise KafkaOutputError(self._failed_message(unsent))
        if not self.transactional:
            return self.produced
        if self._group is not None:
            _transactional_call(self.out.send_offsets_to_transaction, self.what, self.settings,
                                *self._offsets_and_group())  # fmt: skip
        _transactional_call(self.out.commit_transaction, self.what, self.settings)
        crash_point("after_kafka_commit", self.batch_id)
        return self.produced

    def _offsets_and_group(self) -> tuple[list[Any], Any]:
        """What the transaction commits for the group: its positions and the group's
        metadata (``send_offsets_to_transaction``'s arguments)."""
        from confluent_kafka import TopicPartition

        assert self._group is not None
        offsets = [TopicPartition(t, p, o) for t, p, o in self._positions]
        return offsets, self._group.consumer_group_metadata()

    def _failed_message(self, unsent: int) -> str:
        """Why records failed, in one line: an authorization the principal lacks named with
        the topics and the ACL to grant; else each failure."""
        from confluent_kafka import KafkaError, KafkaException

        codes = set().union(*self._failed.values()) if self._failed else set()
        cause = None
        if self.transactional and self._group is not None and codes == {KafkaError._PURGE_QUEUE}:
            # The transaction failed and librdkafka dropped what was queued: the transaction's
            # own error says why. Adding the offsets asks for it and commits nothing.
            try:
                self.out.send_offsets_to_transaction(*self._offsets_and_group(),
                                                     _TRANSACTION_CALL_TIMEOUT_S)  # fmt: skip
            except KafkaException as error:
                cause = error.args[0]
        if KafkaError.TOPIC_AUTHORIZATION_FAILED in codes or (
            cause is not None and cause.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        ):
            return not_authorized_to_write(self.what, sorted(self._failed))
        if cause is not None:
            return explain(cause, self.what, self.settings)
        shown = "; ".join(self.failures[:5])
        return (f"{len(self.failures)} record(s) failed and {unsent} were not acknowledged "
                f"within {_FLUSH_TIMEOUT_S:g}s while producing {self.what}: {shown}")  # fmt: skip

    def abort(self) -> None:
        """Give up an open transaction (nothing of it becomes visible to read_committed)."""
        if self.transactional and not self.already_committed:
            from confluent_kafka import KafkaException

            # Fenced or gone: the broker aborts it anyway (a newer attempt, or the timeout).
            with contextlib.suppress(KafkaException):
                self.out.abort_transaction(_TRANSACTION_CALL_TIMEOUT_S)

    def close(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None


def _group_client(settings: Mapping[str, Any], group: str) -> Any:
    """A consumer of ``group`` that never joins it: for the group's metadata and stable
    committed offsets (read_committed makes the broker wait for pending transactional ones)."""
    from streamplatform.kafka.clients import connection_settings, consumer

    return consumer(connection_settings(settings), group, **{"isolation.level": "read_committed"})


def _committed(
    group: Any, positions: list[tuple[str, int, int]], what: str, any_of: bool = False
) -> bool:
    """Whether the group's committed offsets reach ``positions`` (``any_of``: one of them):
    an earlier attempt committed this task's transaction of this batch."""
    committed = committed_offsets(group, [(t, p) for t, p, _ in positions], what)
    reached = (committed.get((t, p), -1) >= offset for t, p, offset in positions)
    return any(reached) if any_of else all(reached)


def committed_offsets(
    group: Any, partitions: list[tuple[str, int]], what: str
) -> dict[tuple[str, int], int]:
    """The stable offsets the consumer ``group`` has committed on ``partitions`` (none where it
    has committed nothing)."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    moving = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
              KafkaError.COORDINATOR_NOT_AVAILABLE)  # fmt: skip
    deadline = time.monotonic() + _TRANSACTION_CALL_TIMEOUT_S
    while True:
        try:
            found = group.committed([TopicPartition(t, p) for t, p in partitions],
                                    _TRANSACTION_CALL_TIMEOUT_S)  # fmt: skip
            break
        except KafkaException as error:
            # The group's coordinator is moving or loading (a new group, a broker restart).
            if error.args[0].code() in moving and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise KafkaOutputError(f"{what}: reading the committed offsets: {error}") from error
    return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}


def producing(
    settings: Mapping[str, Any], transactions: Transactions | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator]:
    """A ``mapInArrow`` function producing rows of ``COLUMNS`` to Kafka; it yields one row with
    how many records it produced and how many tasks an earlier attempt had committed."""
    connection = dict(settings)

    def produce(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        produced, skipped = send(connection, batches, transactions, "the batch's Kafka output")
        yield pa.RecordBatch.from_pydict({"produced": [produced], "already_committed": [skipped]})

    return produce


def send(
    settings: Mapping[str, Any],
    batches: Iterable[pa.RecordBatch],
    transactions: Transactions | None,
    what: str,
) -> tuple[int, int]:
    """Produce the rows of ``batches`` (``COLUMNS``) and wait until the broker has them:
    acknowledged (at least once) or committed, each task's in its transaction. Returns how
    many records were produced and how many tasks were found committed already. Raises
    KafkaOutputError, naming ``what``, when some were not: the batch must then not be
    committed.

    A task's rows must come one after another (they do: a Spark partition of the batch's
    output holds whole tasks)."""
    produced = skipped = 0
    current: TaskOutput | None = None
    current_task: str | None = None
    done: set[str | None] = set()
    try:
        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in COLUMNS]
            for row in zip(*columns, strict=True):
                task = row[10] if transactions is not None else None
                if current is None or current_task != task:
                    if current is not None:
                        produced += current.commit()
                        current.close()
                        done.add(current_task)
                    if task in done:
                        raise RuntimeError(f"{what}: task {task}'s rows are not together")
                    current, current_task = _open(settings, task, transactions, what), task
                    skipped += current.already_committed
                current.produce(row)
        if current is not None:
            produced += current.commit()
    except BaseException:
        if current is not None:
            current.abort()
        raise
    finally:
        if current is not None:
            current.close()
    return produced, skipped


def _open(
    settings: Mapping[str, Any], task: str | None, transactions: Transactions | None, what: str
) -> TaskOutput:
    if transactions is None or task is None:
        return TaskOutput(settings, what)
    return TaskOutput(
        settings, f"{what} of task {task}", transactions.transactional_id(task),
        transactions.group_and_positions(task), transactions.batch_id,
    )  # fmt: skip


@dataclass(frozen=True)
class InTaskOutputs:
    """What a task that reads its own Kafka range needs to produce its Kafka outputs itself
    (the direct path, paths/direct.py): its Kafka sink records and DLQ records, right as it
    makes them, in one transaction per task and batch under exactly_once_v2 (``app`` set) that
    commits the task's consumed offset to the consumer group ``app``, as the cached path's
    producing does; idempotent and acknowledged at least once otherwise."""

    settings: Mapping[str, Any]
    topics: frozenset[str]  # the Kafka sinks (the DLQ topic's rows are told by their kind)
    app: str | None  # exactly_once_v2: the transactions' group and transactional.id prefix
    batch_id: int
    # The partition a task that reads no Kafka range commits its marker offset on.
    marker: tuple[str, int] | None = None
    # A topology whose extractors choose topics (KStream.to(extractor)): any topic but these
    # (the repartition topics and the Delta sinks) is a Kafka sink too. None: only `topics`.
    any_topic_but: frozenset[str] | None = None

    def is_sink(self, topic: str) -> bool:
        """Whether the task produces ``topic``'s records as a Kafka sink's."""
        if topic in self.topics:
            return True
        return self.any_topic_but is not None and topic not in self.any_topic_but

    def open(self, task: str, partition: int, ranges: Iterable[tuple[str, int, int]]) -> TaskOutput:
        """The task's output for the batch (``ranges``: (topic, start, end) of each topic it
        reads on ``partition``). Its transaction of this batch was committed by an earlier
        attempt when the group's offset is past the start of one of its ranges (only this
        batch's transaction moves one there before the batch commits; a task that stopped
        early may not have reached its other topics): then nothing is produced."""
        what = f"the Kafka outputs of task {task}"
        if self.app is None:
            return TaskOutput(self.settings, what)
        past = [(topic, partition, start + 1) for topic, start, end in ranges if end > start]
        if not past and self.marker is not None:  # a task after a repartition
            transactions = Transactions(self.app, self.batch_id, {}, self.marker)
            return TaskOutput(self.settings, what, f"{self.app}-{task}",
                              transactions.group_and_positions(task), self.batch_id)  # fmt: skip
        return TaskOutput(self.settings, what, f"{self.app}-{task}", (self.app, past),
                          self.batch_id, committed_if_any=True)  # fmt: skip


def send_before_failing(
    settings: Mapping[str, Any], task: str, rows: list[pa.RecordBatch], app: str | None, what: str
) -> None:
    """The DLQ records of a task that fails. At least once (``app`` None): produced and
    acknowledged. exactly_once_v2 (``app``): produced in the task's transaction, which is
    aborted as the task fails, as in Kafka Streams: read_committed readers never see them,
    read_uncommitted ones (and the task's error) do."""
    transactional_id = None if app is None else f"{app}-{task}"
    output = TaskOutput(settings, what, transactional_id)
    try:
        for batch in rows:
            columns = [batch.column(name).to_pylist() for name in COLUMNS]
            for row in zip(*columns, strict=True):
                output.produce(row)
        if app is None:
            output.commit()
            return
        unsent = output.out.flush(_FLUSH_TIMEOUT_S)
        if output.failures or unsent:
            raise KafkaOutputError(
                f"{what}: {unsent} record(s) not acknowledged, failures: {output.failures[:5]}"
            )
    finally:
        output.abort()
        output.close()
