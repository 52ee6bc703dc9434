"""The GPU suite behind benchmarks/gpu_suite.sh: the paper's first point in one lease, as two prepared commands run
back to back on the same warm machine, each under its own deadline and each leaving three files.

    python -m benchmarks.gpu_check.suite run [--cpu-smoke] [--lease DIR] [--out DIR] [--work DIR]  # the first command
    python -m benchmarks.gpu_check.suite run --finish [--cpu-smoke] [--out DIR] [--work DIR]      # the second command
    python -m benchmarks.gpu_check.suite summary DIR                        # the table again, from an archive

The first (RUN, 560 s): unpack (the pack from --lease), env (machine, measured ceilings), checks (a training step,
SDPA gradients per backend), parity (fail fast: eager vs CUDA-graph training losses, benchmarks/loss_check.py, on a
2-layer model so that its cold compile is short), speed (tinyelectra's step with the shapes and compile mode
`pretrain` uses: its cold compile fills the inductor cache `pretrain` then reads, so the same shapes never compile
cold twice), pretrain (`tinyelectra train --recipe electra-small --budget paper`: the paper's own 1M-step schedule,
stopped with --stop-after at its 6.25% checkpoint, step 62,500, when it gets there within the time left, else where
that time ends; with --initial-checkpoint, so that `ckpt-0000`, the no-pre-training side of GLUE, is the run's own
initial weights). It leaves its run in the work folder (default .lease-run/, git-ignored, not carried: it stays on
the warm machine between commands) with run.json, its summary: the schedule, where and why the run stopped, which
share of the paper's point it reached, and how often it saw the pack's tokens.

The second (--finish, 280 s) finds that run (or says in one line that it is not there) and runs first glue (the full
training sets of CoLA, SST-2, MRPC, STS-B and RTE, the paper's protocol, 3 seeds, the last checkpoint and `ckpt-0000`
side by side in one process; CoLA again at the released code's learning rate when the whole plan fits with it) with
all the time the deadline leaves. Before it starts, its plan is checked against that
time on its critical path (benchmarks/gpu_check/glue_fit.py: the jobs round-robin in one process, at the steps/s
measured on the H100 for each number of jobs in flight), the cap on jobs in flight set to the one the model finds
fastest, and when it does not fit it is trimmed in a stated order (the longest task's seeds first, a task dropped last),
said in one line and in finish.json (glue_fit). Its layout is the default (DEFAULT_LAYOUT: the fastest the H100
measured), so no measurement sits before it. Then, with time left: glue_early (a checkpoint at a quarter of the run,
fitted the same way), glue_fp32 (bf16 fine-tuning checked against fp32 on three tasks), the extras (transformers
compiled with CUDA graphs, tinyelectra vs transformers eager, fp16) and glue_speed (fine-tuning steps/s per layout:
processes x jobs in flight, for the next lease's default). Its table gives each side's seeds that answered one class,
the two sides compared by one rule (tinyelectra.metrics.compare_seeds) and the verdict against the paper, computed
(metrics.verdict_against_anchors).

Every stage is a process (or, for glue, the processes of its layout) under its own time limit, recorded whatever
happens. --cpu-smoke runs both commands at toy size on the CPU (one thread per process, compile stages with
inductor's aot_eager backend, fp16 as fp32, static steps instead of CUDA graphs, its own generous limits), from a
toy pack it builds (pack.py build --smoke) unless --lease names one. SUITE_ONLY=a,b runs only those stages;
SUITE_BUDGET_<STAGE>=s and SUITE_DEADLINE_S=s override the limits (tests); SUITE_WORK names the work folder;
SUITE_GLUE_LAYOUT=[Px]MODE:K forces glue's layout; SUITE_GIT_COMMIT names the commit without .git.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks import ROOT, child_env
from benchmarks.gpu_check import glue_fit  # the GLUE plan against its time

WORK_DEFAULT = ROOT / ".lease-run"  # git-ignored, never carried: the first command's run waits here for the second
WORK_MARK = ".tinyelectra-suite"  # a work folder the suite made (and may empty for a new run)

# ---------------------------------------------------------------------------------------------------------------
# The protocol: the recipe pre-trained, and how GLUE is run on it.
# ---------------------------------------------------------------------------------------------------------------

# `pretrain` trains the recipe with CUDA graphs (what train.compile=auto picks on one CUDA device with one micro-batch),
# named explicitly so that the speed stage compiles exactly the same step. The smoke run: one layer of the tiny recipe,
# rows of 32 tokens (its pack's), a few rows per batch and per evaluation.
PRETRAIN = {"gpu": {"recipe": "electra-small", "sets": ("train.compile=reduce-overhead",)},
            "smoke": {"recipe": "tiny", "sets": ("model.num_layers=1", "train.seq_len=32", "train.batch_size=8",
                                                 "train.eval_rows=32", "train.log_every_steps=5",
                                                 "train.compile=reduce-overhead")}}
PAPER_POINT_STEPS = 62_500  # the paper's 6.25% checkpoint of ELECTRA-Small: 62,500 steps of 128 x 128 (Table 1)
POINT_SHARE = 0.0625  # `pretrain` stops at this share of its recipe's schedule (the smoke run: 625 of tiny's 10,000)
# GLUE on the pack's tasks, both sides in the same processes: the full training sets, the paper's protocol
# (tinyelectra glue's defaults), 3 seeds (the paper used more; medians and spreads are reported), bf16 autocast
# (weights and optimizer fp32; fp32 is checked against it on three tasks when time allows: glue_fp32), no test-set
# predictions (the pack holds no test sets). The smoke run: 16 rows per task, fixed-shape steps without CUDA graphs.
GLUE = {"gpu": {"seeds": 3, "max_train_rows": None, "settings": ("precision=bf16", "test_predictions=false")},
        "smoke": {"seeds": 3, "max_train_rows": 16,
                  "settings": ("precision=fp32", "test_predictions=false", "step=static")}}
GLUE_FP32_TASKS = ("cola", "mrpc", "rte")  # the small tasks: about 7,000 steps in true fp32 (TF32 off)
# the glue stage's second learning rate (`glue --released-lr`: the released code's 1e-4, weight decay 0.01), when the
# whole plan fits with it (glue_fit.fit_with_extras; always on the smoke run): CoLA predicted one class at 3e-4
RELEASED_LR_TASKS = ("cola",)
EARLY_CHECKPOINT = "ckpt-2500"  # glue_early: a quarter of the run
# glue_speed: the layouts measured ([P processes x] step mode : jobs in flight per process), after the GLUE stages: it
# tells the next lease's default. The processes split the seeds, so P divides GLUE's seeds.
# the likeliest first: a stopped stage keeps them
GLUE_LAYOUTS = {"gpu": "graphs:32,3xgraphs:10,graphs:8,graphs:1,eager:1",
                "smoke": "static:4,3xstatic:2,static:1,eager:1"}
DEFAULT_LAYOUT = {"gpu": "graphs:32", "smoke": "static:4"}  # glue's layout (glue_speed runs after it)
DEFAULT_WHY = {"gpu": "the default: the fastest of the five layouts glue_speed measured on the H100 on 2026-11-26 "
                      "(graphs:32 275 steps/s; graphs:8 269, 3xgraphs:10 237, graphs:1 144, eager:1 33: "
                      "benchmarks/results/h100-2026-11-26/)",
               "smoke": "the smoke run's default"}


def pretrain_recipe(mode: str, data_dir: Path):
    """The recipe `pretrain` runs on `data_dir`, its vocabulary taken from the data as `tinyelectra train` does."""
    from tinyelectra.config import load_recipe  # noqa: PLC0415
    from tinyelectra.train import adopt_data_vocab  # noqa: PLC0415

    sets = list(PRETRAIN[mode]["sets"])
    return adopt_data_vocab(load_recipe(PRETRAIN[mode]["recipe"], sets), Path(data_dir), sets, [])


def glue_args(mode: str, checkpoint: Path, glue_dir: Path, tasks: list[str], out: Path, device: list[str],
              seeds: int | None = None, extra: tuple[str, ...] = (), task_seeds: dict[str, int] | None = None,
              released: list[str] = ()) -> list[str]:
    """`tinyelectra glue` arguments of the protocol (`device`: ["--gpu", "0"] or ["--device", "cpu"]); `extra`
    settings go after the protocol's (a layout's step mode and jobs in flight, a seed, fp32); `task_seeds`: tasks
    trimmed to fewer seeds (glue_fit); `released`: tasks also fine-tuned with the released code's learning rate."""
    g = GLUE[mode]
    rows = ["--max-train-rows", str(g["max_train_rows"])] if g["max_train_rows"] else []
    fewer = ["--task-seeds", ",".join(f"{t}={n}" for t, n in task_seeds.items())] if task_seeds else []
    second = ["--released-lr", ",".join(released)] if released else []
    return ["glue", "--checkpoint", str(checkpoint), "--glue-dir", str(glue_dir), "--tasks", ",".join(tasks),
            "--seeds", str(seeds or g["seeds"]), *fewer, *second, *rows, "--out", str(out), *device,
            *(a for s in (*g["settings"], *extra) for a in ("--set", s))]


def glue_plan(train_rows: dict[str, int], seeds: int, checkpoints: int, batch_size: int = 32) -> dict:
    """The steps GLUE takes on these training sets: per task the rows (MRPC and STS-B doubled by their swapped pairs),
    epochs (the paper's: 3, 10 for RTE and STS-B), steps per epoch and per seed (finetune.plan_steps), jobs
    (checkpoints x seeds) and steps; the totals."""
    from tinyelectra.finetune import FinetuneConfig, plan_steps  # noqa: PLC0415
    from tinyelectra.glue_data import get_task  # noqa: PLC0415

    fc = FinetuneConfig(batch_size=batch_size)
    tasks = {}
    for task, rows in train_rows.items():
        n = rows * (2 if get_task(task).swap_pairs else 1)
        per_epoch, steps = plan_steps(n, fc.batch_size, fc.task_epochs(task))
        tasks[task] = {"rows_in_file": rows, "train_rows": n, "epochs": fc.task_epochs(task),
                       "steps_per_epoch": per_epoch,
                       "steps_per_seed": steps, "jobs": seeds * checkpoints, "steps": steps * seeds * checkpoints}
    return {"tasks": tasks, "seeds": seeds, "checkpoints": checkpoints, "jobs": sum(t["jobs"] for t in tasks.values()),
            "steps": sum(t["steps"] for t in tasks.values())}


def parse_layout(text: str) -> dict:
    """`[Px]MODE:K` -> {"layout", "processes", "mode", "concurrent"} (device_checks.parse_layout, without torch)."""
    m = re.fullmatch(r"(?:(\d+)x)?(eager|static|graphs):(\d+)", text.strip())
    if not m or int(m.group(3)) < 1 or int(m.group(1) or 1) < 1:
        raise ValueError(f"layout {text!r}: expected [Px]MODE:K, e.g. graphs:8 or 3xgraphs:10")
    return {"layout": text.strip(), "processes": int(m.group(1) or 1), "mode": m.group(2),
            "concurrent": int(m.group(3))}


def pick_layout(measured: dict | None, seeds: int, mode: str, forced: str | None = None) -> dict:
    """The layout glue runs: `forced` (SUITE_GLUE_LAYOUT), else the glue_speed stage's fastest whose processes divide
    the seeds (when it ran before), else DEFAULT_LAYOUT; with the measured aggregate steps/s and why it was picked."""
    if forced:
        return {**parse_layout(forced), "steps_per_second": None, "why": f"SUITE_GLUE_LAYOUT={forced}"}
    fits = [r for r in (measured or {}).get("layouts", []) if seeds % r.get("processes", 1) == 0
            and r.get("steps_per_second")]
    if not fits:
        return {**parse_layout(DEFAULT_LAYOUT[mode]), "steps_per_second": None,
                "why": DEFAULT_WHY[mode]}
    best = max(fits, key=lambda r: r["steps_per_second"])
    others = ", ".join(f"{r['layout']} {r['steps_per_second']:.0f}" for r in fits if r is not best)
    return {**parse_layout(best["layout"]), "steps_per_second": best["steps_per_second"],
            "why": f"fastest measured: {best['steps_per_second']:.0f} steps/s (others: {others or 'none'})"}


# ---------------------------------------------------------------------------------------------------------------
# The plans: each command's stages in order of value, with their GPU budgets (seconds).
# ---------------------------------------------------------------------------------------------------------------

FIXED, REMAINDER, TIME_LEFT = "fixed", "remainder", "time left"
# stage -> (GPU budget s, kind): "fixed" stages run under their budget; the "remainder" stage gets what the fixed
# stages leave of the deadline (more when they finish early); "time left" stages run only when time is left, under at
# most their budget.
PLANS = {
    "run": {"deadline_s": 560, "stages": {
        "unpack": (20, FIXED),  # measured 3.3 s on the H200's machine
        "env": (30, FIXED),  # 7.4 s
        "checks": (40, FIXED),  # 19.5 s
        "parity": (95, FIXED),  # a 2-layer model's cold compiles with CUDA graphs: 70.0 s on the H100 (limit was 80)
        "speed": (200, FIXED),  # the cold compile with CUDA graphs: 112.5 s on the H200, 148.3 s on the H100, then the
        # timing and profile: the stage took 170.0 s of its old 170 on the H100
        "pretrain": (None, REMAINDER),
    }},
    "finish": {"deadline_s": 280, "stages": {
        "glue": (None, REMAINDER),  # first, all the deadline leaves: its plan is fitted to it (glue_fit.py)
        "glue_early": (120, TIME_LEFT),
        "glue_fp32": (90, TIME_LEFT),
        "hf_compiled": (170, TIME_LEFT),
        "eager": (60, TIME_LEFT),  # 47.5 s measured
        "fp16": (170, TIME_LEFT),
        "glue_speed": (60, TIME_LEFT),  # 60.2 s on the H100 (five layouts; graphs:32's set-up alone 19.7 s)
    }},
}
SUMMARY_RESERVE_S = {"gpu": 15, "smoke": 300}  # a stopped stage's 10 s of grace, the summary and the archive
DEADLINE_SMOKE_S = 3600
MIN_STAGE_S = 10  # a stage with less time left is skipped
SMOKE_STAGE_S = 900  # every smoke stage's own limit: a loaded 2-core CPU, not a GPU's minutes
KILL_GRACE_S = 10  # between a stage's SIGTERM at its limit and SIGKILL
# `pretrain`'s time outside training: start-up (imports, data, the compile from the inductor cache the speed stage
# filled, the CUDA-graph recording, ckpt-0000 and its held-out evaluation, the first step), then after the stop the
# step running, the stop's checkpoint with its held-out evaluation, the resume state, summary.json and exit. Measured
# with five checkpoints: 20.7 s of stage time around 242 s of training on the H200 (default compile mode), 34.6 s
# around 217 s with CUDA graphs on the H100 (summary.json: pretrain.overhead_s). The --stop-after time counts the
# command's own time, start-up included: the stage's limit less STOP_MARGIN_S, the time after the stop. Generous on
# purpose: a stage stopped at its limit has written no checkpoint where it stopped, and GLUE would have none.
PRETRAIN_STARTUP_S = 35
STOP_MARGIN_S = 20
PRETRAIN_OVERHEAD_S = PRETRAIN_STARTUP_S + STOP_MARGIN_S
MIN_TRAIN_S = 20
# the smoke run's time stop, there so that both --stop-after kinds are passed as on a card: as late as its stage's
# limit allows (625 steps of the toy model take seconds; a loaded CPU may take minutes, and a test asserts the step
# stop came first)
SMOKE_STOP_S = SMOKE_STAGE_S - STOP_MARGIN_S
EXPECTED_TOKENS_PER_S = (1.4e6, 2.5e6)  # measured with CUDA graphs on the H200 (throughput.py), and the goal


def gpu_plan(command: str) -> dict:
    """A command's GPU budgets added up: the fixed stages, the remainder stage and the summary's reserve; "time left"
    stages plan no time of their own."""
    plan = PLANS[command]
    fixed = sum(b for b, kind in plan["stages"].values() if kind == FIXED)
    reserve = SUMMARY_RESERVE_S["gpu"]
    rest = plan["deadline_s"] - reserve - fixed
    stages = {s: rest if kind == REMAINDER else (b if kind == FIXED else 0) for s, (b, kind) in plan["stages"].items()}
    out = {"stages": stages, "summary_reserve_s": reserve, "total_s": fixed + rest + reserve, "remainder_s": rest}
    if command == "run":
        out["pretrain_train_s"] = rest - PRETRAIN_OVERHEAD_S
    return out


def pretrain_stops(left_s: float, steps_per_second: float | None) -> tuple[int, list[str], str]:
    """(stage limit, --stop-after values, why) for a GPU `pretrain` of the paper's schedule starting `left_s` seconds
    before the deadline: the stage gets all but the summary's reserve; the run stops at the paper's 6.25% checkpoint
    (step 62,500) or STOP_MARGIN_S before the stage's limit, whichever comes first; `why` says which the speed
    stage's rate expects."""
    stage = int(left_s - SUMMARY_RESERVE_S["gpu"])
    stop_s = max(stage - STOP_MARGIN_S, MIN_TRAIN_S)
    train_s = max(stop_s - PRETRAIN_STARTUP_S, 0)
    stops = [f"{PAPER_POINT_STEPS}steps", f"{stop_s}s"]
    if not steps_per_second:
        return stage, stops, (f"the paper's 62,500 steps or {stop_s} s, whichever first (the speed stage measured no "
                              "rate)")
    fit = steps_per_second * train_s
    if fit >= PAPER_POINT_STEPS:
        return stage, stops, (f"the speed stage's {steps_per_second:.0f} steps/s reach the paper's "
                              f"{PAPER_POINT_STEPS:,} steps in about {PAPER_POINT_STEPS / steps_per_second:.0f} s of "
                              f"the {train_s} s of training")
    return stage, stops, (f"about {fit:,.0f} steps fit in {train_s} s of training at the speed stage's "
                          f"{steps_per_second:.0f} steps/s: {fit / PAPER_POINT_STEPS:.0%} of the paper's "
                          f"{PAPER_POINT_STEPS:,}; it stops after {stop_s} s")


# ---------------------------------------------------------------------------------------------------------------
# What each stage runs, on the GPU and (toy sizes) on the CPU.
# ---------------------------------------------------------------------------------------------------------------

SIZES = {
    "gpu": {"device": ["--device", "cuda"], "train_device": ["--gpu", "0"], "model": ["--recipe", "electra-small"],
            "batch": "128", "seq_len": "128", "fp16": "fp16", "parity": [
                "--steps", "20", "--set", "model.num_layers=2"],
            "timing": ["--rounds", "8", "--warmup", "2", "--calls-per-round", "20"], "profile": ["--profile", "2"],
            "glue_speed": ["--device", "cuda", "--precision", "bf16", "--width", "128", "--seconds", "2"]},
    "smoke": {"device": ["--device", "cpu", "--threads", "1"], "train_device": ["--device", "cpu"],
              "model": ["--recipe", "tiny", "--set", "model.num_layers=1"], "batch": "2", "seq_len": "16",
              "fp16": "fp32",
              "parity": ["--steps", "3"], "profile": ["--profile", "2"],
              "timing": ["--rounds", "2", "--warmup", "1", "--calls-per-round", "2", "--no-memory"],
              "glue_speed": ["--device", "cpu", "--precision", "fp32", "--width", "32", "--seconds", "0.5",
                             "--threads", "1"]},
}


def _module(name: str) -> list[str]:
    """`-m benchmarks.NAME`: a stage runs a benchmark as a module (the checkout is on its PYTHONPATH: Run.env)."""
    return ["-m", f"benchmarks.{name}"]


def _step(run: "Run", *extra: str, precision: str = "bf16") -> list[str]:
    z = SIZES[run.mode]
    return [*z["device"], *z["model"], "--batch", z["batch"], "--seq-len", z["seq_len"], "--precision", precision,
            *extra, "--out-dir", str(run.stage_dir)]


def _throughput(run: "Run", name: str, compile_mode: str, sides: str, profile: bool = False, **step) -> list[str]:
    z = SIZES[run.mode]
    return [run.python, *_module("throughput"), *_step(run, "--compile", compile_mode, "--sides", sides, *z["timing"],
                                                          *(z["profile"] if profile else []), **step), "--name", name]


def _checkpoints(run_dir: Path) -> list[Path]:
    """A run's checkpoints after step 0 that are complete (config.json is written last), by fraction: the fraction
    checkpoints and the one where a --stop-after stopped it (ckpt-0000, the initial weights, is not among them)."""
    found = [p for p in run_dir.glob("ckpt-*") if re.fullmatch(r"ckpt-\d{4,5}", p.name) and p.name != "ckpt-0000"
             and (p / "config.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def compile_mode(run: "Run") -> str:
    """The mode the speed stage and pretrain compile with: CUDA graphs, unless the parity stage found that the graphs
    do not compute the eager step (loss_check.py exit code 1): then inductor's default mode, said so."""
    parity = run.record_of("parity")
    if parity and parity.get("status") == "failed" and parity.get("rc") == 1:
        return "on"
    return "reduce-overhead"


def stage_parity(run: "Run") -> list[str]:
    z = SIZES[run.mode]
    return [run.python, *_module("loss_check"), *_step(run, "--compile", "reduce-overhead", *z["parity"]),
            "--name", "parity"]


def stage_speed(run: "Run") -> list[str]:
    mode = compile_mode(run)
    if mode != "reduce-overhead":
        run.note("speed", "no CUDA graphs: the parity stage found that they do not compute the eager step")
    return _throughput(run, "speed", mode, "tinyelectra", profile=True)


def why_eager(speed: dict, train_s: int | None) -> str | None:
    """Why `pretrain` should run eager (train.compile=off), from the speed stage's tinyelectra side, or None.
    Compilation failed there or never finished; or (`train_s` given: the GPU) its cold compile took longer than
    pretrain's training budget. pretrain compiles the same graph (tests/test_gpu_suite.py) and finds it in the
    inductor cache the speed stage filled; should that ever miss, it would compile cold inside its own limit, and
    a compile longer than the training budget would leave it little time to train or to write its checkpoints."""
    if not speed.get("compiled"):
        return ("compilation did not work in the speed stage "
                f"({speed.get('compile_note') or 'the speed stage did not finish'})")
    cold = speed.get("first_call_s")
    if train_s is not None and cold is not None and cold > train_s:
        return (f"the speed stage's cold compile took {cold:.0f} s, more than pretrain's {train_s} s of training "
                "(a miss of its inductor cache would be compiled again inside pretrain's limit)")
    return None


def point_steps(mode: str) -> int:
    """The step `pretrain` stops at when time allows: POINT_SHARE of its recipe's schedule (the GPU: the paper's
    62,500 of 1M)."""
    from tinyelectra.config import load_recipe  # noqa: PLC0415

    return round(POINT_SHARE * load_recipe(PRETRAIN[mode]["recipe"], list(PRETRAIN[mode]["sets"])).train.steps)


def stage_pretrain(run: "Run") -> list[str] | str:
    if not (run.pack / "pretrain" / "manifest.json").is_file():
        return "no unpacked pre-training data (the unpack stage did not finish)"
    z, p = SIZES[run.mode], PRETRAIN[run.mode]
    speed = _get(_load(run.stage_dir / "speed.json"), "tinyelectra") or {}
    mode = compile_mode(run)
    sets = [s for s in p["sets"] if not s.startswith("train.compile=")] + [f"train.compile={mode}"]
    if run.mode == "gpu":
        tokens_per_step = int(z["batch"]) * int(z["seq_len"])
        rate = speed["tokens_per_s"] / tokens_per_step if speed.get("tokens_per_s") else None
        limit, stops, why = pretrain_stops(run.left(), rate)
        if limit < MIN_STAGE_S + MIN_TRAIN_S:
            return f"too little time left: {limit} s"
        run.limits["pretrain"] = limit
        train_s = int(stops[1][:-1]) - PRETRAIN_STARTUP_S
    else:
        stops, why, train_s = [f"{point_steps(run.mode)}steps", f"{SMOKE_STOP_S}s"], "the smoke run's toy point", None
    run.note("pretrain", f"--budget paper --stop-after {' --stop-after '.join(stops)}: {why}")
    if why := why_eager(speed, train_s):
        sets.append("train.compile=off")
        run.note("pretrain", f"eager: {why}")
    return [run.python, "-m", "tinyelectra", "train", "--recipe", p["recipe"], "--data", str(run.pack / "pretrain"),
            "--budget", "paper", *(a for stop in stops for a in ("--stop-after", stop)), "--initial-checkpoint",
            *z["train_device"], "--out", str(run.work / "pretrain"), *(a for s in sets for a in ("--set", s))]


def initial_checkpoint(run: "Run") -> Path:
    """ckpt-0000, the no-pre-training side of GLUE: the pre-training run's own initial weights
    (--initial-checkpoint)."""
    return run.work / "pretrain" / "ckpt-0000"


def _glue_tasks(run: "Run") -> list[str]:
    return list((_load(run.pack / "pack.json") or {}).get("glue", {}).get("tasks", {}))


def _selection(run: "Run", name: str, checkpoints: list[Path]) -> Path:
    """WORK/NAME: links to the checkpoints one `tinyelectra glue` fine-tunes side by side (a run folder to it)."""
    folder = run.work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for c in checkpoints:
        (folder / c.name).symlink_to(c.resolve(), target_is_directory=True)
    return folder


def fit_glue(run: "Run", stage: str, layout: dict, tasks: list[str], checkpoints: int, precision: str,
             released: tuple[str, ...] = ()) -> dict | str:
    """The stage's plan against its time limit (glue_fit.fit: the critical path of its jobs at the rates measured on
    the H100; `released`: tasks whose second learning rate runs only when the whole plan fits with it), or why it is
    not modeled (the CPU smoke run, a layout of several processes or without CUDA graphs, fp32, a pack without row
    counts). Trimmed plans are said in the stage's note."""
    if run.mode != "gpu":
        return "not modeled on the CPU smoke run (the rates are the H100's)"
    if layout["processes"] != 1 or layout["mode"] != "graphs" or precision != "bf16":
        return (f"not modeled for {layout['layout']} in {precision} (the rates are one process's with CUDA graphs in "
                "bf16)")
    rows = {t: _get(_load(run.pack / "pack.json"), "glue", "tasks", t, "train_rows") for t in tasks}
    if not all(rows.values()):
        return "not modeled (the pack does not give every task's training rows)"
    steps = {t: v["steps_per_seed"] for t, v in glue_plan(rows, 1, 1)["tasks"].items()}
    extras = {f"{t} (released lr)": steps[t] for t in released if t in steps}
    return glue_fit.fit_with_extras(steps, extras, GLUE[run.mode]["seeds"], checkpoints, run.budget(stage)[0] or 0)


def _glue_layout_commands(run: "Run", stage: str, checkpoint: Path, tasks: list[str], out: Path,
                          extra: tuple[str, ...] = (), checkpoints: int = 1,
                          released: tuple[str, ...] = ()) -> list[list[str]] | str:
    """The processes of the picked layout: one `tinyelectra glue` with every seed, or one per share of the seeds;
    on the GPU fitted to the stage's time first (fit_glue): the cap on jobs in flight the model finds fastest, and
    the trimmed tasks and seeds when the whole plan does not fit (or why the stage cannot run at all)."""
    seeds = GLUE[run.mode]["seeds"]
    layout = run.layout or pick_layout(_load(run.stage_dir / "glue_speed.json"), seeds, run.mode,
                                       os.environ.get("SUITE_GLUE_LAYOUT"))
    run.layout = layout
    precision = next((s.split("=")[1] for s in reversed((*GLUE[run.mode]["settings"], *extra))
                      if s.startswith("precision=")), "")
    released = tuple(t for t in released if t in tasks)
    fit = fit_glue(run, stage, layout, tasks, checkpoints, precision, released)
    run.glue_fits[stage] = fit if isinstance(fit, dict) else {"modeled": False, "why": fit}
    concurrent, task_seeds = layout["concurrent"], None
    if isinstance(fit, dict):
        if not fit["fits"]:
            return f"does not fit its {fit['available_s']:.0f} s: {glue_fit.describe(fit)}"
        released = tuple(t for t in released if f"{t} (released lr)" in fit["extras"])
        tasks = [t for t in tasks if t in fit["seeds"]]
        task_seeds = {t: n for t, n in fit["seeds"].items() if n != seeds} or None
        concurrent = fit["concurrent"]
    elif run.mode == "gpu":
        released = ()  # not modeled: no time known to allow it
    per = seeds // layout["processes"]
    mode_sets = (f"step={layout['mode']}", f"concurrent={concurrent}")
    device = SIZES[run.mode]["train_device"]
    commands = []
    for p in range(layout["processes"]):
        seed_sets = (f"seed={p * per}",) if layout["processes"] > 1 else ()
        commands.append([run.python, "-m", "tinyelectra",
                         *glue_args(run.mode, checkpoint, run.pack / "glue", tasks, out / f"p{p}", device, per,
                                    (*mode_sets, *seed_sets, *extra), task_seeds, list(released))])
    run.note(stage, f"layout {layout['layout']} ({layout['why']})")
    run.note(stage, f"plan: {glue_fit.describe(fit)}" if isinstance(fit, dict) else f"plan {fit}")
    if isinstance(fit, dict) and fit["trims"]:
        run.say(f"[suite] {stage}: TRIMMED to fit its {fit['available_s']:.0f} s: {', '.join(fit['trims'])} "
                f"(the whole plan: modeled {fit['full_plan']['seconds']:.0f} s, over {fit['budget_s']:.0f} s)")
    return commands


def stage_glue(run: "Run") -> list[list[str]] | str:
    tasks = _glue_tasks(run)
    if not tasks:
        return "no unpacked GLUE tasks"
    found = _checkpoints(run.work / "pretrain")
    init = initial_checkpoint(run)
    sides = ([found[-1]] if found else []) + ([init] if (init / "config.json").is_file() else [])
    if not sides:
        return "no checkpoint: pretrain wrote none"
    if not found:
        run.note("glue", "no pre-trained checkpoint (pretrain wrote none after step 0): the no-pre-training side alone")
    else:
        run.note("glue", f"GLUE on {found[-1].name}, the run's last checkpoint")
    if init not in sides:
        run.note("glue", "no ckpt-0000 (pretrain did not write its initial weights): the pre-trained side alone")
    return _glue_layout_commands(run, "glue", _selection(run, "glue-models", sides), tasks, run.work / "glue",
                                 checkpoints=len(sides), released=RELEASED_LR_TASKS)


def stage_glue_early(run: "Run") -> list[list[str]] | str:
    tasks = _glue_tasks(run)
    found = [p.name for p in _checkpoints(run.work / "pretrain")]
    if EARLY_CHECKPOINT not in found:
        return f"no {EARLY_CHECKPOINT}"
    if found[-1] == EARLY_CHECKPOINT:
        return f"{EARLY_CHECKPOINT} is the run's last checkpoint: the glue stage ran on it"
    return _glue_layout_commands(run, "glue_early", run.work / "pretrain" / EARLY_CHECKPOINT, tasks,
                                 run.work / "glue-early")


def stage_glue_fp32(run: "Run") -> list[list[str]] | str:
    found = _checkpoints(run.work / "pretrain")
    if not found:
        return "no pre-trained checkpoint"
    tasks = [t for t in GLUE_FP32_TASKS if t in _glue_tasks(run)]
    return _glue_layout_commands(run, "glue_fp32", found[-1], tasks, run.work / "glue-fp32", ("precision=fp32",))


def stage_glue_speed(run: "Run") -> list[str] | str:
    init = initial_checkpoint(run)
    if not (init / "config.json").is_file():
        return "no ckpt-0000 to measure with (pretrain did not write its initial weights)"
    return [run.python, *_module("gpu_check.device_checks"), "finetune", "--checkpoint", str(init),
            *SIZES[run.mode]["glue_speed"],
            "--layouts", GLUE_LAYOUTS[run.mode], "--out-dir", str(run.stage_dir), "--name", "glue_speed"]


STAGES = {  # stage -> its command(s) (or why it cannot run), built when the stage starts
    "unpack": lambda r: [r.python, *_module("gpu_check.pack"), "unpack", str(r.lease), str(r.pack)],
    "env": lambda r: [r.python, *_module("gpu_check.device_checks"), "env", "--mode", r.mode, "--out-dir",
                      str(r.stage_dir)],
    "checks": lambda r: [r.python, *_module("gpu_check.device_checks"), "checks", *_step(r)],
    "parity": stage_parity,
    "speed": stage_speed,
    "pretrain": stage_pretrain,
    "glue_speed": stage_glue_speed,
    "glue": stage_glue,
    "glue_early": stage_glue_early,
    "glue_fp32": stage_glue_fp32,
    "hf_compiled": lambda r: _throughput(r, "hf_compiled", "reduce-overhead", "transformers"),
    "eager": lambda r: _throughput(r, "eager", "off", "both", profile=True),
    "fp16": lambda r: _throughput(r, "fp16", "reduce-overhead", "tinyelectra", precision=SIZES[r.mode]["fp16"]),
}


# ---------------------------------------------------------------------------------------------------------------
# Running the stages.
# ---------------------------------------------------------------------------------------------------------------


def _load(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


class Run:
    """One command of the suite: its folders, its clock, the stage records and the notes stages leave for later ones."""

    def __init__(self, mode: str, command: str, lease: Path, out_dir: Path, work: Path) -> None:
        self.mode, self.command, self.lease, self.out_dir, self.work = mode, command, lease, out_dir, work
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.name = f"{'gpu' if mode == 'gpu' else 'cpu-smoke'}-{'suite' if command == 'run' else 'finish'}-{stamp}"
        self.files = ("suite.log", "summary.json") if command == "run" else ("finish.log", "finish.json")
        self.stage_dir = work / self.name  # becomes the archive
        self.pack = work / "pack"
        self.plan = PLANS[command]["stages"]
        self.python = sys.executable
        self.t0 = time.monotonic()
        deadline = PLANS[command]["deadline_s"] if mode == "gpu" else DEADLINE_SMOKE_S
        self.deadline_s = int(os.environ.get("SUITE_DEADLINE_S", deadline))
        self.records: list[dict] = []
        self.notes: dict[str, list[str]] = {}
        self.limits: dict[str, int] = {}  # limits a stage's builder decided (pretrain's)
        self.layout: dict | None = None  # glue's, picked once per command
        self.glue_fits: dict[str, dict] = {}  # each GLUE stage's plan against its time (fit_glue)
        self.interrupted: str | None = None  # SIGTERM or SIGINT: the running stage is stopped, the results written
        (self.stage_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.log = open(out_dir / self.files[0], "w", encoding="utf-8")  # noqa: SIM115 - open for the whole run
        site = installed_copy(work)  # first on the stages' path: the package as users install it
        self.env = child_env({**os.environ,
                              "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
                              "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache")})
        if mode == "smoke":  # one thread per process; inductor's aot_eager backend (no C++ compile on a busy CPU)
            self.env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TINYELECTRA_COMPILE_BACKEND="aot_eager")

    def left(self) -> float:
        return self.deadline_s - (time.monotonic() - self.t0)

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def note(self, stage: str, text: str) -> None:
        self.notes.setdefault(stage, []).append(text)

    def record_of(self, stage: str) -> dict | None:
        return next((r for r in self.records if r["stage"] == stage), None)

    def budget(self, stage: str) -> tuple[int | None, str]:
        """The stage's time limit now, or None and why it does not run."""
        only = [s.strip() for s in os.environ.get("SUITE_ONLY", "").split(",") if s.strip()]
        if only and stage not in only:
            return None, f"not selected (SUITE_ONLY={','.join(only)})"
        left = int(self.left() - SUMMARY_RESERVE_S[self.mode])
        planned, kind = self.plan[stage]
        limit = SMOKE_STAGE_S if self.mode == "smoke" else (planned if planned is not None else left)
        limit = int(os.environ.get(f"SUITE_BUDGET_{stage.upper()}", limit))
        if left < MIN_STAGE_S:
            return None, "suite time limit reached"
        return min(limit, left), ""

    def _start(self, name: str, commands: list[list[str]]) -> tuple[list[subprocess.Popen], list[Path]]:
        procs, logs = [], []
        for i, command in enumerate(commands):
            log = self.stage_dir / "logs" / (f"{name}.log" if len(commands) == 1 else f"{name}.p{i}.log")
            with open(log, "w", encoding="utf-8") as out:
                out.write(f"[suite] {name}: {' '.join(command)}\n")
                out.flush()
                # in the work folder: `python -m` and `-c` put the current folder first on the path, and the checkout's
                # tinyelectra/ (no recipes in it) would shadow the installed copy on a machine where nothing is
                # installed
                procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              cwd=self.work, env=self.env, start_new_session=True))  # stopped whole
            logs.append(log)
        return procs, logs

    def stage(self, name: str) -> None:
        """Run one stage under its limit, its output in logs/NAME.log (NAME.pK.log for each of several processes),
        and record it whatever happens (a fault of the suite's own, building or starting the command, fails this
        stage, not the run)."""
        t0 = time.monotonic()
        limit, commands = 0, []
        try:
            limit, why = self.budget(name)
            built = STAGES[name](self) if limit is not None else why
            if isinstance(built, str):
                return self.record(name, "skipped", None, 0.0, limit or 0, built, [])
            commands = built if isinstance(built[0], list) else [built]
            limit = min(self.limits.pop(name, limit), limit)
            procs, logs = self._start(name, commands)
            rc, status = self.wait(procs, t0 + limit)
        except Exception as e:  # noqa: BLE001 - recorded; the next stages and the summary still run
            return self.record(name, "failed", None, time.monotonic() - t0, limit or 0,
                               f"the suite: {type(e).__name__}: {e}",
                               commands)
        return self.finished(name, procs, logs, rc, status, t0, limit, commands)

    def finished(self, name, procs, logs, rc, status, t0, limit, commands) -> None:
        note = "; ".join(self.notes.get(name, []) + (["the suite was interrupted"] if status == "interrupted" else []))
        if status not in ("ok", "interrupted"):
            bad = next((log for p, log in zip(procs, logs) if p.returncode != 0), logs[0])
            tail = bad.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
            note = "; ".join(filter(None, [note, tail[-1][:300] if tail else ""]))
            self.say(f"[suite] --- last lines of logs/{bad.name} ---\n" + "\n".join(tail) + "\n[suite] ---")
        self.record(name, status, rc, time.monotonic() - t0, limit, note, commands)

    def wait(self, procs: list[subprocess.Popen], until: float) -> tuple[int | None, str]:
        """(exit code, status) of a stage's processes: ok when all end with 0, failed when one does not (the first
        non-zero code), timed_out at the limit (all stopped, exit code 124), interrupted when a signal reached the
        suite (all stopped). Looks twice a second."""
        while True:
            if self.interrupted:
                for p in procs:
                    _stop(p)
                return None, "interrupted"
            if all(p.poll() is not None for p in procs):
                codes = [p.returncode for p in procs]
                bad = next((c for c in codes if c != 0), 0)
                return bad, "ok" if bad == 0 else "failed"
            if time.monotonic() >= until:
                for p in procs:
                    _stop(p)
                return 124, "timed_out"
            time.sleep(max(0.0, min(0.5, until - time.monotonic())))

    def record(self, name: str, status: str, rc: int | None, seconds: float, limit: int, note: str,
               commands: list[list[str]]) -> None:
        planned, kind = self.plan[name]
        rec = {"stage": name, "status": status, "rc": rc, "seconds": round(seconds, 1), "budget_s": limit,
               "gpu_budget_s": gpu_plan(self.command)["stages"][name], "kind": kind, "note": note,
               "log": next((f"logs/{p.name}" for p in sorted((self.stage_dir / "logs").glob(f"{name}.*log"))), None),
               "command": " & ".join(" ".join(c) for c in commands)}
        self.records.append(rec)
        with open(self.stage_dir / "stages.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        self.say(f"[suite] {name:<14} {status:<11} {seconds:6.1f} s (limit {limit} s){'  ' + note if note else ''}")


def installed_copy(work: Path) -> Path:
    """WORK/site: the package laid out as its wheel installs it (pyproject.toml's package-dir: recipes/ becomes
    tinyelectra/recipes, package data). A bare GPU machine has nothing installed, and a checkout on the path alone
    cannot load a recipe ("No module named 'tinyelectra.recipes'")."""
    site = work / "site"
    shutil.rmtree(site, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "tinyelectra", site / "tinyelectra", ignore=skip)
    shutil.copytree(ROOT / "recipes", site / "tinyelectra" / "recipes", ignore=skip)
    return site


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM to the stage's process group (the trainer saves a resume state), SIGKILL after KILL_GRACE_S."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def collect(run: Run) -> None:
    """Copy what the user-facing commands wrote into the archive's folder (never the weights): the first command:
    the pre-training run's plan, summary, metrics, recipe and each checkpoint's meta.json (ckpt-0000's too), pack.json;
    the second: every glue.json (--released-lr's too)."""
    if run.command == "run":
        pre = run.work / "pretrain"
        wanted = ([pre / n for n in ("plan.json", "summary.json", "metrics.jsonl", "recipe.json")]
                  + sorted(pre.glob("ckpt-*/meta.json")))
        wanted += [run.pack / "pack.json"]
    else:
        wanted = (sorted(run.work.glob("glue*/p*/*/glue.json"))
                  + sorted(run.work.glob("glue*/p*/*/released-lr/glue.json")))
    for src in wanted:
        if src.is_file():
            dst = run.stage_dir / src.relative_to(run.work)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    for log in (run.stage_dir / "logs").glob("*.log"):  # a runaway log would not come back (16 MiB a file)
        if log.stat().st_size > 4 * 2**20:
            data = log.read_bytes()
            log.write_bytes(data[: 2**20] + b"\n[suite] ... cut: the log was too long ...\n" + data[-2 * 2**20:])


def close(run: Run, interrupted: str | None) -> int:
    """The summary, the archive, then the table: the last lines printed. A fault in reading the stages' files still
    leaves a summary of the stage records and the archive. The first command's summary also stays in the work folder
    (run.json), where the second finds it."""
    seconds = time.monotonic() - run.t0
    log_name, summary_name = run.files
    try:
        collect(run)
        doc = summarize(run.stage_dir, run.records, run.mode, run.command, seconds, run.deadline_s, interrupted,
                        _load(run.work / "run.json") if run.command == "finish" else None)
        doc["glue_layout"] = run.layout
        if run.command == "finish":
            doc["glue_fit"] = run.glue_fits
        text = table(doc)
    except Exception as e:  # noqa: BLE001 - the records and the files are what the lease leaves: keep them
        doc = {"benchmark": "gpu_suite", "mode": run.mode, "command": run.command, "seconds": round(seconds, 1),
               "deadline_s": run.deadline_s, "interrupted": interrupted,
               "gpu_plan_total_s": gpu_plan(run.command)["total_s"],
               "stages": run.records, "summary_error": f"{type(e).__name__}: {e}"}
        text = "\n".join([f"[suite] {r['stage']}: {r['status']} ({r['seconds']} s) {r['note']}" for r in run.records]
                         + [f"summary failed ({type(e).__name__}: {e}): the stages' files are in the archive"])
    doc["table"] = text.splitlines()
    (run.stage_dir / summary_name).write_text(json.dumps(doc, indent=2) + "\n")
    shutil.copyfile(run.stage_dir / summary_name, run.out_dir / summary_name)
    if run.command == "run":
        shutil.copyfile(run.stage_dir / summary_name, run.work / "run.json")
    run.log.write(text + "\n")
    run.log.flush()
    shutil.copyfile(run.out_dir / log_name, run.stage_dir / log_name)
    archive = run.out_dir / f"{run.name}.tar.gz"
    with tarfile.open(archive.with_suffix(".tmp"), "w:gz") as tar:
        tar.add(run.stage_dir, arcname=run.name)
    os.replace(archive.with_suffix(".tmp"), archive)
    print(f"[suite] results: {archive}, {run.out_dir / summary_name}, {run.out_dir / log_name}")
    print(text, flush=True)
    run.log.close()
    if interrupted:
        return 130
    return 1 if any(r["status"] in ("failed", "timed_out") for r in run.records) else 0


def _prepare_work(work: Path, fresh: bool) -> None:
    """The work folder: for the first command emptied (when the suite made it; its lock, held, stays) or made; the
    second reads it."""
    from tinyelectra.runfolder import LOCK_NAME  # noqa: PLC0415

    if not fresh:
        return
    if work.exists() and any(p.name != LOCK_NAME for p in work.iterdir()):
        if not (work / WORK_MARK).is_file():
            _fail(f"--work {work}: holds files the suite did not write; choose another folder")
        for p in work.iterdir():
            if p.name != LOCK_NAME:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    work.mkdir(parents=True, exist_ok=True)
    (work / WORK_MARK).write_text("a work folder of benchmarks/gpu_check/suite.py: emptied at the start of every first "
                                  "command\n")


def _out_dir(args, mode: str, work: Path) -> tuple[Path, str]:
    """--out, else $OUT, else benchmarks/results/<mode>-<stamp>/; checked writable and outside the work folder `work`
    (one line and exit 2 if not)."""
    env_out = os.environ.get("OUT")
    chosen = args.out or env_out or str(ROOT / "benchmarks" / "results"
                                        / f"{mode}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    why = "--out" if args.out else "$OUT" if env_out else "default"
    if args.out and env_out and Path(args.out).resolve() != Path(env_out).resolve():
        why = f"--out (it wins over $OUT={env_out})"
    out = Path(chosen)
    if out.resolve() == work or work in out.resolve().parents:  # the next first command would empty it, results and all
        _fail(f"{'--out' if args.out else '$OUT' if env_out else 'the results folder'} {out}: inside the work folder "
              f"{work}, which every first command empties; choose a folder outside it")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok\n")
        probe.unlink()
    except OSError as e:
        _fail(f"{'--out' if args.out else '$OUT' if env_out else 'the results folder'} {out}: cannot write there "
              f"({e.strerror or e})")
    return out.resolve(), why


def run_suite(args) -> int:
    mode = "smoke" if args.cpu_smoke else "gpu"
    command = "finish" if args.finish else "run"
    work = Path(args.work or os.environ.get("SUITE_WORK") or WORK_DEFAULT).resolve()
    lease = Path(args.lease).resolve() if args.lease else None
    if command == "finish":
        if args.lease:
            _fail("--finish reads the pack the first command unpacked in the work folder; it takes no --lease")
        first = _load(work / "run.json")
        if first is None:
            _fail(f"no run to finish in {work} (run.json not found): run `bash benchmarks/gpu_suite.sh"
                  f"{' --cpu-smoke' if mode == 'smoke' else ''}` first on this machine; --finish continues what it "
                  "left")
        if first.get("mode") != mode:
            _fail(f"{work / 'run.json'}: the run there is a {first.get('mode')} run, not a {mode} one")
    elif mode == "gpu":
        info = (lease or ROOT / ".lease") / "pack.json"
        if not info.is_file():
            _fail(f"{info} not found: build the pack first (bash benchmarks/gpu_suite.sh --pack)")
        if (kind := (_load(info) or {}).get("kind")) != "gpu":
            _fail(f"{info}: a {kind or 'unknown'} pack, not the GPU run's (its rows would not fit electra-small): "
                  "build it with bash benchmarks/gpu_suite.sh --pack")
    out_dir, out_why = _out_dir(args, mode, work)
    from tinyelectra.errors import UserError  # noqa: PLC0415
    from tinyelectra.runfolder import holding  # noqa: PLC0415

    try:  # one command writes a folder at a time: the work folder and the results folder held to the end
        with holding(work, "--work"), holding(out_dir, "--out"):
            return _run_suite(mode, command, work, lease, out_dir, out_why)
    except UserError as e:
        _fail(str(e))


def _run_suite(mode: str, command: str, work: Path, lease: Path | None, out_dir: Path, out_why: str) -> int:
    try:
        _prepare_work(work, fresh=command == "run")
    except OSError as e:
        _fail(f"{e.filename}: {e.strerror}")
    run = Run(mode, command, lease or (ROOT / ".lease" if mode == "gpu" else work / "lease"), out_dir, work)
    for sig in (signal.SIGTERM, signal.SIGINT):  # noted; the stage waiting stops its processes and the suite ends
        signal.signal(sig, lambda signum, frame: setattr(run, "interrupted", signal.Signals(signum).name))
    run.say(f"[suite] {mode} {command}: deadline {run.deadline_s} s, pack {run.lease}, work folder {work}, results in "
            f"{out_dir} ({out_why})")
    if mode == "smoke" and command == "run" and lease is None:  # the toy pack (seconds), before the stages
        with open(run.stage_dir / "logs" / "smoke_pack.log", "w", encoding="utf-8") as f:
            built = subprocess.run([run.python, *_module("gpu_check.pack"), "build", str(run.lease), "--smoke"],
                                   stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=run.env)
        if built.returncode != 0:
            run.say("[suite] could not build the smoke pack (it needs ../shared/data): see logs/smoke_pack.log")
    for name in run.plan:
        if run.interrupted:
            break
        run.stage(name)
    if run.interrupted:
        run.say(f"[suite] interrupted ({run.interrupted}): writing the summary and the archive")
    return close(run, run.interrupted)


def _fail(message: str) -> None:
    """Bad input: one line on stderr, exit code 2, nothing started."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------------------------
# The summary: what the stages wrote, the figures, the GLUE comparison, the verdict, the table.
# ---------------------------------------------------------------------------------------------------------------


def _get(doc, *path):
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def mfu(tokens_per_s: float | None, flops_per_token: float | None, peak_flops: float | None) -> float | None:
    """Achieved hardware-convention FLOP/s over a peak (the datasheet's, or the measured matrix-product rate)."""
    return tokens_per_s * flops_per_token / peak_flops if tokens_per_s and flops_per_token and peak_flops else None


def side_figures(doc: dict | None, side: str, env: dict | None) -> dict | None:
    """One measured side of a throughput stage: tokens/s, MFU both ways, peak memory, what ran (compile, attention
    kernels, CUDA graphs)."""
    s = _get(doc, side)
    if not s or "tokens_per_s" not in s:
        return None
    peak = s.get("peak_memory_bytes")
    measured = _get(env, "ceilings", "gemm_tflops")
    return {"tokens_per_s": s["tokens_per_s"], "mfu_datasheet": s.get("hardware_mfu"),
            "mfu_measured_peak": mfu(s["tokens_per_s"], doc.get("hardware_flops_per_token"),
                                     measured * 1e12 if measured else None),
            "peak_memory_gib": peak / 2**30 if peak else None, "compile_note": s.get("compile_note"),
            "first_call_s": s.get("first_call_s"),
            "attention_dispatcher": _get(s, "attention_dispatcher", "summary") or s.get("attention_dispatcher"),
            "attention_seen": _get(s, "profile", "attention_seen"),
            "kernel_launches_per_step": _get(s, "profile", "kernel_launches_per_step"),
            "cuda_graphs": _get(s, "cuda_graphs", "label"),
            "measured_as": f"{doc.get('device')}, {doc.get('recipe')} {' '.join(doc.get('overrides') or [])}, batch "
                           f"{doc.get('batch_size')} x {doc.get('seq_len')}, {doc.get('precision')}, compile "
                           f"{doc.get('compile')}",
            "complete": doc.get("complete")}


LEFT_PRIOR = 0.95  # the discriminator has left its prior where its loss stays under this share of the all-original loss
SMOOTH_RECORDS = 5  # ... judged on the median of the last few logged records


def prior_loss(replaced: float | None) -> float | None:
    """The discriminator's loss when it answers the replaced rate `replaced` everywhere, its all-original prior:
    the binary entropy of that rate (nats)."""
    if replaced is None or not 0 < replaced < 1:
        return None
    return -(replaced * math.log(replaced) + (1 - replaced) * math.log(1 - replaced))


def along_the_run(records: list[dict], checkpoints: dict[str, dict]) -> dict:
    """The discriminator along the run: its training loss over its all-original loss at every logged step (1.0 = the
    prior), the first step from which it stays under LEFT_PRIOR to the end (the median of the last SMOOTH_RECORDS
    records: a single noisy one neither starts nor ends it), its early dip (frequency cues, the first 1,000 steps),
    and each checkpoint's held-out ratio, recall and AUCs matched by token id."""
    curve = [(r["step"], r["disc_loss"] / prior_loss(r["replaced_frac"])) for r in records
             if r.get("disc_loss") is not None and prior_loss(r.get("replaced_frac"))]
    smooth = [statistics.median(v for _, v in curve[max(0, i - SMOOTH_RECORDS + 1):i + 1]) for i in range(len(curve))]
    left = None
    for i in range(len(curve) - 1, -1, -1):
        if smooth[i] >= LEFT_PRIOR:
            break
        left = curve[i][0]
    early = [c for c in curve if c[0] <= 1000]
    dip = min(early, key=lambda c: c[1]) if early else None
    marks = {}
    for name, c in checkpoints.items():
        ev = c.get("eval") or {}
        prior = prior_loss(ev.get("replaced_frac"))
        marks[name] = {"step": c.get("step"), "loss_over_prior": ev["disc_loss"] / prior if prior
                       and ev.get("disc_loss") is not None else None,
                       "recall": ev.get("disc_recall"), "auc_matched": ev.get("disc_auc_matched"),
                       "auc_unigram_matched": ev.get("disc_auc_context_matched"),
                       "generator_over_unigram": ev["gen_acc"] / ev["unigram_acc"] if ev.get("gen_acc")
                       and ev.get("unigram_acc") else None}
    return {"loss_over_prior": {"first": curve[0] if curve else None, "last": curve[-1] if curve else None,
                                "every_1000": [c for c in curve if c[0] % 1000 == 0]},
            "left_prior_at_step": left,
            "left_prior_rule": f"median of {SMOOTH_RECORDS} logged steps under {LEFT_PRIOR} to the end",
            "early_dip": {"step": dip[0], "loss_over_prior": dip[1]} if dip else None, "checkpoints": marks,
            "published_end": ("published 1M-step runs end at 0.44-0.48 of the all-original loss "
                              "(../shared/REFERENCE.md)")}


def paper_point(steps: int | None, tokens: float | None, flops_paper: float | None) -> dict:
    """A run's steps, tokens and paper-convention FLOPs as fractions of the paper's 6.25% point of ELECTRA-Small, and
    the learning rate the paper's schedule has there (5e-4 * min(1, 62,500 / 10,000) * (1 - 62,500 / 1M))."""
    from tinyelectra.config import load_recipe  # noqa: PLC0415
    from tinyelectra.paper import TABLE1  # noqa: PLC0415

    row, small = TABLE1[0], load_recipe("electra-small")
    tokens_at = row.steps * 128 * 128
    peak, warmup, total = small.optim.lr, small.optim.warmup_steps, small.train.steps
    return {"paper_steps": row.steps, "paper_tokens": tokens_at, "paper_flops": row.train_flops_paper,
            "paper_glue": row.glue_dev,
            "paper_lr": peak * min(1.0, row.steps / warmup) * (1 - row.steps / total),
            "steps_fraction": steps / row.steps if steps is not None else None,
            "tokens_fraction": tokens / tokens_at if tokens else None,
            "flops_fraction": flops_paper / row.train_flops_paper if flops_paper else None}


def pretrain_figures(d: Path, pack: dict | None, record: dict | None) -> dict:
    """The pre-training run from its own files: its schedule, where and why it stopped, steps, tokens, passes over
    the pack and its unique tokens, time, speed, each checkpoint's held-out verdict (ckpt-0000: the run's initial
    weights), the discriminator along the run, the run against the paper's first point. Works on a run stopped
    early (no summary.json): from metrics.jsonl."""
    summary = _load(d / "pretrain" / "summary.json") or {}
    plan = _load(d / "pretrain" / "plan.json") or {}
    metrics = d / "pretrain" / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    records = []
    for x in lines:
        try:
            records.append(json.loads(x))
        except ValueError:
            continue  # a line cut by a stop
    steps = [r for r in records if "event" not in r]
    ckpts = {r["name"]: r for r in records if r.get("event") == "checkpoint"}
    last = steps[-1] if steps else {}
    step = summary.get("steps", last.get("step"))
    tokens = summary.get("tokens_seen", last.get("tokens_seen"))
    flops_paper = summary.get("train_flops_paper", last.get("train_flops_paper"))
    pack_tokens = _get(pack, "pretrain", "tokens", "train")
    repetition = summary.get("data_repetition") or {}
    passes = repetition.get("passes") or (tokens / pack_tokens if tokens and pack_tokens else None)
    process = summary.get("process_seconds") or {}
    final = [c for n, c in ckpts.items() if n != "ckpt-0000"][-1:] or [None]
    final = final[0]
    schedule = {k: plan.get(k) for k in ("budget", "total_steps", "warmup_steps")}
    return {"command": (record or {}).get("command"), "note": (record or {}).get("note"), "finished": bool(summary),
            "status": summary.get("status") or ("stopped by its stage's limit" if steps else None),
            # what the schedule is, and where (and why) the run stopped: the verdict names what it compared
            "schedule": {**schedule, "peak_lr": _get(summary, "schedule", "peak_lr")},
            "stopped": summary.get("stopped"),
            "steps": step,
            "tokens_seen": tokens, "pack_tokens": pack_tokens, "passes_over_pack": passes,
            # the data's repetition: the pack's unique tokens, seen `passes` times
            "data_repetition": {"unique_tokens": repetition.get("unique_tokens") or pack_tokens, "passes": passes,
                                "train_rows": repetition.get("train_rows")},
            "train_flops_paper": flops_paper,
            "train_seconds": summary.get("train_seconds", last.get("train_seconds")), "budget": plan.get("budget"),
            "startup_s": _get(summary, "excluded_seconds", "startup_and_first_step"),
            "checkpoints_eval_state_s": _get(summary, "excluded_seconds", "checkpoints_eval_state"),
            "overhead_s": process["wall"] - process["training"] if process.get("wall") else None,
            "compile": _get(summary, "runtime", "compile"), "attention": _get(summary, "runtime", "attention"),
            "median_tokens_per_second": summary.get("median_tokens_per_second"),
            "peak_gpu_memory_gib": summary.get("peak_gpu_memory_gib"),
            "metrics_median_tokens_per_second": (statistics.median(r["tokens_per_second"] for r in steps[1:])
                                                 if len(steps) > 1 else None),
            "checkpoints": {n: {"step": c.get("step"), "eval": c.get("eval")} for n, c in ckpts.items()},
            "along_the_run": along_the_run(steps, ckpts),
            "paper_point": paper_point(step, tokens, flops_paper),
            "final_verdict": f"{final['name']}: {_get(final, 'eval', 'verdict')}" if final else None}


def glue_results(folder: Path, arm: str = "") -> dict[str, dict[str, dict]]:
    """Every checkpoint's finished seeds in a glue stage's folder (one glue.json per process and checkpoint: the
    processes of a layout split the seeds), by checkpoint and task: the paper metric's score of each seed, the class
    it answered when it answered one class for every dev row, its loss curve, the majority-class score, the protocol;
    a stopped run's finished seeds of unfinished tasks count too. `arm` "released-lr": glue --released-lr's results."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted(Path(folder).glob(f"p*/*/{arm}/glue.json" if arm else "p*/*/glue.json")):
        doc = _load(path) or {}
        name = path.parents[1 if arm else 0].name
        entries = {t: (e.get("seeds") or [], e) for t, e in (doc.get("tasks") or {}).items()}
        entries.update({t: (p.get("seeds") or [], {}) for t, p in (doc.get("partial") or {}).items()
                        if t not in entries})
        for task, (seeds, entry) in entries.items():
            t = out.setdefault(name, {}).setdefault(task, {"scores": {}, "metric": entry.get("paper_metric"),
                                                           "protocol": doc.get("protocol"),
                                                           "precision": doc.get("precision"),
                                                           "loss_curves": {}})
            t["metric"] = t["metric"] or entry.get("paper_metric")
            t["scores"].update({s["seed"]: s["paper_score"] for s in seeds})
            if any("predicted_classes" in s for s in seeds):  # recorded since issue 34 (older files: unknown)
                t.setdefault("one_class", {}).update({s["seed"]: s["one_class"] for s in seeds if s.get("one_class")})
            t["loss_curves"].update({s["seed"]: s["loss_curve"] for s in seeds if s.get("loss_curve")})
            if entry.get("majority_class"):
                t["majority_class"] = entry["majority_class"]["paper_score"]
            if doc.get("fine_tuning"):
                t.setdefault("fine_tuning", []).append(doc["fine_tuning"])
    return out


def spread(scores: list[float]) -> dict:
    """Median and spread of a task's seeds: the range (min, max) and the sample standard deviation."""
    if not scores:
        return {"seeds": 0, "median": None, "min": None, "max": None, "std": None}
    return {"seeds": len(scores), "median": statistics.median(scores), "min": min(scores), "max": max(scores),
            "std": statistics.stdev(scores) if len(scores) > 1 else None}


def glue_table(sides: dict[str, dict[str, dict]], pretrained: str | None, none: str | None) -> dict:
    """Per task: the pre-trained and no-pre-training medians with their spreads and their seeds that answered one
    class, the paper's ELECTRA-Small (official README, OpenWebText, 1M steps), the majority class, the two sides
    compared in words (metrics.compare_seeds: "beyond the seeds' spread" only where the ranges do not overlap);
    averages over the tasks both sides have; how many tasks pre-training wins, and on how many beyond the seeds'
    spread; the verdict against the anchors, computed (metrics.verdict_against_anchors)."""
    from tinyelectra.metrics import compare_seeds, verdict_against_anchors  # noqa: PLC0415
    from tinyelectra.paper import PAPER_TASKS, PER_TASK  # noqa: PLC0415

    paper = PER_TASK[0].scores
    names = {"pre-trained": pretrained, "no pre-training": none}
    tasks: dict = {}
    for label, name in names.items():
        for task, v in (sides.get(name) or {}).items() if name else ():
            t = tasks.setdefault(task, {"metric": v.get("metric"), "paper": paper.get(task), "one class": {}})
            t[label] = spread([v["scores"][k] for k in sorted(v["scores"])])
            t["one class"][label] = len(v["one_class"]) if "one_class" in v else None
            if v.get("majority_class") is not None:
                t["majority class"] = v["majority_class"]
    order = {t: i for i, t in enumerate(PAPER_TASKS)}  # the paper's column order, whatever order the jobs ended in
    tasks = dict(sorted(tasks.items(), key=lambda kv: order.get(kv[0], len(order))))
    both = [t for t, v in tasks.items() if _get(v, "pre-trained", "median") is not None
            and _get(v, "no pre-training", "median") is not None]
    mine = [t for t, v in tasks.items() if _get(v, "pre-trained", "median") is not None]
    averages = {label: statistics.fmean(tasks[t][label]["median"] for t in both) if both else None for label in names}
    averages["paper"] = (statistics.fmean(tasks[t]["paper"] for t in both)
                         if both and all(tasks[t]["paper"] for t in both) else None)
    for t in both:
        v = tasks[t]
        v["comparison"] = compare_seeds(*(list(sides[n][t]["scores"].values()) for n in (pretrained, none)),
                                        majority=v.get("majority class"))
    wins = [t for t in both if tasks[t]["comparison"]["difference"] > 0]
    clear = [t for t in wins if tasks[t]["comparison"]["beyond_spread"]]
    return {"checkpoint": pretrained, "no_pretraining": none, "tasks": tasks, "averages_over": both,
            "averages": averages,
            "pretrained_tasks": mine, "wins": wins, "wins_beyond_spread": clear, "paper_source": PER_TASK[0].source,
            "verdict": verdict_against_anchors({t: _get(v, "pre-trained", "median") for t, v in tasks.items()})}


def summarize(d: Path, records: list[dict], mode: str, command: str, seconds: float, deadline_s: int,
              interrupted: str | None, first: dict | None = None) -> dict:
    """A command's summary from its archive folder `d` and the stage records; the second command's carries the
    first's figures (`first`, its run.json) beside its own."""
    docs = {p.stem: _load(p) for p in d.glob("*.json") if p.name not in ("summary.json", "finish.json")}
    env = docs.get("env") or _get(first, "env")
    plan = gpu_plan(command)
    doc = {
        "benchmark": "gpu_suite", "mode": mode, "command": command,
        "git_commit": _git_commit(_load(d / "pack" / "pack.json")),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": (env or {}).get("gpu") or ("cpu" if env else None), "torch": (env or {}).get("torch"),
        "seconds": round(seconds, 1), "deadline_s": deadline_s, "within_deadline": seconds <= deadline_s,
        "interrupted": interrupted,
        "gpu_plan": plan["stages"], "gpu_plan_total_s": plan["total_s"], "stages": records,
    }
    if command == "run":
        pack = _load(d / "pack" / "pack.json")
        speed = side_figures(docs.get("speed"), "tinyelectra", env)
        pretrain = pretrain_figures(d, pack, next((r for r in records if r["stage"] == "pretrain"), None))
        rate = pretrain["metrics_median_tokens_per_second"]
        doc.update(env=env, ceilings=_get(env, "ceilings"), checks=docs.get("checks"), pack=pack,
                   parity={**{k: _get(docs.get("parity"), k)
                              for k in ("max_abs_loss_difference", "max_rel_loss_difference", "finite")},
                           **{k: (next((r for r in records if r["stage"] == "parity"), None) or {}).get(k)
                              for k in ("status", "rc")}},
                   speed={"tinyelectra CUDA graphs": speed}, pretrain=pretrain,
                   targets={"pretrain tokens/s >= 2.0M (floor), 2.5M (goal)": [rate, rate >= 2.0e6 if rate else None],
                            "speed stage tokens/s >= 2.0M": [
                                (speed or {}).get("tokens_per_s"),
                                (speed or {}).get("tokens_per_s", 0) >= 2.0e6 if speed else None]},
                   gpu_plan_pretrain_train_s=plan["pretrain_train_s"])
        doc["unmeasured"] = [k for k, v in {"speed": speed, "pretrain": pretrain["steps"],
                                            "parity": doc["parity"]["status"]}.items() if v is None]
    else:
        env_first = _get(first, "env")
        speeds = {"tinyelectra CUDA graphs (first command)": _get(first, "speed", "tinyelectra CUDA graphs"),
                  "transformers compiled + CUDA graphs": side_figures(
                      docs.get("hf_compiled"), "transformers", env_first),
                  "tinyelectra eager": side_figures(docs.get("eager"), "tinyelectra", env_first),
                  "transformers eager": side_figures(docs.get("eager"), "transformers", env_first),
                  "tinyelectra fp16 CUDA graphs": side_figures(docs.get("fp16"), "tinyelectra", env_first)}
        tok = {k: (v or {}).get("tokens_per_s") for k, v in speeds.items()}
        ours, theirs = tok["tinyelectra CUDA graphs (first command)"], tok["transformers compiled + CUDA graphs"]
        sides = glue_results(d / "glue")
        names = sorted(sides, key=lambda n: int(n[5:]) if re.fullmatch(r"ckpt-\d{4,5}", n) else -1)
        pretrained = next((n for n in reversed(names) if n != "ckpt-0000"), None)
        glue = glue_table(sides, pretrained, "ckpt-0000" if "ckpt-0000" in sides else None)
        released = glue_results(d / "glue", "released-lr")
        early = glue_results(d / "glue-early")
        fp32 = glue_results(d / "glue-fp32")
        fine_tuning = [ft for v in (sides.get(pretrained) or sides.get("ckpt-0000") or {}).values()
                       for ft in v.get("fine_tuning", [])][:1]
        cap = GLUE[mode]["max_train_rows"]
        rows = {t: min(v.get("train_rows") or 0, cap or 1 << 40)
                for t, v in (_get(first, "pack", "glue", "tasks") or {}).items()}
        gp = glue_plan(rows, GLUE[mode]["seeds"], len(names)) if rows and all(rows.values()) else None
        layout = next((r for r in records if r["stage"] == "glue"), {})
        doc.update(first_command={k: _get(first, k) for k in ("date_utc", "seconds", "device", "git_commit")},
                   pretrain=_get(first, "pretrain"), glue=glue,
                   glue_released_lr=glue_table(released, pretrained, "ckpt-0000" if "ckpt-0000" in released else None)
                   if released else None,
                   cola_loss_curves={f"{n} ({arm})": _get(r, n, "cola", "loss_curves") for arm, r in
                                     (("paper's lr", sides), ("released lr", released)) for n in names
                                     if _get(r, n, "cola")},
                   glue_early=glue_table(early, next(iter(early), None), None) if early else None,
                   glue_fp32=fp32_check(fp32, sides, pretrained) if fp32 else None,
                   glue_plan=gp, glue_run={"stage_seconds": layout.get("seconds"), "status": layout.get("status"),
                                           "fine_tuning": fine_tuning[0] if fine_tuning else None,
                                           # start-up, set-up and evaluations around the steps: glue_fit's constants
                                           "seconds_outside_steps": layout["seconds"] - fine_tuning[0]["seconds"]
                                           if fine_tuning and layout.get("seconds")
                                           and fine_tuning[0].get("seconds") else None},
                   glue_speed=docs.get("glue_speed"), speed=speeds,
                   ratios={"tinyelectra CUDA graphs / transformers compiled + CUDA graphs": ours / theirs if ours
                           and theirs else None,
                           "eager (paired rounds in one process)": _get(
                               docs.get("eager"), "speedup", "median_of_round_ratios")})
        doc["unmeasured"] = [k for k, v in speeds.items() if v is None] + \
            [f"GLUE {t} {side}" for t, v in glue["tasks"].items() for side in ("pre-trained", "no pre-training")
             if _get(v, side, "median") is None]
    if mode == "smoke":
        doc["note"] = ("CPU smoke run: every stage at toy size on the CPU (one layer of the tiny recipe, a toy pack); "
                       "compile stages use the aot_eager backend, fp16 runs fp32, CUDA graphs do not exist: it checks "
                       "the machinery, and none of these figures is a GPU figure")
    return doc


def fp32_check(fp32: dict, bf16: dict, name: str | None) -> dict:
    """The glue_fp32 stage against the glue stage on the same checkpoint and tasks: medians side by side and their
    differences (bf16 autocast changes the paper's numbers by no more than the seeds' spread, or it does)."""
    out = {}
    for task, v in (fp32.get(name) or {}).items():
        a, b = spread(list(v["scores"].values())), spread(list((_get(bf16, name, task, "scores") or {}).values()))
        out[task] = {"fp32": a, "bf16": b, "difference": a["median"] - b["median"] if a["median"] is not None
                     and b["median"] is not None else None}
    return {"checkpoint": name, "tasks": out}


def _git_commit(pack: dict | None) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        if os.environ.get("SUITE_GIT_COMMIT"):
            return f"{os.environ['SUITE_GIT_COMMIT']} (SUITE_GIT_COMMIT)"
        return f"unknown (no .git; the pack was built at {_get(pack, 'git_commit')})"


def _n(x, fmt: str = "{:,.0f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _header(doc: dict) -> list[str]:
    what = "first command" if doc["command"] == "run" else "second command (--finish)"
    out = [f"== tinyelectra GPU suite, {what} ({doc['mode']}): {doc['device'] or 'device unknown'}, torch "
           f"{doc['torch'] or '-'}, commit {str(doc['git_commit'])[:12]}; {doc['seconds']:.0f} s of "
           f"{doc['deadline_s']} s"
           + (f"; INTERRUPTED ({doc['interrupted']})" if doc["interrupted"] else "")]
    out.append("stages: " + ", ".join(f"{r['stage']} {r['status']}"
                                      + (f" {r['seconds']:.0f}s" if r["status"] != "skipped" else "")
                                      for r in doc["stages"]))
    return out


def _pretrain_lines(p: dict | None) -> list[str]:
    if not p or p.get("steps") is None:
        return ["pretrain: no step recorded (see its stage)"]
    pp, sc, st = p.get("paper_point") or {}, p.get("schedule") or {}, p.get("stopped") or {}
    stop = (f"stopped by {st['why']} at {st['fraction_of_schedule']:.2%} of it (learning rate {st['lr']:.3g})" if st
            else "finished" if p.get("status") == "finished" else "STOPPED by its stage's limit (no checkpoint where "
            "it stopped)")
    out = [f"pretrain: {_n(p['steps'])} steps of a {_n(sc.get('total_steps'))}-step schedule (warm-up "
           f"{_n(sc.get('warmup_steps'))}, --budget {sc.get('budget') or p.get('budget')}), {stop}; "
           f"{_n(p['tokens_seen'] / 1e6 if p['tokens_seen'] else None, '{:.1f}')}M tokens = "
           f"{_n(p['passes_over_pack'], '{:.1f}')} passes over the pack's "
           f"{_n((p.get('pack_tokens') or 0) / 1e6 or None, '{:.1f}')}M unique tokens (repeated data; the paper saw "
           f"each token about once) in {_n(p['train_seconds'], '{:.0f}')} s of training, "
           f"+{_n(p['overhead_s'], '{:.0f}')} s start-up and checkpoints; {_n(p['metrics_median_tokens_per_second'])} "
           "tokens/s median"]
    out.append(f"  against the paper's 6.25% point ({pp.get('paper_steps', 0):,} steps of its 1M, learning rate there "
               f"{_n(pp.get('paper_lr'), '{:.3g}')}, {(pp.get('paper_tokens') or 0) / 1e9:.2f}B tokens, "
               f"{_n(pp.get('paper_flops'), '{:.2g}')} FLOPs, GLUE {pp.get('paper_glue')}): reached steps "
               f"{_n(pp.get('steps_fraction'), '{:.1%}')}, tokens {_n(pp.get('tokens_fraction'), '{:.1%}')}, FLOPs "
               f"{_n(pp.get('flops_fraction'), '{:.1%}')}")
    a = p.get("along_the_run") or {}
    last = (a.get("loss_over_prior") or {}).get("last")
    dip = a.get("early_dip") or {}
    left = "at step " + format(a["left_prior_at_step"], ",") if a.get("left_prior_at_step") is not None else "not yet"
    out.append(f"  discriminator loss / all-original loss (1.0 = prior; published 1M-step runs end at 0.44-0.48): "
               f"{_n(last[1] if last else None, '{:.3f}')} at step {_n(last[0] if last else None)}; left the prior "
               f"{left} "
               f"({a.get('left_prior_rule')}); early dip {_n(dip.get('loss_over_prior'), '{:.3f}')} at step "
               f"{_n(dip.get('step'))} (frequency cues)")
    out.append(f"  {'held-out':<12}{'step':>8}{'loss/prior':>12}{'recall':>8}{'AUC matched':>13}{'AUC unigram':>13}"
               f"{'gen/unigram':>13}")
    for name, c in (a.get("checkpoints") or {}).items():
        out.append(f"  {name:<12}{_n(c['step']):>8}{_n(c['loss_over_prior'], '{:.3f}'):>12}"
                   f"{_n(c['recall'], '{:.3f}'):>8}"
                   f"{_n(c['auc_matched'], '{:.3f}'):>13}{_n(c['auc_unigram_matched'], '{:.3f}'):>13}"
                   f"{_n(c['generator_over_unigram'], '{:.2f}x'):>13}")
    return out


def _cell(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s["seeds"] == 1:
        return f"{s['median']:.1f}"
    return f"{s['median']:.1f} ({s['min']:.1f}..{s['max']:.1f})"


def _glue_lines(g: dict, header: bool = True) -> list[str]:
    """The GLUE table's rows: each side's median (min..max) and how many of its seeds answered one class for every dev
    row, the released ELECTRA-Small-OWT's score ("OWT 1M": the official README's, OpenWebText, 1M steps, not the
    paper's own model), the majority class; then how the sides compare, task by task (metrics.compare_seeds)."""
    out = [f"  {'task (metric)':<24}{'pre-trained':>20}{'no pre-training':>20}{'OWT 1M':>8}{'majority':>10}"
           f"{'one class':>11}"] if header else []
    for task, v in g["tasks"].items():
        one = ", ".join(f"{v['one class'][s]}/{v[s]['seeds']}" if v["one class"].get(s) is not None
                        and v.get(s) else "-"
                        for s in ("pre-trained", "no pre-training"))
        out.append(f"  {task + ' (' + str(v.get('metric')) + ')':<24}{_cell(v.get('pre-trained')):>20}"
                   f"{_cell(v.get('no pre-training')):>20}{_n(v.get('paper'), '{:.1f}'):>8}"
                   f"{_n(v.get('majority class'), '{:.1f}'):>10}{one:>11}")
    a = g["averages"]
    if header:
        out.append(f"  {'average of ' + str(len(g['averages_over'])) + ' tasks':<24}"
                   f"{_n(a.get('pre-trained'), '{:.1f}'):>20}"
                   f"{_n(a.get('no pre-training'), '{:.1f}'):>20}{_n(a.get('paper'), '{:.1f}'):>8}")
    return out + [f"  {task}, pre-trained vs none: {v['comparison']['words']}" for task, v in g["tasks"].items()
                  if "comparison" in v]


def table(doc: dict) -> str:
    """The short table printed last: the last lines of the output alone say what happened."""
    out = _header(doc)
    if doc["command"] == "run":
        c = doc["ceilings"] or {}
        share = (f" ({c['gemm_share_of_datasheet']:.0%} of the datasheet's {c['datasheet_bf16_tflops']:.0f})"
                 if c.get("gemm_share_of_datasheet") else "")
        out.append(f"ceilings: matrix product {_n(c.get('gemm_tflops'), '{:.3g}')} TFLOP/s{share}; copy "
                   f"{_n(c.get('copy_gb_per_s'))} GB/s")
        ch = doc["checks"] or {}
        sdpa = ch.get("sdpa_gradients") or {}
        out.append("checks: training step "
                   f"{'finite' if _get(ch, 'train_step', 'finite') else 'NOT finite or not run'}; SDPA gradients safe: "
                   f"{', '.join(sdpa.get('safe') or []) or '-'}; unsafe: "
                   f"{', '.join(sdpa.get('unsafe') or []) or 'none'}")
        par = doc["parity"]
        verdict = {"ok": "the CUDA graphs compute the eager step",
                   "failed": "MISMATCH: pretrain ran without CUDA graphs"
                   if par.get("rc") == 1 else "failed (see its log)"}.get(par.get("status") or "",
                                                                          par.get("status") or "not run")
        out.append(f"parity (loss_check.py, eager vs the compiled CUDA-graph step): {verdict}; max loss difference "
                   f"{_n(par.get('max_abs_loss_difference'), '{:.3g}')} (relative "
                   f"{_n(par.get('max_rel_loss_difference'), '{:.3g}')})")
        s = doc["speed"]["tinyelectra CUDA graphs"] or {}
        out.append(f"speed ({s.get('measured_as', 'not measured').split(', compile')[0]}): {_n(s.get('tokens_per_s'))} "
                   f"tokens/s, MFU {_n(s.get('mfu_datasheet'), '{:.1%}')} of the datasheet, "
                   f"{_n(s.get('mfu_measured_peak'), '{:.1%}')} of the measured peak; peak memory "
                   f"{_n(s.get('peak_memory_gib'), '{:.2f}')} GiB; cold compile {_n(s.get('first_call_s'), '{:.0f}')} "
                   f"s; {s.get('cuda_graphs') or 'CUDA graphs: not measured'}")
        out += _pretrain_lines(doc["pretrain"])
        out.append("next: bash benchmarks/gpu_suite.sh --finish (GLUE on this run's last checkpoint and ckpt-0000)")
    else:
        out += _pretrain_lines(doc["pretrain"])
        g, lay, gp = doc["glue"], doc.get("glue_layout") or {}, doc.get("glue_plan") or {}
        ft = _get(doc, "glue_run", "fine_tuning") or {}
        fit = _get(doc, "glue_fit", "glue") or {}
        if "fits" in fit:
            plan = (f"modeled {_n(fit['estimate_s'], '{:.0f}')} s with up to {_n(fit['concurrent'])} in flight, of "
                    f"{fit['available_s']:.0f} s" + (f"; TRIMMED to fit: {', '.join(fit['trims'])} (the whole plan: "
                                                       f"modeled {fit['full_plan']['seconds']:.0f} "
                                                       "s)" if fit["trims"] else ""))
        else:
            plan = fit.get("why") or "not planned"
        out.append(f"GLUE: {_n(gp.get('jobs'))} jobs, {_n(gp.get('steps'))} steps planned (full training sets, 3 or 10 "
                   f"epochs, batch 32); layout {lay.get('layout', '-')}; {plan}; ran "
                   f"{_n(_get(doc, 'glue_run', 'stage_seconds'), '{:.0f}')} s "
                   f"({_n(ft.get('steps_per_second'), '{:.0f}')} steps/s)")
        pre = doc.get("pretrain") or {}
        passes = (f" ({_n(pre.get('passes_over_pack'), '{:.1f}')} passes over the pack's "
                  f"{_n((pre.get('pack_tokens') or 0) / 1e6 or None, '{:.1f}')}M tokens)") if g["checkpoint"] else ""
        out.append(f"GLUE dev, median (min..max) over seeds: {g['checkpoint'] or 'no pre-trained checkpoint'}{passes} "
                   "vs no pre-training (ckpt-0000: the same run's initial weights), same card, same processes; paper: "
                   f"{g['paper_source']}")
        out += _glue_lines(g)
        if g["averages_over"]:
            gap = g["averages"]["pre-trained"] - g["averages"]["no pre-training"]
            clear = g["wins_beyond_spread"]
            out.append(f"verdict: pre-training beats no pre-training on {len(g['wins'])} of {len(g['averages_over'])} "
                       f"tasks ({len(clear)} beyond the seeds' spread{': ' + ', '.join(clear) if clear else ''}), "
                       f"average {gap:+.1f} points")
        else:
            out.append("verdict: no GLUE comparison (a side is missing: see stages)")
        if (g.get("verdict") or {}).get("ours") is not None:
            out.append(f"against the paper ({g['checkpoint']}, computed): {g['verdict']['words']}; the paper's GLUE-8 "
                       f"at its 6.25% point: {_get(doc, 'pretrain', 'paper_point', 'paper_glue') or 74.1}")
        for side, curves in (doc.get("cola_loss_curves") or {}).items():
            seed, curve = min((curves or {}).items(), default=(None, None))
            if curve:
                points = dict.fromkeys(map(tuple, (curve[0], curve[len(curve) // 2], curve[-1])))  # first, middle, last
                out.append(f"cola training loss, {side}, seed {seed}: " + ", ".join(f"{loss:.3f} at step {step}"
                                                                                       for step, loss in points))
        if r := doc.get("glue_released_lr"):
            out.append("with the released code's learning rate (1e-4, weight decay 0.01; not the paper's 3e-4):")
            out += _glue_lines(r, header=False)
        if e := doc.get("glue_early"):
            out.append(f"GLUE at {e['checkpoint']} (a quarter of the run): " + ", ".join(
                f"{t} {_cell(v.get('pre-trained'))}" for t, v in e["tasks"].items()))
        if f := doc.get("glue_fp32"):
            out.append("bf16 vs fp32 fine-tuning (medians): " + ", ".join(
                f"{t} {_cell(v['bf16'])} vs {_cell(v['fp32'])} ({_n(v['difference'], '{:+.1f}')})"
                for t, v in f["tasks"].items()))
        sp, r = doc["speed"], doc["ratios"]
        out.append("speed (the pre-training step, tokens/s): "
                   + "; ".join(f"{k} {_n((v or {}).get('tokens_per_s'))}" for k, v in sp.items())
                   + "; ratios: " + "; ".join(f"{k} {_n(v, '{:.2f}x')}" for k, v in r.items()))
    if doc.get("note"):
        out.append(f"note: {doc['note']}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr starting with "error:", exit code 2."""

    def error(self, message: str) -> None:
        _fail(f"{message} (see --help)")


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    r = sub.add_parser("run", help="run the suite's first command, or with --finish its second")
    r.add_argument("--cpu-smoke", action="store_true", help="every stage at toy size on the CPU")
    r.add_argument("--finish", action="store_true", help="the second command: GLUE and the extras on the first's run")
    r.add_argument("--lease", default=None, help="the pack (default .lease/; --cpu-smoke: a toy pack it builds)")
    r.add_argument("--out", default=None, help="where the three files go (wins over $OUT; default $OUT, else "
                                               "benchmarks/results/<mode>-<stamp>/)")
    r.add_argument("--work", default=None,
                   help="the work folder the two commands share (default .lease-run/, or $SUITE_WORK)")
    s = sub.add_parser("summary", help="print the table of an extracted archive")
    s.add_argument("dir")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "run":
        return run_suite(args)
    d = Path(args.dir)
    doc = _load(d / "summary.json") or _load(d / "finish.json")
    if doc is None:
        _fail(f"{d}: no summary.json or finish.json (an extracted suite archive?)")
    print("\n".join(doc.get("table") or [table(doc)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
