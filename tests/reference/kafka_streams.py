"""Running Kafka Streams itself: a reference program of this folder (a single-file Java
program on the jars ``make setup`` puts in ``.jvm/streams/``) on tab-separated input lines."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JARS = ROOT / ".jvm" / "streams"


def run_reference(program: str, mode: str, lines: str, state_dir: Path) -> list[str]:
    """``program`` (a .java file beside this one) in ``mode`` on ``lines``: its output lines.
    Skips the test, saying why, when Java or the jars are missing."""
    if shutil.which("java") is None or not (JARS / ".fetched").exists():
        pytest.skip("Kafka Streams' jars are not in .jvm/streams/ (make setup fetches them)")
    source = Path(__file__).with_name(program)
    done = subprocess.run(
        ["java", "-cp", f"{JARS}/*", str(source), mode, str(state_dir)],
        input=lines, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()
