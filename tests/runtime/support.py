"""Shared pieces of the runtime tests: the topology, the input, the expected output."""

from __future__ import annotations

import json
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

from streamplatform import (
    EmitStrategy,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    TopologyTestDriver,
)
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.serdes import Serdes
from streamplatform.state import Stores

PARTITIONS = 3
RECORDS = 240


def stream_batch(records: list[tuple[int, int, bytes, bytes]]):
    """(offset, timestamp, key, value) records of partition 0 as the Arrow batch Spark hands
    ``TaskBatchRunner.run_partition`` (runtime/rows.py's STREAM_COLUMNS)."""
    import pyarrow as pa

    from streamplatform.runtime.rows import STREAM_COLUMNS

    return pa.RecordBatch.from_arrays(
        [pa.array([0] * len(records), pa.int32()),
         pa.array([r[0] for r in records], pa.int64()),
         pa.array([r[1] for r in records], pa.int64()),
         pa.array([r[2] for r in records], pa.binary()),
         pa.array([r[3] for r in records], pa.binary()), pa.nulls(len(records), pa.string())],
        names=list(STREAM_COLUMNS),
    )  # fmt: skip


def dedup_topology(source: str, sink: str):
    b = StreamsBuilder()
    stream = b.stream(source, Serdes.string(), Serdes.json())
    stream.deduplicate_by_key_value(lambda k, v: v["id"], 60_000).to(sink)
    return b.build()


def amounts_topology(source: str, sink: str, strict: bool):
    """v1 (strict) rejects negative amounts (a processing error: the DLQ); v2 is the fix."""

    def check(tx: dict) -> dict:
        if strict and tx["amount"] < 0:
            raise ValueError(f"negative amount {tx['amount']}")
        return tx

    b = StreamsBuilder()
    b.stream(source, Serdes.string(), Serdes.json()).map_values(check).to(sink)
    return b.build()


def fixed_topology(source: str, sink: str):
    """The fixed code: a value that is not JSON becomes a record instead of an error."""

    class LenientJson:  # defined here so that Spark's workers get it by value, not by module
        def serialize(self, value):
            return json.dumps(value).encode()

        def deserialize(self, data):
            try:
                return json.loads(data)
            except ValueError:
                return {"id": f"raw-{data!r}"}

    b = StreamsBuilder()
    stream = b.stream(source, Serdes.string(), LenientJson())
    stream.deduplicate_by_key_value(lambda k, v: v["id"], 60_000).to(sink)
    return b.build()


def left_join_dedup_topology(transactions: str, rates: str, sink: str):
    """Transactions left-joined with a table of rates, then deduplicated by id: a task reads
    two topics, and its store writes come with the transactions."""
    b = StreamsBuilder()
    table = b.table(rates, Serdes.string(), Serdes.json())
    stream = b.stream(transactions, Serdes.string(), Serdes.json())
    joined = stream.left_join(table, lambda tx, rate: {**tx, "rate": rate and rate["rate"]})
    joined.deduplicate_by_key_value(lambda k, v: v["id"], 60_000).to(sink)
    return b.build()


def views_per_window_topology(source: str, sink: str, suppress: bool = False):
    """Views per user per 10 s window (grace 5 s), each window's final count only: an
    aggregation on window close (``suppress``: every update, then suppressed until the window
    closes), into ``sink``."""
    b = StreamsBuilder()
    views = b.stream(source, Serdes.string(), Serdes.json())
    windowed = views.group_by_key().windowed_by(TimeWindows.of_size_and_grace(10_000, 5_000))
    if suppress:
        counts = windowed.count().suppress(Suppressed.until_window_closes())
    else:
        counts = windowed.emit_strategy(EmitStrategy.on_window_close()).count()
    counts.to_stream().to(sink)
    return b.build()


def suppressed_views_per_window_topology(source: str, sink: str):
    return views_per_window_topology(source, sink, suppress=True)


def spend_per_user_topology(source: str, sink: str):
    """Spend per user over all time (a KTable), every update into ``sink``."""
    b = StreamsBuilder()
    views = b.stream(source, Serdes.string(), Serdes.json())
    views.group_by_key().aggregate(lambda: 0, lambda key, view, total: total + view["spend"],
                                   Serdes.long()).to_stream().to(sink)  # fmt: skip
    return b.build()


def views_per_spend_topology(source: str, sink: str):
    """Views counted per amount spent (group_by: a repartition, two sub-topologies)."""
    b = StreamsBuilder()
    views = b.stream(source, Serdes.string(), Serdes.json())
    per_spend = views.group_by(lambda user, view: str(view["spend"])).count()
    per_spend.to_stream().to(sink, value_serde=Serdes.long())
    return b.build()


def make_views(kafka_settings, source: str, count: int, seed: int = 7):
    """``count`` views of 6 users over 3 partitions (a user's views on one partition, by
    key), a second or so apart, some out of order and some later than the grace period."""
    import random

    rng = random.Random(seed)
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    sent, time = [], 1_000_000
    for n in range(count):
        time += rng.randint(0, 2_000)
        late = rng.random() < 0.05
        timestamp = time - (rng.randint(16_000, 40_000) if late else rng.randint(0, 3_000))
        user = f"u{rng.randint(0, 5)}"
        partition = int(user[1:]) % PARTITIONS
        value = json.dumps({"n": n, "spend": rng.randint(1, 9)}).encode()
        writer.produce(source, key=user, value=value, partition=partition, timestamp=timestamp)
        sent.append((partition, user, value, timestamp))
    assert writer.flush(120) == 0
    return sent


def through_the_test_driver(topology, source, sink, sent, key_serde, value_serde):
    """``sent`` (partition, key, value, timestamp) through the TopologyTestDriver, partition by
    partition as the job's tasks take them: the sink's (key, value, timestamp) records."""
    with TopologyTestDriver(topology, {"application.id": "expected"}) as driver:
        topic = driver.create_input_topic(source, Serdes.string(), Serdes.bytes())
        for partition, key, value, timestamp in sent:
            topic.pipe_raw(key.encode(), value, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic(sink, key_serde, value_serde)
        return [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]


def join_topology(transactions: str, rates: str, sink: str):
    """Transactions joined as-of their time with a versioned table of rates: a task reads
    two topics."""
    b = StreamsBuilder()
    table = b.table(
        rates,
        Serdes.string(),
        Serdes.json(),
        store=Stores.persistent_versioned_key_value_store("rates", timedelta(days=1)),
    )
    stream = b.stream(transactions, Serdes.string(), Serdes.json())
    stream.join(table, lambda tx, rate: {**tx, "rate": rate["rate"]}).to(sink)
    return b.build()  # fmt: skip


def make_input(
    kafka_settings, source: str, indices: range = range(RECORDS)
) -> list[tuple[int, str, bytes, int]]:
    """RECORDS records over 3 partitions: 20% duplicates, 3 poison values (or the part of
    them at ``indices``)."""
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    sent = []
    for index in indices:
        partition = index % PARTITIONS
        tx_id = f"tx-{index - 6 if index % 5 == 0 and index >= 6 else index}"
        value = json.dumps({"id": tx_id, "n": index}).encode()
        if index in (17, 101, 202):
            value = b"{poison"
        timestamp = 1_000_000 + index * 1_000
        writer.produce(source, key=f"k{partition}", value=value, partition=partition,
                       timestamp=timestamp, headers=[("i", str(index).encode())])  # fmt: skip
        sent.append((partition, f"k{partition}", value, timestamp))
    assert writer.flush(120) == 0, "the broker did not acknowledge every test record"
    return sent


def job_config(kafka_settings, tmp_path, app, source, **overrides):
    return {
        "application.id": app,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(tmp_path / app / "state"),
        "platform.delta.root": str(tmp_path / "delta"),
        "platform.max.records.per.batch": 30,  # 80 records per partition: batches 0, 1, 2
        "errors.dead.letter.queue.topic.name": f"{source}-dlq",
        "default.deserialization.exception.handler": "log_and_continue",
    } | overrides


def delta_rows(spark, path):
    rows = spark.read.format("delta").load(path).collect()
    return sorted((r.source_partition, r.source_offset, r.key, r.value) for r in rows)


def expected_with_the_test_driver(source, sent):
    """The same records through the TopologyTestDriver: what the Spark run must produce."""
    topology = dedup_topology(source, "out")
    config = {
        "application.id": "expected",
        "default.deserialization.exception.handler": "log_and_continue",
    }
    expected = []
    with TopologyTestDriver(topology, config) as driver:
        for partition in range(PARTITIONS):
            records = [s for s in sent if s[0] == partition]
            topic = driver.create_input_topic(source, Serdes.string(), Serdes.bytes())
            for _, key, value, timestamp in records:
                topic.pipe_raw(key.encode(), value, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic("out", Serdes.bytes(), Serdes.bytes())
        expected = out.read_records_to_list()
    return sorted((r.key, r.value) for r in expected)


# A child process running the dedup job to the end (the crash tests kill it on the way).
CRASHING_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from runtime.support import dedup_topology
    from streamplatform.runtime.microbatch import StreamingJob
    config = {config!r}
    StreamingJob(dedup_topology({source!r}, "deduplicated"), config,
                 delta_sinks=["deduplicated"]).run_until_caught_up()
    print("finished without crashing")
""")

# A driver process (the two-driver tests) running the dedup job to the end; exit 3 when its claim is refused.
DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from runtime.support import dedup_topology
    from streamplatform import JobClaimedError
    from streamplatform.runtime.microbatch import StreamingJob
    try:
        StreamingJob(dedup_topology({source!r}, "deduplicated"), {config!r},
                     delta_sinks=["deduplicated"]).run_until_caught_up()
    except JobClaimedError as error:
        print("REFUSED", error)
        sys.exit(3)
    print("FINISHED")
""")

# The same for the join job (support.join_topology) over {transactions} and {rates}.
JOIN_CRASHING_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from runtime.support import join_topology
    from streamplatform.runtime.microbatch import StreamingJob
    StreamingJob(join_topology({transactions!r}, {rates!r}, "enriched"), {config!r},
                 delta_sinks=["enriched"]).run_until_caught_up()
    print("finished without crashing")
""")

# A child process running any topology of this module to the end: ``builder`` names the
# function, ``args`` its arguments.
JOB_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from runtime import support
    from streamplatform.runtime.microbatch import StreamingJob
    topology = getattr(support, {builder!r})(*{args!r})
    StreamingJob(topology, {config!r}, delta_sinks={delta_sinks!r}).run_until_caught_up()
    print("finished without crashing")
""")


class Record(NamedTuple):
    """One record as a Kafka consumer sees it."""

    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: list


def read_topic(kafka_settings, topic: str, isolation: str = "read_committed") -> list[Record]:
    """Every record of ``topic`` a reader with ``isolation`` sees, to the end of each partition,
    in offset order per partition."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    from streamplatform.kafka import consumer, describe_topics

    (partitions,) = describe_topics(kafka_settings, [topic]).values()
    reader = consumer(kafka_settings, f"read-{topic}", **{"isolation.level": isolation,
                                                          "enable.partition.eof": True})  # fmt: skip
    records = []
    try:
        for partition in range(partitions):
            reader.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            for _ in range(240):  # at most 240 polls of 0.5 s per partition
                message = reader.poll(0.5)
                if message is None:
                    continue
                if message.error() is not None:
                    # The end, past transaction markers and aborted records too.
                    assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                    break
                records.append(Record(partition, message.key(), message.value(),
                                      message.timestamp()[1], message.headers() or []))  # fmt: skip
            else:
                raise AssertionError(f"{topic}[{partition}] not read to its end in 120 s")
    finally:
        reader.close()
    return records


def ticking_topology(
    source: str,
    sink: str,
    stream_interval_ms: int = 10_000,
    kill_marker: str | None = None,
    kill_at: tuple[int, int] | None = None,
):
    """Counts records per key in a store and, on a stream-time punctuator, sends the count of
    every key with the punctuation's time; a wall-clock punctuator (every millisecond) sends
    one ``wall`` record each time it fires. Pure of time except for the ``wall`` records.

    With ``kill_at`` (partition, offset), the process running that record SIGKILLs itself
    once (``kill_marker``: the file that says it did)."""
    import os
    import signal

    from streamplatform import Processor, PunctuationType
    from streamplatform.records import Record as StreamRecord

    class Ticker(Processor):  # defined here: Spark's workers get it by value
        def init(self, context):
            super().init(context)
            self.store = context.get_state_store("counts")  # reads its own writes
            context.schedule(stream_interval_ms, PunctuationType.STREAM_TIME, self.on_stream)
            context.schedule(1, PunctuationType.WALL_CLOCK_TIME, self.on_wall)

        def process(self, record):
            here = (self.context.partition, self.context.offset)
            if here == kill_at and not os.path.exists(kill_marker):
                open(kill_marker, "w").close()  # noqa: SIM115
                os.kill(os.getpid(), signal.SIGKILL)
            key = record.key.encode()
            self.store.put(key, b"%d" % (int(self.store.get(key) or b"0") + 1))

        def on_stream(self, now):
            counts = {k.decode(): int(v) for k, v in self.store.range(None, None)}
            value = json.dumps({"time": now, "counts": counts}, sort_keys=True)
            self.context.forward(StreamRecord("stream", value, now, []))

        def on_wall(self, now):
            self.context.forward(StreamRecord("wall", "{}", now, []))

    b = StreamsBuilder()
    b.add_state_store(Stores.persistent_key_value_store("counts"))
    b.stream(source, Serdes.string(), Serdes.json()).process(Ticker, "counts").to(
        sink, Serdes.string(), Serdes.string()
    )
    return b.build()


def join_input(kafka_settings, topic_name) -> tuple[str, str]:
    """Two co-partitioned topics: 8 rates and 10 transactions per partition, interleaved in
    event time (a rate every 10 s, a transaction every 7 s; timestamp 0 would be "now")."""
    transactions, rates = f"{topic_name}-tx", f"{topic_name}-rates"
    create_topics(kafka_settings, [TopicSpec(transactions, 2), TopicSpec(rates, 2),
                                   TopicSpec(f"{transactions}-dlq")])  # fmt: skip
    writer = producer(kafka_settings)
    for partition in range(2):
        for n in range(8):
            writer.produce(rates, key=f"c{partition}", value=json.dumps({"rate": n}),
                           partition=partition, timestamp=1 + n * 10_000)  # fmt: skip
        for n in range(10):
            value = b"{poison" if n == 4 else json.dumps({"id": f"{partition}-{n}"})
            writer.produce(transactions, key=f"c{partition}", value=value,
                           partition=partition, timestamp=5_000 + n * 7_000)  # fmt: skip
    assert writer.flush(60) == 0
    return transactions, rates


def join_tables(spark, root: Path | str) -> dict:
    """The join job's tables under ``root`` (a path or a URI), comparable across runs."""

    def table(name, *order):
        frame = spark.read.format("delta").load(f"{root}/{name}")
        return [tuple(r) for r in frame.drop("batch_id").orderBy(*order).collect()]

    coordinates = ("source_topic", "source_partition", "source_offset")
    return {
        "output": table("enriched", *coordinates),
        "dlq": table("_dlq", *coordinates),
        "versions": table("_versions", "task", "store", "key", "valid_from"),
    }


def running_pids(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (a zombie only waits to be reaped: it counts as gone).
    Asked of psutil here, independently of the library's own process bookkeeping."""
    import psutil

    left = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.add(pid)
        except psutil.NoSuchProcess:  # includes a zombie that may not be asked
            continue
        except psutil.AccessDenied:
            left.add(pid)
    return left


def wait_for(what: str, condition, log: Path, timeout_s: float = 240) -> None:
    """Wait until ``condition()``; after ``timeout_s``, fail with the end of the driver's
    ``log``."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}; the driver said:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
