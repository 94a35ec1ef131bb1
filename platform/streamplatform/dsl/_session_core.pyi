# The C extension's interface (_session_core.c); session_aggregate.SessionWindowAggregate is its
# reference.
from collections.abc import Callable
from typing import Any

from streamplatform.records import Record

class Core:
    def __init__(
        self,
        *,
        aggregation: Any,
        cache: Any,
        store: Any,
        stream_time: Any,
        store_time: Any,
        emitted_to: Any,
        task: Any,
        key_serialize: Callable[[Any], bytes | None],
        key_deserialize: Callable[[bytes], Any],
        string_keys: bool,
        result_deserialize: Callable[[bytes], Any],
        initializer: Callable[[], Any] | None,
        aggregator: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
        count: bool,
        gap: int,
        grace: int,
        retention: int,
        emit_final: bool,
        forward: Callable[[Record], None],
        record_type: type,
        windowed_type: type,
        window_type: type,
        result_serialize: Callable[[Any], bytes | None],
        long_results: bool,
        memory_bytes: int,
        sink_topic: str | None,
        sink_append: Callable[[Any], None] | None,
        sink_sources_append: Callable[[Any], None] | None,
        producer_type: type,
        no_source: tuple[Any, ...],
    ) -> None: ...
    def process(self, record: Record) -> None: ...
    def write_held(self, below: int) -> None: ...

def transaction_put(transaction: Any, key: bytes, value: bytes | None) -> None:
    """transaction.put(key, value), its common case in C (_cores.h); for the tests."""
