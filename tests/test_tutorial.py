"""docs/tutorial.md runs as written.

- Its ```python blocks, but those of the YAML project, are executed in order, in one namespace
  (no broker, no Spark: the topology, its test, the Dagster definitions).
- The YAML project of section 4 ("In YAML, from a fresh folder"): each block whose first line
  is ``# <path>`` is a file of it. They are written into an empty folder, nothing else, and the
  section's commands run there as a shell runs them (``dagster dev`` aside: it serves until
  stopped). ``dagster definitions validate`` loads the definitions in a child process as
  ``dagster dev`` does; the instance of the project's ``dagster.yaml``, with those definitions,
  holds a second launch of the job in the run queue until the first has ended.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)

TUTORIAL = (Path(__file__).parents[1] / "docs" / "tutorial.md").read_text()
YAML_SECTION = "### In YAML, from a fresh folder"
FILE_LINE = re.compile(r"# ([\w.-]+(?:/[\w.-]+)*\.(?:py|toml|yaml))\n")
BLOCK = re.compile(r"```(\w+)\n(.*?)```", flags=re.DOTALL)


def yaml_section() -> str:
    start = TUTORIAL.index(YAML_SECTION)
    end = re.search(r"\n##+ ", TUTORIAL[start + len(YAML_SECTION) :])
    return TUTORIAL[start : start + len(YAML_SECTION) + (end.start() if end else len(TUTORIAL))]


def project_files() -> dict[str, str]:
    """``{path: content}`` of every block that names its file on its first line."""
    files = {}
    for _, block in BLOCK.findall(TUTORIAL):
        named = FILE_LINE.match(block)
        if named:
            files[named.group(1)] = block
    return files


def test_tutorial_python_blocks_run():
    outside = TUTORIAL.replace(yaml_section(), "")
    blocks = [block for language, block in BLOCK.findall(outside) if language == "python"]
    assert len(blocks) == 9, (
        "topology, test, Avro, aggregations, cogroup, enrichment, definitions, backfills, "
        "continuous jobs"
    )
    namespace: dict = {}
    for block in blocks:
        # dont_inherit: the blocks run as a user's module would, without this file's
        # `from __future__ import annotations` (Dagster reads real annotations).
        exec(compile(block, "docs/tutorial.md", "exec", dont_inherit=True), namespace)
    assert namespace["defs"].resolve_job_def("orders_dlq_replay") is not None


@pytest.mark.slow  # a child process: `dagster definitions validate` (~10-20 s)
def test_the_yaml_project_loads_from_an_empty_folder_and_queues_a_second_launch(
    tmp_path, monkeypatch
):
    files = project_files()
    assert set(files) == {
        "dg.toml", "dagster_home/dagster.yaml", "my_project/topologies.py",
        "my_project/defs/orders/defs.yaml", "my_project/definitions.py",
    }  # fmt: skip
    for path, content in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content)
    [commands] = [block for language, block in BLOCK.findall(yaml_section()) if language == "bash"]
    lines = commands.strip().splitlines()
    assert lines[-1].startswith("dagster dev -m my_project.definitions"), lines
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PYTHONPATH")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    shell = subprocess.run(
        ["bash", "-euc", "\n".join(lines[:-1])], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    output = shell.stdout + shell.stderr
    assert shell.returncode == 0, output[-4000:]
    assert "does not match the name" not in output  # dg.toml names the code location as -m does
    assert "Validation successful" in output, output[-4000:]

    # The same definitions in this process, on the instance of the project's dagster.yaml.
    # A started run counts for a pool counted per op only for this many seconds before its
    # step claims the slot, and ours start Spark first: 0, as if that had taken long.
    monkeypatch.setenv("DAGSTER_OP_CONCURRENCY_KEYS_ALLOTTED_FOR_STARTED_RUN_SECONDS", "0")
    sys.path.insert(0, str(tmp_path))
    try:
        defs = importlib.import_module("my_project.definitions").defs
        with dg.DagsterInstance.from_config(str(tmp_path / "dagster_home")) as instance:
            assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
            first, second = (queued(instance, defs, dg.AssetKey("orders")) for _ in range(2))
            assert first.run_op_concurrency.all_pools == {"streamplatform/orders"}

            def dequeued() -> list[str]:
                daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
                config = instance.get_concurrency_config()
                return [run.run_id for run in daemon._get_runs_to_dequeue(instance, config, None)]

            assert dequeued() == [first.run_id]  # the second launch waits in the queue
            report(instance, first, DagsterEventType.PIPELINE_START)
            assert dequeued() == []
            report(instance, first, DagsterEventType.PIPELINE_SUCCESS)
            assert dequeued() == [second.run_id]
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "my_project" or m.startswith("my_project.")]:
            del sys.modules[name]


def queued(instance: dg.DagsterInstance, defs: dg.Definitions, asset: dg.AssetKey) -> dg.DagsterRun:
    """A QUEUED run of ``asset``, as a launch from the UI leaves it."""
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={asset})
    origin = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("my_project"), "__repository__")
    return instance.create_run_for_job(
        job_def=job, status=dg.DagsterRunStatus.QUEUED, asset_selection=frozenset({asset}),
        remote_job_origin=RemoteJobOrigin(origin, job.name),
    )  # fmt: skip


def report(instance: dg.DagsterInstance, run: dg.DagsterRun, event: DagsterEventType) -> None:
    """What the run worker reports when the run starts or ends."""
    instance.report_dagster_event(
        DagsterEvent(event_type_value=event.value, job_name=run.job_name), run_id=run.run_id
    )
