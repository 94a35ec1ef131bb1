"""`rewind`: a job ran 10 batches with a bug; it is rewound to batch 4 (the first attempt
SIGKILLed half-way, at a deterministic point, and the job refusing to start until the rewind
is run again), then the fixed job runs: its Delta sink and its store's totals equal those of a
job that ran the buggy code for batches 0-4 and the fixed code from batch 5 on, exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from streamplatform import StreamsBuilder
from streamplatform.config import ConfigError
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.runtime.rewind import RewindUnfinishedError
from streamplatform.serdes import Serdes

from .support import job_config

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]
TESTS = str(Path(__file__).parents[1])


def totals(source: str, sink: str, fixed: bool):
    """Each key's running total of its records' numbers; the buggy version counts them ten
    times over. The same operators either way: only the code of map_values differs."""
    factor = 1 if fixed else 10
    b = StreamsBuilder()
    (b.stream(source, Serdes.string(), Serdes.string())
     .map_values(lambda v: str(int(v) * factor))
     .group_by_key()
     .reduce(lambda a, b: str(int(a) + int(b)))
     .to_stream().to(sink))  # fmt: skip
    return b.build()


CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from runtime.test_rewind import totals
    from streamplatform.runtime.microbatch import StreamingJob
    spec = json.loads(sys.argv[1])
    job = StreamingJob(totals(spec["source"], "totals", fixed=False), spec["config"],
                       delta_sinks=["totals"])
    job.rewind(4)
""")


def _run(config, source, fixed, spark, max_batches=None):
    job = StreamingJob(totals(source, "totals", fixed), config, spark=spark, delta_sinks=["totals"])
    try:
        return job.run(max_batches)
    finally:
        job.close()


def _sink(spark, config) -> list[tuple]:
    path = f"{config['platform.delta.root']}/{config['application.id']}/totals"
    rows = spark.read.format("delta").load(path).collect()
    return sorted((r.source_offset, r.key, r.value, r.batch_id) for r in rows)


@pytest.mark.child_process
def test_rewind_then_the_fixed_job_equals_a_run_fixed_from_the_next_batch_on(
    spark, kafka_settings, tmp_path
):
    source = f"in-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_settings, [TopicSpec(source, 1), TopicSpec(f"{source}-dlq", 1)])
    writer = producer(kafka_settings)
    for n in range(20):
        writer.produce(source, key=f"k{n % 3}", value=str(n), timestamp=1_000 + n)
    assert writer.flush(30) == 0
    cap = {"platform.max.records.per.batch": 2}  # ten batches of two records
    config = job_config(kafka_settings, tmp_path, f"rewind-{uuid.uuid4().hex[:6]}", source, **cap)
    reference = job_config(kafka_settings, tmp_path, f"ref-{uuid.uuid4().hex[:6]}", source, **cap)

    assert len(_run(config, source, fixed=False, spark=spark)) == 10
    job = StreamingJob(totals(source, "totals", False), config, spark=spark, delta_sinks=["totals"])
    with pytest.raises(ConfigError, match="batch 9 is the last"):
        job.rewind(12)
    job.close()

    # The first rewind is killed after the tables went back, before the commit log did.
    env = os.environ | {"STREAMPLATFORM_FAULT": "rewind_tables:4"}
    child = subprocess.run([sys.executable, "-c", CHILD.format(tests=TESTS),
                            json.dumps({"source": source, "config": config})],
                           env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert child.returncode == -9, child.stderr[-3000:]
    job = StreamingJob(totals(source, "totals", True), config, spark=spark, delta_sinks=["totals"])
    try:
        with pytest.raises(RewindUnfinishedError, match="run `streamplatform rewind` again"):
            job.run_batch()
        report = job.rewind(4)  # again: it finishes
    finally:
        job.close()
    assert report.to_batch == 4 and report.group_offsets == {(source, 0): 10}
    assert _run(config, source, fixed=True, spark=spark)[0].batch_id == 5

    assert len(_run(reference, source, fixed=False, spark=spark, max_batches=5)) == 5
    _run(reference, source, fixed=True, spark=spark)
    got, want = _sink(spark, config), _sink(spark, reference)
    assert got == want
    # The stores were rewound with the rest: batch 5's totals build on batch 4's, not on the
    # buggy totals of batches 5-9 (the tasks' local state was of the old incarnation).
    last = {key: int(value) for _, key, value, _ in got}
    assert last == {b"k0": (0 + 3 + 6 + 9) * 10 + (12 + 15 + 18),
                    b"k1": (1 + 4 + 7) * 10 + (10 + 13 + 16 + 19),
                    b"k2": (2 + 5 + 8) * 10 + (11 + 14 + 17)}  # fmt: skip
