"""KIP-708 rack-aware standby placement: an assignor that is a pure function, data in, data out.

The rule is the one Kafka Streams ships (docs/semantics.md), applied in this order:

- Tasks take their turn one by one in task order: ``"<sub-topology>_<partition>"`` ids compare
  as numbers (``0_2`` before ``0_10``), like Kafka's TaskId; other text compares as text.
- Load of an instance = (active + standby tasks) / capacity. Every active counts from the start,
  stateless ones too; a standby counts as soon as it is placed. Ties go to the instance whose
  name sorts first.
- For a task with ``c`` copies so far (its active plus the standbys chosen so far) an instance
  *qualifies* when it holds no copy and shares no (key, value) tag with any copy. Only awareness
  keys that still constrain count: a key stops constraining once its number of distinct values
  (over all instances) is <= ``c`` — it has no unused value left ("partially preferred").
  The least-loaded qualifying instance gets the next standby.
- When no instance qualifies the task's remaining standbys wait. After every task had its turn
  they go, task by task, to the least-loaded instances holding no copy, with no tag rule
  ("least preferred").
- A task never has two copies on one instance, so at most ``instances - 1`` standbys; only
  stateful tasks get standbys (every task of ``active`` unless ``stateful_tasks`` is given).

Beyond Kafka:

- :func:`plan_standbys` returns a :class:`~streamplatform.placement.result.Placement` with the
  level every task reached (absolute / partial / least_preferred / unplaced) and the load per
  instance; :func:`assign_standbys` is the same run reduced to ``{task: [standby clients]}``.
- ``strict=True`` never trades a tag rule for a standby: a standby is placed only through the
  rule above while at least one awareness key still constrains, and there is no least-preferred
  pass. Every placed copy then differs from the others on the awareness key with the most
  values, so a task is absolute, partial or unplaced — never least_preferred.
- :func:`assign` first spreads the actives over the instances by capacity (each task, in task
  order, to the least-loaded instance), then places the standbys.
- Balance: the result is exactly Kafka's rule, so the spread of standbys per instance is the
  same as Kafka's on the same input (``bench/placement_bench.py`` and the tests compare both).
- Speed: instances with the same awareness values ("domains") pass or fail a tag rule
  together, so each domain keeps a heap of its instances by (load, name) and one heap holds the
  domains' least-loaded instances. A pick walks that heap from the least loaded and stops at
  the first domain the rule allows: a few heap operations, not a scan over every instance.

>>> kip_example = {  # the KIP's "least preferred" example: 2 zones x 2 clusters
...     "Node-1": {"zone": "eu-central-1a", "cluster": "K8s_Cluster1"},
...     "Node-2": {"zone": "eu-central-1b", "cluster": "K8s_Cluster1"},
...     "Node-3": {"zone": "eu-central-1a", "cluster": "K8s_Cluster2"},
...     "Node-4": {"zone": "eu-central-1b", "cluster": "K8s_Cluster2"},
... }
>>> assign_standbys(kip_example, {"0_0": "Node-1"}, 2, ["zone", "cluster"])
{'0_0': ['Node-4', 'Node-2']}
>>> plan_standbys(kip_example, {"0_0": "Node-1"}, 2, ["zone", "cluster"]).levels
{'0_0': 'least_preferred'}
>>> plan_standbys(kip_example, {"0_0": "Node-1"}, 2, ["zone", "cluster"], strict=True).standbys
{'0_0': ['Node-4']}
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from heapq import heapify, heappop, heappush

from streamplatform.placement.result import Placement, achieved_level
from streamplatform.placement.validation import awareness_keys, validate_inputs, validate_tasks

_DIGITS = re.compile(r"([0-9]+)")
_Entry = tuple[float, int]  # (load, rank): rank = position of the instance's name, sorted


def task_order_key(task: str) -> tuple[tuple[int | str, ...], str]:
    """Sort key of task ids: digit runs compare as numbers (``0_2`` < ``0_10``), then the text."""
    parts = _DIGITS.split(task)  # text, digits, text, ...: digits at odd positions
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts)), task


class _LeastLoaded:
    """The instances by least load, grouped in domains of equal awareness values.

    Heap entries are never updated in place: a new entry is pushed when an instance's load grows
    and an entry whose load is no longer the instance's is dropped when met (loads only grow, so
    an outdated entry always surfaces before the current one). ``tops`` holds exactly one
    current entry ``(load, rank, domain)`` per domain: its least-loaded instance.
    """

    def __init__(
        self,
        counts: list[int],
        capacity: list[int],
        domain_of: list[int],
        domain_values: list[tuple[int, ...]],
    ) -> None:
        self.counts = counts
        self.capacity = capacity
        self.load = [count / threads for count, threads in zip(counts, capacity, strict=True)]
        self.domain_values = domain_values
        self.members: list[list[_Entry]] = [[] for _ in domain_values]
        for rank, domain in enumerate(domain_of):
            self.members[domain].append((self.load[rank], rank))
        for heap in self.members:
            heapify(heap)
        self.tops = [(heap[0][0], heap[0][1], domain) for domain, heap in enumerate(self.members)]
        heapify(self.tops)

    def _top(self, domain: int) -> _Entry:
        heap = self.members[domain]
        while heap[0][0] != self.load[heap[0][1]]:
            heappop(heap)
        return heap[0]

    def _least_loaded_outside(self, domain: int, holders: set[int]) -> _Entry | None:
        """The domain's least-loaded instance that holds no copy of the task."""
        heap, held, found = self.members[domain], [], None
        while heap:
            entry = heap[0]
            if entry[0] != self.load[entry[1]]:
                heappop(heap)
            elif entry[1] in holders:
                held.append(heappop(heap))
            else:
                found = entry
                break
        for entry in held:
            heappush(heap, entry)
        return found

    def pick(
        self, holders: set[int], constraining: tuple[int, ...], used: list[set[int]]
    ) -> int | None:
        """Give a standby to the least-loaded instance outside ``holders`` whose values of the
        ``constraining`` keys are not in ``used``; return its rank, or None when none qualifies."""
        tops, best, best_domain, seen = self.tops, None, -1, []
        while tops:
            load, rank, domain = tops[0]
            if best is not None and (load, rank) > best:
                break
            heappop(tops)
            current = self._top(domain)
            if current[1] != rank or current[0] != load:
                continue  # outdated: the domain's current entry is elsewhere in the heap
            seen.append(domain)
            values = self.domain_values[domain]
            if any(values[key] in used[key] for key in constraining):
                continue
            candidate = (
                current if rank not in holders else self._least_loaded_outside(domain, holders)
            )
            if candidate is not None and (best is None or candidate < best):
                best, best_domain = candidate, domain
        for domain in seen:
            if domain != best_domain:
                entry = self.members[domain][0]
                heappush(tops, (entry[0], entry[1], domain))
        if best is None:
            return None
        chosen = best[1]
        self.counts[chosen] += 1
        self.load[chosen] = self.counts[chosen] / self.capacity[chosen]
        heappush(self.members[best_domain], (self.load[chosen], chosen))
        entry = self._top(best_domain)
        heappush(tops, (entry[0], entry[1], best_domain))
        return chosen


def plan_standbys(
    clients: Mapping[str, Mapping[str, str]],
    active: Mapping[str, str],
    num_standby_replicas: int,
    awareness: str | Iterable[str],
    *,
    capacity: Mapping[str, int] | None = None,
    strict: bool = False,
    stateful_tasks: Iterable[str] | None = None,
) -> Placement:
    """Place ``num_standby_replicas`` standbys of every stateful task of ``active``.

    ``clients`` maps each instance to its tags (``client.tag.<key>``), ``active`` each task to
    the instance running it, ``awareness`` lists the tag keys to spread over
    (``rack.aware.assignment.tags``: a list, or a comma-separated string), ``capacity`` gives
    instances a weight (stream threads; default 1). Raises ConfigError naming the setting when
    the inputs break the limits of docs/semantics.md. See the module docstring for the rule.
    """
    keys = awareness_keys(awareness)
    stateful_list = None if stateful_tasks is None else list(stateful_tasks)
    validate_inputs(clients, active, num_standby_replicas, keys, capacity, stateful_list)
    names = sorted(clients)
    rank_of = {name: rank for rank, name in enumerate(names)}
    threads = [(capacity or {}).get(name, 1) for name in names]
    counts = [0] * len(names)
    for client in active.values():
        counts[rank_of[client]] += 1

    # Tag values as small ints per key; a domain is one combination of awareness values.
    value_ids: list[dict[str, int]] = [{} for _ in keys]
    values_of = [
        tuple(ids.setdefault(tags[key], len(ids)) for ids, key in zip(value_ids, keys, strict=True))
        for tags in (clients[name] for name in names)
    ]
    domains: dict[tuple[int, ...], int] = {}
    domain_of = [domains.setdefault(values, len(domains)) for values in values_of]
    index = _LeastLoaded(counts, threads, domain_of, list(domains))

    order = sorted(active, key=task_order_key)
    stateful = set(active) if stateful_list is None else set(stateful_list)
    copies = {task: [rank_of[active[task]]] for task in order if task in stateful}
    waiting = _place_by_tags(
        index, copies, values_of, [len(ids) for ids in value_ids], num_standby_replicas, strict
    )
    if not strict:
        _place_least_preferred(index, copies, waiting, num_standby_replicas)

    return Placement(
        active={task: active[task] for task in order},
        standbys={
            task: [names[rank] for rank in copies[task][1:]] if task in copies else []
            for task in order
        },
        levels={
            task: achieved_level(
                [values_of[rank] for rank in placed], num_standby_replicas + 1 - len(placed)
            )
            for task, placed in copies.items()
        },
        capacity=dict(zip(names, threads, strict=True)),
        load=dict(zip(names, index.load, strict=True)),
    )


def _place_by_tags(
    index: _LeastLoaded,
    copies: dict[str, list[int]],
    values_of: list[tuple[int, ...]],
    distinct: list[int],
    replicas: int,
    strict: bool,
) -> list[str]:
    """Kafka's first pass: each task in turn (``copies`` holds each one's active, in task order)
    gets standbys that qualify under the tag rule; returns the tasks left short."""
    keys = range(len(distinct))
    constraining_at = [
        tuple(key for key in keys if distinct[key] > placed) for placed in range(replicas + 1)
    ]
    waiting = []
    for task, placed in copies.items():
        holders = set(placed)
        used = [{value} for value in values_of[placed[0]]]
        while len(placed) <= replicas:
            constraining = constraining_at[len(placed)]
            if strict and distinct and not constraining:
                break  # every awareness key ran out of values: a standby would share them all
            rank = index.pick(holders, constraining, used)
            if rank is None:
                break
            placed.append(rank)
            holders.add(rank)
            for key, value in enumerate(values_of[rank]):
                used[key].add(value)
        if len(placed) <= replicas:
            waiting.append(task)
    return waiting


def _place_least_preferred(
    index: _LeastLoaded, copies: dict[str, list[int]], waiting: list[str], replicas: int
) -> None:
    """Kafka's second pass: the tasks left short, in task order, take the least-loaded
    instances holding no copy, with no tag rule."""
    for task in waiting:
        placed = copies[task]
        holders = set(placed)
        while len(placed) <= replicas:
            rank = index.pick(holders, (), [])
            if rank is None:
                break
            placed.append(rank)
            holders.add(rank)


def assign_standbys(
    clients: Mapping[str, Mapping[str, str]],
    active: Mapping[str, str],
    num_standby_replicas: int,
    awareness: str | Iterable[str],
    *,
    capacity: Mapping[str, int] | None = None,
    strict: bool = False,
    stateful_tasks: Iterable[str] | None = None,
) -> dict[str, list[str]]:
    """Kafka's placement as ``{task: [standby clients]}``, every task of ``active`` listed.

    The same run as :func:`plan_standbys`, for callers that need only the standbys.
    """
    placement = plan_standbys(
        clients,
        active,
        num_standby_replicas,
        awareness,
        capacity=capacity,
        strict=strict,
        stateful_tasks=stateful_tasks,
    )
    return dict(placement.standbys)


def assign(
    clients: Mapping[str, Mapping[str, str]],
    tasks: Iterable[str],
    num_standby_replicas: int,
    awareness: str | Iterable[str],
    *,
    capacity: Mapping[str, int] | None = None,
    strict: bool = False,
    stateful_tasks: Iterable[str] | None = None,
) -> Placement:
    """Place actives, then standbys: each task in task order goes active to the instance with
    the fewest actives per unit of capacity (ties by name), then :func:`plan_standbys` runs.

    >>> plan = assign({"a": {"zone": "1"}, "b": {"zone": "2"}, "c": {"zone": "2"}},
    ...               ["0_0", "0_1", "0_2", "0_3"], 1, ["zone"], capacity={"a": 2})
    >>> plan.active
    {'0_0': 'a', '0_1': 'b', '0_2': 'c', '0_3': 'a'}
    >>> plan.standbys
    {'0_0': ['b'], '0_1': ['a'], '0_2': ['a'], '0_3': ['c']}
    """
    task_list = list(tasks)
    validate_tasks(clients, task_list)
    validate_inputs(clients, {}, num_standby_replicas, awareness_keys(awareness), capacity, None)
    names = sorted(clients)
    threads = {name: (capacity or {}).get(name, 1) for name in names}
    heap = [(0.0, rank, name) for rank, name in enumerate(names)]
    actives_on = dict.fromkeys(names, 0)
    active: dict[str, str] = {}
    for task in sorted(task_list, key=task_order_key):
        _, rank, name = heappop(heap)
        active[task] = name
        actives_on[name] += 1
        heappush(heap, (actives_on[name] / threads[name], rank, name))
    return plan_standbys(
        clients,
        active,
        num_standby_replicas,
        awareness,
        capacity=capacity,
        strict=strict,
        stateful_tasks=stateful_tasks,
    )
