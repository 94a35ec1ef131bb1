# The C extension's interface (_table_join_core.c); table_join.TableJoinSide is its reference.
from collections.abc import Callable
from typing import Any

from streamplatform.records import Record

class Core:
    def __init__(
        self,
        *,
        processor: Any,
        store: Any,
        kind: int,
        left: bool,
        key_serialize: Callable[[Any], bytes | None],
        own_serialize: Callable[[Any], bytes | None],
        other_deserialize: Callable[[bytes], Any],
        joiner: Callable[[Any, Any, Any], Any],
        drops_unchanged: bool,
        forward: Callable[[Record], None],
        record_type: type,
        pack: Callable[[int], bytes],
        unpack_from: Callable[[bytes], tuple[int]],
    ) -> None: ...
    def process(self, record: Record) -> None: ...
