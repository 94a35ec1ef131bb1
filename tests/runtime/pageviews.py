"""A team's own job, written as a Kafka Streams user would: page views, bots filtered out,
deduplicated by event id, counted per user by a processor with a typed key-value store
(``store.get`` then ``store.put``), the counts to a Kafka topic and the views to a Delta table.

Only public names of the library. Spark's workers import it by module (the tests put this
folder on their path), as a team's own package would be.
"""

from __future__ import annotations

import json
from datetime import timedelta

from streamplatform import Processor, StreamsBuilder, TopologyTestDriver
from streamplatform.kafka import producer
from streamplatform.serdes import Serdes
from streamplatform.state import Stores

USERS = 4
PARTITIONS = 2


class CountViews(Processor):
    """Views per user: the running count, forwarded with each view."""

    def init(self, context):
        super().init(context)
        self.counts = context.get_state_store("view-counts")

    def process(self, record):
        count = (self.counts.get(record.key) or 0) + 1
        self.counts.put(record.key, count)
        self.context.forward(record._replace(value=count))


def pageviews(views: str, counts: str, deduplicated: str):
    b = StreamsBuilder()
    b.add_state_store(
        Stores.key_value_store_builder(
            Stores.persistent_key_value_store("view-counts"), Serdes.string(), Serdes.long()
        )
    )
    real = (
        b.stream(views, Serdes.string(), Serdes.json())
        .filter(lambda user, view: not view.get("bot"))
        .deduplicate_by_key_value(lambda user, view: view["event_id"], timedelta(minutes=5))
    )
    real.to(deduplicated)
    real.process(CountViews, "view-counts").to(counts, value_serde=Serdes.long())
    return b.build()


def make_views(records: int) -> list[tuple[int, str, dict, int]]:
    """``(partition, user, view, timestamp)``: users spread over two partitions, every 7th
    view a bot's, every 5th a duplicate of the view two before it (same event id)."""
    views = []
    for index in range(records):
        user = f"user-{index % USERS}"
        partition = index % USERS % PARTITIONS
        event = index - 8 if index % 5 == 0 and index >= 8 else index  # same user: 8 % 4 == 0
        view = {"event_id": f"e{event}", "page": f"/p{index % 3}", "bot": index % 7 == 0}
        views.append((partition, user, view, 1_000_000 + index * 500))
    return views


def produce_views(kafka_settings, topic: str, views) -> None:
    writer = producer(kafka_settings, **{"enable.idempotence": True})
    for partition, user, view, timestamp in views:
        writer.produce(topic, key=user.encode(), value=json.dumps(view).encode(),
                       partition=partition, timestamp=timestamp)  # fmt: skip
    assert writer.flush(120) == 0, "the broker did not acknowledge every view"


def counts_with_the_test_driver(views, commit_every: int | None = 1) -> list[tuple[str, int]]:
    """The counts topic's records, per partition in order, as the test driver gives them."""
    topology = pageviews("views", "counts", "deduplicated")
    out = []
    with TopologyTestDriver(topology, {"application.id": "expected"},
                            commit_every=commit_every) as driver:  # fmt: skip
        source = driver.create_input_topic("views", Serdes.string(), Serdes.json())
        for partition in range(PARTITIONS):
            for p, user, view, timestamp in views:
                if p == partition:
                    source.pipe_input(user, view, timestamp=timestamp, partition=partition)
        counts = driver.create_output_topic("counts", Serdes.string(), Serdes.long())
        out = counts.read_key_values_to_list()
    return out


def expected_counts(views) -> dict[str, list[int]]:
    """``{user: the counts forwarded for them, in order}`` from the test driver."""
    expected: dict[str, list[int]] = {}
    for user, count in counts_with_the_test_driver(views):
        expected.setdefault(user, []).append(count)
    return expected


def duplicates_in(views) -> int:
    """Duplicates the dedup drops in an uninterrupted run: the non-bot views whose event id a
    non-bot view of the same user had before (make_views repeats ids two views apart)."""
    seen, dropped = set(), 0
    for _, user, view, _ in views:
        if view["bot"]:
            continue
        identity = (user, view["event_id"])
        dropped += identity in seen
        seen.add(identity)
    return dropped


def counts_per_user(records) -> dict[str, list[int]]:
    """The counts topic's records (support.read_topic) as ``{user: [count, ...]}`` in offset
    order (a user is on one partition)."""
    per_user: dict[str, list[int]] = {}
    for record in records:
        count = int.from_bytes(record.value, "big", signed=True)
        per_user.setdefault(record.key.decode(), []).append(count)
    return per_user
