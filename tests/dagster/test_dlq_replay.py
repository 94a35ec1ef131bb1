"""DLQ replay against the run's broker, Spark and Delta: what passes the current topology is
re-published once, what fails again is parked with its attempts, and a replay interrupted at
any step is finished by the next one without losing or doubling a record."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest
from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition
from delta.tables import DeltaTable
from runtime.support import amounts_topology

from streamplatform import JobClaimedError
from streamplatform.dlq import DlqReplayer
from streamplatform.dlq.ledger import ReplayLedger
from streamplatform.dlq.records import REPLAY_ATTEMPT_HEADER, REPLAY_BATCH_HEADER, REPLAY_OF_HEADER
from streamplatform.dlq.replay import DlqReplayer as Replayer
from streamplatform.kafka import TopicSpec, consumer, create_topics, producer
from streamplatform.runtime.microbatch import StreamingJob

pytestmark = [pytest.mark.broker, pytest.mark.spark]


topology = amounts_topology  # v1 (strict) rejects negative amounts; v2 is the fix


def make_setup(kafka_settings, spark, directory) -> dict:
    """Topics of their own (2-partition source, DLQ) and a job config writing under
    ``directory``."""
    name = f"replay-{uuid.uuid4().hex[:6]}"
    source, sink, dlq = f"{name}-tx", f"{name}-out", f"{name}-dlq"
    create_topics(kafka_settings, [TopicSpec(source, 2), TopicSpec(dlq, 1)])
    config = {
        "application.id": name,
        "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "processing.guarantee": "exactly_once_v2",
        "state.dir": str(directory / "state"),
        "platform.delta.root": str(directory / "delta"),
        "errors.dead.letter.queue.topic.name": dlq,
        "default.deserialization.exception.handler": "log_and_continue",
        "processing.exception.handler": "log_and_continue",
    }
    return {"source": source, "sink": sink, "config": config, "spark": spark,
            "kafka": kafka_settings, "root": f"{directory}/delta/{name}"}  # fmt: skip


@pytest.fixture
def setup(kafka_settings, spark, tmp_path):
    return make_setup(kafka_settings, spark, tmp_path)


def produce(setup, values: list[bytes]) -> None:
    out = producer(setup["kafka"])
    for index, value in enumerate(values):
        out.produce(setup["source"], key=b"k", value=value, partition=index % 2,
                    timestamp=1_000 + index, headers=[("trace", str(index).encode())])  # fmt: skip
    assert out.flush(30) == 0


def run_job(setup, strict: bool) -> int:
    """Run the job until caught up; the rows of its Delta sink."""
    top = topology(setup["source"], setup["sink"], strict)
    job = StreamingJob(top, setup["config"], spark=setup["spark"], delta_sinks=[setup["sink"]])
    try:
        job.run_until_caught_up()
    finally:
        job.close()
    sink = f"{setup['root']}/{setup['sink']}"
    if not DeltaTable.isDeltaTable(setup["spark"], sink):
        return 0
    return setup["spark"].read.format("delta").load(sink).count()


def replayer(setup, strict: bool = False, **kwargs) -> DlqReplayer:
    top = topology(setup["source"], setup["sink"], strict)
    return DlqReplayer(top, setup["config"], setup["spark"], **kwargs)


def republished(setup) -> list[tuple[bytes, dict[str, bytes]]]:
    """Records in the source topic that this setup's replays wrote: (value, replay headers)."""
    stamp = setup["config"]["application.id"].encode() + b"/"
    reader = consumer(setup["kafka"], group_id=f"check-{uuid.uuid4().hex[:6]}",
                      **{"isolation.level": "read_committed", "enable.partition.eof": True})  # fmt: skip
    found = []
    try:
        reader.assign([KafkaTopicPartition(setup["source"], p, 0) for p in range(2)])
        remaining = {0, 1}
        while remaining:
            message = reader.poll(10)
            assert message is not None, "no end of partition from Kafka within 10 s"
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                remaining.discard(message.partition())
                continue
            headers = dict(message.headers() or [])
            if headers.get(REPLAY_BATCH_HEADER, b"").startswith(stamp):
                found.append((message.value(), headers))
    finally:
        reader.close()
    return found


@pytest.mark.slow  # two job runs, four replays
def test_replay_republishes_what_passes_parks_what_fails_and_never_twice(setup):
    good = [json.dumps({"amount": n}).encode() for n in range(1, 7)]
    negative = [json.dumps({"amount": -n}).encode() for n in (1, 2)]
    produce(setup, [*good, *negative, b"{poison"])
    assert run_job(setup, strict=True) == len(good)

    first = replayer(setup).replay()  # the fixed topology accepts negative amounts
    assert (first.replay_batch, first.candidates, first.republished, first.parked) == (0, 3, 2, 1)
    assert first.parked_by_exception == {"SerializationError": 1}
    published = republished(setup)
    assert sorted(value for value, _ in published) == sorted(negative)
    for _, headers in published:
        assert headers[REPLAY_ATTEMPT_HEADER] == b"1"
        assert headers[REPLAY_OF_HEADER].startswith(setup["source"].encode() + b"/")
        assert headers["trace"] in (b"6", b"7")  # the original headers travel along

    second = replayer(setup).replay()
    assert (second.replay_batch, second.candidates, second.republished) == (None, 0, 0)
    assert len(republished(setup)) == 2

    assert run_job(setup, strict=False) == len(good) + 2  # the job reads the replayed records
    counts = ReplayLedger(setup["spark"], setup["root"], setup["config"]["application.id"])
    assert counts.counts() == {"replayed": 2, "parked": 1}

    retried = replayer(setup).replay(retry_parked=True)  # after a "fix" that fixed nothing
    assert (retried.candidates, retried.parked, retried.republished) == (1, 1, 0)
    parked = counts.parked().collect()
    assert [(row.attempts, row.exception, bytes(row.value)) for row in parked] == [
        (2, "SerializationError", b"{poison")
    ]


@pytest.mark.slow  # two job runs, three replays
def test_a_record_that_keeps_failing_in_the_job_is_parked_after_max_attempts(setup):
    produce(setup, [json.dumps({"amount": -3}).encode()])
    run_job(setup, strict=True)
    # The preflight passes (the lenient topology) but the job still runs the strict one: the
    # re-published record fails again and returns to the DLQ with its replay headers.
    assert replayer(setup, max_attempts=1).replay().republished == 1
    run_job(setup, strict=True)
    again = replayer(setup, max_attempts=1).replay()
    assert (again.candidates, again.republished, again.parked, again.exhausted) == (1, 0, 1, 1)
    ledger = ReplayLedger(setup["spark"], setup["root"], setup["config"]["application.id"])
    [row] = ledger.parked().collect()
    assert (row.attempts, row.exception) == (2, "AttemptsExhausted")
    assert row.original == f"{setup['source']}/0/0"  # the first failure, not the replayed copy
    assert row.source_offset == 1  # the replayed copy's own DLQ record
    assert replayer(setup, max_attempts=1).replay().candidates == 0


@pytest.fixture(scope="module")
def failed_once(kafka_settings, spark, tmp_path_factory) -> dict:
    """Three records v1 sent to its DLQ: one job run, shared by the interruption tests."""
    setup = make_setup(kafka_settings, spark, tmp_path_factory.mktemp("replay"))
    produce(setup, [json.dumps({"amount": -n}).encode() for n in (1, 2, 3)])
    run_job(setup, strict=True)
    return setup


def copy_of(setup: dict, directory) -> dict:
    """The same DLQ mirror under an application of its own, replayed independently."""
    app = f"{setup['config']['application.id']}-{uuid.uuid4().hex[:4]}"
    config = setup["config"] | {"application.id": app, "platform.delta.root": str(directory)}
    shutil.copytree(f"{setup['root']}/_dlq", f"{directory}/{app}/_dlq")
    return setup | {"config": config, "root": f"{directory}/{app}"}


@pytest.mark.slow  # ~30 s each, after a job run of theirs
@pytest.mark.parametrize("crash_in", ["before_publish", "mid_publish", "before_record"])
def test_an_interrupted_replay_is_finished_once_by_the_next(
    failed_once, tmp_path, monkeypatch, crash_in
):
    setup = copy_of(failed_once, tmp_path)
    publish = Replayer._publish

    def crash(*args, **kwargs):
        raise KeyboardInterrupt(crash_in)

    def publish_one_then_crash(self, plan, items):
        publish(self, plan, items[:1])
        raise KeyboardInterrupt(crash_in)

    if crash_in == "before_publish":  # planned, nothing published
        monkeypatch.setattr(Replayer, "_publish", crash)
    elif crash_in == "mid_publish":  # planned, one of three published
        monkeypatch.setattr(Replayer, "_publish", publish_one_then_crash)
    else:  # all published, outcomes not recorded
        monkeypatch.setattr(ReplayLedger, "record", crash)
    with pytest.raises(KeyboardInterrupt):
        replayer(setup).replay()
    monkeypatch.undo()
    before = {"before_publish": 0, "mid_publish": 1, "before_record": 3}[crash_in]
    assert len(republished(setup)) == before

    report = replayer(setup).replay()
    assert report.recovered_batch == 0
    assert report.recovered_already_published == before
    assert report.candidates == 0  # nothing left: the recovered batch handled all three
    values = sorted(value for value, _ in republished(setup))
    assert values == sorted(json.dumps({"amount": -n}).encode() for n in (1, 2, 3))  # once each
    ledger = ReplayLedger(setup["spark"], setup["root"], setup["config"]["application.id"])
    assert ledger.counts() == {"replayed": 3, "parked": 0}
    assert replayer(setup).replay().recovered_batch is None


@pytest.mark.slow  # 20-80 s: a job run and two replays (make test: test_dlq_preflight.py)
def test_a_second_replay_of_the_same_job_is_refused_while_one_runs(setup):
    produce(setup, [json.dumps({"amount": -1}).encode()])
    run_job(setup, strict=True)  # the record is in the DLQ and its mirror
    running = replayer(setup)
    running._claim.acquire()  # a replay of this job is under way
    try:
        with pytest.raises(JobClaimedError, match="DLQ replay"):
            replayer(setup).replay()
        assert republished(setup) == []  # the refused replay published nothing
    finally:
        running._claim.release()
    report = replayer(setup).replay()  # once it ended, the next replay runs
    assert report.republished == 1 and len(republished(setup)) == 1
