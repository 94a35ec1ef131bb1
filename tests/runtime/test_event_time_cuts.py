"""Any batch cut of live traffic gives the test driver's answer (docs/semantics.md, "Event time
across partitions and batches"), without Spark: the runtime's task code run batch after batch
by a model of the driver's plans (batch_model.py), records arriving in event-time order across
partitions and topics, random partition counts, batch caps (one record included) and arrival
cuts, against the test driver fed the same records in the order they arrived."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from streamplatform import (
    EmitStrategy,
    JoinWindows,
    SessionWindows,
    SlidingWindows,
    StreamsBuilder,
    TimeWindows,
)
from streamplatform.serdes import Serdes
from streamplatform.state import Stores

from .batch_model import Arrival, BatchModel, model_output, through_the_test_driver

SECOND = 1_000


def _final_counts_into_out(grouped, grace_s: int) -> None:
    """10-second windows' final counts of ``grouped``, into the topic "out"."""
    (
        grouped.windowed_by(TimeWindows.of_size_and_grace(timedelta(seconds=10),
                                                          timedelta(seconds=grace_s)))
        .emit_strategy(EmitStrategy.on_window_close())
        .count()
        .to_stream()
        .map(lambda w, n: (f"{w.key}@{w.window.start}", n))
        .to("out", key_serde=Serdes.string(), value_serde=Serdes.long())
    )  # fmt: skip


def rekeyed_windowed_count():
    b = StreamsBuilder()
    clicks = b.stream("clicks", Serdes.string(), Serdes.json())
    _final_counts_into_out(clicks.group_by(lambda k, v: v["page"], key_serde=Serdes.string()), 2)
    return b.build(), ["clicks"]


def stream_stream_join():
    b = StreamsBuilder()
    shown = b.stream("impressions", Serdes.string(), Serdes.json())
    clicked = b.stream("clicks", Serdes.string(), Serdes.json())
    windows = JoinWindows.of_time_difference_with_no_grace(timedelta(seconds=10)).after(0)
    clicked.join(shown, lambda c, i: [c["n"], i["n"]], windows).to("out")
    return b.build(), ["impressions", "clicks"]


def dedup_of_two_merged_topics():
    b = StreamsBuilder()
    web = b.stream("web", Serdes.string(), Serdes.json())
    app = b.stream("app", Serdes.string(), Serdes.json())
    web.merge(app).deduplicate_by_key(timedelta(seconds=5)).to("out")
    return b.build(), ["web", "app"]


def stream_table_join():
    b = StreamsBuilder()
    rates = b.table("rates", Serdes.string(), Serdes.json(),
                    store=Stores.persistent_versioned_key_value_store(
                        "rates", timedelta(minutes=10)))  # fmt: skip
    b.stream("orders", Serdes.string(), Serdes.json()).join(
        rates, lambda o, r: [o["n"], r["n"]]
    ).to("out")
    return b.build(), ["orders", "rates"]


def _final_counts_per_window(windows):
    """Final counts of each key's ``windows`` (session or sliding) of "clicks", into "out"."""
    b = StreamsBuilder()
    (
        b.stream("clicks", Serdes.string(), Serdes.json())
        .group_by_key()
        .windowed_by(windows)
        .emit_strategy(EmitStrategy.on_window_close())
        .count()
        .to_stream()
        .map(lambda w, n: (f"{w.key}@{w.window.start}-{w.window.end}", n))
        .to("out", key_serde=Serdes.string(), value_serde=Serdes.long())
    )  # fmt: skip
    return b.build(), ["clicks"]


def session_counts():
    return _final_counts_per_window(
        SessionWindows.of_inactivity_gap_and_grace(timedelta(seconds=4), timedelta(seconds=1))
    )


def sliding_counts():
    """Kafka Streams' sliding windows (5 s apart at most, 1 s of grace), final counts: the
    windows not yet emitted and a key's windows held in memory across batches."""
    return _final_counts_per_window(
        SlidingWindows.of_time_difference_and_grace(timedelta(seconds=5), timedelta(seconds=1))
    )


def join_of_two_rekeyed_streams():
    """Three sub-topologies: each stream re-keyed by page, then joined within 10 s."""
    b = StreamsBuilder()
    views = b.stream("views", Serdes.string(), Serdes.json()).select_key(lambda k, v: v["page"])
    buys = b.stream("buys", Serdes.string(), Serdes.json()).select_key(lambda k, v: v["page"])
    windows = JoinWindows.of_time_difference_with_no_grace(timedelta(seconds=10))
    views.join(buys, lambda v, p: [v["n"], p["n"]], windows).to("out")
    return b.build(), ["views", "buys"]


def two_repartitions_in_a_row():
    """Re-keyed by page and deduplicated there, then counted per user again."""
    b = StreamsBuilder()
    deduplicated = (
        b.stream("clicks", Serdes.string(), Serdes.json())
        .select_key(lambda k, v: v["page"])
        .repartition()
        .deduplicate_by_key(timedelta(seconds=2))
    )
    _final_counts_into_out(
        deduplicated.group_by(lambda page, v: f"u{v['n'] % 3}", key_serde=Serdes.string()), 1
    )
    return b.build(), ["clicks"]


def live_traffic(rng: random.Random, topics: list[str], partitions: int) -> list[Arrival]:
    """Records in event-time order over ``topics``' partitions; a key always on the same
    partition, as a producer's partitioner puts it. Records of one time arrive in the order a
    task breaks such ties (topic, then partition; Kafka Streams leaves it open)."""
    arrivals, time = [], 1_000_000
    for n in range(rng.randint(5, 45)):
        time += rng.choice([0, SECOND // 2, SECOND, 3 * SECOND, 7 * SECOND])
        key = f"k{rng.randrange(4)}"
        partition = int(key[1:]) % partitions
        value = {"n": n, "page": rng.choice("ab")}
        arrivals.append(Arrival(rng.choice(topics), partition, key, value, time))
    return sorted(arrivals, key=lambda a: (a.timestamp, a.topic, a.partition))


def run_cut(make, seed: int, tmp_path) -> tuple[list, list, int]:
    rng = random.Random(seed)
    topology, topics = make()
    partitions = rng.randint(1, 3)
    arrivals = live_traffic(rng, topics, partitions)
    want = through_the_test_driver(make()[0], arrivals, "out", partitions)
    model = BatchModel(topology, dict.fromkeys(topics, partitions), tmp_path / f"s{seed}")
    pending = list(arrivals)
    batches = 0
    while pending or model.buffered or batches == 0:
        for _ in range(rng.randint(0, 8)):  # what has arrived when the batch is planned
            if pending:
                model.arrive(pending.pop(0))
        ran = model.run_batch(rng.choice([1, 1, 2, 3, 5, 100]))
        batches += 1
        assert batches < 500, "the batches never caught up"
        if not ran and not pending:
            break
    while model.run_batch(rng.choice([1, 2, 100])):  # what the caps left
        batches += 1
        assert batches < 500
    return sorted(model_output(model, "out")), sorted(want), batches


SHAPES = [rekeyed_windowed_count, stream_stream_join, dedup_of_two_merged_topics,
          stream_table_join, session_counts, sliding_counts, join_of_two_rekeyed_streams,
          two_repartitions_in_a_row]  # fmt: skip


@pytest.mark.parametrize("make", SHAPES, ids=lambda make: make.__name__)
@pytest.mark.parametrize("seed", range(3))
def test_any_cut_gives_the_test_drivers_answer(make, seed, tmp_path):
    got, want, _ = run_cut(make, seed, tmp_path)
    assert got == want


@pytest.mark.slow  # many examples
@pytest.mark.parametrize("make", SHAPES, ids=lambda make: make.__name__)
@pytest.mark.parametrize("seed", range(3, 30))
def test_any_cut_gives_the_test_drivers_answer_on_many_examples(make, seed, tmp_path):
    got, want, _ = run_cut(make, seed, tmp_path)
    assert got == want
