"""The job fingerprint that guards replays: what changes it and what does not (pure logic)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from streamplatform import StreamsBuilder
from streamplatform.runtime.fingerprint import job_fingerprint
from streamplatform.serdes import Serdes

SETTINGS = {"application.id": "app", "processing.guarantee": "exactly_once_v2"}


def id_of(value):
    return value["id"]


def other_id_of(value):
    return value.get("id")


helper = id_of


def topology(select=lambda k, v: v["id"]):
    b = StreamsBuilder()
    b.stream("in", Serdes.string(), Serdes.json()).deduplicate_by_key_value(select, 60_000).to(
        "out"
    )
    return b.build()


def through_helper():
    return topology(lambda k, v: helper(v))


def test_the_same_job_has_the_same_fingerprint_in_another_process():
    tests = str(Path(__file__).parents[1])
    script = (
        f"import sys; sys.path.insert(0, {tests!r}); from runtime.test_fingerprint import *; "
        "print(job_fingerprint(topology(), SETTINGS))"
    )
    other = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert other.stdout.strip() == job_fingerprint(topology(), SETTINGS)


def test_changed_code_changes_it():
    base = job_fingerprint(topology(), SETTINGS)
    assert job_fingerprint(topology(lambda k, v: v["n"]), SETTINGS) != base
    global helper
    before = job_fingerprint(through_helper(), SETTINGS)
    helper = other_id_of  # the fix went into a function the lambda calls
    try:
        assert job_fingerprint(through_helper(), SETTINGS) != before
    finally:
        helper = id_of


def test_output_settings_change_it_and_where_it_runs_does_not():
    base = job_fingerprint(topology(), SETTINGS)
    changed = SETTINGS | {"default.deserialization.exception.handler": "log_and_continue"}
    assert job_fingerprint(topology(), changed) != base
    moved = SETTINGS | {"bootstrap.servers": "elsewhere:9092", "platform.max.records.per.batch": 7}
    assert job_fingerprint(topology(), moved) == base


def test_which_sinks_are_delta_tables_changes_it():
    """A batch planned with its sink in Kafka is not replayed into a Delta table, or back."""
    base = job_fingerprint(topology(), SETTINGS)
    assert job_fingerprint(topology(), SETTINGS, ["out"]) != base
    assert job_fingerprint(topology(), SETTINGS, []) == base
