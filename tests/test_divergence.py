"""A run whose loss turns non-finite stops (before the guard, `train --budget 12steps --set optim.lr=1e8` exited 0
after writing five checkpoints of NaN weights): pre-training and fine-tuning end with one `error:` line naming the
steps, what was kept and a lower learning rate to try, exit code 3, and write nothing from the diverged steps: every
checkpoint and resume state on disk holds finite weights, and no summary.json says the run finished.

The runs go through the real command line on the built-in corpus (prepared once per session, conftest.cli_env).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SMALL = ["--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32"]
DIVERGING = ["train", "--recipe", "tiny", "--budget", "12steps", "--device", "cpu", *SMALL, "--set", "optim.lr=1e8"]


def tinyelectra(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=env, capture_output=True, text=True,
                          timeout=900)


def the_error_line(p: subprocess.CompletedProcess) -> str:
    """Exit code 3 (a diverged run), one `error:` line and it is the last one, no traceback."""
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert p.returncode == 3, (p.returncode, p.stderr[-3000:])
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in p.stderr, p.stderr[-3000:]
    return errors[0]


def strict_json_lines(path: Path) -> list[dict]:
    """metrics.jsonl as strict JSON: a NaN or Infinity token is an error."""
    def refuse(token):
        raise AssertionError(f"{path}: {token} in the log")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines() if line.strip()]


def all_finite(safetensors_file: Path) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(str(safetensors_file)).values())


@pytest.fixture(scope="module")
def diverged(cli_env, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("diverged") / "run"
    return run, tinyelectra([*DIVERGING, "--out", str(run)], cli_env)


@pytest.mark.cli
@pytest.mark.slow
def test_a_diverging_pretraining_run_stops_with_one_line_and_keeps_only_finite_weights(diverged):
    run, p = diverged
    line = the_error_line(p)
    assert "training diverged" in line and "loss is nan" in line, line
    assert "--set optim.lr=5e+07" in line, line  # half the peak: the command to type
    # what it names as kept is there, and every checkpoint and resume state on disk holds finite weights
    kept = [d for d in run.iterdir() if d.name.startswith("ckpt-")]
    assert kept and all(d.name in line for d in kept), (line, kept)
    for ckpt in kept:
        assert all_finite(ckpt / "discriminator.safetensors") and all_finite(ckpt / "generator.safetensors"), ckpt
    states = sorted((run / "state").glob("step-*"))
    assert states and all(all_finite(s / "model.safetensors") for s in states)
    assert (run / "state" / (run / "state" / "LATEST").read_text().strip()).name in line
    assert not (run / "summary.json").exists()  # no "finished" summary
    records = strict_json_lines(run / "metrics.jsonl")  # no NaN logged, in a step or a checkpoint's evaluation
    assert records[-1]["event"] == "diverged" and records[-1]["message"] == line.removeprefix("error: ")


@pytest.mark.cli
def test_the_suggested_command_continues_with_half_the_learning_rate(diverged):
    """From the last resume state (tests/test_resume_changes.py runs it)."""
    run, p = diverged
    words = shlex.split(the_error_line(p).split("half the peak, and continue from the resume state at step ", 1)[1]
                        .split(" with it: ", 1)[1].split(" (or start over", 1)[0])
    assert words[:2] == ["tinyelectra", "train"] and "--resume" in words and "--force" not in words
    assert words[words.index("--out") + 1] == str(run)
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert [s for s in sets if s.startswith("optim.lr")] == ["optim.lr=5e+07"]  # the old one replaced, not repeated


@pytest.mark.cli
@pytest.mark.slow
def test_a_diverging_fine_tuning_run_stops_with_one_line(diverged, tmp_path, cli_env):
    """Fine-tuning the run's first checkpoint (finite weights, kept) at learning rate 1e8: one line naming the task,
    seed and the --set to type; no glue.json for the diverged seed."""
    run, _ = diverged
    glue_dir = tmp_path / "glue" / "SST-2"
    glue_dir.mkdir(parents=True)
    rows = "".join(f"{'a good film' if i % 2 else 'a bad film'} number {i}\t{i % 2}\n" for i in range(64))
    for split in ("train", "dev"):
        (glue_dir / f"{split}.tsv").write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    out = tmp_path / "out"
    p = tinyelectra(["glue", "--checkpoint", str(run / "ckpt-0625"), "--glue-dir", str(glue_dir.parent), "--tasks",
                     "sst2", "--seeds", "1", "--device", "cpu", "--set", "finetune.lr=1e8", "--out", str(out)], cli_env)
    line = the_error_line(p)
    assert "fine-tuning diverged on sst2, seed 0" in line and "loss is nan" in line, line
    assert "--set finetune.lr=5e+07" in line, line
    assert not list(out.rglob("glue.json"))  # its only seed diverged: no result (before: NaN scores, exit 0)

