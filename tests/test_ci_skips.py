"""Under CI=true a test that would skip for something missing fails, naming it (ci_skips.py);
elsewhere it skips, saying why."""

from __future__ import annotations

SKIPPING = """
import pytest

def test_needs_a_jdk():
    pytest.skip("no Java 21+ found for the registry")

@pytest.mark.skipif(True, reason="the S3A jars are not fetched")
def test_needs_jars():
    pass

def test_asked_for():
    pytest.skip("STREAMPLATFORM_NO_C_CORE=1: the pure-Python core runs, as asked")
"""


def test_a_skip_fails_under_ci_naming_what_is_missing(pytester, monkeypatch):
    pytester.makepyfile(test_skipping=SKIPPING)
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "ci_skips")
    result.assert_outcomes(failed=1, errors=1, skipped=1)  # a skipif fails in its setup
    result.stdout.fnmatch_lines(["*would be skipped under CI*no Java 21+ found*",
                                 "*would be skipped under CI*S3A jars*"])  # fmt: skip


def test_outside_ci_a_skip_stays_a_skip(pytester, monkeypatch):
    pytester.makepyfile(test_skipping=SKIPPING)
    monkeypatch.delenv("CI", raising=False)
    pytester.runpytest("-p", "ci_skips").assert_outcomes(skipped=3)
