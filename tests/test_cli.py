"""`streamplatform` without a broker or Spark: the exit codes of `run` and their one line,
the start-up and progress lines, --topology from the current directory, the topics parser, and
how `topics consume` shows what it reads."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamplatform import JobClaimedError, ReplayRefused, cli
from streamplatform.config import ConfigError
from streamplatform.kafka import topic_tools

RUN = ["run", "--topology", "unused:x", "--set", "application.id=orders"]


@dataclass
class Batch:
    batch_id: int
    records_in: int = 5
    records_out: int = 4
    duplicates_dropped: int = 1
    dlq_records: int = 0
    lag: int = 0
    duration_ms: int = 12
    replayed: bool = False


class FakeJob:
    """Runs ``batches`` batches, then raises ``fail`` (if any); ``close`` raises
    ``close_fails`` (if any)."""

    def __init__(self, batches=0, fail=None, close_fails=None, guarantee="exactly_once_v2"):
        self.config = {"application.id": "orders", "processing.guarantee": guarantee}
        self.batches, self.fail, self.close_fails = batches, fail, close_fails
        self.closed = 0
        self.next_id = 0

    def run_forever(self, trigger_interval_ms, idle_interval_ms, on_batch, stop=None,
                    until_caught_up=False):  # fmt: skip
        for batch_id in range(self.batches):
            on_batch(Batch(batch_id))
        if self.fail is not None:
            raise self.fail
        return self.batches

    def run_batch(self):
        if self.next_id < self.batches:
            self.next_id += 1
            return Batch(self.next_id - 1)
        if self.fail is not None:
            raise self.fail
        return None

    def close(self):
        self.closed += 1
        if self.close_fails is not None:
            raise self.close_fails


def _run(monkeypatch, capsys, job, *options):
    monkeypatch.setattr(cli, "_job", lambda args: job)
    code = cli.main([*RUN, *options])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_replay_refused_is_exit_4_a_person_must_decide_in_one_line(monkeypatch, capsys):
    refused = ReplayRefused("orders: batch 7 was planned under another topology, code or settings")
    job = FakeJob(batches=2, fail=refused)
    code, out, err = _run(monkeypatch, capsys, job)
    assert code == cli.EXIT_REPLAY_REFUSED == 4
    line = _one_line(err)
    assert line.startswith("streamplatform run: a person must decide (exit 4")
    assert "batch 7 was planned under another topology" in line
    assert job.closed == 1


def test_a_second_sigterm_in_a_batch_is_exit_130_with_one_line_naming_the_batch(
    monkeypatch, capsys
):
    # What run_forever's signal handler raises on the second SIGTERM.
    interrupt = KeyboardInterrupt("SIGTERM again: the batch in flight is interrupted")
    job = FakeJob(batches=3, fail=interrupt)
    code, out, err = _run(monkeypatch, capsys, job)
    assert code == cli.EXIT_INTERRUPTED == 130
    assert _one_line(err) == (
        "streamplatform run: interrupted by a second SIGTERM during batch 3; nothing of it is "
        "committed, the next run replays it (exit 130)"
    )
    assert job.closed == 1  # closed after the line, once


def test_ctrl_c_before_any_batch_committed_names_the_batch_in_flight_when_it_can(
    monkeypatch, capsys
):
    job = FakeJob(fail=KeyboardInterrupt())  # a plain Ctrl-C; no commit log to ask
    code, _, err = _run(monkeypatch, capsys, job, "--until-caught-up")
    assert code == 130
    assert _one_line(err).startswith(
        "streamplatform run: interrupted by SIGINT during the batch in flight; nothing of it"
    )


def test_an_interrupt_while_closing_is_one_line_too(monkeypatch, capsys):
    job = FakeJob(batches=2, close_fails=KeyboardInterrupt("SIGTERM"))
    code, _, err = _run(monkeypatch, capsys, job)
    assert code == 130
    assert _one_line(err) == (
        "streamplatform run: interrupted by SIGTERM while closing the job (batch 1 committed); "
        "safe to restart (exit 130)"
    )


def test_an_interrupt_while_the_job_starts_is_one_line(monkeypatch, capsys):
    def starting(args):
        raise KeyboardInterrupt()

    monkeypatch.setattr(cli, "_job", starting)
    assert cli.main(RUN) == 130
    assert "while starting, before any batch ran" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (JobClaimedError("orders: the job is held by host-1"), cli.EXIT_CLAIMED),
        (ConfigError("unknown setting foo"), cli.EXIT_BAD_SETTINGS),
    ],
)
def test_claimed_and_bad_settings_keep_their_codes(monkeypatch, capsys, error, code):
    assert _run(monkeypatch, capsys, FakeJob(fail=error))[0] == code


def test_a_failed_batch_is_exit_1(monkeypatch, capsys):
    job = FakeJob(batches=1, fail=RuntimeError("executor lost"))
    code, _, err = _run(monkeypatch, capsys, job)
    assert code == cli.EXIT_BATCH_FAILED == 1
    assert job.closed == 1


def test_an_upgrade_that_would_start_a_store_empty_is_exit_4_a_person_must_decide(
    monkeypatch, capsys
):
    from streamplatform import UpgradeRefused

    refused = UpgradeRefused("orders: store KSTREAM-COUNT-STATE-STORE-0000000001 is gone")
    code, _, err = _run(monkeypatch, capsys, FakeJob(batches=0, fail=refused))
    assert code == cli.EXIT_REPLAY_REFUSED == 4
    line = _one_line(err)
    assert line.startswith("streamplatform run: a person must decide (exit 4")
    assert "KSTREAM-COUNT-STATE-STORE-0000000001 is gone" in line


def test_an_error_a_signal_caused_is_an_interrupt_not_a_failed_batch(monkeypatch, capsys):
    """py4j makes a call into the JVM that a second SIGTERM cut short its own network error."""
    try:
        try:
            raise KeyboardInterrupt("SIGTERM again: the batch in flight is interrupted")
        except KeyboardInterrupt as interrupt:
            raise ConnectionError("Answer from Java side is empty") from interrupt
    except ConnectionError as cut:
        error = cut
    code, _, err = _run(monkeypatch, capsys, FakeJob(batches=1, fail=error))
    assert code == cli.EXIT_INTERRUPTED == 130
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_start_up_and_progress_lines_name_the_processing_guarantee(monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, FakeJob(batches=3), "--until-caught-up")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "streamplatform run: orders, processing.guarantee=exactly_once_v2"
    assert lines[1] == (
        "batch 0: 5 in, 4 out, 1 duplicates dropped, 0 to the DLQ, lag 0, 12 ms, exactly_once_v2"
    )
    assert len(lines) == 4


def test_the_progress_line_takes_the_batch_s_own_guarantee(monkeypatch, capsys):
    @dataclass
    class GuaranteedBatch(Batch):
        guarantee: str = "at_least_once"

    job = FakeJob()
    job.run_forever = lambda trigger, idle, on_batch, **_: on_batch(GuaranteedBatch(0))
    _, out, _ = _run(monkeypatch, capsys, job)
    assert out.splitlines()[1].endswith(" ms, at_least_once")


def test_every_exit_code_is_in_run_s_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for code in ("0 stopped", "1 a batch failed", "2 a wrong setting", "3 another driver",
                 "4 a person must decide", "130 interrupted"):  # fmt: skip
        assert code in text


FAKE_RUN = """
import os, signal, sys, time
from streamplatform import cli
from streamplatform.runtime.signals import StopOnSignals


class Job:
    config = {{"application.id": "orders", "processing.guarantee": "exactly_once_v2"}}

    def run_forever(self, trigger_interval_ms, idle_interval_ms, on_batch, stop=None,
                    until_caught_up=False):
        import threading

        with StopOnSignals(stop or threading.Event(), "orders"):  # run_forever's own handlers
            for signum in {signals}:
                os.kill(os.getpid(), signum)
                time.sleep(0.2)
            time.sleep(30)  # the batch in flight

    def close(self):
        pass


cli._job = lambda args: Job()
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("signals", ["[signal.SIGTERM] * 2", "[signal.SIGINT] * 2"])
def test_a_real_second_signal_ends_the_process_with_130_one_line_and_no_traceback(
    tmp_path, signals
):
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE_RUN.format(signals=signals))
    done = subprocess.run([sys.executable, str(script), *RUN], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 130, done.stderr
    name = "SIGTERM" if "SIGTERM" in signals else "SIGINT"
    lines = [line for line in done.stderr.splitlines() if line.startswith("streamplatform run:")]
    assert lines == [
        f"streamplatform run: interrupted by a second {name} during the batch in flight; "
        "nothing of it is committed, the next run replays it (exit 130)"
    ], done.stderr
    assert "Traceback" not in done.stderr


SIGNAL_WHILE_STARTING = """
import os, signal, sys, time
from streamplatform import cli


class Job:
    config = {{"application.id": "orders", "processing.guarantee": "exactly_once_v2"}}
    ran = False

    def run_forever(self, *args, **kwargs):
        Job.ran = True
        raise AssertionError("a batch was started after the stop signal")

    def close(self):
        print("closed", flush=True)


def building(args):  # the job's start (settings, imports, ...) when the signal comes
    os.kill(os.getpid(), signal.{name})
    time.sleep(0.2)
    return Job()


cli._job = building
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_one_signal_while_the_job_starts_starts_no_batch_and_exits_0(tmp_path, name):
    """Before: the first SIGTERM during the start raised KeyboardInterrupt there (exit 130),
    where the documented first signal lets the batch in flight finish, or starts none."""
    script = tmp_path / "fake_start.py"
    script.write_text(SIGNAL_WHILE_STARTING.format(name=name))
    done = subprocess.run([sys.executable, str(script), *RUN], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == cli.EXIT_STOPPED == 0, done.stderr
    assert "streamplatform run: stopped before the first batch" in done.stderr
    assert f"{name} received; finishing the batch in flight" in done.stderr
    assert "closed" in done.stdout and "Traceback" not in done.stderr


def test_topology_resolves_from_the_current_directory_first(tmp_path, monkeypatch):
    package = tmp_path / "myteam_cwd"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "topologies.py").write_text("x = 'the topology'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    from streamplatform.config import load_object

    with pytest.raises(ValueError, match="cannot import"):
        load_object("myteam_cwd.topologies:x")
    cli.topology_importable_from_cwd()
    cli.topology_importable_from_cwd()  # idempotent
    assert load_object("myteam_cwd.topologies:x") == "the topology"
    assert sys.path[0] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1
    # Spark's Python workers of a local master inherit it through PYTHONPATH.
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(tmp_path), "/elsewhere"])
    sys.modules.pop("myteam_cwd.topologies", None)
    sys.modules.pop("myteam_cwd", None)


TEAM_MODULE = """
from streamplatform import StreamsBuilder
from streamplatform.serdes import Serdes


def x():
    print("topology built", flush=True)
    b = StreamsBuilder()
    b.stream({source!r}, Serdes.string(), Serdes.string()).map_values(str.upper).to({sink!r})
    return b.build()
"""


def team_module(directory: Path, source: str = "in", sink: str = "out") -> str:
    """A package ``myteam`` in ``directory`` (the working directory of the commands below)
    whose ``topologies.x`` builds source -> upper case -> sink; returns its import path."""
    (directory / "myteam").mkdir()
    (directory / "myteam" / "__init__.py").write_text("")
    (directory / "myteam" / "topologies.py").write_text(
        TEAM_MODULE.format(source=source, sink=sink)
    )
    return "myteam.topologies:x"


def five_records(kafka_settings, topic_name: str) -> tuple[str, str]:
    """A one-partition topic ``topic_name`` with k0/v0 .. k4/v4; returns it and the name of the
    team module's sink (``team_module``)."""
    from streamplatform.kafka import TopicSpec, create_topics, producer

    create_topics(kafka_settings, [TopicSpec(topic_name, 1)])
    writer = producer(kafka_settings)
    for n in range(5):
        writer.produce(topic_name, key=f"k{n}", value=f"v{n}")
    assert writer.flush(30) == 0
    return topic_name, f"{topic_name}-upper"


def console_command(action: str, topology: str, settings: dict, *options: str) -> list[str]:
    """The installed ``streamplatform`` script (its sys.path[0] is its bin directory)."""
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    script = str(Path(sys.executable).parent / "streamplatform")
    return [script, action, "--topology", topology, *sets, *options]


def env_without_pythonpath() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


@pytest.mark.child_process
def test_the_console_script_imports_the_topology_from_its_working_directory(tmp_path):
    """No PYTHONPATH: the module in the working directory is found; the command then stops
    at the missing bootstrap.servers, a later step than the import (exit 2)."""
    topology = team_module(tmp_path)
    done = subprocess.run(
        console_command("run", topology, {"application.id": "a"}), cwd=tmp_path,
        env=env_without_pythonpath(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "topology built" in done.stdout, done.stderr
    assert "cannot import" not in done.stderr
    assert done.returncode == cli.EXIT_BAD_SETTINGS, done.stderr
    assert "bootstrap.servers" in done.stderr


def test_topics_parser_takes_the_servers_before_or_after_the_action():
    parser = cli.build_parser()
    before = parser.parse_args(["topics", "--bootstrap-servers", "h:1", "list"])
    after = parser.parse_args(["topics", "list", "--bootstrap-servers", "h:2"])
    assert (before.action, before.bootstrap_servers) == ("list", "h:1")
    assert (after.action, after.bootstrap_servers) == ("list", "h:2")
    tail = parser.parse_args(["topics", "tail", "dlq", "--follow", "--from-end"])
    assert (tail.action, tail.name, tail.follow, tail.from_end) == ("tail", "dlq", True, True)
    with pytest.raises(SystemExit):
        parser.parse_args(["topics", "create"])  # needs a NAME
    with pytest.raises(SystemExit):
        parser.parse_args(["topics", "consume", "t", "--from-end", "--from-beginning"])


def test_a_record_is_shown_whole_even_when_its_value_is_not_what_the_serde_reads():
    record = topic_tools.ConsumedRecord(
        topic="orders-dlq", partition=0, offset=41, timestamp=1_764_000_000_123,
        timestamp_type="CreateTime",
        key=topic_tools.decode(topic_tools.serde("string"), b"k1"),
        value=topic_tools.decode(topic_tools.serde("json"), b"{poison"),
        headers=[("__streams.errors.stacktrace", b"Traceback:\n  line 1\nError"),
                 ("bin", b"\x00\xff"), ("none", None)],
    )  # fmt: skip
    text = record.as_text("string", "json")
    assert text.splitlines()[0] == (
        "partition 0  offset 41  timestamp 2025-11-24T16:00:00.123Z (1764000000123, CreateTime)"
    )
    assert "  key: k1" in text
    assert "  value: {poison  (not json: not JSON:" in text
    assert "    __streams.errors.stacktrace: Error  (3 lines; --stacktrace shows them)" in text
    whole = record.as_text("string", "json", stacktrace=True)
    assert "    __streams.errors.stacktrace: Traceback:\n        line 1\n      Error" in whole
    assert "    bin: hex:00ff" in text and "    none: null" in text
    data = record.as_json()
    assert data["value"]["raw"] == "{poison" and "not JSON" in data["value"]["error"]
    assert data["headers"][1:] == [{"name": "bin", "hex": "00ff"}, {"name": "none", "value": None}]


@pytest.mark.parametrize(
    ("serde", "text", "data"),
    [
        ("string", "héllo", "héllo".encode()),
        ("json", '{"id": 1}', b'{"id":1}'),
        ("long", "-5", (-5).to_bytes(8, "big", signed=True)),
        ("bytes", "00ff", b"\x00\xff"),
    ],
)
def test_produce_encodes_text_with_each_serde(serde, text, data):
    assert topic_tools.encode(serde, text, "value") == data


def test_produce_names_the_line_that_is_not_what_its_serde_takes():
    with pytest.raises(topic_tools.TopicToolError, match="line 2: value '{x' is not json"):
        topic_tools.encode("json", "{x", "line 2: value")


def test_py4j_reports_of_an_interrupted_call_are_dropped_and_its_real_errors_kept():
    """py4j logs (some through the root logger) the call a second SIGTERM interrupted, and what
    closing its connection then raised: noise beside run's one line. Its other errors stay."""

    def shown(name, level, error=None, path="/site-packages/py4j/clientserver.py"):
        info = (type(error), error, None) if error is not None else None
        return cli._quiet_py4j(logging.LogRecord(name, level, path, 1, "m", None, info))

    try:
        try:
            raise KeyboardInterrupt("SIGTERM again")
        except KeyboardInterrupt:
            raise BrokenPipeError("closing the interrupted connection")  # noqa: B904
    except BrokenPipeError as closing:
        assert not shown("py4j.clientserver", logging.ERROR, closing)
    assert not shown(
        "root", logging.ERROR, KeyboardInterrupt(), "/site-packages/py4j/java_gateway.py"
    )
    assert not shown("py4j.clientserver", logging.INFO)  # a connection closed
    assert shown("py4j.java_gateway", logging.ERROR, RuntimeError("the JVM died"))
    assert shown("streamplatform.cli", logging.INFO, path="/platform/streamplatform/cli.py")


def test_run_takes_state_tables_as_the_python_and_dagster_declarations_do(monkeypatch):
    """``--delta-state-table`` is StreamingJob's ``delta_state_tables`` (and the Dagster
    spec's): the same name, the same meaning."""
    made = {}
    monkeypatch.setattr("streamplatform.runtime.microbatch.StreamingJob",
                        lambda topology, settings, **kwargs: made.update(kwargs))  # fmt: skip
    args = cli.build_parser().parse_args([
        "run", "--topology", "tests.test_cli:_counts_topology", "--delta-sink", "copy",
        "--delta-state-table", "counts",
    ])  # fmt: skip
    cli._job(args)
    assert made == {"delta_sinks": ["copy"], "delta_state_tables": ["counts"]}


def _counts_topology():
    from streamplatform import StreamsBuilder

    b = StreamsBuilder()
    stream = b.stream("in")
    stream.to("copy")
    stream.group_by_key().count().to_stream().to("counts")
    return b.build()


def test_rewind_prints_what_it_did_and_refuses_in_one_line(monkeypatch, capsys):
    from streamplatform.runtime.rewind import RewindReport

    class Rewindable(FakeJob):
        def rewind(self, to_batch, accept_kafka_repeats=False):
            if not accept_kafka_repeats:
                raise ConfigError("orders: the batches after 4 wrote to the Kafka topics ['out']")
            return RewindReport("orders", 9, to_batch, {"out": 10}, ["out"], {("in", 0): 10})

    job = Rewindable()
    monkeypatch.setattr(cli, "_job", lambda args: job)
    command = ["rewind", "--topology", "unused:x", "--to-batch", "4"]
    assert cli.main(command) == cli.EXIT_BAD_SETTINGS
    assert "wrote to the Kafka topics" in _one_line(capsys.readouterr().err)
    assert cli.main([*command, "--accept-kafka-repeats"]) == 0
    out = capsys.readouterr().out
    assert "orders rewound to just after batch 4 (was at batch 9)" in out
    assert "Kafka topic out: what batches after 4 wrote stays" in out
    assert job.closed == 2
