"""The CI rule of tests/conftest.py: under CI=true a skip fails the run; elsewhere it stays a skip."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py").read_text()

SKIPPING_TESTS = """
import pytest

def test_skips_inside():
    pytest.skip("no widget here")

@pytest.mark.skipif(True, reason="marked away")
def test_skipif_marker():
    pass

@pytest.mark.xfail(reason="known bug")
def test_expected_failure():
    assert False

def test_passes():
    pass
"""

MODULE_LEVEL_SKIP = """
import pytest

pytest.skip("whole module needs a widget", allow_module_level=True)

def test_never_collected():
    pass
"""


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


@pytest.mark.parametrize("value", ["true", "1"])
def test_skips_fail_under_ci(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    inner.makepyfile(test_inner=SKIPPING_TESTS)
    result = inner.runpytest("-rA")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # pytest.skip() in the test body fails the test; a skipif marker is evaluated in setup, so it shows as an error.
    result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1)
    result.stdout.fnmatch_lines(["*skips count as failures under CI=*no widget here*"])
    result.stdout.fnmatch_lines(["*skips count as failures under CI=*marked away*"])


def test_collection_skip_fails_under_ci(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    inner.makepyfile(test_inner=MODULE_LEVEL_SKIP)
    result = inner.runpytest()
    assert result.ret != pytest.ExitCode.OK
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*skips count as failures under CI=*whole module needs a widget*"])


@pytest.mark.parametrize("value", [None, "false", ""])
def test_skips_stay_skips_outside_ci(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    inner.makepyfile(test_inner=SKIPPING_TESTS)
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)


def test_collection_skip_stays_skip_outside_ci(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    inner.makepyfile(test_inner=MODULE_LEVEL_SKIP)
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.assert_outcomes(skipped=1)
