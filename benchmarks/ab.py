"""Issue 33, item 7: every variant of the training step against today's default, on one card, in one command.

Paired timing rounds, each variant's kernel table, its losses against the eager step, its cold and cached compile
times.

    python -m benchmarks.ab --device cuda [--recipe electra-small --batch 128 --seq-len 128 --precision auto]
        [--variants default,flat-update,regional,regional-graph] [--variant NAME=SET[,SET...]] [--budget-s 240]
      -> benchmarks/results/ab_<card>.json   (or --name; rewritten after every part, "complete": false until the end)
    python -m benchmarks.ab --cpu-smoke    the same code at toy size on the CPU (dynamo's aot_eager backend)

A variant is a name and a list of recipe overrides (`--set`s) on top of the recipe (VARIANTS; `--variant NAME=...`
adds one from the command line); "default" is today's default (train.compile=auto: inductor + CUDA graphs, the
per-tensor update compiled with them).

Why one process per variant (children of this one, on the same card, one at a time when timed): torch.compile keeps
one compiled graph per code object and shares it between model instances of the same shapes (two separately
compiled models of one process trace once: measured on this project's CPU), and CUDA graphs record the addresses of
the parameters they were first run with; variants sharing code (default and flat-update share the whole-step
graph) would share compilations and re-record graphs in one process. A child per variant keeps each one's
compilation, caches and graphs its own, as `tinyelectra train` has them.

Parts, in this order, each written to the result as it completes:
  1. build: every child compiles its variant at the same time, each on its own slice of the CPU cores (compile
     workers and torch threads pinned to it, recorded; the eager references, which compile nothing, one core each),
     each with an empty inductor and Triton cache: the COLD compile
     (Engine.compile_now: seconds and their split into dynamo, AOT autograd, inductor and CUDA-graph capture), then
     the peak memory of build, compile and two steps (CUDA: common.HeldMemory);
  2. losses: the recipe's dropout on, learning rate 0, one batch, --repeats seeds per variant and for the eager step
     (train.compile=off; in bf16/fp16 also an fp32 eager reference): benchmarks.loss_check.dropout_verdict (fresh
     random numbers every step, the same mean and spread as eager); every child starts from the recipe's seed's weights;
  3. timing: --rounds rounds; in each, every variant runs --calls-per-round steps back to back with one device
     synchronisation at the end, the variants one after another in an order that rotates every round; per variant
     the median and range of its ms per step and of its per-round ratio to the default's time in the same round;
  4. kernel tables: torch.profiler over --profile steps per variant (throughput.kernel_table: device ms per step,
     kernels and launches per step, the issue's classes: GEMM with its split-K reduces, layer norm, attention, GELU,
     sampling and losses, optimizer, casts, other);
  5. cached compile: every variant built again in a new child with the cache its cold build left (what a second run
     on the same machine pays).
Parts 1-4 always run (once everything is compiled, 2-4 take some tens of seconds on a card); part 5 is skipped, and
said so, when --budget-s has been spent by then. The cold compiles dominate: today's default took 148 s cold on an
H100 in 2026-11 compiling alone; side by side on a slice of the cores it may take longer, and the command with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from benchmarks import child_env
from benchmarks.common import command_line, run_main, summarize, write_result

VARIANTS = {  # name -> recipe overrides; the coordinator adds one line per variant
    "default": [],
    "flat-update": ["train.update=flat"],
    "regional": ["train.compile=regional", "train.update=flat"],
    "regional-graph": ["train.compile=regional-graph", "train.update=flat"],
    "inverse-cdf": ["train.sampler=inverse-cdf"],  # one random number per masked slot (electra.inverse_cdf_sample)
    "varlen": ["train.attention=varlen"],  # padded rows by their lengths: FlashAttention's varlen kernel
    "weight-copy": ["train.weight_copy=copy"],  # the matmuls read bf16/fp16 copies refreshed after each update
    "all": ["train.compile=regional-graph", "train.update=flat", "train.sampler=inverse-cdf", "train.attention=varlen",
            "train.weight_copy=copy"],
}
EAGER = ["train.compile=off"]  # the losses' reference (not timed)
SMOKE = {"recipe": "tiny", "sets": ["model.num_layers=1"], "batch": 4, "seq_len": 32, "rounds": 2, "calls": 1,
         "profile": 1, "repeats": 4, "precision": "fp32"}


# ----------------------------------------------------------------------------------------------------------------
# a child: one variant, built once, answering commands (one JSON line each way)


def child(args) -> None:
    import torch  # noqa: PLC0415

    from benchmarks.common import HeldMemory  # noqa: PLC0415
    from benchmarks.loss_check import dropout_samples  # noqa: PLC0415
    from benchmarks.throughput import Batches, TrainerStep, profile_steps  # noqa: PLC0415

    from tinyelectra import runtime  # noqa: PLC0415
    from tinyelectra.config import load_recipe  # noqa: PLC0415

    cores = [int(c) for c in args.cores.split(",")] if args.cores else None
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores) if cores else 1)
    device = runtime.pick_device(None, args.device)
    precision = args.child_precision
    runtime.configure_matmul(precision, device)
    if device.type == "cpu":
        runtime.tune_cpu()
    recipe = load_recipe(args.recipe, [*args.set, *json.loads(args.child_sets), f"train.batch_size={args.batch}",
                                       f"train.seq_len={args.seq_len}", f"train.precision={precision}"])

    def say(obj) -> None:
        print(json.dumps(obj), flush=True)

    with HeldMemory(device) as held:
        batches = Batches(None, recipe.model.vocab_size, args.batch, args.seq_len, device, padding="builder")
        step = TrainerStep(recipe, device, precision, batches)
        schedule = step.lr
        step.lr = lambda _step: 0.0  # every child keeps the recipe seed's weights until the losses are sampled
        t0 = time.perf_counter()
        step.first_call()
        runtime.synchronize(device)
        first_call_s = time.perf_counter() - t0
        for _ in range(2):
            step()
    say({"built": {"compile": step.compiled_record, "first_call_s": round(first_call_s, 3), "note": step.compile_note,
                   "memory": held.figures}})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "losses":
            say({"losses": dropout_samples(step, cmd["repeats"], first_call=False)})
        elif cmd["cmd"] == "round":
            step.lr = schedule  # training as the recipe schedules it from here on
            runtime.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(cmd["steps"]):
                step()
            runtime.synchronize(device)
            say({"seconds_per_step": (time.perf_counter() - t0) / cmd["steps"]})
        elif cmd["cmd"] == "profile":
            table = profile_steps(step, cmd["steps"], device)
            table.pop("kernels")  # the top ones and the classes travel; the full list is long
            say({"profile": table})
        else:
            return


class Child:
    """A running child process: its variant, its pipes, its cache folder."""

    def __init__(self, name: str, sets: list[str], precision: str, args, cores: list[int], cache: Path) -> None:
        self.name, self.sets, self.cache, self.cores = name, sets, cache, len(cores)
        env = child_env(dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
                             TRITON_CACHE_DIR=str(cache / "triton"),
                   TORCHINDUCTOR_COMPILE_THREADS=str(len(cores)), PYTHONUNBUFFERED="1"))
        if args.cpu_smoke:
            env["TINYELECTRA_COMPILE_BACKEND"] = "aot_eager"
        cmd = [sys.executable, "-m", "benchmarks.ab", *args.child_argv, "--child", name, "--child-sets",
               json.dumps(sets),
               "--child-precision", precision, "--cores", ",".join(map(str, cores))]
        self.log = open(cache / f"{name}.log", "w")  # noqa: SIM115 - closed in `close`
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env)

    def read(self) -> dict:
        """The child's next answer: its next line that is a JSON object (anything else a library printed is skipped)."""
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                tail = (self.cache / f"{self.name}.log").read_text().strip().splitlines()[-3:]
                raise RuntimeError(f"{self.name}: the child ended (exit {self.proc.returncode}): {' | '.join(tail)}")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.log.close()


def core_slices(heavy: int, light: int = 0) -> list[list[int]]:
    """Slices of this process's CPU cores: one core for each of `light` children (the eager references compile
    nothing), the rest shared as equally as they divide among `heavy` ones; cores are shared (round robin) where there
    are too few. Heavy slices first."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    spare = cores[light:] if len(cores) > light + heavy else cores
    width = max(1, len(spare) // heavy)
    return ([[spare[(i * width + j) % len(spare)] for j in range(width)] for i in range(heavy)]
            + [[cores[i % len(cores)]] for i in range(light)])


def start(variants: dict[str, list[str]], precisions: dict[str, str], args, caches: dict[str, Path],
          light: tuple[str, ...] = ()) -> dict[str, Child]:
    """A child per entry of `variants` (those named in `light` after the others), each on its slice of the cores."""
    order = [n for n in variants if n not in light] + [n for n in variants if n in light]
    slices = core_slices(len(order) - len(light), len(light))
    return {name: Child(name, variants[name], precisions[name], args, cores, caches[name])
            for name, cores in zip(order, slices)}


# ----------------------------------------------------------------------------------------------------------------
# the parent


def ratios(times: dict[str, list[float]], base: str = "default") -> dict:
    """Per variant: the median, min and max over rounds of its time over the default's time in the same round."""
    out = {}
    for name, ts in times.items():
        per_round = [t / b for t, b in zip(ts, times[base])]
        out[name] = {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}
    return out


def rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names)
    return names[k:] + names[:k]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="electra-small")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if there is one)")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--set", action="append", default=[], help="recipe overrides for every variant")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="which of VARIANTS (comma-separated; default all)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=SET[,SET...]",
                    help="one more variant: its name and recipe overrides, e.g. fused-ln=model.fused_layer_norm=true")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls-per-round", type=int, default=20)
    ap.add_argument("--profile", type=int, default=3, help="steps profiled per variant (0: none)")
    ap.add_argument("--repeats", type=int, default=16, help="seeds per variant for the losses' check")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="part 5 (the cached compile) is skipped once this many seconds have passed (default 240; "
                         "no limit with --cpu-smoke)")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy size on the CPU, dynamo's aot_eager backend")
    ap.add_argument("--name", default=None)
    ap.add_argument("--out-dir", default=None)
    for hidden in ("--child", "--child-sets", "--child-precision", "--cores"):
        ap.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    return ap


def plan(args) -> dict[str, list[str]]:
    from tinyelectra.errors import UserError  # noqa: PLC0415

    variants = {}
    for name in [v for v in args.variants.split(",") if v]:
        if name not in VARIANTS:
            raise UserError(f"--variants: unknown variant {name!r} (known: {', '.join(VARIANTS)}; add one with "
                            "--variant)")
        variants[name] = VARIANTS[name]
    for spec in args.variant:
        name, _, sets = spec.partition("=")
        if not name or not sets:
            raise UserError(f"--variant {spec!r}: write NAME=SET[,SET...], e.g. fused-ln=model.fused_layer_norm=true")
        variants[name] = sets.split(",")
    variants.setdefault("default", [])
    return {"default": variants.pop("default"), **variants}


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.cpu_smoke:
        args.device, args.recipe, args.precision = "cpu", SMOKE["recipe"], SMOKE["precision"]
        args.set = [*SMOKE["sets"], *args.set]
        args.batch, args.seq_len, args.rounds = SMOKE["batch"], SMOKE["seq_len"], SMOKE["rounds"]
        args.calls_per_round, args.profile, args.repeats = SMOKE["calls"], SMOKE["profile"], SMOKE["repeats"]
    if args.budget_s is None:  # the smoke run checks the code, not the time: every part runs however busy the CPU
        args.budget_s = float("inf") if args.cpu_smoke else 240.0
    args.child_argv = ["--recipe", args.recipe, "--batch", str(args.batch), "--seq-len", str(args.seq_len),
                       *(["--device", args.device] if args.device else []), *[f"--set={s}" for s in args.set]]
    if args.child:
        child(args)
        return None
    import torch  # noqa: PLC0415

    from benchmarks.loss_check import dropout_verdict  # noqa: PLC0415

    from tinyelectra import runtime  # noqa: PLC0415
    from tinyelectra.config import load_recipe  # noqa: PLC0415

    t_start = time.perf_counter()
    device = runtime.pick_device(None, args.device)
    precision, reason = runtime.pick_precision(args.precision, device)
    variants = plan(args)
    for sets in variants.values():  # bad overrides: one line now, not a child's traceback later
        load_recipe(args.recipe, [*args.set, *sets])
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    name = args.name or ("ab_cpu_smoke" if args.cpu_smoke else f"ab_{card.replace(' ', '_').lower()}")
    references = {"eager": EAGER, **({"reference_fp32": EAGER} if precision != "fp32" else {})}
    precisions = {**{n: precision for n in variants}, "eager": precision, "reference_fp32": "fp32"}
    payload: dict = {
        "device": card, "precision": precision, "precision_reason": reason, "recipe": args.recipe,
        "overrides": args.set,
        "batch_size": args.batch, "seq_len": args.seq_len, "tokens_per_step": args.batch * args.seq_len,
        "variants": {n: {"sets": s} for n, s in variants.items()}, "references": references,
        "rounds": args.rounds, "calls_per_round": args.calls_per_round, "repeats": args.repeats,
        "budget_s": args.budget_s if args.budget_s != float("inf") else None, "cpu_smoke": args.cpu_smoke,
        "skipped": [], "complete": False,
        "how": "one child process per variant (see the module docstring); cold compile: empty inductor and Triton "
               "caches, the children compiling side by side, each pinned to its own slice of the CPU cores",
    }

    def save() -> Path:
        payload["seconds"] = round(time.perf_counter() - t_start, 1)
        return write_result(name, payload, device, out_dir=args.out_dir, command=command_line("benchmarks.ab", argv))

    def skip(part: str) -> bool:
        if time.perf_counter() - t_start < args.budget_s:
            return False
        payload["skipped"].append(f"{part}: not measured (the --budget-s {args.budget_s:g} s was spent)")
        return True

    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        caches = {n: Path(tmp) / n for n in [*variants, *references]}
        for c in caches.values():
            c.mkdir()
        children = start({**variants, **references}, precisions, args, caches, light=tuple(references))
        try:
            # 1. build: the cold compiles, side by side
            for n, c in children.items():
                built = c.read()["built"]
                entry = payload["variants"].setdefault(n, {"sets": references.get(n)})
                entry.update({"note": built["note"], "cold": built["compile"], "first_call_s": built["first_call_s"],
                              "memory": built["memory"], "cores": c.cores})
                print(f"{n}: cold compile {built['compile'].get('seconds')} s; {built['note']}", flush=True)
            save()
            # 2. losses: dropout on, lr 0, one batch, fresh seeds; against the eager step (2-4 always run: seconds)
            samples = {n: c.ask(cmd="losses", repeats=args.repeats)["losses"] for n, c in children.items()}
            for n in variants:
                v = dropout_verdict(samples["eager"], samples[n], samples.get("reference_fp32"))
                payload["variants"][n]["losses"] = {**{k: v[k] for k in v if k != "line"}, "why": v["line"] or None,
                                                    "samples": samples[n]}
            payload["eager_losses"] = samples["eager"]
            save()
            for n in references:  # the references are done
                children.pop(n).close()
            # 3. timing: paired rounds, the order rotating
            names = list(variants)
            times: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.rounds):
                for n in rotated(names, r):
                    times[n].append(children[n].ask(cmd="round", steps=args.calls_per_round)["seconds_per_step"])
            rel = ratios(times)
            for n, ts in times.items():
                s = summarize(ts)
                payload["variants"][n]["step"] = {
                    "ms_median": s["median_s"] * 1e3, "ms_min": s["min_s"] * 1e3, "ms_max": max(ts) * 1e3,
                    "tokens_per_s": args.batch * args.seq_len / s["median_s"], "rounds": len(ts),
                    "time_vs_default": rel[n], "ms_per_round": [round(t * 1e3, 4) for t in ts]}
            save()
            # 4. kernel tables
            if args.profile:
                for n, c in children.items():
                    payload["variants"][n]["kernels"] = c.ask(cmd="profile", steps=args.profile)["profile"]
                save()
        finally:
            for c in children.values():
                c.close()
        # 5. cached compile: new children, the caches the cold builds left
        if not skip("cached compile"):
            again = start(variants, precisions, args, caches)
            try:
                for n, c in again.items():
                    payload["variants"][n]["cached"] = c.read()["built"]["compile"]
            finally:
                for c in again.values():
                    c.close()
    payload["complete"] = not payload["skipped"]
    path = save()
    for n, v in payload["variants"].items():
        if n in references:
            continue
        step, cold, cached = v.get("step"), v.get("cold") or {}, v.get("cached") or {}
        line = f"{n:16s}"
        if step:
            line += f" {step['ms_median']:8.3f} ms/step ({step['time_vs_default']['median']:.3f}x default)"
        line += f"  compile cold {cold.get('seconds')} s, cached {cached.get('seconds')} s"
        if v.get("losses"):
            line += f"  losses {'ok' if v['losses']['ok'] else 'FAIL: ' + str(v['losses']['why'])}"
        print(line)
    print(f"-> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
