"""The collection check of tests/conftest.py (tests/process_markers.py): a test that starts a
heavy process of its own without the marker saying so fails the run, naming the test and the
marker; light child processes, in-process jobs and mere mentions need none."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import pytest
from process_markers import MARKERS, read_source, required_markers

# Small fake tests, written to a module of their own (never run): what each needs.
FAKES = '''
import subprocess, sys, textwrap

DRIVER = textwrap.dedent("""
    from streamplatform.runtime.microbatch import StreamingJob
    StreamingJob(topology, config).run_until_caught_up()
""")
DOCUMENT = open(__file__).read()  # text read from elsewhere: not a script of the tests


def _start_driver(script):
    return subprocess.Popen([sys.executable, "-c", script])


def test_driver_script():
    _start_driver(DRIVER).wait()


def test_cli_run():
    command = [sys.executable, "-m", "streamplatform.cli", "run", "--topology", "m:t"]
    subprocess.run(command, check=True)


def test_console_run(tmp_path):
    subprocess.run(console_command("run", "m:t", {}), cwd=tmp_path)


def test_demo():
    subprocess.run([sys.executable, "demo.py", "--records", "10"])


def test_light_child():
    subprocess.run([sys.executable, "-c", "import time; time.sleep(0.1)"], check=True)


def test_job_in_this_process(spark):
    StreamingJob(topology, config, spark=spark).run_until_caught_up()


def test_a_light_child_beside_a_document():
    subprocess.run([sys.executable, "-c", "print(1)"])
    assert DOCUMENT.count("spark_session") == 1  # the text has it, the test does not write it


def test_a_sleeper_named_dagster_dev():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(9)", "dagster", "dev"])


def test_mentions_only():
    """Not `dagster dev`, nor LocalCluster(...), nor chromium() here: words only."""
    # webui.dagster_dev(...) in a comment is no call either.
    assert "LocalCluster(" != "dagster dev"


def test_cluster(tmp_path):
    with LocalCluster(tmp_path, workers=2):
        pass


def test_local_cluster_master(spark_session):
    spark_session(master="LOCAL_CLUSTER[2,1,1024]")


def test_connect_server(tmp_path):
    with LocalConnectServer(tmp_path):
        pass


def test_dagster_dev(tmp_path):
    with webui.dagster_dev(ROOT, {}, tmp_path / "log"):
        pass


def test_make_ui():
    subprocess.Popen(["make", "--no-print-directory", "ui", "UI_PORT=3001"])


def test_browser(tmp_path):
    with webui.chromium(tmp_path):
        pass
'''

EXPECTED = {
    "test_driver_script": {"child_process"},
    "test_cli_run": {"child_process"},
    "test_console_run": {"child_process"},
    "test_demo": {"child_process"},
    "test_light_child": set(),
    "test_job_in_this_process": set(),
    "test_a_light_child_beside_a_document": set(),
    "test_a_sleeper_named_dagster_dev": set(),
    "test_mentions_only": set(),
    "test_cluster": {"cluster"},
    "test_local_cluster_master": {"cluster"},
    "test_connect_server": {"connect_server"},
    "test_dagster_dev": {"dagster_dev"},
    "test_make_ui": {"dagster_dev"},
    "test_browser": {"browser"},
}


@pytest.fixture
def fakes(tmp_path):
    path = tmp_path / "fake_tests.py"
    # Spark's multi-process master, spelt out only in the fakes: here it would be a string of
    # this module, read by the check for the tests that use this fixture.
    path.write_text(FAKES.replace("LOCAL_CLUSTER", "local-" + "cluster"))
    spec = importlib.util.spec_from_file_location(f"fake_tests_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, tmp_path


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fake_needs_exactly_its_markers(fakes, name):
    module, root = fakes
    needed = required_markers(read_source([getattr(module, name)], root))
    assert set(needed) == EXPECTED[name], needed


def test_nothing_outside_the_root_is_read(fakes):
    """Code outside the root (a library's) is not read: it is called by name instead."""
    module, root = fakes
    assert required_markers(read_source([module.test_driver_script], root / "elsewhere")) == {}


def test_every_marker_is_declared_with_its_description(pytestconfig):
    declared = pytestconfig.getini("markers")
    for marker, description in MARKERS.items():
        assert f"{marker}: {description}" in declared


UNMARKED = """
import subprocess, sys

import pytest

DRIVER = "from streamplatform.spark import spark_session; spark_session()"


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path, workers=2) as started:
        yield started


def test_light():
    subprocess.run([sys.executable, "-c", "print(1)"])


@pytest.mark.parametrize("n", [1, 2])
def test_unmarked_driver(n):
    subprocess.Popen([sys.executable, "-c", DRIVER])


def test_on_the_cluster_fixture(cluster):
    pass


@pytest.mark.slow
def test_deselected_but_still_checked():
    subprocess.Popen([sys.executable, "-c", DRIVER])
"""


def _pytester_project(pytester: pytest.Pytester, tests: str) -> None:
    """``tests`` beside a copy of the suite's own conftest.py (its hook reads the tests beside
    it) and the markers of pyproject.toml."""
    pytester.makeini(
        "[pytest]\nmarkers =\n    slow: slow\n"
        + "".join(f"    {marker}: {description}\n" for marker, description in MARKERS.items())
    )
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_fake=tests)


def test_the_run_fails_naming_each_test_and_the_marker_it_lacks(pytester):
    _pytester_project(pytester, UNMARKED)
    result = pytester.runpytest("--collect-only", "-q", "-m", "not slow", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = "\n".join(result.errlines)
    for test, marker in [
        ("test_unmarked_driver[1]", "child_process"),
        ("test_unmarked_driver[2]", "child_process"),
        ("test_on_the_cluster_fixture", "cluster"),  # in the fixture it requests
        ("test_deselected_but_still_checked", "child_process"),
    ]:
        assert f"test_fake.py::{test} lacks @pytest.mark.{marker}" in errors, errors
    assert "test_light" not in errors


def test_with_the_markers_the_run_goes_on(pytester):
    marked = (
        UNMARKED.replace("def test_unmarked", "@pytest.mark.child_process\ndef test_unmarked")
        .replace("def test_on_the", "@pytest.mark.cluster\ndef test_on_the")
        .replace("@pytest.mark.slow\n", "@pytest.mark.slow\n@pytest.mark.child_process\n")
    )
    _pytester_project(pytester, marked)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, "\n".join(result.errlines)
    result.stdout.fnmatch_lines(["5 tests collected*"])
