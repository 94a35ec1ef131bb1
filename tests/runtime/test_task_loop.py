"""A task's loop over its records runs in C (``runtime/_task_loop.c``) beside its Python
reference (``Task._process_all``), and so do its sinks' delivery functions (``Writer`` beside
``sink_writers.sink_writer``'s ``write``). The two must be indistinguishable: the same outputs and DLQ
records in order, the same handler calls, stream time, punctuations, consumed offsets, counters
and lateness sums, the same answer to a limit that stops the loop early, and the same state
when a handler fails the task half way. Each example runs the same records through a task with
each loop."""

from __future__ import annotations

import json
import os
import re
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform import StreamsBuilder
from streamplatform.config import StreamsConfig
from streamplatform.dsl.processor import Processor, PunctuationType
from streamplatform.errors.exceptions import TaskFailedError
from streamplatform.records import ConsumedRecord, Record
from streamplatform.runtime import sink_writers
from streamplatform.runtime import task as task_module
from streamplatform.runtime.task import Task
from streamplatform.serdes import Serdes
from streamplatform.state import IsolationLevel

MINUTE = 60_000


class Ticker(Processor):
    """Forwards each record with its value's "n" doubled (n == 4: a set, which JSON cannot
    write: a production error); raises for n == 3 (a processing error); every 50 ms of stream
    time forwards a tick with the time it fired at."""

    def init(self, context) -> None:
        super().init(context)
        context.schedule(50, PunctuationType.STREAM_TIME, self._tick)

    def _tick(self, now: int) -> None:
        self.context.forward(Record("tick", {"at": now}, now))

    def process(self, record) -> None:
        if record.value["n"] == 3:
            raise ValueError("n is 3")
        n = record.value["n"]
        self.context.forward(record._replace(value={"n": {n} if n == 4 else n * 2}))


def _event_time(record: ConsumedRecord, partition_time: int) -> int:
    """The value's "t"; a negative "t" is no event time (the deserialization handler), nor is
    "t" 399, which stands for a time beyond Kafka's int64."""
    t = record.value["t"]
    return 2**63 if t == 399 else t


def _topology():
    """Topic "a" (JSON, its own time) deduplicated into "copy" (written as read), and merged with
    "b" (JSON, event time from the value) through the Ticker into "out"."""
    builder = StreamsBuilder()
    a = builder.stream("a", Serdes.string(), Serdes.json())
    a = a.deduplicate_by_key_value(lambda key, value: value["n"], MINUTE)
    a.to("copy", Serdes.string(), Serdes.json())
    b = builder.stream("b", Serdes.string(), Serdes.json(), timestamp_extractor=_event_time)
    a.merge(b).process_values(Ticker).to("out", Serdes.string(), Serdes.json())
    return builder.build()


def _task(state_dir, native: bool, handler: str = "log_and_continue", **settings_) -> Task:
    """A task whose sinks' writers are the C ones (``native``) or the Python reference."""
    topology = _topology()
    config = StreamsConfig({
        "application.id": "loop", "processing.guarantee": "exactly_once_v2",
        "errors.dead.letter.queue.topic.name": "dlq",
        "default.deserialization.exception.handler": handler,
        "processing.exception.handler": handler,
        "default.production.exception.handler": handler, **settings_,
    })  # fmt: skip
    with patch.object(sink_writers, "NATIVE_WRITER", native):
        return Task(topology, topology.subtopologies[0], 0, config, state_dir, lambda topic: 1,
                    isolation_level=IsolationLevel.READ_COMMITTED)  # fmt: skip


def _value(n: int | None, t: int) -> bytes | None:
    if n is None:
        return None
    if n == 9:
        return b"{not json"
    return json.dumps({"n": n, "t": t}).encode()


# (topic, value's n, value's t, record timestamp): n 9 is no JSON, 3 fails the Ticker, None is
# a tombstone (the Ticker's value["n"] fails on it); t < 0 is no event time for "b".
records_ = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.one_of(st.integers(0, 9), st.none()),
        st.integers(-5, 400),
        st.integers(0, 400),
    ),  # fmt: skip
    max_size=60,
)


def _consumed(rows, plain: bool) -> list:
    """The records as ConsumedRecords, or (``plain``) as tuples in their layout."""
    offsets: dict[str, int] = {}
    out = []
    for topic, n, t, timestamp in rows:
        offset = offsets[topic] = offsets.get(topic, -1) + 1
        fields = (topic, 0, offset, timestamp, b"k", _value(n, t), [])
        out.append(fields if plain else ConsumedRecord(*fields))
    return out


# A frame of the Python loop (task.py) or writer (sink_writers.py) in a traceback: its file
# line, its source line, and the carets under it.
_LOOP_FRAME = re.compile(
    r'  File "[^"]*runtime/(task|sink_writers)\.py", line \d+, in \w+\n    .*\n( *\^+ *\n)?'
)


def _without_the_loops_frame(record) -> tuple:
    """A DLQ record's stack trace names the Python loop's and writer's own frames where the C
    ones have none: the one difference, which this takes out."""
    if record.headers is None:
        return tuple(record)
    headers = []
    for name, value in record.headers:
        if name == "__streams.errors.stacktrace":
            value = _LOOP_FRAME.sub("", value.decode()).encode()
        headers.append((name, value))
    return tuple(record._replace(headers=headers))


def _state(task: Task) -> tuple:
    return (
        [_without_the_loops_frame(record) for record in task.output], list(task.output_sources),
        dict(task.consumed), task.stream_time, task.records_in, task.skipped,
        task.dlq_records, dict(task.timing), task.current, dict(task.partition_times),
        [p.next_time for p in task.punctuations], task.metrics(),
    )  # fmt: skip


def _run(task: Task, native: bool, records, **kwargs):
    """What ``process_all`` returned (or raised) with the given loop, and the task's state."""
    with patch.object(task_module, "NATIVE_LOOP", native):
        try:
            answer = task.process_all(records, **kwargs)
        except TaskFailedError as error:
            answer = ("failed", str(error).split(" at ")[0])
    return answer, _state(task)


NO_C_CORE = os.environ.get("STREAMPLATFORM_NO_C_CORE", "").strip().lower() in {"1", "true", "yes"}
# Without the C loop both runs of a comparison would be the reference: nothing compared.
needs_c_loop = pytest.mark.skipif(
    task_module._native_loop is None,
    reason="the C loop is not built here (test_the_c_loop_and_writers_are_the_ones_that_run)",
)


def test_the_c_loop_and_writers_are_the_ones_that_run(tmp_path):
    if NO_C_CORE:
        pytest.skip("STREAMPLATFORM_NO_C_CORE is set: the C loop is left out on purpose")
    assert task_module._native_loop is not None, (
        "runtime/_task_loop.c was not built: rebuild it with `make setup` or "
        "`.venv/bin/python setup.py build_ext --inplace`"
    )
    assert sink_writers._native_writer is not None
    task = _task(tmp_path, native=True)
    try:
        writers = {type(deliver).__name__ for deliver in task._deliver.values()}
        assert "Writer" in writers  # "copy" and "out" are sinks of the common kind
    finally:
        task.close()


@needs_c_loop
@settings(max_examples=examples(150), deadline=None)
@given(rows=records_, plain=st.booleans(), split=st.integers(0, 60))
def test_the_c_loop_and_the_python_reference_are_indistinguishable(
    tmp_path_factory, rows, plain, split
):
    """In two calls (cut at ``split``), as a task is fed over a batch's pieces; the second
    call's stream time and sums go on from the first's."""
    records = _consumed(rows, plain)
    outcomes = []
    for native in (True, False):
        task = _task(tmp_path_factory.mktemp("loop"), native)
        try:
            first = _run(task, native, records[:split])
            second = _run(task, native, records[split:])
            outcomes.append((first, second, task.commit()))
        finally:
            task.close()
    assert outcomes[0] == outcomes[1]


@needs_c_loop
@settings(max_examples=examples(60), deadline=None)
@given(rows=records_)
def test_a_handler_that_fails_the_task_leaves_the_same_state_with_either_loop(
    tmp_path_factory, rows
):
    records = _consumed(rows, plain=False)
    outcomes = []
    for native in (True, False):
        task = _task(tmp_path_factory.mktemp("fail"), native, handler="log_and_fail")
        try:
            outcomes.append(_run(task, native, records))
        finally:
            task.close()
    assert outcomes[0] == outcomes[1]


@needs_c_loop
def test_a_limit_stops_either_loop_right_after_the_same_record(tmp_path):
    """statestore.uncommitted.max.records 5: the dedup's held writes pass it after a few
    distinct ids; asked after every record (the interval is 1 for so small a limit), the loop
    stops there, returns True and leaves the rest unread, at the same record either way."""
    records = _consumed([("a", n % 8, 0, n) for n in range(20)], plain=True)
    outcomes = []
    for native in (True, False):
        task = _task(tmp_path / str(native), native,
                     **{"statestore.uncommitted.max.records": 5})  # fmt: skip
        try:
            answer, state = _run(task, native, records, stop_early=True)
            assert answer is True
            assert 0 < task.records_in < len(records)
            assert state[2] == {("a", 0): task.records_in}  # consumed: the records read
            outcomes.append(state)
        finally:
            task.close()
    assert outcomes[0] == outcomes[1]


@needs_c_loop
def test_a_topic_the_task_does_not_read_is_refused_by_either_loop(tmp_path):
    for native in (True, False):
        task = _task(tmp_path / str(native), native)
        try:
            with (
                patch.object(task_module, "NATIVE_LOOP", native),
                pytest.raises(ValueError, match="does not read topic 'c'"),
            ):
                task.process_all([("c", 0, 0, 0, b"k", b"{}", [])] * 2)
            assert task.current is None and task.records_in == 0
        finally:
            task.close()


@needs_c_loop
def test_an_event_time_beyond_int64_goes_to_the_handler_with_either_loop(tmp_path):
    records = _consumed([("b", 1, 399, 5), ("b", 2, 7, 6)], plain=False)
    outcomes = []
    for native in (True, False):
        task = _task(tmp_path / str(native), native)
        try:
            answer, state = _run(task, native, records)
            (dlq,) = [record for record in state[0] if record[0] == "dlq"]
            assert b"fits Kafka's int64" in dict(dlq[4])["__streams.errors.message"]
            assert task.stream_time == 7
            outcomes.append((answer, state))
        finally:
            task.close()
    assert outcomes[0] == outcomes[1]
