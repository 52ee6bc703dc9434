"""Nothing lost, nothing stuck (issue 11): a run killed or interrupted anywhere — during start-up, before its first
resume state, while writing a state or a checkpoint, by a double Ctrl-C, by a full disk — is continued with the
documented command (`--resume`, or the same command again) and ends bit-identical to an uninterrupted run, with the
same logged losses; a checkpoint written before the kill is kept. A finished run's command can be run again; an
unfinished one is never overwritten without --force; --force says what it deletes.

The kills are placed exactly, not timed: a wrapper script makes the process die (os._exit, as abrupt as SIGKILL) or
signal itself at a named point of the real command line.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tinyelectra.budget import FRACTIONS, checkpoint_name

CKPTS = [checkpoint_name(f) for f in FRACTIONS]
STEPS = 8  # checkpoints after steps 1, 2, 3, 4 and 8
# a smaller-than-tiny model; deterministic; a log window of 3 steps, so that a resume inside a window shows
ARGS = ["train", "--recipe", "tiny", "--budget", f"{STEPS}steps", "--device", "cpu", "--set", "model.num_layers=2",
        "--set", "train.batch_size=8", "--set", "train.eval_rows=32", "--set", "train.deterministic=true",
        "--set", "train.log_every_steps=3"]

KILL = """
import os, signal, sys
import tinyelectra.budget as budget
import tinyelectra.files as files
import tinyelectra.train as train

point = os.environ["KILL_AT"]
real_fsync, real_save = files.fsync_file, budget.Plan.save
real_verify, real_update = train.Engine.verify_compile, train.Engine.update
calls = {"update": 0}

def fsync(path):
    name = str(path)
    if point == "first-state" and "step-000000000" in name and path.name == "trainer.json":
        os._exit(9)  # inside the resume state written right after start-up
    if point == "state-after-ckpt-0625" and "step-000000001" in name and path.name == "trainer.json":
        os._exit(9)  # ckpt-0625 is complete, the resume state after it is not
    if point == "ckpt-2500" and "ckpt-2500" in name and path.name == "config.json":
        os._exit(9)  # inside the 25% checkpoint, in the middle of a log window
    real_fsync(path)

def save(self, path):
    real_save(self, path)
    if point == "after-plan" and path.name == "plan.json":
        os._exit(9)  # recipe.json and plan.json written, no resume state yet (the old stuck case)

def verify(self, special):
    if point == "sigterm-startup":
        os.kill(os.getpid(), signal.SIGTERM)  # mid start-up, before anything is written
    return real_verify(self, special)

def update(self):
    real_update(self)
    calls["update"] += 1
    if point in ("sigterm-step-4", "sigint-step-4") and calls["update"] == 4:
        # between log steps 3 and 6
        os.kill(os.getpid(), signal.SIGTERM if point == "sigterm-step-4" else signal.SIGINT)
    if point == "double-ctrl-c" and calls["update"] == 3:
        os.kill(os.getpid(), signal.SIGINT)  # asks the loop to stop after this step ...
        os.kill(os.getpid(), signal.SIGINT)  # ... and the second Ctrl-C ends it at once

files.fsync_file, budget.Plan.save, train.Engine.verify_compile, train.Engine.update = fsync, save, verify, update
from tinyelectra.cli import main
sys.argv = ["tinyelectra"] + sys.argv[1:]
main()
"""


def tinyelectra(args: list[str], env: dict, kill_at: str | None = None, limit_file_bytes: int | None = None):
    cmd = [sys.executable, "-c", KILL, *args] if kill_at else [sys.executable, "-m", "tinyelectra", *args]
    env = dict(env, KILL_AT=kill_at or "")

    def limit():  # a "full disk" for this process only: writing past this size fails with EFBIG
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_bytes, limit_file_bytes))

    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                          preexec_fn=limit if limit_file_bytes else None)


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    return p


def losses(run: Path) -> dict[int, tuple[float, float]]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: (r["gen_loss"], r["disc_loss"]) for r in recs if "event" not in r}


def metrics_lines(run: Path) -> list[dict]:
    """metrics.jsonl line by line, without what timing changes (seconds, speeds)."""
    def clean(rec):
        if isinstance(rec, dict):
            return {k: clean(v) for k, v in rec.items() if "seconds" not in k and "per_second" not in k and k != "mfu"}
        return rec
    return [clean(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return {f"{part}/{k}": v for part in ("discriminator", "generator")
            for k, v in load_file(str(ckpt / f"{part}.safetensors")).items()}


def same_weights(a: Path, b: Path) -> bool:
    x, y = weights(a), weights(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def assert_same_run(run: Path, ref: Path) -> None:
    """Every logged loss (windows of 3 steps) and every checkpoint's weights equal the uninterrupted run's."""
    assert losses(run) == losses(ref)
    for name in CKPTS:
        assert same_weights(run / name, ref / name), name
    assert json.loads((run / "plan.json").read_text())["checkpoint_steps"] == {
        "ckpt-0625": 1, "ckpt-1250": 2, "ckpt-2500": 3, "ckpt-5000": 4, "ckpt-10000": 8}
    assert not list(run.rglob("*.tmp-*")), "a temporary file was left behind"


@pytest.fixture(scope="module")
def reference(cli_env, tmp_path_factory) -> Path:
    ref = tmp_path_factory.mktemp("ref") / "run"
    ok(tinyelectra([*ARGS, "--out", str(ref)], cli_env))
    assert sorted(losses(ref)) == [3, 6, 8]
    return ref


def continue_command(stderr: str) -> list[str]:
    """The command the interrupted run printed ("continue with: tinyelectra train ... --resume"), as argv."""
    found = re.findall(r"continue with: (tinyelectra .*)$", stderr, flags=re.MULTILINE)
    assert found, stderr[-2000:]
    words = shlex.split(found[-1])
    assert words[0] == "tinyelectra" and "--resume" in words
    return words[1:]


@pytest.mark.slow
@pytest.mark.parametrize("point", ["sigterm-startup", "after-plan", "first-state", "state-after-ckpt-0625",
                                   "ckpt-2500", "double-ctrl-c"])
@pytest.mark.cli
def test_killed_run_continues_with_the_documented_command(point, reference, cli_env, tmp_path):
    run = tmp_path / "run"
    killed = tinyelectra([*ARGS, "--out", str(run)], cli_env, kill_at=point)
    assert "Traceback" not in killed.stderr, killed.stderr[-3000:]
    if point == "sigterm-startup":
        assert killed.returncode == 143
        assert "interrupted (SIGTERM) during start-up" in killed.stderr
        assert "run the same command again" in killed.stderr
        assert not run.exists()  # nothing was written yet: not even an empty --out
        again = [*ARGS, "--out", str(run)]
    elif point == "double-ctrl-c":
        assert killed.returncode == 130
        assert re.search(r"interrupted \(SIGINT\) at step \d: saved: resume state at step \d", killed.stderr), \
            killed.stderr[-2000:]
        again = continue_command(killed.stderr)
    else:
        assert killed.returncode == 9, killed.stderr[-3000:]
        assert (run / "plan.json").is_file()
        again = [*ARGS, "--out", str(run), "--resume"]  # the documented way on (train --help, README)
    if point == "state-after-ckpt-0625":
        assert (run / "ckpt-0625" / "sha256.json").is_file()  # complete, written before the kill
        before = weights(run / "ckpt-0625")
    if point == "ckpt-2500":  # died inside the checkpoint write: nothing loadable under its name, the others intact
        from tinyelectra.checkpoint import is_checkpoint, load_checkpoint

        assert list(run.glob("ckpt-2500.tmp-*")) and not (run / "ckpt-2500").exists()
        assert all(load_checkpoint(run / n)[2]["name"] == n for n in ("ckpt-0625", "ckpt-1250"))
        assert not is_checkpoint(run / "ckpt-2500")
    if point == "after-plan":  # the old stuck case: plan.json + recipe.json, no resume state; the same command again
        assert not (run / "state" / "LATEST").exists()
        again = [*ARGS, "--out", str(run)]
    p = ok(tinyelectra(again, cli_env))
    if point in ("after-plan", "first-state"):
        assert "stopped before its first resume state" in p.stderr and "starting it again from step 0" in p.stderr
    if point == "state-after-ckpt-0625":
        assert "ckpt-0625: written after this resume state; kept" in p.stderr
        after = weights(run / "ckpt-0625")
        assert all(torch.equal(before[k], after[k]) for k in before)  # the kept checkpoint is the same model
    assert_same_run(run, reference)


@pytest.mark.slow
@pytest.mark.cli
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_between_log_steps_resumes_to_the_same_metrics_lines(sig, reference, cli_env, tmp_path):
    """SIGTERM (or one Ctrl-C) after step 4, between the log steps 3 and 6 (issue 35, finding 9): the run stops
    after that step without logging the window in progress (its resume state holds it), and the resumed run's
    metrics.jsonl equals the uninterrupted run's line by line; before, the stop wrote an extra line at step 4 and the
    next logged loss covered steps 5-6 only."""
    run = tmp_path / "run"
    killed = tinyelectra([*ARGS, "--out", str(run)], cli_env, kill_at=f"{sig.lower()}-step-4")
    assert killed.returncode == (143 if sig == "SIGTERM" else 130), killed.stderr[-3000:]
    assert f"stopped by {sig} at step 4: saved: resume state at step 4" in killed.stderr
    assert sorted(losses(run)) == [3]  # nothing logged at the stop
    ok(tinyelectra(continue_command(killed.stderr), cli_env))
    assert metrics_lines(run) == metrics_lines(reference)
    assert_same_run(run, reference)


@pytest.mark.slow
@pytest.mark.cli
def test_stranded_checkpoint_without_any_resume_state_is_kept(reference, cli_env, tmp_path):
    """A run directory as older versions left it: a complete ckpt-0625, plan.json and recipe.json, no resume state
    at all. `--resume` starts it again from step 0 and keeps the checkpoint (the new run writes the same model)."""
    run = tmp_path / "run"
    tinyelectra([*ARGS, "--out", str(run)], cli_env, kill_at="state-after-ckpt-0625")
    shutil.rmtree(run / "state")
    kept = (run / "ckpt-0625" / "discriminator.safetensors").read_bytes()
    p = ok(tinyelectra([*ARGS, "--out", str(run), "--resume"], cli_env))
    assert "starting it again from step 0; kept ckpt-0625" in p.stderr
    assert (run / "ckpt-0625" / "discriminator.safetensors").read_bytes() == kept
    assert_same_run(run, reference)


@pytest.mark.slow
@pytest.mark.cli
def test_full_disk_during_start_up_is_one_line_and_the_run_can_start_again(reference, cli_env, tmp_path):
    """Files larger than 1 MB cannot be written (the limit makes the first resume state fail, as a full disk does):
    one line, exit 2, no temporary files; with room again the same command starts the run and completes it."""
    run = tmp_path / "run"
    p = tinyelectra([*ARGS, "--out", str(run)], cli_env, limit_file_bytes=1_000_000)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "File too large" in last
    assert not list(run.rglob("*.tmp-*")) and not list(run.rglob(".*.tmp"))
    ok(tinyelectra([*ARGS, "--out", str(run)], cli_env))
    assert_same_run(run, reference)


@pytest.mark.slow
@pytest.mark.cli
def test_run_directory_states(reference, cli_env, tmp_path):
    """The quick start's line twice: the second does nothing and says so (exit 0). An unfinished run is refused
    without --resume (it says how to continue or start over); --force starts over, saying what it deleted; --resume
    on a path that does not exist creates nothing."""
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    p = ok(tinyelectra([*ARGS, "--out", str(run)], cli_env))
    assert "already holds this run, finished" in p.stderr and "--force" in p.stderr
    assert losses(run) == losses(reference)

    unfinished = tmp_path / "unfinished"
    tinyelectra([*ARGS, "--out", str(unfinished)], cli_env, kill_at="ckpt-2500")
    p = tinyelectra([*ARGS, "--out", str(unfinished)], cli_env)
    assert p.returncode == 2 and "holds an unfinished run (resume state at step 2 of 8)" in p.stderr
    assert "--resume" in p.stderr and "--force" in p.stderr
    p = ok(tinyelectra([*ARGS, "--out", str(unfinished), "--force"], cli_env))
    assert re.search(r"--force: deleted the earlier run in .*\(ckpt-0625/ \(\d+ files\), ckpt-1250/ \(\d+ files\), "
                     r".*state/",
                     p.stderr), p.stderr[-2000:]
    assert_same_run(unfinished, reference)

    missing = tmp_path / "missing" / "run"
    p = tinyelectra([*ARGS, "--out", str(missing), "--resume"], cli_env)
    assert p.returncode == 2 and "does not exist" in p.stderr and not missing.parent.exists()
