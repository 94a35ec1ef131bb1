"""The staged writes' ordered scans (state/overlay.py) against a plain dict sorted anew."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

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


# The overlay's keys in order through the C SortedKeys (when built) and through the reference.
SORTED_KEYS = [pytest.param(True, id="c-sorted-keys"), pytest.param(False, id="python-sorted-keys")]


@pytest.mark.parametrize("native", SORTED_KEYS)
@settings(max_examples=examples(300), deadline=None)
@given(operations=OPERATIONS)
def test_scans_see_the_staged_writes_in_order_with_small_chunks(operations, native):
    """Chunks of 2 keys: every insertion, removal and scan crosses chunk bounds and splits."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(overlay, "NATIVE_SORTED_KEYS", native and overlay.NATIVE_SORTED_KEYS)
        patch.setattr(overlay, "_CHUNK", 2)
        patch.setattr(overlay, "_INSERT_AT_MOST", 3)
        check(operations, Overlay("data"))


@pytest.mark.parametrize("native", SORTED_KEYS)
def test_a_scan_after_every_write_over_many_keys(native, monkeypatch):
    """A windowed aggregation's pattern: a write, a scan of a key's range, many times over,
    with removals; at the real chunk size, keys past several chunk splits."""
    monkeypatch.setattr(overlay, "NATIVE_SORTED_KEYS", native and overlay.NATIVE_SORTED_KEYS)
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


@pytest.mark.parametrize("native", SORTED_KEYS)
def test_sorted_keys_split_and_remove(native, monkeypatch):
    monkeypatch.setattr(overlay, "NATIVE_SORTED_KEYS", native and overlay.NATIVE_SORTED_KEYS)
    keys = overlay.sorted_keys([])
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


needs_c_sorted_keys = pytest.mark.skipif(
    not overlay.NATIVE_SORTED_KEYS,
    reason="the C SortedKeys is not built (STREAMPLATFORM_NO_C_CORE): the overlay runs the "
    "reference, which the tests above check",
)


@needs_c_sorted_keys
def test_the_overlay_uses_the_c_sorted_keys_when_built():
    staged = Overlay("data")
    staged.put(b"a", b"1")
    assert staged.sorted_items(None, None) == [(b"a", b"1")]
    assert type(staged._sorted).__module__ == "streamplatform.state._sorted_keys"


SORTED_KEY_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), KEYS, st.none()),
        st.tuples(st.just("insert_all"), st.lists(KEYS, max_size=6), st.none()),
        st.tuples(st.just("remove"), KEYS, st.none()),
        st.tuples(st.just("between"), st.one_of(st.none(), KEYS), st.one_of(st.none(), KEYS)),
        st.tuples(
            st.just("remove_between"), st.one_of(st.none(), KEYS), st.one_of(st.none(), KEYS)
        ),
    ),
    max_size=200,
)


@needs_c_sorted_keys
@settings(max_examples=examples(300), deadline=None)
@given(
    initial=st.lists(KEYS, max_size=20),
    chunk=st.integers(min_value=1, max_value=4),
    operations=SORTED_KEY_OPERATIONS,
)
def test_the_c_sorted_keys_answer_as_the_reference(initial, chunk, operations):
    """Every operation's result, and every key in order after it, from both; keys only
    inserted when not there (as the overlay does); small chunks so that splits and emptied
    chunks happen all the time."""
    from streamplatform.state._sorted_keys import SortedKeys as NativeSortedKeys

    keys = sorted(set(initial))
    c_keys, reference, present = NativeSortedKeys(keys, chunk), SortedKeys(keys, chunk), set(keys)
    for name, first, second in operations:
        if name == "insert":
            if first in present:
                continue
            present.add(first)
            assert c_keys.insert(first) is reference.insert(first) is None
        elif name == "insert_all":
            new = [key for key in dict.fromkeys(first) if key not in present]
            present.update(new)
            c_keys.insert_all(new)
            reference.insert_all(new)
        elif name == "remove":
            present.discard(first)
            assert c_keys.remove(first) == reference.remove(first)
        elif name == "remove_between":
            removed = reference.remove_between(first, second)
            assert c_keys.remove_between(first, second) == removed
            assert removed == [key for key in sorted(present)
                               if (first is None or key >= first)
                               and (second is None or key < second)]  # fmt: skip
            present.difference_update(removed)
        else:
            assert c_keys.between(first, second) == reference.between(first, second)
            writes = {key: key + b"!" for key in present}
            assert c_keys.items_between(first, second, writes) == reference.items_between(
                first, second, writes
            )
        assert c_keys.between(None, None) == reference.between(None, None) == sorted(present)


@needs_c_sorted_keys
def test_the_c_sorted_keys_refuse_what_is_not_bytes():
    from streamplatform.state._sorted_keys import SortedKeys as NativeSortedKeys

    keys = NativeSortedKeys([b"a"], 2)
    for call in (lambda: keys.insert("b"), lambda: keys.remove(1), lambda: keys.between("a", None),
                 lambda: keys.between(None, 2), lambda: keys.remove_between(None, "b"),
                 lambda: NativeSortedKeys(["a"], 2)):  # fmt: skip
        with pytest.raises(TypeError, match="must be bytes"):
            call()
    with pytest.raises(KeyError):
        keys.items_between(None, None, {})
    with pytest.raises(ValueError, match="chunk"):
        NativeSortedKeys([], 0)
    assert keys.between(None, None) == [b"a"]
