# The C extension's interface (_task_loop.c); Task._process_all and sink_writers.sink_writer's
# write are its references.
from collections.abc import Callable, Iterable, Sequence
from typing import Any

def configure(
    undecoded: object,
    consumed_record: type,
    record: type,
    streams_error: type,
    deserialization: str,
    processing: str,
    stream_time: Any,
) -> None: ...
def process_all(
    task: Any,
    triples: Iterable[tuple[Any, Any, Any]],
    checks: Sequence[Callable[[], bool]],
    every: int,
) -> bool: ...
def serialize(
    format: int, serialize: Callable[[Any], Any], value: Any, windowed_types: Any
) -> Any: ...

class Writer:
    def __init__(
        self,
        *,
        task: Any,
        topic: str,
        serialize_key: Callable[[Any], Any],
        serialize_value: Callable[[Any], Any],
        as_read: frozenset[str],
        output: list[Any],
        sources: list[Any],
        sink_name: str,
        producer_record: type,
        no_source: Any,
        production: str,
        key_format: int = 0,
        value_format: int = 0,
        windowed_types: tuple[type, type] | None = None,
    ) -> None: ...
    def __call__(self, record: Any) -> None: ...

def decode_slice(
    records: list[Any],
    start: int,
    count: int,
    key_kind: int,
    value_kind: int,
    loads: Callable[[bytes], Any],
) -> list[tuple[Any, Any, Any]] | None: ...
def binary_buffers(
    rows: Sequence[tuple[Any, ...]], index: int
) -> tuple[int, bytes | None, bytes, bytes] | None: ...
def int64_buffer(rows: Sequence[tuple[Any, ...]], index: int) -> bytes | None: ...
