"""Memory of a state query: a store of N entries restored from a changelog snapshot and read
whole through ``streamplatform.state_query``, its peak RSS against the store's size.

The changelog is what maintenance leaves for a task whose store holds N keys: one snapshot file
(a batch, negative seqs) in the job's Delta changelog, and the batch in the commit log. The
query restores it into RocksDB a chunk at a time and iterates it; the figure to look at is the
process's peak RSS as N grows (it should not grow with N), and the time per entry. Each size
runs in a process of its own, so one size's peak is not another's.

    .venv/bin/python bench/query_bench.py --entries 1000000 10000000

There is no peer here: Kafka Streams' Interactive Queries read a running instance's store,
Spark's state data source reads a checkpoint; neither restores a store from a table as of a
batch. The numbers say what a query costs, not how it compares.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 500_000


def topology():
    from streamplatform import Processor, StreamsBuilder
    from streamplatform.serdes import Serdes
    from streamplatform.state import Stores

    class Keep(Processor):
        def process(self, record):
            pass

    b = StreamsBuilder()
    b.add_state_store(Stores.key_value_store_builder(
        Stores.persistent_key_value_store("big"), Serdes.string(), Serdes.long()))  # fmt: skip
    b.stream("in", Serdes.string(), Serdes.long()).process(Keep, "big")
    return b.build()


def write_snapshot(root: str, app: str, entries: int) -> None:
    """A snapshot of ``entries`` keys of store "big" of task 0_0, as batch 0, committed."""
    import pyarrow as pa

    from streamplatform.runtime import delta_direct
    from streamplatform.runtime.logs import CommitLog
    from streamplatform.state.transaction import DATA

    schema = pa.schema([("task", pa.string()), ("store", pa.string()), ("batch_id", pa.int64()),
                        ("seq", pa.int64()), ("column_family", pa.string()),
                        ("key", pa.binary()), ("value", pa.binary())])  # fmt: skip

    def chunks():
        for start in range(0, entries, CHUNK):
            n = min(CHUNK, entries - start)
            keys = [f"key-{i:010d}".encode() for i in range(start, start + n)]
            values = [i.to_bytes(8, "big", signed=True) for i in range(start, start + n)]
            yield pa.record_batch([
                pa.array(["0_0"] * n), pa.array(["big"] * n), pa.array([0] * n, pa.int64()),
                pa.array(range(-entries + start, -entries + start + n), pa.int64()),
                pa.array([DATA] * n), pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
            ], schema=schema)  # fmt: skip

    reader = pa.RecordBatchReader.from_batches(schema, chunks())
    delta_direct.append(f"{root}/{app}/_changelog", reader, f"{app}-changelog", 0,
                        partition_by=["task"])  # fmt: skip
    CommitLog(f"{root}/{app}/_commits", app).append(0, {}, {}, "exactly_once_v2")


def _status_mb(field: str) -> float:
    """A /proc/self/status memory figure in MB: VmRSS (now) or VmHWM (this process's peak;
    unlike getrusage's ru_maxrss, it does not inherit the parent's peak across fork and exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(root: str, app: str, entries: int) -> dict:
    from streamplatform.state_query import StateQuery

    before = _status_mb("VmRSS")
    started = time.perf_counter()
    with StateQuery(topology(), {"application.id": app, "platform.delta.root": root}) as state:
        store = state.store("big")
        restored = time.perf_counter()
        seen = sum(1 for _ in store.all())
        scanned = time.perf_counter()
        assert seen == entries, (seen, entries)
        assert store.get(f"key-{entries // 2:010d}") == entries // 2
    return {
        "entries": entries,
        "restore_s": restored - started,
        "scan_s": scanned - restored,
        "rss_before_mb": before,
        "peak_rss_mb": _status_mb("VmHWM"),
    }


def one_size(entries: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        root = f"{directory}/delta"
        write_snapshot(root, "query-bench", entries)
        # The query in a fresh process: its peak RSS is the query's alone.
        code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import query_bench; print(json.dumps(query_bench.measure({root!r}, "
                f"'query-bench', {entries})))")  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True).stdout  # fmt: skip
        return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[1_000_000, 10_000_000])
    args = parser.parse_args()
    print("entries | restore | scan (all) | per entry | RSS after imports | peak RSS")
    for entries in args.entries:
        r = one_size(entries)
        per = (r["restore_s"] + r["scan_s"]) / entries * 1e6
        print(f"{entries:,} | {r['restore_s']:.1f} s | {r['scan_s']:.1f} s | {per:.2f} us | "
              f"{r['rss_before_mb']:.0f} MB | {r['peak_rss_mb']:.0f} MB", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
