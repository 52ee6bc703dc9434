"""How torch's OpenMP threads wait: the command line makes them sleep instead of spin (OMP_WAIT_POLICY=PASSIVE)
unless the user chose, and the run says which in its log and summary.json.

What OpenMP actually read is asked of libgomp itself (OMP_DISPLAY_ENV=VERBOSE prints its settings when torch loads
it): its spin count before a waiting thread sleeps is 300,000 by default, 0 under PASSIVE and 30,000,000,000 under
ACTIVE (libgomp's env.c). With another OpenMP runtime (no GOMP_SPINCOUNT line) those checks skip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TINYELECTRA_SET_OMP_WAIT_POLICY")
SMALL = ["--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32"]


def clean_env(base: dict, **extra: str) -> dict:
    """`base` without any OpenMP wait setting (nor tinyelectra's mark that it set one), plus `extra`."""
    return {**{k: v for k, v in base.items() if k not in OPENMP_VARIABLES}, **extra}


def libgomp_settings(args: list[str], env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `python ARGS` with OMP_DISPLAY_ENV=VERBOSE; libgomp's settings as it printed them when torch loaded it."""
    p = subprocess.run([sys.executable, *args], env={**env, "OMP_DISPLAY_ENV": "VERBOSE"}, capture_output=True,
                       text=True, timeout=300)
    shown = dict(line.strip().split(" = ", 1) for line in p.stderr.splitlines() if line.startswith("  ")
                 and " = " in line)
    if "GOMP_SPINCOUNT" not in shown:
        pytest.skip("torch's OpenMP runtime is not libgomp (no GOMP_SPINCOUNT in OMP_DISPLAY_ENV's output)")
    return p, {k: v.strip("'") for k, v in shown.items()}


# A command that loads torch and then stops with a one-line error, before any work.
NO_GPU = ["-m", "tinyelectra", "train", "--recipe", "tiny", "--budget", "1steps", "--gpu", "3"]


@pytest.mark.parametrize(("user", "spins"), [({}, "0"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "30000000000"),
                                             ({"GOMP_SPINCOUNT": "1234"}, "1234")])
@pytest.mark.cli
@pytest.mark.slow
def test_tinyelectra_waits_passively_unless_the_user_chose(cli_env, tmp_path, user, spins):
    p, gomp = libgomp_settings([*NO_GPU, "--out", str(tmp_path / "r")], clean_env(cli_env, **user))
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error:"), p.stderr
    assert gomp["GOMP_SPINCOUNT"] == spins


@pytest.mark.cli
@pytest.mark.slow
def test_without_tinyelectra_libgomp_spins(cli_env):
    """The control: the same environment without tinyelectra's command line leaves libgomp's default spinning."""
    _, gomp = libgomp_settings(["-c", "import torch"], clean_env(cli_env))
    assert gomp["GOMP_SPINCOUNT"] == "300000"


@pytest.mark.parametrize(("env", "set_by", "says"), [
    ({"OMP_WAIT_POLICY": "PASSIVE", "TINYELECTRA_SET_OMP_WAIT_POLICY": "1"}, "tinyelectra",
     "PASSIVE, tinyelectra's default"),
    ({"OMP_WAIT_POLICY": "ACTIVE", "TINYELECTRA_SET_OMP_WAIT_POLICY": "1"}, "environment",
     "OMP_WAIT_POLICY=ACTIVE from the environment"),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "environment", "OMP_WAIT_POLICY=PASSIVE from the environment"),
    ({"GOMP_SPINCOUNT": "1234"}, "environment", "GOMP_SPINCOUNT=1234 from the environment"),
    ({}, None, "OpenMP's default"),
])
def test_the_note_says_who_chose_the_wait_policy(monkeypatch, env, set_by, says):
    from tinyelectra.runtime import openmp_note

    for k in OPENMP_VARIABLES:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    text, record = openmp_note()
    assert says in text and record["set_by"] == set_by
    assert (record["omp_wait_policy"], record["gomp_spincount"]) == (
        env.get("OMP_WAIT_POLICY"), env.get("GOMP_SPINCOUNT"))


@pytest.mark.slow
@pytest.mark.cli
def test_a_run_logs_and_records_the_wait_policy(cli_env, tmp_path):
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "tinyelectra", "train", "--recipe", "tiny", "--budget", "2steps",
                        "--device", "cpu", *SMALL, "--out", str(run)], env=clean_env(cli_env), capture_output=True,
                       text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    assert "OpenMP waits: OMP_WAIT_POLICY=PASSIVE, tinyelectra's default" in " ".join(p.stderr.split())
    threads = json.loads((run / "summary.json").read_text())["runtime"]["cpu_threads"]
    assert threads["omp_wait_policy"] == "PASSIVE" and threads["set_by"] == "tinyelectra" and threads["threads"] >= 1
