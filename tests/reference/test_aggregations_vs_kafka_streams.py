"""Kafka Streams itself is the reference for grouping, aggregations and windows: the same
seeded random input (out-of-order and late records, None keys and values) through its
TopologyTestDriver (AggregationReference.java, run by the JDK as a single-file program on the
jars of ``.jvm/streams/``) and through ours must give the same output records — keys, windows,
values and timestamps — in the same order.

Kafka Streams runs with its record cache off (statestore.cache.max.bytes=0) and its driver
commits after every record, so it forwards every update. Ours runs both ways that must agree
with that: the cache on with a commit after every record (as Kafka Streams' driver), and the
cache off with no commit until the end (as a Spark micro-batch without the cache). The cache
with one commit at the end, what a micro-batch does by default, must forward exactly each
key's last update."""

from __future__ import annotations

import random

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.dsl import EmitStrategy, Suppressed, TimeWindows, Windowed
from streamplatform.serdes import Serdes

from .kafka_streams import run_reference

NULL = "\\N"
MODES = [
    "count",
    "reduce",
    "aggregate",
    "group_by",
    "tumbling",
    "hopping",
    "tumbling_final",
    "suppress",
]
# Kafka Streams 4.4.0's driver forwards nothing for emitStrategy(onWindowClose()) in this
# harness (cache on or off, wall clock advanced or not), so a window's final result is
# compared with what suppress(untilWindowCloses(unbounded())) forwards there: the same results
# and timestamps, the same windows, each once. Suppression forwards them in the order it
# buffered them, the emit strategy in window order: the comparison is as sets.
REFERENCE_MODE = {"tumbling_final": "suppress"}


def _text(value) -> str:
    return NULL if value is None else str(value)


def kafka_streams(mode: str, records, tmp_path) -> list[tuple[str, str, int]]:
    """``records`` (key, value, timestamp) through Kafka Streams' driver: topic "out"."""
    lines = "".join(f"{_text(k)}\t{_text(v)}\t{t}\n" for k, v, t in records)
    out = []
    for line in run_reference("AggregationReference.java", mode, lines, tmp_path / "ks"):
        key, value, timestamp = line.split("\t")
        out.append((key, value, int(timestamp)))
    return out


def _topology(mode: str):
    b = StreamsBuilder()
    stream = b.stream("in", Serdes.string(), Serdes.string())
    by_key = stream.group_by_key()
    tumbling = TimeWindows.of_size_and_grace(10, 5)
    if mode == "count":
        table = by_key.count()
    elif mode == "reduce":
        table = by_key.reduce(lambda total, value: str(int(total) + int(value)))
    elif mode == "aggregate":
        table = by_key.aggregate(lambda: "", lambda key, value, agg: f"{agg},{value}",
                                 Serdes.string())  # fmt: skip
    elif mode == "group_by":
        table = stream.group_by(lambda key, value: None if value is None else f"m{int(value) % 3}"
                                ).count()  # fmt: skip
    else:
        windows = tumbling.advance_by(3) if mode == "hopping" else tumbling
        windowed = by_key.windowed_by(windows)
        if mode == "tumbling_final":
            windowed = windowed.emit_strategy(EmitStrategy.on_window_close())
        table = windowed.count()
        if mode == "suppress":
            table = table.suppress(Suppressed.until_window_closes())
    table.to_stream().to("out")
    return b.build(), table.key_serde, table.value_serde


def _printed(key) -> str:
    if isinstance(key, Windowed):
        return f"{key.key}@{key.window.start}/{key.window.end}"
    return _text(key)


def ours(mode: str, records, commit_every, cache_bytes=None) -> list[tuple[str, str, int]]:
    return through_our_driver(_topology(mode), records, commit_every, cache_bytes)


def through_our_driver(built, records, commit_every, cache_bytes=None):
    """``records`` (key, value, timestamp) into topic "in" of ``built`` (topology, output key
    serde, output value serde) through our driver: topic "out" as (key, value, timestamp)
    text, a windowed key as "key@start/end"."""
    topology, key_serde, value_serde = built
    config = {"application.id": "ours"}
    if cache_bytes is not None:
        config["statestore.cache.max.bytes"] = cache_bytes
    with TopologyTestDriver(topology, config, commit_every=commit_every) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.string())
        for key, value, timestamp in records:
            source.pipe_input(key, value, timestamp=timestamp)
        driver.commit()
        out = driver.create_output_topic("out", key_serde, value_serde).read_records_to_list()
    return [(_printed(r.key), _text(r.value), r.timestamp) for r in out]


def random_input(seed: int, n: int = 300) -> list[tuple[str | None, str | None, int]]:
    """Keys a..e (some None), small integer values (some None), timestamps that mostly rise,
    with records out of order within the grace period and some later than it."""
    rng = random.Random(seed)
    records = []
    time = 0
    for _ in range(n):
        time += rng.randint(0, 4)
        late = rng.random() < 0.1
        timestamp = max(0, time - (rng.randint(6, 40) if late else rng.randint(0, 4)))
        key = None if rng.random() < 0.05 else rng.choice("abcde")
        value = None if rng.random() < 0.05 else str(rng.randint(0, 9))
        records.append((key, value, timestamp))
    return records


SMALL = [("a", "1", 1), ("b", "2", 3), ("a", "3", 12), (None, "4", 13), ("a", None, 14),
         ("a", "5", 30), ("b", "6", 2)]  # fmt: skip


def _same(mode: str, got: list, expected: list) -> None:
    if mode in REFERENCE_MODE:
        assert len(got) == len({record[0] for record in got})  # each window once
        got, expected = sorted(got), sorted(expected)
    assert got == expected


@pytest.mark.parametrize("mode", MODES)
def test_a_small_input_aggregates_as_in_kafka_streams(tmp_path, mode):
    expected = kafka_streams(REFERENCE_MODE.get(mode, mode), SMALL, tmp_path)
    _same(mode, ours(mode, SMALL, commit_every=1), expected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [1, 2])
def test_random_input_with_late_records_aggregates_as_in_kafka_streams(tmp_path, mode, seed):
    records = random_input(seed)
    expected = kafka_streams(REFERENCE_MODE.get(mode, mode), records, tmp_path)
    assert expected, "the reference forwarded nothing: the input does not exercise the mode"
    _same(mode, ours(mode, records, commit_every=1), expected)  # cache on, a commit per record
    _same(mode, ours(mode, records, commit_every=None, cache_bytes=0), expected)  # no cache


@pytest.mark.parametrize("mode", ["count", "aggregate", "group_by", "hopping"])
def test_the_record_cache_forwards_each_keys_last_update_at_the_commit(mode):
    """One commit at the end, as a micro-batch: the cache forwards exactly the last update of
    each key (window), in the order of those last updates."""
    records = random_input(3)
    every = ours(mode, records, commit_every=None, cache_bytes=0)
    last: dict[str, tuple[str, str, int]] = {}
    for record in every:
        last.pop(record[0], None)
        last[record[0]] = record
    assert ours(mode, records, commit_every=None) == list(last.values())
    assert len(every) > len(last)  # the input updates keys more than once
