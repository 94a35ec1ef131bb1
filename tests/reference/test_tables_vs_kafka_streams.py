"""Kafka Streams itself is the reference for table-table joins and for grouping a table: the
same seeded random input (two table topics, updates of the same keys, tombstones, keys moving
between groups, timestamps out of order) through its TopologyTestDriver (TableReference.java)
and through ours must give the same output records (keys, values, timestamps) in the same
order.

Kafka Streams runs with its record cache off and its driver commits after every record. Ours
runs with the cache off and one commit at the end (as a Spark micro-batch without the cache),
and with the default cache and a commit after every record (as Kafka Streams' driver)."""

from __future__ import annotations

import random

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.serdes import Serdes

from .kafka_streams import run_reference
from .test_aggregations_vs_kafka_streams import _text

JOINS = ["inner_join", "left_join", "outer_join", "filtered_left_join"]
GROUPINGS = ["group_by_count", "group_by_aggregate", "group_by_reduce", "filtered_group_by_count"]
MODES = [*JOINS, *GROUPINGS, "joined_group_by_count"]


def _joiner(left, right) -> str:
    return f"{'-' if left is None else left}+{'-' if right is None else right}"


def _group(key, value) -> tuple[str | None, str]:
    """TableReference.java's grouping: "g" + (the value's first number mod 3), no group for a
    number that is 6 mod 7."""
    number = int(value.split("+")[0].replace("-", "0"))
    return (None if number % 7 == 6 else f"g{number % 3}"), str(number)


def _kept(key, value) -> bool:
    return int(value) % 4 != 0


def _topology(mode: str):
    b = StreamsBuilder()
    left = b.table("left", Serdes.string(), Serdes.string())
    right = b.table("right", Serdes.string(), Serdes.string()) if "join" in mode else None
    if mode == "inner_join":
        out = left.join(right, _joiner)
    elif mode == "left_join":
        out = left.left_join(right, _joiner)
    elif mode == "outer_join":
        out = left.outer_join(right, _joiner)
    elif mode == "filtered_left_join":
        out = left.filter(_kept).left_join(right.map_values(lambda value: f"m{value}"), _joiner)
    elif mode == "group_by_count":
        out = left.group_by(_group).count().map_values(str, Serdes.string())
    elif mode == "group_by_aggregate":
        out = left.group_by(_group).aggregate(
            lambda: "", lambda key, value, agg: f"{agg}+{value}",
            lambda key, value, agg: f"{agg}-{value}", Serdes.string(),
        )  # fmt: skip
    elif mode == "group_by_reduce":
        out = left.group_by(_group).reduce(lambda agg, value: str(int(agg) + int(value)),
                                           lambda agg, value: str(int(agg) - int(value)))  # fmt: skip
    elif mode == "filtered_group_by_count":
        out = left.filter(_kept).group_by(_group).count().map_values(str, Serdes.string())
    elif mode == "joined_group_by_count":
        joined = left.outer_join(right, _joiner)
        out = joined.group_by(_group).count().map_values(str, Serdes.string())
    else:
        raise ValueError(mode)
    out.to_stream().to("out", Serdes.string(), Serdes.string())
    return b.build()


def _uses_right(mode: str) -> bool:
    return "join" in mode


def kafka_streams(mode: str, records, tmp_path) -> list[tuple[str, str, int]]:
    """``records`` (topic, key, value, timestamp) through Kafka Streams' driver: topic "out"."""
    lines = "".join(f"{topic}\t{_text(k)}\t{_text(v)}\t{t}\n" for topic, k, v, t in records)
    out = []
    for line in run_reference("TableReference.java", mode, lines, tmp_path / "ks"):
        key, value, timestamp = line.split("\t")
        out.append((key, value, int(timestamp)))
    return out


def ours(mode: str, records, commit_every, cache_bytes=None) -> list[tuple[str, str, int]]:
    config = {"application.id": "ours"}
    if cache_bytes is not None:
        config["statestore.cache.max.bytes"] = cache_bytes
    with TopologyTestDriver(_topology(mode), config, commit_every=commit_every) as driver:
        topics = {name: driver.create_input_topic(name, Serdes.string(), Serdes.string())
                  for name in (("left", "right") if _uses_right(mode) else ("left",))}  # fmt: skip
        for topic, key, value, timestamp in records:
            topics[topic].pipe_input(key, value, timestamp=timestamp)
        driver.commit()
        out = driver.create_output_topic("out", Serdes.string(), Serdes.string())
        return [(_text(r.key), _text(r.value), r.timestamp) for r in out.read_records_to_list()]


def random_input(seed: int, mode: str, n: int = 250) -> list[tuple[str, str, str | None, int]]:
    """Updates of keys a..f on "left" (and "right" for joins), a fifth of them tombstones
    (some for keys that have no value), values 0..13 (so keys move between groups, and into
    and out of no group), timestamps that mostly rise, some out of order."""
    rng = random.Random(seed)
    topics = ("left", "right") if _uses_right(mode) else ("left",)
    records = []
    time = 0
    for _ in range(n):
        time += rng.randint(0, 5)
        timestamp = max(0, time - (rng.randint(5, 30) if rng.random() < 0.15 else 0))
        value = None if rng.random() < 0.2 else str(rng.randint(0, 13))
        records.append((rng.choice(topics), rng.choice("abcdef"), value, timestamp))
    return records


SMALL = [("left", "a", "1", 10), ("right", "a", "2", 5), ("left", "b", "4", 3),
         ("right", "c", "5", 7), ("left", "a", "3", 4), ("right", "a", None, 8),
         ("left", "b", None, 9), ("left", "d", None, 2), ("right", "c", None, 1),
         ("left", "a", "6", 20), ("left", "a", None, 21), ("right", "b", "7", 22)]  # fmt: skip


def _small(mode: str):
    return [record for record in SMALL if _uses_right(mode) or record[0] == "left"]


@pytest.mark.slow  # the random inputs of the first seed run in `make test`
@pytest.mark.parametrize("mode", MODES)
def test_a_small_input_gives_what_kafka_streams_gives(tmp_path, mode):
    records = _small(mode)
    expected = kafka_streams(mode, records, tmp_path)
    assert ours(mode, records, commit_every=None, cache_bytes=0) == expected
    assert ours(mode, records, commit_every=1) == expected


@pytest.mark.parametrize("mode", MODES)
# The first seed in `make test`; the others in the slow tier (each mode is a JVM run).
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_random_updates_and_tombstones_give_what_kafka_streams_gives(tmp_path, mode, seed):
    records = random_input(seed, mode)
    expected = kafka_streams(mode, records, tmp_path)
    assert expected, "the reference forwarded nothing: the input does not exercise the mode"
    if mode in GROUPINGS:
        assert any(value == "0" for _, value, _ in expected) or mode != "group_by_count"
    assert ours(mode, records, commit_every=None, cache_bytes=0) == expected  # no cache
    assert ours(mode, records, commit_every=1) == expected  # cache on, a commit per record
