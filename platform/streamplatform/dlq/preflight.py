"""Does a DLQ record still fail? Run it through the *current* topology's task code, in-process.

The replay re-publishes a DLQ record to its source topic only when the current topology
processes it without an error; a record that fails again is parked instead of going round the
DLQ once more. The check runs the same ``Task`` the Spark executors and the TopologyTestDriver
run, on a fresh, empty state in a temporary directory, one task per source partition, records
in source offset order. Its outputs are thrown away: the running job produces the real ones when
it reads the re-published record, with its real state (dedup stores, join tables).

A record passes when processing it raised nothing, sent nothing to the DLQ and no handler
answered ``resume`` for it. Failures that depend on state the empty task lacks are not seen here;
such a record fails again in the job, comes back to the DLQ carrying its replay headers, and
the replay parks it once it has had ``max_attempts`` attempts.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamplatform.config import StreamsConfig
from streamplatform.dlq.records import DlqRecord, ErrorInfo
from streamplatform.dsl.topology import Topology
from streamplatform.errors.exceptions import TaskFailedError
from streamplatform.records import ConsumedRecord
from streamplatform.runtime.task import Task

# When the job has no DLQ topic, the preflight still needs the built-in handlers' DLQ records
# to learn what failed; they go to this name and are never written anywhere.
_PREFLIGHT_DLQ = "__streamplatform-preflight-dlq"
_DLQ_SETTING = "errors.dead.letter.queue.topic.name"


@dataclass(frozen=True)
class Verdict:
    """What the current topology made of one DLQ record."""

    record: DlqRecord
    passes: bool
    outputs: int = 0  # records it produced (discarded; the job will produce them)
    exception: str | None = None
    message: str | None = None


def preflight(
    topology: Topology, settings: Mapping[str, Any], records: Iterable[DlqRecord]
) -> list[Verdict]:
    """One verdict per record, in the order of ``records``; see the module docstring."""
    ordered = list(records)
    with tempfile.TemporaryDirectory(prefix="sp-dlq-preflight-") as state_dir:
        config = StreamsConfig(
            dict(settings)
            | {"state.dir": state_dir, _DLQ_SETTING: settings.get(_DLQ_SETTING) or _PREFLIGHT_DLQ}
        )
        runner = _Runner(topology, config, Path(state_dir))
        try:
            by_source = sorted(range(len(ordered)), key=lambda i: ordered[i].source)
            verdicts = {i: runner.check(ordered[i]) for i in by_source}
        finally:
            runner.close()
    return [verdicts[i] for i in range(len(ordered))]


class _Runner:
    """Tasks opened on demand, one per (sub-topology, partition); a failed task is replaced."""

    def __init__(self, topology: Topology, config: StreamsConfig, state_dir: Path) -> None:
        self.topology, self.config, self.state_dir = topology, config, state_dir
        self.app: str = config["application.id"]
        self.dlq_topic: str = config[_DLQ_SETTING]
        self.tasks: dict[tuple[int, int], Task] = {}
        self.repartition_topics = set(topology.repartition_topics(self.app))

    def check(self, record: DlqRecord) -> Verdict:
        source = record.source
        subtopology = self.topology.subtopology_of_topic(source.topic, self.app)
        if subtopology is None:
            message = f"the current topology does not read {source.topic!r}"
            return Verdict(record, False, exception="TopicNotRead", message=message)
        if source.topic in self.repartition_topics:
            # On Spark a repartition topic exists only inside a micro-batch: there is no topic
            # to re-publish to, so the record is parked (kept, with this reason), not lost.
            message = (
                f"{source.topic!r} is a repartition topic, which the Spark runtime keeps inside "
                "each micro-batch: re-send the record's original to its source topic"
            )
            return Verdict(record, False, exception="RepartitionedRecord", message=message)
        key = (subtopology.id, source.partition)
        task = self.tasks.get(key)
        if task is None:
            task = Task(self.topology, subtopology, source.partition, self.config,
                        self.state_dir, lambda topic: 1)  # fmt: skip
            self.tasks[key] = task
        consumed = ConsumedRecord(source.topic, source.partition, source.offset, record.timestamp,
                                  record.key, record.value, record.original_headers)  # fmt: skip
        skipped = task.skipped
        try:
            task.process(consumed)
            task.commit()
        except TaskFailedError as error:
            failed = [r for r in task.take_output() if r.topic == self.dlq_topic]
            task.close()
            del self.tasks[key]
            if failed:
                info = ErrorInfo.from_headers(failed[0].headers)
                return Verdict(record, False, exception=info.exception, message=info.message)
            cause = error.__cause__ or error
            return Verdict(record, False, exception=type(cause).__name__, message=str(cause))
        task.take_output_sources()
        task.take_versions()
        output = task.take_output()
        failed = [r for r in output if r.topic == self.dlq_topic]
        if failed:
            info = ErrorInfo.from_headers(failed[0].headers)
            return Verdict(record, False, exception=info.exception, message=info.message)
        if task.skipped > skipped:
            message = "an exception handler answered resume (no DLQ record)"
            return Verdict(record, False, exception="Skipped", message=message)
        return Verdict(record, True, outputs=len(output))

    def close(self) -> None:
        for task in self.tasks.values():
            task.close()
        self.tasks.clear()
