"""A model of micro-batch plans that runs the runtime's own task code without Spark or Kafka.

Topics are lists in memory. Records *arrive* one at a time (live traffic); a batch is planned
the way the driver plans one (planning.py: each partition from its consumed offset, up to what
has arrived, capped) and run sub-topology after sub-topology through ``TaskBatchRunner.run`` —
the grouped path's entry, the same code Spark's ``applyInArrow`` calls — with repartitioned
records numbered and handed on as paths/stages.py does, the upstream tasks' bounds passed down,
and the tasks' stores prepared and settled batch after batch. What the batches write to the
sink topic is what the job would write; the reference is the test driver fed the same records
in the order they arrived.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamplatform import TopologyTestDriver
from streamplatform.runtime.batch_outputs import Progress
from streamplatform.runtime.executor import TaskBatchRunner
from streamplatform.runtime.job_context import BatchPlan
from streamplatform.runtime.repartition_buffer import (
    UPSTREAM_BITS,
    repartition_offset_base,
    written_bounds,
)
from streamplatform.runtime.rows import encode_headers
from streamplatform.serdes import Serdes

APP = "model"


@dataclass(frozen=True)
class Arrival:
    topic: str
    partition: int
    key: str
    value: Any
    timestamp: int


@dataclass
class BatchModel:
    topology: Any
    partitions: dict[str, int]  # source topics' partition counts
    state_dir: Path
    settings: dict[str, Any] = field(default_factory=dict)
    log: dict[tuple[str, int], list[tuple]] = field(default_factory=dict)  # arrived records
    consumed: dict[tuple[str, int], int] = field(default_factory=dict)
    output: list[tuple[str, bytes, bytes, int]] = field(default_factory=list)
    batch_id: int = 0
    buffered: int = 0  # repartitioned records the last batch left in buffers

    def arrive(self, record: Arrival) -> None:
        key_serde, value_serde = Serdes.string(), Serdes.json()
        queue = self.log.setdefault((record.topic, record.partition), [])
        queue.append((record.topic, record.partition, len(queue), record.timestamp,
                      key_serde.serialize(record.key), value_serde.serialize(record.value),
                      []))  # fmt: skip

    def run_batch(self, cap: int) -> bool:
        """Plan and run one batch under ``cap``; False when it had nothing to do."""
        ranges = {}
        for topic, count in self.partitions.items():
            for partition in range(count):
                arrived = len(self.log.get((topic, partition), []))
                start = self.consumed.get((topic, partition), 0)
                ranges[(topic, partition)] = (start, min(arrived, start + cap))
        if not any(end > start for start, end in ranges.values()) and not self.buffered:
            return False
        config = {"application.id": APP, "bootstrap.servers": "127.0.0.1:9",
                  "state.dir": str(self.state_dir),
                  "platform.max.records.per.batch": cap} | self.settings  # fmt: skip
        plan = BatchPlan(self.batch_id, ranges, self.batch_id - 1 if self.batch_id else None,
                         0, False, False, None, self.buffered)  # fmt: skip
        internal = set(self.topology.repartition_topics(APP))
        widths = dict(self.partitions) | {t: max(self.partitions.values()) for t in internal}
        repartitioned: list[tuple] = []
        bounds: dict[str, dict[int, int]] = {}
        progress_rows = []
        for subtopology in self.topology.subtopologies:
            topics = subtopology.source_topics(self.topology, APP)
            runner = TaskBatchRunner(
                self.topology, config, self.batch_id, plan.last_committed, {}, widths,
                state_dirs={}, subtopology=subtopology.id, internal_topics=internal,
                task_cap=cap, capped=plan.capped(cap), repartition_bounds=bounds,
                wall_clock_ms=0,
            )  # fmt: skip
            rows_by_task: dict[int, list[tuple]] = {}
            for (topic, partition), (start, end) in ranges.items():
                if topic in topics:
                    for record in self.log.get((topic, partition), [])[start:end]:
                        rows_by_task.setdefault(partition, []).append(record)
            for record in repartitioned:
                if record[0] in topics:
                    rows_by_task.setdefault(record[1], []).append(record)
            if internal.intersection(topics) and (self.buffered or any(bounds.values())):
                width = max(widths[t] for t in topics)
                for partition in range(width):
                    rows_by_task.setdefault(partition, []).append(None)  # wakes the task
            outputs = [runner.run(_table(p, rows)) for p, rows in sorted(rows_by_task.items())]
            # A later stage may read what any stage before it wrote: kept for every stage.
            base = repartition_offset_base(self.batch_id)
            for table in outputs:
                progress = table.filter(pc.equal(table["kind"], "progress"))
                progress_rows += list(zip(progress["task"].to_pylist(),
                                          progress["value"].to_pylist(), strict=True))  # fmt: skip
                numbered: dict[tuple[str, int], int] = {}
                for row in table.filter(pc.equal(table["kind"], "sink")).to_pylist():
                    if row["topic"] in internal:
                        upstream = int(row["task"].split("_")[1])
                        n = numbered.get((row["topic"], row["partition"]), 0)
                        numbered[(row["topic"], row["partition"])] = n + 1
                        offset = base + (upstream << UPSTREAM_BITS) + n
                        repartitioned.append((row["topic"], row["partition"], offset,
                                              row["timestamp"], row["key"], row["value"],
                                              row["headers"]))  # fmt: skip
                    else:
                        self.output.append((row["topic"], row["key"], row["value"],
                                            row["timestamp"]))  # fmt: skip
            stage = Progress.of(progress_rows[-len(outputs) :] if outputs else [])
            bounds |= written_bounds(self.topology, subtopology, APP, stage.bounds)
        progress = Progress.of(progress_rows)
        for tp, (_, end) in ranges.items():
            self.consumed[tp] = progress.consumed.get(tp, end)
        self.buffered = progress.metrics.get("repartition_buffered", 0)
        self.batch_id += 1
        return True


def _table(partition: int, records: Iterable[tuple | None]) -> pa.Table:
    """A task's rows in INPUT_COLUMNS; None: a row that only wakes the task."""
    rows = list(records)

    def column(index: int) -> list:
        return [None if r is None else r[index] for r in rows]

    headers = [None if r is None else encode_headers([(h[0], h[1]) for h in r[6]]) for r in rows]
    return pa.table({
        "task_partition": pa.array([partition] * len(rows), pa.int32()),
        "topic": pa.array(column(0), pa.string()),
        "partition": pa.array(column(1), pa.int32()),
        "offset": pa.array(column(2), pa.int64()),
        "timestamp": pa.array(column(3), pa.int64()),
        "key": pa.array(column(4), pa.binary()),
        "value": pa.array(column(5), pa.binary()),
        "headers": pa.array(headers, pa.string()),
    })  # fmt: skip


def through_the_test_driver(topology: Any, arrivals: list[Arrival], sink: str, partitions: int):
    """The sink's records, the test driver fed ``arrivals`` in order: (key, value, ts)."""
    config = {"application.id": APP}
    with TopologyTestDriver(topology, config, repartition_partitions=partitions) as driver:
        inputs: dict[str, Any] = {}
        for record in arrivals:
            if record.topic not in inputs:
                inputs[record.topic] = driver.create_input_topic(
                    record.topic, Serdes.string(), Serdes.json()
                )
            inputs[record.topic].pipe_input(record.key, record.value,
                                            timestamp=record.timestamp,
                                            partition=record.partition)  # fmt: skip
        out = driver.create_output_topic(sink, Serdes.bytes(), Serdes.bytes())
        return [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]


def model_output(model: BatchModel, sink: str) -> list[tuple[bytes, bytes, int]]:
    return [(key, value, ts) for topic, key, value, ts in model.output if topic == sink]


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()
