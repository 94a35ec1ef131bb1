"""Kafka Streams' store operation metrics (``metrics.recording.level=DEBUG``): each call a
processor makes on its store counted and timed once, reported with the task's store metrics,
and turned into ``put-latency-avg``/``-max``/``put-rate`` and the others per store."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamplatform import Processor, StreamsBuilder, TopologyTestDriver
from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.metrics import JobMetrics
from streamplatform.runtime.task_run import _store_metrics
from streamplatform.serdes import Serdes
from streamplatform.state import KeyValueStore, Stores
from streamplatform.state.facades import facade_for
from streamplatform.state.store_metrics import timed


class Counter(Processor):
    def init(self, context):
        super().init(context)
        self.store = context.get_state_store("counts")

    def process(self, record):
        count = (self.store.get(record.key) or 0) + 1
        self.store.put(record.key, count)
        if count == 3:
            list(self.store.range(None, None))
        self.context.forward(record._replace(value=count))


def _counting():
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value_store_builder(
        Stores.persistent_key_value_store("counts"), Serdes.string(), Serdes.long()))  # fmt: skip
    b.stream("in", Serdes.string(), Serdes.string()).process(Counter, "counts").to(
        "out", value_serde=Serdes.long()
    )
    return b.build()


def _run(level: str | None) -> dict[str, dict[str, int]]:
    config = {"application.id": "count"}
    if level is not None:
        config["metrics.recording.level"] = level
    with TopologyTestDriver(_counting(), config) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.string())
        for offset, key in enumerate("aabaca"):
            source.pipe_input(key, "x", timestamp=offset)
        (task,) = driver._tasks.values()
        return _store_metrics(task)


def test_at_debug_each_processor_call_is_counted_once_per_operation():
    numbers = _run("DEBUG")["counts"]
    assert numbers["get_calls"] == 6 and numbers["put_calls"] == 6
    assert numbers["range_calls"] == 1  # the third "a"
    for operation in ("get", "put", "range"):
        total = numbers[f"{operation}_latency_total_ns"]
        assert 0 < numbers[f"{operation}_latency_max_ns"] <= total


def test_at_info_nothing_is_timed():
    assert not any(name.endswith("_calls") for name in _run(None).get("counts", {}))
    assert not any(name.endswith("_calls") for name in _run("INFO").get("counts", {}))


def test_a_wrong_level_names_the_setting():
    with pytest.raises(ConfigError, match="metrics.recording.level"):
        StreamsConfig({"application.id": "a", "metrics.recording.level": "debug-ish"})


def test_put_all_and_reverse_ranges_count_as_kafka_streams_counts_them(tmp_path):
    spec = Stores.key_value_store_builder(
        Stores.persistent_key_value_store("s"), Serdes.string(), Serdes.long()
    )
    engine = spec.open(str(tmp_path))
    try:
        store = timed(facade_for(spec, engine))
        assert isinstance(store, KeyValueStore)
        store.put_all([("a", 1), ("b", 2), ("c", 3)])  # one put-all, no puts
        assert store.put_if_absent("a", 9) == 1
        assert list(store.reverse_range("a", "b")) == [("b", 2), ("a", 1)]
        assert [k for k, _ in store.reverse_all()] == ["c", "b", "a"]
        iterator = store.prefix_scan("b")
        assert next(iterator) == ("b", 2)
        iterator.close()  # closed before the end: timed until then
        assert store.delete("c") == 3
        calls = {op: n for op, (n, _total, _most) in store.timings.take().items()}
        assert calls == {"put-all": 1, "put-if-absent": 1, "range": 1, "all": 1,
                         "prefix-scan": 1, "delete": 1}  # fmt: skip
        assert store.timings.take() == {}  # taken: the next batch starts over
    finally:
        engine.close()


def _samples(metrics: JobMetrics) -> dict[tuple[str, tuple], float]:
    text = metrics.exposition().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class _Result:  # the BatchResult fields JobMetrics reads
    def __init__(self, batch_id: int, store_metrics: dict) -> None:
        self.batch_id, self.records_in, self.records_out = batch_id, 1, 0
        self.dlq_records = self.duplicates_dropped = self.restored_records = self.lag = 0
        self.duration_ms, self.replayed, self.path = 10, False, "direct-spark"
        self.metrics: dict = {}
        self.task_metrics: dict = {}
        self.partition_lag: dict = {}
        self.store_metrics = store_metrics


def test_batches_of_timings_become_kafka_streams_store_latency_and_rate_metrics():
    metrics = JobMetrics("orders")
    first = {"put_calls": 2, "put_latency_total_ns": 3_000, "put_latency_max_ns": 2_000,
             "estimate_num_keys": 5}  # fmt: skip
    second = {"put_calls": 2, "put_latency_total_ns": 1_000, "put_latency_max_ns": 600,
              "get_calls": 1, "get_latency_total_ns": 400, "get_latency_max_ns": 400}  # fmt: skip
    metrics.record(_Result(0, {("0_0", "counts"): first}))
    metrics.record(_Result(1, {("0_0", "counts"): second}))
    got = _samples(metrics)
    labels = tuple(sorted({"application_id": "orders", "thread_id": "orders-driver",
                           "task_id": "0_0", "rocksdb_state_id": "counts"}.items()))  # fmt: skip
    state = "kafka_streams_stream_state_metrics_"
    assert got[(f"{state}put_latency_avg", labels)] == 1_000  # 4,000 ns over 4 puts
    assert got[(f"{state}put_latency_max", labels)] == 2_000
    assert got[(f"{state}get_latency_avg", labels)] == 400
    assert got[(f"{state}put_rate", labels)] > got[(f"{state}get_rate", labels)] > 0
    assert got[(f"{state}estimate_num_keys", labels)] == 5
