"""The task's own Kafka reader (runtime/kafka_input.py) on a real broker: committed records
only, ranges that end in aborted records or transaction markers end, a start offset gone from
the log fails."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime.kafka_input import (
    KafkaInputError,
    close_consumers,
    kept_consumers,
    read_range,
)

pytestmark = pytest.mark.broker


def _transaction(settings, topic, values, commit=True) -> None:
    writer = Producer({"bootstrap.servers": settings["bootstrap.servers"],
                       "transactional.id": f"{topic}-{uuid.uuid4().hex[:6]}"})  # fmt: skip
    writer.init_transactions(30)
    writer.begin_transaction()
    for value in values:
        writer.produce(topic, key=b"k", value=value, partition=0, headers=[("h", value)])
    writer.flush(30)
    if commit:
        writer.commit_transaction(30)
    else:
        writer.abort_transaction(30)


def _read(settings, topic, start, end):
    return [(record[2], record[5]) for chunk in read_range(settings, topic, 0, start, end)
            for record in chunk]  # fmt: skip


def test_committed_records_only_and_ranges_ending_in_markers_end(kafka_settings):
    topic = f"input-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(topic, 1)])
    _transaction(kafka_settings, topic, [b"a0", b"a1", b"a2"])  # offsets 0-2, marker 3
    _transaction(kafka_settings, topic, [b"x0", b"x1"], commit=False)  # 4-5 aborted, marker 6
    _transaction(kafka_settings, topic, [b"b0"])  # offset 7, marker 8

    assert _read(kafka_settings, topic, 0, 9) == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (7, b"b0")]
    assert _read(kafka_settings, topic, 1, 7) == [(1, b"a1"), (2, b"a2")]  # ends in 3..6
    assert _read(kafka_settings, topic, 3, 7) == []  # nothing committed in it: still ends
    assert _read(kafka_settings, topic, 8, 9) == []  # the last offset is a marker: EOF ends it
    ((record,),) = read_range(kafka_settings, topic, 0, 7, 8)
    assert record == (
        topic,
        0,
        7,
        record[3],
        b"k",
        b"b0",
        [("h", b"b0")],
    )  # ConsumedRecord's layout


def test_a_start_offset_gone_from_the_log_fails(kafka_settings):
    topic = f"input-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(topic, 1)])
    _transaction(kafka_settings, topic, [b"a0", b"a1", b"a2", b"a3"])
    admin = AdminClient({"bootstrap.servers": kafka_settings["bootstrap.servers"]})
    for future in admin.delete_records([KafkaTopicPartition(topic, 0, 2)]).values():
        future.result(30)
    with pytest.raises(KafkaInputError, match=rf"{topic}-0 \[0, 4\)"):
        _read(kafka_settings, topic, 0, 4)
    assert _read(kafka_settings, topic, 2, 5) == [(2, b"a2"), (3, b"a3")]


def test_reads_at_once_take_their_own_consumers_and_closing_spares_one_in_use(kafka_settings):
    """A kept consumer reads one range at a time: a second read while the first is in flight
    (the driver's tasks beside another job's) gets a consumer of its own."""
    topic = f"input-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(topic, 1)])
    _transaction(kafka_settings, topic, [b"a", b"b", b"c"])
    settings = {"bootstrap.servers": kafka_settings["bootstrap.servers"], "client.id": topic}
    first = read_range(settings, topic, 0, 0, 4)
    assert [record[5] for record in next(first)] == [b"a", b"b", b"c"]  # in flight
    assert _read(settings, topic, 1, 4) == [(1, b"b"), (2, b"c")]
    assert kept_consumers(settings) == 2
    close_consumers(settings)  # what a job's close does: the one in flight stays
    assert kept_consumers(settings) == 1
    first.close()
    close_consumers(settings)
    assert kept_consumers(settings) == 0


KEEP_A_READER_AND_EXIT = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s: %(message)s")
from streamplatform.runtime.kafka_input import has_records, kept_consumers
settings = {{"bootstrap.servers": {servers!r}}}
has_records(settings, {topic!r}, 0, 0, 1)
assert kept_consumers(settings) == 1
print("kept, exiting", flush=True)
"""


def test_a_consumer_kept_when_the_process_exits_is_closed_while_the_interpreter_works(
    kafka_settings,
):
    topic = f"input-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(topic, 1)])
    script = KEEP_A_READER_AND_EXIT.format(servers=kafka_settings["bootstrap.servers"],
                                           topic=topic)  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    exiting = done.stdout.index("kept, exiting")
    assert "Closing 1 kept Kafka consumer(s)" in done.stdout[exiting:], done.stdout
