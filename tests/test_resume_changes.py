"""A diverged run continued at a lower learning rate instead of started over: the Diverged line prints
`tinyelectra train ... --resume --set optim.lr=X`, which continues from the last resume state with the new peak
learning rate (the schedule's shape and steps unchanged) and records the change in plan.json, summary.json,
metrics.jsonl and the report. `optim.lr` and `optim.clip_norm` are the only settings a --resume may change; any other
change is refused, leaving the run as it was. (Before, --resume refused every change: the line offered only --force,
losing the steps done, or --init in a new run directory.)

The runs go through the real command line on the built-in corpus (prepared once per session, conftest.cli_env).
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

ARGS = ["train", "--recipe", "tiny", "--budget", "12steps", "--device", "cpu", "--set", "model.num_layers=2",
        "--set", "train.batch_size=8", "--set", "train.eval_rows=32", "--set", "train.deterministic=true"]


def tinyelectra(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=env, capture_output=True, text=True,
                          timeout=900)


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def diverged(cli_env, tmp_path_factory) -> tuple[Path, str]:
    """A run at learning rate 1e8: its loss is NaN at step 2, after the resume state at step 1 (the first step's
    learning rate is 0: the warm-up starts there). Returns the run and its error line."""
    run = tmp_path_factory.mktemp("diverged") / "run"
    p = tinyelectra([*ARGS, "--set", "optim.lr=1e8", "--out", str(run)], cli_env)
    assert p.returncode == 3, p.stderr[-3000:]
    return run, p.stderr.strip().splitlines()[-1]


CKPTS = ["ckpt-0625", "ckpt-1250", "ckpt-2500", "ckpt-5000", "ckpt-10000"]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return {f"{part}/{k}": v for part in ("discriminator", "generator")
            for k, v in load_file(str(ckpt / f"{part}.safetensors")).items()}


def suggested_command(line: str, original: Path, run: Path, lr: str) -> list[str]:
    """The command the Diverged line prints (checked: --resume, this run's --out, half the peak learning rate in
    place of the old one), for a copy of the run in `run` and learning rate `lr` (half of 1e8 would diverge too)."""
    found = re.search(r"continue from the resume state at step 1 with it: (tinyelectra .*?) \(or start over", line)
    assert found, line
    words = shlex.split(found.group(1))
    assert words[:2] == ["tinyelectra", "train"] and "--resume" in words and "--force" not in words
    assert words[words.index("--out") + 1] == str(original)
    assert [w for w in words if w.startswith("optim.lr=")] == ["optim.lr=5e+07"]
    shutil.copytree(original, run)
    words[words.index("--out") + 1] = str(run)
    words[words.index("optim.lr=5e+07")] = f"optim.lr={lr}"
    return words[1:]


@pytest.fixture(scope="module")
def resumed(diverged, cli_env, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("resumed") / "run"
    return run, ok(tinyelectra(suggested_command(diverged[1], diverged[0], run, "0.001"), cli_env))


@pytest.mark.slow
def test_a_diverged_run_continues_from_its_resume_state_with_a_lower_learning_rate(resumed, cli_env, tmp_path):
    run, p = resumed
    assert "resumed from step 1" in p.stderr and "optim.lr 1e+08 -> 0.001 at step 1" in p.stderr
    changes = [{"step": 1, "key": "optim.lr", "old": 1e8, "new": 0.001}]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["resumed_with_changes"] == changes
    assert json.loads((run / "plan.json").read_text())["resumed_with_changes"] == changes
    assert [r for r in records(run) if r.get("event") == "resumed_with_changes"] == [
        {"event": "resumed_with_changes", "step": 1, "changes": changes}]

    # it continued from the resume state at step 1, which is the same in a run that had learning rate 0.001 from the
    # start (step 1 runs at learning rate 0: the warm-up starts there): every logged loss and checkpoint is that run's
    fresh = tmp_path / "fresh"
    ok(tinyelectra([*ARGS, "--set", "optim.lr=0.001", "--out", str(fresh)], cli_env))
    logged = lambda r: {x["step"]: (x["gen_loss"], x["disc_loss"]) for x in records(r) if "event" not in x}  # noqa: E731
    assert logged(run) == logged(fresh) and max(logged(run)) == 12
    for name in CKPTS:
        a, b = weights(run / name), weights(fresh / name)
        assert all(torch.equal(a[k], b[k]) for k in b), name

    ok(tinyelectra(["report", str(run)], cli_env))  # and the report says that it is not the recipe's run
    assert ("NOT THE RECIPE'S RUN: settings changed on --resume (optim.lr 1e+08 -> 0.001 at step 1"
            in (run / "report.md").read_text())


@pytest.mark.slow
def test_the_clipping_norm_may_change_on_resume_too(diverged, resumed, cli_env, tmp_path):
    """Recorded beside the learning rate, and in effect: the weights differ from the run resumed with the learning
    rate alone (clip 1.0)."""
    run = tmp_path / "run"
    ok(tinyelectra([*suggested_command(diverged[1], diverged[0], run, "0.001"), "--set", "optim.clip_norm=0.5"], cli_env))
    assert json.loads((run / "summary.json").read_text())["resumed_with_changes"] == [
        {"step": 1, "key": "optim.clip_norm", "old": 1.0, "new": 0.5},
        {"step": 1, "key": "optim.lr", "old": 1e8, "new": 0.001}]
    a, b = weights(run / "ckpt-10000"), weights(resumed[0] / "ckpt-10000")
    assert not all(torch.equal(a[k], b[k]) for k in b)


REFUSED = {  # what a --resume must not change: the model, the objective, the batch, the schedule, Adam's constants
    "model.hidden_size=64": "model.hidden_size", "objective.disc_weight=10": "objective.disc_weight",
    "train.batch_size=4": "train.batch_size", "train.seq_len=64": "train.seq_len", "train.steps=5": "train.steps",
    "optim.beta2=0.99": "optim.beta2", "optim.warmup_steps=3": "optim.warmup_steps",
}


@pytest.mark.parametrize("setting", list(REFUSED))
def test_any_other_change_on_resume_is_refused(setting, diverged, cli_env, tmp_path, monkeypatch, capsys):
    """One line naming the setting and the two that may change; the run directory is left exactly as it was."""
    from tinyelectra import cli

    run = tmp_path / "run"
    shutil.copytree(diverged[0], run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    monkeypatch.setenv("TINYELECTRA_CACHE", cli_env["TINYELECTRA_CACHE"])
    monkeypatch.setattr(sys, "argv", ["tinyelectra", *ARGS, "--out", str(run), "--resume", "--set", "optim.lr=0.001",
                                      "--set", setting])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: --resume: "), err
    assert REFUSED[setting] in err[0] and "may change only optim.lr and optim.clip_norm" in err[0], err[0]
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_changed_learning_rate_without_resume_is_refused(diverged, cli_env, tmp_path, monkeypatch, capsys):
    from tinyelectra import cli

    run = tmp_path / "run"
    shutil.copytree(diverged[0], run)
    monkeypatch.setenv("TINYELECTRA_CACHE", cli_env["TINYELECTRA_CACHE"])
    monkeypatch.setattr(sys, "argv", ["tinyelectra", *ARGS, "--out", str(run), "--set", "optim.lr=0.001"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "optim.lr: 100000000.0 there, 0.001 now" in err[0], err


def test_a_finished_run_is_not_resumed_with_changes(resumed, cli_env, tmp_path, monkeypatch, capsys):
    """Nothing is left to continue: a changed learning rate on a finished run is another run's (refused)."""
    from tinyelectra import cli

    monkeypatch.setenv("TINYELECTRA_CACHE", cli_env["TINYELECTRA_CACHE"])
    monkeypatch.setattr(sys, "argv", ["tinyelectra", *ARGS, "--out", str(resumed[0]), "--resume", "--set",
                                      "optim.lr=0.002"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "optim.lr: 0.001 there, 0.002 now" in err[0], err
