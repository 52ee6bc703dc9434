"""The GPU suite behind benchmarks/gpu_suite.sh: ONE command, at most 570 s on a bare GPU machine, that runs what a
user runs (`tinyelectra train --recipe electra-small ... --gpu 0`, then `tinyelectra glue`) beside the speed
measurements, and leaves three files: an archive, summary.json and suite.log, whose last lines are a short table.

    python benchmarks/suite.py run [--cpu-smoke] [--lease DIR] [--out DIR]    # what gpu_suite.sh runs
    python benchmarks/suite.py summary DIR                                      # the table again, from an archive

Stages, in order of value (PLAN: each one's GPU budget), every one a process under its own time limit and recorded
whatever happens: unpack (the pack from --lease), env (machine, measured ceilings), checks (a training step, SDPA
gradients per backend), eager (tinyelectra vs transformers, alternating in one process: tokens/s, peak memory,
profile), compiled (tinyelectra under torch.compile; its inductor cache, in the work folder, serves the later
stages), pretrain (the user's command, its --budget what is left minus GLUE's share; eager if compilation failed),
glue (the final checkpoint, or the last one written), then with time left: glue_0625 and the extras. The
no-pre-training GLUE side (glue_baseline) is computed beforehand on the CPU with the same protocol
(benchmarks/glue_baseline.py); the smoke run computes its own.

--cpu-smoke runs every stage at toy size on the CPU (one thread per process, compile stages with inductor's aot_eager
backend, fp16 as fp32, no CUDA graphs, its own generous limits), from a toy pack it builds (pack.py build --smoke)
unless --lease names one. SUITE_ONLY=a,b runs only those stages; SUITE_BUDGET_<STAGE>=s and SUITE_DEADLINE_S=s
override the limits (tests); SUITE_WORK keeps the work folder; SUITE_GIT_COMMIT names the commit without .git.
"""

from __future__ import annotations

import argparse
import json
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

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# ---------------------------------------------------------------------------------------------------------------
# The protocol: the recipe pre-trained, and how GLUE is run on it (benchmarks/glue_baseline.py runs the same).
# ---------------------------------------------------------------------------------------------------------------

# The recipe `pretrain` trains and whose initial weights the no-pre-training baseline fine-tunes. The smoke run: one
# layer of the tiny recipe, rows of 32 tokens (its pack's), a few rows per batch and per evaluation.
PRETRAIN = {"gpu": {"recipe": "electra-small", "sets": ()},
            "smoke": {"recipe": "tiny", "sets": ("model.num_layers=1", "train.seq_len=32", "train.batch_size=8",
                                                 "train.eval_rows=32", "train.log_every_steps=5")}}
# GLUE on the pack's tasks: one seed, the first N training rows of each task (MRPC and STS-B then train on 2N with
# their swapped pairs), the paper's protocol otherwise, in fp32 on both sides (the CPU baseline's precision; fp32
# also keeps fine-tuning off cuDNN's bf16 attention kernels), no test-set predictions (the pack holds no test sets).
# Sized for the CPU baseline, the slower side: about 2.5 CPU-seconds per row of the cap on one thread of this
# project's AMD EPYC (benchmarks/results/glue_cpu_estimate_small_t1.json: 0.6-3.1 s per step of 32; 1,331 steps at
# 1,000 rows: CoLA 96, SST-2 96, STS-B 630, MRPC 189, RTE 320), an hour or so; the GPU's are estimated at 10-15 ms
# each (small, launch-bound): 20-40 s.
GLUE = {"gpu": {"seeds": 1, "max_train_rows": 1000}, "smoke": {"seeds": 1, "max_train_rows": 16}}
GLUE_SETTINGS = ("precision=fp32", "test_predictions=false")
BASELINE_RESULT = BENCH / "results" / "glue_no_pretraining_cpu.json"


def pretrain_recipe(mode: str, data_dir: Path):
    """The recipe `pretrain` runs on `data_dir`, its vocabulary taken from the data as `tinyelectra train` does."""
    from tinyelectra.config import load_recipe  # noqa: PLC0415
    from tinyelectra.train import adopt_data_vocab  # noqa: PLC0415

    sets = list(PRETRAIN[mode]["sets"])
    return adopt_data_vocab(load_recipe(PRETRAIN[mode]["recipe"], sets), Path(data_dir), sets, [])


def glue_args(mode: str, checkpoint: Path, glue_dir: Path, tasks: list[str], out: Path, device: list[str]) -> list[str]:
    """`tinyelectra glue` arguments of the protocol (`device`: ["--gpu", "0"] or ["--device", "cpu"])."""
    g = GLUE[mode]
    return ["glue", "--checkpoint", str(checkpoint), "--glue-dir", str(glue_dir), "--tasks", ",".join(tasks),
            "--seeds", str(g["seeds"]), "--max-train-rows", str(g["max_train_rows"]), "--out", str(out), *device,
            *(a for s in GLUE_SETTINGS for a in ("--set", s))]


# ---------------------------------------------------------------------------------------------------------------
# The plan: stages in order of value, each with its GPU budget (seconds).
# ---------------------------------------------------------------------------------------------------------------

DEADLINE_S = {"gpu": 570, "smoke": 3600}  # the GPU command's deadline (the device tool allows 600 s a command)
SUMMARY_RESERVE_S = {"gpu": 20, "smoke": 300}  # a stopped stage's 10 s of grace, the summary and the archive
MIN_STAGE_S = 10  # a stage with less time left is skipped
SMOKE_STAGE_S = 900  # every smoke stage's own limit: a loaded 2-core CPU, not a GPU's minutes
KILL_GRACE_S = 10  # between a stage's SIGTERM at its limit and SIGKILL
REMAINDER, TIME_LEFT = "remainder", "time left"
# stage -> (GPU budget s, kind): "fixed" stages run under their budget; `pretrain` gets what the fixed stages leave
# of the deadline (more when they finish early); "time left" stages run only when time is left, under at most their
# budget; "cpu": computed beforehand on the CPU, never on the GPU.
PLAN = {
    "unpack": (30, "fixed"),  # 52 MB of xz: 8 s on this project's loaded 2-core CPU
    "env": (45, "fixed"),  # a cold machine's first torch import can take 10-20 s
    "checks": (45, "fixed"),
    "eager": (60, "fixed"),
    "compiled": (150, "fixed"),
    "pretrain": (None, REMAINDER),
    "glue": (90, "fixed"),
    "glue_baseline": (0, "cpu"),
    "glue_0625": (90, TIME_LEFT),
    "cudagraphs": (150, TIME_LEFT),
    "hf_compiled": (150, TIME_LEFT),
    "loss_check": (120, TIME_LEFT),
    "fp16": (120, TIME_LEFT),
    "batch_256": (100, TIME_LEFT),
}
# `pretrain`'s time outside its --budget (which counts training time only): start-up (imports, data, the compile
# check from the inductor cache the compiled stage filled, the first step), five checkpoints with their held-out
# evaluation and resume states, exit. An estimate until a GPU run measures it (summary.json: pretrain.overhead_s).
PRETRAIN_OVERHEAD_S = 70
MIN_TRAIN_S = 20
SMOKE_TRAIN_S = 6  # the smoke run's pre-training budget: a time budget, as on the GPU, at a toy size
EXPECTED_TOKENS_PER_S = (1.5e6, 2.5e6)  # the ELECTRA-Small 128 x 128 bf16 floor and goal on an H100


def gpu_plan() -> dict:
    """The GPU budgets added up: the fixed stages, `pretrain`'s remainder (its stage and its training seconds) and
    the summary's reserve; "time left" stages plan no time of their own."""
    fixed = sum(b for b, kind in PLAN.values() if kind == "fixed")
    reserve = SUMMARY_RESERVE_S["gpu"]
    pretrain_s = DEADLINE_S["gpu"] - reserve - fixed
    stages = {s: pretrain_s if kind == REMAINDER else (b if kind == "fixed" else 0) for s, (b, kind) in PLAN.items()}
    return {"stages": stages, "summary_reserve_s": reserve, "total_s": fixed + pretrain_s + reserve,
            "pretrain_stage_s": pretrain_s, "pretrain_train_s": pretrain_s - PRETRAIN_OVERHEAD_S}


def pretrain_seconds(left_s: float) -> tuple[int, int]:
    """(stage limit, --budget seconds) of a GPU `pretrain` that starts `left_s` seconds before the deadline: the
    stage gets what the summary's reserve and the fixed stages after it leave; training, that less its overhead."""
    after = list(PLAN)[list(PLAN).index("pretrain") + 1:]
    stage = int(left_s - SUMMARY_RESERVE_S["gpu"] - sum(PLAN[s][0] for s in after if PLAN[s][1] == "fixed"))
    return stage, max(stage - PRETRAIN_OVERHEAD_S, MIN_TRAIN_S)


# ---------------------------------------------------------------------------------------------------------------
# What each stage runs, on the GPU and (toy sizes) on the CPU.
# ---------------------------------------------------------------------------------------------------------------

SIZES = {
    "gpu": {"device": ["--device", "cuda"], "train_device": ["--gpu", "0"], "model": ["--recipe", "electra-small"],
            "batch": "128", "batch_256": "256", "seq_len": "128", "fp16": "fp16", "loss_steps": "20",
            "timing": ["--rounds", "8", "--warmup", "2", "--calls-per-round", "20"], "profile": ["--profile", "3"]},
    "smoke": {"device": ["--device", "cpu", "--threads", "1"], "train_device": ["--device", "cpu"],
              "model": ["--recipe", "tiny", "--set", "model.num_layers=1"], "batch": "2", "batch_256": "4",
              "seq_len": "16", "fp16": "fp32", "loss_steps": "3",
              "timing": ["--rounds", "2", "--warmup", "1", "--calls-per-round", "2", "--no-memory"], "profile": ["--profile", "2"]},
}


def _script(name: str) -> str:
    return str(BENCH / name)


def _step(run: "Run", *extra: str, batch: str = "batch", precision: str = "bf16") -> list[str]:
    z = SIZES[run.mode]
    return [*z["device"], *z["model"], "--batch", z[batch], "--seq-len", z["seq_len"], "--precision", precision, *extra,
            "--out-dir", str(run.stage_dir)]


def _throughput(run: "Run", name: str, compile_mode: str, sides: str, profile: bool = False, **step) -> list[str]:
    z = SIZES[run.mode]
    return [run.python, _script("throughput.py"), *_step(run, "--compile", compile_mode, "--sides", sides, *z["timing"],
                                                          *(z["profile"] if profile else []), **step), "--name", name]


def _checkpoints(run_dir: Path) -> list[Path]:
    """A run's fraction checkpoints that are complete (config.json is written last), by fraction."""
    found = [p for p in run_dir.glob("ckpt-*") if re.fullmatch(r"ckpt-\d{4,5}", p.name) and (p / "config.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def why_eager(compiled: dict, train_s: int | None) -> str | None:
    """Why `pretrain` should run eager (train.compile=off), from the compiled stage's tinyelectra side, or None.
    Compilation failed there or never finished; or (`train_s` given: the GPU) its cold compile took longer than
    pretrain's training budget. pretrain compiles the same graph (tests/test_gpu_suite.py) and finds it in the
    inductor cache the compiled stage filled; should that ever miss, it would compile cold inside its own limit, and
    a compile longer than the training budget would leave it little time to train or to write its checkpoints."""
    if not compiled.get("compiled"):
        return f"compilation did not work in the compiled stage ({compiled.get('compile_note') or 'the compiled stage did not finish'})"
    cold = compiled.get("first_call_s")
    if train_s is not None and cold is not None and cold > train_s:
        return (f"the compiled stage's cold compile took {cold:.0f} s, more than pretrain's {train_s} s of training "
                "(a miss of its inductor cache would be compiled again inside pretrain's limit)")
    return None


def stage_pretrain(run: "Run") -> list[str] | str:
    if not (run.pack / "pretrain" / "manifest.json").is_file():
        return "no unpacked pre-training data (the unpack stage did not finish)"
    z, p = SIZES[run.mode], PRETRAIN[run.mode]
    sets = list(p["sets"])
    if run.mode == "gpu":
        limit, train_s = pretrain_seconds(run.left())
        if limit < MIN_STAGE_S + MIN_TRAIN_S:
            return f"too little time left: {limit} s after GLUE's share"
        run.limits["pretrain"] = limit
    else:
        train_s = SMOKE_TRAIN_S
    compiled = _get(_load(run.stage_dir / "compiled.json"), "tinyelectra") or {}
    if why := why_eager(compiled, train_s if run.mode == "gpu" else None):
        sets.append("train.compile=off")
        run.note("pretrain", f"eager: {why}")
    return [run.python, "-m", "tinyelectra", "train", "--recipe", p["recipe"], "--data", str(run.pack / "pretrain"),
            "--budget", f"{train_s}s", *z["train_device"], "--out", str(run.work / "pretrain"),
            *(a for s in sets for a in ("--set", s))]


def _glue(run: "Run", checkpoint: Path | None, why_not: str) -> list[str] | str:
    if checkpoint is None:
        return why_not
    tasks = list((_load(run.pack / "pack.json") or {}).get("glue", {}).get("tasks", {}))
    if not tasks:
        return "no unpacked GLUE tasks"
    return [run.python, "-m", "tinyelectra", *glue_args(run.mode, checkpoint, run.pack / "glue", tasks, run.work / "glue",
                                                        SIZES[run.mode]["train_device"])]


def stage_glue(run: "Run") -> list[str] | str:
    found = _checkpoints(run.work / "pretrain")
    if found and found[-1].name != "ckpt-10000":
        run.note("glue", f"pretrain stopped before its end: GLUE on {found[-1].name}, its last checkpoint")
    return _glue(run, found[-1] if found else None, "no checkpoint (pretrain wrote none)")


def stage_glue_0625(run: "Run") -> list[str] | str:
    found = [p.name for p in _checkpoints(run.work / "pretrain")]
    if found[-1:] == ["ckpt-0625"]:
        return "ckpt-0625 is the run's last checkpoint: the glue stage ran on it"
    return _glue(run, run.work / "pretrain" / "ckpt-0625" if "ckpt-0625" in found else None, "no ckpt-0625")


def stage_glue_baseline(run: "Run") -> list[str] | str:
    if run.mode == "gpu":
        return f"computed beforehand on the CPU (benchmarks/glue_baseline.py -> {BASELINE_RESULT.relative_to(ROOT)})"
    return [run.python, _script("glue_baseline.py"), "--lease", str(run.lease), "--work", str(run.work / "baseline"),
            "--out-dir", str(run.stage_dir), "--name", "glue_baseline"]


STAGES = {  # stage -> its command (or why it cannot run), built when the stage starts
    "unpack": lambda r: [r.python, _script("pack.py"), "unpack", str(r.lease), str(r.pack)],
    "env": lambda r: [r.python, _script("device_checks.py"), "env", "--mode", r.mode, "--out-dir", str(r.stage_dir)],
    "checks": lambda r: [r.python, _script("device_checks.py"), "checks", *_step(r)],
    "eager": lambda r: _throughput(r, "eager", "off", "both", profile=True),
    "compiled": lambda r: _throughput(r, "compiled", "on", "tinyelectra", profile=True),
    "pretrain": stage_pretrain,
    "glue": stage_glue,
    "glue_baseline": stage_glue_baseline,
    "glue_0625": stage_glue_0625,
    "cudagraphs": lambda r: _throughput(r, "cudagraphs", "reduce-overhead", "tinyelectra", profile=True),
    "hf_compiled": lambda r: _throughput(r, "hf_compiled", "on", "transformers"),
    "loss_check": lambda r: [r.python, _script("loss_check.py"), *_step(r, "--compile", "on", "--steps", SIZES[r.mode]["loss_steps"]),
                             "--name", "loss_check"],
    "fp16": lambda r: _throughput(r, "fp16", "on", "tinyelectra", precision=SIZES[r.mode]["fp16"]),
    "batch_256": lambda r: _throughput(r, "batch_256", "on", "tinyelectra", batch="batch_256"),
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
    """One run of the suite: its folders, its clock, the stage records and the notes stages leave for later ones."""

    def __init__(self, mode: str, lease: Path, out_dir: Path, work: Path) -> None:
        self.mode, self.lease, self.out_dir, self.work = mode, lease, out_dir, work
        self.name = f"{'gpu-suite' if mode == 'gpu' else 'cpu-smoke'}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        self.stage_dir = work / self.name  # becomes the archive
        self.pack = work / "pack"
        self.python = sys.executable
        self.t0 = time.monotonic()
        self.deadline_s = int(os.environ.get("SUITE_DEADLINE_S", DEADLINE_S[mode]))
        self.records: list[dict] = []
        self.notes: dict[str, list[str]] = {}
        self.limits: dict[str, int] = {}  # limits a stage's builder decided (pretrain's remainder)
        self.interrupted: str | None = None  # SIGTERM or SIGINT: the running stage is stopped, the results written
        (self.stage_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.log = open(out_dir / "suite.log", "w", encoding="utf-8")  # noqa: SIM115 - open for the whole run
        site = installed_copy(work)  # first on the stages' path: the package as users install it
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
                    "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache")}
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

    def budget(self, stage: str) -> tuple[int | None, str]:
        """The stage's time limit now, or None and why it does not run."""
        only = [s.strip() for s in os.environ.get("SUITE_ONLY", "").split(",") if s.strip()]
        if only and stage not in only:
            return None, f"not selected (SUITE_ONLY={','.join(only)})"
        left = int(self.left() - SUMMARY_RESERVE_S[self.mode])
        planned, kind = PLAN[stage]
        limit = SMOKE_STAGE_S if self.mode == "smoke" else (planned if planned is not None else left)
        limit = int(os.environ.get(f"SUITE_BUDGET_{stage.upper()}", limit))
        if left < MIN_STAGE_S:
            return None, "suite time limit reached"
        return min(limit, left), ""

    def stage(self, name: str) -> None:
        """Run one stage under its limit, its output in logs/NAME.log, and record it whatever happens (a fault of the
        suite's own, building or starting the command, fails this stage, not the run)."""
        t0 = time.monotonic()
        limit, command = 0, []
        try:
            limit, why = self.budget(name)
            command = STAGES[name](self) if limit is not None else why
            if isinstance(command, str):
                return self.record(name, "skipped", None, 0.0, limit or 0, command, [])
            limit = min(self.limits.pop(name, limit), limit)
            log = self.stage_dir / "logs" / f"{name}.log"
            with open(log, "w", encoding="utf-8") as out:
                out.write(f"[suite] {name}: {' '.join(command)}\n")
                out.flush()
                # in the work folder: `python -m` and `-c` put the current folder first on the path, and the checkout's
                # tinyelectra/ (no recipes in it) would shadow the installed copy on a machine where nothing is installed
                proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.work,
                                        env=self.env, start_new_session=True)  # its own process group: stopped whole
                rc, status = self.wait(proc, t0 + limit)
        except Exception as e:  # noqa: BLE001 - recorded; the next stages and the summary still run
            return self.record(name, "failed", None, time.monotonic() - t0, limit or 0, f"the suite: {type(e).__name__}: {e}", command)
        note = "; ".join(self.notes.get(name, []) + (["the suite was interrupted"] if status == "interrupted" else []))
        if status not in ("ok", "interrupted"):
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
            note = "; ".join(filter(None, [note, tail[-1][:300] if tail else ""]))
            self.say(f"[suite] --- last lines of logs/{name}.log ---\n" + "\n".join(tail) + "\n[suite] ---")
        self.record(name, status, rc, time.monotonic() - t0, limit, note, command)

    def wait(self, proc: subprocess.Popen, until: float) -> tuple[int | None, str]:
        """(exit code, status) of a stage: ok / failed when it ends, timed_out at its limit (stopped, exit code 124),
        interrupted when a signal reached the suite (stopped). Looks twice a second."""
        while True:
            if self.interrupted:
                _stop(proc)
                return None, "interrupted"
            try:
                rc = proc.wait(timeout=max(0.0, min(0.5, until - time.monotonic())))
                return rc, "ok" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                if time.monotonic() >= until:
                    _stop(proc)
                    return 124, "timed_out"

    def record(self, name: str, status: str, rc: int | None, seconds: float, limit: int, note: str, command: list[str]) -> None:
        planned, kind = PLAN[name]
        rec = {"stage": name, "status": status, "rc": rc, "seconds": round(seconds, 1), "budget_s": limit,
               "gpu_budget_s": gpu_plan()["stages"][name], "kind": kind, "note": note,
               "log": f"logs/{name}.log" if (self.stage_dir / "logs" / f"{name}.log").is_file() else None,
               "command": " ".join(command)}
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
    """Copy what the user-facing commands wrote into the archive's folder (never the weights): the pre-training
    run's plan, summary, metrics, recipe and each checkpoint's meta.json; every glue.json; pack.json."""
    pre = run.work / "pretrain"
    wanted = [pre / n for n in ("plan.json", "summary.json", "metrics.jsonl", "recipe.json")] + sorted(pre.glob("ckpt-*/meta.json"))
    for src in wanted + sorted((run.work / "glue").glob("*/glue.json")) + [run.pack / "pack.json"]:
        if src.is_file():
            dst = run.stage_dir / src.relative_to(run.work)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    for log in (run.stage_dir / "logs").glob("*.log"):  # a runaway log would not come back (16 MiB a file)
        if log.stat().st_size > 4 * 2**20:
            data = log.read_bytes()
            log.write_bytes(data[: 2**20] + b"\n[suite] ... cut: the log was too long ...\n" + data[-2 * 2**20:])


def finish(run: Run, interrupted: str | None) -> int:
    """summary.json, the archive, then the table: the last lines printed. A fault in reading the stages' files still
    leaves a summary of the stage records and the archive."""
    seconds = time.monotonic() - run.t0
    try:
        collect(run)
        doc = summarize(run.stage_dir, run.records, run.mode, seconds, run.deadline_s, interrupted)
        text = table(doc)
    except Exception as e:  # noqa: BLE001 - the records and the files are what the lease leaves: keep them
        doc = {"benchmark": "gpu_suite", "mode": run.mode, "seconds": round(seconds, 1), "deadline_s": run.deadline_s,
               "interrupted": interrupted, "gpu_plan_total_s": gpu_plan()["total_s"], "stages": run.records,
               "summary_error": f"{type(e).__name__}: {e}"}
        text = "\n".join([f"[suite] {r['stage']}: {r['status']} ({r['seconds']} s) {r['note']}" for r in run.records]
                         + [f"summary failed ({type(e).__name__}: {e}): the stages' files are in the archive"])
    doc["table"] = text.splitlines()
    (run.stage_dir / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    shutil.copyfile(run.stage_dir / "summary.json", run.out_dir / "summary.json")
    run.log.write(text + "\n")
    run.log.flush()
    shutil.copyfile(run.out_dir / "suite.log", run.stage_dir / "suite.log")
    archive = run.out_dir / f"{run.name}.tar.gz"
    with tarfile.open(archive.with_suffix(".tmp"), "w:gz") as tar:
        tar.add(run.stage_dir, arcname=run.name)
    os.replace(archive.with_suffix(".tmp"), archive)
    print(f"[suite] results: {archive}, {run.out_dir / 'summary.json'}, {run.out_dir / 'suite.log'}")
    print(text, flush=True)
    run.log.close()
    if interrupted:
        return 130
    return 1 if any(r["status"] in ("failed", "timed_out") for r in run.records) else 0


def run_suite(args) -> int:
    mode = "smoke" if args.cpu_smoke else "gpu"
    out_dir = Path(os.environ.get("OUT") or args.out or BENCH / "results" / f"{mode}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    lease = Path(args.lease).resolve() if args.lease else None
    if mode == "gpu":
        info = (lease or ROOT / ".lease") / "pack.json"
        if not info.is_file():
            _fail(f"{info} not found: build the pack first (bash benchmarks/gpu_suite.sh --pack)")
        if (kind := (_load(info) or {}).get("kind")) != "gpu":
            _fail(f"{info}: a {kind or 'unknown'} pack, not the GPU run's (its rows would not fit electra-small): build it "
                  "with bash benchmarks/gpu_suite.sh --pack")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        work = Path(os.environ.get("SUITE_WORK") or _mkdtemp())
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"{e.filename}: {e.strerror}")
    run = Run(mode, lease or (ROOT / ".lease" if mode == "gpu" else work.resolve() / "lease"), out_dir.resolve(), work.resolve())
    for sig in (signal.SIGTERM, signal.SIGINT):  # noted; the stage waiting stops its process and the suite ends
        signal.signal(sig, lambda signum, frame: setattr(run, "interrupted", signal.Signals(signum).name))
    run.say(f"[suite] {mode}: deadline {run.deadline_s} s, pack {run.lease}, work folder {work}, results in {out_dir}")
    if mode == "smoke" and lease is None:  # the toy pack (seconds), before the stages
        with open(run.stage_dir / "logs" / "smoke_pack.log", "w", encoding="utf-8") as f:
            built = subprocess.run([run.python, _script("pack.py"), "build", str(run.lease), "--smoke"], stdout=f,
                                   stderr=subprocess.STDOUT, cwd=ROOT, env=run.env)
        if built.returncode != 0:
            run.say("[suite] could not build the smoke pack (it needs ../shared/data): see logs/smoke_pack.log")
    for name in PLAN:
        if run.interrupted:
            break
        run.stage(name)
    if run.interrupted:
        run.say(f"[suite] interrupted ({run.interrupted}): writing the summary and the archive")
    return finish(run, run.interrupted)


def _fail(message: str) -> None:
    """Bad input: one line on stderr, exit code 2, nothing started."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _mkdtemp() -> str:
    import tempfile  # noqa: PLC0415

    return tempfile.mkdtemp(prefix="tinyelectra-suite.")


# ---------------------------------------------------------------------------------------------------------------
# The summary: what the stages wrote, the figures, the GLUE comparison, the table.
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
            "mfu_measured_peak": mfu(s["tokens_per_s"], doc.get("hardware_flops_per_token"), measured * 1e12 if measured else None),
            "peak_memory_gib": peak / 2**30 if peak else None, "compile_note": s.get("compile_note"),
            "attention_dispatcher": _get(s, "attention_dispatcher", "summary") or s.get("attention_dispatcher"),
            "attention_seen": _get(s, "profile", "attention_seen"),
            "kernel_launches_per_step": _get(s, "profile", "kernel_launches_per_step"),
            "cuda_graphs": _get(s, "cuda_graphs", "label"),
            "measured_as": f"{doc.get('device')}, {doc.get('recipe')} {' '.join(doc.get('overrides') or [])}, batch "
                           f"{doc.get('batch_size')} x {doc.get('seq_len')}, {doc.get('precision')}, compile {doc.get('compile')}",
            "complete": doc.get("complete")}


def pretrain_figures(d: Path, pack: dict | None, record: dict | None) -> dict:
    """The pre-training run from its own files: steps, tokens, epochs over the pack, time, speed, each checkpoint's
    held-out verdict. Works on a run stopped early (no summary.json): from metrics.jsonl."""
    summary = _load(d / "pretrain" / "summary.json") or {}
    lines = (d / "pretrain" / "metrics.jsonl").read_text().splitlines() if (d / "pretrain" / "metrics.jsonl").is_file() else []
    records = [json.loads(x) for x in lines if x.strip()]
    steps = [r for r in records if "event" not in r]
    ckpts = {r["name"]: r for r in records if r.get("event") == "checkpoint"}
    last = steps[-1] if steps else {}
    tokens = summary.get("tokens_seen", last.get("tokens_seen"))
    pack_tokens = _get(pack, "pretrain", "tokens", "train")
    process = summary.get("process_seconds") or {}
    final = list(ckpts.values())[-1] if ckpts else None
    return {"command": (record or {}).get("command"), "finished": bool(summary), "steps": summary.get("steps", last.get("step")),
            "tokens_seen": tokens, "epochs": tokens / pack_tokens if tokens and pack_tokens else None,
            "train_seconds": summary.get("train_seconds", last.get("train_seconds")), "budget": _get(_load(d / "pretrain" / "plan.json"), "budget"),
            "startup_s": _get(summary, "excluded_seconds", "startup_and_first_step"),
            "checkpoints_eval_state_s": _get(summary, "excluded_seconds", "checkpoints_eval_state"),
            "overhead_s": process["wall"] - process["training"] if process.get("wall") else None,
            "compile": _get(summary, "runtime", "compile"), "attention": _get(summary, "runtime", "attention"),
            "median_tokens_per_second": summary.get("median_tokens_per_second"),  # the trainer's own, once it records it
            "peak_gpu_memory_gib": summary.get("peak_gpu_memory_gib"),
            "metrics_median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in steps[1:]) if len(steps) > 1 else None,
            "checkpoints": {n: {"step": c.get("step"), "eval": c.get("eval")} for n, c in ckpts.items()},
            "final_verdict": f"{final['name']}: {_get(final, 'eval', 'verdict')}" if final else None}


PROTOCOL_KEYS = ("settings", "max_train_rows", "epochs", "swapped_pairs", "peak_lr", "layerwise_decay")


def protocol_differences(a: dict, b: dict, pack_a: str | None, pack_b: str | None) -> list[str]:
    """What differs between two glue.json files' protocols (settings, row cap, epochs, seeds, the rows each task
    trained and was scored on, the model's shape) and the packs' tokenizers: an empty list means the same protocol."""
    out = [f"protocol {k}: {_get(a, 'protocol', k)!r} vs {_get(b, 'protocol', k)!r}" for k in PROTOCOL_KEYS
           if _get(a, "protocol", k) != _get(b, "protocol", k)]
    out += [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in ("seeds", "model") if a.get(k) != b.get(k)]
    for task in sorted(set(a.get("tasks", {})) & set(b.get("tasks", {}))):
        for split, da in (_get(a, "data", task) or {}).items():
            if _get(da, "sha256") != _get(b, "data", task, split, "sha256"):
                out.append(f"{task} {split}: other rows")
    if pack_a != pack_b:
        out.append(f"tokenizer: {pack_a} vs {pack_b}")
    return out


def glue_figures(d: Path, baseline: dict | None, pack: dict | None) -> dict:
    """Per task: the final (or last) checkpoint's, ckpt-0625's and the no-pre-training median dev scores; averages
    over the tasks all present sides share; whether the protocols match."""
    runs = {p.parent.name: _load(p) for p in sorted((d / "glue").glob("*/glue.json"))}
    final = max(runs, key=lambda n: int(n[5:]), default=None)  # ckpt-NNNN: the largest fraction is the final
    base = _get(baseline, "glue")
    sides = {"pre-trained": runs.get(final), "ckpt-0625": runs.get("ckpt-0625") if final != "ckpt-0625" else None,
             "no pre-training": base}
    tasks: dict = {}
    for label, g in sides.items():
        for task, entry in (_get(g, "tasks") or {}).items():
            t = tasks.setdefault(task, {"metric": entry.get("paper_metric")})
            t[label] = entry.get("median_paper")
            if "majority_class" in entry:  # glue.json's own: every dev row given the training rows' commonest class
                t["majority class"] = _get(entry, "majority_class", "paper_score")
    averages = {}
    shared = [t for t, v in tasks.items() if v.get("pre-trained") is not None and v.get("no pre-training") is not None]
    for label in sides:
        values = [tasks[t].get(label) for t in shared]
        averages[label] = statistics.fmean(values) if shared and all(v is not None for v in values) else None
    wins = sum(tasks[t]["pre-trained"] > tasks[t]["no pre-training"] for t in shared)
    differences = protocol_differences(runs[final], base, _get(pack, "pretrain", "tokenizer_fingerprint"),
                                       _get(baseline, "pack", "tokenizer_fingerprint")) if final and base else None
    return {"checkpoint": final, "complete": _get(runs.get(final), "complete"), "tasks": tasks, "averages_over": shared,
            "averages": averages,
            "pretrained_better_on": f"{wins} of {len(shared)} tasks" if shared else None,
            "protocol": {"seeds": _get(runs.get(final), "seeds"), **(_get(runs.get(final), "protocol") or {})} if final else None,
            "protocol_differences_from_baseline": differences,
            "baseline": {"machine": _get(baseline, "machine", "cpu"), "threads": _get(baseline, "threads"),
                         "commit": _get(baseline, "git_commit"), "date_utc": _get(baseline, "date_utc")} if baseline else None}


TARGETS = {"tokens_per_s_floor": 1.5e6, "tokens_per_s_goal": 2.5e6, "eager_ratio": 2.0, "compiled_ratio": 1.5,
           "peak_memory_gib": 1.5}  # the issue's, for ELECTRA-Small 128 x 128 bf16 on an H100


def summarize(d: Path, records: list[dict], mode: str, seconds: float, deadline_s: int, interrupted: str | None) -> dict:
    """summary.json from the archive's folder `d` and the stage records (see the module docstring)."""
    docs = {p.stem: _load(p) for p in d.glob("*.json") if p.name != "summary.json"}
    env, pack = docs.get("env"), _load(d / "pack" / "pack.json")
    baseline = docs.get("glue_baseline") if mode == "smoke" else _load(BASELINE_RESULT)
    speed = {"tinyelectra eager": side_figures(docs.get("eager"), "tinyelectra", env),
             "transformers eager": side_figures(docs.get("eager"), "transformers", env),
             "tinyelectra compiled": side_figures(docs.get("compiled"), "tinyelectra", env),
             "transformers compiled": side_figures(docs.get("hf_compiled"), "transformers", env),
             "tinyelectra CUDA graphs": side_figures(docs.get("cudagraphs"), "tinyelectra", env),
             "tinyelectra fp16 compiled": side_figures(docs.get("fp16"), "tinyelectra", env),
             "tinyelectra compiled batch 256": side_figures(docs.get("batch_256"), "tinyelectra", env)}
    tok = {k: (v or {}).get("tokens_per_s") for k, v in speed.items()}
    ratios = {"eager (paired rounds in one process)": _get(docs.get("eager"), "speedup", "median_of_round_ratios"),
              "compiled (separate stages, same card)": tok["tinyelectra compiled"] / tok["transformers compiled"]
              if tok["tinyelectra compiled"] and tok["transformers compiled"] else None}
    compiled = speed["tinyelectra compiled"] or {}
    targets = {
        "compiled tokens/s >= 1.5M (floor), 2.5M (goal)": [tok["tinyelectra compiled"], tok["tinyelectra compiled"] >= TARGETS["tokens_per_s_floor"]
                                                           if tok["tinyelectra compiled"] else None],
        "eager >= 2x transformers": [ratios["eager (paired rounds in one process)"], ratios["eager (paired rounds in one process)"] >= TARGETS["eager_ratio"]
                                     if ratios["eager (paired rounds in one process)"] else None],
        "compiled >= 1.5x transformers": [ratios["compiled (separate stages, same card)"], ratios["compiled (separate stages, same card)"] >= TARGETS["compiled_ratio"]
                                          if ratios["compiled (separate stages, same card)"] else None],
        "peak memory <= 1.5 GiB (compiled, batch 128)": [compiled.get("peak_memory_gib"), compiled["peak_memory_gib"] <= TARGETS["peak_memory_gib"]
                                                         if compiled.get("peak_memory_gib") else None],
    }
    record = {r["stage"]: r for r in records}
    plan = gpu_plan()
    doc = {
        "benchmark": "gpu_suite", "mode": mode, "git_commit": _git_commit(pack), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": (env or {}).get("gpu") or ("cpu" if env else None), "torch": (env or {}).get("torch"),
        "seconds": round(seconds, 1), "deadline_s": deadline_s, "within_deadline": seconds <= deadline_s, "interrupted": interrupted,
        "gpu_plan": plan["stages"], "gpu_plan_total_s": plan["total_s"], "gpu_plan_pretrain_train_s": plan["pretrain_train_s"],
        "stages": records, "env": env, "ceilings": _get(env, "ceilings"), "checks": docs.get("checks"),
        "speed": speed, "ratios": ratios, "targets": targets,
        "pretrain": {**pretrain_figures(d, pack, record.get("pretrain")),
                     "compiled_stage_first_call_s": _get(docs.get("compiled"), "tinyelectra", "first_call_s")},
        "glue": glue_figures(d, baseline, pack), "pack": pack,
        "loss_check": {k: _get(docs.get("loss_check"), k) for k in ("max_abs_loss_difference", "max_rel_loss_difference", "finite")},
    }
    doc["unmeasured"] = [k for k, v in {**speed, **ratios}.items() if v is None] + \
        [f"GLUE {t} {side}" for t, v in doc["glue"]["tasks"].items() for side in ("pre-trained", "no pre-training") if v.get(side) is None]
    if mode == "smoke":
        doc["note"] = ("CPU smoke run: every stage at toy size on the CPU (one layer of the tiny recipe, a toy pack); compile "
                       "stages use the aot_eager backend, fp16 runs fp32, CUDA graphs do not exist: it checks the machinery, "
                       "and none of these figures is a GPU figure")
    return doc


def _git_commit(pack: dict | None) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        if os.environ.get("SUITE_GIT_COMMIT"):
            return f"{os.environ['SUITE_GIT_COMMIT']} (SUITE_GIT_COMMIT)"
        return f"unknown (no .git; the pack was built at {_get(pack, 'git_commit')})"


def _n(x, fmt: str = "{:,.0f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def table(doc: dict) -> str:
    """The short table printed last: the last lines of the output alone say what happened."""
    out = [f"== tinyelectra GPU suite ({doc['mode']}): {doc['device'] or 'device unknown'}, torch {doc['torch'] or '-'}, commit {str(doc['git_commit'])[:12]}; "
           f"{doc['seconds']:.0f} s of {doc['deadline_s']} s" + (f"; INTERRUPTED ({doc['interrupted']})" if doc["interrupted"] else "")]
    out.append("stages: " + ", ".join(f"{r['stage']} {r['status']}" + (f" {r['seconds']:.0f}s" if r["status"] != "skipped" else "")
                                      for r in doc["stages"]))
    c = doc["ceilings"] or {}
    share = f" ({c['gemm_share_of_datasheet']:.0%} of the datasheet's {c['datasheet_bf16_tflops']:.0f})" if c.get("gemm_share_of_datasheet") else ""
    out.append(f"ceilings: matrix product {_n(c.get('gemm_tflops'), '{:.3g}')} TFLOP/s{share}; copy {_n(c.get('copy_gb_per_s'))} GB/s")
    ch = doc["checks"] or {}
    sdpa = ch.get("sdpa_gradients") or {}
    bad = {n: sorted({v for v in cases.values() if v != "ok" and not v.startswith("not available")})
           for n, cases in (sdpa.get("cases") or {}).items() if n in (sdpa.get("unsafe") or [])}
    unsafe = "; ".join(f"{n} ({', '.join(v)})" for n, v in bad.items()) or "none"
    out.append(f"checks: training step {'finite' if _get(ch, 'train_step', 'finite') else 'NOT finite or not run'}; SDPA gradients "
               f"safe: {', '.join(sdpa.get('safe') or []) or '-'}; unsafe: {unsafe}")
    sp = doc["speed"]
    te = sp["tinyelectra eager"] or {}
    out.append(f"attention: dispatcher {te.get('attention_dispatcher') or '-'}; seen in the profile: eager "
               f"{te.get('attention_seen') or '-'}, compiled {(sp['tinyelectra compiled'] or {}).get('attention_seen') or '-'}")
    shape = (sp["tinyelectra eager"] or sp["tinyelectra compiled"] or {}).get("measured_as", "").split(", compile")[0]
    out.append(f"speed ({shape or 'not measured'})")
    out.append(f"  {'':<32}{'tokens/s':>12}{'MFU datasheet':>15}{'MFU measured':>14}{'peak GiB':>10}")
    for name, s in sp.items():
        if s is None and name not in ("tinyelectra eager", "transformers eager", "tinyelectra compiled", "transformers compiled"):
            continue
        s = s or {}
        out.append(f"  {name:<32}{_n(s.get('tokens_per_s')):>12}{_n(s.get('mfu_datasheet'), '{:.1%}'):>15}"
                   f"{_n(s.get('mfu_measured_peak'), '{:.1%}'):>14}{_n(s.get('peak_memory_gib'), '{:.2f}'):>10}"
                   + ("" if s else "  (not measured)"))
    r = doc["ratios"]
    out.append("  tinyelectra / transformers: " + "; ".join(f"{k} {_n(v, '{:.2f}x')}" for k, v in r.items()))
    cg = sp.get("tinyelectra CUDA graphs")
    out.append(f"  CUDA graphs: {(cg or {}).get('cuda_graphs') or 'not measured (extra stage not run)'}")
    p = doc["pretrain"]
    if p["steps"] is None:
        out.append("pretrain: no step recorded (see its stage)")
    else:
        out.append(f"pretrain: {_n(p['steps'])} steps, {_n(p['tokens_seen'] / 1e6 if p['tokens_seen'] else None, '{:.1f}')}M tokens "
                   f"({_n(p['epochs'], '{:.1f}')} epochs of the pack) in {_n(p['train_seconds'], '{:.0f}')} s of training (--budget "
                   f"{p['budget']}), +{_n(p['overhead_s'], '{:.0f}')} s start-up and checkpoints; "
                   f"{_n(p['metrics_median_tokens_per_second'])} tokens/s median" + ("" if p["finished"] else "; STOPPED before its end"))
        out.append(f"  start-up {_n(p['startup_s'], '{:.0f}')} s, compile included (the compiled stage's first call, a cold "
                   f"compile: {_n(p['compiled_stage_first_call_s'], '{:.0f}')} s); {p['compile'] or 'compile: not recorded'}")
        out.append(f"  {p['final_verdict'] or 'no checkpoint'}")
    g = doc["glue"]
    proto = g["protocol"] or {}
    same = g["protocol_differences_from_baseline"]
    out.append(f"GLUE dev ({g['checkpoint'] or 'no checkpoint'}{'' if g['complete'] in (True, None) else ', STOPPED: the tasks it finished'}; "
               f"{_n(len(proto.get('seeds') or []) or None)} seed, <= {_n(proto.get('max_train_rows'))} train rows; no pre-training: "
               f"{(g['baseline'] or {}).get('machine') or 'none recorded'}; "
               f"protocol {'identical' if same == [] else 'DIFFERS: ' + '; '.join(same) if same else 'not compared'})")
    out.append(f"  {'task (metric)':<28}{'pre-trained':>12}{'ckpt-0625':>11}{'no pre-training':>17}{'majority class':>16}")
    for task, v in g["tasks"].items():
        out.append(f"  {task + ' (' + str(v.get('metric')) + ')':<28}{_n(v.get('pre-trained'), '{:.1f}'):>12}"
                   f"{_n(v.get('ckpt-0625'), '{:.1f}'):>11}{_n(v.get('no pre-training'), '{:.1f}'):>17}"
                   f"{_n(v.get('majority class'), '{:.1f}'):>16}")
    a = g["averages"]
    out.append(f"  {'average of ' + str(len(g['averages_over'])) + ' tasks':<28}{_n(a.get('pre-trained'), '{:.1f}'):>12}"
               f"{_n(a.get('ckpt-0625'), '{:.1f}'):>11}{_n(a.get('no pre-training'), '{:.1f}'):>17}")
    if g["pretrained_better_on"]:
        gap = a["pre-trained"] - a["no pre-training"] if a.get("pre-trained") is not None and a.get("no pre-training") is not None else None
        out.append(f"verdict: pre-training beats no pre-training on {g['pretrained_better_on']}, average {_n(gap, '{:+.1f}')} points")
    else:
        out.append("verdict: no GLUE comparison (a side is missing: see stages)")
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
    r = sub.add_parser("run", help="run the suite")
    r.add_argument("--cpu-smoke", action="store_true", help="every stage at toy size on the CPU")
    r.add_argument("--lease", default=None, help="the pack (default .lease/; --cpu-smoke: a toy pack it builds)")
    r.add_argument("--out", default=None, help="where the three files go ($OUT when set; default benchmarks/results/<mode>-<stamp>/)")
    s = sub.add_parser("summary", help="print the table of an extracted archive")
    s.add_argument("dir")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "run":
        return run_suite(args)
    d = Path(args.dir)
    doc = _load(d / "summary.json")
    if doc is None:
        _fail(f"{d / 'summary.json'}: not found or not JSON (an extracted suite archive?)")
    again = summarize(d, doc["stages"], doc["mode"], doc["seconds"], doc["deadline_s"], doc.get("interrupted"))
    print(table({**again, "git_commit": doc["git_commit"]}))  # the commit that ran, not this checkout's
    return 0


if __name__ == "__main__":
    sys.exit(main())
