"""TransactionalKeyValueStore: a RocksDB key-value store with KIP-892 transactions.

Typical runtime use, one writing transaction per task::

    store = TransactionalKeyValueStore(path, IsolationLevel.READ_COMMITTED)
    txn = store.transaction             # the store's writing transaction
    txn.put(b"k", b"v")                 # staged; txn.get / range / prefix see it
    store.get(b"k")                     # None: the store itself reads committed data only
    store.commit({("orders", 0): 42})   # data + offsets + status marker, one atomic batch
    store.committed_offset(("orders", 0))  # 42

Data lives in the ``data`` column family, keys and values as given.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from streamplatform.state.base import StoreBase
from streamplatform.state.checks import check_bytes
from streamplatform.state.rocks import StoreOptions
from streamplatform.state.transaction import (
    DATA,
    IsolationLevel,
    KeyValueTransaction,
    check_bounds,
    prefix_end,
    scan,
)

__all__ = ["TransactionalKeyValueStore"]


class TransactionalKeyValueStore(StoreBase):
    """A persistent bytes -> bytes store whose writes go through transactions.

    `get`, `range` and `prefix` on the store read committed data only (under
    READ_UNCOMMITTED, writes are committed data as soon as they are made). `commit`,
    `prepare` and the uncommitted counters act on the store's writing transaction
    (`transaction`); `new_transaction()` opens more, each committed on its own.
    """

    KIND = "key_value"
    COLUMN_FAMILIES = (DATA,)

    def __init__(
        self,
        path: str | os.PathLike[str],
        isolation_level: IsolationLevel = IsolationLevel.READ_COMMITTED,
        *,
        options: StoreOptions | None = None,
        max_uncommitted_records: int | None = None,
        max_uncommitted_bytes: int | None = None,
    ) -> None:
        super().__init__(
            path, isolation_level, options, max_uncommitted_records, max_uncommitted_bytes
        )

    def _new_transaction(self) -> KeyValueTransaction:
        return KeyValueTransaction(self._db, self._isolation_level)

    def new_transaction(self) -> KeyValueTransaction:
        """Open a transaction with the store's isolation level; close it to discard it."""
        transaction = self._open_transaction()
        assert isinstance(transaction, KeyValueTransaction)
        return transaction

    @property
    def transaction(self) -> KeyValueTransaction:
        """The store's writing transaction, committed by `commit`; a new one after `close`."""
        transaction = self._writing_transaction()
        assert isinstance(transaction, KeyValueTransaction)
        return transaction

    def get(self, key: bytes) -> bytes | None:
        """The committed value of `key`, or None."""
        check_bytes("key", key)
        self._check_open()
        return self._db.columns[DATA].get(key)

    def range(
        self, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Committed (key, value) pairs with start <= key < end, in key order, as of this call."""
        check_bounds(start, end)
        self._check_open()
        return scan(self._db, [], start, end)

    def approximate_num_entries(self) -> int:
        """RocksDB's estimate of the committed keys, plus the writing transaction's staged
        writes (a staged delete counts as one too: an estimate)."""
        self._check_open()
        stored = self._db.columns[DATA].property_int_value("rocksdb.estimate-num-keys") or 0
        return int(stored) + self.approximate_num_uncommitted_entries()

    def prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Committed (key, value) pairs whose key starts with `prefix`, in key order."""
        check_bytes("prefix", prefix)
        return self.range(prefix, prefix_end(prefix))
