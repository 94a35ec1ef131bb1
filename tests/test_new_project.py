"""`streamplatform new` in an empty folder, then its README's commands as written: the project's
test passes, a local broker started from that folder takes the clicks, `streamplatform run`
deduplicates them into a Delta table of the project's, and the project's data stays in its own
`.data/` (none in the platform's install). Its Dagster definitions load."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamplatform import new_project
from streamplatform.home import _CHECKOUT


@pytest.mark.slow  # ~40 s: a broker of its own and a child driver
@pytest.mark.child_process  # the README's `streamplatform run`
def test_a_new_project_works_as_its_readme_says(tmp_path, monkeypatch):
    project = tmp_path / "clickstream-team"
    written = {p.relative_to(project).as_posix() for p in new_project.create(project)}
    assert written == {
        "pyproject.toml", "clickstream_team/__init__.py", "clickstream_team/topology.py",
        "tests/test_topology.py", "definitions.py", "README.md", ".gitignore",
    }  # fmt: skip
    with pytest.raises(FileExistsError, match="not empty"):
        new_project.create(project)
    (block,) = re.findall(r"```bash\n(.*?)```", (project / "README.md").read_text(), re.S)
    env = {k: v for k, v in os.environ.items()
           if k not in ("STREAMPLATFORM_DATA", "STREAMPLATFORM_HOME", "PYTHONPATH", "CI")}  # fmt: skip
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
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
    assert not (_CHECKOUT / ".data" / "delta" / "clicks").exists()

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
