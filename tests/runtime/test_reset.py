"""`streamplatform reset` on a stateful job with a real broker and Spark: the job's inputs
start again at a date-time, its state starts empty (the counts start over, also from a task
directory left on "another machine"), its sinks are kept; a dry run changes nothing; a running
job refuses the reset; an interrupted reset keeps the job from starting until it is run again."""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime

import pytest

from streamplatform import JobClaimedError, StreamsBuilder, cli
from streamplatform.config import StreamsConfig
from streamplatform.kafka import TopicSpec, create_topics, producer
from streamplatform.runtime import reset
from streamplatform.runtime.microbatch import StreamingJob
from streamplatform.serdes import Serdes

from .support import job_config, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]  # ~10-20 s each
HOUR = 3_600_000
T0 = 1_767_268_800_000  # 2026-01-01T12:00Z


def _counts(source: str, sink: str):
    """Clicks counted per user (a store, its changelog): each update to ``sink``."""
    b = StreamsBuilder()
    (b.stream(source, Serdes.string(), Serdes.string()).group_by_key().count()
     .to_stream().to(sink, value_serde=Serdes.long()))  # fmt: skip
    return b.build()


def _setup(kafka_settings, tmp_path, values: list[tuple[str, int]]):
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_settings, [TopicSpec(source, 2), TopicSpec(sink, 1),
                                   TopicSpec(f"{source}-dlq", 1)])  # fmt: skip
    writer = producer(kafka_settings)
    for n, (user, timestamp) in enumerate(values):
        partition = int(user[1:]) - 1  # u1 on partition 0, u2 on 1: keys stay on one task
        writer.produce(source, key=user, value=f"c{n}", partition=partition, timestamp=timestamp)
    assert writer.flush(30) == 0
    app = f"reset-{uuid.uuid4().hex[:6]}"
    # Two records per task and batch: the stores' committed state holds the batches before the
    # last (whose writes stay prepared until the next batch settles them).
    config = job_config(kafka_settings, tmp_path, app, source,
                        **{"platform.max.records.per.batch": 2})  # fmt: skip
    return source, sink, config


def _run(source, sink, config, spark):
    job = StreamingJob(_counts(source, sink), config, spark=spark)
    try:
        return job.run_until_caught_up()
    finally:
        job.close()


def _latest_counts(kafka_settings, sink, skip: int = 0) -> dict[str, int]:
    counts = {}
    for record in read_topic(kafka_settings, sink)[skip:]:
        counts[record.key.decode()] = int.from_bytes(record.value, "big", signed=True)
    return counts


def test_reset_to_a_datetime_counts_the_input_from_then_on_with_empty_state(
    spark, kafka_settings, tmp_path
):
    # u1 clicks 4 times before noon+2h and twice after; u2 once before, three times after.
    clicks = [("u1", T0), ("u1", T0 + 1), ("u2", T0 + 2), ("u1", T0 + 3), ("u1", T0 + 4),
              ("u1", T0 + 2 * HOUR), ("u2", T0 + 2 * HOUR + 1), ("u2", T0 + 2 * HOUR + 2),
              ("u1", T0 + 2 * HOUR + 3), ("u2", T0 + 2 * HOUR + 4)]  # fmt: skip
    source, sink, config = _setup(kafka_settings, tmp_path, clicks)
    _run(source, sink, config, spark)
    assert _latest_counts(kafka_settings, sink) == {"u1": 6, "u2": 4}
    before = len(read_topic(kafka_settings, sink))
    # A task directory of the old state on "another machine": a state.dir the reset cannot
    # see, which the next run uses.
    elsewhere = tmp_path / "elsewhere-state"
    shutil.copytree(config["state.dir"], elsewhere)

    noon_plus_2h = datetime.fromtimestamp((T0 + 2 * HOUR) / 1000, UTC).isoformat()
    plan = reset.plan_reset(StreamsConfig(config), [source], "datetime", noon_plus_2h)
    assert plan.positions == {(source, 0): 4, (source, 1): 1}  # the first records from then on
    assert {t.rsplit("/", 1)[1] for t in plan.internal_tables} >= {"_offsets", "_commits",
                                                                   "_changelog"}  # fmt: skip
    reset.apply_reset(plan, StreamsConfig(config))

    again = config | {"state.dir": str(elsewhere)}
    results = _run(source, sink, again, spark)
    assert sum(r.records_in for r in results) == 5
    # Counted from zero: the state of before the reset is gone, here and "elsewhere".
    assert _latest_counts(kafka_settings, sink, skip=before) == {"u1": 2, "u2": 3}


def test_a_dry_run_changes_nothing_and_a_running_job_refuses_the_reset(
    spark, kafka_settings, tmp_path, capsys
):
    source, sink, config = _setup(kafka_settings, tmp_path, [("u1", T0), ("u2", T0 + 1)])
    _run(source, sink, config, spark)
    args = ["reset", config["application.id"], "--input-topics", source, "--to-earliest",
            "--set", f"platform.delta.root={config['platform.delta.root']}",
            "--set", f"state.dir={config['state.dir']}",
            "--bootstrap-servers", kafka_settings["bootstrap.servers"]]  # fmt: skip
    assert cli.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"input {source}-0: starts at offset 0" in out and "remove internal table" in out
    assert "Kafka sink topics are not touched" in out and "Dry run: nothing was changed." in out
    job = StreamingJob(_counts(source, sink), config, spark=spark)
    try:
        assert job.run_batch() is None  # nothing new: the dry run kept the positions
        # The job holds its claim now: the reset is refused.
        assert cli.main(args) == cli.EXIT_CLAIMED == 3
        assert "refused, the job runs" in capsys.readouterr().err
        with pytest.raises(JobClaimedError):
            reset.apply_reset(reset.plan_reset(StreamsConfig(config), [source], "earliest"),
                              StreamsConfig(config))  # fmt: skip
    finally:
        job.close()
    assert cli.main(args) == 0  # stopped: it goes through
    assert "Reset done" in capsys.readouterr().out
    results = _run(source, sink, config, spark)
    assert sum(r.records_in for r in results) == 2  # read again from the earliest


def test_an_interrupted_reset_keeps_the_job_from_starting_until_it_is_run_again(
    spark, kafka_settings, tmp_path, monkeypatch
):
    source, sink, config = _setup(kafka_settings, tmp_path, [("u1", T0), ("u1", T0 + 1)])
    _run(source, sink, config, spark)
    plan = reset.plan_reset(StreamsConfig(config), [source], "earliest")

    def crash(table):
        raise KeyboardInterrupt("interrupted in the middle of the reset")

    monkeypatch.setattr(reset.storage, "remove_tree", crash)
    with pytest.raises(KeyboardInterrupt):
        reset.apply_reset(plan, StreamsConfig(config))
    monkeypatch.undo()
    job = StreamingJob(_counts(source, sink), config, spark=spark)
    try:
        with pytest.raises(reset.ResetUnfinishedError, match="run `streamplatform reset` again"):
            job.run_batch()
    finally:
        job.close()
    reset.apply_reset(reset.plan_reset(StreamsConfig(config), [source], "earliest"),
                      StreamsConfig(config))  # fmt: skip
    results = _run(source, sink, config, spark)
    assert sum(r.records_in for r in results) == 2


def test_a_reset_job_writes_its_results_into_the_delta_sink_kept_beside_the_old_ones(
    spark, kafka_settings, tmp_path
):
    """The sink is kept, and it skips a batch id it holds already: the reset job's batches go
    on from the old job's last + 1, so its rows land (before, batch 0 again was dropped)."""
    source, _, config = _setup(kafka_settings, tmp_path, [("u1", T0), ("u2", T0 + 1)])

    def run():
        job = StreamingJob(_counts(source, "totals"), config, spark=spark, delta_sinks=["totals"])
        try:
            return job.run_until_caught_up()
        finally:
            job.close()

    first = run()
    plan = reset.plan_reset(StreamsConfig(config), [source], "earliest")
    assert plan.first_batch == first[-1].batch_id + 1
    reset.apply_reset(plan, StreamsConfig(config))
    again = run()
    assert again[0].batch_id == plan.first_batch
    path = f"{config['platform.delta.root']}/{config['application.id']}/totals"
    rows = spark.read.format("delta").load(path).collect()
    assert sorted((r.key, r.batch_id >= plan.first_batch) for r in rows) == [
        (b"u1", False),
        (b"u1", True),
        (b"u2", False),
        (b"u2", True),
    ]
