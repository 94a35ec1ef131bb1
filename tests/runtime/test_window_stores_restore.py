"""Window, session and join stores are stores like the others: after the state directory is
wiped between two micro-batches, each task restores them from the changelog and the job goes
on as if nothing happened — each session's final count, and every order-payment pair, once
and as the test driver gives them."""

from __future__ import annotations

import json
import shutil
import uuid
from collections import Counter

import pytest

from streamplatform import EmitStrategy, SessionWindowedSerde, SessionWindows, StreamsBuilder
from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import PARTITIONS, job_config, make_views, read_topic, through_the_test_driver
from .test_stream_joins_on_spark import make_orders_and_payments, orders_with_payments_topology
from .test_stream_joins_on_spark import through_the_test_driver as joins_through_the_driver

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]  # ~45 s each


def sessions_topology(source: str, sink: str):
    """Views per user session (3 s of inactivity ends one, 2 s grace), final counts only."""
    b = StreamsBuilder()
    views = b.stream(source, Serdes.string(), Serdes.json())
    views.group_by_key().windowed_by(SessionWindows.of_inactivity_gap_and_grace(3_000, 2_000)
                                     ).emit_strategy(EmitStrategy.on_window_close()
                                                     ).count().to_stream().to(sink)  # fmt: skip
    return b.build()


def _run_wiping_state_after_the_first_batch(topology, config):
    first = StreamingJob(topology, config)
    done = first.run(max_batches=1)
    first.close()
    shutil.rmtree(config["state.dir"])
    rest = StreamingJob(topology, config)
    results = rest.run_until_caught_up()
    rest.close()
    assert len(done) == 1 and len(results) >= 2
    assert results[0].restored_records > 0  # the tasks of batch 1 restored their stores
    return results


def test_session_stores_restore_after_the_state_dir_is_wiped(spark, kafka_settings, tmp_path):
    app = f"sess-{uuid.uuid4().hex[:6]}"
    source, sink = f"{app}-views", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS), TopicSpec(sink, PARTITIONS)])
    sent = make_views(kafka_settings, source, 450)
    config = job_config(kafka_settings, tmp_path, app, source) | {
        "platform.max.records.per.batch": 50, "errors.dead.letter.queue.topic.name": None,
    }  # fmt: skip
    topology = sessions_topology(source, sink)
    _run_wiping_state_after_the_first_batch(topology, config)
    serde = SessionWindowedSerde(Serdes.string())
    got = [(serde.deserialize(r.key), Serdes.long().deserialize(r.value), r.timestamp)
           for r in read_topic(kafka_settings, sink)]  # fmt: skip
    expected = through_the_test_driver(topology, source, sink, sent, serde, Serdes.long())
    assert len(expected) > 20
    assert sorted(got, key=repr) == sorted(expected, key=repr)


def test_join_stores_restore_after_the_state_dir_is_wiped(spark, kafka_settings, tmp_path):
    app = f"sjr-{uuid.uuid4().hex[:6]}"
    orders, payments, sink = f"{app}-orders", f"{app}-payments", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(t, PARTITIONS) for t in (orders, payments, sink)])
    events = make_orders_and_payments(kafka_settings, orders, payments, 300)
    config = job_config(kafka_settings, tmp_path, app, orders) | {
        "platform.max.records.per.batch": 40, "errors.dead.letter.queue.topic.name": None,
    }  # fmt: skip
    topology = orders_with_payments_topology(orders, payments, sink)
    _run_wiping_state_after_the_first_batch(topology, config)
    got = Counter((r.key.decode(), json.dumps(json.loads(r.value)), r.timestamp)
                  for r in read_topic(kafka_settings, sink))  # fmt: skip
    assert got == Counter(joins_through_the_driver(topology, sink, events))
