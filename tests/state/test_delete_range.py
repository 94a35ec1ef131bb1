"""KeyValueTransaction.delete_range, delete_each and keys against their references: ``delete``
of each key ``range`` gives, ``delete`` of each key given, and the keys ``range`` gives, in the same transaction state (staged puts,
staged deletes, keys put after a read as absent, committed keys, commits between), under both
isolation levels."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform.state import IsolationLevel, TransactionalKeyValueStore, overlay
from streamplatform.state.overlay import Overlay

KEYS = st.sampled_from([b"", b"a", b"a\x00", b"ab", b"b", b"ba", b"c", b"\xff", b"\xff\xff"])
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.binary(max_size=3)),
        st.tuples(st.just("delete"), KEYS, st.none()),
        st.tuples(st.just("get"), KEYS, st.none()),  # a miss then a put: the key is "fresh"
        st.tuples(st.just("range"), KEYS, KEYS),
        st.tuples(st.just("delete_range"), KEYS, KEYS),
        st.tuples(st.just("delete_each"), st.lists(KEYS, unique=True, max_size=4), st.none()),
        st.tuples(st.just("commit"), st.none(), st.none()),
    ),
    max_size=40,
)
ISOLATION = [
    pytest.param(IsolationLevel.READ_COMMITTED, id="read-committed"),
    pytest.param(IsolationLevel.READ_UNCOMMITTED, id="read-uncommitted"),
]
SORTED_KEYS = [pytest.param(True, id="c-sorted-keys"), pytest.param(False, id="python-sorted-keys")]


def deleted_one_by_one(transaction, start: bytes, end: bytes) -> int:
    keys = [key for key, _ in transaction.range(start, end)]
    for key in keys:
        transaction.delete(key)
    return len(keys)


def observed(store) -> tuple:
    """What the two stores must agree on: the transaction's view, what its commit would write
    (and log), its uncommitted counts, and the committed data."""
    transaction = store.transaction
    return (
        list(transaction.range(None, None)),
        sorted(transaction.staged_entries()),
        store.approximate_num_uncommitted_entries(),
        store.approximate_num_uncommitted_bytes(),
        list(store.range(None, None)),
    )


@pytest.mark.parametrize("native", SORTED_KEYS)
@pytest.mark.parametrize("isolation", ISOLATION)
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS)
def test_delete_range_and_delete_each_do_what_deleting_each_key_does(operations, isolation, native):
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as directory:
        patch.setattr(overlay, "NATIVE_SORTED_KEYS", native and overlay.NATIVE_SORTED_KEYS)
        patch.setattr(overlay, "_CHUNK", 2)  # every removal crosses chunk bounds
        ranged = TransactionalKeyValueStore(Path(directory) / "ranged", isolation)
        reference = TransactionalKeyValueStore(Path(directory) / "reference", isolation)
        try:
            for step, (name, first, second) in enumerate(operations):
                for store in (ranged, reference):
                    transaction = store.transaction
                    if name == "put":
                        transaction.put(first, second)
                    elif name == "delete":
                        transaction.delete(first)
                    elif name == "get":
                        if transaction.get(first) is None:
                            transaction.put(first, b"new")
                    elif name == "range":  # range puts the staged keys in order, keys not
                        if store is ranged:  # keys before any order, then after
                            keys = transaction.keys(first, second)
                            assert keys == [key for key, _ in transaction.range(first, second)]
                        else:
                            keys = [key for key, _ in transaction.range(first, second)]
                        assert transaction.keys(first, second) == keys
                    elif name == "delete_each":
                        if store is ranged:
                            transaction.delete_each(first)
                        else:
                            for key in first:
                                transaction.delete(key)
                    elif name == "commit":
                        store.commit({("input", 0): step})
                counts = None
                if name == "delete_range":
                    counts = (ranged.transaction.delete_range(first, second),
                              deleted_one_by_one(reference.transaction, first, second))  # fmt: skip
                    assert counts[0] == counts[1]
                assert observed(ranged) == observed(reference), (step, name, first, second)
            ranged.commit({("input", 0): len(operations)})
            reference.commit({("input", 0): len(operations)})
            assert list(ranged.range(None, None)) == list(reference.range(None, None))
        finally:
            ranged.close()
            reference.close()


def test_a_range_of_keys_put_after_reads_as_absent_leaves_the_transaction():
    """A window store's segment written and dropped within one transaction: its keys, each
    put after a read found nothing, leave the transaction; nothing is written or logged for
    them. A committed key in the range gets a staged delete."""
    with tempfile.TemporaryDirectory() as directory:
        store = TransactionalKeyValueStore(Path(directory) / "store", IsolationLevel.READ_COMMITTED)
        try:
            store.transaction.put(b"w1-committed", b"old")
            store.commit({("input", 0): 1})
            transaction = store.transaction
            for key in (b"w1-a", b"w1-b", b"w2-a"):
                assert transaction.get(key) is None
                transaction.put(key, b"value")
            assert transaction.delete_range(b"w1", b"w2") == 3
            assert sorted(transaction.staged_entries()) == [
                ("data", b"w1-committed", None),
                ("data", b"w2-a", b"value"),
            ]
            assert list(transaction.range(None, None)) == [(b"w2-a", b"value")]
            # counted as the deletes they replaced: the limits cut batches as before
            assert store.approximate_num_uncommitted_entries() == 4
        finally:
            store.close()


@pytest.mark.parametrize("native", SORTED_KEYS)
@settings(max_examples=examples(200), deadline=None)
@given(
    keys=st.lists(KEYS, unique=True),
    puts=st.lists(st.booleans()),
    start=KEYS,
    end=KEYS,
    unstage=st.sets(KEYS),
    ordered=st.booleans(),
    late=st.lists(KEYS, max_size=3),
)
def test_the_overlay_deletes_a_range_of_staged_writes(
    keys, puts, start, end, unstage, ordered, late, native
):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(overlay, "NATIVE_SORTED_KEYS", native and overlay.NATIVE_SORTED_KEYS)
        patch.setattr(overlay, "_CHUNK", 2)
        staged = Overlay("data")
        model: dict[bytes, bytes | None] = {}
        for key, put in zip(keys, puts + [True] * len(keys), strict=False):
            staged.put(key, key + b"!" if put else None)
            model[key] = key + b"!" if put else None
        if ordered:  # the staged keys in order before (and some added after), or never ordered
            staged.sorted_items(None, None)
            for key in late:
                if key not in model:
                    staged.put(key, key + b"?")
                    model[key] = key + b"?"
        in_range = [key for key in sorted(model) if start <= key < end and model[key] is not None]
        turned, gone = staged.delete_between(start, end, unstage)
        assert sorted(gone) == [key for key in in_range if key in unstage]
        assert sorted(turned) == [key for key in in_range if key not in unstage]
        for key in gone:
            del model[key]
        for key in turned:
            model[key] = None
        assert staged.sorted_items(None, None) == sorted(model.items())
        assert staged.num_bytes == sum(len(k) + len(v or b"") for k, v in model.items())
