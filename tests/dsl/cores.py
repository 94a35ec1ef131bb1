"""What the C cores' differential tests (test_window_core.py, test_session_core.py,
test_sliding_core.py) share: one task of a one-processor topology, as Spark's executors make
it, and its processor."""

from __future__ import annotations

from typing import Any

from streamplatform.config import StreamsConfig
from streamplatform.runtime.task import Task


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
