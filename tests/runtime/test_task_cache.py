"""Tasks kept open between batches (runtime/task_cache.py), without Spark: when a kept task is
used again, when it is closed, and how another process gets its stores."""

from __future__ import annotations

import json
import multiprocessing
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from streamplatform.config import StreamsConfig
from streamplatform.records import ConsumedRecord
from streamplatform.runtime import task_cache
from streamplatform.runtime.executor import ChangelogWrites, TaskBatchRunner
from streamplatform.runtime.task import Task
from streamplatform.state import IsolationLevel

from .support import stream_batch, ticking_topology


def _open(state_dir) -> Task:
    topology = ticking_topology("in", "out")
    config = StreamsConfig({"application.id": "cache", "processing.guarantee": "exactly_once_v2"})
    return Task(topology, topology.subtopologies[0], 0, config, state_dir, lambda topic: 1,
                isolation_level=IsolationLevel.READ_COMMITTED)  # fmt: skip


def _stores_open(task: Task) -> bool:
    return bool(task.stores) and not any(store.closed for store in task.stores.values())


@pytest.fixture(autouse=True)
def _nothing_kept():
    # Before too: a Spark test that never closed its job may have left a driver task kept in
    # this process, and these tests count what is kept.
    task_cache.close_all()
    yield
    task_cache.close_all()


def test_a_kept_task_is_taken_back_only_when_current_and_under_the_same_fingerprint(tmp_path):
    task = _open(tmp_path)
    assert task_cache.take(task.directory, "f1", lambda batch: True) is None  # nothing kept
    task_cache.keep(task, "f1", batch=4, idle_ms=60_000)
    assert task_cache.kept_tasks() == [str(task.directory)]
    asked = []
    assert task_cache.take(task.directory, "f1", lambda b: asked.append(b) or True) is task
    assert asked == [4]  # currency is judged on the batch the task last finished
    assert task_cache.kept_tasks() == []  # taken: the caller owns it now

    task_cache.keep(task, "f1", batch=5, idle_ms=60_000)
    assert task_cache.take(task.directory, "f1", lambda batch: False) is None
    assert not _stores_open(task)  # not current: closed, the next batch opens it anew

    other = _open(tmp_path)
    task_cache.keep(other, "f1", batch=6, idle_ms=60_000)
    assert task_cache.take(other.directory, "f2", lambda batch: True) is None  # code changed
    assert not _stores_open(other)


def test_a_kept_task_whose_state_dir_was_wiped_is_not_taken(tmp_path):
    task = _open(tmp_path)
    task_cache.keep(task, "f", batch=0, idle_ms=60_000)
    shutil.rmtree(task.directory)  # the disk was wiped under the open stores
    assert task_cache.take(task.directory, "f", lambda batch: True) is None
    assert task_cache.kept_tasks() == []  # dropped (RocksDB cannot even close it cleanly)


def test_idle_ms_zero_closes_at_once_and_an_idle_task_is_closed(tmp_path):
    task = _open(tmp_path)
    task_cache.keep(task, "f", batch=0, idle_ms=0)
    assert not _stores_open(task) and task_cache.kept_tasks() == []

    task = _open(tmp_path)
    task_cache.keep(task, "f", batch=0, idle_ms=50)
    deadline = time.monotonic() + 10
    while _stores_open(task) and time.monotonic() < deadline:  # closed after leaving the list
        time.sleep(0.01)
    assert task_cache.kept_tasks() == [] and not _stores_open(task)


def _keep_in_child(state_dir, ready, done) -> None:
    task = _open(state_dir)
    task.process(ConsumedRecord("in", 0, 0, 1_000, b"k", b"{}", []))
    task.commit()
    task_cache.keep(task, "f", batch=0, idle_ms=600_000)  # idle far longer than the test
    ready.set()
    done.wait(60)


def test_another_process_gets_the_stores_of_a_kept_task(tmp_path):
    """A Spark Python worker keeps the task; Spark gives its next batch to another worker
    (or a test reads the store): the holder lets go at once when asked, instead of making
    the other wait out StoreOptions.open_timeout_s and fail."""
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Event()
    child = context.Process(target=_keep_in_child, args=(tmp_path, ready, done))
    child.start()
    try:
        assert ready.wait(60), "the child did not keep its task"
        started = time.monotonic()
        task = _open(tmp_path)  # StoreLockedError without the release
        waited = time.monotonic() - started
        try:
            assert task.stores["counts"].get(b"k") == b"1"  # the child's committed write
            assert task.stream_time == 1_000  # committed with the stores
        finally:
            task.close()
        assert waited < 10  # what StoreOptions.open_timeout_s would have let it wait
        assert child.is_alive()  # it let go of the task, not of its life
    finally:
        done.set()
        child.join(30)


def _tick(task: Task, timestamp: int, offset: int) -> list[tuple[str, str]]:
    task.process(ConsumedRecord("in", 0, offset, timestamp, b"k", b"{}", []))
    task.take_output_sources()
    return [(record.key, record.value) for record in task.take_output()]


def test_stream_time_punctuations_follow_kafka_streams_schedule_across_reopens(tmp_path):
    """The first record fires a stream-time punctuator; later ones fire when stream time
    reaches the next multiple of the interval (missed ones are skipped). A task opened again
    over the same stores goes on with its stream time and schedule."""
    task = _open(tmp_path)
    fired = [_tick(task, t, offset) for offset, t in enumerate((500, 9_999, 10_000, 35_000))]
    assert [len([1 for key, _ in out if key == b"stream"]) for out in fired] == [1, 0, 1, 1]
    task.commit()
    task.close()

    reopened = _open(tmp_path)
    assert reopened.stream_time == 35_000
    fired = [_tick(reopened, t, 4 + i) for i, t in enumerate((35_500, 39_999, 40_000))]
    # Opened anew without its schedule, it would fire again at 35_500.
    assert [len([1 for key, _ in out if key == b"stream"]) for out in fired] == [0, 0, 1]
    reopened.close()


class _Batches:
    """Drives one task through batches the way StreamingJob does, in this process:
    TaskBatchRunner.run_partition on each batch's records, the commit recorded, the next batch
    planned from where the task stopped."""

    def __init__(self, topology, state_dir, idle_ms: int, limit: int | None) -> None:
        self.topology, self.state_dir, self.idle_ms, self.limit = (
            topology,
            state_dir,
            idle_ms,
            limit,
        )
        self.batch_id, self.position = 0, 0
        self.runs = ChangelogWrites(0, {})
        self.reused = 0

    def runner(self) -> TaskBatchRunner:
        settings = {
            "application.id": "differential", "bootstrap.servers": "unused:9092",
            "processing.guarantee": "exactly_once_v2", "state.dir": str(self.state_dir),
            "platform.task.cache.idle.ms": self.idle_ms,
            "statestore.uncommitted.max.records": self.limit,
            "default.deserialization.exception.handler": "log_and_continue",
            "errors.dead.letter.queue.topic.name": "in-dlq",
        }  # fmt: skip
        return TaskBatchRunner(
            self.topology, settings, self.batch_id,
            self.batch_id - 1 if self.batch_id else None, {}, {"in": 1, "out": 1},
            stream_topic="in", fingerprint="f", task_runs=self.runs,
        )  # fmt: skip

    def run(self, records: list[tuple], fail_after: int | None) -> list[tuple]:
        """One batch over ``records[position:]`` (at most 50); with ``fail_after``, an attempt
        stopped after that many output batches first, then the batch again."""
        planned = records[self.position : self.position + 50]
        arrow = stream_batch(planned)
        if fail_after is not None:  # the attempt dies: Spark stops reading its output
            attempt = self.runner().run_partition(iter([arrow]))
            for _ in range(fail_after):
                next(attempt, None)
            attempt.close()
        output = pa.Table.from_batches(list(self.runner().run_partition(iter([arrow]))))
        rows = output.to_pylist()
        (progress,) = [json.loads(r["value"]) for r in rows if r["kind"] == "progress"]
        self.reused += progress["metrics"]["tasks_reused"]
        self.position = progress["consumed"][0][2] if progress["cut"] else self.position + len(
            planned)  # fmt: skip
        self.runs.last_run["0_0"] = self.batch_id  # committed
        self.batch_id += 1
        numbers = {
            name: value for name, value in progress["metrics"].items()
            if not name.endswith("_ms") and name not in ("tasks_reused", "tasks_opened")
        }  # fmt: skip
        return [numbers] + [(r["topic"], r["key"], r["value"], r["source_offset"])
                            for r in rows if r["kind"] in ("sink", "dlq")]  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_a_kept_task_and_one_opened_every_batch_give_the_same_outputs_and_state(tmp_path, seed):
    """Differential: the same batches, cut early by a small uncommitted limit and with
    attempts that die half-way, through a task kept open between batches and through one
    opened anew every batch, give the same outputs and numbers batch for batch and the same
    stores."""
    from .support import dedup_topology

    rng = random.Random(seed)
    records, timestamp = [], 0
    for offset in range(600):
        timestamp += rng.choice((0, 500, 2_000, 40_000))
        value = b"{poison" if rng.random() < 0.01 else json.dumps(
            {"id": f"id-{rng.randrange(80)}", "n": offset}).encode()  # fmt: skip
        records.append((offset, timestamp, f"k{rng.randrange(3)}".encode(), value))
    failures = {rng.randrange(20): rng.randrange(3) for _ in range(4)}
    limit = rng.choice((None, 7))
    outputs, stores = {}, {}
    for mode, idle_ms in (("kept", 60_000), ("opened", 0)):
        topology = dedup_topology("in", "out")
        batches = _Batches(topology, tmp_path / mode, idle_ms, limit)
        outputs[mode] = []
        while batches.position < len(records):
            outputs[mode].append(batches.run(records, failures.get(batches.batch_id)))
        assert (batches.reused > 0) == (mode == "kept")
        task_cache.close_all()
        task = Task(topology, topology.subtopologies[0], 0,
                    StreamsConfig({"application.id": "differential"}), tmp_path / mode,
                    lambda topic: 1, isolation_level=IsolationLevel.READ_COMMITTED)  # fmt: skip
        for store in task.stores.values():
            if store.prepared_batch_id is not None:  # the last batch: committed
                store.settle(store.prepared_batch_id, committed=True)
        stores[mode] = {name: list(store.range()) for name, store in task.stores.items()}
        task.close()
    assert outputs["kept"] == outputs["opened"]
    assert stores["kept"] == stores["opened"]
    assert sum(len(batch) - 1 for batch in outputs["kept"]) > 100


KEEP_AND_EXIT = """
import atexit, threading
def watcher_left():  # registered first, so it runs after the library's exit handlers
    left = [t.name for t in threading.enumerate() if t.name == "streamplatform-task-cache"]
    print("watchers left at teardown:", left, flush=True)
atexit.register(watcher_left)
import logging, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s: %(message)s")
from runtime.support import ticking_topology
from streamplatform.config import StreamsConfig
from streamplatform.runtime import task_cache
from streamplatform.runtime.task import Task
from streamplatform.state import IsolationLevel

topology = ticking_topology("in", "out")
config = StreamsConfig({{"application.id": "cache", "processing.guarantee": "exactly_once_v2"}})
task = Task(topology, topology.subtopologies[0], 0, config, Path({state!r}), lambda topic: 1,
            isolation_level=IsolationLevel.READ_COMMITTED)
task_cache.keep(task, "f", batch=0, idle_ms=600_000)
print("kept, exiting", flush=True)
"""


def test_a_task_kept_when_the_process_exits_is_closed_while_the_interpreter_works(tmp_path):
    """A driver or worker that ends with tasks kept closes them at exit (atexit), their stores
    in order, not whenever the interpreter's final teardown reaches their objects."""
    tests = str(Path(__file__).parents[1])
    script = KEEP_AND_EXIT.format(tests=tests, state=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    kept_at = done.stdout.index("kept, exiting")
    assert "Closing kept task 0_0: closing all" in done.stdout[kept_at:], done.stdout
    # The watcher thread (which closes idle tasks: native RocksDB code) is stopped before the
    # teardown, which could end it in the middle of that code.
    assert "watchers left at teardown: []" in done.stdout[kept_at:], done.stdout
