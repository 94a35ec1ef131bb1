"""A replayed batch sees the clock its first attempt saw: the batch's wall-clock time is logged
with its plan, wall-clock punctuations fire at it and ``context.current_system_time_ms()``
answers it, and the wall-clock schedules are committed with the stores. A job whose output
depends on the clock, killed after its sink was written and before the batch committed, is
replayed into state and changelog that agree with that sink (docs/guarantees.md)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
from pyspark import cloudpickle

from streamplatform import StreamingJob
from streamplatform.serdes import Serdes

from . import clock_job
from .clock_job import clock_topology
from .support import job_config

pytestmark = [pytest.mark.broker, pytest.mark.spark]
TESTS = os.path.dirname(os.path.dirname(__file__))
# The session's Spark workers started before this folder was on any path they know: the job's
# module travels by value, as a team's package installed on the workers would be imported.
cloudpickle.register_pickle_by_value(clock_job)
CHILD_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from runtime.clock_job import clock_topology
    from streamplatform import StreamingJob
    StreamingJob(clock_topology({source!r}, {sink!r}), {config!r},
                 delta_sinks=[{sink!r}]).run_until_caught_up()
    print("finished without crashing")
""")


@pytest.mark.parametrize(
    "overrides",
    # The direct path (the replay takes it too), and the Delta-write path (tasks inside
    # Spark's write of the sink; the replay takes the cached path).
    [{}, {"platform.sink.driver.max.records": 0}],
    ids=["direct", "delta-write-then-cached"],
)
@pytest.mark.child_process
def test_a_clock_reading_job_killed_after_its_sink_replays_into_agreeing_state(
    spark, kafka_settings, source_topic, tmp_path, overrides
):
    source, _ = source_topic
    app = f"clock-{uuid.uuid4().hex[:6]}"
    sink = "seen"
    config = job_config(kafka_settings, tmp_path, app, source, **overrides)
    script = CHILD_RUN.format(tests=TESTS, source=source, sink=sink, config=config)
    # Killed in batch 1 (its task fires the punctuator scheduled in batch 0), once the sink
    # holds the batch and before the changelog and the commit do.
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        # Spark's Python workers import the topology's module (runtime.support) by name.
        env=os.environ | {"STREAMPLATFORM_FAULT": "during_outputs:1", "PYTHONPATH": TESTS},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = child.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the Spark JVM the killed driver left behind
    assert child.returncode == -signal.SIGKILL, output[-3000:]

    job = StreamingJob(clock_topology(source, sink), config, spark=spark, delta_sinks=[sink])
    results = job.run_until_caught_up()
    job.close()
    assert results[0].batch_id == 1 and results[0].replayed

    written = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/{sink}").collect()
    sink_times: dict[str, set[int]] = {}
    for row in written:
        value = json.loads(row.value)
        sink_times.setdefault(row.key.decode(), set()).add(value.get("seen_at", value.get("tick")))
    changelog = (
        spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_changelog")
        .where("store = 'seen-at'").collect()
    )  # fmt: skip
    state_times: dict[str, set[int]] = {}
    for row in changelog:
        key = Serdes.string().deserialize(row.key)
        if row.value is not None and not key.startswith("__streamplatform."):  # offset rows
            state_times.setdefault(key, set()).add(Serdes.long().deserialize(row.value))
    ticks = sink_times.pop("tick", set())
    assert ticks, "the wall-clock punctuator never fired: the test would prove nothing"
    assert ticks == state_times.pop("tick")  # the same punctuations, at the same times
    assert sink_times == state_times  # every record's time in the sink is its time in the state
    assert all(len(times) == 1 for times in sink_times.values())
