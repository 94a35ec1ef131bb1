"""A job on Spark Connect (streamplatform.local_cluster.LocalConnectServer): a client process
whose ``platform.spark.master`` is ``sc://...`` runs the dedup job, on the small-batch path
and on the big-batch path (side files), with the same Delta output and DLQ as a classic run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamplatform.local_cluster import LocalConnectServer

from .support import RECORDS, delta_rows, expected_with_the_test_driver, job_config, running_pids

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]
TESTS = os.path.dirname(os.path.dirname(__file__))

# The client runs in a process of its own: the pytest process hosts a classic SparkSession
# already, and pyspark keeps one active session per process. spark=None: the job makes its
# session from "platform.spark.master" (streamplatform.spark.spark_session's Connect path).
CLIENT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from runtime.support import dedup_topology
    from streamplatform.runtime.microbatch import StreamingJob
    job = StreamingJob(dedup_topology({source!r}, "deduplicated"), {config!r},
                       delta_sinks=["deduplicated"])
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    print(json.dumps({{
        "session": type(job.spark).__module__,
        "batches": [
            {{"batch_id": r.batch_id, "records_in": r.records_in, "dlq_records": r.dlq_records,
              "tasks_reused": r.metrics.get("tasks_reused"),
              "tasks_opened": r.metrics.get("tasks_opened")}}
            for r in results
        ],
    }}), flush=True)
    job.spark.stop()
""")


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConnectServer]:
    # The server's Python workers run the tasks: they must import what the client's functions
    # refer to by module (runtime.support), so the tests directory is on their PYTHONPATH.
    python_path = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
    server = LocalConnectServer(tmp_path_factory.mktemp("connect"), env={"PYTHONPATH": python_path})
    with server:
        yield server
        pids = server.pids()
    assert not running_pids(pids), f"left behind by the Connect server: {running_pids(pids)}"


def _run_client(script: str, folder: Path, timeout_s: float = 300) -> dict:
    """Run ``script`` to the end; its last stdout line is JSON. Output goes to files."""
    out_path, err_path = folder / "client.out", folder / "client.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", script], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            env=os.environ | {"PYTHONUNBUFFERED": "1"}, start_new_session=True,
        )  # fmt: skip
        try:
            code = child.wait(timeout=timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)  # anything left (or all, on a timeout)
            child.wait()
    output = out_path.read_text(errors="replace")
    lines = output.strip().splitlines()
    if code != 0 or not lines:
        errors = err_path.read_text(errors="replace")[-4000:]
        raise AssertionError(f"the client exited with {code}:\n{output[-2000:]}\n{errors}")
    result: dict = json.loads(lines[-1])
    return result


@pytest.mark.parametrize(
    "overrides",
    [{}, {"platform.sink.driver.max.records": 0}],
    ids=["small-batches", "big-batches-side-files"],
)
@pytest.mark.connect_server
@pytest.mark.child_process
def test_the_dedup_job_on_spark_connect_equals_the_test_driver(
    spark, kafka_settings, source_topic, connect_server, tmp_path, overrides
):
    source, sent = source_topic
    app = f"connect-{uuid.uuid4().hex[:6]}"
    config = job_config(kafka_settings, tmp_path, app, source, **overrides) | {
        "platform.spark.master": connect_server.url
    }
    script = CLIENT.format(tests=TESTS, config=config, source=source)
    try:
        result = _run_client(script, tmp_path)
    except AssertionError as error:
        log = connect_server.log_file.read_text(errors="replace")[-3000:]
        raise AssertionError(f"{error}\n--- Connect server log (tail) ---\n{log}") from None
    print(json.dumps(result))  # per-batch records_in and tasks_reused, with -s or on failure

    assert result["session"].startswith("pyspark.sql.connect"), result["session"]
    batches = result["batches"]
    assert [b["batch_id"] for b in batches] == list(range(len(batches)))
    assert sum(b["records_in"] for b in batches) == RECORDS
    assert sum(b["dlq_records"] for b in batches) == 3
    rows = delta_rows(spark, f"{tmp_path}/delta/{app}/deduplicated")
    assert sorted((k, v) for _, _, k, v in rows) == expected_with_the_test_driver(source, sent)
    assert len({(p, o) for p, o, _, _ in rows}) == len(rows)  # no source record twice
    dlq = spark.read.format("delta").load(f"{tmp_path}/delta/{app}/_dlq").collect()
    assert sorted(r.value for r in dlq) == [b"{poison"] * 3
