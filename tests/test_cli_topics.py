"""`streamplatform topics produce` / `consume` against the test broker, and `streamplatform run`
as a supervisor sees it: a job planned under other settings exits 4, in one line."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
import uuid

import pytest
from test_cli import console_command, env_without_pythonpath, team_module

from streamplatform import cli
from streamplatform.kafka import TopicSpec, create_topics, producer

pytestmark = pytest.mark.broker


@pytest.fixture
def topic(kafka_settings, topic_name):
    create_topics(kafka_settings, [TopicSpec(topic_name, partitions=3)])
    return topic_name


def _cli(capsys, kafka_settings, *args):
    code = cli.main(["topics", *args, "--bootstrap-servers", kafka_settings["bootstrap.servers"]])
    out, err = capsys.readouterr()
    return code, out, err


def _records(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_produce_then_consume_round_trip_with_keys_headers_and_partitions(
    capsys, monkeypatch, kafka_settings, topic
):
    monkeypatch.setattr(
        sys, "stdin", io.StringIO('k1\t{"id": 1}\nk2\t{"id": 2}\n\nk1\t{"id": 3}\n')
    )
    code, out, err = _cli(capsys, kafka_settings, "produce", topic, "--value-serde", "json",
                          "--header", "trace=abc", "--header", "source=cli", "--json")  # fmt: skip
    assert code == 0, err
    placed = _records(out)
    assert len(placed) == 3 and "3 records written" in err
    assert placed[0]["partition"] == placed[2]["partition"]  # one key, one partition

    code, out, err = _cli(capsys, kafka_settings, "consume", topic, "--value-serde", "json",
                          "--json")  # fmt: skip
    assert code == 0, err
    records = _records(out)
    assert sorted((r["key"], r["value"]["id"]) for r in records) == [
        ("k1", 1), ("k1", 3), ("k2", 2)
    ]  # fmt: skip
    first = next(r for r in records if r["value"] == {"id": 1})
    assert first["headers"] == [
        {"name": "trace", "value": "abc"}, {"name": "source", "value": "cli"}
    ]  # fmt: skip
    assert (first["partition"], first["offset"]) == (placed[0]["partition"], placed[0]["offset"])
    assert first["timestamp_type"] == "CreateTime" and first["timestamp"] > 0
    assert "3 records read from" in err and "read_committed" in err
    assert "read to the end of every partition" in err

    # Text, one partition, at most one record, with the alias.
    code, out, err = _cli(capsys, kafka_settings, "tail", topic, "--partition",
                          str(placed[0]["partition"]), "--max-messages", "1")  # fmt: skip
    assert code == 0
    assert out.splitlines()[0].startswith(f"partition {placed[0]['partition']}  offset 0  ")
    assert '  key: k1\n  value: {"id":1}\n  headers:\n    trace: abc\n    source: cli' in out
    assert "1 record read" in err and "--max-messages 1 reached" in err

    code, out, err = _cli(capsys, kafka_settings, "consume", topic, "--from-end")
    assert (code, out) == (0, "") and "0 records read" in err


def test_a_dlq_record_with_binary_header_values_is_readable(capsys, kafka_settings, topic):
    stacktrace = b'Traceback (most recent call last):\n  File "x.py", line 1\nSerializationError'
    writer = producer(kafka_settings)
    writer.produce(topic, key=b"\xff\x01", value=b"{poison", partition=1, timestamp=1_000, headers=[
        ("i", b"17"),
        ("__streams.errors.exception", b"SerializationError"),
        ("__streams.errors.message", b"not JSON: unexpected character"),
        ("__streams.errors.stacktrace", stacktrace),
        ("__streams.errors.topic", b"transactions"),
        ("__streams.errors.partition", b"2"),
        ("__streams.errors.offset", b"41"),
        ("__streams.errors.raw", b"\x00\x9f\x92\x96"),  # not UTF-8
    ])  # fmt: skip
    assert writer.flush(30) == 0

    code, out, err = _cli(capsys, kafka_settings, "consume", topic, "--value-serde", "json")
    assert code == 0, err
    assert out.splitlines()[0] == (
        "partition 1  offset 0  timestamp 1970-01-01T00:00:01.000Z (1000, CreateTime)"
    )
    assert "  key: hex:ff01  (not string: not UTF-8" in out
    assert "  value: {poison  (not json: not JSON" in out
    for line in ("    i: 17", "    __streams.errors.exception: SerializationError",
                 "    __streams.errors.message: not JSON: unexpected character",
                 "    __streams.errors.stacktrace: SerializationError  (3 lines; --stacktrace "
                 "shows them)",
                 "    __streams.errors.topic: transactions",
                 "    __streams.errors.partition: 2", "    __streams.errors.offset: 41",
                 "    __streams.errors.raw: hex:009f9296"):  # fmt: skip
        assert line in out

    assert "File" not in out  # the stack trace takes one line
    code, out, _ = _cli(capsys, kafka_settings, "consume", topic, "--stacktrace")
    assert ("    __streams.errors.stacktrace: Traceback (most recent call last):\n"
            '        File "x.py", line 1\n      SerializationError') in out  # fmt: skip

    code, out, _ = _cli(capsys, kafka_settings, "consume", topic, "--key-serde", "bytes",
                        "--value-serde", "bytes", "--json")  # fmt: skip
    (record,) = _records(out)
    assert record["key"] == {"hex": "ff01"} and record["value"] == "{poison"
    headers = {h["name"]: h for h in record["headers"]}
    assert headers["__streams.errors.offset"]["value"] == "41"
    assert headers["__streams.errors.stacktrace"]["value"] == stacktrace.decode()
    assert headers["__streams.errors.raw"] == {"name": "__streams.errors.raw", "hex": "009f9296"}


def test_read_committed_hides_aborted_records_and_says_so(capsys, kafka_settings, topic):
    writer = producer(kafka_settings, **{"transactional.id": f"{topic}-tx"})
    writer.init_transactions(30)
    writer.begin_transaction()
    writer.produce(topic, value=b"aborted", partition=0)
    writer.flush(10)
    writer.abort_transaction(30)
    writer.begin_transaction()
    writer.produce(topic, value=b"committed", partition=0)
    writer.commit_transaction(30)

    code, out, err = _cli(capsys, kafka_settings, "consume", topic, "--json")
    assert [r["value"] for r in _records(out)] == ["committed"]
    assert "1 record read from" in err and "(read_committed;" in err
    code, out, err = _cli(capsys, kafka_settings, "consume", topic, "--json",
                          "--isolation-level", "read_uncommitted")  # fmt: skip
    assert [r["value"] for r in _records(out)] == ["aborted", "committed"]


def test_produce_with_values_a_partition_and_a_tombstone(capsys, kafka_settings, topic):
    code, out, err = _cli(capsys, kafka_settings, "produce", topic, "--partition", "2",
                          "--key-serde", "long", "--value", "7\thello", "--value", "8\tNULL",
                          "--null-value", "NULL", "--json")  # fmt: skip
    assert code == 0, err
    assert [r["partition"] for r in _records(out)] == [2, 2]
    code, out, _ = _cli(capsys, kafka_settings, "consume", topic, "--key-serde", "long", "--json")
    assert [(r["key"], r["value"]) for r in _records(out)] == [(7, "hello"), (8, None)]


def test_produce_json_lines_with_each_records_timestamp_partition_and_headers(
    capsys, monkeypatch, kafka_settings, topic
):
    """Tasks merge their partitions by timestamp: a user sets each record's own."""
    lines = [
        '{"key": "a", "value": {"page": "x"}, "timestamp": "2026-01-01T12:00:00Z", "partition": 1}',
        '{"key": "b", "value": {"page": "y"}, "timestamp": 1767268860000, "partition": 0,'
        ' "headers": {"trace": "t1"}}',
        '{"key": "c"}',
    ]  # fmt: skip
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    code, out, err = _cli(capsys, kafka_settings, "produce", topic, "--json-lines",
                          "--value-serde", "json", "--json")  # fmt: skip
    assert code == 0, err
    assert [r["partition"] for r in _records(out)][:2] == [1, 0]
    code, out, _ = _cli(capsys, kafka_settings, "consume", topic, "--value-serde", "json", "--json")
    got = {r["key"]: r for r in _records(out)}
    assert got["a"]["timestamp"] == 1_767_268_800_000 and got["a"]["value"] == {"page": "x"}
    assert got["b"]["timestamp"] == 1_767_268_860_000 and got["b"]["partition"] == 0
    assert got["b"]["headers"] == [{"name": "trace", "value": "t1"}]
    assert got["c"]["value"] is None  # a tombstone
    code, out, err = _cli(capsys, kafka_settings, "produce", topic, "--timestamp", "yesterday",
                          "--value", "v")  # fmt: skip
    assert code == 1 and "--timestamp: 'yesterday' is not a timestamp" in err


def test_describe_and_delete_a_topic(capsys, kafka_settings, topic):
    _cli(capsys, kafka_settings, "produce", topic, "--partition", "1", "--value", "k\tv",
         "--timestamp", "1767268800000")  # fmt: skip
    code, out, err = _cli(capsys, kafka_settings, "describe", topic)
    assert code == 0, err
    assert f"{topic}: 3 partitions, 1 records" in out and "partition 1: offsets 0..1" in out
    code, out, _ = _cli(capsys, kafka_settings, "delete", topic)
    assert code == 0 and f"Deleted {topic}." in out
    code, _, err = _cli(capsys, kafka_settings, "describe", topic)
    assert code == 1 and "do not exist" in err


def test_errors_are_one_line_and_exit_1(capsys, kafka_settings, topic):
    code, _, err = _cli(capsys, kafka_settings, "consume", "no-such-topic-here")
    assert code == 1 and err.startswith("streamplatform topics consume: ") and "no-such" in err
    code, _, err = _cli(capsys, kafka_settings, "produce", topic, "--value-serde", "json",
                        "--value", "k\t{broken")  # fmt: skip
    assert code == 1 and "line 1: value '{broken' is not json" in err
    assert "Traceback" not in err


def test_follow_waits_for_new_records_and_stops_cleanly_on_sigterm(kafka_settings, topic):
    command = [sys.executable, "-m", "streamplatform.cli", "topics", "consume", topic, "--follow",
               "--json", "--bootstrap-servers", kafka_settings["bootstrap.servers"]]  # fmt: skip
    follower = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    try:
        writer = producer(kafka_settings)
        seen = []
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:  # produced until the follower has one
            writer.produce(topic, value=b"new", partition=0)
            writer.flush(10)
            time.sleep(0.5)
            seen = follower.stdout.readline() if follower.poll() is None else "exited"
        assert seen and seen != "exited", follower.stderr.read()
        assert json.loads(seen)["value"] == "new"
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err


@pytest.mark.child_process
def test_a_batch_planned_under_other_settings_exits_4_for_a_person_in_one_line(
    kafka_settings, topic, tmp_path
):
    """A supervisor's view: `streamplatform run` of a job whose uncommitted batch was planned
    under another topology or settings (ReplayRefused) exits 4, which says: do not restart,
    a person decides (old code, or discard-batch). The topology comes from a module in the
    working directory, without PYTHONPATH; no Spark is started before the refusal."""
    from streamplatform.runtime.logs import OffsetLog

    sink = f"{topic}-out"
    create_topics(kafka_settings, [TopicSpec(sink, 1)])
    topology = team_module(tmp_path, topic, sink)
    app = f"refused-{uuid.uuid4().hex[:6]}"
    root = tmp_path / "delta"
    # Batch 0 planned by another version of the job, never committed; under at_least_once its
    # Kafka sends may have happened (they leave no trace), so it is not replayed silently.
    OffsetLog(f"{root}/{app}/_offsets", app).append(0, {(topic, 0): (0, 1)}, "f" * 64)
    settings = {"application.id": app, "bootstrap.servers": kafka_settings["bootstrap.servers"],
                "processing.guarantee": "at_least_once", "platform.delta.root": str(root),
                "state.dir": str(tmp_path / "state")}  # fmt: skip
    env = env_without_pythonpath()
    done = subprocess.run(console_command("run", topology, settings, "--until-caught-up"),
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == cli.EXIT_REPLAY_REFUSED == 4, done.stderr[-3000:]
    assert done.stdout.splitlines()[:2] == [
        "topology built",
        f"streamplatform run: {app}, processing.guarantee=at_least_once",
    ]
    ours = [line for line in done.stderr.splitlines() if line.startswith("streamplatform run:")]
    assert len(ours) == 1, done.stderr
    assert ours[0].startswith("streamplatform run: a person must decide (exit 4")
    assert f"{app}: batch 0 was planned under another topology" in ours[0]
    assert "discard-batch" in ours[0]
    assert "Traceback" not in done.stderr

    # The way on that the line names: discard-batch, from the same directory.
    done = subprocess.run(console_command("discard-batch", topology, settings), cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Batch 0 discarded" in done.stdout
