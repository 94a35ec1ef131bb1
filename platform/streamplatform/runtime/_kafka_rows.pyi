# The C extension's interface (_kafka_rows.c); kafka_input.append_rows is its reference.
from typing import Any

def append_rows(
    messages: list[Any], topic: str, partition: int, end: int, rows: list[Any], no_headers: Any
) -> int: ...
def partition_for(key: bytes, partitions: int) -> int: ...
