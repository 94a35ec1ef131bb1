"""KIP-708 standby placement: streamplatform's assignor against a plain version of Kafka's rule.

10,000 tasks over 1,000 instances tagged with 10 zones x 5 clusters, 10 actives per instance,
2 standbys, awareness [zone, cluster]. The peer, :func:`kafka_rule_peer`, is Kafka's rule as
docs/semantics.md states it, written the straightforward way (every standby scans every
instance); both run in the same process. Prints both times, the ratio, the load spread (max -
min standbys per instance) of both, and whether the two placements are identical.

    .venv/bin/python bench/placement_bench.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from streamplatform.placement import plan_standbys
from streamplatform.placement.assignor import task_order_key

INSTANCES, TASKS, STANDBYS, ZONES, CLUSTERS = 1_000, 10_000, 2, 10, 5


def kafka_rule_peer(
    clients: Mapping[str, Mapping[str, str]],
    active: Mapping[str, str],
    num_standby_replicas: int,
    awareness: Sequence[str],
    capacity: Mapping[str, int] | None = None,
) -> dict[str, list[str]]:
    """Kafka's rule, plainly: for each standby, the least-loaded instance (load = tasks /
    capacity, ties by name) holding no copy and sharing no (key, value) with a copy, on keys
    with more distinct values than copies so far; leftovers, after all tasks, least-loaded."""
    names = sorted(clients)
    threads = {name: (capacity or {}).get(name, 1) for name in names}
    assigned = Counter(active.values())
    distinct = {key: len({clients[name][key] for name in names}) for key in awareness}
    copies = {task: [client] for task, client in active.items()}

    def least_loaded(candidates: list[str]) -> str:
        return min(candidates, key=lambda name: (assigned[name] / threads[name], name))

    waiting = []
    for task in sorted(active, key=task_order_key):
        placed = copies[task]
        while len(placed) <= num_standby_replicas:
            keys = [key for key in awareness if distinct[key] > len(placed)]
            used = {(key, clients[client][key]) for client in placed for key in keys}
            candidates = [
                name
                for name in names
                if name not in placed and not any((key, clients[name][key]) in used for key in keys)
            ]
            if not candidates:
                waiting.append(task)
                break
            chosen = least_loaded(candidates)
            assigned[chosen] += 1
            placed.append(chosen)
    for task in waiting:
        placed = copies[task]
        while len(placed) <= num_standby_replicas:
            candidates = [name for name in names if name not in placed]
            if not candidates:
                break
            chosen = least_loaded(candidates)
            assigned[chosen] += 1
            placed.append(chosen)
    return {task: placed[1:] for task, placed in copies.items()}


def spread(clients: Mapping[str, object], standbys: Mapping[str, list[str]]) -> int:
    """max - min standby tasks per instance, every instance counted."""
    counts = Counter(client for placed in standbys.values() for client in placed)
    per_instance = [counts[client] for client in clients]
    return max(per_instance) - min(per_instance)


def workload() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Instances i0000..i0999 over 10 zones x 5 clusters; task s_p active on instance (10s+p)."""
    clients = {
        f"i{i:04d}": {"zone": f"zone-{i % ZONES}", "cluster": f"cluster-{(i // ZONES) % CLUSTERS}"}
        for i in range(INSTANCES)
    }
    names = sorted(clients)
    per_subtopology = TASKS // 10
    active = {
        f"{s}_{p}": names[(s * per_subtopology + p) % INSTANCES]
        for s in range(10)
        for p in range(per_subtopology)
    }
    return clients, active


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of ours (median reported)")
    repeat = parser.parse_args().repeat
    clients, active = workload()
    awareness = ["zone", "cluster"]

    ours_times = []
    for _ in range(repeat):
        started = time.perf_counter()
        placement = plan_standbys(clients, active, STANDBYS, awareness)
        ours_times.append(time.perf_counter() - started)
    started = time.perf_counter()
    peer = kafka_rule_peer(clients, active, STANDBYS, awareness)
    peer_time = time.perf_counter() - started
    ours_time = statistics.median(ours_times)

    print(
        f"KIP-708 standby placement: {len(active):,} tasks, {len(clients):,} instances "
        f"({ZONES} zones x {CLUSTERS} clusters), {STANDBYS} standbys, awareness zone,cluster"
    )
    print(
        f"ours  plan_standbys (heaps per tag domain)    {ours_time:8.3f} s  "
        f"(median of {repeat}, min {min(ours_times):.3f} s)"
    )
    print(f"peer  Kafka's rule, scan per standby          {peer_time:8.3f} s  (1 run)")
    print(f"ratio peer / ours                             {peer_time / ours_time:8.1f} x")
    print(
        f"standby spread (max - min per instance)       ours {placement.standby_spread()}   "
        f"peer {spread(clients, peer)}"
    )
    print(f"identical placement to the peer               {dict(placement.standbys) == peer}")
    print(f"levels (ours)                                 {placement.level_counts()}")


if __name__ == "__main__":
    main()
