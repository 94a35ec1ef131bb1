"""streamplatform's metrics under Kafka Streams' names: every task, processor-node and
state-store metric JobMetrics publishes exists in Kafka Streams 4.4 itself, with the same tags
(MetricsReference.java lists what a TopologyTestDriver with a RocksDB store publishes), as
Prometheus's JMX exporter names them (``kafka_streams_<group>_<name>``, dashes to
underscores). Thread-level metrics are not in the test driver (it has no stream thread)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from streamplatform.metrics import JobMetrics

from .kafka_streams import run_reference


def _ours() -> dict[str, set[str]]:
    """JobMetrics' Kafka Streams families after a batch: name -> label names."""
    from test_metrics import Result

    metrics = JobMetrics("orders")
    task = {"records_in": 3, "records_timestamped": 3, "record_lateness_sum_ms": 0,
            "record_lateness_max": 0, "record_e2e_latency_sum_ms": 30,
            "record_e2e_latency_max_ms": 10}  # fmt: skip
    store = dict.fromkeys(("cur_size_all_mem_tables", "size_all_mem_tables",
                           "estimate_num_keys", "estimate_table_readers_mem",
                           "block_cache_usage"), 1)  # fmt: skip
    metrics.record(Result(0, 3, metrics={"commit_ms": 1}, task_metrics={"0_0": task},
                          store_metrics={("0_0", "counts"): store}))  # fmt: skip
    families = text_string_to_metric_families(metrics.exposition().decode())
    return {
        sample.name: set(sample.labels) - {"application_id"}
        for family in families for sample in family.samples
        if sample.name.startswith("kafka_streams_")
    }  # fmt: skip


def test_the_task_node_and_store_metrics_are_kafka_streams_own(tmp_path):
    lines = run_reference("MetricsReference.java", "info", "a\tx\t1\nb\ty\t2\na\tz\t3\n",
                          tmp_path / "ks")  # fmt: skip
    theirs = {}
    for line in lines:
        group, name, tags = line.split("\t")
        exported = f"kafka_streams_{group}_{name}".replace("-", "_")
        theirs[exported] = {tag.replace("-", "_") for tag in tags.split(",") if tag}
    ours = _ours()
    compared = {name for name in ours if "stream_thread_metrics" not in name}
    assert len(compared) == 14, sorted(ours)  # 6 task, 3 processor-node, 5 state-store
    missing = sorted(name for name in compared if name not in theirs)
    assert not missing, f"not Kafka Streams metrics: {missing}"
    for name in compared:
        assert ours[name] == theirs[name], (name, ours[name], theirs[name])
