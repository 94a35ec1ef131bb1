"""Queries of a job's committed state (streamplatform.state_query) against the test driver: a
job on Spark with every queryable kind of store (a user processor's, a versioned table, an
aggregation over all time, time, sliding and session windows, a deduplication), run in small
batches over two partitions, queried as of each committed batch, equals the test driver's
stores after the same records; while the job holds its claim; back to an earlier batch; and
refusals that name what to do."""

from __future__ import annotations

import json
import random
import uuid

import pytest
from confluent_kafka import Producer

from streamplatform import (
    Processor,
    SessionWindows,
    SlidingWindows,
    StreamingJob,
    StreamsBuilder,
    TimeWindows,
    TopologyTestDriver,
)
from streamplatform.cli import main
from streamplatform.dagster import StreamingJobSpec, StreamplatformResource
from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.runtime import delta_direct
from streamplatform.serdes import Serdes
from streamplatform.state import Stores
from streamplatform.state_query import QueryError, StateQuery
from streamplatform.state_query.views import view_for

pytestmark = [pytest.mark.spark, pytest.mark.broker]

HOUR = 3_600_000
START = 1_767_225_600_000


class LastPage(Processor):
    """A user processor: each user's last page, in a store of its own."""

    def init(self, context):
        super().init(context)
        self.store = context.get_state_store("last-page")

    def process(self, record):
        self.store.put(record.key, record.value["page"])


def topology(clicks: str, profiles: str):
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value_store_builder(
        Stores.persistent_key_value_store("last-page"), Serdes.string(), Serdes.string()))  # fmt: skip
    b.table(profiles, Serdes.string(), Serdes.json(),
            store=Stores.persistent_versioned_key_value_store("profiles", HOUR * 24))  # fmt: skip
    stream = b.stream(clicks, Serdes.string(), Serdes.json())
    stream.process(LastPage, "last-page")
    unique = stream.deduplicate_by_key_value(lambda user, click: click["id"], HOUR * 24, "unique")
    grouped = unique.group_by_key()
    grouped.count("clicks")
    # Grace beyond the input's span: no window closes, so a task's stream time (per partition
    # here, one for all in the test driver) never decides what a store holds.
    grouped.windowed_by(TimeWindows.of_size_and_grace(60_000, HOUR * 24)).count("per-minute")
    grouped.windowed_by(SlidingWindows.of_time_difference_and_grace(30_000, HOUR * 24)).count(
        "sliding"
    )
    grouped.windowed_by(SessionWindows.of_inactivity_gap_and_grace(20_000, HOUR * 24)).count(
        "sessions"
    )
    return b.build()


CLI_TOPICS: dict[str, str] = {}  # the topics of the job `streamplatform query` reads


def cli_topology():
    """The topology for `streamplatform query --topology <this module>:cli_topology`."""
    return topology(CLI_TOPICS["clicks"], CLI_TOPICS["profiles"])


def produce(settings, clicks: str, profiles: str) -> dict[str, list[tuple]]:
    """Clicks and profile updates on two partitions each, by key (Kafka's partitioner); returns
    each topic's records as (partition, offset, key, value, timestamp)."""
    rng = random.Random(3)
    producer = Producer({"bootstrap.servers": settings["bootstrap.servers"],
                         "enable.idempotence": True})  # fmt: skip
    sent: dict[str, list[tuple]] = {clicks: [], profiles: []}

    def delivered(error, message):
        assert error is None, error
        sent[message.topic()].append((message.partition(), message.offset(),
                                      message.key().decode(), json.loads(message.value()),
                                      message.timestamp()[1]))  # fmt: skip

    for n in range(90):
        user = f"u{rng.randrange(6)}"
        click_id = f"c{rng.randrange(70)}"  # some ids twice: the dedup drops them
        value = {"id": click_id, "page": f"/p{rng.randrange(4)}"}
        producer.produce(clicks, key=user, value=json.dumps(value).encode(),
                         timestamp=START + n * 7_000, on_delivery=delivered)  # fmt: skip
        if n % 9 == 0:
            producer.produce(profiles, key=user, value=json.dumps({"tier": n}).encode(),
                             timestamp=START + n * 7_000, on_delivery=delivered)  # fmt: skip
    assert producer.flush(30) == 0
    return sent


def committed_positions(root: str) -> dict[int, dict[tuple[str, int], int]]:
    rows = delta_direct.read(f"{root}/_commits").to_pylist()
    return {int(r["batch_id"]): {(t, int(p)): int(o) for t, p, o in json.loads(r["consumed"])}
            for r in rows}  # fmt: skip


def stores_through_the_test_driver(top, sent, upto: dict[tuple[str, int], int]) -> dict:
    """Every store's content after the records before ``upto`` (per topic and partition),
    through the test driver (one partition; the state here is per key, so the union of the
    job's partitions holds the same)."""
    with TopologyTestDriver(top, {"application.id": "reference"}) as driver:
        topics = {name: driver.create_input_topic(name, Serdes.string(), Serdes.json())
                  for name in sent}  # fmt: skip
        pending = sorted(
            (timestamp, topic, partition, offset, key, value)
            for topic, records in sent.items()
            for partition, offset, key, value, timestamp in records
            if offset < upto.get((topic, partition), 0)
        )
        for timestamp, topic, _, _, key, value in pending:
            topics[topic].pipe_input(key, value, timestamp=timestamp)
        return {name: contents(view_for(top, name, engine))
                for task in driver._tasks.values()
                for name, engine in task.stores.items() if name in top.stores}  # fmt: skip


USERS = [f"u{n}" for n in range(6)]


def contents(view) -> list:
    """A store's whole content as comparable rows, whatever its kind (a versioned store,
    which has no range query in Kafka Streams either, by the input's keys)."""
    if view.kind == "versioned":
        return [(user, view.get(user)) for user in USERS if view.get(user) is not None]
    return sorted(view.all(), key=repr)


@pytest.mark.slow  # ~30 s: a job of a dozen batches and a restore per batch queried
def test_each_committed_batch_queried_equals_the_test_driver(
    spark, kafka_settings, tmp_path, capsys
):
    clicks, profiles = f"clicks-{uuid.uuid4().hex[:6]}", f"profiles-{uuid.uuid4().hex[:6]}"
    create_topics(kafka_settings, [TopicSpec(clicks, 2), TopicSpec(profiles, 2)])
    sent = produce(kafka_settings, clicks, profiles)
    top = topology(clicks, profiles)
    config = {"application.id": f"query-{uuid.uuid4().hex[:6]}",
              "bootstrap.servers": kafka_settings["bootstrap.servers"],
              "state.dir": str(tmp_path / "state"), "platform.delta.root": str(tmp_path / "delta"),
              "platform.max.records.per.batch": 12}  # fmt: skip
    job = StreamingJob(top, config, spark=spark)
    try:
        results = job.run_until_caught_up()
        assert len(results) >= 4
        # While the job holds its claim (not closed): a query touches only its Delta tables.
        positions = committed_positions(job.root)
        with StateQuery(top, config) as state:
            assert state.batch == results[-1].batch_id
            for batch in sorted(positions):
                state.at(batch)
                expected = stores_through_the_test_driver(top, sent, positions[batch])
                for name in top.stores:
                    got = contents_of_all_partitions(state, name)
                    assert got == expected.get(name, []), (batch, name)
            assert all(expected.get(name) for name in top.stores), expected  # none vacuous
            # Back to the first batch: restored again from the changelog.
            first = min(positions)
            state.at(first)
            expected = stores_through_the_test_driver(top, sent, positions[first])
            assert (
                contents_of_all_partitions(state, "clicks-STATE-STORE")
                == expected["clicks-STATE-STORE"]
            )
            # Typed single-key queries of each kind.
            counts = state.at().store("clicks-STATE-STORE")
            user = sent[clicks][0][2]
            assert counts.get(user) == expected_count(top, sent, positions, user)
            assert state.store("last-page").get(user) is not None
            assert state.store("profiles").get(user) is not None
            windows = state.store("per-minute-STATE-STORE").fetch(user, START, START + HOUR)
            assert windows and all(count > 0 for _, count in windows)
            assert state.store("sessions-STATE-STORE").fetch(user)
            click_id = next(v["id"] for _, _, k, v, _ in sent[clicks] if k == user)
            assert state.store("unique-store").get((user, click_id)) is not None
            with pytest.raises(QueryError, match="is not committed: the last committed batch"):
                state.at(results[-1].batch_id + 1)
            with pytest.raises(QueryError, match="no store named 'nope'"):
                state.store("nope")
        # The same from a Dagster asset, through the platform's resource.
        spec = StreamingJobSpec(name="clicks", topology=top,
                                application_id=config["application.id"])  # fmt: skip
        resource = StreamplatformResource(delta_root=config["platform.delta.root"])
        with resource.query_state(spec) as state:
            assert state.store("clicks-STATE-STORE").get(user) == expected_count(
                top, sent, positions, user)  # fmt: skip
        # The same from the command line, as JSON lines.
        CLI_TOPICS.update(clicks=clicks, profiles=profiles)
        base = ["query", "--topology", f"{__name__}:cli_topology",
                "--set", f"application.id={config['application.id']}",
                "--set", f"platform.delta.root={config['platform.delta.root']}"]  # fmt: skip
        capsys.readouterr()
        assert main([*base, "--store", "clicks-STATE-STORE", "--key", user]) == 0
        [line] = capsys.readouterr().out.splitlines()
        assert json.loads(line)["value"] == expected_count(top, sent, positions, user)
        assert main([*base, "--store", "per-minute-STATE-STORE", "--key", user,
                     "--batch", str(min(positions))]) == 0  # fmt: skip
        lines = [json.loads(row) for row in capsys.readouterr().out.splitlines()]
        assert all(row["key"] == user and row["window"]["end"] - row["window"]["start"]
                   == 60_000 for row in lines)  # fmt: skip
        assert main([*base, "--store", "unique-store", "--key", json.dumps([user, click_id])]) == 0
        assert json.loads(capsys.readouterr().out)["key"] == [user, click_id]
        assert main([*base, "--store", "clicks-STATE-STORE", "--batch", "999"]) == 1
        assert "is not committed: the last committed batch is" in capsys.readouterr().err
    finally:
        job.close()


def contents_of_all_partitions(state, name) -> list:
    query = state.store(name)
    rows = []
    for partition in sorted(query.partitions):
        rows += contents(query.partition(partition))
    return sorted(rows, key=repr)


def expected_count(top, sent, positions, user) -> int:
    last = positions[max(positions)]
    rows = stores_through_the_test_driver(top, sent, last)["clicks-STATE-STORE"]
    return dict(rows)[user]
