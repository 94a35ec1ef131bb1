"""A running job's metrics under Kafka Streams' names, for Prometheus (docs/operations.md).

Kafka Streams publishes its metrics through JMX; teams scrape them with Prometheus's JMX
exporter, which names a metric ``kafka_streams_<group>_<name>`` (dashes to underscores) and
turns its tags into labels. The same names here, so that their dashboards and alerts read a
streamplatform job too:

- thread level (``stream-thread-metrics``; ``thread_id`` is the driver's):
  ``process-total``/``-rate``, ``commit-total``/``-rate``, ``commit-latency-avg``/``-max``;
- task level (``stream-task-metrics``; ``task_id``), from the tasks' own numbers, which come
  back from Spark's executors with each batch's progress rows: ``process-total``/``-rate``,
  ``dropped-records-total``/``-rate``, ``record-lateness-avg``/``-max``;
- processor-node level (``stream-processor-node-metrics``; a task's source nodes as
  ``processor_node_id="sources"``): ``record-e2e-latency-avg``/``-min``/``-max``, the time from a
  record's timestamp to the end of the batch that processed it;
- state-store level (``stream-state-metrics``; ``rocksdb_state_id``: the store), RocksDB's
  properties as Kafka Streams' RocksDB metrics (KIP-607): ``cur-size-all-mem-tables``,
  ``size-all-mem-tables``, ``estimate-num-keys``, ``estimate-table-readers-mem``,
  ``block-cache-usage`` (the cache is shared by a process's stores);
- the consumer's ``records-lag`` per partition (``consumer-fetch-manager-metrics``);
- the platform's own, ``streamplatform_*``: batches by execution path, each phase's duration,
  records in and out, the DLQ, duplicates dropped, replays, restores, the committed batch, the
  claim's epoch and the lag.

Rates and averages are over Kafka Streams' sample window, the last 30 s of batches; totals
since the job started in this process. Every series carries ``application_id``.

    metrics = JobMetrics("orders")
    metrics.serve(9464)                     # http://127.0.0.1:9464/metrics
    metrics.export_otlp("http://collector:4318/v1/metrics")   # optional: OpenTelemetry
    job.run_forever(on_batch=metrics.record)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from streamplatform.state.db import StateDB
from streamplatform.state.store_metrics import OPERATIONS

WINDOW_S = 30.0  # Kafka Streams' metrics.sample.window.ms, for rates and averages

_THREAD = "kafka_streams_stream_thread_metrics_"
_TASK = "kafka_streams_stream_task_metrics_"
_NODE = "kafka_streams_stream_processor_node_metrics_"
_FETCH = "kafka_consumer_consumer_fetch_manager_metrics_"
_STATE = "kafka_streams_stream_state_metrics_"
# Kafka Streams' RocksDB metrics (KIP-607) and the properties they read.
_ROCKSDB_PROPERTIES = StateDB.ROCKSDB_PROPERTIES


class JobMetrics:
    """One job's metrics in a registry of their own (``registry``), fed a ``BatchResult``
    per batch (``record``), served over HTTP (``serve``) or rendered (``exposition``)."""

    def __init__(
        self, application_id: str, registry: CollectorRegistry | None = None,
        thread_id: str | None = None,
    ) -> None:  # fmt: skip
        self.application_id = application_id
        self.thread_id = thread_id or f"{application_id}-driver"
        self.registry = registry or CollectorRegistry()
        self._started = time.monotonic()
        self._window: deque[tuple[float, Any]] = deque()  # (when recorded, result)
        self._process_total = 0
        self._commit_total = 0
        self._task_totals: dict[str, dict[str, int]] = {}
        self._store_ops_seen: set[tuple[str, str, str]] = set()  # (task, store, operation)
        self._lock = threading.Lock()  # record() (the job's thread) and refresh() (serve's)
        thread, task = ["application_id", "thread_id"], ["application_id", "thread_id", "task_id"]
        node = [*task, "processor_node_id"]

        def gauge(name: str, help: str, labels: list[str]) -> Gauge:
            return Gauge(name, help, labels, registry=self.registry)

        def counter(name: str, help: str, labels: Iterable[str] = ("application_id",)) -> Counter:
            return Counter(name, help, list(labels), registry=self.registry)

        self.thread = {
            "process_total": gauge(f"{_THREAD}process_total", "Records processed.", thread),
            "process_rate": gauge(
                f"{_THREAD}process_rate", "Records processed per second.", thread
            ),  # fmt: skip
            "commit_total": gauge(f"{_THREAD}commit_total", "Commits (one per batch).", thread),
            "commit_rate": gauge(f"{_THREAD}commit_rate", "Commits per second.", thread),
            "commit_latency_avg": gauge(
                f"{_THREAD}commit_latency_avg", "Average commit time, ms.", thread
            ),  # fmt: skip
            "commit_latency_max": gauge(
                f"{_THREAD}commit_latency_max", "Longest commit time, ms.", thread
            ),  # fmt: skip
        }
        self.task = {
            "process_total": gauge(f"{_TASK}process_total", "Records the task processed.", task),
            "process_rate": gauge(f"{_TASK}process_rate", "Records per second.", task),
            "dropped_records_total": gauge(f"{_TASK}dropped_records_total",
                                           "Records dropped (late, malformed and skipped, "
                                           "null keys).", task),  # fmt: skip
            "dropped_records_rate": gauge(f"{_TASK}dropped_records_rate",
                                          "Records dropped per second.", task),  # fmt: skip
            "record_lateness_avg": gauge(f"{_TASK}record_lateness_avg",
                                         "Average lateness behind stream time, ms.", task),
            "record_lateness_max": gauge(f"{_TASK}record_lateness_max",
                                         "Largest lateness behind stream time, ms.", task),
        }  # fmt: skip
        self.node = {
            which: gauge(f"{_NODE}record_e2e_latency_{which}",
                         f"{which.capitalize()} time from a record's timestamp to the end of "
                         "its processing, ms.", node)
            for which in ("avg", "min", "max")
        }  # fmt: skip
        store = [*task, "rocksdb_state_id"]
        self.state = {
            name: gauge(f"{_STATE}{name}", f"RocksDB's {prop} of the store, bytes or keys.", store)
            for name, prop in _ROCKSDB_PROPERTIES.items()
        }
        # Kafka Streams' store operation metrics (DEBUG recording level; store_metrics.py).
        self.store_ops = {
            (operation, which): gauge(
                f"{_STATE}{operation.replace('-', '_')}_{which}",
                f"{operation}: " + {"latency_avg": "average time of a call, ns.",
                                    "latency_max": "longest call, ns.",
                                    "rate": "calls per second."}[which], store)
            for operation in OPERATIONS for which in ("latency_avg", "latency_max", "rate")
        }  # fmt: skip
        self.records_lag = gauge(f"{_FETCH}records_lag", "Records behind the last stable "
                                 "offset.", ["application_id", "topic", "partition"])  # fmt: skip
        self.records_lag_max = gauge(f"{_FETCH}records_lag_max", "Largest lag of a partition.",
                                     ["application_id"])  # fmt: skip
        app = ["application_id"]
        self.batches = counter("streamplatform_batches", "Batches committed, by path.",
                               ["application_id", "path"])  # fmt: skip
        self.phase_ms = gauge("streamplatform_batch_phase_duration_ms", "The last batch's "
                              "phases: plan, run_and_write, commit, total.",
                              ["application_id", "phase"])  # fmt: skip
        self.records_in = counter("streamplatform_records_in", "Records read from the sources.")
        self.records_out = counter("streamplatform_records_out", "Records written to sinks.")
        self.dlq_records = counter("streamplatform_dlq_records", "Records sent to the DLQ.")
        self.duplicates = counter("streamplatform_duplicates_dropped", "Duplicates dropped.")
        self.replays = counter("streamplatform_replayed_batches", "Batches replayed.")
        self.restored = counter("streamplatform_restored_records", "Changelog rows restored.")
        self.committed = gauge("streamplatform_committed_batch_id", "The last committed batch.",
                               app)  # fmt: skip
        self.last_commit = gauge(
            "streamplatform_last_commit_timestamp_seconds",
            "When the last batch committed (a stalled job: it stops moving).", app,
        )  # fmt: skip
        self.claim_epoch = gauge("streamplatform_claim_epoch", "The epoch of this driver's "
                                 "claim on the job.", app)  # fmt: skip
        self.lag = gauge("streamplatform_lag", "Records behind the sources' ends.", app)

    # Feeding ---------------------------------------------------------------------------------

    def record(self, result: Any, claim_epoch: int | None = None) -> None:
        """Take one batch's result (``StreamingJob``'s ``BatchResult``)."""
        with self._lock:
            self._window.append((time.monotonic(), result))
            self._record_totals(result, claim_epoch)
            self.observe_lag(result.partition_lag)
            self._refresh()

    def observe_lag(self, partition_lag: Mapping[tuple[str, int], int]) -> None:
        """Each source partition's lag, also between batches (``run_forever``'s ``on_idle``:
        the planner's last look at the sources)."""
        app = self.application_id
        for (topic, partition), lag in partition_lag.items():
            self.records_lag.labels(app, topic, str(partition)).set(lag)
        self.records_lag_max.labels(app).set(max(partition_lag.values(), default=0))
        self.lag.labels(app).set(sum(partition_lag.values()))

    def refresh(self) -> None:
        """Recompute the rates and averages over the last 30 s as of now: without batches
        they fall to zero (``serve`` calls it every few seconds)."""
        with self._lock:
            self._refresh()

    def _record_totals(self, result: Any, claim_epoch: int | None) -> None:
        app, thread = self.application_id, self.thread_id
        metrics: Mapping[str, int] = result.metrics
        self._process_total += result.records_in + int(metrics.get("repartition_records_in", 0))
        self._commit_total += 1
        self._set(self.thread, "process_total", self._process_total, app, thread)
        self._set(self.thread, "commit_total", self._commit_total, app, thread)
        for task, numbers in result.task_metrics.items():
            totals = self._task_totals.setdefault(task, {"process": 0, "dropped": 0})
            totals["process"] += _processed(numbers)
            totals["dropped"] += _dropped(numbers)
            self._set(self.task, "process_total", totals["process"], app, thread, task)
            self._set(self.task, "dropped_records_total", totals["dropped"], app, thread, task)
            count = int(numbers.get("records_timestamped", 0))
            if count:  # this batch's records: from their timestamps to the batch's end
                node = (app, thread, task, "sources")
                self._set(self.node, "avg", numbers["record_e2e_latency_sum_ms"] / count, *node)
                self._set(self.node, "max", numbers["record_e2e_latency_max_ms"], *node)
                self._set(self.node, "min", numbers.get("record_e2e_latency_min_ms", 0), *node)
        for (task, store), numbers in getattr(result, "store_metrics", {}).items():
            for name, value in numbers.items():
                if name in self.state:
                    self.state[name].labels(app, thread, task, store).set(value)
        self.batches.labels(app, result.path or "unknown").inc()
        phases = {"plan": "plan_ms", "run_and_write": "run_and_write_ms", "commit": "commit_ms"}
        for phase, key in phases.items():
            self.phase_ms.labels(app, phase).set(int(metrics.get(key, 0)))
        self.phase_ms.labels(app, "total").set(result.duration_ms)
        self.records_in.labels(app).inc(result.records_in)
        self.records_out.labels(app).inc(result.records_out)
        self.dlq_records.labels(app).inc(result.dlq_records)
        self.duplicates.labels(app).inc(result.duplicates_dropped)
        self.replays.labels(app).inc(int(result.replayed))
        self.restored.labels(app).inc(result.restored_records)
        self.committed.labels(app).set(result.batch_id)
        self.last_commit.labels(app).set(time.time())
        if claim_epoch is not None:
            self.claim_epoch.labels(app).set(claim_epoch)

    def _refresh(self) -> None:
        app, thread = self.application_id, self.thread_id
        now = time.monotonic()
        while self._window and now - self._window[0][0] > WINDOW_S:
            self._window.popleft()
        span = min(WINDOW_S, max(now - self._started, 1e-3))
        results = [result for _, result in self._window]
        commits = [int(r.metrics.get("commit_ms", 0)) for r in results]
        in_window = sum(r.records_in + int(r.metrics.get("repartition_records_in", 0))
                        for r in results)  # fmt: skip
        self._set(self.thread, "process_rate", in_window / span, app, thread)
        self._set(self.thread, "commit_rate", len(commits) / span, app, thread)
        if commits:  # Kafka Streams' averages without a sample: kept as they were
            self._set(self.thread, "commit_latency_avg", sum(commits) / len(commits), app, thread)
            self._set(self.thread, "commit_latency_max", max(commits), app, thread)
        windowed: dict[str, dict[str, int]] = {task: {} for task in self._task_totals}
        for result in results:
            for task, numbers in result.task_metrics.items():
                sums = windowed.setdefault(task, {})
                for key in ("records_in", "repartition_records_in", "dropped_records", "skipped",
                            "record_lateness_sum_ms", "records_timestamped"):  # fmt: skip
                    sums[key] = sums.get(key, 0) + int(numbers.get(key, 0))
                sums["record_lateness_max"] = max(
                    sums.get("record_lateness_max", 0), int(numbers.get("record_lateness_max", 0))
                )
        self._refresh_store_operations(results, span)
        for task, sums in windowed.items():
            labels = (app, thread, task)
            self._set(self.task, "process_rate", _processed(sums) / span, *labels)
            self._set(self.task, "dropped_records_rate", _dropped(sums) / span, *labels)
            timestamped = sums.get("records_timestamped", 0)
            if timestamped:
                self._set(self.task, "record_lateness_avg",
                          sums["record_lateness_sum_ms"] / timestamped, *labels)  # fmt: skip
                self._set(self.task, "record_lateness_max", sums["record_lateness_max"], *labels)

    def _refresh_store_operations(self, results: list[Any], span: float) -> None:
        """Each store operation's rate, average and longest call over the sample window."""
        app, thread = self.application_id, self.thread_id
        sums: dict[tuple[str, str, str], list[int]] = {}  # (task, store, op) -> calls, ns, max
        for result in results:
            for (task, store), numbers in getattr(result, "store_metrics", {}).items():
                for operation in OPERATIONS:
                    name = operation.replace("-", "_")
                    calls = int(numbers.get(f"{name}_calls", 0))
                    if not calls:
                        continue
                    seen = sums.setdefault((task, store, operation), [0, 0, 0])
                    seen[0] += calls
                    seen[1] += int(numbers[f"{name}_latency_total_ns"])
                    seen[2] = max(seen[2], int(numbers[f"{name}_latency_max_ns"]))
        for (task, store, operation), (calls, total_ns, max_ns) in sums.items():
            labels = (app, thread, task, store)
            self.store_ops[(operation, "rate")].labels(*labels).set(calls / span)
            self.store_ops[(operation, "latency_avg")].labels(*labels).set(total_ns / calls)
            self.store_ops[(operation, "latency_max")].labels(*labels).set(max_ns)
        # An operation seen before but not in the window: no calls now (its average and
        # maximum are kept, as Kafka Streams keeps an average without samples).
        for task, store, operation in self._store_ops_seen - sums.keys():
            self.store_ops[(operation, "rate")].labels(app, thread, task, store).set(0)
        self._store_ops_seen |= sums.keys()

    @staticmethod
    def _set(family: Mapping[str, Gauge], name: str, value: float, *labels: str) -> None:
        family[name].labels(*labels).set(value)

    # Serving ---------------------------------------------------------------------------------

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread (prometheus_client's
        server); returns the server (``.shutdown()`` stops it)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        threading.Thread(target=self._refresh_every, args=(5.0,), daemon=True,
                         name=f"{self.application_id}-metrics").start()  # fmt: skip
        return server

    def _refresh_every(self, seconds: float) -> None:
        while True:
            time.sleep(seconds)
            self.refresh()

    def export_otlp(self, endpoint: str, interval_s: float = 15.0) -> Any:
        """Also push the metrics to an OpenTelemetry collector over OTLP/HTTP (``endpoint``:
        its metrics URL, ``http://collector:4318/v1/metrics``) every ``interval_s``: the same
        names and labels, as gauges. Needs the ``otel`` extra (opentelemetry-sdk and its
        OTLP/HTTP exporter). Returns the MeterProvider (``.shutdown()`` stops it, after a last
        export)."""
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.metrics import CallbackOptions, Observation
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
        except ImportError as error:
            raise ImportError(
                "the OpenTelemetry exporter needs `pip install streamplatform[otel]` "
                "(opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"
            ) from error
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=endpoint), export_interval_millis=interval_s * 1000
        )
        resource = Resource.create({"service.name": "streamplatform",
                                    "application_id": self.application_id})  # fmt: skip
        provider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = provider.get_meter("streamplatform")
        for family in self.registry.collect():
            for suffix in _sample_suffixes(family.type):

                def observe(_: CallbackOptions, name: str = family.name + suffix) -> list:
                    return [Observation(value, labels) for value, labels in self._samples(name)]

                meter.create_observable_gauge(family.name + suffix, callbacks=[observe],
                                              description=family.documentation)  # fmt: skip
        return provider

    def _samples(self, name: str) -> list[tuple[float, dict[str, str]]]:
        return [(sample.value, dict(sample.labels)) for family in self.registry.collect()
                for sample in family.samples if sample.name == name]  # fmt: skip

    def exposition(self) -> bytes:
        """The metrics in Prometheus's text format, as a scrape gets them."""
        return bytes(generate_latest(self.registry))


def _sample_suffixes(kind: str) -> tuple[str, ...]:
    """The sample names a family of ``kind`` has beside its own: a counter's ``_total``."""
    return ("_total",) if kind == "counter" else ("",)


def _processed(numbers: Mapping[str, int]) -> int:
    return int(numbers.get("records_in", 0)) + int(numbers.get("repartition_records_in", 0))


def _dropped(numbers: Mapping[str, int]) -> int:
    """Kafka Streams' dropped-records: records a window or join dropped (late, null key) and
    records the handlers skipped (a deserialization or processing error, log_and_continue)."""
    return int(numbers.get("dropped_records", 0)) + int(numbers.get("skipped", 0))
