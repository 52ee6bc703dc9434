"""Time budgets under a changing speed (issue 11): the plan is re-planned from the measured speed, the five fraction
checkpoints each get their own step, plan.json ends up equal to what happened, the warm-up is not fixed by one noisy
measurement, and the log says when the speed moves a lot.

No test here depends on how fast this machine is: the planner is driven by simulated step times, and the run
through the command line uses a simulated clock (tinyelectra.train.train's `clock`) advanced by the steps themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tinyelectra.budget import (
    FRACTIONS, TimeBudgetPlanner, checkpoint_name, checkpoint_schedule, make_plan, parse_budget, warmup_for,
)
from tinyelectra.checkpoint import due_checkpoints
from tinyelectra.config import load_recipe

CKPTS = [checkpoint_name(f) for f in FRACTIONS]
SMALL = ["--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32"]


def simulate(seconds_per_step, budget: str = "40s", recipe: str = "tiny"):
    """The trainer's loop without the model: step 1 is start-up (not timed), then every step takes
    `seconds_per_step(step)` of training time. Returns (plan, {checkpoint: step}, training seconds, log lines,
    the first plan's warm-up)."""
    r = load_recipe(recipe)
    bud = parse_budget(budget)
    plan = make_plan(bud, r)
    step, seconds, done, lines, first_warmup = 1, 0.0, {}, [], None
    planner = TimeBudgetPlanner(bud, r, plan, step)
    while not plan.finished(step):
        step += 1
        seconds += seconds_per_step(step)
        replanned = planner.after_step(step, seconds, set(done))
        if replanned is not None:
            lines += replanned
            plan = planner.plan
            first_warmup = plan.warmup_steps if first_warmup is None else first_warmup
        for name in due_checkpoints(plan, step, set(done)):
            done[name] = step
            plan.checkpoint_steps[name] = step
        assert step < 100_000, "the run never ended"
    return plan, done, seconds, lines, first_warmup


def assert_true_plan(plan, done: dict[str, int], steps_end: int) -> None:
    assert list(done) == CKPTS
    steps = list(done.values())
    assert steps == sorted(steps) and len(set(steps)) == 5, steps  # five distinct steps, in fraction order
    assert plan.checkpoint_steps == done  # the plan says where the checkpoints are
    assert plan.total_steps == steps_end == done["ckpt-10000"]


def test_steady_speed_puts_checkpoints_at_their_fractions():
    plan, done, seconds, lines, _ = simulate(lambda step: 0.25)
    assert_true_plan(plan, done, plan.total_steps)
    assert abs(seconds - 40.0) <= 0.25  # the budget, to within one step
    assert 155 <= plan.total_steps <= 162  # 4 steps/s x 40 s after the start-up step
    for name, fraction in zip(CKPTS, FRACTIONS):
        assert abs(done[name] - fraction * plan.total_steps) <= 1, (name, done[name])
    assert not any("speed changed" in line for line in lines)
    assert any("does not reproduce" in line for line in lines)  # said once, at the first measurement


@pytest.mark.parametrize("slow_from_step", [12, 30, 60])
def test_slowdown_keeps_five_distinct_checkpoints_and_a_true_plan(slow_from_step):
    """4 steps/s, then 4x slower from `slow_from_step` on (the issue's busy machine): the end is re-planned, no two
    checkpoints share a step, the budget still holds to within one slow step, and the log says the speed changed."""
    plan, done, seconds, lines, _ = simulate(lambda step: 0.25 if step < slow_from_step else 1.0)
    assert_true_plan(plan, done, plan.total_steps)
    assert abs(seconds - 40.0) <= 1.0
    assert any(line.startswith("speed changed from 4 to") for line in lines), lines
    assert any(n.startswith("speed changed") for n in plan.notes)  # plan.json tells it too


def test_speedup_keeps_five_distinct_checkpoints():
    plan, done, seconds, lines, _ = simulate(lambda step: 1.0 if step < 15 else 0.2)
    assert_true_plan(plan, done, plan.total_steps)
    assert abs(seconds - 40.0) <= 1.0
    assert any(line.startswith("speed changed") for line in lines)


def test_a_stall_at_the_end_stretches_the_run_rather_than_doubling_checkpoints():
    """From 90% of the budget on a step takes 60 s: the checkpoints still to write each get their own step; the log
    says the run takes more steps than fit, and why."""
    plan, done, seconds, lines, _ = simulate(lambda step: 0.25 if step < 10 else 60.0, budget="10s")
    assert_true_plan(plan, done, plan.total_steps)
    assert any("so that each checkpoint has its own step" in line for line in lines), lines


def test_a_noisy_first_measurement_does_not_fix_the_warm_up():
    """The first timed steps run 20x slow (a busy moment), then the machine is quiet: the warm-up planned from that
    first measurement is re-planned while it lasts, to what the whole run's length asks for."""
    slow_first = lambda step: 5.0 if step <= 6 else 0.25  # noqa: E731
    plan, done, seconds, lines, first_warmup = simulate(slow_first, budget="120s")
    assert first_warmup < 0.5 * plan.warmup_steps  # the noisy start planned a short run and a short warm-up
    wanted = warmup_for(load_recipe("tiny"), plan.total_steps)  # what the run's real length asks for
    assert abs(plan.warmup_steps - wanted) <= 0.05 * wanted, (plan.warmup_steps, wanted)
    assert any("re-planned while it lasted" in n for n in plan.notes)
    assert_true_plan(plan, done, plan.total_steps)


def test_slow_steps_are_measured_soon_enough_for_the_first_checkpoint():
    """4 s per step in a 120 s budget (the quick start on a busy machine): the speed is known after two timed steps,
    so the 6.25% checkpoint lands near 6.25% of the run, not after the five-step measurement (a quarter of it)."""
    plan, done, seconds, lines, _ = simulate(lambda step: 4.0, budget="120s")
    assert_true_plan(plan, done, plan.total_steps)
    assert 30 <= plan.total_steps <= 32 and done["ckpt-0625"] <= 3, (plan.total_steps, done)


def test_checkpoint_schedule_gives_each_checkpoint_its_own_step():
    assert checkpoint_schedule(1_000_000) == {"ckpt-0625": 62_500, "ckpt-1250": 125_000, "ckpt-2500": 250_000,
                                              "ckpt-5000": 500_000, "ckpt-10000": 1_000_000}
    for total in range(5, 200):
        steps = list(checkpoint_schedule(total).values())
        assert len(set(steps)) == 5 and steps == sorted(steps) and steps[-1] == total, (total, steps)
    assert list(checkpoint_schedule(3).values()) == [1, 1, 1, 2, 3]  # fewer than five steps: some share ...
    assert any("at least five steps" in n for n in make_plan(parse_budget("3steps"), load_recipe("tiny")).notes)  # ... said
    # written checkpoints stay; the rest follow the new end, each after the last written one
    assert checkpoint_schedule(40, {"ckpt-0625": 10, "ckpt-1250": 20, "ckpt-2500": 38}) == {
        "ckpt-0625": 10, "ckpt-1250": 20, "ckpt-2500": 38, "ckpt-5000": 39, "ckpt-10000": 40}


def test_a_provisional_plan_has_no_placeholder_numbers():
    plan = make_plan(parse_budget("2m"), load_recipe("tiny"))
    assert plan.status == "provisional" and plan.total_steps is None and plan.checkpoint_steps == {}
    assert plan.expected_tokens is None and plan.train_flops_paper is None
    assert "4611686018427387904" not in json.dumps(plan.to_dict(), indent=2)
    assert due_checkpoints(plan, 3, set()) == [] and not plan.finished(10**9)


# ---------------------------------------------------------------------------------------------------------------
# through the command line, with a simulated clock

SIMULATED_CLOCK = """
import functools, json, os, sys
import tinyelectra.train as t
SPEEDS = json.loads(os.environ["SIM_SECONDS_PER_STEP"])  # [[last step, seconds per step], ...]
now, steps = [0.0], [0]
real_update = t.Engine.update
def update(self):
    real_update(self)
    steps[0] += 1
    now[0] += next((sec for last, sec in SPEEDS if steps[0] <= last), SPEEDS[-1][1])
t.Engine.update = update
t.train = functools.partial(t.train, clock=lambda: now[0])
from tinyelectra.cli import main
sys.argv = ["tinyelectra"] + sys.argv[1:]
main()
"""


@pytest.mark.slow
def test_time_budget_run_whose_speed_drops_mid_run(tmp_path, cli_env):
    """`train --budget 24s` where the first 24 steps take 0.25 s and every later one 1 s of (simulated) training
    time: five fraction checkpoints on five distinct steps, plan.json equal to what happened (its checkpoint steps
    are those saved, its total the steps run), the run ends on budget with the learning rate at zero, and the log
    names the change of speed."""
    run = tmp_path / "run"
    env = dict(cli_env, SIM_SECONDS_PER_STEP=json.dumps([[24, 0.25], [10**9, 1.0]]))
    p = subprocess.run([sys.executable, "-c", SIMULATED_CLOCK, "train", "--recipe", "tiny", "--budget", "24s",
                        "--device", "cpu", *SMALL, "--out", str(run)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    plan = json.loads((run / "plan.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    saved = {n: json.loads((run / n / "meta.json").read_text())["step"] for n in CKPTS}
    assert len(set(saved.values())) == 5 and list(saved.values()) == sorted(saved.values()), saved
    assert plan["checkpoint_steps"] == saved == summary["checkpoint_steps"]
    assert plan["status"] == "final" and plan["total_steps"] == summary["steps"] == saved["ckpt-10000"]
    assert abs(summary["train_seconds"] - 24.0) <= 1.0 and summary["final_lr"] == 0.0
    assert "speed changed from 4 to" in p.stderr and any(n.startswith("speed changed") for n in plan["notes"])
    assert "does not reproduce" in p.stderr
