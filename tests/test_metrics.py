"""JobMetrics without Spark: batch results in, Prometheus's text format out, under Kafka
Streams' names (as the JMX exporter names them) and the platform's own."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from streamplatform.metrics import JobMetrics


@dataclass
class Result:  # BatchResult's fields that JobMetrics reads
    batch_id: int
    records_in: int
    records_out: int = 0
    dlq_records: int = 0
    duplicates_dropped: int = 0
    restored_records: int = 0
    lag: int = 0
    duration_ms: int = 100
    replayed: bool = False
    path: str = "direct-spark"
    metrics: dict = field(default_factory=dict)
    task_metrics: dict = field(default_factory=dict)
    partition_lag: dict = field(default_factory=dict)
    store_metrics: dict = field(default_factory=dict)


def samples(metrics: JobMetrics) -> dict[tuple[str, tuple], float]:
    text = metrics.exposition().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_batches_become_kafka_streams_thread_task_node_and_consumer_metrics():
    metrics = JobMetrics("orders")
    task_0 = {"records_in": 10, "dropped_records": 1, "skipped": 1, "records_timestamped": 10,
              "record_lateness_sum_ms": 50, "record_lateness_max": 30,
              "record_e2e_latency_sum_ms": 10_000, "record_e2e_latency_max_ms": 2_000}  # fmt: skip
    task_1 = {"records_in": 5, "records_timestamped": 5, "record_lateness_sum_ms": 0,
              "record_lateness_max": 0, "record_e2e_latency_sum_ms": 500,
              "record_e2e_latency_max_ms": 200}  # fmt: skip
    metrics.record(Result(0, 15, records_out=12, dlq_records=2, duplicates_dropped=1,
                          metrics={"commit_ms": 40, "plan_ms": 5, "run_and_write_ms": 50},
                          task_metrics={"0_0": task_0, "0_1": task_1},
                          partition_lag={("in", 0): 3, ("in", 1): 0}, lag=3),
                   claim_epoch=7)  # fmt: skip
    metrics.record(Result(1, 5, replayed=True, metrics={"commit_ms": 20},
                          task_metrics={"0_0": {"records_in": 5}},
                          partition_lag={("in", 0): 0, ("in", 1): 0}))  # fmt: skip
    got = samples(metrics)
    app = ("application_id", "orders")

    def value(name, **labels):
        key = tuple(sorted([app, *labels.items()]))
        return got[(name, key)]

    thread_labels = {"thread_id": "orders-driver"}
    assert value("kafka_streams_stream_thread_metrics_process_total", **thread_labels) == 20
    assert value("kafka_streams_stream_thread_metrics_commit_total", **thread_labels) == 2
    assert value("kafka_streams_stream_thread_metrics_commit_latency_max", **thread_labels) == 40
    assert value("kafka_streams_stream_thread_metrics_commit_latency_avg", **thread_labels) == 30
    assert value("kafka_streams_stream_thread_metrics_process_rate", **thread_labels) > 0
    task = {"thread_id": "orders-driver", "task_id": "0_0"}
    assert value("kafka_streams_stream_task_metrics_process_total", **task) == 15
    assert value("kafka_streams_stream_task_metrics_dropped_records_total", **task) == 2
    assert value("kafka_streams_stream_task_metrics_record_lateness_max", **task) == 30
    assert value("kafka_streams_stream_task_metrics_record_lateness_avg", **task) == 5
    node = {"thread_id": "orders-driver", "task_id": "0_1", "processor_node_id": "sources"}
    assert (
        value("kafka_streams_stream_processor_node_metrics_record_e2e_latency_avg", **node) == 100
    )
    assert (
        value("kafka_streams_stream_processor_node_metrics_record_e2e_latency_max", **node) == 200
    )
    lag = "kafka_consumer_consumer_fetch_manager_metrics_records_lag"
    assert value(lag, topic="in", partition="0") == 0  # the last batch's
    assert value("streamplatform_records_in_total") == 20
    assert value("streamplatform_dlq_records_total") == 2
    assert value("streamplatform_replayed_batches_total") == 1
    assert value("streamplatform_batches_total", path="direct-spark") == 2
    assert value("streamplatform_batch_phase_duration_ms", phase="commit") == 20
    assert value("streamplatform_committed_batch_id") == 1
    assert value("streamplatform_claim_epoch") == 7
    assert (
        "kafka_streams_stream_task_metrics_process_total",
        tuple(sorted([app, ("task_id", "0_1"), ("thread_id", "orders-driver")])),
    ) in got


def test_the_grafana_dashboard_reads_only_metrics_the_job_exposes():
    """docs/grafana/streamplatform-dashboard.json: every expression names metrics JobMetrics
    serves (a renamed metric would leave a panel empty)."""
    import json
    import re
    from pathlib import Path

    dashboard = json.loads(
        (Path(__file__).parents[1] / "docs/grafana/streamplatform-dashboard.json").read_text()
    )
    metrics = JobMetrics("orders")
    metrics.record(Result(0, 1, metrics={"commit_ms": 1}, partition_lag={("in", 0): 0},
                          task_metrics={"0_0": {"records_in": 1, "records_timestamped": 1,
                                                "record_lateness_sum_ms": 0,
                                                "record_lateness_max": 0,
                                                "record_e2e_latency_sum_ms": 5,
                                                "record_e2e_latency_max_ms": 5}},
                          store_metrics={("0_0", "s"): {"cur_size_all_mem_tables": 1,
                                                        "estimate_num_keys": 1,
                                                        "get_calls": 1, "put_calls": 1,
                                                        "get_latency_total_ns": 9,
                                                        "get_latency_max_ns": 9,
                                                        "put_latency_total_ns": 9,
                                                        "put_latency_max_ns": 9}}),
                   claim_epoch=1)  # fmt: skip
    served = {name for name, _ in samples(metrics)}
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions.append(dashboard["templating"]["list"][1]["query"])
    named = {n for e in expressions for n in re.findall(r"\b(?:kafka|streamplatform)_\w+", e)}
    assert len(dashboard["panels"]) >= 10 and named
    assert named <= served, named - served


def test_a_stores_rocksdb_properties_become_kafka_streams_state_metrics(tmp_path):
    """KIP-607's RocksDB metrics from a real store: its memtables hold what was written, its
    keys are counted; JobMetrics publishes them per task and store."""
    from streamplatform.state import TransactionalKeyValueStore

    with TransactionalKeyValueStore(tmp_path / "counts") as store:
        empty = store.rocksdb_metrics()
        txn = store.transaction
        for n in range(1_000):
            txn.put(b"key-%05d" % n, b"x" * 100)
        store.commit({("clicks", 0): 1_000})
        written = store.rocksdb_metrics()
    assert set(written) == {"cur_size_all_mem_tables", "size_all_mem_tables",
                            "estimate_num_keys", "estimate_table_readers_mem",
                            "block_cache_usage"}  # fmt: skip
    assert written["cur_size_all_mem_tables"] > empty["cur_size_all_mem_tables"] + 100_000
    assert 900 <= written["estimate_num_keys"] <= 1_100  # RocksDB's estimate

    metrics = JobMetrics("orders")
    metrics.record(Result(0, 1, store_metrics={("0_0", "counts"): written}))
    got = samples(metrics)
    key = ("kafka_streams_stream_state_metrics_estimate_num_keys",
           tuple(sorted([("application_id", "orders"), ("rocksdb_state_id", "counts"),
                         ("task_id", "0_0"), ("thread_id", "orders-driver")])))  # fmt: skip
    assert got[key] == written["estimate_num_keys"]


def test_the_same_metrics_reach_an_opentelemetry_collector_over_otlp_http():
    """A receiver of OTLP/HTTP (what an OpenTelemetry collector listens with) gets the job's
    metrics under the same names and labels."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    received: list[ExportMetricsServiceRequest] = []

    class Collector(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            received.append(request)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    metrics = JobMetrics("orders")
    metrics.record(Result(0, 7, dlq_records=2, task_metrics={"0_0": {"records_in": 7}}))
    provider = metrics.export_otlp(f"http://127.0.0.1:{server.server_address[1]}/v1/metrics",
                                   interval_s=3600)  # fmt: skip
    try:
        assert provider.force_flush(10_000)
    finally:
        provider.shutdown()
        server.shutdown()
    points = {}
    for request in received:
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.gauge.data_points:
                        labels = {a.key: a.value.string_value for a in point.attributes}
                        points[(metric.name, labels.get("task_id"))] = point.as_double
    assert points[("kafka_streams_stream_task_metrics_process_total", "0_0")] == 7
    assert points[("kafka_streams_stream_thread_metrics_process_total", None)] == 7
    assert points[("streamplatform_dlq_records_total", None)] == 2


def test_rates_fall_to_zero_without_batches_and_the_lag_moves_between_them(monkeypatch):
    """A job that stops committing shows it: its rates fall to zero once its batches leave
    the 30 s window, the time of its last commit stays, and the lag seen between batches is
    published (before, every gauge kept its last batch's value)."""
    import streamplatform.metrics as metrics_module

    clock = [1_000.0]
    monkeypatch.setattr(metrics_module.time, "monotonic", lambda: clock[0])
    metrics = JobMetrics("orders")
    clock[0] += 10
    metrics.record(Result(0, 30, metrics={"commit_ms": 5}, partition_lag={("in", 0): 0},
                          task_metrics={"0_0": {"records_in": 30}}))  # fmt: skip
    rate = ("kafka_streams_stream_thread_metrics_process_rate",
            (("application_id", "orders"), ("thread_id", "orders-driver")))  # fmt: skip
    task_rate = ("kafka_streams_stream_task_metrics_process_rate",
                 (("application_id", "orders"), ("task_id", "0_0"),
                  ("thread_id", "orders-driver")))  # fmt: skip
    assert samples(metrics)[rate] == 3.0  # 30 records over the 10 s the job has run
    clock[0] += 31
    metrics.refresh()
    metrics.observe_lag({("in", 0): 500})
    got = samples(metrics)
    assert got[rate] == 0 and got[task_rate] == 0
    lag = ("kafka_consumer_consumer_fetch_manager_metrics_records_lag",
           (("application_id", "orders"), ("partition", "0"), ("topic", "in")))  # fmt: skip
    assert got[lag] == 500
    assert got[("streamplatform_lag", (("application_id", "orders"),))] == 500
    assert got[("streamplatform_last_commit_timestamp_seconds",
                (("application_id", "orders"),))] > 0  # fmt: skip
