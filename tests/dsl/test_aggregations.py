"""Grouping, aggregations, windows, tables and event time from the payload, through the test
driver (Kafka Streams' own outputs for the same inputs: tests/reference)."""

from __future__ import annotations

import json

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.dsl import EmitStrategy, TimeWindowedSerde, TimeWindows, Window, Windowed
from streamplatform.serdes import Serdes

DLQ = "agg-dlq"


def _views_per_user_per_window(extractor=None, emit=None):
    """The tutorial's job: views per user per 10 ms window, event time from the payload."""
    b = StreamsBuilder()
    views = b.stream("views", Serdes.string(), Serdes.json(), timestamp_extractor=extractor)
    windowed = views.group_by_key().windowed_by(TimeWindows.of_size_and_grace(10, 5))
    if emit is not None:
        windowed = windowed.emit_strategy(emit)
    counts = windowed.count()
    counts.to_stream().to("counts")
    return b.build(), counts


def _payload_time(record, partition_time):
    return record.value["at"]


def test_event_time_comes_from_the_payload_and_a_bad_one_goes_to_the_dlq():
    topology, counts = _views_per_user_per_window(_payload_time)
    config = {"application.id": "agg", "errors.dead.letter.queue.topic.name": DLQ,
              "default.deserialization.exception.handler": "log_and_continue"}  # fmt: skip
    with TopologyTestDriver(topology, config) as driver:
        views = driver.create_input_topic("views", Serdes.string(), Serdes.json())
        views.pipe_input("u1", {"at": 3}, timestamp=1_000_000)  # Kafka's time is ignored
        views.pipe_input("u1", {"at": -1}, timestamp=1_000_001)  # negative: to the DLQ
        views.pipe_input("u1", {"at": 12}, timestamp=5)
        out = driver.create_output_topic("counts", counts.key_serde, Serdes.long())
        records = out.read_records_to_list()
        dlq = driver.create_output_topic(DLQ, Serdes.bytes(), Serdes.bytes()).read_records_to_list()
    assert [(r.key, r.value, r.timestamp) for r in records] == [
        (Windowed("u1", Window(0, 10)), 1, 3),
        (Windowed("u1", Window(10, 20)), 1, 12),
    ]
    assert len(dlq) == 1 and json.loads(dlq[0].value) == {"at": -1}
    message = dict(dlq[0].headers)["__streams.errors.message"]
    assert b"an event time must be an int >= 0" in message


class PayloadTime:  # Kafka Streams' interface: a class with extract()
    def extract(self, record, partition_time):
        return record.value["at"]


def test_default_timestamp_extractor_is_an_import_path_checked_at_start():
    topology, counts = _views_per_user_per_window()
    path = f"{__name__}.PayloadTime"
    with TopologyTestDriver(topology, {"application.id": "agg",
                                       "default.timestamp.extractor": path}) as driver:  # fmt: skip
        driver.create_input_topic("views", Serdes.string(), Serdes.json()).pipe_input(
            "u1", {"at": 25}, timestamp=3
        )
        out = driver.create_output_topic("counts", counts.key_serde, Serdes.long())
        assert [r.key for r in out.read_records_to_list()] == [Windowed("u1", Window(20, 30))]
    with pytest.raises(ConfigError, match="default.timestamp.extractor"):
        StreamsConfig({"application.id": "agg", "default.timestamp.extractor": "no.such:thing"})


def test_a_record_for_a_closed_window_is_dropped_and_counted():
    topology, counts = _views_per_user_per_window()
    with TopologyTestDriver(topology, {"application.id": "agg"}) as driver:
        views = driver.create_input_topic("views", Serdes.string(), Serdes.json())
        for timestamp in (1, 30, 9, 26):  # 9: window [0, 10) closed at 15; 26: still open
            views.pipe_input("u1", {}, timestamp=timestamp)
        out = driver.create_output_topic("counts", counts.key_serde, Serdes.long())
        windows = [(r.key.window.start, r.value) for r in out.read_records_to_list()]
        assert windows == [(0, 1), (30, 1), (20, 1)]
        assert driver.metrics()["dropped_records"] == 1


def test_on_window_close_forwards_each_windows_final_result_once():
    topology, counts = _views_per_user_per_window(emit=EmitStrategy.on_window_close())
    with TopologyTestDriver(topology, {"application.id": "agg"}) as driver:
        views = driver.create_input_topic("views", Serdes.string(), Serdes.json())
        for user, timestamp in [("u1", 1), ("u2", 2), ("u1", 4), ("u1", 13), ("u2", 14)]:
            views.pipe_input(user, {}, timestamp=timestamp)
        out = driver.create_output_topic("counts", counts.key_serde, Serdes.long())
        assert out.read_records_to_list() == []  # stream time 14: [0, 10) closes at 15...
        views.pipe_input("u1", {}, timestamp=40)  # ...and [10, 20) at 25
        got = [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]
    assert got == [
        (Windowed("u1", Window(0, 10)), 2, 4),
        (Windowed("u2", Window(0, 10)), 1, 2),
        (Windowed("u1", Window(10, 20)), 1, 13),
        (Windowed("u2", Window(10, 20)), 1, 14),
    ]


def test_windowed_keys_are_written_as_kafka_streams_writes_them():
    serde = TimeWindowedSerde(Serdes.string(), 10)
    key = Windowed("u1", Window(20, 30))
    assert serde.serialize(key) == b"u1" + (20).to_bytes(8, "big")
    assert serde.deserialize(serde.serialize(key)) == key


def test_tables_filter_to_tombstones_and_map_values_keeps_them():
    b = StreamsBuilder()
    totals = (
        b.stream("spend", Serdes.string(), Serdes.long())
        .group_by_key()
        .reduce(lambda total, amount: total + amount)
    )
    totals.filter(lambda key, total: total < 100).map_values(str, Serdes.string()).to_stream().to(
        "small", value_serde=Serdes.string()
    )
    with TopologyTestDriver(b.build(), {"application.id": "agg"}) as driver:
        spend = driver.create_input_topic("spend", Serdes.string(), Serdes.long())
        for account, amount in [("a", 40), ("b", 10), ("a", 70), ("b", 5)]:
            spend.pipe_input(account, amount)
        out = driver.create_output_topic("small", Serdes.string(), Serdes.string())
        assert out.read_key_values_to_list() == [("a", "40"), ("b", "10"), ("a", None),
                                                 ("b", "15")]  # fmt: skip


def test_group_by_rekeys_through_a_repartition_and_drops_none_keys():
    b = StreamsBuilder()
    orders = b.stream("orders", Serdes.string(), Serdes.json())
    per_country = orders.group_by(lambda key, order: order.get("country")).count()
    per_country.to_stream().to("per-country", value_serde=Serdes.long())
    topology = b.build()
    assert len(topology.subtopologies) == 2  # the repartition
    with TopologyTestDriver(topology, {"application.id": "agg"}) as driver:
        orders_in = driver.create_input_topic("orders", Serdes.string(), Serdes.json())
        for country in ["fr", "de", None, "fr"]:
            orders_in.pipe_input("o", {"country": country})
        out = driver.create_output_topic("per-country", Serdes.string(), Serdes.long())
        assert out.read_key_values_to_list() == [("fr", 1), ("de", 1), ("fr", 2)]
        assert driver.metrics()["dropped_records"] == 1


def test_a_derived_table_cannot_be_joined():
    b = StreamsBuilder()
    table = b.table("rates", Serdes.string(), Serdes.json()).filter(lambda k, v: True)
    with pytest.raises(ValueError, match="derived"):
        b.stream("tx", Serdes.string(), Serdes.json()).join(table, lambda tx, rate: tx)


def test_windows_are_checked_when_built():
    with pytest.raises(ValueError, match="advance"):
        TimeWindows.of_size_with_no_grace(10).advance_by(11)
    with pytest.raises(ValueError, match="size"):
        TimeWindows.of_size_and_grace(0, 5)
    assert [w.start for w in TimeWindows.of_size_with_no_grace(10).advance_by(5).windows_for(12)] \
        == [5, 10]  # fmt: skip


def test_a_reopened_task_keeps_its_windows_closed(tmp_path):
    """The aggregation's stream time is committed with its store: after a restart, a record
    for a window that had closed is still too late."""
    config = {"application.id": "agg", "state.dir": str(tmp_path)}
    topology, counts = _views_per_user_per_window()
    with TopologyTestDriver(topology, config) as driver:
        views = driver.create_input_topic("views", Serdes.string(), Serdes.json())
        views.pipe_input("u1", {}, timestamp=1)
        views.pipe_input("u1", {}, timestamp=30)  # [0, 10) closes at 15
    with TopologyTestDriver(topology, config) as driver:
        driver.create_input_topic("views", Serdes.string(), Serdes.json()).pipe_input(
            "u1", {}, timestamp=9
        )
        out = driver.create_output_topic("counts", counts.key_serde, Serdes.long())
        assert out.read_records_to_list() == []
        assert driver.metrics()["dropped_records"] == 1


def test_only_a_windowed_table_can_be_suppressed_until_its_windows_close():
    from streamplatform import Suppressed

    b = StreamsBuilder()
    totals = b.stream("spend", Serdes.string(), Serdes.long()).group_by_key().count()
    with pytest.raises(ValueError, match="windowed aggregation"):
        totals.suppress(Suppressed.until_window_closes())


def test_the_record_cache_counts_what_its_entries_take_in_memory(tmp_path):
    """statestore.cache.max.bytes bounds the cache as Python holds it: for a count() the
    cache's own count is within 25% of what tracemalloc sees its entries take."""
    import tracemalloc

    from streamplatform.runtime.task import Task

    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.string()).group_by_key().count()
    topology = b.build()
    config = StreamsConfig({"application.id": "cache", "statestore.cache.max.bytes": 2**30})
    task = Task(topology, topology.subtopologies[0], 0, config, tmp_path, lambda topic: 1)
    try:
        (cache,) = [p.cache for p in task.processors.values() if hasattr(p, "cache")]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        # Made while traced: on Spark each source record is decoded from its batch, and the
        # entry its update is in keeps it.
        task.process_all([("in", 0, n, n, b"user-%010d" % n, b"v", ()) for n in range(20_000)])
        traced = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert len(cache.entries) == 20_000
        assert 0.75 * traced <= cache.bytes <= 1.25 * traced
    finally:
        task.close()
