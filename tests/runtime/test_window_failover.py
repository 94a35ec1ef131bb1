"""A windowed count on window close when an instance is lost (KIP-708 standbys): the task
promoted to its warm standby goes on from the replayed windows, and every window's final
count reaches Kafka once — none re-emitted, none lost — as the test driver gives them."""

from __future__ import annotations

import uuid

import pytest

from streamplatform import TimeWindowedSerde
from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.placement import plan_standbys
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import (
    PARTITIONS,
    job_config,
    make_views,
    read_topic,
    through_the_test_driver,
    views_per_window_topology,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]  # ~1 min

INSTANCES = {"i0": {"zone": "a"}, "i1": {"zone": "b"}, "i2": {"zone": "c"}}
ACTIVE = {"0_0": "i0", "0_1": "i1", "0_2": "i2"}
WINDOWED = TimeWindowedSerde(Serdes.string(), 10_000)


@pytest.mark.parametrize("standbys", [1, 0])
def test_each_windows_final_count_once_after_an_instance_is_lost(
    spark, kafka_settings, tmp_path, standbys
):
    app = f"winfail-{standbys}-{uuid.uuid4().hex[:4]}"
    source, sink = f"{app}-views", f"{app}-out"
    create_topics(kafka_settings, [TopicSpec(source, PARTITIONS), TopicSpec(sink, PARTITIONS)])
    sent = make_views(kafka_settings, source, 450)
    config = job_config(kafka_settings, tmp_path, app, source) | {
        "platform.max.records.per.batch": 30, "errors.dead.letter.queue.topic.name": None,
    }  # fmt: skip
    topology = views_per_window_topology(source, sink)
    job = StreamingJob(topology, config, spark=spark,
                       placement=plan_standbys(INSTANCES, ACTIVE, standbys, ["zone"]))  # fmt: skip
    job.run(max_batches=2)  # standbys replay each batch after its commit
    job.keep_standbys_warm = False
    job.run(max_batches=1)  # batch 2 commits, and i0 is lost before its standby sees it
    moved = job.fail_instance("i0")
    after = job.run_until_caught_up()
    job.close()
    assert moved["0_0"][1] is (standbys == 1)  # promoted to its warm standby, or moved cold
    assert after[0].restored_records > 0

    got = [(WINDOWED.deserialize(r.key), Serdes.long().deserialize(r.value), r.timestamp)
           for r in read_topic(kafka_settings, sink)]  # fmt: skip
    expected = through_the_test_driver(topology, source, sink, sent, WINDOWED, Serdes.long())
    assert len(expected) > 20
    assert len({key for key, _, _ in got}) == len(got)  # no window's count re-emitted
    assert sorted(got, key=repr) == sorted(expected, key=repr)
