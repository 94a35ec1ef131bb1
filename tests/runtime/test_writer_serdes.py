"""A sink's C writer (``runtime/_task_loop.c``, ``Writer``) serializes the keys and values of
the serdes whose every case it knows itself: the built-in string, bytes and long serdes, and
time- and session-windowed keys of those (``sink_writers.serde_format``). The serde is the
reference: for any value, the writer gives the serde's bytes, or the serde's own error (which
then goes to the production handler as before)."""

from __future__ import annotations

import os
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform import StreamsBuilder, TimeWindows
from streamplatform.config import StreamsConfig
from streamplatform.dsl.windows import SessionWindowedSerde, TimeWindowedSerde, Window, Windowed
from streamplatform.records import ConsumedRecord
from streamplatform.runtime import sink_writers
from streamplatform.runtime.sink_writers import serde_format
from streamplatform.serdes import Serdes
from streamplatform.state import IsolationLevel

try:
    from streamplatform.runtime import _task_loop
except ImportError:  # pragma: no cover - depends on the build
    _task_loop = None

pytestmark = pytest.mark.skipif(
    _task_loop is None, reason="the C writer is not built (STREAMPLATFORM_NO_C_CORE is set)"
)
if _task_loop is None and not os.environ.get("STREAMPLATFORM_NO_C_CORE"):
    raise ImportError("the C task loop was expected (setup.py): _task_loop did not import")

PLAIN = [Serdes.string(), Serdes.bytes(), Serdes.long()]
SERDES = (
    PLAIN
    + [TimeWindowedSerde(inner, 300_000) for inner in PLAIN]
    + [SessionWindowedSerde(inner) for inner in PLAIN]
)

# Values of every kind a serde may be handed: its own, the others', and those it refuses
# (a str that is no UTF-8, ints past 64 bits, a bool, a subclass).
_plain = st.one_of(
    st.none(),
    st.text(max_size=8),
    st.just("\ud800"),
    st.binary(max_size=8),
    st.builds(bytearray, st.binary(max_size=4)),
    st.integers(-(2**64), 2**64),
    st.sampled_from([True, False, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1]),
    st.floats(allow_nan=False),
)


class _Str(str):
    pass


class _Window:
    """Not a Window, with a Window's fields."""

    def __init__(self, start: object, end: object) -> None:
        self.start, self.end = start, end


_times = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**63, -(2**63) - 1, True]), st.none()
)
_windowed = st.one_of(
    st.builds(Windowed, _plain, st.builds(Window, _times, _times)),
    st.builds(Windowed, st.builds(_Str, st.text(max_size=4)), st.builds(Window, _times, _times)),
    st.builds(Windowed, _plain, st.builds(_Window, _times, _times)),
)
values = st.one_of(_plain, _windowed)


def _outcome(function, *args):
    try:
        return "value", function(*args)
    except Exception as error:  # the same error, raised by the same serde
        return "error", type(error), str(error)


@settings(max_examples=examples(400), deadline=None)
@given(serde_index=st.integers(0, len(SERDES) - 1), value=values)
def test_the_writer_serializes_as_the_serde_does(serde_index, value):
    serde = SERDES[serde_index]
    for windowed in (True, False):  # keys may be windowed; values never are
        format_ = serde_format(serde, windowed=windowed)
        written = _outcome(
            _task_loop.serialize, format_, serde.serialize, value, (Windowed, Window)
        )
        assert written == _outcome(serde.serialize, value)


def test_the_built_in_serdes_and_their_windowed_keys_have_a_format():
    assert [serde_format(serde) for serde in SERDES] == [1, 2, 3, 5, 6, 7, 9, 10, 11]
    assert serde_format(TimeWindowedSerde(Serdes.string(), 1), windowed=False) == 0
    assert serde_format(Serdes.json()) == 0
    assert serde_format(TimeWindowedSerde(Serdes.json(), 1)) == 0

    class Upper(TimeWindowedSerde):  # a user's own subclass: its serialize is called
        def serialize(self, value):
            return super().serialize(value).upper()

    assert serde_format(Upper(Serdes.string(), 1)) == 0


def _windowed_count_task(state_dir, native: bool):
    from streamplatform.runtime.task import Task

    builder = StreamsBuilder()
    (builder.stream("views", Serdes.string(), Serdes.bytes()).group_by_key()
     .windowed_by(TimeWindows.of_size_with_no_grace(1_000)).count()
     .to_stream().to("counts"))  # fmt: skip
    topology = builder.build()
    config = StreamsConfig({"application.id": "writer", "statestore.cache.max.bytes": 0})
    with patch.object(sink_writers, "NATIVE_WRITER", native):
        return Task(topology, topology.subtopologies[0], 0, config, state_dir, lambda topic: 1,
                    isolation_level=IsolationLevel.READ_COMMITTED)  # fmt: skip


def test_a_windowed_count_is_written_without_calling_its_serdes(tmp_path):
    """The fast path is the one taken for a windowed count's sink (its keys' string serde is
    not called), and writes what the Python writer writes."""
    records = [
        ConsumedRecord("views", 0, offset, 500 * offset, key.encode(), b"v", [])
        for offset, key in enumerate(["a", "b", "a", "é", "a", "b"])
    ]
    outputs = {}
    serialize = Serdes.string().serialize
    for native in (True, False):
        string_calls: list[str] = []

        def counted(value, calls=string_calls):
            calls.append(value)
            return serialize(value)

        with patch.object(Serdes.string(), "serialize", counted):
            task = _windowed_count_task(tmp_path / f"state-{native}", native)
            task.process_all(records)
            outputs[native] = [tuple(r[:4]) for r in task.take_output()]
            task.close()
        assert bool(string_calls) is not native
    assert outputs[True] == outputs[False]
    assert outputs[True][0] == ("counts", b"a" + (0).to_bytes(8, "big"), (1).to_bytes(8, "big"), 0)
