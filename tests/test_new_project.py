"""`streamplatform new` in an empty folder, then its README's commands as written: the project's
test passes, a local broker started from that folder takes the clicks, `streamplatform run`
deduplicates them into a Delta table of the project's, and the project's data stays in its own
`.data/` (nothing new in the platform's install: its `.data/`, nor beside it). Its Dagster
definitions load."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamplatform.home import _CHECKOUT

PROJECT_FILES = {
    "pyproject.toml", "clickstream_team/__init__.py", "clickstream_team/topology.py",
    "tests/test_topology.py", "definitions.py", "README.md", ".gitignore",
}  # fmt: skip


def platform_files() -> set[str]:
    """What is in the platform's install where a command could write: its data folder (a run
    from inside the checkout uses the checkout's `.data/`, streamplatform/home.py: Delta tables,
    the broker, state, Spark's warehouse) and the checkout's own folder (a stray
    `spark-warehouse/`, `derby.log` or `.data/` of a command run in the wrong place). The test
    fixtures' run folders (`.data/test-*/`) are left out: other test runs may be writing there
    at the same time."""
    found = {entry.name for entry in _CHECKOUT.iterdir()}
    data = _CHECKOUT / ".data"
    for path in data.rglob("*") if data.is_dir() else ():
        relative = path.relative_to(data)
        if not relative.parts[0].startswith("test-"):
            found.add(f".data/{relative.as_posix()}")
    return found


@pytest.mark.slow  # ~40 s: a broker of its own and a child driver
@pytest.mark.child_process  # the README's `streamplatform run`
def test_a_new_project_works_as_its_readme_says(tmp_path, monkeypatch):
    project = tmp_path / "clickstream-team"
    env = {k: v for k, v in os.environ.items()
           if k not in ("STREAMPLATFORM_DATA", "STREAMPLATFORM_HOME", "PYTHONPATH", "CI")}  # fmt: skip
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    before = platform_files()

    # The command a team runs, as the README of the platform says it.
    new = ["streamplatform", "new", str(project)]
    made = subprocess.run(new, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    written = {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()}
    assert written == PROJECT_FILES
    listed = {line.strip() for line in made.stdout.splitlines() if line.startswith("  ")}
    assert listed == {str(project / name) for name in PROJECT_FILES}  # it says what it wrote
    again = subprocess.run(new, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)
    assert again.returncode == 1 and "not empty" in again.stderr
    assert {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()} == written

    (block,) = re.findall(r"```bash\n(.*?)```", (project / "README.md").read_text(), re.S)
    try:
        shell = subprocess.run(["bash", "-euc", block], cwd=project, env=env, text=True,
                               capture_output=True, timeout=600)  # fmt: skip
    finally:
        subprocess.run(["streamplatform", "broker", "stop"], cwd=project, env=env,
                       capture_output=True, timeout=120)  # fmt: skip
    output = shell.stdout + shell.stderr
    assert shell.returncode == 0, output[-4000:]
    assert "1 passed" in output  # the project's own test
    assert f"data in {project / '.data' / 'broker'}" in output
    assert "batch 0: 3 in, 2 out, 1 duplicates dropped" in output
    table = project / ".data" / "delta" / "clicks" / "clicks-deduplicated"
    assert (table / "_delta_log").is_dir()
    assert (project / ".data" / "broker").is_dir()
    # Nothing new in the platform's install: no table, broker, state or stray folder.
    new_in_install = sorted(platform_files() - before)
    assert not new_in_install, new_in_install

    # Loaded from its file under a name of its own: the example's `definitions` module may already
    # be imported by other tests in this process.
    monkeypatch.syspath_prepend(str(project))
    spec = importlib.util.spec_from_file_location(
        "new_project_definitions", project / "definitions.py"
    )
    definitions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(definitions)
    keys = {k.to_user_string() for a in definitions.defs.assets for k in a.keys}
    assert "clicks_deduplicated" in keys
