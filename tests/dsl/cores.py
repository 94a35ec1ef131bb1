"""What the C cores' differential tests (test_window_core.py, test_session_core.py,
test_sliding_core.py) share: one task of a one-processor topology, as Spark's executors make
it, and its processor."""

from __future__ import annotations

from typing import Any

from streamplatform.config import StreamsConfig
from streamplatform.records import ConsumedRecord
from streamplatform.runtime.task import Task

# (kind, on window close, string keys, whether the core writes to the sink itself): only a
# count's final results, whatever the key serde, go to the sink without a Record.
DIRECT_SINK_CASES = [
    ("count", True, True, True), ("count", True, False, True), ("count", False, True, False),
    ("reduce", True, True, False), ("aggregate", True, False, False),
]  # fmt: skip


def core_task(directory: Any, topology: Any, cache_bytes: int) -> Task:
    """A task of ``topology``'s only sub-topology (exactly once, DLQ on, processing errors
    logged and skipped), its record cache ``cache_bytes``."""
    config = StreamsConfig({
        "application.id": "core", "processing.guarantee": "exactly_once_v2",
        "errors.dead.letter.queue.topic.name": "dlq",
        "processing.exception.handler": "log_and_continue",
        "statestore.cache.max.bytes": cache_bytes,
    })  # fmt: skip
    return Task(topology, topology.subtopologies[0], 0, config, directory, lambda topic: 1)


def only_processor(task: Task) -> Any:
    (processor,) = task.processors.values()
    return processor


def final_counts_written(directory: Any, topology: Any, timestamps: list[int]
                         ) -> tuple[bool, list[tuple[bytes, bytes, int]]]:  # fmt: skip
    """Records of key b"k" at ``timestamps`` through a task of ``topology`` (no record cache),
    committed: whether its core writes to the sink itself, and the (key, value, timestamp) of
    the sink records written."""
    task = core_task(directory, topology, 0)
    try:
        processor = only_processor(task)
        direct = processor.emit_final and processor._direct_sink(processor.context) is not None
        for offset, timestamp in enumerate(timestamps):
            task.process(ConsumedRecord("in", 0, offset, timestamp, b"k", b"x", []))
        task.commit()
        return direct, [(r.key, r.value, r.timestamp) for r in task.take_output()]
    finally:
        task.close()
