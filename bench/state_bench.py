"""State store throughput against raw rocksdict, measured in the same run on one core.

Workload: N records of 64-byte values over K keys (record i has key i % K and, for the
versioned store, timestamp 10 * i ms), so every key gets N / K versions in time order.

Targets (issue 3), each a ratio to raw rocksdict measured here:
- transactional writes, committed every 10k records  >= 1.0x raw single puts
- versioned in-order puts (committed every 10k)      >= 0.5x raw single puts
- versioned get(key, as_of) hitting the latest       >= 0.7x raw gets
- versioned get(key, as_of) hitting older versions   >= 0.3x raw gets

Raw puts are `Rdict.put` one at a time with default options, over the same N records; raw
gets are `Rdict.get` of the same keys from that DB. Versioned gets run with the store's
caches (latest versions, and hot keys' histories) on (the default) and off. One more raw
figure gives context to the older-version gets: gets from a raw DB holding N distinct keys, as
much data as the versioned history. Each figure is the best of --repeat runs; stores are
reopened before reads, so with caches on the first run fills them and the best run reads them
warm: a last row (context) times single passes, each over a freshly reopened store.

Run: .venv/bin/python bench/state_bench.py [--records N] [--keys K] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from rocksdict import Options, Rdict

from streamplatform.state import StoreOptions, TransactionalKeyValueStore, VersionedKeyValueStore

COMMIT_EVERY = 10_000
TIME_STEP_MS = 10
TOPIC_PARTITION = ("bench", 0)


class Closeable(Protocol):
    def close(self) -> None: ...


StoreT = TypeVar("StoreT", bound=Closeable)


def key_of(j: int) -> bytes:
    return b"key-%08d" % j


class Bench:
    """The workload, plus one open store at a time (RocksDB locks a directory while open)."""

    def __init__(self, records: int, keys: int, repeat: int, directory: Path) -> None:
        self.records, self.repeat, self.directory = records, repeat, directory
        self.value = os.urandom(64)
        self.keys = [key_of(i % keys) for i in range(records)]
        rng = random.Random(7)
        lookups = [rng.randrange(keys) for _ in range(records)]
        self.lookup_keys = [key_of(j) for j in lookups]
        # as_of inside version r (not the last) of key j: answered from history.
        versions = records // keys
        self.older = [
            (key_of(j), (j + rng.randrange(versions - 1) * keys) * TIME_STEP_MS + 5)
            for j in lookups
        ]
        self.retention_ms = 2 * records * TIME_STEP_MS  # nothing expires during the run
        self._open: Closeable | None = None

    def open(self, opener: Callable[[], StoreT]) -> StoreT:
        """Open a store (after `path` closed the previous one) and remember to close it."""
        store = opener()
        self._open = store
        return store

    def rate(self, prepare: Callable[[], Callable[[], object]]) -> float:
        """Operations per second of the best run; `prepare` (untimed) returns the run."""
        best = float("inf")
        for _ in range(self.repeat):
            run = prepare()
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
        return self.records / best

    def path(self, name: str, fresh: bool) -> Path:
        """Close the open store; return the path of `name`, emptied when `fresh`."""
        if self._open is not None:
            self._open.close()
            self._open = None
        path = self.directory / name
        if fresh and path.exists():
            Rdict.destroy(str(path))
        return path

    # -- raw rocksdict -------------------------------------------------------------------

    def raw(self, name: str, fresh: bool) -> Rdict:
        path = self.path(name, fresh)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        return self.open(lambda: Rdict(str(path), options))

    def raw_puts(self) -> float:
        def prepare() -> Callable[[], None]:
            put, value = self.raw("raw", fresh=True).put, self.value

            def run() -> None:
                for key in self.keys:
                    put(key, value)

            return run

        return self.rate(prepare)

    def raw_gets(self, name: str, keys: list[bytes]) -> float:
        get = self.raw(name, fresh=False).get

        def run() -> None:
            for key in keys:
                get(key)

        return self.rate(lambda: run)

    def raw_gets_of_distinct_keys(self) -> float:
        distinct = [b"%s.%d" % (key, i) for i, key in enumerate(self.keys)]
        db = self.raw("distinct", fresh=True)
        for key in distinct:
            db.put(key, self.value)
        return self.raw_gets("distinct", random.Random(9).sample(distinct, len(distinct)))

    # -- our stores ----------------------------------------------------------------------

    def transactional_puts(self) -> float:
        def prepare() -> Callable[[], None]:
            path = self.path("transactional", fresh=True)
            store = self.open(lambda: TransactionalKeyValueStore(path))

            def run() -> None:
                put, value = store.transaction.put, self.value
                for i, key in enumerate(self.keys, 1):
                    put(key, value)
                    if i % COMMIT_EVERY == 0:
                        store.commit({TOPIC_PARTITION: i})
                store.commit({TOPIC_PARTITION: self.records})

            return run

        return self.rate(prepare)

    def versioned(self, fresh: bool, caches: bool = True) -> VersionedKeyValueStore:
        path = self.path("versioned", fresh)
        options = StoreOptions()
        if not caches:
            options = StoreOptions(latest_cache_entries=0, history_cache_bytes=0)
        return self.open(lambda: VersionedKeyValueStore(path, self.retention_ms, options=options))

    def versioned_puts(self) -> float:
        def prepare() -> Callable[[], None]:
            store = self.versioned(fresh=True)

            def run() -> None:
                put, value = store.put, self.value
                for i, key in enumerate(self.keys, 1):
                    put(key, value, (i - 1) * TIME_STEP_MS)
                    if i % COMMIT_EVERY == 0:
                        store.commit({TOPIC_PARTITION: i})
                store.commit({TOPIC_PARTITION: self.records})

            return run

        return self.rate(prepare)

    def versioned_gets(self, caches: bool, older: bool, cold: bool = False) -> float:
        """Gets of the latest or of older versions; `cold`: each run on a reopened store."""
        if older:
            queries = self.older
        else:
            now = self.records * TIME_STEP_MS
            queries = [(key, now) for key in self.lookup_keys]

        def prepare() -> Callable[[], None]:
            store = self.versioned(fresh=False, caches=caches)
            if older:
                found = store.get(*queries[0])
                assert found is not None and found.valid_to is not None, found

            def run() -> None:
                get = store.get
                for key, as_of in queries:
                    get(key, as_of)

            return run

        if cold:
            return self.rate(prepare)
        run = prepare()
        return self.rate(lambda: run)

    def close(self) -> None:
        self.path("", fresh=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per workload")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best kept)")
    args = parser.parse_args()
    if args.records < 2 * args.keys:
        parser.error("--records must be at least twice --keys (older versions are queried)")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})  # one core, inherited by RocksDB's background threads
    with tempfile.TemporaryDirectory(prefix="state-bench-") as directory:
        bench = Bench(args.records, args.keys, args.repeat, Path(directory))
        print(f"{args.records:,} records over {args.keys:,} keys, best of {args.repeat} runs")
        raw_put = bench.raw_puts()
        raw_get = bench.raw_gets("raw", bench.lookup_keys)
        rows = [
            ("raw rocksdict put", raw_put, None, None),
            ("raw rocksdict get", raw_get, None, None),
            ("raw get, N distinct keys (context)", bench.raw_gets_of_distinct_keys(), None, None),
            ("transactional put, commit/10k", bench.transactional_puts(), raw_put, 1.0),
            ("versioned in-order put, commit/10k", bench.versioned_puts(), raw_put, 0.5),
        ]
        for label, caches in (("cache on", True), ("cache off", False)):
            latest = bench.versioned_gets(caches, older=False)
            rows.append((f"versioned get latest ({label})", latest, raw_get, 0.7))
            older = bench.versioned_gets(caches, older=True)
            rows.append((f"versioned get older ({label})", older, raw_get, 0.3))
        first_pass = bench.versioned_gets(True, older=True, cold=True)
        rows.append(("older, cache on, 1st pass (context)", first_pass, raw_get, None))
        bench.close()
    print(f"{'workload':40s} {'ops/s':>10s} {'us/op':>7s} {'ratio':>6s} {'target':>7s}")
    for label, rate, base, target in rows:
        line = f"{label:40s} {rate:10,.0f} {1e6 / rate:7.2f}"
        if base is not None:
            line += f" {rate / base:5.2f}x"
        if base is not None and target is not None:
            verdict = "met" if rate / base >= target else "MISSED"
            line += f" {target:>5.1f}x {verdict}"
        print(line)


if __name__ == "__main__":
    main()
