"""Stores factory, store options, shared memory and the directory lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from streamplatform.state import (
    IsolationLevel,
    KeyValueStoreSpec,
    StoreLockedError,
    StoreOptions,
    Stores,
    TransactionalKeyValueStore,
    VersionedKeyValueStore,
    VersionedStoreSpec,
)
from streamplatform.state.rocks import shared_memory


def test_versioned_spec_accepts_timedelta_and_milliseconds() -> None:
    spec = Stores.persistent_versioned_key_value_store("rates", timedelta(days=1))
    assert spec == VersionedStoreSpec("rates", 86_400_000, None)
    assert spec.kind == "versioned"
    spec = Stores.persistent_versioned_key_value_store("rates", 5_000, timedelta(seconds=1))
    assert (spec.history_retention_ms, spec.segment_interval_ms) == (5_000, 1_000)
    assert Stores.persistent_versioned_key_value_store("r", 0).history_retention_ms == 0


@pytest.mark.parametrize(
    ("args", "error", "name"),
    [
        (("r", -1), ValueError, "history_retention"),
        (("r", timedelta(milliseconds=-5)), ValueError, "history_retention"),
        (("r", 1.5), TypeError, "history_retention"),
        (("r", "1d"), TypeError, "history_retention"),
        (("r", True), TypeError, "history_retention"),
        (("r", 1_000, 0), ValueError, "segment_interval"),
        (("r", 1_000, timedelta(0)), ValueError, "segment_interval"),
        (("r", 1_000, -3), ValueError, "segment_interval"),
        (("r", 1_000, 2.0), TypeError, "segment_interval"),
        (("", 1_000), ValueError, "name"),
        (("a/b", 1_000), ValueError, "name"),
        ((None, 1_000), TypeError, "name"),
    ],
)
def test_versioned_spec_bad_arguments_are_named(args, error, name: str) -> None:
    with pytest.raises(error, match=name):
        Stores.persistent_versioned_key_value_store(*args)


def test_key_value_spec() -> None:
    spec = Stores.persistent_key_value_store("counts")
    assert spec == KeyValueStoreSpec("counts") and spec.kind == "key_value"
    with pytest.raises(ValueError, match="name"):
        Stores.persistent_key_value_store("..")


def test_specs_open_stores_under_the_directory(tmp_path: Path) -> None:
    ru = IsolationLevel.READ_UNCOMMITTED
    with Stores.persistent_key_value_store("counts").open(tmp_path, ru) as store:
        assert isinstance(store, TransactionalKeyValueStore)
        assert store.path == tmp_path / "counts" and store.isolation_level is ru
    spec = Stores.persistent_versioned_key_value_store("rates", timedelta(minutes=1), 5_000)
    with spec.open(tmp_path, max_uncommitted_records=1) as store:
        assert isinstance(store, VersionedKeyValueStore)
        assert store.path == tmp_path / "rates"
        assert (store.history_retention_ms, store.segment_interval_ms) == (60_000, 5_000)
        assert store.isolation_level is IsolationLevel.READ_COMMITTED
        store.put(b"a", b"1", 1)
        store.put(b"b", b"1", 1)
        assert store.uncommitted_limit_exceeded()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_cache_bytes", 0),
        ("write_buffer_bytes", -1),
        ("bloom_bits_per_key", -1),
        ("compression", "brotli"),
        ("open_timeout_s", -1),
        ("latest_cache_entries", 1.5),
        ("history_cache_bytes", -1),
    ],
)
def test_store_options_bad_values_are_named(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        StoreOptions(**{field: value})


def test_one_block_cache_and_write_buffer_manager_per_process(tmp_path: Path) -> None:
    cache, manager = shared_memory(StoreOptions())
    with (
        TransactionalKeyValueStore(tmp_path / "a"),
        VersionedKeyValueStore(
            tmp_path / "b", 10, options=StoreOptions(block_cache_bytes=64 << 20)
        ),
    ):
        again_cache, again_manager = shared_memory(StoreOptions(block_cache_bytes=64 << 20))
        assert again_cache is cache and again_manager is manager
        assert manager.get_buffer_size() == StoreOptions().write_buffer_manager_bytes
    shared_memory(StoreOptions())  # back to the defaults for the other tests


_HOLDER = """
import sys, time
from streamplatform.state import TransactionalKeyValueStore
store = TransactionalKeyValueStore(sys.argv[1])
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
store.close()
"""


def _hold(path: Path, seconds: float) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_locked_by_another_process_fails_naming_path_and_pid(tmp_path: Path) -> None:
    path = tmp_path / "kv"
    child = _hold(path, 30)
    try:
        started = time.monotonic()
        options = StoreOptions(open_timeout_s=0.5, open_retry_interval_s=0.05)
        with pytest.raises(StoreLockedError) as raised:
            TransactionalKeyValueStore(path, options=options)
        assert time.monotonic() - started >= 0.5
        assert str(path) in str(raised.value) and f"pid {child.pid}" in str(raised.value)
    finally:
        child.kill()
        child.wait()
    TransactionalKeyValueStore(path).close()  # a killed holder leaves no lock behind


def test_open_waits_for_a_holder_that_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "kv"
    child = _hold(path, 0.5)
    with TransactionalKeyValueStore(path, options=StoreOptions(open_timeout_s=20)) as store:
        assert store.committed_offset(("t", 0)) is None
    assert child.wait(timeout=10) == 0


def test_locked_by_this_process_says_so(tmp_path: Path) -> None:
    with (
        TransactionalKeyValueStore(tmp_path / "kv"),
        pytest.raises(StoreLockedError, match=f"this process \\(pid {os.getpid()}\\)"),
    ):
        TransactionalKeyValueStore(tmp_path / "kv", options=StoreOptions(open_timeout_s=0))
