"""One store's RocksDB: its column families, atomic commits with offsets, prepare and settle.

Column families besides the store's own data:
- ``offsets``: committed source/changelog offsets, key ``topic NUL partition(>i)``, value ``>q``.
- ``meta``: the status marker ``commit_seq`` (number of commits applied, bumped in every commit
  batch), the store kind, the pending ``prepared_batch`` id and the last ``settled_batch``,
  plus whatever the store itself keeps there (a versioned store's stream time).
- ``prepared``: the write set of a prepared batch, key ``column family NUL key``, value
  ``\\x01 value`` for a put and ``\\x00`` for a delete; offsets travel as ``offsets`` entries.

Every commit is ONE WriteBatch (data + offsets + status marker), written through the WAL with
atomic flush enabled, so after a crash at any moment RocksDB recovers either all of a commit
or none of it: reopening shows exactly the last commit, with no wipe and no restore.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Generator, Iterable, Mapping
from pathlib import Path
from typing import TypeAlias, cast

import rocksdict

from streamplatform.records import TopicPartition
from streamplatform.state.errors import StateStoreError
from streamplatform.state.overlay import StagedWrites
from streamplatform.state.rocks import StoreOptions, open_rocksdict, release_pid_file

__all__ = ["Offsets", "StateDB", "normalize_offsets"]

Offsets: TypeAlias = Mapping[TopicPartition | tuple[str, int], int]

META, OFFSETS, PREPARED = "meta", "offsets", "prepared"
_COMMIT_SEQ = b"commit_seq"
_KIND = b"kind"
_PREPARED_BATCH = b"prepared_batch"
_SETTLED_BATCH = b"settled_batch"
_INT64 = struct.Struct(">q")
_PARTITION = struct.Struct(">i")
_PUT, _DELETE = b"\x01", b"\x00"
# Prepared keys start with an ASCII column-family name, so this bound is above all of them.
_PREPARED_END = b"\xff"
_PREPARED_OFFSET = OFFSETS.encode() + b"\x00"


def normalize_offsets(offsets: Offsets | None) -> dict[TopicPartition, int]:
    """Check `offsets` and key them by TopicPartition; plain (topic, partition) tuples pass."""
    if offsets is None:
        return {}
    if not isinstance(offsets, Mapping):
        raise TypeError(f"offsets must be a mapping of TopicPartition to int, got {offsets!r}")
    result = {}
    for tp, offset in offsets.items():
        if not (
            isinstance(tp, tuple)
            and len(tp) == 2
            and isinstance(tp[0], str)
            and isinstance(tp[1], int)
            and not isinstance(tp[1], bool)
        ):
            raise TypeError(f"offsets keys must be TopicPartition(topic, partition), got {tp!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offsets[{tp!r}] must be an int >= 0, got {offset!r}")
        result[TopicPartition(*tp)] = offset
    return result


def _offset_key(tp: TopicPartition) -> bytes:
    return tp.topic.encode() + b"\x00" + _PARTITION.pack(tp.partition)


def _decode_offset_key(key: bytes) -> TopicPartition:
    topic, partition = key[:-5], key[-4:]
    return TopicPartition(topic.decode(), _PARTITION.unpack(partition)[0])


class StateDB:
    """The RocksDB of one store, with the column families named in `data_column_families`."""

    def __init__(
        self, path: Path, kind: str, data_column_families: tuple[str, ...], options: StoreOptions
    ) -> None:
        self.path = path
        self._options = options
        names = (*data_column_families, META, OFFSETS, PREPARED)
        self._rdict: rocksdict.Rdict | None = open_rocksdict(path, names, options)
        self.columns = {name: self._rdict.get_column_family(name) for name in names}
        self.handles = {name: self._rdict.get_column_family_handle(name) for name in names}
        self._write_options = rocksdict.WriteOptions()
        self._sync_write_options = rocksdict.WriteOptions()
        self._sync_write_options.sync = True
        self.generation = 0
        """Bumped at every write to stored data; cached iterators older than it are stale."""
        # The batch prepared by this object, ready to apply: (batch id, its data and offsets
        # as one WriteBatch, the offsets). Settling it commits this batch instead of reading
        # the write set back from the `prepared` column family, which only a store reopened
        # since (another process, a restart) needs to do.
        self._ready: tuple[int, rocksdict.WriteBatch, dict[TopicPartition, int]] | None = None
        self._scans: weakref.WeakSet[Generator] = weakref.WeakSet()
        meta = self.columns[META]
        stored_kind = meta.get(_KIND)
        if stored_kind is None:
            meta.put(_KIND, kind.encode())
        elif stored_kind != kind.encode():
            self.close()
            raise StateStoreError(
                f"state store {path} holds a {stored_kind.decode()} store, not a {kind} store"
            )
        self._offsets = {
            _decode_offset_key(cast(bytes, key)): _INT64.unpack(value)[0]
            for key, value in self.columns[OFFSETS].items()
        }
        self.commit_sequence = self._meta_int(_COMMIT_SEQ) or 0
        self.prepared_batch_id = self._meta_int(_PREPARED_BATCH)
        settled = meta.get(_SETTLED_BATCH)
        self._settled = (
            None if settled is None else (_INT64.unpack(settled[:8])[0], settled[8:] == _PUT)
        )

    def _meta_int(self, key: bytes) -> int | None:
        value = self.columns[META].get(key)
        return None if value is None else _INT64.unpack(value)[0]

    @property
    def closed(self) -> bool:
        return self._rdict is None

    # RocksDB's properties behind Kafka Streams' RocksDB metrics (KIP-607), by their names.
    ROCKSDB_PROPERTIES = {
        "cur_size_all_mem_tables": "rocksdb.cur-size-all-mem-tables",
        "size_all_mem_tables": "rocksdb.size-all-mem-tables",
        "estimate_num_keys": "rocksdb.estimate-num-keys",
        "estimate_table_readers_mem": "rocksdb.estimate-table-readers-mem",
        "block_cache_usage": "rocksdb.block-cache-usage",
    }

    def rocksdb_metrics(self, data_column_families: tuple[str, ...]) -> dict[str, int]:
        """Kafka Streams' RocksDB metrics of this store: each property summed over the data
        column families (the block cache is shared: its usage counts once); {} when closed."""
        if self._rdict is None:
            return {}
        found: dict[str, int] = {}
        for name, prop in self.ROCKSDB_PROPERTIES.items():
            families = (
                data_column_families if name != "block_cache_usage" else data_column_families[:1]
            )
            found[name] = sum(int(self.columns[f].property_int_value(prop) or 0) for f in families)
        return found

    def committed_offset(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        return self._offsets.get(TopicPartition(*tp))

    def committed_offsets(self) -> dict[TopicPartition, int]:
        return dict(self._offsets)

    def iterator(self, column_family: str) -> rocksdict.RdictIter:
        """A new iterator over the stored data, pinned to what is stored now."""
        if self._rdict is None:
            raise StateStoreError(f"state store {self.path} is closed")
        return self.columns[column_family].iter()

    def track(self, scan: Generator) -> Generator:
        """Register a scan handed to a caller, so that closing the store ends it."""
        self._scans.add(scan)
        return scan

    def write(self, batch: rocksdict.WriteBatch, sync: bool = False) -> None:
        """Write `batch` atomically through the WAL, fsynced when `sync`."""
        if self._rdict is None:
            raise StateStoreError(f"state store {self.path} is closed")
        self._rdict.write(batch, self._sync_write_options if sync else self._write_options)
        self.generation += 1

    def apply(self, staged: Iterable[StagedWrites]) -> None:
        """Write staged data at once, without offsets (READ_UNCOMMITTED transactions)."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        for writes in staged:
            writes.write_to(batch, self.handles)
        self.write(batch)

    def commit(self, staged: Iterable[StagedWrites], offsets: dict[TopicPartition, int]) -> None:
        """Write staged data, `offsets` and the status marker in one atomic batch."""
        self._refuse_while_prepared("commit")
        batch = self._data_and_offsets(staged, offsets)
        batch.put(_COMMIT_SEQ, _INT64.pack(self.commit_sequence + 1), self.handles[META])
        self.write(batch, sync=self._options.sync_commits)
        self.commit_sequence += 1
        self._offsets.update(offsets)

    def _data_and_offsets(
        self, staged: Iterable[StagedWrites], offsets: dict[TopicPartition, int]
    ) -> rocksdict.WriteBatch:
        """A batch writing `staged` data and `offsets`: a commit's, before its marker."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        for writes in staged:
            writes.write_to(batch, self.handles)
        offsets_cf = self.handles[OFFSETS]
        for tp, offset in offsets.items():
            batch.put(_offset_key(tp), _INT64.pack(offset), offsets_cf)
        return batch

    def prepare(
        self, batch_id: int, staged: Iterable[StagedWrites], offsets: dict[TopicPartition, int]
    ) -> None:
        """Persist the write set and offsets of batch `batch_id` without applying them.

        Always fsynced: the driver treats a prepared batch as committable, so it must survive
        a machine crash, not only a killed process.
        """
        self._refuse_while_prepared("prepare")
        staged = list(staged)
        batch = rocksdict.WriteBatch(raw_mode=True)
        prepared_cf = self.handles[PREPARED]
        for writes in staged:
            for name, key, value in writes.entries():
                prepared_key = name.encode() + b"\x00" + key
                batch.put(prepared_key, _DELETE if value is None else _PUT + value, prepared_cf)
        for tp, offset in offsets.items():
            batch.put(_PREPARED_OFFSET + _offset_key(tp), _PUT + _INT64.pack(offset), prepared_cf)
        batch.put(_PREPARED_BATCH, _INT64.pack(batch_id), self.handles[META])
        ready = self._data_and_offsets(staged, offsets)
        self.write(batch, sync=True)
        self.prepared_batch_id = batch_id
        self._ready = (batch_id, ready, dict(offsets))

    def settle(self, batch_id: int, committed: bool) -> bool:
        """Apply (`committed`) or discard prepared batch `batch_id`; True if anything changed.

        With nothing prepared, settling is a no-op that returns False, so a retried task can
        settle the previous batch again. Two contradictory outcomes for the last settled
        batch, or a batch id other than the prepared one, raise StateStoreError.
        """
        pending = self.prepared_batch_id
        if pending is None:
            last = self._settled
            if last is not None and last[0] == batch_id and last[1] != committed:
                outcome = "committed" if last[1] else "discarded"
                raise StateStoreError(
                    f"state store {self.path}: batch {batch_id} was already {outcome}"
                )
            return False
        if pending != batch_id:
            raise StateStoreError(
                f"state store {self.path}: batch {pending} is prepared, not batch {batch_id}; "
                f"settle batch {pending} first"
            )
        ready, self._ready = self._ready, None
        if committed and ready is not None and ready[0] == batch_id:
            batch, applied_offsets = ready[1], ready[2]
        else:
            batch, applied_offsets = self._read_prepared(committed)
        if committed:
            batch.put(_COMMIT_SEQ, _INT64.pack(self.commit_sequence + 1), self.handles[META])
        batch.delete_range(b"", _PREPARED_END, self.handles[PREPARED])
        batch.delete(_PREPARED_BATCH, self.handles[META])
        settled_flag = _PUT if committed else _DELETE
        batch.put(_SETTLED_BATCH, _INT64.pack(batch_id) + settled_flag, self.handles[META])
        self.write(batch, sync=self._options.sync_commits)
        if committed:
            self.commit_sequence += 1
            self._offsets.update(applied_offsets)
        self.prepared_batch_id = None
        self._settled = (batch_id, committed)
        return True

    def _read_prepared(
        self, committed: bool
    ) -> tuple[rocksdict.WriteBatch, dict[TopicPartition, int]]:
        """A batch applying the prepared write set as read back from the `prepared` column
        family (empty when not `committed`), and the offsets it commits."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        applied_offsets: dict[TopicPartition, int] = {}
        if committed:
            for key, value in self.columns[PREPARED].items():
                name, _, data_key = cast(bytes, key).partition(b"\x00")
                handle = self.handles[name.decode()]
                if value == _DELETE:
                    batch.delete(data_key, handle)
                else:
                    batch.put(data_key, value[1:], handle)
                    if name == _PREPARED_OFFSET[:-1]:
                        applied_offsets[_decode_offset_key(data_key)] = _INT64.unpack(value[1:])[0]
        return batch, applied_offsets

    def _refuse_while_prepared(self, action: str) -> None:
        if self.prepared_batch_id is not None:
            raise StateStoreError(
                f"state store {self.path}: cannot {action} while batch {self.prepared_batch_id} "
                "is prepared; settle it first"
            )

    def close(self) -> None:
        """Close the DB; every object holding a reference to it is dropped first."""
        if self._rdict is None:
            return
        # Iterators and column-family objects keep the DB (and its lock) alive: drop them first.
        for scan in list(self._scans):
            scan.close()
        self._ready = None
        self.columns.clear()
        self.handles.clear()
        release_pid_file(self.path)
        self._rdict.close()
        self._rdict = None
