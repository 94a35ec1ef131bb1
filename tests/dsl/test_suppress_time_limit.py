"""``KTable.suppress(Suppressed.until_time_limit(...))`` through the test driver: Kafka Streams'
own scenarios (SuppressScenarioTest, SuppressionIntegrationTest) with their inputs and
expected outputs unchanged, and what our buffer adds (it is a store: a restart keeps it).

As in Kafka Streams' scenario tests the count()'s record cache is off
(``statestore.cache.max.bytes`` 0) and the driver commits after every record."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streamplatform import (
    BufferConfig,
    StreamsBuilder,
    StreamsError,
    Suppressed,
    TimeWindows,
    TopologyTestDriver,
)
from streamplatform.serdes import Serdes

LONG_MAX = 2**63 - 1  # Kafka Streams' ofMillis(Long.MAX_VALUE): nothing expires by time
CONFIG = {"application.id": "suppress", "statestore.cache.max.bytes": 0}
INPUT = [("k1", "v1", 0), ("k1", "v2", 1), ("k2", "v1", 2)]
RAW = [("v1", 1, 0), ("v1", 0, 1), ("v2", 1, 1), ("v1", 1, 2)]


def _value_counts(suppressed):
    """Kafka Streams' scenario: a table of key -> value, counted by value, suppressed."""
    b = StreamsBuilder()
    counts = (
        b.table("input", Serdes.string(), Serdes.string())
        .group_by(lambda k, v: (v, k), Serdes.string(), Serdes.string())
        .count()
    )
    counts.suppress(suppressed).to_stream().to("output-suppressed", Serdes.string(), Serdes.long())
    counts.to_stream().to("output-raw", Serdes.string(), Serdes.long())
    return b.build()


def _drain(driver, topic, value_serde=None):
    out = driver.create_output_topic(topic, Serdes.string(), value_serde or Serdes.long())
    return [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]


def _pipe(driver, records, topic="input"):
    source = driver.create_input_topic(topic, Serdes.string(), Serdes.string())
    for key, value, timestamp in records:
        source.pipe_input(key, value, timestamp=timestamp)


def test_should_immediately_emit_events_with_zero_emit_after():
    """shouldImmediatelyEmitEventsWithZeroEmitAfter"""
    topology = _value_counts(Suppressed.until_time_limit(0, BufferConfig.unbounded()))
    with TopologyTestDriver(topology, CONFIG) as driver:
        _pipe(driver, INPUT)
        assert _drain(driver, "output-raw") == RAW
        assert _drain(driver, "output-suppressed") == RAW
        _pipe(driver, [("x", "x", 3)])
        assert _drain(driver, "output-raw") == [("x", 1, 3)]
        assert _drain(driver, "output-suppressed") == [("x", 1, 3)]
        _pipe(driver, [("x", "y", 4)])
        assert _drain(driver, "output-raw") == [("x", 0, 4), ("y", 1, 4)]
        assert _drain(driver, "output-suppressed") == [("x", 0, 4), ("y", 1, 4)]


def test_should_suppress_intermediate_events_with_time_limit():
    """shouldSuppressIntermediateEventsWithTimeLimit"""
    suppressed = Suppressed.until_time_limit(timedelta(milliseconds=2), BufferConfig.unbounded())
    with TopologyTestDriver(_value_counts(suppressed), CONFIG) as driver:
        _pipe(driver, INPUT)
        assert _drain(driver, "output-raw") == RAW
        assert _drain(driver, "output-suppressed") == [("v1", 1, 2)]
        _pipe(driver, [("tick", "tick", 3)])  # a dummy "tick" record to advance stream time
        assert _drain(driver, "output-raw") == [("tick", 1, 3)]
        assert _drain(driver, "output-suppressed") == [("v2", 1, 1)]  # stream time is now 3
        _pipe(driver, [("tick", "tock", 4)])
        assert _drain(driver, "output-raw") == [("tick", 0, 4), ("tock", 1, 4)]
        # tick is still buffered: first inserted at time 3, and it is only time 4 now
        assert _drain(driver, "output-suppressed") == []


def _emits_early(buffer_config):
    with TopologyTestDriver(_value_counts(Suppressed.until_time_limit(LONG_MAX, buffer_config)),
                            CONFIG) as driver:  # fmt: skip
        _pipe(driver, INPUT)
        assert _drain(driver, "output-raw") == RAW
        # consecutive updates to v1 get suppressed into only the latter; the last update
        # won't be evicted until another key comes along
        assert _drain(driver, "output-suppressed") == [("v1", 0, 1), ("v2", 1, 1)]
        _pipe(driver, [("x", "x", 3)])
        assert _drain(driver, "output-raw") == [("x", 1, 3)]
        # now the last update to v1, but not the update to x until it gets evicted
        assert _drain(driver, "output-suppressed") == [("v1", 1, 2)]


def test_should_suppress_intermediate_events_with_record_limit():
    """shouldSuppressIntermediateEventsWithRecordLimit"""
    _emits_early(BufferConfig.max_records(1).emit_early_when_full())


# Kafka Streams' limit is 200 bytes for entries "a little over 100 bytes" each: room for one
# entry, not two. Ours count 8 (buffer time) + the key ("v1": 2 bytes) + 8 (timestamp) + 4
# (no headers) + 1 + 8 (the Long count) = 31 bytes ("x": 30), two are 61: 40 keeps the same
# one-entry room, so the same records are forwarded.
ONE_ENTRY_BYTES = 40


def test_should_suppress_intermediate_events_with_bytes_limit():
    """shouldSuppressIntermediateEventsWithBytesLimit"""
    _emits_early(BufferConfig.max_bytes(ONE_ENTRY_BYTES).emit_early_when_full())


def test_max_records_and_max_bytes_emit_early_by_default():
    assert BufferConfig.max_records(1) == BufferConfig.max_records(1).emit_early_when_full()
    assert BufferConfig.max_bytes(5) == BufferConfig.max_bytes(5).emit_early_when_full()
    _emits_early(BufferConfig.max_records(1))


@pytest.mark.parametrize(
    "buffer_config",
    [
        BufferConfig.max_records(1).shut_down_when_full(),  # shouldShutdownWhenRecordConstraint...
        BufferConfig.max_bytes(ONE_ENTRY_BYTES).shut_down_when_full(),  # ...BytesConstraint...
    ],
    ids=["records", "bytes"],
)
def test_should_shut_down_when_the_constraint_is_violated(buffer_config):
    """shouldShutdownWhenRecordConstraintIsViolated, shouldShutdownWhenBytesConstraintIsViolated
    (SuppressionIntegrationTest): the task fails, naming the suppression."""
    suppressed = Suppressed.until_time_limit(LONG_MAX, buffer_config).with_name("capped")
    with TopologyTestDriver(_value_counts(suppressed), CONFIG) as driver:
        _pipe(driver, INPUT[:1])  # v1 buffered: one entry
        # k1 moves from v1 to v2: v1 is replaced in the buffer, v2 is a second entry
        with pytest.raises(StreamsError, match=r"^capped buffer exceeded its max capacity"):
            _pipe(driver, INPUT[1:] + [("x", "x", 3)])
        assert _drain(driver, "output-suppressed") == []


def _suppressed_table(suppressed, topic="input"):
    b = StreamsBuilder()
    table = b.table(topic, Serdes.string(), Serdes.string())
    table.suppress(suppressed).to_stream().to("output", Serdes.string(), Serdes.string())
    return b.build()


def test_should_work_before_group_by():
    """shouldWorkBeforeGroupBy: any table can be suppressed (here a source table)."""
    b = StreamsBuilder()
    (
        b.table("topic", Serdes.string(), Serdes.string())
        .suppress(Suppressed.until_time_limit(10, BufferConfig.unbounded()))
        .group_by(lambda k, v: (k, v), Serdes.string(), Serdes.string())
        .count()
        .to_stream()
        .to("output", Serdes.string(), Serdes.long())
    )
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        _pipe(driver, [("A", "a", 0), ("tick", "tick", 10)], topic="topic")
        assert _drain(driver, "output") == [("A", 1, 0)]


def test_a_key_keeps_its_first_buffer_time_and_forwards_its_latest_update_and_headers():
    topology = _suppressed_table(Suppressed.until_time_limit(10))
    with TopologyTestDriver(topology, CONFIG) as driver:
        source = driver.create_input_topic("input", Serdes.string(), Serdes.string())
        source.pipe_input("b", "b0", timestamp=0)
        source.pipe_input("a", "a0", timestamp=0)  # same buffer time: by the key's bytes
        source.pipe_input("c", "c0", timestamp=5)
        source.pipe_input("a", "a1", timestamp=9, headers=[("h", b"1"), ("n", None)])
        source.pipe_input("b", None, timestamp=8)  # a tombstone is buffered like any update
        out = driver.create_output_topic("output", Serdes.string(), Serdes.string())
        assert out.read_records_to_list() == []
        source.pipe_input("d", "d0", timestamp=10)  # expiry 0: "a" and "b", not restarted
        assert [tuple(r) for r in out.read_records_to_list()] == [
            ("a", "a1", 9, [("h", b"1"), ("n", None)]),
            ("b", None, 8, []),
        ]
        source.pipe_input("a", "a2", timestamp=11)  # forwarded: "a" is buffered anew, at 11
        source.pipe_input("e", "e0", timestamp=20)  # expiry 10: "c" at 5, "d" at 10
        assert _drain(driver, "output", Serdes.string()) == [("c", "c0", 5), ("d", "d0", 10)]
        source.pipe_input("e", "e1", timestamp=21)
        assert _drain(driver, "output", Serdes.string()) == [("a", "a2", 11)]


def test_a_restart_keeps_the_buffer_and_the_stream_time(tmp_path):
    """The buffer is the suppression's store and its stream time is kept with it: a driver
    reopened on the same state.dir goes on from both."""
    config = {**CONFIG, "state.dir": str(tmp_path)}
    topology = _suppressed_table(Suppressed.until_time_limit(10).with_name("limited"))
    with TopologyTestDriver(topology, config) as driver:
        _pipe(driver, [("a", "a0", 5), ("b", "b0", 14)])  # stream time 14: nothing expired
        assert _drain(driver, "output", Serdes.string()) == []
    with TopologyTestDriver(topology, config) as driver:
        # Stream time is still 14: "x" at 3 is past the time limit at once; "a" (5) is not.
        _pipe(driver, [("x", "x0", 3)])
        assert _drain(driver, "output", Serdes.string()) == [("x", "x0", 3)]
        _pipe(driver, [("a", "a1", 15)])  # expiry 5: "a", buffered before the restart
        assert _drain(driver, "output", Serdes.string()) == [("a", "a1", 15)]
    with TopologyTestDriver(topology, config) as driver:
        _pipe(driver, [("c", "c0", 30)])
        assert _drain(driver, "output", Serdes.string()) == [("b", "b0", 14)]


def test_emitted_early_entries_are_gone_after_a_restart(tmp_path):
    """What the bounds forwarded early is not in the buffer after a restart, and the buffer's
    size is kept: one more key still forwards the oldest."""
    config = {**CONFIG, "state.dir": str(tmp_path)}
    topology = _suppressed_table(Suppressed.until_time_limit(LONG_MAX, BufferConfig.max_records(2)))
    with TopologyTestDriver(topology, config) as driver:
        _pipe(driver, [("a", "a0", 0), ("b", "b0", 1), ("c", "c0", 2)])
        assert _drain(driver, "output", Serdes.string()) == [("a", "a0", 0)]
    with TopologyTestDriver(topology, config) as driver:
        _pipe(driver, [("d", "d0", 3)])
        assert _drain(driver, "output", Serdes.string()) == [("b", "b0", 1)]


def test_a_failed_task_keeps_the_buffer_of_its_last_commit(tmp_path):
    topology = _suppressed_table(
        Suppressed.until_time_limit(LONG_MAX, BufferConfig.max_records(1).shut_down_when_full())
    )
    with TopologyTestDriver(topology, CONFIG) as driver:
        _pipe(driver, [("a", "a0", 0)])
        with pytest.raises(StreamsError, match="exceeded its max capacity"):
            _pipe(driver, [("b", "b0", 1)])
        _pipe(driver, [("a", "a1", 2)])  # restarted from its commit: "a" alone, replaced
        assert _drain(driver, "output", Serdes.string()) == []


def test_a_windowed_table_can_be_suppressed_until_a_time_limit():
    b = StreamsBuilder()
    counts = (
        b.stream("input", Serdes.string(), Serdes.string())
        .group_by_key()
        .windowed_by(TimeWindows.of_size_and_grace(10, 100))
        .count()
    )
    counts.suppress(Suppressed.until_time_limit(5)).to_stream().to("output")
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        _pipe(driver, [("k", "v", 0), ("k", "v", 1), ("k", "v", 6)])
        out = driver.create_output_topic("output", counts.key_serde, Serdes.long())
        assert [(r.key.key, r.key.window.start, r.value, r.timestamp)
                for r in out.read_records_to_list()] == [("k", 0, 3, 6)]  # fmt: skip


def test_with_name_names_the_node_and_its_store():
    suppressed = Suppressed.until_time_limit(10, BufferConfig.max_bytes(100)).with_name("lim")
    assert suppressed.time_to_wait_ms == 10
    assert suppressed.buffer_config == BufferConfig.max_bytes(100)
    topology = _suppressed_table(suppressed)
    assert "lim" in topology.nodes
    assert "lim-STATE-STORE" in topology.stores


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="time_to_wait_for_more_updates"):
        Suppressed.until_time_limit(-1)
    with pytest.raises(TypeError, match="buffer_config"):
        Suppressed.until_time_limit(1, 5)
    with pytest.raises(ValueError, match="max_records"):
        BufferConfig.max_records(-1)
    with pytest.raises(TypeError, match="suppress"):
        StreamsBuilder().table("t", Serdes.string(), Serdes.string()).suppress("until")
    unbounded = BufferConfig.unbounded()
    assert unbounded.shut_down and unbounded == BufferConfig.max_records(3).with_no_bound()
