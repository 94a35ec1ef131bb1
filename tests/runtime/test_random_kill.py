"""A driver SIGKILLed at a random moment, then restarted, ends exactly where one clean run ends:
the same Delta output, DLQ mirror and changelog rows (batch by batch), and the same store
contents, byte for byte."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.state import IsolationLevel, TransactionalKeyValueStore

from .support import CRASHING_RUN, dedup_topology, job_config, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _run_clean(spark, config, source) -> float:
    started = time.monotonic()
    job = StreamingJob(dedup_topology(source, "deduplicated"), config, spark=spark,
                       delta_sinks=["deduplicated"])  # fmt: skip
    job.run_until_caught_up()
    job.close()
    return time.monotonic() - started


def _kill_at_random(config, source, delta_root: Path, seed: int, run_s: float) -> str:
    """Start the job in a child process; once it planned its first batch, SIGKILL its process
    group after a random part (from ``seed``) of ``run_s``, how long a clean run took. Returns
    what happened, for the failure message."""
    script = CRASHING_RUN.format(
        tests=os.path.dirname(os.path.dirname(__file__)), config=config, source=source
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    delay = random.Random(seed).uniform(0.05, 0.95) * run_s
    try:
        planned = delta_root / config["application.id"] / "_offsets" / "_delta_log"
        deadline = time.monotonic() + 240
        while not planned.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(delay)
        finished = child.poll() is not None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(60)
    return f"killed {delay:.2f}s after the first plan" + (" (it had finished)" if finished else "")


def _state(spark, root: Path, app: str, state_dir: Path) -> dict:
    """Everything the job leaves behind, in a comparable form."""

    def table(name, *order, drop=()):
        frame = spark.read.format("delta").load(str(root / app / name)).drop(*drop)
        return [tuple(r) for r in frame.orderBy(*order).collect()]

    commits = spark.read.format("delta").load(str(root / app / "_commits"))
    last = max(r.batch_id for r in commits.select("batch_id").collect())
    stores = {}
    for current in sorted((state_dir / app).rglob("CURRENT")):
        store = TransactionalKeyValueStore(current.parent, IsolationLevel.READ_COMMITTED)
        try:
            prepared = store.prepared_batch_id
            if prepared is not None:  # the last batch is prepared: settle it as a task would
                store.settle(prepared, committed=prepared <= last)
            stores[str(current.parent.relative_to(state_dir / app))] = list(store.range())
        finally:
            store.close()
    columns = ("batch_id", "source_partition", "source_offset")
    return {
        "last_batch": last,
        "output": table("deduplicated", *columns),
        "dlq": table("_dlq", *columns, drop=["topic"]),  # the runs' DLQ topics differ
        "changelog": table("_changelog", "batch_id", "task", "store", "seq"),
        "stores": stores,
    }


@pytest.mark.parametrize("seed", [3, 8])
@pytest.mark.child_process
def test_a_job_killed_at_a_random_moment_ends_exactly_like_a_clean_run(
    spark, kafka_settings, source_topic, tmp_path, seed
):
    source, _ = source_topic
    # Each run an application of its own: an application.id is also a consumer group, which
    # says how far its Kafka outputs are committed (the source topic is shared by the module).
    clean_app, killed_app = f"clean-{seed}", f"killed-{seed}"
    clean_config = job_config(kafka_settings, tmp_path / "clean", clean_app, source)
    run_s = _run_clean(spark, clean_config, source)
    clean = _state(spark, tmp_path / "clean" / "delta", clean_app,
                   tmp_path / "clean" / clean_app / "state")  # fmt: skip

    # A DLQ topic of its own: a read_committed reader sees each of its DLQ records once.
    dlq = f"{source}-dlq-killed-{seed}"
    create_topics(kafka_settings, [TopicSpec(dlq, 1)])
    config = job_config(kafka_settings, tmp_path / "killed", killed_app, source) | {
        "errors.dead.letter.queue.topic.name": dlq
    }
    what = _kill_at_random(config, source, tmp_path / "killed" / "delta", seed, run_s)
    print(f"seed {seed}: {what}")
    _run_clean(spark, config, source)  # the restart
    killed = _state(spark, tmp_path / "killed" / "delta", killed_app,
                    tmp_path / "killed" / killed_app / "state")  # fmt: skip

    assert [r.value for r in read_topic(kafka_settings, dlq)] == [b"{poison"] * 3, what
    assert clean["stores"], "the dedup job keeps state: there must be stores to compare"
    for part in ("last_batch", "output", "dlq", "changelog", "stores"):
        assert killed[part] == clean[part], f"{part} differs after the job was {what}"
