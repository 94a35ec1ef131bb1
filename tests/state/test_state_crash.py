"""SIGKILL at random moments: reopening shows exactly the last commit, with no wipe."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamplatform.state import TransactionalKeyValueStore, VersionedKeyValueStore

TP = ("input", 0)

# Each commit i writes the counter, ten keys named after i and offset i, in one transaction.
# The child never stops by itself: the test kills it.
_WRITER = """
import sys
from streamplatform.state import TransactionalKeyValueStore, VersionedKeyValueStore
kind, path = sys.argv[1], sys.argv[2]
TP = ("input", 0)
if kind == "kv":
    store = TransactionalKeyValueStore(path)
else:
    store = VersionedKeyValueStore(path, history_retention_ms=1_000, segment_interval_ms=100)
i = store.committed_offset(TP) or 0
print("ready", flush=True)
while True:
    i += 1
    if kind == "kv":
        txn = store.transaction
        txn.put(b"counter", b"%d" % i)
        for j in range(10):
            txn.put(b"k%08d.%d" % (i, j), b"x" * 100)
    else:
        store.put(b"counter", b"%d" % i, i)
        for j in range(10):
            store.put(b"k%d" % j, b"%d" % i, i)
    store.commit({TP: i})
"""


def _run_and_kill(kind: str, path: Path, rng: random.Random) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER, kind, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    time.sleep(rng.uniform(0.05, 0.4))
    child.send_signal(signal.SIGKILL)
    child.wait()


def _check_key_value_store(path: Path) -> int:
    with TransactionalKeyValueStore(path) as store:
        offset = store.committed_offset(TP)
        assert offset is not None
        assert store.get(b"counter") == b"%d" % offset
        assert store.commit_sequence == offset
        assert store.get(b"k%08d.9" % offset) == b"x" * 100
        assert store.get(b"k%08d.0" % (offset + 1)) is None  # nothing of the next commit
        assert sum(1 for _ in store.prefix(b"k")) == 10 * offset
        return offset


def _check_versioned_store(path: Path) -> int:
    with VersionedKeyValueStore(path, history_retention_ms=1_000) as store:
        offset = store.committed_offset(TP)
        assert offset is not None
        assert store.stream_time == offset
        latest = store.get(b"counter")
        assert latest is not None and (latest.value, latest.timestamp) == (b"%d" % offset, offset)
        for j in range(10):
            assert store.get(b"k%d" % j).value == b"%d" % offset
        if offset > 1:
            assert store.get(b"k9", offset - 1).value == b"%d" % (offset - 1)
        return offset


def test_key_value_store_survives_repeated_sigkill(tmp_path: Path) -> None:
    rng = random.Random(892)
    offsets = []
    for _ in range(6):
        _run_and_kill("kv", tmp_path / "kv", rng)
        offsets.append(_check_key_value_store(tmp_path / "kv"))
    assert offsets == sorted(offsets) and offsets[-1] > offsets[0]  # it kept committing


def test_versioned_store_survives_repeated_sigkill(tmp_path: Path) -> None:
    rng = random.Random(889)
    offsets = []
    for _ in range(4):
        _run_and_kill("versioned", tmp_path / "v", rng)
        offsets.append(_check_versioned_store(tmp_path / "v"))
    assert offsets == sorted(offsets) and offsets[-1] > offsets[0]


_PREPARER = """
import sys
from streamplatform.state import TransactionalKeyValueStore
store = TransactionalKeyValueStore(sys.argv[1])
store.transaction.put(b"committed", b"1")
store.commit({("input", 0): 1})
store.transaction.put(b"prepared", b"2")
store.prepare(41, {("input", 0): 2})
print("prepared", flush=True)
sys.stdin.read()  # wait to be killed between prepare and settle
"""


def test_prepared_batch_survives_sigkill_and_is_settled_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "kv"
    child = subprocess.Popen(
        [sys.executable, "-c", _PREPARER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "prepared"
    child.send_signal(signal.SIGKILL)
    child.wait()
    with TransactionalKeyValueStore(path) as store:
        assert store.prepared_batch_id == 41
        assert store.get(b"prepared") is None and store.committed_offset(TP) == 1
        assert store.settle(41, committed=True)
        assert store.get(b"prepared") == b"2" and store.committed_offset(TP) == 2
