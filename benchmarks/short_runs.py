"""Issue 9, item 1: short runs, measured — which warm-up / optimizer / learning rate lets a short run learn.

Each arm is a real `tinyelectra train` run (step budget, the same data and seed) whose fraction checkpoints are
scored on held-out rows (diagnostics.py: discriminator accuracy against its all-"original" prior, ROC-AUC, generator
accuracy against the unigram answer). Arms differ only in the optimizer settings:

- `paper-10pct`: the paper's Adam (no bias correction) with the warm-up as it was before issue 9: the recipe's,
  capped at 10% of the run, no floor (emulated here by switching budget.adam_warmup_floor off);
- `paper-floor`: the paper's Adam with today's rule (at least min(1 / (1 - beta2), half the run) steps);
- `adamw-10pct`: bias-corrected AdamW (off-recipe) with the 10% warm-up;
- `paper-floor-lrX`: today's rule at other peak learning rates (the tiny recipe's rate is chosen from these).

    python benchmarks/short_runs.py --data data/enwiki-v8k --steps 600 [--arms a,b] [--threads 1]
      -> benchmarks/results/short_runs_cpu.json and .md; runs in runs/short-runs/<arm>/ (reused when finished)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import torch  # noqa: E402
from common import RESULTS, ROOT, command_line, run_main, write_result  # noqa: E402

from tinyelectra import budget  # noqa: E402
from tinyelectra.errors import UserError  # noqa: E402

ARMS = {  # name -> (--set overrides, warm-up floor on?)
    "paper-10pct": (["optim.lr=5e-4", "optim.warmup_steps=10000"], False),
    "paper-floor": (["optim.lr=5e-4", "optim.warmup_steps=10000"], True),
    "adamw-10pct": (["optim.lr=5e-4", "optim.warmup_steps=10000", "optim.name=adamw"], True),
    "paper-floor-lr1e-4": (["optim.lr=1e-4", "optim.warmup_steps=10000"], True),
    "paper-floor-lr3e-4": (["optim.lr=3e-4", "optim.warmup_steps=10000"], True),
    "paper-floor-lr1e-3": (["optim.lr=1e-3", "optim.warmup_steps=10000"], True),
    "paper-floor-lr2e-3": (["optim.lr=2e-3", "optim.warmup_steps=10000"], True),
    "paper-floor-lr4e-3": (["optim.lr=4e-3", "optim.warmup_steps=10000"], True),
}


@contextlib.contextmanager
def warmup_floor(enabled: bool):
    """The pre-issue-9 rule (no floor) for the arms that measure it; today's rule otherwise."""
    saved = budget.adam_warmup_floor
    if not enabled:
        budget.adam_warmup_floor = lambda recipe, total_steps: 0
    try:
        yield
    finally:
        budget.adam_warmup_floor = saved


def run_arm(name: str, args, work: Path) -> Path:
    from tinyelectra.train import train_command

    overrides, floor = ARMS[name]
    run_dir = work / name
    overrides = [*overrides, f"train.eval_rows={args.eval_rows}", *args.set]
    if (run_dir / "summary.json").is_file():
        print(f"{name}: reusing {run_dir}")
        return run_dir
    resume = (run_dir / "state" / "LATEST").is_file()  # an interrupted arm continues (one stopped in start-up restarts)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with warmup_floor(floor):
            train_command(budget=f"{args.steps}steps", data_dir=Path(args.data), corpus=None, recipe_name=args.recipe,
                          gpu=None, device="cpu", out_dir=run_dir, resume=resume, overrides=overrides,
                          command=f"(benchmarks/short_runs.py arm {name})")
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return run_dir


def arm_facts(name: str, run_dir: Path) -> dict | None:
    if not (run_dir / "summary.json").is_file():
        return None
    plan = json.loads((run_dir / "plan.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    recipe = json.loads((run_dir / "recipe.json").read_text())
    checkpoints = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line) if line.strip() else {}
        if rec.get("event") == "checkpoint":
            e = rec["eval"]
            checkpoints.append({"name": rec["name"], "step": rec["step"], "disc_gain": e["disc_acc"] - e["baseline_acc"],
                                **{k: e.get(k) for k in ("disc_acc", "baseline_acc", "disc_auc", "disc_precision",
                                                         "disc_recall", "gen_acc", "unigram_acc", "learned")}})
    return {"overrides": ARMS[name][0], "warmup_floor": ARMS[name][1], "optimizer": recipe["optim"]["name"],
            "lr": recipe["optim"]["lr"], "steps": summary["steps"], "warmup_steps": plan["warmup_steps"],
            "train_seconds": summary["train_seconds"], "checkpoints": checkpoints, "final": checkpoints[-1] if checkpoints else None}


def render(doc: dict) -> str:
    lines = [f"# Short runs: warm-up, optimizer and learning rate ({doc['recipe']}, {doc['steps']} steps)", "",
             f"Data: `{doc['data']}`; held-out rows per checkpoint: {doc['eval_rows']}; machine: {doc['machine']['cpu']}.", "",
             "| arm | optimizer | peak lr | warm-up | checkpoint | step | disc. acc − prior | disc. AUC | recall | gen. acc (unigram) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in doc["arms"].items():
        if a is None:
            continue
        for c in a["checkpoints"]:
            lines.append(f"| {name} | {a['optimizer']} | {a['lr']:g} | {a['warmup_steps']} | {c['name']} | {c['step']} | "
                         f"{c['disc_gain']:+.4f} | {c['disc_auc']:.3f} | {c['disc_recall']:.3f} | "
                         f"{c['gen_acc']:.3f} ({c['unigram_acc']:.3f}) |")
    lines += ["", f"Command: `{doc['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a directory written by `tinyelectra prepare` (vocabulary 8192)")
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-rows", type=int, default=1024)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override for every arm")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work-dir", default=str(ROOT / "runs" / "short-runs"))
    ap.add_argument("--name", default="short_runs_cpu")
    ap.add_argument("--out-dir", default=None)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not names or any(a not in ARMS for a in names):
        raise UserError(f"--arms {args.arms!r}: choose among {', '.join(ARMS)}")
    work = Path(args.work_dir) / f"{args.recipe}-{args.steps}"
    command = command_line("benchmarks/short_runs.py", argv)
    out_dir = Path(args.out_dir) if args.out_dir else RESULTS
    started = time.perf_counter()

    def save() -> Path:
        arms = {n: arm_facts(n, work / n) for n in ARMS if (work / n / "summary.json").is_file()}
        doc = {"recipe": args.recipe, "steps": args.steps, "data": args.data, "eval_rows": args.eval_rows,
               "arms": arms, "wall_seconds_this_invocation": time.perf_counter() - started}
        path = write_result(args.name, doc, torch.device("cpu"), out_dir=out_dir, command=command)
        md = path.with_suffix(".md")
        tmp = md.with_name(f"{md.name}.tmp-{os.getpid()}")
        tmp.write_text(render(json.loads(path.read_text())), encoding="utf-8")
        os.replace(tmp, md)
        return path

    for name in names:
        run_arm(name, args, work)
        save()
    path = save()
    return json.loads(path.read_text())


if __name__ == "__main__":
    run_main(main)
