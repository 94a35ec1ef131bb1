"""A real Prometheus scrapes a `streamplatform run --metrics-port` job on Spark (its tasks in
Spark's Python workers: ``platform.driver.tasks.max.records=0``) while it runs, and finds Kafka
Streams' metrics with the values the job's own progress lines give: records processed (by the
thread and by its tasks, which report from the executors), the DLQ, duplicates dropped and the
records lag; the tasks' RocksDB stores; and the platform's own batches by path."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
from runtime.support import RECORDS, make_input, wait_for
from test_cli import console_command, env_without_pythonpath

from streamplatform.kafka import TopicSpec, create_topics
from streamplatform.local_cluster import free_port

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

PROMETHEUS = Path(__file__).parents[1] / ".tools" / "prometheus" / "usr" / "bin" / "prometheus"

DEDUP_MODULE = """
from streamplatform import Processor, StreamsBuilder
from streamplatform.serdes import Serdes
from streamplatform.state import Stores


class Counter(Processor):
    def init(self, context):
        super().init(context)
        self.store = context.get_state_store("counts")

    def process(self, record):
        count = (self.store.get(record.key) or 0) + 1
        self.store.put(record.key, count)


def x():
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value_store_builder(
        Stores.persistent_key_value_store("counts"), Serdes.string(), Serdes.long()))
    stream = b.stream({source!r}, Serdes.string(), Serdes.json())
    stream.deduplicate_by_key_value(lambda k, v: v["id"], 60_000).to("deduplicated")
    stream.process(Counter, "counts")
    return b.build()
"""


def _query(port: int, expression: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(expression)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def _value(port: int, expression: str) -> float | None:
    result = _query(port, expression)
    return float(result[0]["value"][1]) if result else None


@pytest.mark.timeout(600)
@pytest.mark.child_process
def test_prometheus_scrapes_kafka_streams_metrics_that_match_the_batches(kafka_settings, tmp_path):
    if not PROMETHEUS.exists():
        pytest.skip(f"no Prometheus server at {PROMETHEUS} (make setup fetches Debian's)")
    source = f"in-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_settings, [TopicSpec(source, 3), TopicSpec(f"{source}-dlq", 1)])
    make_input(kafka_settings, source)  # 240 records, 20% duplicates, 3 poison values
    (tmp_path / "metricsjob").mkdir()
    (tmp_path / "metricsjob" / "__init__.py").write_text("")
    (tmp_path / "metricsjob" / "topologies.py").write_text(DEDUP_MODULE.format(source=source))
    app = f"metrics-{uuid.uuid4().hex[:6]}"
    settings = {
        "application.id": app, "bootstrap.servers": kafka_settings["bootstrap.servers"],
        "platform.delta.root": str(tmp_path / "delta"), "state.dir": str(tmp_path / "state"),
        "platform.spark.master": "local[2]", "platform.max.records.per.batch": 50,
        "platform.driver.tasks.max.records": 0,  # the tasks in Spark's Python workers
        "errors.dead.letter.queue.topic.name": f"{source}-dlq",
        "default.deserialization.exception.handler": "log_and_continue",
        "metrics.recording.level": "DEBUG",  # the store operations too
    }  # fmt: skip
    metrics_port, prometheus_port = free_port(), free_port()
    command = console_command("run", "metricsjob.topologies:x", settings,
                              "--delta-sink", "deduplicated", "--metrics-port", str(metrics_port),
                              "--idle-interval-ms", "500")  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: streamplatform\n    static_configs: [{{targets: "
        f"['127.0.0.1:{metrics_port}']}}]\n"
    )
    out, err, prom_log = tmp_path / "driver.out", tmp_path / "driver.err", tmp_path / "prom.log"
    with out.open("w") as stdout, err.open("w") as stderr, prom_log.open("w") as prom_out:
        driver = subprocess.Popen(command, cwd=tmp_path, env=env_without_pythonpath(),
                                  stdout=stdout, stderr=stderr, start_new_session=True)  # fmt: skip
        prometheus = subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            stdout=prom_out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        thread_total = (f'kafka_streams_stream_thread_metrics_process_total'
                        f'{{application_id="{app}"}}')  # fmt: skip

        def scraped_everything() -> bool:
            with contextlib.suppress(OSError):
                return _value(prometheus_port, thread_total) == RECORDS
            return False

        wait_for("Prometheus to scrape all 240 records processed", scraped_everything, err, 300)
        selector = f'{{application_id="{app}"}}'
        tasks = _query(
            prometheus_port, f"kafka_streams_stream_task_metrics_process_total{selector}"
        )
        by_task = {r["metric"]["task_id"]: float(r["value"][1]) for r in tasks}
        dlq = _value(prometheus_port, f"streamplatform_dlq_records_total{selector}")
        duplicates = _value(prometheus_port, f"streamplatform_duplicates_dropped_total{selector}")
        lag = _value(prometheus_port, f"max(kafka_consumer_consumer_fetch_manager_metrics_"
                                      f"records_lag{selector})")  # fmt: skip
        paths = _query(prometheus_port, f"streamplatform_batches_total{selector}")
        keys = _query(prometheus_port,
                      f"kafka_streams_stream_state_metrics_estimate_num_keys{selector}")  # fmt: skip
        e2e = _value(prometheus_port, f"max(kafka_streams_stream_processor_node_metrics_"
                                      f"record_e2e_latency_max{selector})")  # fmt: skip
        counts = f'{{application_id="{app}",rocksdb_state_id="counts"}}'
        put_latency = _query(
            prometheus_port, f"kafka_streams_stream_state_metrics_put_latency_avg{counts}"
        )
        get_latency_max = _value(prometheus_port, "max(kafka_streams_stream_state_metrics_"
                                 f"get_latency_max{counts})")  # fmt: skip
    finally:
        driver.send_signal(signal.SIGTERM)
        code = driver.wait(120)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(prometheus.pid, signal.SIGKILL)
        prometheus.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # its Spark JVM
    assert code == 0, err.read_text()[-3000:]
    batches = [re.match(r"batch \d+: (\d+) in, (\d+) out, (\d+) duplicates dropped, (\d+) to "
                        r"the DLQ, lag (\d+)", line)
               for line in out.read_text().splitlines() if line.startswith("batch ")]  # fmt: skip
    assert batches and all(batches)
    assert sum(int(b[1]) for b in batches) == RECORDS
    # The tasks' own counts, from Spark's Python workers: three partitions, three tasks.
    assert len(by_task) == 3 and sum(by_task.values()) == RECORDS, by_task
    assert dlq == sum(int(b[4]) for b in batches) == 3
    assert duplicates == sum(int(b[3]) for b in batches) > 0
    assert lag == int(batches[-1][5]) == 0
    assert {r["metric"]["path"] for r in paths} == {"direct-spark"}
    assert e2e is not None and e2e > 0
    # The dedup store of each task, as its RocksDB counts its keys (ids and their index).
    assert {r["metric"]["task_id"] for r in keys} == set(by_task)
    assert sum(float(r["value"][1]) for r in keys) > 0
    # DEBUG: the user processor's store operations, timed in the executors, per task.
    assert {r["metric"]["task_id"] for r in put_latency} == set(by_task)
    assert all(float(r["value"][1]) > 0 for r in put_latency)
    assert get_latency_max is not None and get_latency_max > 0
