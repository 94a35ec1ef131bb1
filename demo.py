"""`make demo`: the whole Dagster story in one process, on embedded defaults.

1. Starts a local Kafka broker (unless ``--bootstrap-servers`` points at one), creates the demo
   topics and produces demo data (transactions with duplicates, out-of-order and poison records;
   FX rates with late corrections).
2. Loads the code location (``definitions.py``) with its resources on that broker, Spark
   ``local[*]`` and Delta, state and placement files under ``.data/demo/``, and runs it
   in-process against a real Dagster instance in ``.data/dagster`` (telemetry off), so that
   `make ui` afterwards shows every run, materialization and check of the story:

   - ``transactions_enrichment`` and its snapshot ``transactions_enrichment_fx_rates_versions``
     first (the FX rates into the versioned store before any transaction), then every asset —
     ``transactions_deduplicated`` (KIP-655 dedup, poison records to the DLQ, KIP-1034),
     ``transactions_enrichment`` (the temporal join, KIP-889) and the snapshot,
     ``standby_placements`` (KIP-708) — with their asset checks, then ``transactions_enriched``
     for each daily partition that has data;
   - one tick of each DLQ replay schedule and its run (the poison records fail again and are
     parked);
   - one late FX-rate correction, the enrichment and its snapshot again (which reports the day
     the correction makes stale), an evaluation of the snapshot's late-version backfill sensor
     and the runs it requests (``enriched_backfill``: the day recomputed by a batch as-of join).
3. Prints a summary table from the materializations' metadata and stops the broker (also on an
   error, Ctrl-C or SIGTERM). Each run starts from fresh job state and a fresh instance, since
   a local broker starts empty.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

import pipelines
from streamplatform import data_dir
from streamplatform.kafka import LocalBroker

DEDUP_APP = "demo-dedup"
ENRICH_APP = "demo-enrich"
DEDUP_ASSET = "transactions_deduplicated"
ENRICH_ASSET = "transactions_enrichment"
SNAPSHOT_ASSET = "transactions_enrichment_fx_rates_versions"
ENRICHED_ASSET = "transactions_enriched"
BACKFILL_SENSOR = f"{SNAPSHOT_ASSET}_late_backfill"
REPLAY_SCHEDULES = (f"{DEDUP_ASSET}_dlq_replay_schedule", f"{ENRICH_ASSET}_dlq_replay_schedule")
HOUR_MS = 3_600_000
# The late correction: USD from 2026-01-01T10:30Z (regular rates change every 3 hours, so it
# is valid until 12:00 at the latest: it makes exactly one day stale), 5% above the rate it
# corrects.
CORRECTION_CURRENCY = "USD"
CORRECTION_VALID_FROM = pipelines.START_MS + 10 * HOUR_MS + 30 * 60_000
CORRECTION_FACTOR = 1.05
# The settings this project gives every Dagster instance it writes (`make demo`, `make ui`, the
# tests): telemetry off, and every pool limited to one run at a time. The code location puts
# each op that runs a streaming job (its asset, its DLQ replay) in the pool of its application
# id (``streamplatform.dagster.job_pool``); ``granularity: run`` makes the daemon's run queue
# hold a second run of the pool as QUEUED until the first one ends, and the UI says which pool
# holds it ("View queue criteria"). With ``op`` a started run counts only once its step holds
# the slot, and ours start Spark first: the second run could start as well and wait inside,
# at its step. Runs executed in-process (this demo) bypass the queue: pools do not hold them.
INSTANCE_CONFIG: dict[str, Any] = {
    "telemetry": {"enabled": False},
    "concurrency": {"pools": {"default_limit": 1, "granularity": "run"}},
}
# Dagster's console logger prints every event at DEBUG; the demo prints its own progress and
# the runs' warnings (the instance keeps every event: `make ui` shows them).
LOG_LEVEL = "WARNING"
STEPS = 6
ASSET_ORDER = (
    DEDUP_ASSET,
    ENRICH_ASSET,
    SNAPSHOT_ASSET,
    ENRICHED_ASSET,
    "standby_placements",
)


def demo_dir() -> Path:
    """The demo's Delta tables, state stores, placement files and broker: ``.data/demo``."""
    return data_dir() / "demo"


def dagster_home() -> Path:
    """The Dagster instance the demo runs against and `make ui` opens: ``.data/dagster``."""
    return data_dir() / "dagster"


def demo_resources(bootstrap_servers: str) -> dict[str, Any]:
    """The code location's resources for the demo: its broker, everything else local."""
    _import_code_location()
    from resources import local_resources

    return local_resources(bootstrap_servers, data_dir=demo_dir())


def demo_mission() -> Any:
    """The code location's configuration for the demo: default topics, the demo's own
    application ids (its tables and pools apart from those of `make ui`'s runs)."""
    _import_code_location()
    from resources import MissionConfig

    return MissionConfig(dedup_application_id=DEDUP_APP, enrichment_application_id=ENRICH_APP)


def code_location(bootstrap_servers: str) -> Any:
    """``definitions.py``'s Definitions on the demo's configuration and resources."""
    _import_code_location()
    import definitions

    return definitions.build_definitions(demo_mission(), demo_resources(bootstrap_servers))


def write_instance_config(home: Path) -> Path:
    """``home/dagster.yaml`` with :data:`INSTANCE_CONFIG`'s settings where the file has none of
    its own: an edited file keeps its edits, an older one (telemetry only) gains the pools."""
    import yaml

    path = home / "dagster.yaml"
    current = yaml.safe_load(path.read_text()) if path.exists() else None
    merged = _with_defaults(current or {}, INSTANCE_CONFIG)
    if merged != current:
        home.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(merged, sort_keys=False))
    return path


def _with_defaults(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(config)
    for key, value in defaults.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _with_defaults(merged[key], value)
        else:
            merged.setdefault(key, value)
    return merged


def code_location_pools() -> set[str]:
    """The pools of the code location as `dagster dev` loads it (``definitions.defs``)."""
    _import_code_location()
    import definitions

    return definitions.pools(definitions.defs)


def init_pools(instance: Any, pools: Iterable[str]) -> None:
    """Give each pool its (default) limit in the instance before any run uses it.

    Dagster's run queue reads the limited pools before it creates the limit of a pool it meets
    for the first time, so in that pass it lets every queued run of the new pool through: two
    runs launched together on a fresh instance would start side by side.
    """
    for pool in sorted(pools):
        instance.event_log_storage.initialize_concurrency_limit_to_default(pool)


def prepare_instance(home: str | Path | None = None) -> Path:
    """The Dagster instance in ``home`` (default :func:`dagster_home`) made ready for `dagster
    dev` (`make ui`): its dagster.yaml written, the code location's pools limited."""
    import dagster as dg

    folder = Path(home) if home is not None else dagster_home()
    write_instance_config(folder)
    with dg.DagsterInstance.from_config(str(folder)) as instance:
        init_pools(instance, code_location_pools())
    return folder


def open_instance(fresh: bool = False) -> Any:
    """The Dagster instance in :func:`dagster_home` (its dagster.yaml completed from
    :data:`INSTANCE_CONFIG`, the code location's pools limited); ``fresh`` wipes its runs,
    events, schedules and pool limits first (dagster.yaml stays)."""
    import dagster as dg

    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if fresh and (users := dagster_processes(home)):
        raise RuntimeError(
            f"Dagster processes {users} use the instance in {home} (`make ui`?): stop them "
            "first, the demo starts that instance afresh."
        )
    if fresh:
        for child in home.iterdir():
            if child != config:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    write_instance_config(home)
    instance = dg.DagsterInstance.from_config(str(home))
    init_pools(instance, code_location_pools())
    return instance


def produce_data(
    count: int,
    bootstrap_servers: str,
    say: Callable[[str], None] = print,
    topics: pipelines.Topics | None = None,
) -> pipelines.DemoData:
    """Only the demo data: the topics, ``count`` transactions and the FX rates (what
    `python demo.py --data-only` sends to the broker of `make ui`). ``topics``: default, those
    of the code location's configuration (``STREAMPLATFORM_TOPIC_PREFIX``)."""
    if topics is None:
        _import_code_location()
        from resources import MissionConfig

        topics = MissionConfig.from_env().topics
    settings = {"bootstrap.servers": bootstrap_servers}
    say(f"Broker at {bootstrap_servers}; creating the demo topics ...")
    pipelines.create_demo_topics(settings, topics)
    say(f"Producing {count} transactions and the FX rates into {topics.transactions} and "
        f"{topics.fx_rates} ...")  # fmt: skip
    data = pipelines.generate(settings, transactions=count, topics=topics)
    say(f"  {data}")
    return data


def dagster_processes(home: Path) -> list[int]:
    """Pids of other processes running Dagster with ``DAGSTER_HOME=home`` (`make ui`)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []  # None: not ours to look at; []: a zombie
        if process.pid == os.getpid() or not any("dagster" in arg for arg in command):
            continue
        with contextlib.suppress(psutil.Error):
            if process.environ().get("DAGSTER_HOME") == str(home):
                found.append(process.pid)
    return sorted(found)


def run(count: int = 2_000, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """Run the demo; returns the numbers it prints (see the module docstring)."""
    say = _Progress()
    for name in ("alembic", "py4j"):  # the instance's migrations, Spark's gateway: chatty at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    for folder in ("delta", "state", "placement"):  # a fresh broker: fresh job state
        shutil.rmtree(demo_dir() / folder, ignore_errors=True)
    numbers: dict[str, Any] = {"dagster_home": dagster_home()}
    broker = None
    with _sigterm_as_interrupt():
        try:
            if bootstrap_servers is None:
                say("Starting a local Kafka broker (KRaft) ...")
                broker = LocalBroker(demo_dir() / "broker")
                bootstrap_servers = broker.start()
                assert broker.state is not None
                numbers["broker"] = asdict(broker.state)
            settings = {"bootstrap.servers": bootstrap_servers}
            numbers["data"] = produce_data(count, bootstrap_servers, say, demo_mission().topics)
            numbers |= _story(settings, say)
        finally:
            if broker is not None:
                say("Stopping the local broker ...")
                broker.stop()
    numbers["elapsed_s"] = say.elapsed()
    print()
    print(summary(numbers))
    return numbers


def _story(settings: Mapping[str, Any], say: Callable[[str], None]) -> dict[str, Any]:
    """Steps 2-6 of the module docstring against the broker of ``settings``."""
    from pyspark import SparkContext

    from streamplatform import spark_session

    say("Starting Spark (local) and loading the code location (definitions.py) ...")
    spark_started = SparkContext._active_spark_context is None
    spark = spark_session(app_name="streamplatform-demo")  # the runs share it (one JVM)
    try:
        defs = code_location(settings["bootstrap.servers"])
        instance = open_instance(fresh=True)
        with instance:
            return _materialize_the_story(defs, instance, spark, settings, say)
    finally:
        if spark_started:
            spark.stop()


def _materialize_the_story(
    defs: Any, instance: Any, spark: Any, settings: Mapping[str, Any], say: Callable[[str], None]
) -> dict[str, Any]:
    import definitions
    from assets import DAILY
    from assets.enriched import Enrichment, stream_days
    from jobs import in_process
    from streamplatform.dagster import snapshot_path

    mission = demo_mission()
    jobs = {job.name: job for job in definitions.mission_jobs(mission)}
    resource = defs.resources["streamplatform"]
    story = _Story(instance, say)
    say(
        f"[1/{STEPS}] {ENRICH_ASSET} and {SNAPSHOT_ASSET}: the FX rates into the versioned "
        "store (KIP-889), before any transaction"
    )
    story.record(
        "rates",
        in_process.materialize(defs, instance, [ENRICH_ASSET, SNAPSHOT_ASSET], log_level=LOG_LEVEL),
    )

    everything = [DEDUP_ASSET, ENRICH_ASSET, SNAPSHOT_ASSET, "standby_placements"]
    say(f"[2/{STEPS}] materializing every asset with its checks: {', '.join(everything)}")
    story.record("load", in_process.materialize(defs, instance, everything, log_level=LOG_LEVEL))

    enrichment = Enrichment(jobs[ENRICH_ASSET], mission.topics, resource)
    days = [day for day in stream_days(spark, enrichment) if DAILY.has_partition_key(day)]
    say(f"[3/{STEPS}] {ENRICHED_ASSET}, one run per daily partition with data: {', '.join(days)}")
    for day in days:
        story.record(
            "load",
            in_process.materialize(
                defs, instance, [ENRICHED_ASSET], partition_key=day, log_level=LOG_LEVEL
            ),
        )

    say(f"[4/{STEPS}] a tick of each DLQ replay schedule, and its run ...")
    replayed: dict[str, dict[str, Any]] = {}
    for schedule in REPLAY_SCHEDULES:
        [replay_request] = in_process.tick(defs, instance, schedule).run_requests
        replay = in_process.execute_run_request(
            defs, instance, schedule, replay_request, log_level=LOG_LEVEL
        )
        if replay is None or not replay.success:
            raise RuntimeError(f"the {schedule} run failed; `make ui` shows its logs")
        story.record("dlq replay", replay)
        replayed[schedule] = _replay_report(replay)
        say(f"  {replay.job_def.name}: {replayed[schedule]}")

    table = snapshot_path(resource.delta_root_path(), jobs[ENRICH_ASSET], "fx-rates")
    snapshot = spark.read.format("delta").load(table)
    at = CORRECTION_VALID_FROM
    [current] = snapshot.where(
        f"key = '{CORRECTION_CURRENCY}' AND valid_from <= {at} AND "
        f"(valid_to IS NULL OR valid_to > {at})"
    ).collect()
    old_rate = json.loads(current.value)["rate"]
    new_rate = round(old_rate * CORRECTION_FACTOR, 5)
    day = _day(at)
    say(
        f"[5/{STEPS}] a late correction: {CORRECTION_CURRENCY} {old_rate} -> {new_rate} from "
        f"{_time(at)}, produced after the join passed it; {ENRICH_ASSET} and {SNAPSHOT_ASSET} "
        "again"
    )
    pipelines.produce_correction(settings, CORRECTION_CURRENCY, new_rate, at, mission.topics)
    story.record(
        "correction",
        in_process.materialize(defs, instance, [ENRICH_ASSET, SNAPSHOT_ASSET], log_level=LOG_LEVEL),
    )

    say(f"[6/{STEPS}] the {BACKFILL_SENSOR} sensor, and the runs it requests ...")
    tick = in_process.tick(defs, instance, BACKFILL_SENSOR)
    requests = list(tick.run_requests or [])
    say(f"  requested {[r.partition_key for r in requests]} {tick.skip_message or ''}".rstrip())
    backfills: dict[str, dict[str, Any]] = {}
    for request in requests:
        result = in_process.execute_run_request(
            defs, instance, BACKFILL_SENSOR, request, log_level=LOG_LEVEL
        )
        if result is None:
            continue
        story.record("backfill", result)
        backfills[str(request.partition_key)] = {
            "run_id": result.run_id,
            "success": result.success,
            "job": result.job_def.name,
            "metadata": (
                in_process.materialization_metadata(result, ENRICHED_ASSET)
                if result.success
                else {}
            ),
        }
        say(
            f"  {result.job_def.name} {request.partition_key}: "
            f"{'SUCCESS' if result.success else 'FAILURE'} (run {result.run_id[:8]})"
        )
    return {
        "materializations": story.materializations,
        "checks": story.checks,
        "runs": story.runs,
        "enriched_days": days,
        "dlq_replay": replayed,
        "correction": {
            "currency": CORRECTION_CURRENCY,
            "valid_from": at,
            "day": day,
            "old_rate": old_rate,
            "new_rate": new_rate,
        },
        "sensor": {
            "requested": [r.partition_key for r in requests],
            "run_keys": [r.run_key for r in requests],
            "cursor": tick.cursor,
            "skip_message": tick.skip_message,
        },
        "backfills": backfills,
    }


def _replay_report(result: Any) -> dict[str, Any]:
    """A DLQ replay run's counts (its observation of the job's asset): candidates,
    republished, parked, exhausted."""
    prefix = "dlq_replay_"
    for event in result.all_events:
        if event.event_type_value == "ASSET_OBSERVATION":
            metadata = event.event_specific_data.asset_observation.metadata
            return {
                name[len(prefix) :]: value.value
                for name, value in metadata.items()
                if name[len(prefix) :] in ("candidates", "republished", "parked", "exhausted")
            }
    raise LookupError(f"DLQ replay run {result.run_id} observed nothing")


class _Story:
    """The runs of the story and what they reported, in order."""

    def __init__(self, instance: Any, say: Callable[[str], None]) -> None:
        self.instance = instance
        self.say = say
        self.materializations: list[dict[str, Any]] = []
        self.checks: dict[str, dict[str, Any]] = {}
        self.runs: list[dict[str, Any]] = []

    def record(self, step: str, result: Any) -> None:
        run = self.instance.get_run_by_id(result.run_id)
        self.runs.append(
            {
                "step": step,
                "run_id": result.run_id,
                "job": result.job_def.name,
                "success": result.success,
                "status": run.status.value,
                "tags": dict(run.tags),
            }
        )
        for event in result.get_asset_materialization_events():
            asset, partition = event.asset_key.to_user_string(), event.partition
            metadata = {name: value.value for name, value in event.materialization.metadata.items()}
            self.materializations.append(
                {"step": step, "asset": asset, "partition": partition, "run_id": result.run_id,
                 "metadata": metadata}
            )  # fmt: skip
            if not asset.startswith("kafka/"):  # a topic a job writes: the job's line says it
                self.say(f"  {_describe(asset, partition, metadata)}")
        for check in result.get_asset_check_evaluations():
            asset = check.asset_key.to_user_string()
            self.checks[f"{asset}.{check.check_name}"] = {
                "asset": asset,
                "check": check.check_name,
                "passed": check.passed,
                "severity": check.severity.value,
                "run_id": result.run_id,
            }


def _describe(asset: str, partition: str | None, m: Mapping[str, Any]) -> str:
    """One line of progress for a materialization."""
    name = f"{asset}[{partition}]" if partition else asset
    if "rows_in" in m:
        return (
            f"{name}: {m['rows_in']} in, {m['rows_out']} out, {m['duplicates_dropped']} "
            f"duplicates, {m['dlq_records']} to the DLQ, {_plural(m['batches'], 'batch')}, lag "
            f"{m['lag']}" + (f", late days {m['late_days']}" if m.get("late_days") else "")
        )
    if "computed_by" in m:
        return f"{name}: {m['rows']} rows ({m['computed_by']}), EUR {m['amount_eur_total']:,.2f}"
    if "versions" in m:
        return (
            f"{name}: {m['versions']} versions of {m['keys']} keys, "
            f"{m.get('late_versions', 0)} late" + (f", stale days {m['late_days']}"
                                                   if m.get("late_days") else "")
        )  # fmt: skip
    return f"{name}: generation {m.get('generation')}, {m.get('tasks')} tasks"


def summary(numbers: Mapping[str, Any]) -> str:
    """The table and lines the demo prints at the end."""
    lines = []
    columns = ("asset", "runs", "rows in", "rows out", "duplicates", "DLQ", "lag", "table v")
    widths = (42, 4, 8, 8, 10, 5, 5, 7)
    row = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    lines.append(row.format(*columns) + "  notes")
    groups: dict[str, list[dict[str, Any]]] = {}
    order = {name: index for index, name in enumerate(ASSET_ORDER)}
    events = sorted(
        numbers.get("materializations", []),
        key=lambda e: (order.get(e["asset"], len(order)), e["partition"] or ""),
    )
    for event in events:
        if event["asset"].startswith("kafka/"):  # a topic a job writes: the job's row says it
            continue
        name = event["asset"] + (f"[{event['partition']}]" if event["partition"] else "")
        groups.setdefault(name, []).append(event)
    for name, group in groups.items():
        cells, note = _row(group)
        lines.append(row.format(name, len(group), *cells) + f"  {note}")
    for index, (schedule, replay) in enumerate(numbers.get("dlq_replay", {}).items()):
        lines.append(
            ("" if index else "\n") + f"DLQ replay ({schedule}, one run): "
            f"{_plural(replay['candidates'], 'DLQ record')}, "
            f"{replay['republished']} re-published, {replay['parked']} parked"
        )
    correction = numbers.get("correction")
    if correction is not None:
        lines.append(
            f"Late correction: {correction['currency']} {correction['old_rate']} -> "
            f"{correction['new_rate']} valid from {_time(correction['valid_from'])}"
        )
        sensor = numbers["sensor"]
        lines.append(
            f"{BACKFILL_SENSOR} sensor requested: {sensor['requested'] or 'nothing'}"
            f" (run keys {sensor['run_keys']})"
        )
        for day, backfill in numbers.get("backfills", {}).items():
            m = backfill["metadata"]
            state = "SUCCESS" if backfill["success"] else "FAILURE"
            lines.append(
                f"  {backfill['job']} {day}: {state} (run {backfill['run_id'][:8]})"
                + (f", {m['rows']} rows by {m['computed_by']}" if m else "")
            )
    checks = numbers.get("checks", {})
    if checks:
        lines.append(f"\n{'asset check':<30} {'asset':<26} result")
        for _, check in sorted(checks.items()):
            verdict = "passed" if check["passed"] else f"FAILED ({check['severity']})"
            lines.append(f"{check['check']:<30} {check['asset']:<26} {verdict}")
    if "dagster_home" in numbers:
        lines.append(f"\nDagster instance: {numbers['dagster_home']} (`make ui` shows the runs)")
        lines.append(f"Delta tables, state stores, placement files: {demo_dir()}")
    if "elapsed_s" in numbers:
        lines.append(f"Took {numbers['elapsed_s']:.1f} s")
    return "\n".join(lines)


def _row(events: list[dict[str, Any]]) -> tuple[list[Any], str]:
    """The numeric cells and a note for one asset (or partition) over its materializations."""
    last = events[-1]["metadata"]

    def total(name: str) -> Any:
        return sum(int(e["metadata"].get(name, 0)) for e in events)

    if "rows_in" in last:  # a streaming asset: sums over the story, the last one's lag
        cells = [
            total("rows_in"),
            total("rows_out"),
            total("duplicates_dropped"),
            total("dlq_records"),
            last["lag"],
            "-",
        ]
        note = f"{_plural(total('batches'), 'batch')}, committed up to batch " \
            f"{last['committed_batch_id']}"  # fmt: skip
        return cells, note
    if "versions" in last:  # a versioned snapshot
        late = total("late_versions")
        note = f"{last['versions']} rate versions of {last['keys']} currencies, {late} late"
        return ["-", "-", "-", "-", "-", last["table_version"]], note
    if "computed_by" in last:
        first = events[0]["metadata"]
        note = f"{last['computed_by']}, EUR {last['amount_eur_total']:,.2f}"
        if len(events) > 1:
            note = f"{first['computed_by']} -> {note} (was {first['amount_eur_total']:,.2f})"
        return ["-", last["rows"], "-", "-", "-", last["table_version"]], note
    note = (
        f"generation {last.get('generation')}: {last.get('tasks')} tasks, "
        f"{last.get('standbys')} standbys"
    )
    return ["-", "-", "-", "-", "-", last.get("placements_version", "-")], note


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith("ch") else "s")


def _day(timestamp_ms: int) -> str:
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).strftime("%Y-%m-%d")


def _time(timestamp_ms: int) -> str:
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%MZ")


def _import_code_location() -> None:
    """Make ``definitions.py`` and its packages (assets/, jobs/, resources/) importable: they
    live next to this file (imported as a module, the root need not be on ``sys.path``)."""
    root = str(Path(__file__).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)


class _Progress:
    """Prints a progress line with the seconds since the demo started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {message}", flush=True)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the demo like Ctrl-C, so that the broker is stopped on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """``python demo.py [--records N] [--bootstrap-servers HOST:PORT] [--data-only]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="demo.py",
        description="The whole Dagster story in-process: Kafka -> Spark -> Delta, DLQ replay, "
        "a sensor-triggered backfill.",
    )
    parser.add_argument("--records", type=int, default=2_000, help="transactions to produce")
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a local one")
    parser.add_argument(
        "--data-only",
        action="store_true",
        help="only create the topics and produce the demo data (into --bootstrap-servers, or "
        "else the broker the code location uses: KAFKA_BOOTSTRAP_SERVERS or the running local "
        "broker, e.g. the one of `make ui`)",
    )
    args = parser.parse_args(argv)
    if args.data_only:
        servers = args.bootstrap_servers or _running_broker()
        produce_data(args.records, servers)
    else:
        run(count=args.records, bootstrap_servers=args.bootstrap_servers)
    return 0


def _running_broker() -> str:
    """The broker the code location's resource uses, as `make ui` does: KAFKA_BOOTSTRAP_SERVERS,
    else the running local broker of `streamplatform broker start`."""
    _import_code_location()
    from resources import streamplatform_from_env

    try:
        return str(streamplatform_from_env().kafka_settings()["bootstrap.servers"])
    except ConnectionError:
        raise SystemExit(
            "No broker: pass --bootstrap-servers or start one with `streamplatform broker start`."
        ) from None


if __name__ == "__main__":
    sys.exit(main())
