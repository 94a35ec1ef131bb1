"""State stores on RocksDB: transactional (KIP-892) and versioned (KIP-889).

Public names are re-exported here; the modules behind them are internal. A processor meets
its stores as ``KeyValueStore`` and ``VersionedStore`` (typed, reading its own writes; see
docs/processor-api.md); the engine classes below them (``TransactionalKeyValueStore``,
``VersionedKeyValueStore``, bytes in and out, with the transaction protocol) are for using a
store on its own.

>>> import tempfile
>>> from streamplatform.state import VersionedKeyValueStore
>>> with tempfile.TemporaryDirectory() as directory:
...     with VersionedKeyValueStore(directory, history_retention_ms=60_000) as store:
...         store.put(b"eur", b"1.08", 1_000), store.put(b"eur", b"1.09", 5_000)
...         store.get(b"eur", as_of=2_000)
(-1, -1)
VersionedRecord(value=b'1.08', timestamp=1000, valid_to=5000)
"""

from streamplatform.state.errors import StateStoreError, StoreLockedError
from streamplatform.state.facades import KeyValueStore, VersionedStore
from streamplatform.state.rocks import RocksDBConfigSetter, RocksDBOptions, StoreOptions
from streamplatform.state.stores import KeyValueStoreSpec, Stores, StoreSpec, VersionedStoreSpec
from streamplatform.state.transaction import IsolationLevel, KeyValueTransaction
from streamplatform.state.transactional import TransactionalKeyValueStore
from streamplatform.state.versioned import (
    PUT_RETURN_CODE_NOT_PUT,
    VALID_TO_UNDEFINED,
    VersionedKeyValueStore,
    VersionedRecord,
)

__all__ = [
    "PUT_RETURN_CODE_NOT_PUT",
    "VALID_TO_UNDEFINED",
    "IsolationLevel",
    "KeyValueStore",
    "KeyValueStoreSpec",
    "KeyValueTransaction",
    "RocksDBConfigSetter",
    "RocksDBOptions",
    "StateStoreError",
    "StoreLockedError",
    "StoreOptions",
    "StoreSpec",
    "Stores",
    "TransactionalKeyValueStore",
    "VersionedKeyValueStore",
    "VersionedRecord",
    "VersionedStore",
    "VersionedStoreSpec",
]
