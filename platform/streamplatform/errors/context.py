"""ErrorHandlerContext: where a failed record came from (KIP-1033, with KIP-1034's raw bytes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamplatform.records import Headers


@dataclass(frozen=True)
class ErrorHandlerContext:
    """The source coordinates of a failure.

    ``source_raw_key`` / ``source_raw_value`` are the bytes of the record that entered the
    sub-topology (after a repartition, the repartitioned record), not the failing processor's
    input. They, and topic/partition/offset, are None (offsets -1) under a punctuation; the raw
    bytes are None in the production handler.
    """

    topic: str | None
    partition: int
    offset: int
    timestamp: int
    processor_node_name: str
    task_id: str
    headers: Headers = field(default_factory=list)
    source_raw_key: bytes | None = None
    source_raw_value: bytes | None = None
