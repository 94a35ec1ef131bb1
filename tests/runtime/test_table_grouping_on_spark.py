"""Tables on Spark end as in the test driver: a table grouped by another key (users per region:
its repartition a shuffle inside the micro-batch, old values subtracted as members move
between groups, tombstones), and two tables joined (a task reading both topics)."""

from __future__ import annotations

import random
import uuid

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import PARTITIONS, job_config, read_topic

# several batches on the direct-stages path
pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]


def users_per_region_topology(users: str, sink: str):
    b = StreamsBuilder()
    b.table(users, Serdes.string(), Serdes.string()).group_by(
        lambda user, region: (region, user)).count().to_stream().to(sink)  # fmt: skip
    return b.build()


def test_users_per_region_end_as_in_the_test_driver(spark, kafka_settings, tmp_path):
    app = f"regions-{uuid.uuid4().hex[:6]}"
    users, sink = f"{app}-users", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(users, PARTITIONS), TopicSpec(sink, PARTITIONS)])
    rng = random.Random(4)
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    sent = []
    for n in range(400):  # 40 users moving between 5 regions, some leaving (tombstones)
        user = f"user{rng.randrange(40)}"
        region = None if rng.random() < 0.1 else f"region{rng.randrange(5)}"
        partition = int(user[4:]) % PARTITIONS
        value = None if region is None else region.encode()
        writer.produce(users, key=user, value=value, partition=partition, timestamp=1_000 + n)
        sent.append((partition, user, value, 1_000 + n))
    assert writer.flush(60) == 0
    config = job_config(kafka_settings, tmp_path, app, users) | {
        "platform.max.records.per.batch": 40, "errors.dead.letter.queue.topic.name": None,
    }  # fmt: skip
    topology = users_per_region_topology(users, sink)
    job = StreamingJob(topology, config, spark=spark)
    results = job.run_until_caught_up()
    job.close()
    assert len(results) >= 3 and {r.path for r in results} == {"direct-stages-driver"}

    final = {r.key.decode(): Serdes.long().deserialize(r.value)
             for r in read_topic(kafka_settings, sink)}  # fmt: skip
    with TopologyTestDriver(topology, {"application.id": "expected"}) as driver:
        topic = driver.create_input_topic(users, Serdes.string(), Serdes.bytes())
        for partition, user, value, timestamp in sent:
            topic.pipe_raw(user.encode(), value, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic(sink, Serdes.string(), Serdes.long())
        expected = dict(out.read_key_values_to_list())
    assert final == expected
    assert sum(expected.values()) <= 40 and len(expected) == 5


def profiles_with_balances_topology(profiles: str, balances: str, sink: str):
    b = StreamsBuilder()
    profile = b.table(profiles, Serdes.string(), Serdes.string())
    balance = b.table(balances, Serdes.string(), Serdes.string())
    profile.left_join(balance, lambda name, amount: f"{name}:{amount}").to_stream().to(sink)
    return b.build()


def test_a_table_table_join_ends_as_in_the_test_driver(spark, kafka_settings, tmp_path):
    """Two co-partitioned tables joined on Spark, a task reading both topics: each user's
    last joined value (or tombstone) as the test driver's."""
    app = f"tjoin-{uuid.uuid4().hex[:6]}"
    profiles, balances, sink = f"{app}-profiles", f"{app}-balances", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(t, PARTITIONS) for t in (profiles, balances, sink)])
    rng = random.Random(9)
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    sent = []
    for n in range(400):
        topic = rng.choice([profiles, balances])
        user = f"user{rng.randrange(30)}"
        value = None if rng.random() < 0.1 else f"v{n}".encode()
        partition = int(user[4:]) % PARTITIONS
        writer.produce(topic, key=user, value=value, partition=partition, timestamp=1_000 + n)
        sent.append((topic, partition, user, value, 1_000 + n))
    assert writer.flush(60) == 0
    config = job_config(kafka_settings, tmp_path, app, profiles) | {
        "platform.max.records.per.batch": 20, "errors.dead.letter.queue.topic.name": None,
    }  # fmt: skip
    topology = profiles_with_balances_topology(profiles, balances, sink)
    job = StreamingJob(topology, config, spark=spark)
    results = job.run_until_caught_up()
    job.close()
    assert len(results) >= 3

    final = {}
    for record in read_topic(kafka_settings, sink):  # per partition in offset order
        final[record.key.decode()] = None if record.value is None else record.value.decode()
    with TopologyTestDriver(topology, {"application.id": "expected"}) as driver:
        topics = {t: driver.create_input_topic(t, Serdes.string(), Serdes.bytes())
                  for t in (profiles, balances)}  # fmt: skip
        for topic, partition, user, value, timestamp in sent:
            topics[topic].pipe_raw(user.encode(), value, timestamp=timestamp, partition=partition)
        out = driver.create_output_topic(sink, Serdes.string(), Serdes.string())
        expected = dict(out.read_key_values_to_list())
    assert final == expected
    assert sum(value is None for value in expected.values()) > 0  # some ended deleted
