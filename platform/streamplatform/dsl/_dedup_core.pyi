# The C extension's interface (_dedup_core.c); dedup._DedupCore is its reference.
from collections import deque
from collections.abc import Callable
from typing import Any

from streamplatform.records import Record

MemoryKey = str | tuple[str, str] | bytes
Entry = tuple[int, int]

def handed_over(
    pending: dict[MemoryKey, Entry | None],
    in_store: set[MemoryKey],
    store_key: Callable[[MemoryKey], bytes],
) -> list[tuple[bytes, bytes | None]]: ...

class Core:
    forwarded: int
    dropped: int
    late: int
    pending_entries: int
    pending_bytes: int
    purge_after: int
    entries: dict[MemoryKey, Entry]
    pending: dict[MemoryKey, Entry | None]
    in_store: set[MemoryKey]
    in_order: deque[tuple[int, MemoryKey, Entry]]
    expiry: list[tuple[int, int, MemoryKey, Entry]]
    lookup: Callable[[MemoryKey], Entry | None] | None
    def __init__(
        self,
        *,
        interval: int,
        purge_slack: int,
        purge_after: int,
        id_of: Callable[[Any, Any], Any],
        per_key: bool,
        forward: Callable[[Record], None],
        task: Any,
        memory_key: Callable[[Any], MemoryKey],
        entries: dict[MemoryKey, Entry],
        in_order: deque[tuple[int, MemoryKey, Entry]],
        in_store: set[MemoryKey],
    ) -> None: ...
    def process(self, record: Record) -> None: ...
    def purge(self, horizon: int) -> None: ...
