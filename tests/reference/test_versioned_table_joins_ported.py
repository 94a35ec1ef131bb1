"""Table-table joins of versioned tables (KIP-914), ported from Kafka Streams' own tests
(apache/kafka, streams/src/test/java/org/apache/kafka/streams/) with their inputs and expected
outputs unchanged: integration/TableTableJoinIntegrationTest's test{Inner,Left,Outer}With
VersionedStores, ...WithLeftVersionedOnly and ...WithRightVersionedOnly (the input of
AbstractJoinIntegrationTest: every record has key 0, timestamps out of order, some tombstones),
and kstream/internals/KTableFilterTest's shouldNotSkipNullIfVersionedUpstream.

The Java tests add a base time (MockTime's) to every timestamp; here it is 0: the versioned
stores keep 5 minutes of history, far more than the input spans, so nothing depends on it. Each
expected entry is what the output topic holds after that input record (None: nothing). With
the cache enabled the Java tests of a join with one versioned side check the last result only;
ours run with the default cache and a commit after every record (as Kafka Streams' driver).
"""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.serdes import Serdes
from streamplatform.state import Stores

L, R = "inputTopicLeft", "inputTopicRight"
# AbstractJoinIntegrationTest.input: (topic, value, timestamp), all with key 0.
INPUT = [(L, None, 1), (R, None, 2), (L, "A", 3), (R, "a", 4), (L, "B", 5), (R, "b", 6),
         (L, None, 7), (R, None, 8), (L, "C", 9), (R, "c", 10), (R, None, 11), (L, None, 12),
         (R, None, 13),
         (R, "d", 7),  # out-of-order data with null as latest
         (L, "D", 6), (L, None, 2), (R, None, 3), (R, "e", 14), (L, "E", 15),
         (L, None, 10),  # out-of-order data with non-null as latest
         (R, None, 9), (L, "F", 4), (R, "f", 3)]  # fmt: skip
FIVE_MINUTES = 5 * 60 * 1000


def _joiner(left, right) -> str:
    """The test's valueJoiner, ``value1 + "-" + value2`` in Java: a None prints "null"."""
    return f"{'null' if left is None else left}-{'null' if right is None else right}"


def _table(b: StreamsBuilder, topic: str, versioned: bool):
    store = Stores.persistent_versioned_key_value_store(topic, FIVE_MINUTES) if versioned else None
    return b.table(topic, Serdes.long(), Serdes.string(), store=store)


def _run(kind: str, left_versioned: bool, right_versioned: bool, cache: bool) -> list:
    b = StreamsBuilder()
    left, right = _table(b, L, left_versioned), _table(b, R, right_versioned)
    joined = getattr(left, kind)(right, _joiner)
    joined.to_stream().to("outputTopic", Serdes.long(), Serdes.string())
    config = {"application.id": "table-table-join-integration-test"}
    if not cache:
        config["statestore.cache.max.bytes"] = 0
    outputs = []
    with TopologyTestDriver(b.build(), config, commit_every=1) as driver:
        topics = {t: driver.create_input_topic(t, Serdes.long(), Serdes.string()) for t in (L, R)}
        out = driver.create_output_topic("outputTopic", Serdes.long(), Serdes.string())
        for topic, value, timestamp in INPUT:
            topics[topic].pipe_input(0, value, timestamp=timestamp)
            records = [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]
            outputs.append(records or None)
    return outputs


def _expected(*results) -> list:
    """One entry per input record: None, or the one (value, timestamp) of key 0."""
    assert len(results) == len(INPUT)
    return [None if r is None else [(0, r[0], r[1])] for r in results]


N = None
BOTH_VERSIONED = {
    "join": _expected(
        N,
        N,
        N,
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        (None, 7),
        N,
        N,
        ("C-c", 10),
        (None, 11),
        N,
        N,
        N,
        N,
        N,
        N,
        N,
        ("E-e", 15),
        N,
        N,
        N,
        N,
    ),
    "left_join": _expected(
        N,
        N,
        ("A-null", 3),
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        (None, 7),
        N,
        ("C-null", 9),
        ("C-c", 10),
        ("C-null", 11),
        (None, 12),
        N,
        N,
        N,
        N,
        N,
        N,
        ("E-e", 15),
        N,
        N,
        N,
        N,
    ),
    "outer_join": _expected(
        N,
        N,
        ("A-null", 3),
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        ("null-b", 7),
        (None, 8),
        ("C-null", 9),
        ("C-c", 10),
        ("C-null", 11),
        (None, 12),
        N,
        N,
        N,
        N,
        N,
        ("null-e", 14),
        ("E-e", 15),
        N,
        N,
        N,
        N,
    ),
}
LEFT_VERSIONED_ONLY = {
    "join": _expected(
        N,
        N,
        N,
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        (None, 7),
        N,
        N,
        ("C-c", 10),
        (None, 11),
        N,
        N,
        N,
        N,
        N,
        N,
        N,
        ("E-e", 15),
        N,
        (None, 15),
        N,
        ("E-f", 15),
    ),
    "left_join": _expected(
        N,
        N,
        ("A-null", 3),
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        (None, 7),
        N,
        ("C-null", 9),
        ("C-c", 10),
        ("C-null", 11),
        (None, 12),
        N,
        N,
        N,
        N,
        N,
        N,
        ("E-e", 15),
        N,
        ("E-null", 15),
        N,
        ("E-f", 15),
    ),
    "outer_join": _expected(
        N,
        N,
        ("A-null", 3),
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        ("null-b", 7),
        (None, 8),
        ("C-null", 9),
        ("C-c", 10),
        ("C-null", 11),
        (None, 12),
        N,
        ("null-d", 7),
        N,
        N,
        (None, 3),
        ("null-e", 14),
        ("E-e", 15),
        N,
        ("E-null", 15),
        N,
        ("E-f", 15),
    ),
}
RIGHT_VERSIONED_ONLY = {
    "join": _expected(
        N,
        N,
        N,
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        (None, 7),
        N,
        N,
        ("C-c", 10),
        (None, 11),
        N,
        N,
        N,
        N,
        N,
        N,
        N,
        ("E-e", 15),
        (None, 14),
        N,
        ("F-e", 14),
        N,
    ),
    "left_join": _expected(
        N,
        N,
        ("A-null", 3),
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        (None, 7),
        N,
        ("C-null", 9),
        ("C-c", 10),
        ("C-null", 11),
        (None, 12),
        N,
        N,
        ("D-null", 6),
        (None, 2),
        N,
        N,
        ("E-e", 15),
        (None, 14),
        N,
        ("F-e", 14),
        N,
    ),
    "outer_join": _expected(
        N,
        N,
        ("A-null", 3),
        ("A-a", 4),
        ("B-a", 5),
        ("B-b", 6),
        ("null-b", 7),
        (None, 8),
        ("C-null", 9),
        ("C-c", 10),
        ("C-null", 11),
        (None, 12),
        N,
        N,
        ("D-null", 6),
        (None, 2),
        N,
        ("null-e", 14),
        ("E-e", 15),
        ("null-e", 14),
        N,
        ("F-e", 14),
        N,
    ),
}
# The final results the Java tests check with the cache enabled (one versioned side).
FINAL_LEFT_VERSIONED_ONLY = (0, "E-f", 15)
FINAL_RIGHT_VERSIONED_ONLY = (0, "F-e", 14)
KINDS = ["join", "left_join", "outer_join"]


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_with_versioned_stores(kind, cache):
    """test{Inner,Left,Outer}WithVersionedStores: out-of-order updates of either side are
    dropped by the join ("versioned stores do not support caching": the same either way)."""
    assert _run(kind, True, True, cache) == BOTH_VERSIONED[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_with_left_versioned_only(kind):
    assert _run(kind, True, False, cache=False) == LEFT_VERSIONED_ONLY[kind]
    outputs = [record for records in _run(kind, True, False, cache=True) if records
               for record in records]  # fmt: skip
    assert outputs[-1] == FINAL_LEFT_VERSIONED_ONLY


@pytest.mark.parametrize("kind", KINDS)
def test_with_right_versioned_only(kind):
    assert _run(kind, False, True, cache=False) == RIGHT_VERSIONED_ONLY[kind]
    outputs = [record for records in _run(kind, False, True, cache=True) if records
               for record in records]  # fmt: skip
    assert outputs[-1] == FINAL_RIGHT_VERSIONED_ONLY


def test_filter_should_not_skip_null_if_versioned_upstream():
    """KTableFilterTest.shouldNotSkipNullIfVersionedUpstream: a downstream operator asks the
    filter for old values, yet it forwards its tombstones for keys that had no value, because
    its table is versioned. The Java test's downstream operator is a groupBy (still refused on
    a versioned table here); a left join asks for old values the same way."""
    b = StreamsBuilder()
    store = Stores.persistent_versioned_key_value_store("versioned", FIVE_MINUTES)
    table1 = b.table("topic1", Serdes.string(), Serdes.string(), store=store)
    table2 = table1.filter(lambda key, value: value.lower() == "accept")
    other = b.table("other", Serdes.string(), Serdes.string())
    table2.left_join(other, _joiner)
    table1.to_stream().to("proc1", Serdes.string(), Serdes.string())
    table2.to_stream().to("proc2", Serdes.string(), Serdes.string())
    config = {"application.id": "ktable-filter", "statestore.cache.max.bytes": 0}
    with TopologyTestDriver(b.build(), config) as driver:
        topic = driver.create_input_topic("topic1", Serdes.string(), Serdes.string())
        for key, timestamp in (("A", 5), ("B", 10), ("C", 20)):
            topic.pipe_input(key, "reject", timestamp=timestamp)
        read = {name: [(r.key, r.value, r.timestamp) for r in
                       driver.create_output_topic(name, Serdes.string(), Serdes.string())
                       .read_records_to_list()] for name in ("proc1", "proc2")}  # fmt: skip
    assert read["proc1"] == [("A", "reject", 5), ("B", "reject", 10), ("C", "reject", 20)]
    assert read["proc2"] == [("A", None, 5), ("B", None, 10), ("C", None, 20)]
