# The C extension's interface (_window_core.c); window_aggregate.WindowedAggregate is its
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
        stream_time: Any,
        stored_to: Any,
        task: Any,
        key_serialize: Callable[[Any], bytes | None],
        key_deserialize: Callable[[bytes], Any],
        string_keys: bool,
        initializer: Callable[[], Any] | None,
        aggregator: Callable[[Any, Any, Any], Any],
        count: bool,
        size: int,
        advance: int,
        grace: int,
        emit_final: bool,
        forward: Callable[[Record], None],
        record_type: type,
        windowed_type: type,
        window_type: type,
        sink_topic: str | None,
        sink_append: Callable[[Any], None] | None,
        sink_sources_append: Callable[[Any], None] | None,
        producer_type: type,
        no_source: tuple[Any, ...],
    ) -> None: ...
    def process(self, record: Record) -> None: ...
    def close_windows(self, record: Record | None, close: int) -> None: ...
