"""A diverged run continued at a lower learning rate instead of started over: the Diverged line prints
`tinyelectra train ... --resume --set optim.lr=X`, which continues from the last resume state with the new peak
learning rate (the schedule's shape and steps unchanged) and records the change in plan.json, summary.json,
metrics.jsonl and the report. `optim.lr` and `optim.clip_norm` are the only settings a --resume may change; any other
change is refused, leaving the run as it was. (Before, --resume refused every change: the line offered only --force,
losing the steps done, or --init in a new run directory.)

The runtime settings (config.RUNTIME_SETTINGS: the micro-batch, gradient checkpointing, compile, the update,
deterministic kernels, how often a resume state is written) change how the steps are computed, not what: a --resume
may change them at any step, recorded apart (`resumed_with_runtime_changes`), and the report does not call such a run
another recipe's. A step that runs out of memory says how to continue with half the micro-batch. (Before, --resume
refused them too: the out-of-memory line offered only --force, losing the steps done.)

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


def follow(line: str, pattern: str, setting: str, original: Path, run: Path) -> list[str]:
    """The command an error line suggests (`pattern`'s group; checked: `tinyelectra train`, --resume, no --force, the
    run's --out, the `--set` `setting`), for a copy of the run in `run`: its words after `tinyelectra`."""
    found = re.search(pattern, line)
    assert found, line
    words = shlex.split(found.group(1))
    assert words[:2] == ["tinyelectra", "train"] and "--resume" in words and "--force" not in words
    assert words[words.index("--out") + 1] == str(original)
    assert [w for w in words if w.startswith(setting.split("=")[0] + "=")] == [setting]
    shutil.copytree(original, run)
    words[words.index("--out") + 1] = str(run)
    return words[1:]


def suggested_command(line: str, original: Path, run: Path, lr: str) -> list[str]:
    """The command the Diverged line prints (half the peak learning rate in place of the old one), for a copy of the
    run in `run` and learning rate `lr` (half of 1e8 would diverge too)."""
    words = follow(line, r"continue from the resume state at step 1 with it: (tinyelectra .*?) \(or start over",
                   "optim.lr=5e+07", original, run)
    words[words.index("optim.lr=5e+07")] = f"optim.lr={lr}"
    return words


@pytest.fixture(scope="module")
def resumed(diverged, cli_env, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("resumed") / "run"
    return run, ok(tinyelectra(suggested_command(diverged[1], diverged[0], run, "0.001"), cli_env))


@pytest.mark.slow
@pytest.mark.cli
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
@pytest.mark.cli
def test_the_clipping_norm_may_change_on_resume_too(diverged, resumed, cli_env, tmp_path):
    """Recorded beside the learning rate, and in effect: the weights differ from the run resumed with the learning
    rate alone (clip 1.0)."""
    run = tmp_path / "run"
    ok(tinyelectra([*suggested_command(diverged[1], diverged[0], run, "0.001"), "--set", "optim.clip_norm=0.5"],
                   cli_env))
    assert json.loads((run / "summary.json").read_text())["resumed_with_changes"] == [
        {"step": 1, "key": "optim.clip_norm", "old": 1.0, "new": 0.5},
        {"step": 1, "key": "optim.lr", "old": 1e8, "new": 0.001}]
    a, b = weights(run / "ckpt-10000"), weights(resumed[0] / "ckpt-10000")
    assert not all(torch.equal(a[k], b[k]) for k in b)


REFUSED = {  # what a --resume must not change: the model, the objective, the batch, the schedule, Adam's constants,
    # and the train settings that are not runtime ones (config.RUNTIME_SETTINGS says why)
    "model.hidden_size=64": "model.hidden_size", "objective.disc_weight=10": "objective.disc_weight",
    "train.batch_size=4": "train.batch_size", "train.seq_len=64": "train.seq_len", "train.steps=5": "train.steps",
    "optim.beta2=0.99": "optim.beta2", "optim.warmup_steps=3": "optim.warmup_steps",
    "train.precision=bf16": "train.precision", "train.seed=1": "train.seed",
    "train.log_every_steps=5": "train.log_every_steps", "train.eval_rows=16": "train.eval_rows",
}
MAY_CHANGE = ("may change only optim.lr and optim.clip_norm, and how the steps are computed: train.micro_batch_size, "
              "train.grad_checkpointing, train.compile, train.update, train.deterministic, train.resume_every_seconds, "
              "train.sampler, train.attention, train.weight_copy")


@pytest.mark.parametrize("setting", list(REFUSED))
@pytest.mark.cli
def test_any_other_change_on_resume_is_refused(setting, diverged, cli_env, tmp_path, monkeypatch, capsys):
    """One line naming the setting and those that may change; the run directory is left exactly as it was. A runtime
    change in the same command lets nothing else through."""
    from tinyelectra import cli

    run = tmp_path / "run"
    shutil.copytree(diverged[0], run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    monkeypatch.setenv("TINYELECTRA_CACHE", cli_env["TINYELECTRA_CACHE"])
    monkeypatch.setattr(sys, "argv", ["tinyelectra", *ARGS, "--out", str(run), "--resume", "--set", "optim.lr=0.001",
                                      "--set", "train.micro_batch_size=4", "--set", setting])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: --resume: "), err
    assert REFUSED[setting] in err[0] and MAY_CHANGE in err[0], err[0]
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.cli
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


@pytest.mark.cli
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


# --- runtime settings: how the steps are computed, not what (config.RUNTIME_SETTINGS) --------------------------------

# every step's losses in metrics.jsonl; at the learning rate tiny had when the losses below were measured (1e-4):
# at tiny's 3e-3 two runs with other random draws drift apart faster (1.3% at step 9), which says nothing about resuming
LOGGED = [*ARGS, "--set", "train.log_every_steps=1", "--set", "optim.lr=1e-4"]
# The real command line, whose 8th step runs out of memory (the CPU allocator's own error), as a GPU's might: the last
# resume state is the one after ckpt-5000, at step 6 (checkpoints after steps 1, 2, 3, 6 and 12).
OUT_OF_MEMORY_AT_STEP_8 = """
import torch
import tinyelectra.train as train
from tinyelectra.cli import main

real_mask_step = train.mask_step

def mask_step(batch, recipe, special, step, *rest):
    if step == 7:  # the steps done so far: the 8th is being computed
        torch.empty(2**60, dtype=torch.uint8)
    return real_mask_step(batch, recipe, special, step, *rest)

train.mask_step = mask_step
main()
"""


@pytest.fixture(scope="module")
def unchanged(cli_env, tmp_path_factory) -> Path:
    """The run as the recipe has it, never stopped: 12 steps, the whole batch of 8 in one micro-batch."""
    run = tmp_path_factory.mktemp("unchanged") / "run"
    ok(tinyelectra([*LOGGED, "--out", str(run)], cli_env))
    return run


@pytest.fixture(scope="module")
def out_of_memory(cli_env, tmp_path_factory) -> tuple[Path, str]:
    """The same run, stopped by an out-of-memory error in its 8th step. Returns the run and its error line."""
    run = tmp_path_factory.mktemp("out_of_memory") / "run"
    p = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY_AT_STEP_8, *LOGGED, "--out", str(run)], env=cli_env,
                       capture_output=True, text=True, timeout=900)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and err[-1].startswith("error: a training step of 8 sequences"), p.stderr[-3000:]
    return run, err[-1]


def continue_after_out_of_memory(line: str, original: Path, run: Path) -> list[str]:
    """The command the out-of-memory line ends with: half the micro-batch, from the resume state."""
    return follow(line, r"; continue from the resume state with half the micro-batch: (tinyelectra .*)$",
                  "train.micro_batch_size=4", original, run)


def logged(run: Path) -> dict[int, dict]:
    """Each logged step's record without its timings (`train_seconds`, `tokens_per_second`, ...)."""
    return {r["step"]: {k: v for k, v in r.items() if "second" not in k} for r in records(run) if "event" not in r}


@pytest.mark.slow
@pytest.mark.cli
def test_out_of_memory_continues_from_the_resume_state_with_half_the_micro_batch(out_of_memory, unchanged, cli_env,
                                                                                  tmp_path):
    original, line = out_of_memory
    assert "does not fit in CPU memory (tried to allocate 1,073,741,824.0 GiB) after step 7" in line
    assert f"saved: resume state at step 6 ({original / 'state'}" in line
    run = tmp_path / "run"
    p = ok(tinyelectra(continue_after_out_of_memory(line, original, run), cli_env))
    assert "resumed from step 6" in p.stderr and "1 process(es) x 2 micro-batch(es) of 4" in p.stderr
    assert ("resumed with changed runtime settings: train.micro_batch_size 0 -> 4 at step 6; still the recipe's run"
            in p.stderr)
    change = [{"step": 6, "key": "train.micro_batch_size", "old": 0, "new": 4}]  # 0: the recipe's "the whole batch"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["resumed_with_runtime_changes"] == change
    assert summary["resumed_with_changes"] == []
    assert json.loads((run / "plan.json").read_text())["resumed_with_runtime_changes"] == change
    assert [r for r in records(run) if r.get("event", "").startswith("resumed")] == [
        {"event": "resumed_with_runtime_changes", "step": 6, "changes": change}]

    # the steps before the resume state are the unchanged run's; after it, the same rows (the data cursor carried on),
    # each step's losses of the same global batch. Not bit for bit: each micro-batch draws its masks, samples and
    # dropout from its own seed (train.step_seed: seed, step, first row), so two micro-batches of 4 draw other ones
    # than one of 8. Measured on this run: at most 0.26% (generator) and 0.18% (discriminator) apart, where the
    # summation order alone (the same draws, 8 rows as one micro-batch or two) moves the loss and gradients by ~1e-7
    # relative (test_objective.py's test_combine_over_micro_batches_equals_one_batch checks that part).
    a, b = logged(run), logged(unchanged)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    assert all(a[s] == b[s] for s in range(1, 7))
    assert [a[s]["tokens_seen"] for s in a] == [b[s]["tokens_seen"] for s in b]
    for s in range(7, 13):
        for loss in ("gen_loss", "disc_loss"):
            assert a[s][loss] != b[s][loss] and a[s][loss] == pytest.approx(b[s][loss], rel=0.01), (s, loss)

    ok(tinyelectra(["report", str(run)], cli_env))  # the report: a runtime change, not another recipe's run
    report = (run / "report.md").read_text()
    assert "NOT THE RECIPE'S RUN" not in report
    assert ("runtime settings changed on --resume (train.micro_batch_size 0 -> 4 at step 6; summary.json): still the "
            "recipe's run, computed another way (a changed micro-batch or compile mode also draws other "
            "masks") in report


@pytest.mark.slow
@pytest.mark.cli
def test_runtime_changes_that_keep_the_draws_continue_bit_identical(out_of_memory, unchanged, cli_env, tmp_path):
    """Gradient checkpointing (the out-of-memory line's other way on), compile off, kernels not forced deterministic
    and a longer interval between resume states: every logged loss and every checkpoint's weights are the unchanged
    run's, bit for bit (CPU, fp32: measured, no tolerance needed)."""
    run = tmp_path / "run"
    words = continue_after_out_of_memory(out_of_memory[1], out_of_memory[0], run)
    words[words.index("train.micro_batch_size=4")] = "train.grad_checkpointing=true"
    ok(tinyelectra([*words, "--set", "train.compile=off", "--set", "train.deterministic=false",
                    "--set", "train.resume_every_seconds=600"], cli_env))
    assert json.loads((run / "summary.json").read_text())["resumed_with_runtime_changes"] == [
        {"step": 6, "key": key, "old": old, "new": new} for key, old, new in [
            ("train.compile", "auto", "off"), ("train.deterministic", True, False),
            ("train.grad_checkpointing", False, True), ("train.resume_every_seconds", 300.0, 600.0)]]
    loss = lambda r: {s: (x["gen_loss"], x["disc_loss"]) for s, x in logged(r).items()}  # noqa: E731
    assert loss(run) == loss(unchanged) and max(loss(run)) == 12
    for name in CKPTS:
        a, b = weights(run / name), weights(unchanged / name)
        assert all(torch.equal(a[k], b[k]) for k in b), name


def test_the_out_of_memory_line_says_how_to_go_on(tmp_path):
    """Half the micro-batch, else gradient checkpointing, from the resume state; a run without one is run again; a
    smaller model is another run."""
    from tinyelectra.config import load_recipe
    from tinyelectra.runstate import _out_of_memory_next

    run, tiny = tmp_path / "my run", load_recipe("tiny")
    command = f"tinyelectra train --recipe tiny --set train.micro_batch_size=8 --out '{run}' --force"
    assert _out_of_memory_next(command, run, tiny, 8, resumable=True) == (
        f"; continue from the resume state with half the micro-batch: tinyelectra train --recipe tiny --out '{run}' "
        "--resume --set train.micro_batch_size=4")
    assert _out_of_memory_next(command, run, tiny, 1, resumable=False) == (
        f"; run it again with gradient checkpointing: tinyelectra train --recipe tiny --set train.micro_batch_size=8 "
        f"--out '{run}' --set train.grad_checkpointing=true")
    checkpointing = load_recipe("tiny", ["train.grad_checkpointing=true"])
    assert _out_of_memory_next(command, run, checkpointing, 1, resumable=True) == (
        "; a smaller model is another run: start over with --force (or choose another --out)")
    assert _out_of_memory_next(command, run, checkpointing, None, resumable=False) == ""


@pytest.mark.slow
def test_the_flat_update_continues_a_per_tensor_run_from_its_resume_state(out_of_memory, unchanged, cli_env, tmp_path):
    """train.update=flat (optim.FlatUpdate) is a runtime setting: a run whose resume state the per-tensor update wrote
    continues with the flat buffers (the state's format is the same, copied into them), the same rows and draws; the
    steps before the resume state are the unchanged run's bit for bit, the ones after it equal to float rounding (the
    two updates round differently: tests/test_optim.py bounds it), far inside the 1% a changed micro-batch moves
    them."""
    run = tmp_path / "run"
    words = continue_after_out_of_memory(out_of_memory[1], out_of_memory[0], run)
    words[words.index("train.micro_batch_size=4")] = "train.update=flat"
    p = ok(tinyelectra(words, cli_env))
    assert "update: flat" in p.stderr
    assert json.loads((run / "summary.json").read_text())["resumed_with_runtime_changes"] == [
        {"step": 6, "key": "train.update", "old": "per-tensor", "new": "flat"}]
    a, b = logged(run), logged(unchanged)
    assert all(a[s] == b[s] for s in range(1, 7)) and sorted(a) == list(range(1, 13))
    for s in range(7, 13):
        for loss in ("gen_loss", "disc_loss"):
            assert a[s][loss] == pytest.approx(b[s][loss], rel=1e-4), (s, loss)
