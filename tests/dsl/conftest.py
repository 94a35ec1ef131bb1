"""What the tests of the C cores share (tests/dsl/test_*_core.py)."""

from __future__ import annotations

import pytest


class HeldSerde:
    """Decodes to objects the test holds (made at run time: neither interned nor shared), so
    that the keys, values and ids a processor is handed are objects whose references it
    counts."""

    name = "held"

    def __init__(self, decoded: dict) -> None:
        self.decoded = decoded
        self.encoded = {id(value): data for data, value in decoded.items()}

    def serialize(self, value):
        return None if value is None else self.encoded[id(value)]

    def deserialize(self, data):
        return None if data is None else self.decoded[data]


@pytest.fixture
def held_serde() -> type[HeldSerde]:
    """A serde decoding to objects the test holds: a leak test counts their references."""
    return HeldSerde
