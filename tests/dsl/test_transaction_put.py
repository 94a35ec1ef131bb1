"""The C cores' transaction put (dsl/_cores.h, ``transaction_put``) against the reference,
KeyValueTransaction.put: the same sequence of puts, deletes, reads, scans and commits on two
stores, one staging through each, leaves the same staged writes, counters, order and
committed data after every step. The C side does the common case itself and calls the
reference for the rest (a key just read as absent, a fresh key's delete, READ_UNCOMMITTED,
a closed transaction), so the sequences mix them all."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform.records import TopicPartition
from streamplatform.state import IsolationLevel, TransactionalKeyValueStore
from streamplatform.state.transaction import KeyValueTransaction

try:
    from streamplatform.dsl._sliding_core import transaction_put
except ImportError:  # pragma: no cover - depends on the build
    transaction_put = None

pytestmark = pytest.mark.skipif(
    transaction_put is None,
    reason="the C cores are not built"
    + (" (STREAMPLATFORM_NO_C_CORE is set)" if os.environ.get("STREAMPLATFORM_NO_C_CORE") else ""),
)
if transaction_put is None and not os.environ.get("STREAMPLATFORM_NO_C_CORE"):
    raise ImportError("the C cores were expected (setup.py): _sliding_core did not import")

TP = TopicPartition("t", 0)
KEYS = st.binary(min_size=1, max_size=2)
VALUES = st.one_of(st.none(), st.binary(max_size=3))
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, VALUES),
        st.tuples(st.just("get"), KEYS, st.none()),  # a miss makes the key's next put fresh
        st.tuples(st.just("get_then_put"), KEYS, VALUES),  # the same key object: `_missed`
        st.tuples(st.just("fresh_then_delete"), KEYS, st.binary(max_size=3)),  # unstaged
        st.tuples(st.just("scan"), st.none(), st.none()),  # staged keys kept in order
        st.tuples(st.just("commit"), st.none(), st.none()),
    ),
    max_size=80,
)


def state(txn: KeyValueTransaction) -> tuple:
    overlay = txn._data
    return (
        dict(overlay.writes), overlay.num_bytes, list(overlay._added), overlay._sorted is None,
        set(txn._fresh), txn._missed, txn.approximate_num_uncommitted_entries(),
        txn.approximate_num_uncommitted_bytes(), list(txn.range()),
    )  # fmt: skip


@pytest.mark.parametrize("level", list(IsolationLevel))
@settings(max_examples=examples(60), deadline=None)  # two RocksDB stores opened per example
@given(steps=STEPS)
def test_the_c_put_leaves_what_the_python_put_leaves(tmp_path_factory, level, steps):
    directory = tmp_path_factory.mktemp("put")
    with (
        TransactionalKeyValueStore(directory / "python", isolation_level=level) as python_store,
        TransactionalKeyValueStore(directory / "c", isolation_level=level) as c_store,
    ):
        stores = {"python": python_store, "c": c_store}
        for name, key, value in steps:
            for side, store in stores.items():
                txn = store.transaction

                def put(key, value, txn=txn, side=side):
                    if side == "python":
                        txn.put(key, value)
                    else:
                        transaction_put(txn, key, value)

                if name == "put":
                    put(bytes(bytearray(key)), value)  # a key object of its own, never `_missed`
                elif name == "get":
                    txn.get(bytes(key))
                elif name == "get_then_put":
                    txn.get(key)
                    put(key, value)
                elif name == "fresh_then_delete":  # a fresh key's delete unstages its put
                    txn.get(key)
                    put(key, value)
                    put(bytes(bytearray(key)), None)
                elif name == "scan":
                    list(txn.range())
                else:
                    store.commit({TP: 1})
            assert state(c_store.transaction) == state(python_store.transaction)
        python_store.commit({TP: 2})
        c_store.commit({TP: 2})
        assert list(c_store.range()) == list(python_store.range())


def test_the_c_put_refuses_what_the_python_put_refuses(tmp_path):
    with TransactionalKeyValueStore(tmp_path / "kv") as store:
        txn = store.transaction
        for key, value in (("k", b"v"), (b"k", "v")):
            with pytest.raises(TypeError) as c_error:
                transaction_put(txn, key, value)
            with pytest.raises(TypeError) as python_error:
                txn.put(key, value)
            assert str(c_error.value) == str(python_error.value)
        txn.close()
        with pytest.raises(Exception, match="closed") as closed:
            transaction_put(txn, b"k", b"v")
        assert type(closed.value).__name__ == "StateStoreError"


def test_the_c_put_stages_through_any_other_object_by_its_put():
    """A store facade (or any transaction-like object) gets its own put called."""
    calls = []

    class Facade:
        def put(self, key, value):
            calls.append((key, value))

    transaction_put(Facade(), b"k", None)
    assert calls == [(b"k", None)]
