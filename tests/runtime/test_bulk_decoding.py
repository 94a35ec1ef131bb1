"""A task decodes a list of source records a slice at a time (``Task._decoded``), and a single
record, or a record whose slice failed to decode in bulk, by itself. Both must give the same
outputs, DLQ records, state and counters; the cases that decline the bulk path (a value that is
no JSON, an integer beyond 64 bits, a key that is no UTF-8) must reach the handler at their
record, in order."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform import StreamsBuilder
from streamplatform.config import StreamsConfig
from streamplatform.records import ConsumedRecord
from streamplatform.runtime.source_records import DECODE_SLICE
from streamplatform.runtime.task import Task
from streamplatform.serdes import Serdes
from streamplatform.state import IsolationLevel

MINUTE = 60_000


def _topology(second_value_serde=None):
    """The dedup of "in"; with ``second_value_serde``, of "in" merged with "in2" (read with
    that value serde)."""
    builder = StreamsBuilder()
    stream = builder.stream("in", Serdes.string(), Serdes.json())
    if second_value_serde is not None:
        stream = stream.merge(builder.stream("in2", Serdes.string(), second_value_serde))
    stream.deduplicate_by_key_value(lambda key, value: value["id"], MINUTE).to("out")
    return builder.build()


def _task(state_dir, second_value_serde=None) -> Task:
    topology = _topology(second_value_serde)
    config = StreamsConfig({
        "application.id": "bulk", "processing.guarantee": "exactly_once_v2",
        "errors.dead.letter.queue.topic.name": "dlq",
        "default.deserialization.exception.handler": "log_and_continue",
        "processing.exception.handler": "log_and_continue",
    })  # fmt: skip
    return Task(topology, topology.subtopologies[0], 0, config, state_dir, lambda topic: 1,
                isolation_level=IsolationLevel.READ_COMMITTED)  # fmt: skip


# A value: a record with a (mostly repeated) id, JSON that is no object, no JSON at all, an
# integer beyond 64 bits, or a tombstone. A key: a string, None, or bytes that are no UTF-8.
values = st.one_of(
    st.integers(0, 5).map(lambda n: json.dumps({"id": f"tx-{n}", "n": n}).encode()),
    st.just(b"[1, 2]"),
    st.just(b"{not json"),
    st.integers(0, 5).map(lambda n: json.dumps({"id": f"tx-{n}", "n": 2**70}).encode()),
    st.none(),
)
keys = st.one_of(st.sampled_from([b"a", b"b"]), st.none(), st.just(b"\xff"))


def _outcome(task: Task) -> tuple:
    """Everything the two paths must agree on: outputs (DLQ records included, in order),
    counters, the offsets and stream time committed, and the store after the commit."""
    output = [tuple(record) for record in task.take_output()]
    committed = task.commit()
    (store,) = task.stores.values()
    return output, task.metrics(), committed, task.stream_time, list(store.prefix(b""))


def _assert_bulk_as_one_by_one(tmp_path_factory, records, second_value_serde=None) -> None:
    """``records`` as one list and one at a time, each into a task of its own: the same
    outcome."""
    in_bulk = _task(tmp_path_factory.mktemp("bulk"), second_value_serde)
    one_by_one = _task(tmp_path_factory.mktemp("single"), second_value_serde)
    try:
        in_bulk.process_all(list(records))
        for record in records:
            one_by_one.process(record)
        assert _outcome(in_bulk) == _outcome(one_by_one)
    finally:
        in_bulk.close()
        one_by_one.close()


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.tuples(keys, values, st.integers(0, 3 * MINUTE)), max_size=3 * DECODE_SLICE))
def test_a_list_and_one_record_at_a_time_give_the_same_result(tmp_path_factory, rows):
    records = [
        ConsumedRecord("in", 0, offset, timestamp, key, value, [])
        for offset, (key, value, timestamp) in enumerate(rows)
    ]
    _assert_bulk_as_one_by_one(tmp_path_factory, records)


@settings(max_examples=examples(30), deadline=None)
@given(
    rows=st.lists(st.tuples(st.booleans(), keys, values, st.integers(0, 3 * MINUTE)),
                  max_size=2 * DECODE_SLICE),
    second_value_serde=st.sampled_from([Serdes.json(), Serdes.string()]),
)  # fmt: skip
def test_records_of_two_topics_read_merged_give_the_same_result(
    tmp_path_factory, rows, second_value_serde
):
    """A merge's two topics in one list: decoded together when their sources share both
    serdes (JSON and JSON), record by record when not (JSON and string, whose values fail the
    id lookup: processing errors); the same result as one record at a time either way."""
    records = [
        ConsumedRecord("in2" if second else "in", 0, offset, timestamp, key, value, [])
        for offset, (second, key, value, timestamp) in enumerate(rows)
    ]
    _assert_bulk_as_one_by_one(tmp_path_factory, records, second_value_serde)


def test_a_record_that_fails_to_decode_reaches_the_handler_in_order(tmp_path):
    """A malformed record in the middle of a slice: the records before and after it are
    processed, and its DLQ record comes between their outputs."""
    good = [json.dumps({"id": f"tx-{n}"}).encode() for n in range(6)]
    values_in = good[:3] + [b"{broken"] + good[3:]
    records = [
        ConsumedRecord("in", 0, offset, 1_000 + offset, b"k", value, [])
        for offset, value in enumerate(values_in)
    ]
    task = _task(tmp_path)
    try:
        task.process_all(records)
        topics = [record.topic for record in task.take_output()]
        assert topics == ["out", "out", "out", "dlq", "out", "out", "out"]
        assert task.metrics()["records_in"] == 7
    finally:
        task.close()


def test_two_topics_decode_in_bulk_only_when_their_sources_share_both_serdes(tmp_path):
    records = [
        ConsumedRecord(topic, 0, offset, 0, b"k", b'{"id": 1}', [])
        for offset, topic in enumerate(["in", "in2"] * 3)
    ]
    for second_value_serde, in_bulk in ((Serdes.json(), True), (Serdes.string(), False)):
        task = _task(tmp_path / str(in_bulk), second_value_serde)
        try:
            values = [value for _, _, value in task._decoded(records)]
            assert (values == [{"id": 1}] * 6) is in_bulk
        finally:
            task.close()


# Keys and values as a source serde may be handed them: bytes (UTF-8 or not, JSON or not,
# with an integer beyond 64 bits), None, and other buffers (which the bulk path declines).
raw_data = st.one_of(
    values,
    keys,
    st.binary(max_size=12),
    st.integers(-(2**80), 2**80).map(lambda n: str(n).encode()),
    st.sampled_from(
        [b'"text"', b"1.5", b"NaN", b"[1, 2, 3]", bytearray(b'{"id": 1}'), bytearray(b"\xff")]
    ),
)


@settings(max_examples=examples(60), deadline=None)
@given(
    data=st.lists(st.tuples(raw_data, raw_data), max_size=DECODE_SLICE + 3),
    start=st.integers(0, 4),
    serdes=st.tuples(*[st.sampled_from([Serdes.string(), Serdes.bytes(), Serdes.json()])] * 2),
)  # fmt: skip
def test_a_slice_decoded_in_c_is_what_deserialize_all_gives(data, start, serdes):
    """``_task_loop.decode_slice`` against its reference, ``deserialize_all`` per slice: the
    same keys and values, or both declining the slice (each record then ``UNDECODED``)."""
    from unittest.mock import patch

    import streamplatform.runtime.source_records as source_records
    from streamplatform.dsl.graph import SourceNode

    if source_records._native_decode_slice is None:
        pytest.skip("the package was built without its C extensions")
    source = SourceNode(name="in", topic="in", key_serde=serdes[0], value_serde=serdes[1])
    records = [
        ConsumedRecord("in", 0, offset, 0, key, value, [])
        for offset, (key, value) in enumerate(data)
    ]
    results = []
    for native in (True, False):
        with patch.object(source_records, "NATIVE_DECODE", native):
            results.append(list(source_records.decode_slice(source, records, start)))
    assert results[0] == results[1]
