"""Stream-stream joins through the test driver: the windows' rules, retention and the expiry
of old segments (Kafka Streams' own outputs for random inputs: tests/reference)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streamplatform import JoinWindows, StreamsBuilder, TopologyTestDriver
from streamplatform.serdes import Serdes


def test_join_windows_are_checked_and_may_be_asymmetric():
    windows = JoinWindows.of_time_difference_and_grace(timedelta(minutes=10), timedelta(minutes=1))
    assert (windows.before_ms, windows.after_ms, windows.grace_ms) == (600_000, 600_000, 60_000)
    assert windows.retention_ms == 1_260_000
    assert JoinWindows.of_time_difference_with_no_grace(5).before(0).after(7).size_ms == 7
    with pytest.raises(ValueError, match="must not be negative"):
        JoinWindows.of_time_difference_with_no_grace(-1)
    with pytest.raises(ValueError, match="grace must not be negative"):
        JoinWindows.of_time_difference_and_grace(5, -1)
    with pytest.raises(ValueError, match="must not be negative"):
        JoinWindows.of_time_difference_with_no_grace(5).before(-6)
    b = StreamsBuilder()
    with pytest.raises(TypeError, match="needs JoinWindows"):
        b.stream("a").join(b.stream("b"), lambda x, y: x)


def _join_within_30_seconds():
    b = StreamsBuilder()
    left = b.stream("left", Serdes.string(), Serdes.string())
    right = b.stream("right", Serdes.string(), Serdes.string())
    left.join(right, lambda x, y: f"{x}+{y}",
              JoinWindows.of_time_difference_with_no_grace(30_000)).to("out")  # fmt: skip
    topology = b.build()
    (left_store,) = [name for name in topology.stores if "JOINTHIS" in name]
    return topology, left_store


def test_records_past_the_retention_no_longer_join_and_their_segments_leave_the_store():
    """Retention = before + after + grace = 60 s, in segments of 60 s: once the left side has
    seen 10 minutes, its records of the first minute are gone from the store, and a late right
    record within 30 s of them joins nothing (Kafka Streams' window store hides them too)."""
    topology, left_store = _join_within_30_seconds()
    with TopologyTestDriver(topology, {"application.id": "expiry"}) as driver:
        left = driver.create_input_topic("left", Serdes.string(), Serdes.string())
        right = driver.create_input_topic("right", Serdes.string(), Serdes.string())
        left.pipe_input("a", "L0", timestamp=0)
        left.pipe_input("a", "L1", timestamp=1_000)
        right.pipe_input("a", "R0", timestamp=20_000)  # within 30 s of both: two pairs
        store = driver.get_state_store(left_store)
        assert any(key.startswith(b"w") for key, _ in store.all())
        left.pipe_input("b", "L2", timestamp=600_000)  # the first minute's segment expires
        assert [key for key, _ in store.all() if key.startswith(b"w")] == [
            b"w" + (600_000 // 60_000).to_bytes(8, "big") + b"b"]  # fmt: skip
        right.pipe_input("a", "R1", timestamp=25_000)  # late: its partners are gone
        right.pipe_input("b", "R2", timestamp=590_000)  # within 30 s of L2
        records = [(r.key, r.value, r.timestamp) for r in
                   driver.create_output_topic("out", Serdes.string(), Serdes.string())
                   .read_records_to_list()]  # fmt: skip
    assert records == [("a", "L0+R0", 20_000), ("a", "L1+R0", 20_000), ("b", "L2+R2", 600_000)]


def test_none_keys_and_values_are_dropped_and_counted():
    topology, _ = _join_within_30_seconds()
    with TopologyTestDriver(topology, {"application.id": "nulls"}) as driver:
        left = driver.create_input_topic("left", Serdes.string(), Serdes.string())
        left.pipe_input(None, "L0", timestamp=0)
        left.pipe_input("a", None, timestamp=1)
        assert driver.metrics()["dropped_records"] == 2
