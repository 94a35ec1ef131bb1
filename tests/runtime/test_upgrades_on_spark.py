"""An upgrade that adds an operator upstream of an aggregation, on Spark with a real broker:
refused when the aggregation is unnamed (its store would start empty), accepted per store by a
person, and harmless when it is named (the counts go on from where they were)."""

from __future__ import annotations

import uuid

import pytest

from streamplatform import StreamsBuilder
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime import delta_direct
from streamplatform.runtime.logs import CommitLog
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.runtime.upgrade import UpgradeRefused
from streamplatform.serdes import Serdes

from .support import job_config

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.broker]


def views_per_user(source: str, *, filtered: bool, name: str | None):
    """Views counted per user into the Delta sink ``counts``; ``filtered``: the upgrade, a
    filter added upstream of the count."""
    b = StreamsBuilder()
    views = b.stream(source, Serdes.string(), Serdes.string())
    if filtered:
        views = views.filter(lambda user, page: page != "spam")
    views.group_by_key().count(name=name).to_stream().to("counts")
    return b.build()


def produce(kafka_settings, topic: str, users: str) -> None:
    writer = producer(kafka_settings)
    for n, user in enumerate(users):
        writer.produce(topic, key=user, value=f"page-{n}", partition=0, timestamp=1_000 + n)
    assert writer.flush(60) == 0


def run(spark, topology, config) -> None:
    job = StreamingJob(topology, config, spark=spark, delta_sinks=["counts"])
    try:
        job.run_until_caught_up()
    finally:
        job.close()


def counts_of_batch(tmp_path, app: str, batch_id: int) -> dict[str, int]:
    """The counts the sink got in batch ``batch_id``, per user (a long serde's 8 bytes)."""
    rows = delta_direct.read(f"{tmp_path}/delta/{app}/counts", [("batch_id", "=", batch_id)])
    return {
        key.decode(): int.from_bytes(value, "big", signed=True)
        for key, value in zip(
            rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True
        )
    }


def test_an_upstream_operator_is_refused_for_an_unnamed_count_and_keeps_a_named_ones_state(
    spark, kafka_settings, topic_name, tmp_path
):
    source = topic_name
    create_topics(kafka_settings, [TopicSpec(source, 1), TopicSpec(f"{source}-dlq", 1)])
    unnamed_app, named_app = f"up-u-{uuid.uuid4().hex[:6]}", f"up-n-{uuid.uuid4().hex[:6]}"
    unnamed = job_config(kafka_settings, tmp_path, unnamed_app, source)
    named = job_config(kafka_settings, tmp_path, named_app, source)
    produce(kafka_settings, source, "aaba")
    run(spark, views_per_user(source, filtered=False, name=None), unnamed)
    run(spark, views_per_user(source, filtered=False, name="views"), named)
    assert counts_of_batch(tmp_path, unnamed_app, 0) == {"a": 3, "b": 1}
    assert counts_of_batch(tmp_path, named_app, 0) == {"a": 3, "b": 1}
    produce(kafka_settings, source, "ab")

    # Unnamed: the filter renumbers the count, whose store would start empty. Refused at
    # start, nothing committed, and the message names both stores.
    with pytest.raises(UpgradeRefused) as refused:
        run(spark, views_per_user(source, filtered=True, name=None), unnamed)
    assert ("store KSTREAM-COUNT-0000000001-STATE-STORE of the last commit is gone and "
            "KSTREAM-COUNT-0000000002-STATE-STORE is new") in str(refused.value)  # fmt: skip
    assert CommitLog(f"{tmp_path}/delta/{unnamed_app}/_commits", unnamed_app).last().batch_id == 0

    # A person accepts the loss store by store: the new store starts empty, as announced.
    accepted = unnamed | {
        "platform.upgrade.drop.stores": "KSTREAM-COUNT-0000000001-STATE-STORE",
        "platform.upgrade.allow.new.stores": "KSTREAM-COUNT-0000000002-STATE-STORE",
    }
    run(spark, views_per_user(source, filtered=True, name=None), accepted)
    assert counts_of_batch(tmp_path, unnamed_app, 1) == {"a": 1, "b": 1}

    # Named: the same upgrade keeps the store, and the counts go on.
    run(spark, views_per_user(source, filtered=True, name="views"), named)
    assert counts_of_batch(tmp_path, named_app, 1) == {"a": 4, "b": 2}
