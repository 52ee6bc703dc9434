"""A run stopped where the paper's checkpoints are (issue 34): `--stop-after` ends a run of any schedule early,
cleanly and resumably, with the schedule left as --budget planned it, so a `--budget paper` run stopped at step N
has the paper's learning rate there (lr * min(1, N / warm-up) * (1 - N / total), computed here); plan.json,
summary.json and the log say what the schedule is and where (and why) the run stopped; the stop leaves a checkpoint
of its weights; `--resume` continues it bit-identically to a run never stopped. `--initial-checkpoint` writes
ckpt-0000, the run's own weights at step 0 (the no-pre-training control), equal to the recipe's initial weights.

Runs go through the real command line on the built-in corpus with a smaller-than-tiny model; the time stop is driven
by a simulated clock (tinyelectra.train.train's `clock`), so no test depends on this machine's speed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from tinyelectra.budget import parse_budget, parse_stop, stop_checkpoint_name
from tinyelectra.config import load_recipe
from tinyelectra.errors import UserError

from test_interruptions import metrics_lines, same_weights, weights

SMALL = ["--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32",
         "--set", "train.deterministic=true", "--set", "train.log_every_steps=3"]
TINY = ["train", "--recipe", "tiny", "--device", "cpu", *SMALL]


def paper_lr(step: int, peak: float, warmup: int, total: int) -> float:
    """The paper's schedule (REFERENCE.md, the official optimization.py): warm-up and linear decay at once."""
    return peak * min(1.0, step / warmup) * (1.0 - step / total)


def test_stop_after_takes_a_step_count_or_a_time_and_nothing_else():
    assert (parse_stop("62500steps").kind, parse_stop("62500steps").value) == ("steps", 62_500)
    assert (parse_stop("6h").kind, parse_stop("6h").value) == ("time", 6 * 3600)
    assert parse_stop("1h30m").value == 5400
    for bad, said in (("paper", "a step count or a time"), ("1.4e18flops", "a step count or a time"),
                      ("0steps", "must be positive"), ("soon", "not understood"), ("2.5steps", "whole number")):
        with pytest.raises(UserError, match=said):
            parse_stop(bad)


STOP_FORMS = "(a step count or a time: e.g. 62500steps, 1Msteps, 6h, 90m)"
BUDGET_FORMS = "(e.g. 4d, 36h, 90m, 45s, 1.4e18flops, 62500steps, 1Msteps or paper)"


@pytest.mark.parametrize("text,budget_line,stop_line", [
    ("0steps", f"budget '0steps' must be positive {BUDGET_FORMS}",
     f"--stop-after: '0steps' must be positive {STOP_FORMS}"),
    (" -1h ", f"budget '-1h' must be positive {BUDGET_FORMS}", f"--stop-after: '-1h' must be positive {STOP_FORMS}"),
    ("2.5steps", "budget '2.5steps': a step count must be a whole number",
     f"--stop-after: '2.5steps': a step count must be a whole number {STOP_FORMS}"),
    ("1e400flops", f"budget '1e400flops' is not a finite number {BUDGET_FORMS}",
     f"--stop-after: '1e400flops' is not a finite number {STOP_FORMS}"),
    ("2e15steps", f"budget '2e15steps': more than 1e+15 steps {BUDGET_FORMS}",
     f"--stop-after: '2e15steps': more than 1e+15 steps {STOP_FORMS}"),
    # the value is quoted whole, whatever it holds (a stop's line once cut it at " (e.g.")
    ("6 (e.g. h", f"budget '6 (e.g. h' is not understood {BUDGET_FORMS}",
     f"--stop-after: '6 (e.g. h' is not understood {STOP_FORMS}"),
])
def test_a_budget_and_a_stop_read_alike_each_saying_what_is_wrong_in_its_own_words(text, budget_line, stop_line):
    """--budget and --stop-after share one reading of a value (budget.parse_budget, parse_stop): the same fault named
    the same way, each line with its own option's examples (--budget's none for a step count that is not whole)."""
    for parse, line in ((parse_budget, budget_line), (parse_stop, stop_line)):
        with pytest.raises(UserError) as e:
            parse(text)
        assert str(e.value) == line


def test_a_stop_checkpoint_is_named_by_its_share_of_the_schedule_never_as_another():
    assert stop_checkpoint_name(40_000, 1_000_000) == "ckpt-0400"  # 4% of the paper's schedule
    assert stop_checkpoint_name(62_550, 1_000_000) == "ckpt-0624"  # ckpt-0625 is the fraction checkpoint's name
    assert stop_checkpoint_name(3, 1_000_000) == "ckpt-0001"  # ckpt-0000 is the initial weights
    assert stop_checkpoint_name(999_999, 1_000_000) == "ckpt-9999"
    assert stop_checkpoint_name(5, 12) == "ckpt-4166"


def tinyelectra(args: list[str], env: dict, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=env, capture_output=True, text=True,
                       timeout=900)
    if check:
        assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    return p


@pytest.mark.slow
def test_a_paper_schedule_stops_at_the_step_asked_with_the_papers_learning_rate(cli_env, tmp_path):
    """`--budget paper --stop-after 8steps` (tiny's schedule: 10,000 steps, warm-up 1,000): exit 0 after step 8,
    summary.json `stopped` at step 8 with the formula's learning rate there, each logged step's rate the formula's,
    plan.json keeping the paper's schedule and saying where this command stops, the log saying both, a checkpoint of
    the weights where it stopped (ckpt-0008: 0.08% of the schedule), and ckpt-0000 the recipe's initial weights."""
    run = tmp_path / "run"
    p = tinyelectra([*TINY, "--budget", "paper", "--stop-after", "8steps", "--initial-checkpoint", "--out", str(run)],
                    cli_env)
    r = load_recipe("tiny")
    peak, warmup, total = r.optim.lr, r.optim.warmup_steps, r.train.steps
    summary, plan = json.loads((run / "summary.json").read_text()), json.loads((run / "plan.json").read_text())
    assert (plan["total_steps"], plan["warmup_steps"]) == (total, warmup) == (10_000, 1_000)  # the schedule stays
    assert summary["status"] == "stopped" and summary["steps"] == 8
    assert summary["schedule"]["total_steps"] == total and summary["schedule"]["warmup_steps"] == warmup
    stopped = summary["stopped"]
    assert stopped["step"] == 8 and stopped["why"] == "--stop-after 8steps" and stopped["checkpoint"] == "ckpt-0008"
    assert stopped["lr"] == pytest.approx(paper_lr(8, peak, warmup, total), rel=1e-12)
    assert summary["final_lr"] == pytest.approx(paper_lr(8, peak, warmup, total), rel=1e-12)
    assert stopped["fraction_of_schedule"] == 8 / total and plan["stopped"] == [stopped]
    assert plan["stop"] == [{"after": "8steps", "kind": "steps", "step": 8, "fraction_of_schedule": 8 / total,
                             "lr": pytest.approx(paper_lr(8, peak, warmup, total), rel=1e-12)}]
    logged = [x for x in metrics_lines(run) if "event" not in x]
    assert [x["step"] for x in logged] == [3, 6]  # nothing logged beyond the stop, no partial window
    for x in logged:  # the rate the step ran with: the formula at the step before it
        assert x["lr"] == pytest.approx(paper_lr(x["step"] - 1, peak, warmup, total), rel=1e-12)
    meta = json.loads((run / "ckpt-0008" / "meta.json").read_text())
    assert meta["step"] == 8 and meta["stopped_by"] == "--stop-after 8steps" and meta["fraction"] == 8 / total
    assert not [c for c in ("ckpt-0625", "ckpt-10000") if (run / c).exists()]
    assert re.search(r"this command stops\s*│ after step 8 \(0\.08% of the schedule, learning rate 2\.4e-05\)",
                     p.stderr)
    line = next(x for x in p.stderr.splitlines() if x.startswith("· stopped by --stop-after 8steps at step 8"))
    assert "0.08% of the schedule (10,000 steps, warm-up 1,000, --budget paper" in line
    assert "--stop-after" not in line.split("continue with: ")[1].split(" (with another")[0]
    assert line.split("continue with: ")[1].split(" (with another")[0].endswith(f"--out {run} --resume")

    # ckpt-0000: the weights the run started from, the recipe's initial draw (its seed), untrained
    from tinyelectra.model import Electra

    data = json.loads((run / "dataset.json").read_text())
    recipe = load_recipe("tiny", ["model.num_layers=2", f"model.vocab_size={data['vocab_size']}"])
    torch.manual_seed(recipe.train.seed)
    fresh = Electra(recipe.model, "electra")
    saved = weights(run / "ckpt-0000")
    expected = {**{f"discriminator/{k}": v for k, v in fresh.discriminator_state_dict().items()},
                **{f"generator/{k}": v for k, v in fresh.generator_state_dict().items()}}
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)
    assert summary["initial_checkpoint"] == "ckpt-0000"
    assert json.loads((run / "ckpt-0000" / "meta.json").read_text())["step"] == 0
    assert summary["data_repetition"]["passes"] == pytest.approx(8 * 8 / summary["data_repetition"]["train_rows"])

    # again with the same --stop-after: nothing to do; past the schedule's end: one line, nothing written
    again = tinyelectra([*TINY, "--budget", "paper", "--stop-after", "8steps", "--out", str(run), "--resume"], cli_env)
    assert "already past --stop-after 8steps: nothing to do" in again.stderr
    past = tinyelectra([*TINY, "--budget", "20steps", "--stop-after", "30steps", "--out", str(tmp_path / "past")],
                       cli_env, check=False)
    assert past.returncode == 2 and past.stderr.strip().splitlines()[-1].startswith("error: --stop-after 30steps: "
                                                                                   "after the end of the 20-step")
    assert not (tmp_path / "past").exists()


@pytest.mark.slow
def test_stopped_and_resumed_is_the_uninterrupted_run(cli_env, tmp_path):
    """`--budget 12steps --stop-after 5steps` (inside a log window of 3 steps), then `--resume` without a stop: the
    same metrics.jsonl lines as the run never stopped (the stop's checkpoint event aside), line by line, and
    bit-identical fraction checkpoints; the stop's own checkpoint is ckpt-4166 (5 / 12 of the schedule)."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    tinyelectra([*TINY, "--budget", "12steps", "--out", str(ref)], cli_env)
    p = tinyelectra([*TINY, "--budget", "12steps", "--stop-after", "5steps", "--out", str(run)], cli_env)
    assert "stopped by --stop-after 5steps at step 5, 41.67% of the schedule" in p.stderr
    assert json.loads((run / "summary.json").read_text())["stopped"]["checkpoint"] == "ckpt-4166"
    assert (run / "ckpt-4166").is_dir() and not (run / "ckpt-5000").exists()
    tinyelectra([*TINY, "--budget", "12steps", "--out", str(run), "--resume"], cli_env)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["stopped"] is None and summary["final_lr"] == 0.0
    assert [s["step"] for s in summary["stops"]] == [5]
    mine = [x for x in metrics_lines(run) if x.get("name") != "ckpt-4166"]
    assert mine == metrics_lines(ref)  # line by line: losses, rates, tokens, checkpoint evaluations
    for name in ("ckpt-0625", "ckpt-1250", "ckpt-2500", "ckpt-5000", "ckpt-10000"):
        assert same_weights(run / name, ref / name), name


@pytest.mark.slow
def test_a_stop_on_a_fraction_checkpoint_keeps_it_and_names_it_once(cli_env, tmp_path):
    """`--budget 16steps --stop-after 1steps`: step 1 is 6.25% of the schedule, so the stop's checkpoint is ckpt-0625,
    written once; the stop line lists it once (it said "checkpoints ckpt-0625; checkpoint ckpt-0625")."""
    run = tmp_path / "run"
    p = tinyelectra([*TINY, "--budget", "16steps", "--stop-after", "1steps", "--out", str(run)], cli_env)
    assert json.loads((run / "summary.json").read_text())["stopped"]["checkpoint"] == "ckpt-0625"
    line = next(x for x in p.stderr.splitlines() if x.startswith("· stopped by --stop-after 1steps at step 1"))
    said = " ".join(line.split()).split("continue with:")[0]
    assert said.count("ckpt-0625") == 1 and "checkpoints ckpt-0625 (the last where it stopped)" in said


SIMULATED_CLOCK = """
import functools, json, os, sys
import tinyelectra.train as t
now = [0.0]
real_update = t.Engine.update
def update(self):
    real_update(self)
    now[0] += 0.25  # every optimizer update takes a quarter of a (simulated) second
t.Engine.update = update
t.train = functools.partial(t.train, clock=lambda: now[0])
from tinyelectra.cli import main
sys.argv = ["tinyelectra"] + sys.argv[1:]
main()
"""


@pytest.mark.slow
def test_a_time_stop_ends_after_the_step_that_reaches_it_and_resumes(cli_env, tmp_path):
    """`--budget paper --stop-after 2s --stop-after 100steps` at 0.25 s a step (simulated): the time is reached
    first, after step 8 (2 s of this command); the log and summary.json name the time stop; `--resume
    --stop-after 10steps` continues to step 10 as the run that never stopped does."""
    run, ref = tmp_path / "run", tmp_path / "ref"
    p = subprocess.run([sys.executable, "-c", SIMULATED_CLOCK, *TINY, "--budget", "paper", "--stop-after", "2s",
                        "--stop-after", "100steps", "--out", str(run)], env=cli_env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"]["why"] == "--stop-after 2s" and summary["steps"] == 8
    plan = json.loads((run / "plan.json").read_text())
    assert [s["kind"] for s in plan["stop"]] == ["time", "steps"] and plan["stop"][0]["seconds"] == 2.0
    assert "after 2 s of this command (start-up included) or after step 100" in p.stderr
    tinyelectra([*TINY, "--budget", "paper", "--stop-after", "10steps", "--out", str(run), "--resume"], cli_env)
    tinyelectra([*TINY, "--budget", "paper", "--stop-after", "10steps", "--out", str(ref)], cli_env)
    assert [x for x in metrics_lines(run) if x.get("name") != "ckpt-0008"] == metrics_lines(ref)
    assert same_weights(run / "ckpt-0010", ref / "ckpt-0010")
