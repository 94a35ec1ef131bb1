"""RocksDB plumbing shared by every store: options, process-wide memory, opening with a lock.

All stores of a process share one block cache and one write-buffer manager (whose memtable
memory is charged to that cache), so the memory of RocksDB is bounded by one number however
many tasks and stores an executor runs. Store tuning lives in the frozen `StoreOptions`;
`rocksdict_options` is the only place that turns it into `rocksdict.Options`.

A job's settings reach its stores through `TaskStoreOptions`: the plain settings
(`platform.rocksdb.*`, `platform.versioned.*`), then `rocksdb.config.setter`, which changes a
mutable `RocksDBOptions` per store as Kafka Streams' RocksDBConfigSetter does (docs/memory.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import rocksdict
from rocksdict import WriteBufferManager

from streamplatform.config import STORE_OPTION_SETTINGS, ConfigError, StreamsConfig, load_object
from streamplatform.state.errors import StoreLockedError

__all__ = [
    "RELEASE_REQUEST",
    "RocksDBConfigSetter",
    "RocksDBOptions",
    "StoreOptions",
    "TaskStoreOptions",
    "open_rocksdict",
    "release_pid_file",
    "rocksdict_options",
    "shared_memory",
    "shared_memory_sizes",
]

log = logging.getLogger(__name__)

_COMPRESSION = {
    "none": rocksdict.DBCompressionType.none,
    "snappy": rocksdict.DBCompressionType.snappy,
    "lz4": rocksdict.DBCompressionType.lz4,
    "zstd": rocksdict.DBCompressionType.zstd,
}
PID_FILE_NAME = "streamplatform.pid"
# Left beside a locked store by a process waiting to open it: a Spark Python worker keeping
# the store's task open between batches closes it when it sees this (runtime/task_cache.py).
RELEASE_REQUEST = "streamplatform.release"
_MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """Tuning of a state store. Every field has a default; sizes are in bytes.

    The two process-wide sizes (`block_cache_bytes`, `write_buffer_manager_bytes`) apply to
    the cache and manager shared by all stores: the most recently opened store's values win.
    """

    block_cache_bytes: int = 128 * _MiB
    """Process-wide LRU block cache for all stores. Default 128 MiB."""
    write_buffer_manager_bytes: int = 64 * _MiB
    """Process-wide limit of memtable memory, charged to the block cache. Default 64 MiB."""
    write_buffer_bytes: int = 16 * _MiB
    """Memtable size per column family before it is flushed. Default 16 MiB."""
    max_write_buffer_number: int = 3
    """Memtables per column family (one active, the rest being flushed). Default 3."""
    target_file_size_bytes: int = 64 * _MiB
    """Target size of SST files at level 1. Default 64 MiB."""
    bloom_bits_per_key: int = 10
    """Bloom filter bits per key (cheap lookups of absent keys); 0 disables. Default 10."""
    compression: str = "lz4"
    """SST compression: "none", "snappy", "lz4" or "zstd". Default "lz4"."""
    cache_index_and_filter_blocks: bool = False
    """Keep the SST files' index and filter blocks in the block cache, where they count
    against it (and may be evicted), instead of beside it, outside any bound: about 1.9 bytes
    per stored key with the default bloom filter (docs/memory.md). Default False."""
    max_background_jobs: int = 2
    """Threads for flushes and compactions per store. Default 2."""
    max_info_log_files: int = 3
    """RocksDB info LOG files kept per store (a new one starts at each open). Default 3."""
    sync_commits: bool = False
    """fsync the write-ahead log at every commit and settle. Off by default: a killed process
    loses nothing (the log is in the OS page cache); only a machine crash can lose the last
    commits, which the changelog restores. `prepare` always syncs, see `StateDB.prepare`."""
    open_timeout_s: float = 10.0
    """How long opening waits for a directory locked by another live store. Default 10 s."""
    open_retry_interval_s: float = 0.01
    """Pause between two attempts to open a locked directory. Default 0.01 s: a Spark Python
    worker keeping the store's task between batches lets go within milliseconds."""
    latest_cache_entries: int = 10_000
    """Versioned stores: latest versions kept decoded in memory, per store; 0 disables.
    Default 10,000 entries."""
    history_cache_bytes: int = 64 * _MiB
    """Versioned stores: memory, per store, for the whole history of keys read often at older
    times, so that `get(key, as_of)` finds their older versions without RocksDB
    (history_cache.py). Counted as the values plus ~190 bytes per version and ~400 per key
    (the Python objects); keys not read recently go first; 0 disables. Default 64 MiB."""

    def __post_init__(self) -> None:
        positive = ("block_cache_bytes", "write_buffer_manager_bytes", "write_buffer_bytes")
        for name in (*positive, "max_write_buffer_number", "target_file_size_bytes"):
            _require(name, getattr(self, name), minimum=1)
        for name in ("bloom_bits_per_key", "latest_cache_entries", "history_cache_bytes"):
            _require(name, getattr(self, name), minimum=0)
        for name in ("max_background_jobs", "max_info_log_files"):
            _require(name, getattr(self, name), minimum=1)
        if self.write_buffer_manager_bytes > self.block_cache_bytes:
            raise ValueError(
                f"StoreOptions.write_buffer_manager_bytes ({self.write_buffer_manager_bytes}) "
                f"must not exceed block_cache_bytes ({self.block_cache_bytes}): the memtables "
                "are charged to the block cache"
            )
        if self.compression not in _COMPRESSION:
            raise ValueError(
                f"StoreOptions.compression must be one of {sorted(_COMPRESSION)}, "
                f"got {self.compression!r}"
            )
        for name in ("open_timeout_s", "open_retry_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"StoreOptions.{name} must be a number >= 0, got {value!r}")


def _require(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"StoreOptions.{name} must be an int >= {minimum}, got {value!r}")


_D = StoreOptions  # the defaults below are StoreOptions' own


@dataclasses.dataclass(slots=True)
class RocksDBOptions:
    """The options of one store as `rocksdb.config.setter` sees them: `StoreOptions`' fields
    (same names, meanings and defaults), changed in place by the setter's `set_config`.

    Slotted: assigning a name that is not an option raises AttributeError. The runtime turns
    the result into a `StoreOptions` (`to_store_options`), which checks every value.

    >>> options = RocksDBOptions()
    >>> options.write_buffer_bytes = 4 * 1024 * 1024
    >>> options.to_store_options().write_buffer_bytes
    4194304
    """

    block_cache_bytes: int = _D.block_cache_bytes
    write_buffer_manager_bytes: int = _D.write_buffer_manager_bytes
    write_buffer_bytes: int = _D.write_buffer_bytes
    max_write_buffer_number: int = _D.max_write_buffer_number
    target_file_size_bytes: int = _D.target_file_size_bytes
    bloom_bits_per_key: int = _D.bloom_bits_per_key
    compression: str = _D.compression
    cache_index_and_filter_blocks: bool = _D.cache_index_and_filter_blocks
    max_background_jobs: int = _D.max_background_jobs
    max_info_log_files: int = _D.max_info_log_files
    sync_commits: bool = _D.sync_commits
    open_timeout_s: float = _D.open_timeout_s
    open_retry_interval_s: float = _D.open_retry_interval_s
    latest_cache_entries: int = _D.latest_cache_entries
    history_cache_bytes: int = _D.history_cache_bytes

    @classmethod
    def of(cls, options: StoreOptions) -> RocksDBOptions:
        """A mutable copy of `options`."""
        return cls(**dataclasses.asdict(options))

    def to_store_options(self) -> StoreOptions:
        """The frozen, checked `StoreOptions` of these values (ValueError names a bad one)."""
        return StoreOptions(**dataclasses.asdict(self))


class RocksDBConfigSetter(Protocol):
    """What `rocksdb.config.setter` names: a class, instantiated once per store open, as
    Kafka Streams' `RocksDBConfigSetter`. `set_config` changes `options` in place; `configs` is
    a copy of the job's settings (`StreamsConfig.to_dict()`). A `close(store_name, options)`
    method, when the class has one, is called once the store is closed."""

    def set_config(
        self, store_name: str, options: RocksDBOptions, configs: dict[str, Any]
    ) -> None: ...


_shared_lock = threading.Lock()
_block_cache: rocksdict.Cache | None = None
_write_buffer_manager: rocksdict.WriteBufferManager | None = None
_shared_sizes: tuple[int, int] | None = None


def shared_memory(options: StoreOptions) -> tuple[rocksdict.Cache, rocksdict.WriteBufferManager]:
    """Return the process-wide cache and write-buffer manager, created on first use."""
    global _block_cache, _write_buffer_manager, _shared_sizes
    with _shared_lock:
        if _block_cache is None or _write_buffer_manager is None:
            _block_cache = rocksdict.Cache(options.block_cache_bytes)
            _write_buffer_manager = WriteBufferManager.new_write_buffer_manager_with_cache(
                options.write_buffer_manager_bytes, False, _block_cache
            )
        else:
            # Resizing in place keeps one cache for all stores already open.
            _block_cache.set_capacity(options.block_cache_bytes)
            _write_buffer_manager.set_buffer_size(options.write_buffer_manager_bytes)
        _shared_sizes = (options.block_cache_bytes, options.write_buffer_manager_bytes)
        return _block_cache, _write_buffer_manager


def shared_memory_sizes() -> tuple[int, int] | None:
    """(block cache capacity, write-buffer manager size) of this process in bytes, as the
    last store opened set them; None before any store was opened."""
    with _shared_lock:
        return _shared_sizes


def rocksdict_options(options: StoreOptions) -> rocksdict.Options:
    """Translate `options` into the rocksdict Options used for the DB and each column family."""
    cache, write_buffer_manager = shared_memory(options)
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    # One atomic WriteBatch spans data, offsets and status; atomic flush keeps the column
    # families consistent on disk too, so recovery never sees data without its offsets.
    opts.set_atomic_flush(True)
    opts.set_write_buffer_size(options.write_buffer_bytes)
    opts.set_max_write_buffer_number(options.max_write_buffer_number)
    opts.set_target_file_size_base(options.target_file_size_bytes)
    opts.set_max_background_jobs(options.max_background_jobs)
    opts.set_keep_log_file_num(options.max_info_log_files)
    opts.set_compression_type(_COMPRESSION[options.compression]())
    opts.set_write_buffer_manager(write_buffer_manager)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache)
    if options.bloom_bits_per_key:
        table.set_bloom_filter(options.bloom_bits_per_key, False)
    if options.cache_index_and_filter_blocks:
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    opts.set_block_based_table_factory(table)
    return opts


def open_rocksdict(
    path: Path, column_families: Sequence[str], options: StoreOptions
) -> rocksdict.Rdict:
    """Open (or create) the RocksDB at `path` with `column_families`, waiting for its lock.

    RocksDB locks the directory while a store has it open. A task restarted on the same
    executor may find the previous attempt still closing, or another Python worker keeping the
    task open between batches (asked to let go by RELEASE_REQUEST), so a locked directory is
    retried for `options.open_timeout_s` before StoreLockedError names the path and the
    holder.
    """
    path.mkdir(parents=True, exist_ok=True)
    # RocksDB opens only with every column family it has, even ones this store does not use
    # (a directory of another kind of store: the caller then refuses it by its metadata).
    names = dict.fromkeys([*column_families, *_existing_column_families(path)])
    names.pop("default", None)
    deadline = time.monotonic() + options.open_timeout_s
    while True:
        try:
            db = rocksdict.Rdict(
                str(path),
                rocksdict_options(options),
                column_families={name: rocksdict_options(options) for name in names},
            )
        except Exception as error:  # rocksdict raises plain Exception for every RocksDB status
            if "lock" not in str(error).lower():
                raise
            (path / RELEASE_REQUEST).touch()
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"state store {path} is locked by {_describe_holder(path)}; waited "
                    f"{options.open_timeout_s:g} s (StoreOptions.open_timeout_s). Close the "
                    "store holding it or stop that process, then retry."
                ) from error
            time.sleep(options.open_retry_interval_s)
        else:
            (path / PID_FILE_NAME).write_text(f"{os.getpid()} {socket.gethostname()}\n")
            (path / RELEASE_REQUEST).unlink(missing_ok=True)  # answered (or an old one)
            return db


def _existing_column_families(path: Path) -> list[str]:
    if not (path / "CURRENT").exists():
        return []
    return rocksdict.Rdict.list_cf(str(path), rocksdict.Options(raw_mode=True))


def release_pid_file(path: Path) -> None:
    """Remove the holder note of `open_rocksdict`; called while the lock is still held, so
    it can never remove the note of the next holder."""
    (path / PID_FILE_NAME).unlink(missing_ok=True)


def _describe_holder(path: Path) -> str:
    try:
        pid, host = (path / PID_FILE_NAME).read_text().split()
    except (OSError, ValueError):
        return "another open store (holder unknown)"
    if int(pid) == os.getpid() and host == socket.gethostname():
        return f"this process (pid {pid}): another store object on the same path is still open"
    return f"pid {pid} on host {host}"


class TaskStoreOptions:
    """The `StoreOptions` of a task's stores, from the job's settings.

    For each store: `RocksDBOptions` with the plain settings (`STORE_OPTION_SETTINGS`, e.g.
    `platform.rocksdb.block.cache.bytes`) over StoreOptions' defaults; then, when
    `rocksdb.config.setter` is set, a new instance of its class (one per store open, as in
    Kafka Streams) changes them in place in `set_config(store_name, options, configs)`. A
    setter that fails, or leaves a bad value, raises ConfigError naming the setting and the
    store. `close()`, once the stores are closed, calls each setter's `close(store_name,
    options)` if its class has one.
    """

    def __init__(self, config: StreamsConfig) -> None:
        self._settings = config.to_dict()
        self._plain = {field: config[name] for name, field in STORE_OPTION_SETTINGS.items()}
        self._setter_path: str | None = config["rocksdb.config.setter"]
        self._setter_class = None if self._setter_path is None else load_object(self._setter_path)
        self._to_close: list[tuple[Any, str, RocksDBOptions]] = []

    def options(self, store_name: str) -> StoreOptions:
        """The options to open `store_name` with."""
        options = RocksDBOptions(**self._plain)
        if self._setter_class is None:
            return options.to_store_options()
        try:
            setter = self._setter_class()
            setter.set_config(store_name, options, dict(self._settings))
            store_options = options.to_store_options()
        except Exception as error:
            raise ConfigError(
                f"rocksdb.config.setter={self._setter_path!r} for store {store_name!r}: {error}"
            ) from error
        if callable(getattr(setter, "close", None)):
            self._to_close.append((setter, store_name, options))
        return store_options

    def close(self) -> None:
        """Call the setters' `close(store_name, options)`; a failing one is logged."""
        to_close, self._to_close = self._to_close, []
        for setter, store_name, options in to_close:
            try:
                setter.close(store_name, options)
            except Exception:
                log.exception("rocksdb.config.setter close() failed for store %r", store_name)
