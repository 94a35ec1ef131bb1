"""The staged writes' ordered scans (state/overlay.py) against a plain dict sorted anew."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamplatform.state import overlay
from streamplatform.state.overlay import Overlay, SortedKeys

KEYS = st.binary(min_size=0, max_size=2)  # short keys: many collisions, prefixes, b"\xff"s
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.one_of(st.none(), st.binary(max_size=2))),
        st.tuples(st.just("discard"), KEYS, st.none()),
        st.tuples(st.just("scan"), st.one_of(st.none(), KEYS), st.one_of(st.none(), KEYS)),
        # put_all: pairs that may repeat a key or hit staged ones; discard_all: of staged keys
        st.tuples(st.just("put_all"), st.lists(st.tuples(KEYS, st.binary(max_size=2))), st.none()),
        st.tuples(st.just("discard_all"), st.lists(KEYS), st.none()),
    ),
    max_size=300,
)


def expected(model: dict[bytes, bytes | None], start, end) -> list:
    return [(k, model[k]) for k in sorted(model)
            if (start is None or k >= start) and (end is None or k < end)]  # fmt: skip


def check(operations, staged: Overlay) -> None:
    model: dict[bytes, bytes | None] = {}
    for name, first, second in operations:
        if name == "put":
            staged.put(first, second)
            model[first] = second
        elif name == "discard":
            staged.discard(first)
            model.pop(first, None)
        elif name == "put_all":
            staged.put_all(first)
            model.update(first)
        elif name == "discard_all":
            keys = list(dict.fromkeys(key for key in first if key in model))
            staged.discard_all(keys)
            for key in keys:
                del model[key]
        else:
            assert staged.sorted_items(first, second) == expected(model, first, second)
        assert len(staged) == len(model)
        assert staged.num_bytes == sum(len(k) + len(v or b"") for k, v in model.items())
    assert staged.sorted_items(None, None) == expected(model, None, None)


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_scans_see_the_staged_writes_in_order_with_small_chunks(operations):
    """Chunks of 2 keys: every insertion, removal and scan crosses chunk bounds and splits."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(overlay, "_CHUNK", 2)
        patch.setattr(overlay, "_INSERT_AT_MOST", 3)
        check(operations, Overlay("data"))


def test_a_scan_after_every_write_over_many_keys():
    """A windowed aggregation's pattern: a write, a scan of a key's range, many times over,
    with removals; at the real chunk size, keys past several chunk splits."""
    rng = random.Random(7)
    staged, model = Overlay("data"), {}
    for step in range(6000):
        key = rng.randrange(4000).to_bytes(4, "big")
        if rng.random() < 0.1 and model:
            gone = rng.choice(list(model))
            staged.discard(gone)
            del model[gone]
        else:
            staged.put(key, None if rng.random() < 0.2 else bytes([step % 256]))
            model[key] = staged.writes[key]
        low = rng.randrange(4000)
        start, end = low.to_bytes(4, "big"), (low + rng.randrange(50)).to_bytes(4, "big")
        assert staged.sorted_items(start, end) == expected(model, start, end)
    assert staged.sorted_items(None, None) == expected(model, None, None)


def test_sorted_keys_split_and_remove():
    keys = SortedKeys([])
    for number in range(2000, 0, -1):  # each at the front: the first chunk splits again and again
        keys.insert(number.to_bytes(2, "big"))
    assert keys.between(None, None) == [n.to_bytes(2, "big") for n in range(1, 2001)]
    assert keys.remove((5).to_bytes(2, "big")) and not keys.remove((5).to_bytes(2, "big"))
    assert not keys.remove((3000).to_bytes(2, "big"))
    for number in range(1, 2001):
        keys.remove(number.to_bytes(2, "big"))
    assert keys.between(None, None) == []
    keys.insert(b"x")
    assert keys.between(b"a", b"y") == [b"x"] and keys.between(b"y", None) == []
