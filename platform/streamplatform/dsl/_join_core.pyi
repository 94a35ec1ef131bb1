# The C extension's interface (_join_core.c); stream_join.StreamStreamJoinSide is its
# reference.
from collections.abc import Callable, Iterator
from typing import Any

from streamplatform.records import Record

class Core:
    def __init__(
        self,
        *,
        processor: Any,
        own: Any,
        outer: Any,
        own_observed: Any,
        others_observed: Any,
        stream_time: Any,
        own_get: Callable[[bytes], bytes | None],
        own_put: Callable[[bytes, bytes | None], None],
        others_get: Callable[[bytes], bytes | None],
        outer_get: Callable[[bytes], bytes | None] | None,
        outer_put: Callable[[bytes, bytes | None], None] | None,
        outer_delete: Callable[[bytes], None] | None,
        outer_prefix: Callable[[bytes], Iterator[tuple[bytes, bytes]]] | None,
        key_serialize: Callable[[Any], bytes | None],
        key_deserialize: Callable[[bytes], Any],
        value_serialize: Callable[[Any], bytes | None],
        other_deserialize: Callable[[bytes], Any],
        left_deserialize: Callable[[bytes], Any],
        right_deserialize: Callable[[bytes], Any],
        joiner: Callable[[Any, Any, Any], Any],
        forward: Callable[[Record], None],
        record_type: type,
        key_kind: int,
        value_kind: int,
        other_kind: int,
        left_kind: int,
        right_kind: int,
        join_before: int,
        join_after: int,
        before: int,
        after: int,
        grace: int,
        retention: int,
        segment: int,
        is_left: bool,
        outer_side: bool,
    ) -> None: ...
    def process(self, record: Record) -> None: ...
