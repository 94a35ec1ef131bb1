"""Sliding windows and sessions on small hand-checked inputs (Kafka Streams' own outputs for
random inputs: tests/reference/test_windows_vs_kafka_streams.py)."""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder, Suppressed, TopologyTestDriver
from streamplatform.dsl import (
    EmitStrategy,
    SessionWindowedKStream,
    SessionWindowedSerde,
    SessionWindows,
    SlidingWindows,
    TimeWindowedKStream,
    Window,
    Windowed,
)
from streamplatform.serdes import Serdes


def _run(windows, records, emit=None, suppress=False, commit_every=1):
    """Counts of ``records`` (key, timestamp) per window: (key, window, count, timestamp)
    forwarded, and the dropped records."""
    b = StreamsBuilder()
    windowed = b.stream("in", Serdes.string(), Serdes.string()).group_by_key().windowed_by(windows)
    if emit is not None:
        windowed = windowed.emit_strategy(emit)
    counts = windowed.count()
    if suppress:
        counts = counts.suppress(Suppressed.until_window_closes())
    counts.to_stream().to("out")
    config = {"application.id": "windows"}
    with TopologyTestDriver(b.build(), config, commit_every=commit_every) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.string())
        for key, timestamp in records:
            source.pipe_input(key, "v", timestamp=timestamp)
        driver.commit()
        out = driver.create_output_topic("out", counts.key_serde, Serdes.long())
        got = [(r.key.key, r.key.window, r.value, r.timestamp) for r in out.read_records_to_list()]
        return got, driver.metrics()["dropped_records"]


# Gap 5 and grace 5: a session stays in the store until the latest session end passes its
# own by 10 (Kafka Streams' retention, gap + grace).
SESSIONS = SessionWindows.of_inactivity_gap_and_grace(5, 5)


def test_a_record_between_two_sessions_merges_them_forwarding_tombstones_for_both():
    got, dropped = _run(SESSIONS, [("u", 1), ("u", 10), ("u", 6)])
    assert got == [
        ("u", Window(1, 1), 1, 1),
        ("u", Window(10, 10), 1, 10),
        ("u", Window(1, 1), None, 1),  # the merged sessions go, each at its end...
        ("u", Window(10, 10), None, 10),
        ("u", Window(1, 10), 3, 10),  # ...then the merged one
    ]
    assert dropped == 0


def test_the_cache_forwards_no_tombstone_for_a_session_it_never_forwarded():
    """One commit at the end, as a micro-batch: the sessions merged before the commit were
    never forwarded, so only the merged one goes on."""
    got, _ = _run(SESSIONS, [("u", 1), ("u", 10), ("u", 6)], commit_every=None)
    assert got == [("u", Window(1, 10), 3, 10)]


def test_session_aggregate_merges_with_the_merger():
    b = StreamsBuilder()
    sessions = b.stream("in", Serdes.string(), Serdes.string()).group_by_key().windowed_by(SESSIONS)
    table = sessions.aggregate(lambda: "", lambda key, value, agg: agg + value,
                               lambda key, one, two: f"{one}+{two}", Serdes.string())  # fmt: skip
    table.to_stream().to("out")
    with TopologyTestDriver(b.build(), {"application.id": "s"}) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.string())
        for value, timestamp in [("a", 1), ("b", 10), ("c", 6)]:
            source.pipe_input("u", value, timestamp=timestamp)
        out = driver.create_output_topic("out", table.key_serde, Serdes.string())
        last = out.read_records_to_list()[-1]
    assert (last.key, last.value) == (Windowed("u", Window(1, 10)), "+a+bc")


def test_a_late_record_is_dropped_and_counted():
    """Closed: too late to be merged (it would not be anyway: the session [1, 1] is past
    the store's retention, as in Kafka Streams)."""
    # sessions: stream time 20, gap 5, no grace: a session ending before 15 has closed
    got, dropped = _run(SessionWindows.of_inactivity_gap_with_no_grace(5),
                        [("u", 1), ("u", 20), ("u", 3), (None, 21)])  # fmt: skip
    assert [window for _, window, _, _ in got] == [Window(1, 1), Window(20, 20)]
    assert dropped == 2  # the late record, and the one without a key
    # sliding windows: stream time 30, no grace: the window [5, 15] has closed
    got, dropped = _run(SlidingWindows.of_time_difference_with_no_grace(10), [("u", 20), ("u", 30),
                                                                             ("u", 5)])  # fmt: skip
    assert dropped == 1 and len(got) == 3  # [10, 20], then [21, 31] and [20, 30] at 30


def test_sliding_windows_make_left_windows_and_the_previous_records_right_window():
    got, _ = _run(SlidingWindows.of_time_difference_and_grace(10, 5), [("u", 20), ("u", 25)])
    assert got == [
        ("u", Window(10, 20), 1, 20),  # the first record's left window
        ("u", Window(21, 31), 1, 25),  # its right window, now that a record falls in it
        ("u", Window(15, 25), 2, 25),  # the second record's left window: both records
    ]


def test_final_results_on_window_close_and_suppressed_sessions():
    sessions = SessionWindows.of_inactivity_gap_with_no_grace(5)
    records = [("u", 1), ("u", 3), ("v", 9)]  # [1, 3] closes at 3 + 5: stream time 9 > 8
    final, _ = _run(sessions, records, emit=EmitStrategy.on_window_close())
    suppressed, _ = _run(sessions, records, suppress=True)
    assert final == suppressed == [("u", Window(1, 3), 2, 3)]


def test_windowed_by_gives_the_stream_of_its_windows():
    grouped = StreamsBuilder().stream("in", Serdes.string(), Serdes.string()).group_by_key()
    assert isinstance(grouped.windowed_by(SlidingWindows.of_time_difference_with_no_grace(5)),
                      TimeWindowedKStream)  # fmt: skip
    assert isinstance(grouped.windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(5)),
                      SessionWindowedKStream)  # fmt: skip
    with pytest.raises(TypeError, match="SessionWindows"):
        grouped.windowed_by(5)  # type: ignore[call-overload]


def test_session_keys_are_written_as_kafka_streams_writes_them():
    serde = SessionWindowedSerde(Serdes.string())
    key = Windowed("u1", Window(20, 35))
    data = serde.serialize(key)
    assert data == b"u1" + (35).to_bytes(8, "big") + (20).to_bytes(8, "big")  # end, then start
    assert serde.deserialize(data) == key
    assert serde.serialize(None) is None and serde.deserialize(None) is None


def test_windows_are_checked_when_built():
    with pytest.raises(ValueError, match="time_difference must not be negative"):
        SlidingWindows.of_time_difference_with_no_grace(-1)
    with pytest.raises(ValueError, match="grace must not be negative"):
        SlidingWindows.of_time_difference_and_grace(10, -1)
    with pytest.raises(ValueError, match="inactivity_gap must be positive"):
        SessionWindows.of_inactivity_gap_with_no_grace(0)
    with pytest.raises(ValueError, match="grace must not be negative"):
        SessionWindows.of_inactivity_gap_and_grace(5, -2)
    assert SlidingWindows.of_time_difference_with_no_grace(0).retention_ms == 0  # allowed
    assert SessionWindows.of_inactivity_gap_and_grace(5, 3).retention_ms == 8
