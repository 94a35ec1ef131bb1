"""A task's reader turns consumed messages into record tuples twice over:
``kafka_input.append_rows`` (Python, the reference) and ``_kafka_rows.append_rows`` (C, built
with the package). They must give the same rows and stop at the same message: the first with
an error, or the first at or past the range's end. The reader's own tests (a real broker:
test_kafka_input.py) run the C one."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamplatform.records import NO_HEADERS
from streamplatform.runtime import kafka_input


class _Message:
    """What the reader asks of a confluent_kafka Message."""

    def __init__(self, offset, timestamp, key, value, headers, error=None) -> None:
        self._offset, self._timestamp, self._error = offset, timestamp, error
        self._key, self._value, self._headers = key, value, headers

    def error(self):
        return self._error

    def offset(self):
        return self._offset

    def timestamp(self):
        return (1, self._timestamp)

    def key(self):
        return self._key

    def value(self):
        return self._value

    def headers(self):
        return self._headers


messages = st.lists(
    st.builds(
        _Message,
        offset=st.integers(0, 40),
        timestamp=st.integers(-1, 2**40),
        key=st.none() | st.binary(max_size=4),
        value=st.none() | st.binary(max_size=4),
        headers=st.sampled_from([None, [], [("h", b"1")]]),
        error=st.sampled_from([None, None, None, None, "an error"]),
    ),
    max_size=12,
)


@pytest.mark.skipif(kafka_input._native_append_rows is None, reason="the C helper is not built")
@given(messages=messages, end=st.integers(0, 45), earlier=st.integers(0, 2))
def test_the_c_rows_and_the_python_rows_are_the_same(messages, end, earlier):
    python_rows = [("t", 0, n, 0, None, None, NO_HEADERS) for n in range(earlier)]
    c_rows = list(python_rows)  # rows of an earlier consume, not yet handed on
    python = kafka_input.append_rows(messages, "t", 0, end, python_rows, NO_HEADERS)
    native = kafka_input._native_append_rows(messages, "t", 0, end, c_rows, NO_HEADERS)
    assert (native, c_rows) == (python, python_rows)
    assert all(row[6] is NO_HEADERS for row in c_rows if not row[6])


def _confluent(message: _Message):
    """The same message as confluent_kafka's own Message: the type whose accessors the C
    helper calls directly, where it calls the double's by name."""
    from confluent_kafka import KafkaError, Message

    error = None if message._error is None else KafkaError(KafkaError._FAIL, message._error)
    return Message(topic="t", partition=0, offset=message._offset, key=message._key,
                   value=message._value, headers=message._headers,
                   timestamp=(1, message._timestamp), error=error)  # fmt: skip


@pytest.mark.skipif(kafka_input._native_append_rows is None, reason="the C helper is not built")
@given(messages=messages, end=st.integers(0, 45), doubles=st.integers(0, 2))
def test_confluent_kafkas_messages_give_the_rows_their_doubles_give(messages, end, doubles):
    """Real Messages, with a few doubles among them (another type: called by name)."""
    real = [_confluent(m) if i >= doubles else m for i, m in enumerate(messages)]
    python_rows: list = []
    c_rows: list = []
    python = kafka_input.append_rows(messages, "t", 0, end, python_rows, NO_HEADERS)
    native = kafka_input._native_append_rows(real, "t", 0, end, c_rows, NO_HEADERS)
    assert (native, c_rows) == (python, python_rows)


@pytest.mark.skipif(kafka_input._native_append_rows is None, reason="the C helper is not built")
def test_the_c_rows_hold_no_reference_to_the_messages_left_behind():
    key, value = b"".join([b"k", b"1"]), b"".join([b"v", b"1"])
    before = sys.getrefcount(key), sys.getrefcount(value)
    rows: list = []
    kafka_input._native_append_rows([_Message(0, 5, key, value, None)], "t", 0, 10, rows,
                                    NO_HEADERS)  # fmt: skip
    assert rows == [("t", 0, 0, 5, key, value, NO_HEADERS)]
    del rows
    assert (sys.getrefcount(key), sys.getrefcount(value)) == before


def test_the_reader_runs_the_c_helper_where_it_was_built():
    if kafka_input._native_append_rows is None:
        pytest.skip("the C helper is not built here (test_dedup_core.py's build test says why)")
    assert kafka_input._append_rows is kafka_input._native_append_rows


def test_the_c_partitioner_is_kafkas_murmur2_as_the_python_reference():
    import random

    from streamplatform.runtime.partitioner import partition_for, python_partition_for

    rng = random.Random(3)
    for _ in range(5_000):
        key = rng.randbytes(rng.randrange(0, 40))
        partitions = rng.randrange(1, 100)
        assert partition_for(key, partitions) == python_partition_for(key, partitions)
    assert (partition_for(b"a", 3), partition_for(b"hello", 12)) == (1, 9)  # as Java's
