# The C extension's interface (_avro_core.c); fastavro's schemaless_reader is its reference and
# avro_program.py builds its programs.
from typing import Any

class Reader:
    def __init__(self, program: tuple) -> None: ...
    def read_all(
        self, datas: list[bytes | None], offset: int = 5, prefix: bytes | None = None
    ) -> list[Any] | None: ...
