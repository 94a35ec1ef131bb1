"""Properties of the assignor on random clusters, checked against the tags themselves and
against a plain implementation of Kafka's rule (the benchmark's peer)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from property_budget import examples

from bench.placement_bench import kafka_rule_peer, spread
from streamplatform.placement import Placement, assign, plan_standbys

SETTINGS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
KEYS = ("zone", "cluster", "rack")


@st.composite
def clusters(draw, min_instances: int = 1):
    """Instances with up to 3 tag keys of few values (shared values are the interesting case),
    capacities 1-3, tasks active anywhere, some stateless, an awareness list in any order."""
    keys = draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=3))
    values = {key: draw(st.integers(1, 4)) for key in keys}
    count = draw(st.integers(min_instances, 9))
    names = [f"n{i}" for i in range(count)]
    clients = {
        name: {key: f"{key}{draw(st.integers(0, values[key] - 1))}" for key in keys}
        for name in names
    }
    capacity = {name: draw(st.integers(1, 3)) for name in names}
    tasks = [f"{s}_{p}" for s in range(2) for p in range(draw(st.integers(0, 8)))]
    active = {task: draw(st.sampled_from(names)) for task in tasks}
    stateful = draw(st.none() | st.lists(st.sampled_from(tasks), unique=True)) if tasks else None
    awareness = draw(st.permutations(keys))
    replicas = draw(st.integers(0, 4))
    return clients, active, replicas, awareness, capacity, stateful


def apart(clients, copies, key) -> bool:
    values = [clients[client][key] for client in copies]
    return len(set(values)) == len(values)


def check_levels(placement: Placement, clients, replicas, awareness) -> None:
    """Every level claims exactly what the tags of the task's copies show."""
    for task, level in placement.levels.items():
        standbys = placement.standbys[task]
        copies = [placement.active[task], *standbys]
        keys_apart = [apart(clients, copies, key) for key in awareness]
        if len(standbys) < replicas:
            assert level == "unplaced"
        elif all(keys_apart):
            assert level == "absolute"
        elif any(keys_apart):
            assert level == "partial"
        else:
            assert level == "least_preferred"


@SETTINGS
@given(clusters())
def test_copies_counts_levels_and_load(case):
    clients, active, replicas, awareness, capacity, stateful = case
    placement = plan_standbys(
        clients, active, replicas, awareness, capacity=capacity, stateful_tasks=stateful
    )
    stateful_set = set(active) if stateful is None else set(stateful)
    assert list(placement.standbys) == sorted(active, key=lambda t: tuple(map(int, t.split("_"))))
    for task, standbys in placement.standbys.items():
        copies = [active[task], *standbys]
        assert len(set(copies)) == len(copies)  # never two copies on one instance
        if task in stateful_set:
            # Kafka's least-preferred pass fills every standby an instance is left for.
            assert len(standbys) == min(replicas, len(clients) - 1)
        else:
            assert standbys == []
    assert set(placement.levels) == stateful_set
    check_levels(placement, clients, replicas, awareness)
    tasks_on = Counter(active.values()) + Counter(placement.standby_counts())
    assert placement.load == {c: tasks_on[c] / capacity[c] for c in clients}


@SETTINGS
@given(clusters())
def test_exactly_the_plain_kafka_rule_so_balance_is_never_worse(case):
    clients, active, replicas, awareness, capacity, _ = case
    placement = plan_standbys(clients, active, replicas, awareness, capacity=capacity)
    peer = kafka_rule_peer(clients, active, replicas, awareness, capacity)
    assert dict(placement.standbys) == peer
    assert placement.standby_spread() <= spread(clients, peer)


@SETTINGS
@given(clusters(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_input_order(case, rnd):
    clients, active, replicas, awareness, capacity, stateful = case

    def shuffled(mapping):
        items = list(mapping.items())
        rnd.shuffle(items)
        return dict(items)

    first = plan_standbys(
        clients, active, replicas, awareness, capacity=capacity, stateful_tasks=stateful
    )
    again = plan_standbys(
        {name: shuffled(tags) for name, tags in shuffled(clients).items()},
        shuffled(active),
        replicas,
        awareness,
        capacity=shuffled(capacity),
        stateful_tasks=None if stateful is None else rnd.sample(stateful, len(stateful)),
    )
    assert first == again
    assert list(first.standbys.items()) == list(again.standbys.items())


@SETTINGS
@given(clusters())
def test_strict_mode_never_breaks_a_tag_rule(case):
    clients, active, replicas, awareness, capacity, stateful = case
    placement = plan_standbys(
        clients,
        active,
        replicas,
        awareness,
        capacity=capacity,
        stateful_tasks=stateful,
        strict=True,
    )
    check_levels(placement, clients, replicas, awareness)
    assert "least_preferred" not in placement.levels.values()
    for task in placement.levels:
        copies = [active[task], *placement.standbys[task]]
        assert len(set(copies)) == len(copies)
        if awareness:  # some awareness key keeps every copy apart, even when some are missing
            assert any(apart(clients, copies, key) for key in awareness)
    if not awareness:  # no tag rule to break: strict changes nothing
        assert placement == plan_standbys(
            clients, active, replicas, awareness, capacity=capacity, stateful_tasks=stateful
        )


@SETTINGS
@given(
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 2),
    st.integers(0, 4),
    st.integers(0, 30),
)
def test_kip_formulas_on_full_grids(zones, clusters_, per_cell, replicas, tasks):
    """Every zone x cluster cell holds instances: the KIP's formulas predict the level."""
    clients = {
        f"n{z}{c}{i}": {"zone": f"z{z}", "cluster": f"c{c}"}
        for z in range(zones)
        for c in range(clusters_)
        for i in range(per_cell)
    }
    placement = assign(clients, [f"0_{p}" for p in range(tasks)], replicas, ["zone", "cluster"])
    if replicas > len(clients) - 1:
        expected = "unplaced"
    elif replicas <= min(zones, clusters_) - 1:
        expected = "absolute"
    elif replicas <= max(zones, clusters_) - 1:
        expected = "partial"
    else:
        expected = "least_preferred"
    assert set(placement.levels.values()) <= {expected}
    assert len(placement.levels) == tasks


@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), st.integers(0, 40))
def test_assign_spreads_actives_by_capacity(capacities, tasks):
    clients = {f"n{i}": {} for i in range(len(capacities))}
    capacity = dict(zip(clients, capacities, strict=True))
    placement = assign(clients, [f"0_{p}" for p in range(tasks)], 0, [], capacity=capacity)
    actives = placement.active_counts()
    per_thread = {c: Fraction(actives[c], capacity[c]) for c in clients}
    # Each task went to the instance with the fewest actives per thread, so an instance's load
    # before its last active was at most any other instance's final load.
    for c in clients:
        if actives[c]:
            assert per_thread[c] - Fraction(1, capacity[c]) <= min(per_thread.values())
