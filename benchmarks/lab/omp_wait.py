"""How torch's OpenMP threads wait, measured: tokens/s of the trainer's step (throughput.py's `TrainerStep`, the body
of `tinyelectra.train.train`'s loop) under libgomp's wait policies and thread counts, on a quiet CPU and with one
core busy with another program.

    python -m benchmarks.lab.omp_wait --recipe tiny --condition quiet            # waits for a load average < 0.3
    python -m benchmarks.lab.omp_wait --recipe tiny --condition busy
    python -m benchmarks.lab.omp_wait --recipe electra-small --condition busy --rounds 3 --warmup 1 --steps 3
      -> benchmarks/lab/results/omp_wait_cpu.json: one section per recipe and condition, rewritten after every round;
         an interrupted run continues with the rounds it still needs

libgomp reads OMP_WAIT_POLICY, GOMP_SPINCOUNT and OMP_NUM_THREADS once, when torch loads it, so every measurement
is a process of its own (`--child`), started with one variant's environment; libgomp's own account of what it read
(OMP_DISPLAY_ENV=VERBOSE) is recorded beside it. Variants (`VARIANTS`): libgomp's default (a waiting thread spins
300,000 times, then sleeps), OMP_WAIT_POLICY=PASSIVE (sleeps at once), one thread, and shorter spins. A round runs
every variant once, in reversed order every other round; the summary gives per-variant medians and the median of the
per-round ratios of tokens/s (tokens = batch x sequence positions).

Conditions. quiet: a round starts once the 1-minute load average is under --quiet-load. busy: one core busy with
another program: a `python -c 'while 1: pass'` pinned to the last core for the round, or, when another program
already keeps one core busy, that program (recorded as the round's `busy_source`).
Load: the 1-minute load average before and after every measurement and, since that average lags by minutes and
counts this benchmark's own processes, the other programs' demand during the timed steps: the time all other
threads on the machine spent running or waiting to run (/proc/*/task/*/schedstat) per second, i.e. the mean number
of runnable threads besides the measured process. A round counts when every measurement's demand lies in its
condition's band (quiet < 0.2, busy 0.8-1.25); other rounds are kept in the file, marked, and left out of the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import child_env
from benchmarks.lab import RESULTS

VARIANTS = {  # name -> the environment libgomp sees (on top of one without any OpenMP variable)
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "threads1": {"OMP_NUM_THREADS": "1"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
}
OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_DISPLAY_ENV")
DEMAND_BAND = {"quiet": (0.0, 0.2), "busy": (0.8, 1.25)}  # runnable threads besides the measured process
# ends with its parent
SPIN = "import os\nos.sched_setaffinity(0, {{{core}}})\np = os.getppid()\nwhile os.getppid() == p: pass"


# ----------------------------------------------------------------------------------------------------------------
# Load: what other programs ask of the CPU.


def runnable_ns(exclude_pid: int) -> dict[str, int]:
    """Every thread's time running + waiting to run so far (ns), by /proc path, leaving out process `exclude_pid`."""
    out = {}
    for path in Path("/proc").glob("[0-9]*/task/*/schedstat"):
        if path.parts[2] == str(exclude_pid):
            continue
        try:
            run_ns, wait_ns, _ = path.read_text().split()
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
        out[str(path)] = int(run_ns) + int(wait_ns)
    return out


def demand(before: dict[str, int], after: dict[str, int], seconds: float) -> float:
    """Mean number of runnable threads over `seconds` among those in both snapshots (see `runnable_ns`)."""
    return sum(after[k] - before[k] for k in after.keys() & before.keys()) / 1e9 / seconds


def top_demand(before: dict[str, int], after: dict[str, int], seconds: float, count: int = 3) -> list[str]:
    """The `count` processes with the most demand in that window, as "command (runnable threads)"."""
    per_pid: dict[str, int] = {}
    for k in after.keys() & before.keys():
        pid = k.split("/")[2]
        per_pid[pid] = per_pid.get(pid, 0) + after[k] - before[k]
    out = []
    for pid, ns in sorted(per_pid.items(), key=lambda kv: -kv[1])[:count]:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cmd = " ".join(raw.split())[:80]
        except OSError:
            cmd = "(ended)"
        out.append(f"{cmd or pid} ({ns / 1e9 / seconds:.2f})")
    return out


def others_demand(seconds: float = 5.0) -> float:
    before, t0 = runnable_ns(os.getpid()), time.perf_counter()
    time.sleep(seconds)
    return demand(before, runnable_ns(os.getpid()), time.perf_counter() - t0)


def load_1min() -> float:
    return round(os.getloadavg()[0], 2)


# ----------------------------------------------------------------------------------------------------------------
# One measurement (child process).


def child(args) -> None:
    """Time --steps trainer steps after --warmup; print one JSON line."""
    import torch  # first: libgomp reads the environment the parent chose when torch loads it

    from benchmarks.throughput import Batches, TrainerStep  # noqa: PLC0415

    from tinyelectra import runtime  # noqa: PLC0415
    from tinyelectra.config import load_recipe  # noqa: PLC0415

    device = torch.device("cpu")
    runtime.tune_cpu()  # as the trainer does
    runtime.configure_matmul("fp32", device)
    recipe = load_recipe(args.recipe, [f"train.batch_size={args.batch}", f"train.seq_len={args.seq_len}",
                                       "train.compile=off"])
    step = TrainerStep(recipe, device, "fp32",
                       Batches(args.data, recipe.model.vocab_size, args.batch, args.seq_len, device))
    step.first_call()
    for _ in range(args.warmup):
        step()
    seconds = []
    before, t0 = runnable_ns(os.getpid()), time.perf_counter()
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t)
    after, window = runnable_ns(os.getpid()), time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": args.batch * args.seq_len / statistics.median(seconds),
                      "others_demand": round(demand(before, after, window), 3),
                      "others_top": top_demand(before, after, window),
                      "torch_threads": torch.get_num_threads(), "step_seconds": [round(s, 4) for s in seconds],
                      "data": step.batches.source}))


def measure(args, variant: str) -> dict:
    """One child process under `variant`'s environment; its result with the load around it."""
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_VARIABLES}
    env.update(VARIANTS[variant], OMP_DISPLAY_ENV="VERBOSE")
    cmd = [sys.executable, "-m", __spec__.name, "--child", "--recipe", args.recipe, "--batch", str(args.batch),
           "--seq-len",
           str(args.seq_len), "--warmup", str(args.warmup), "--steps", str(args.steps),
           *(["--data", args.data] if args.data else [])]
    load_before, t0 = load_1min(), time.perf_counter()
    proc = subprocess.run(cmd, env=child_env(env), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {variant}: the measuring process failed:\n{proc.stderr[-3000:]}")
    shown = dict(line.strip().split(" = ", 1) for line in proc.stderr.splitlines() if " = " in line
                 and line.startswith("  "))
    # its OMP_WAIT_POLICY
    libgomp = {k: shown[k].strip("'") for k in ("GOMP_SPINCOUNT", "OMP_NUM_THREADS") if k in shown}
    # line says PASSIVE when the variable is unset: the spin count is what it does
    return {"variant": variant, "environment": VARIANTS[variant], "libgomp": libgomp, "load_1min_before": load_before,
            "load_1min_after": load_1min(), "process_seconds": round(time.perf_counter() - t0, 1),
            **json.loads(proc.stdout.strip().splitlines()[-1])}


# ----------------------------------------------------------------------------------------------------------------
# Rounds and their summary.


def wait_for_condition(args) -> tuple[str, subprocess.Popen | None]:
    """Block until the condition can hold; for `busy`, start the pinned busy process when nothing else is busy.
    Returns (what keeps a core busy, the process this started or None)."""
    while True:
        if args.condition == "quiet":
            if load_1min() < args.quiet_load and others_demand() < DEMAND_BAND["quiet"][1]:
                return "none", None
        else:
            others = others_demand()
            if others < DEMAND_BAND["quiet"][1]:
                last_core = max(os.sched_getaffinity(0))
                spin = subprocess.Popen([sys.executable, "-c", SPIN.format(core=last_core)])
                return f"python -c 'while 1: pass' pinned to core {last_core}", spin
            low, high = DEMAND_BAND["busy"]
            if low <= others <= high:
                return f"another program already running ({others:.2f} runnable threads)", None
        print(f"waiting: load {load_1min()}, other programs' demand {others_demand(2.0):.2f}", flush=True)
        time.sleep(args.poll_seconds)


def summarize(rounds: list[dict]) -> dict:
    """Per variant: median tokens/s, and the median over rounds of its tokens/s divided by each other variant's."""
    valid = [r for r in rounds if r["valid"]]
    if not valid:
        return {"valid_rounds": 0}
    tps = {v: [next(m["tokens_per_s"] for m in r["measurements"] if m["variant"] == v) for r in valid]
           for v in valid[0]["order"]}
    out = {"valid_rounds": len(valid), "rounds_discarded": len(rounds) - len(valid),
           "median_tokens_per_s": {v: round(statistics.median(x), 1) for v, x in tps.items()}}
    for base in ("default", "passive"):
        if base in tps:
            out[f"ratio_to_{base}"] = {v: round(statistics.median(a / b for a, b in zip(x, tps[base])), 3)
                                       for v, x in tps.items()}
    return out


def run(args) -> None:
    from benchmarks.common import command_line, write_result  # noqa: PLC0415 (torch: not in the parent until here)

    path = Path(args.out_dir or RESULTS) / f"{args.name}.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    sections = doc.get("sections", {})
    key = f"{args.recipe} {args.condition}"
    section = sections.setdefault(key, {"rounds": []})
    section.update(command=command_line(), batch_size=args.batch, seq_len=args.seq_len, warmup_steps=args.warmup,
                   timed_steps=args.steps, data=args.data or "synthetic", demand_band=DEMAND_BAND[args.condition])
    while sum(r["valid"] for r in section["rounds"]) < args.rounds:
        order = list(args.variants) if len(section["rounds"]) % 2 == 0 else list(reversed(args.variants))
        busy_source, spin = wait_for_condition(args)
        try:
            measurements = [measure(args, v) for v in order]
        finally:
            if spin is not None:
                spin.kill()
                spin.wait()
        low, high = DEMAND_BAND[args.condition]
        valid = all(low <= m["others_demand"] <= high for m in measurements)
        section["rounds"].append({"order": order, "busy_source": busy_source, "valid": valid,
                                  "measurements": measurements,
                                  "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        section["summary"] = summarize(section["rounds"])
        section["complete"] = sum(r["valid"] for r in section["rounds"]) >= args.rounds
        print(f"{key} round {len(section['rounds'])} ({'kept' if valid else 'discarded'}): " + ", ".join(
            f"{m['variant']} {m['tokens_per_s']:.0f} tok/s (others {m['others_demand']:.2f}, load "
            f"{m['load_1min_before']})"
            for m in measurements), flush=True)
        write_result(args.name, {"what": __doc__.split("\n\n")[0], "variants": VARIANTS, "sections": sections},
                     out_dir=args.out_dir or RESULTS,
                     command="python -m benchmarks.lab.omp_wait (per section: `command`)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--condition", choices=tuple(DEMAND_BAND), default="quiet")
    ap.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--rounds", type=int, default=5, help="valid rounds wanted in this section")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps after the first")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--data", default=None,
                    help="prepared data (default: the built-in corpus for tiny, else synthetic batches)")
    ap.add_argument("--quiet-load", type=float, default=0.3)
    ap.add_argument("--poll-seconds", type=float, default=30.0)
    ap.add_argument("--name", default="omp_wait_cpu")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.data is None and args.recipe == "tiny":  # the quick start's data: the built-in corpus, prepared once
        args.data = str(builtin_corpus(args))
    run(args)


def builtin_corpus(args) -> Path:
    from tinyelectra.config import load_recipe  # noqa: PLC0415
    from tinyelectra.train import Dist, resolve_data  # noqa: PLC0415

    recipe = load_recipe(args.recipe, [f"train.seq_len={args.seq_len}"])
    return resolve_data(None, None, recipe, Path("."), Dist())


if __name__ == "__main__":
    main()
