"""Kafka Streams itself is the reference for sliding windows and sessions: the same seeded
random input (out-of-order and late records, None keys and values) through its
TopologyTestDriver (WindowReference.java, its record cache off) and through ours must give the
same output records — keys, windows, values, timestamps, tombstones of merged sessions — in
the same order, for updates, final results on window close and suppressed results.

Ours runs with the cache off and no commit until the end (a Spark micro-batch without the
cache): exactly Kafka Streams' output. With the cache on and a commit after every record (as
Kafka Streams' driver), the cache keeps the last update of each window per record (a record
can update a window twice: a sliding window that is both the previous record's right window
and this one's left; a session deleted and written again when a record falls inside it), and
drops the tombstone of a window it never forwarded (``cached``).

(Kafka Streams' own cache on is not the reference: its cached windows stay visible past the
store's retention, as long as the cache holds them, so what it computes depends on the cache's
size. Ours sees the same windows with the cache on or off: those Kafka Streams sees without.)
"""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder
from streamplatform.dsl import EmitStrategy, SessionWindows, SlidingWindows, Suppressed
from streamplatform.serdes import Serdes

from .kafka_streams import run_reference
from .test_aggregations_vs_kafka_streams import (
    NULL,
    SMALL,
    _text,
    random_input,
    through_our_driver,
)

MODES = [
    "sliding_count",
    "sliding_reduce",
    "sliding_aggregate",
    "sliding_suppress",
    "sliding_final",
    "session_count",
    "session_reduce",
    "session_aggregate",
    "session_suppress",
    "session_final",
]
SLIDING = SlidingWindows.of_time_difference_and_grace(10, 5)
SESSIONS = SessionWindows.of_inactivity_gap_and_grace(5, 3)


Output = list[tuple[str, str, int]]


def kafka_streams(mode: str, records, tmp_path) -> list[Output]:
    """``records`` (key, value, timestamp) through Kafka Streams' driver: what each made on
    topic "out"."""
    lines = "".join(f"{_text(k)}\t{_text(v)}\t{t}\n" for k, v, t in records)
    made: list[Output] = [[]]
    for line in run_reference("WindowReference.java", mode, lines, tmp_path / "ks"):
        if line == "--":
            made.append([])
            continue
        key, value, timestamp = line.split("\t")
        made[-1].append((key, value, int(timestamp)))
    return made[:-1]


def flat(made: list[Output]) -> Output:
    return [update for updates in made for update in updates]


def cached(made: list[Output]) -> Output:
    """What the record cache, flushed after every record, makes of the updates each record
    ``made``: the last update of each window, in the order of those last updates; a
    tombstone of a window whose last update forwarded was none (or a tombstone) goes nowhere.
    """
    out: Output = []
    live: set[str] = set()
    for updates in made:
        last: dict[str, tuple[str, str, int]] = {}
        for update in updates:
            last.pop(update[0], None)
            last[update[0]] = update
        for window, update in last.items():
            if update[1] != NULL:
                live.add(window)
            elif window in live:
                live.discard(window)
            else:
                continue
            out.append(update)
    return out


def _sum(total: str, value: str | None) -> str:
    """As WindowReference.sum: a None value adds nothing."""
    return total if value is None else str(int(total) + int(value))


def _appended(key, value, aggregate: str) -> str:
    return f"{aggregate},{'null' if value is None else value}"


def _topology(mode: str):
    b = StreamsBuilder()
    by_key = b.stream("in", Serdes.string(), Serdes.string()).group_by_key()
    kind, windowed_kind = mode.split("_", 1)[0], mode.split("_", 1)[1]
    windowed = by_key.windowed_by(SLIDING if kind == "sliding" else SESSIONS)
    if windowed_kind == "final":
        windowed = windowed.emit_strategy(EmitStrategy.on_window_close())
    if windowed_kind == "reduce":
        table = windowed.reduce(_sum)
    elif windowed_kind == "aggregate" and kind == "sliding":
        table = windowed.aggregate(lambda: "", _appended, Serdes.string())
    elif windowed_kind == "aggregate":
        table = windowed.aggregate(lambda: "", _appended, lambda key, one, two: f"{one}|{two}",
                                   Serdes.string())  # fmt: skip
    else:
        table = windowed.count()
        if windowed_kind == "suppress":
            table = table.suppress(Suppressed.until_window_closes())
        table = table.map_values(_text, Serdes.string())
    table.to_stream().to("out")
    return b.build(), table.key_serde, table.value_serde


def ours(mode: str, records, commit_every, cache_bytes=None) -> list[tuple[str, str, int]]:
    return through_our_driver(_topology(mode), records, commit_every, cache_bytes)


@pytest.mark.slow  # the random inputs of the first seed run in `make test`
@pytest.mark.parametrize("mode", MODES)
def test_a_small_input_aggregates_as_in_kafka_streams(tmp_path, mode):
    made = kafka_streams(mode, SMALL, tmp_path)
    assert ours(mode, SMALL, commit_every=None, cache_bytes=0) == flat(made)
    assert ours(mode, SMALL, commit_every=1) == cached(made)


@pytest.mark.parametrize("mode", MODES)
# The first seed in `make test`; the others in the slow tier (each mode is a JVM run).
@pytest.mark.parametrize(
    "seed", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
)
def test_random_input_with_late_records_aggregates_as_in_kafka_streams(tmp_path, mode, seed):
    records = random_input(seed)
    made = kafka_streams(mode, records, tmp_path)
    assert flat(made), "the reference forwarded nothing: the input does not exercise the mode"
    assert ours(mode, records, commit_every=None, cache_bytes=0) == flat(made)  # no cache
    assert ours(mode, records, commit_every=1) == cached(made)  # a commit per record
