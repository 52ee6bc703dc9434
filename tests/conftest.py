"""Fixtures shared by the test modules that run the command line, and the fast tier's guard.

The guard keeps the fast tier (`pytest -m "not slow and not cli"`) the loop of a few minutes it is measured to be
(tinyelectra/docs/CONTRIBUTING.md), and the `slow` marker honest: a test not marked `slow` is over the limit when its
call took more than `slow_guard_cpu_s` seconds (pyproject.toml: 5) both of CPU and of wall time, or more
than ten times that of wall time alone. Both, because each alone misjudges: wall time grows with the machine's load
(CI has seen load 10 on 2 cores, where a 1 s test takes 5 s), CPU time with threads (two torch threads spend 2 s of
CPU in 1 s). The CPU counted is this process's and that of the child processes it waited for (os.times), so a test
that runs the command line in a subprocess is judged by the work it caused. Under load CPU time moves only by what
spinning OpenMP threads burn, and the slow tests were marked at well under the limit. Wall time alone catches a test
that waits (a sleep, a child's timer) instead of computing: ten times the limit is twice what load 10 makes of a
test at the limit. Fixtures are not counted (a module's shared set-up would fall on whichever test comes first).
Such a test FAILS only in a run that leaves the slow tests out (a `-m` with "not slow": the fast tier, where the limit
is the point); in any other run (the full suite, CI) it is listed at the end of the run, not failed, because a test's
outcome must not depend on the machine's speed (CI's shared machine has run the suite at a quarter of its quiet
speed, and CPU time too grows under load: cache contention, spinning threads)."""

from __future__ import annotations

import os
import time

import pytest

pytest_plugins = ["pytester"]  # tests/test_fast_tier.py runs the guard on tests of its own


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("slow_guard_cpu_s", "a test not marked slow fails past this many seconds of CPU and of wall time "
                  "(0: no guard)", default="5")


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


OVER_LIMIT = pytest.StashKey[list]()  # (test id, what the guard says) of the tests over the limit in this run


def _fast_tier(config: pytest.Config) -> bool:
    """Does this run leave the slow tests out (`-m "not slow ..."`)? Only there does the guard fail a test."""
    return "not slow" in " ".join((config.getoption("markexpr") or "").split())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    limit = float(item.config.getini("slow_guard_cpu_s"))
    cpu0, wall0 = _cpu_seconds(), time.monotonic()
    result = yield  # a failing test's exception passes through unchanged
    cpu, wall = _cpu_seconds() - cpu0, time.monotonic() - wall0
    if limit > 0 and (min(cpu, wall) > limit or wall > 10 * limit) and item.get_closest_marker("slow") is None:
        said = (f"slow but not marked: {cpu:.1f} s of CPU and {wall:.1f} s of wall time, over the fast tier's "
                f"{limit:g} s (slow_guard_cpu_s); mark it @pytest.mark.slow or make it faster")
        if _fast_tier(item.config):
            pytest.fail(said, pytrace=False)
        item.config.stash.setdefault(OVER_LIMIT, []).append((item.nodeid, said))
    return result


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    """The full suite's over-limit tests, listed (not failed: see the module's docstring)."""
    over = config.stash.get(OVER_LIMIT, [])
    if over:
        terminalreporter.section("the fast tier's guard (not failed outside the fast tier)", sep="-")
        for nodeid, said in over:
            terminalreporter.line(f"{nodeid}: {said}")


@pytest.fixture(scope="session")
def cli_env(tmp_path_factory) -> dict:
    """Environment for command-line runs: one private cache for the whole session (the built-in corpus is prepared
    once, never in the user's ~/.cache), unbuffered output."""
    return dict(os.environ, TINYELECTRA_CACHE=str(tmp_path_factory.mktemp("cache")), PYTHONUNBUFFERED="1")


@pytest.fixture
def one_thread():
    """Torch on one thread for the test, restored after: tiny models gain nothing from threads, and on a machine
    shared with other jobs two threads can run 10x slower than one (OpenMP spin-waiting). Modules that want it
    say `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def fake_gpu(monkeypatch):
    """`fake_gpu(name, capability, memory_gib, count)`: torch.cuda answers as a machine with `count` such cards would
    (availability, count, name, properties, capability, bf16 support), for testing GPU decisions on the CPU. The
    properties are the ones runtime.card_of reads; bf16 support follows torch's own rule (8.0+)."""
    import types

    import torch

    def fake(name: str = "NVIDIA H100 80GB HBM3", capability: tuple[int, int] = (9, 0), memory_gib: float = 79.2,
             count: int = 1) -> None:
        props = types.SimpleNamespace(name=name, major=capability[0], minor=capability[1],
                                      total_memory=int(memory_gib * 2**30))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: name)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: capability >= (8, 0))

    return fake
