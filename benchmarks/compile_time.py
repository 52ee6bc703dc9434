"""Issue 33, item 1 on the CPU: how the training step's compile time grows with depth, whole-step vs regional.

Today's whole-step compile against regional compilation, cold (a fresh inductor cache) and cached (the same cache
again), each in a fresh process.

    nice .venv/bin/python -m benchmarks.compile_time [--depths 2 12] [--recipe tiny] [--threads 1]
      -> benchmarks/results/compile_time_cpu.json   (resumable: cells already measured are kept; --fresh to redo)

Arms (the trainer's own Engine and `compile_now`, i.e. what `tinyelectra train` does at start-up: the step with and
without an attention mask, forward and backward, and the update):
  whole      train.compile=reduce-overhead: the GPU default's whole-step compile (inductor; the CPU has no CUDA
             graphs, so nothing is recorded after it) with the update compiled too (optim.GraphSafeUpdate);
  regional   train.compile=regional + train.update=flat: each repeated block, the embeddings and the heads compiled
             once per shape (runtime.compile_regions), the flat update eager (out of inductor).
Each cell (arm, depth, cold|cached) runs in a process of its own (nothing in memory carries over), cold with an
empty TORCHINDUCTOR_CACHE_DIR, cached with the cache its cold run left; the arms alternate at each depth so that a
change of the machine's load falls on both. Torch threads and inductor's compile workers are pinned (--threads,
TORCHINDUCTOR_COMPILE_THREADS) and recorded, with the load average around each cell. Timed: `compile_now`'s seconds
(what the trainer logs) and its split (runtime.compile_time_split: dynamo, AOT autograd, inductor), and the
process's whole start to its first trained step.

The figure: each arm's compile time at the deepest depth over the shallowest (the issue: 2.80x for the whole step,
2 vs 12 layers of tiny's step on a loaded CPU), and regional over whole at each depth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from benchmarks import child_env
from benchmarks.common import RESULTS, command_line, run_main, write_result

ARMS = {
    "whole": ["train.compile=reduce-overhead"],
    "regional": ["train.compile=regional", "train.update=flat"],
}


def cell(args) -> dict:
    """(Child process) build the trainer's step for one arm and depth, compile it as `tinyelectra train` does, run one
    step; the timings as JSON on the last line of stdout."""
    t_start = time.perf_counter()
    import torch  # noqa: PLC0415

    from benchmarks.throughput import Batches, TrainerStep  # noqa: PLC0415

    from tinyelectra.config import load_recipe  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    arm, depth = args.cell.split(":")
    recipe = load_recipe(args.recipe, [*ARMS[arm], f"model.num_layers={depth}", f"train.batch_size={args.batch}",
                                       f"train.seq_len={args.seq_len}", "train.precision=fp32"])
    device = torch.device("cpu")
    batches = Batches(None, recipe.model.vocab_size, args.batch, args.seq_len, device, padding="alternate")
    step = TrainerStep(recipe, device, "fp32", batches)
    t0 = time.perf_counter()
    step.first_call()  # compile_now (both graphs, the update), then one real step
    first = time.perf_counter() - t0
    record = step.compiled_record
    return {"arm": arm, "depth": int(depth), "compile_s": record["seconds"], "split": record["split"],
            "compile_note": step.compile_note, "first_call_s": round(first, 3),
            "process_to_first_step_s": round(time.perf_counter() - t_start, 3)}


def run_cell(argv_common: list[str], name: str, cache: Path, threads: int) -> dict:
    env = child_env(dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), TORCHINDUCTOR_COMPILE_THREADS=str(threads),
                         OMP_WAIT_POLICY="PASSIVE"))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", *argv_common, "--cell", name],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return {"error": tail[:500], "wall_s": round(time.perf_counter() - t0, 1)}
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    return {**rec, "wall_s": round(time.perf_counter() - t0, 1),
            "load_average_1min_before_after": [load, os.getloadavg()[0]]}


def summary(cells: dict, depths: list[int]) -> dict:
    def t(arm, depth, kind="cold"):
        c = cells.get(f"{arm}:{depth}:{kind}")
        return c.get("compile_s") if c else None

    lo, hi = min(depths), max(depths)
    out: dict = {}
    for kind in ("cold", "cached"):
        for arm in ARMS:
            a, b = t(arm, lo, kind), t(arm, hi, kind)
            out[f"{arm}_{kind}_depth_ratio_{hi}_over_{lo}"] = round(b / a, 3) if a and b else None
        for d in depths:
            w, r = t("whole", d, kind), t("regional", d, kind)
            out[f"regional_over_whole_{kind}_at_{d}_layers"] = round(r / w, 3) if w and r else None
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 12])
    ap.add_argument("--batch", type=int, default=2, help="rows per step (compile time does not depend on it)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads and inductor compile workers, pinned")
    ap.add_argument("--name", default="compile_time_cpu")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--fresh", action="store_true", help="measure every cell again (default: keep those measured)")
    ap.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.cell:
        print(json.dumps(cell(args)))
        return None
    common = ["--recipe", args.recipe, "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--threads",
              str(args.threads)]
    path = Path(args.out_dir or RESULTS) / f"{args.name}.json"
    old = json.loads(path.read_text()) if path.exists() and not args.fresh else {}
    same = old.get("config") == {"recipe": args.recipe, "batch": args.batch, "seq_len": args.seq_len,
                                 "threads": args.threads}
    cells = dict(old.get("cells", {})) if same else {}
    payload = {"config": {"recipe": args.recipe, "batch": args.batch, "seq_len": args.seq_len, "threads": args.threads},
               "arms": {k: v for k, v in ARMS.items()}, "depths": args.depths, "precision": "fp32", "device": "cpu",
               "inductor_compile_threads": args.threads, "cells": cells, "complete": False,
               "what": "compile_s: Engine.compile_now (both graphs of the step, forward and backward, and the update) "
                       "in a fresh process; cold: empty TORCHINDUCTOR_CACHE_DIR; cached: the cache the cold run left"}

    def save() -> Path:
        payload["summary"] = summary(cells, args.depths)
        return write_result(args.name, payload, out_dir=args.out_dir,
                            command=command_line("benchmarks.compile_time", argv))

    order = [(arm, d) for i, d in enumerate(args.depths) for arm in (list(ARMS) if i % 2 == 0 else list(ARMS)[::-1])]
    for arm, depth in order:
        cold = f"{arm}:{depth}:cold"
        if cold in cells and "error" not in cells[cold] and f"{arm}:{depth}:cached" in cells:
            continue
        with tempfile.TemporaryDirectory(prefix="inductor-cold-") as cache:
            for kind in ("cold", "cached"):
                rec = run_cell(common, f"{arm}:{depth}", Path(cache), args.threads)
                cells[f"{arm}:{depth}:{kind}"] = rec
                print(f"{arm:8s} {depth:3d} layers {kind:6s}: " + (f"compile {rec['compile_s']:.1f} s "
                      f"(wall {rec['wall_s']:.1f} s)" if "error" not in rec else f"error: {rec['error']}"), flush=True)
                save()
    payload["complete"] = True
    out = save()
    print(json.dumps(payload["summary"], indent=1), f"-> {out}")
    return payload


if __name__ == "__main__":
    run_main(main)
