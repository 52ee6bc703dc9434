"""The fast tier's guard (tests/conftest.py), run by pytester on tests of its own with the project's conftest copied
beside them and a limit of 0.2 s. In the fast tier (`-m "not slow"`) a test not marked slow that computes past the limit
fails, in this process or in a child it waits for; a test that only waits (wall time, no CPU) within ten times the
limit passes, as a test slowed by a loaded machine does. In the full suite the same tests pass and are listed at the
end: an outcome there must not depend on the machine's speed."""

from __future__ import annotations

from pathlib import Path

import pytest

INNER = '''
import subprocess, sys, time

import pytest


def burn(seconds):
    t0 = time.process_time()
    while time.process_time() - t0 < seconds:
        pass


def test_quick():
    burn(0.01)


def test_unmarked_and_slow():
    burn(0.4)


@pytest.mark.slow
def test_marked_and_slow():
    burn(0.4)


def test_waits_without_computing():
    time.sleep(0.25)


def test_slow_in_a_child_process():
    burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass"
    subprocess.run([sys.executable, "-S", "-c", burn], check=True)


def test_waits_past_ten_times_the_limit():
    time.sleep(2.2)


def test_failing_fast_keeps_its_own_failure():
    assert 1 == 2
'''


def run_inner(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, str]]:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makeini("[pytest]\nslow_guard_cpu_s = 0.2\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", *args)
    outcomes = {r.nodeid.split("::")[1]: r.outcome for r in result.reprec.getreports("pytest_runtest_logreport")
                if r.when == "call"}
    return result, outcomes


SAID = "slow but not marked: * s of CPU and * s of wall time, over the fast tier's 0.2 s (slow_guard_cpu_s)*"


def test_the_guard_fails_a_slow_test_that_is_not_marked_in_the_fast_tier(pytester: pytest.Pytester):
    result, outcomes = run_inner(pytester, "-m", "not slow")
    assert outcomes == {"test_quick": "passed", "test_unmarked_and_slow": "failed",
                        "test_waits_without_computing": "passed", "test_slow_in_a_child_process": "failed",
                        "test_waits_past_ten_times_the_limit": "failed",
                        "test_failing_fast_keeps_its_own_failure": "failed"}
    result.stdout.fnmatch_lines(["*_ test_unmarked_and_slow _*", SAID, "*_ test_slow_in_a_child_process _*", SAID,
                                 "*_ test_waits_past_ten_times_the_limit _*", SAID,
                                 "*_ test_failing_fast_keeps_its_own_failure _*", "*assert 1 == 2"])


def test_outside_the_fast_tier_the_guard_lists_and_does_not_fail(pytester: pytest.Pytester):
    result, outcomes = run_inner(pytester, "-k", "unmarked_and_slow or marked_and_slow or failing_fast")
    assert outcomes == {"test_unmarked_and_slow": "passed", "test_marked_and_slow": "passed",
                        "test_failing_fast_keeps_its_own_failure": "failed"}
    result.stdout.fnmatch_lines(["*the fast tier's guard (not failed outside the fast tier)*",
                                 "test_inner.py::test_unmarked_and_slow: " + SAID])
    assert "test_marked_and_slow: slow" not in result.stdout.str()
