"""What a person sees (issue 11, point 6): the progress display keeps its step counter and ETA in narrow terminals
(80 and 110 columns), never shows a placeholder total, and logs written to a file are not wrapped mid-sentence."""

from __future__ import annotations

import io
import itertools

import pytest
from rich.console import Console

from tinyelectra.budget import make_plan, parse_budget
from tinyelectra.config import load_recipe
from tinyelectra.logs import Log, Progress, make_console

RECORD = {"gen_loss": 6.123, "disc_loss": 0.4567, "gen_acc": 0.123, "disc_acc": 0.876, "lr": 1.23e-4,
          "tokens_per_second": 12345.0}


def rendered(progress: Progress, width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None, record=True)
    console.print(progress.bar.get_renderable())
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 110])
def test_step_counter_and_eta_survive_a_narrow_terminal(width):
    plan = make_plan(parse_budget("123456steps"), load_recipe("tiny"))
    clock = iter(float(t) for t in range(0, 10**6, 10)).__next__  # 10 s per reading
    progress = Progress(plan, 0, main=True, clock=clock, console=Console(file=io.StringIO(), width=width))
    progress.update(61_728, RECORD)
    lines = rendered(progress, width)
    assert all(len(line) <= width for line in lines), lines
    bar = lines[0]
    assert "train 61,728/123,456" in bar and "end " in bar and "next ckpt" in bar, lines
    info = " ".join(lines[1:])  # the losses wrap onto the next lines, whole
    for piece in ("loss g 6.123", "d 0.4567", "lr 1.23e-04", "12,345 tok/s"):
        assert piece in info, (piece, lines)


def test_no_placeholder_total_before_the_speed_is_measured():
    plan = make_plan(parse_budget("2m"), load_recipe("tiny"))
    progress = Progress(plan, 0, main=True, console=Console(file=io.StringIO(), width=80))
    progress.update(3, RECORD)
    text = "\n".join(rendered(progress, 80))
    assert "train 3/?" in text and "measuring the speed" in text
    assert "4611686018427387904" not in text and "4,611,686" not in text


def test_file_logs_are_not_wrapped(tmp_path, capsys):
    """stderr redirected to a file (here: captured): a long note and a plain progress line stay one line each."""
    assert not make_console().is_terminal
    long_note = "a note that goes on " * 20  # 400 characters
    log = Log(tmp_path, main=True)
    log.once(long_note)
    plan = make_plan(parse_budget("1000steps"), load_recipe("tiny"))
    Progress(plan, 0, main=True).update(10, RECORD)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].rstrip() == ("· " + long_note).rstrip()
    assert lines[1].startswith("step 10/1,000 | end ") and "12,345 tok/s" in lines[1]
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "metrics.jsonl").exists()  # nothing written yet


def test_eta_follows_the_recent_speed_not_the_start_up():
    """The H100 run printed "end 0:17:20" at step 50 of a 217 s budget: 12 s of first-step compiling and graph
    capture were counted as training speed. With 50 s of start-up then 50 steps a second, 850 steps are 17 s away."""
    plan = make_plan(parse_budget("1000steps"), load_recipe("tiny"))
    times = itertools.chain([0.0, 50.0, 51.0, 52.0], itertools.repeat(53.0))  # the start, then per update
    progress = Progress(plan, 0, main=True, clock=times.__next__, console=Console(file=io.StringIO(), width=110))
    for step in (50, 100, 150):
        progress.update(step, RECORD)
    rate_since_start = 150 / 53.0  # what the old ETA used: 2.8 steps/s, 5 minutes for the last 850 steps
    assert (plan.total_steps - 150) / rate_since_start > 290
    eta = progress._eta(150)
    assert eta.startswith("end 0:00:17"), eta  # 850 steps at (150 - 50) / (52 - 50) = 50 steps/s


@pytest.mark.parametrize("step,stopped_in,listed", [
    # a stop on a fraction checkpoint's step (ckpt-0625 of 16 steps is step 1): that checkpoint, listed once
    (1, "ckpt-0625", "ckpt-0000@0 (initial weights), ckpt-0625@1 (where it stopped)"),
    # between fractions: its own checkpoint, 3/16 = 18.75% of the schedule
    (3, "ckpt-1875", "ckpt-0000@0 (initial weights), ckpt-0625@1, ckpt-1250@2, ckpt-1875@3 (where it stopped)"),
])
def test_the_closing_report_lists_each_checkpoint_once(tmp_path, capsys, step, stopped_in, listed):
    """The FLOPs report's checkpoints row: the initial weights, the fraction checkpoints, the stop's; a stop that
    fell on a fraction checkpoint's step wrote no other (runstate.write_stop_checkpoint), and the row once said
    "ckpt-0625@1, ckpt-0625@1 (where it stopped)"."""
    plan = make_plan(parse_budget("16steps"), load_recipe("tiny"))
    fractions = [n for n, at in plan.checkpoint_steps.items() if at <= step]
    stop = {"step": step, "why": f"--stop-after {step}steps", "fraction_of_schedule": step / 16, "lr": 1e-4,
            "checkpoint": stopped_in}
    summary = {"steps": step, "tokens_seen": 1000 * step, "stopped": stop, "train_flops_paper": 1e9,
               "train_flops_hardware": 1e9, "budget_seconds": None, "train_seconds": 1.0,
               "excluded_seconds": {"checkpoints_eval_state": 1.0}, "checkpoints": fractions,
               "checkpoint_steps": {n: plan.checkpoint_steps[n] for n in fractions}, "initial_checkpoint": "ckpt-0000",
               "median_tokens_per_second": None, "host_sync_per_step": "", "peak_gpu_memory_gib": None}
    Log(tmp_path, main=True).summary(summary, plan, [])
    row = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("│ checkpoints "))
    assert row.split("│")[2].strip() == listed
