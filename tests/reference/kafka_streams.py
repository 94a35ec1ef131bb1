"""Running Kafka Streams itself: a reference program of this folder (a single-file Java
program on the jars ``make setup`` puts in ``.jvm/streams/``) on tab-separated input lines.

Each program is compiled once per test session (``javac``, into a temporary directory) and
then run as a class: a run is then the JVM's start and the program, not a compilation too."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JARS = ROOT / ".jvm" / "streams"
_COMPILED: dict[str, Path] = {}  # program -> the directory of its classes


def _classes(program: str) -> Path:
    """``program`` compiled (once per session): the directory its classes are in."""
    if program not in _COMPILED:
        out = Path(tempfile.mkdtemp(prefix="reference-classes-"))
        done = subprocess.run(
            ["javac", "-cp", f"{JARS}/*", "-d", str(out), str(Path(__file__).with_name(program))],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        _COMPILED[program] = out
    return _COMPILED[program]


def run_reference(program: str, mode: str, lines: str, state_dir: Path) -> list[str]:
    """``program`` (a .java file beside this one) in ``mode`` on ``lines``: its output lines.
    Skips the test, saying why, when Java or the jars are missing."""
    if shutil.which("javac") is None or not (JARS / ".fetched").exists():
        pytest.skip("Kafka Streams' jars are not in .jvm/streams/ (make setup fetches them), "
                    "or there is no JDK (javac)")  # fmt: skip
    classes = _classes(program)
    done = subprocess.run(
        ["java", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-cp", f"{classes}:{JARS}/*",
         Path(program).stem, mode, str(state_dir)],
        input=lines, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()
