"""Issue 33, item 7: every variant of the training step against today's default, on one card, in one command.

Paired timing rounds, each variant's kernel table, its losses against the eager step, its cold and cached compile
times.

    python -m benchmarks.ab --device cuda [--recipe electra-small --batch 128 --seq-len 128 --precision auto]
        [--variants default,flat-update,regional,regional-graph] [--variant NAME=SET[,SET...]] [--budget-s 240]
      -> benchmarks/results/ab_<card>.json   (or --name; rewritten after every part, "complete": false until the end)
    python -m benchmarks.ab --cpu-smoke    the same code at toy size on the CPU (dynamo's aot_eager backend)

A variant is a name and a list of recipe overrides (`--set`s) on top of the recipe (VARIANTS; `--variant NAME=...`
adds one from the command line); "default" is today's default (train.compile=auto: inductor + CUDA graphs, the
per-tensor update compiled with them). Unless --variants says otherwise a run measures LEASE_VARIANTS: the default
(the one whole-step compile: the slowest to build, so it gets half the CPU cores), the regional family, and each change
alone on top of regional-graph (rg-*) and all of them together, so that one lease's command holds every comparison.

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
said so, when --budget-s has been spent by then. A lease's command has 10 minutes: --deadline-s (default 540 on a
device) bounds the whole, and no variant takes the others down with it: one whose child fails (a path that never ran
on a card may) or has not built when parts 2-4 need the rest of the time (--deadline-s less PARTS_RESERVE_S) is
dropped, its reason in the result and on the console, and the others are measured; the timing rounds and the kernel
tables stop at the deadline, said so. The cold compiles dominate: today's default took 148 s cold on an
H100 in 2026-11 compiling alone; side by side on a slice of the cores it may take longer, and the command with it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
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
# Each change also on top of regional-graph, whose regional compile is cheap: a lease's run then compiles the whole
# step once (the default) and measures every change alone and together within its deadline.
VARIANTS.update({f"rg-{name}": [*VARIANTS["regional-graph"], *VARIANTS[name]]
                 for name in ("inverse-cdf", "varlen", "weight-copy")})
# What --variants runs unless told: one whole-step compile (the default), the regional family, each change on it.
LEASE_VARIANTS = ("default", "regional", "regional-graph", "rg-inverse-cdf", "rg-varlen", "rg-weight-copy", "all")
EAGER = ["train.compile=off"]  # the losses' reference (not timed)
DEADLINE_S = 540.0  # the default --deadline-s on a device: a lease's command may run 600 s; the result written before
PARTS_RESERVE_S = 90.0  # what parts 2-4 are left when waiting for the builds: seconds of steps for 9 children on a card
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

    def read_later(self, answers: queue.Queue) -> None:
        """The child's next answer, or the error reading it, put on `answers` as (name, answer) by a thread of its own
        (the parent waits for several children at once, each for a bounded time)."""
        def read() -> None:
            try:
                answers.put((self.name, self.read()))
            except (RuntimeError, OSError, ValueError) as e:  # the child ended, or its pipe broke
                answers.put((self.name, e))

        threading.Thread(target=read, daemon=True).start()

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def kill(self) -> None:
        """Stop a child that is still compiling (close would wait for it to read its next command)."""
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.log.close()


def core_slices(heavy: int, light: int = 0, cores: list[int] | None = None) -> list[list[int]]:
    """Slices of the CPU cores (default: this process's): one core for each of `light` children (the eager references
    compile nothing); of the rest, half for the first heavy child (the default: in the lease's set the one whole-step
    compile, the slowest, and the baseline every ratio needs) and the other half shared among the other heavy ones,
    overlapping where they do not divide (no core left idle); cores are shared round robin where there are too few."""
    if cores is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        cores = sorted(affinity)
    spare = cores[light:] if len(cores) > light + heavy else cores
    first = spare if heavy == 1 else spare[:max(1, len(spare) // 2)]
    rest = spare[len(first):] or spare
    width = -(-len(rest) // max(1, heavy - 1))  # ceiling: every core of `rest` in some slice
    others = [[rest[(i * width + j) % len(rest)] for j in range(width)] for i in range(heavy - 1)]
    return [first, *others][:heavy] + [[cores[i % len(cores)]] for i in range(light)]


def start(variants: dict[str, list[str]], precisions: dict[str, str], args, caches: dict[str, Path],
          light: tuple[str, ...] = ()) -> dict[str, Child]:
    """A child per entry of `variants` (those named in `light` after the others), each on its slice of the cores."""
    order = [n for n in variants if n not in light] + [n for n in variants if n in light]
    slices = core_slices(len(order) - len(light), len(light))
    return {name: Child(name, variants[name], precisions[name], args, cores, caches[name])
            for name, cores in zip(order, slices)}


# ----------------------------------------------------------------------------------------------------------------
# the parent


def builds(children: dict, wait_s: float) -> tuple[dict[str, dict], dict[str, str]]:
    """Every child's "built" answer, waited for at most `wait_s` seconds in all (inf: as long as they take). Returns
    (name -> what it built, name -> why it has none: its child failed, or it was still compiling when the time ran
    out)."""
    answers: queue.Queue = queue.Queue()
    for c in children.values():
        c.read_later(answers)
    built: dict[str, dict] = {}
    failed: dict[str, str] = {}
    end = time.monotonic() + wait_s
    while len(built) + len(failed) < len(children):
        try:
            name, answer = answers.get(timeout=None if wait_s == float("inf") else max(0.0, end - time.monotonic()))
        except queue.Empty:
            break
        if isinstance(answer, Exception):
            failed[name] = str(answer)
        else:
            built[name] = answer["built"]
    for name in children:
        if name not in built and name not in failed:
            failed[name] = f"not built within {wait_s:.0f} s: still compiling when the rest of the time was needed"
    return built, failed


def ratios(times: dict[str, list[float]], base: str = "default") -> dict:
    """Per variant: the median, min and max over rounds of its time over the default's time in the same round (none
    when the default was not measured)."""
    if base not in times:
        return {}
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
    ap.add_argument("--variants", default=",".join(LEASE_VARIANTS),
                    help=f"which of VARIANTS (comma-separated; known: {', '.join(VARIANTS)}; default: "
                         f"{','.join(LEASE_VARIANTS)}: one whole-step compile, each change on the regional graph)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=SET[,SET...]",
                    help="one more variant: its name and recipe overrides, e.g. fused-ln=model.fused_layer_norm=true")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls-per-round", type=int, default=20)
    ap.add_argument("--profile", type=int, default=3, help="steps profiled per variant (0: none)")
    ap.add_argument("--repeats", type=int, default=16, help="seeds per variant for the losses' check")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="part 5 (the cached compile) is skipped once this many seconds have passed (default 240; "
                         "no limit with --cpu-smoke)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help=f"the whole command's limit: variants not built by then less {PARTS_RESERVE_S:g} s are "
                         f"dropped, rounds and kernel tables stop at it (default {DEADLINE_S:g} on a device; none "
                         "with --cpu-smoke)")
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
    if args.deadline_s is None:
        args.deadline_s = float("inf") if args.cpu_smoke else DEADLINE_S
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
        "budget_s": args.budget_s if args.budget_s != float("inf") else None,
        "deadline_s": args.deadline_s if args.deadline_s != float("inf") else None, "cpu_smoke": args.cpu_smoke,
        "skipped": [], "complete": False,
        "how": "one child process per variant (see the module docstring); cold compile: empty inductor and Triton "
               "caches, the children compiling side by side, each pinned to its own slice of the CPU cores; memory: "
               "peak_reserved/allocated_bytes are each child's own, device_used_bytes_at_end counts every process on "
               "the card (the children build side by side): not a variant's figure",
    }

    def save() -> Path:
        payload["seconds"] = round(time.perf_counter() - t_start, 1)
        return write_result(name, payload, device, out_dir=args.out_dir, command=command_line("benchmarks.ab", argv))

    def skip(part: str) -> bool:
        if time.perf_counter() - t_start < args.budget_s:
            return False
        payload["skipped"].append(f"{part}: not measured (the --budget-s {args.budget_s:g} s was spent)")
        return True

    def past_deadline() -> bool:
        return time.perf_counter() - t_start >= args.deadline_s

    def drop(name: str, why: str) -> None:
        """A variant (or reference) left out from here on: its child stopped, its reason kept."""
        c = children.pop(name, None)
        if c is not None:
            c.kill()
        variants.pop(name, None)
        payload["variants"].setdefault(name, {"sets": references.get(name)})["failed"] = why
        payload["skipped"].append(f"{name}: {why}")
        print(f"{name}: dropped: {why}", flush=True)

    def ask(name: str, part: str, **cmd) -> dict | None:
        """The child's answer to `cmd`, or None when it failed (then it is dropped, and `part` names when)."""
        try:
            return children[name].ask(**cmd)
        except (RuntimeError, OSError, ValueError) as e:
            drop(name, f"{part}: {e}")
            return None

    def ask_each(part: str, **cmd) -> dict[str, dict]:
        """Every child's answer to `cmd`; a child that fails is dropped, the others answer."""
        answers = {n: ask(n, part, **cmd) for n in list(children)}
        return {n: a for n, a in answers.items() if a is not None}

    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        caches = {n: Path(tmp) / n for n in [*variants, *references]}
        for c in caches.values():
            c.mkdir()
        children = start({**variants, **references}, precisions, args, caches, light=tuple(references))
        try:
            # 1. build: the cold compiles, side by side, until the time parts 2-4 need
            built, failed = builds(children, args.deadline_s - PARTS_RESERVE_S - (time.perf_counter() - t_start))
            for n, b in built.items():
                entry = payload["variants"].setdefault(n, {"sets": references.get(n)})
                entry.update({"note": b["note"], "cold": b["compile"], "first_call_s": b["first_call_s"],
                              "memory": b["memory"], "cores": children[n].cores})
                print(f"{n}: cold compile {b['compile'].get('seconds')} s; {b['note']}", flush=True)
            for n, why in failed.items():
                drop(n, f"build: {why}")
            save()
            # 2. losses: dropout on, lr 0, one batch, fresh seeds; against the eager step (2-4 always run: seconds)
            samples = {n: a["losses"] for n, a in ask_each("losses", cmd="losses", repeats=args.repeats).items()}
            for n in [n for n in variants if n in samples and "eager" in samples]:
                v = dropout_verdict(samples["eager"], samples[n], samples.get("reference_fp32"))
                payload["variants"][n]["losses"] = {**{k: v[k] for k in v if k != "line"}, "why": v["line"] or None,
                                                    "samples": samples[n]}
            if "eager" in samples:
                payload["eager_losses"] = samples["eager"]
            else:
                payload["skipped"].append("losses: not compared (no eager reference)")
            save()
            for n in [n for n in references if n in children]:  # the references are done
                children.pop(n).close()
            # 3. timing: paired rounds, the order rotating, until the deadline
            times: dict[str, list[float]] = {n: [] for n in variants}
            for r in range(args.rounds):
                if past_deadline():
                    payload["skipped"].append(f"timing: {r} of {args.rounds} rounds (--deadline-s {args.deadline_s:g})")
                    break
                for n in rotated(list(variants), r):
                    if (answer := ask(n, "timing", cmd="round", steps=args.calls_per_round)) is None:
                        times.pop(n)
                    else:
                        times[n].append(answer["seconds_per_step"])
            whole = min((len(ts) for ts in times.values()), default=0)  # the rounds every variant ran
            times = {n: ts[:whole] for n, ts in times.items()} if whole else {}
            rel = ratios(times)
            for n, ts in times.items():
                s = summarize(ts)
                payload["variants"][n]["step"] = {
                    "ms_median": s["median_s"] * 1e3, "ms_min": s["min_s"] * 1e3, "ms_max": max(ts) * 1e3,
                    "tokens_per_s": args.batch * args.seq_len / s["median_s"], "rounds": len(ts),
                    "time_vs_default": rel.get(n), "ms_per_round": [round(t * 1e3, 4) for t in ts]}
            save()
            # 4. kernel tables
            if args.profile:
                for n in list(children):
                    if past_deadline():
                        payload["skipped"].append(f"kernel tables from {n} on (--deadline-s {args.deadline_s:g})")
                        break
                    if (answer := ask(n, "kernel table", cmd="profile", steps=args.profile)) is not None:
                        payload["variants"][n]["kernels"] = answer["profile"]
                save()
        finally:
            for c in children.values():
                c.close()
        # 5. cached compile: new children, the caches the cold builds left
        if variants and not past_deadline() and not skip("cached compile"):
            again = start(variants, precisions, args, caches)
            try:
                built, failed = builds(again, args.deadline_s - (time.perf_counter() - t_start))
                for n, b in built.items():
                    payload["variants"][n]["cached"] = b["compile"]
                for n, why in failed.items():
                    payload["skipped"].append(f"{n}: cached compile: {why}")
            finally:
                for n, c in again.items():
                    if n in built:
                        c.close()
                    else:
                        c.kill()
    payload["complete"] = not payload["skipped"]
    path = save()
    for n, v in payload["variants"].items():
        if n in references:
            continue
        step, cold, cached = v.get("step"), v.get("cold") or {}, v.get("cached") or {}
        line = f"{n:16s}"
        if step:
            rel = step["time_vs_default"]
            line += f" {step['ms_median']:8.3f} ms/step" + (f" ({rel['median']:.3f}x default)" if rel else "")
        line += f"  compile cold {cold.get('seconds')} s, cached {cached.get('seconds')} s"
        if v.get("losses"):
            line += f"  losses {'ok' if v['losses']['ok'] else 'FAIL: ' + str(v['losses']['why'])}"
        if v.get("failed"):
            line += f"  DROPPED: {v['failed']}"
        print(line)
    print(f"-> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
