"""Short runs, measured: which peak learning rate and short-budget warm-up let a run of a few hundred steps learn,
and the generator-vs-unigram curve of a recipe as it ships.

Each arm is a real `tinyelectra train` run (a step budget, the same prepared data and seed) whose fraction checkpoints
are scored on held-out rows (diagnostics.evaluate): generator accuracy over the unigram answer (context learned
through the generator), the identity-matched discriminator AUCs (context in the discriminator: word frequency cannot
fool them), the raw AUCs and discriminator accuracy beside its all-"original" prior (frequency cues). Arms:

- `recipe`: the recipe as it ships;
- `lrX`: peak learning rate X, warm-up by today's rule (budget.warmup_for: the paper's Adam warms up for at least
  min(1 / (1 - beta2), half the run) steps);
- `lrX-warmupN`: peak X, warm-up N% of the run's steps instead (budget.warmup_for replaced for that arm);
- any of these with `-seedN`: the same with train.seed = N (the recipe's is 0).

The `-discS` arms of plateau_mini_cpu.md and plateau_tiny_grammar_cpu.md (the discriminator's encoder and head at S
times the rate) ran at commit 0f79abe through optim.disc_lr_scale, deleted since: they did not help.

Threads are pinned (`--threads`, default 1, also exported as OMP_NUM_THREADS): unpinned beside other work a trainer
ran at 200-350 tokens/s on the 2-core machine these were measured on instead of 2,000-3,800.

    python -m benchmarks.lab.short_runs --data data/enwiki10-v8k --steps 600 --arms lr1e-3,lr2e-3,lr2e-3-warmup10
      -> benchmarks/lab/results/short_runs_cpu.json and .md; runs in runs/short-runs/<name>/<recipe>-<steps>/<arm>/,
         a finished arm reused, an interrupted one resumed; the results are rewritten after every arm
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import torch

from benchmarks import ROOT
from benchmarks.common import command_line, run_main, write_result
from benchmarks.lab import RESULTS

from tinyelectra import budget
from tinyelectra.errors import UserError

ARM = re.compile(r"(recipe|lr(?P<lr>\d+(\.\d+)?e-\d+)(-warmup(?P<percent>\d+))?)(-seed(?P<seed>\d+))?")
EVAL_KEYS = ("gen_acc", "unigram_acc", "gen_loss", "disc_auc_matched", "disc_auc_context_matched", "disc_auc",
             "disc_auc_context", "disc_acc", "baseline_acc", "disc_recall", "learned")


def arm_settings(name: str) -> tuple[list[str], float | None]:
    """(recipe overrides, warm-up share of the run or None for today's rule) of an arm name."""
    m = ARM.fullmatch(name)
    if m is None:
        raise UserError(f"arm {name!r}: expected recipe, lrX (e.g. lr2e-3) or lrX-warmupN (N% of the run), "
                        "each optionally followed by -seedN")
    overrides = ([f"optim.lr={m['lr']}"] if m["lr"] else []) + ([f"train.seed={m['seed']}"] if m["seed"] else [])
    return overrides, (int(m["percent"]) / 100 if m["percent"] is not None else None)


@contextlib.contextmanager
def warmup_share(share: float | None):
    """A warm-up of `share` of the run for the arms that measure one; today's rule otherwise."""
    saved = budget.warmup_for
    if share is not None:
        budget.warmup_for = lambda recipe, total_steps: round(share * total_steps)
    try:
        yield
    finally:
        budget.warmup_for = saved


def run_arm(name: str, args, work: Path) -> Path:
    from tinyelectra.train import train_command

    overrides, share = arm_settings(name)
    run_dir = work / name
    if (run_dir / "summary.json").is_file():
        print(f"{name}: reusing {run_dir}")
        return run_dir
    resume = (run_dir / "state" / "LATEST").is_file()  # an interrupted arm continues (one stopped in start-up restarts)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with warmup_share(share):
            train_command(budget=f"{args.steps}steps", data_dir=Path(args.data), corpus=None, recipe_name=args.recipe,
                          gpu=None, device="cpu", out_dir=run_dir, resume=resume,
                          overrides=[*overrides, f"train.eval_rows={args.eval_rows}", *args.set],
                          command=f"(python -m benchmarks.lab.short_runs: arm {name})")
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return run_dir


def arm_facts(run_dir: Path) -> dict:
    plan = json.loads((run_dir / "plan.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    recipe = json.loads((run_dir / "recipe.json").read_text())
    checkpoints = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line) if line.strip() else {}
        if rec.get("event") == "checkpoint":
            e = rec["eval"]
            checkpoints.append({"name": rec["name"], "step": rec["step"],
                                "gen_over_unigram": e["gen_acc"] / e["unigram_acc"],
                                "disc_gain": e["disc_acc"] - e["baseline_acc"], **{k: e.get(k) for k in EVAL_KEYS}})
    return {"lr": recipe["optim"]["lr"], "optimizer": recipe["optim"]["name"], "steps": summary["steps"],
            "warmup_steps": plan["warmup_steps"], "seed": recipe["train"]["seed"],
            "train_seconds": summary["train_seconds"],
            "tokens_per_second": summary["tokens_seen"] / summary["train_seconds"], "checkpoints": checkpoints}


def render(doc: dict) -> str:
    lines = [f"# Short runs: learning rate and warm-up ({doc['recipe']}, {doc['steps']} steps)", "",
             f"Data: `{doc['data']}`; held-out rows asked per checkpoint: {doc['eval_rows']}; machine: "
             f"{doc['machine']['cpu']}, {doc['machine']['cores']} cores, {doc['threads']} thread(s) per run; "
             f"commit {doc['git_commit']}.", "",
             "Generator: held-out accuracy at the masked slots, and its ratio to always answering the most frequent "
             "word. Matched AUCs: replaced vs original occurrences of the same token id (0.5 = no context), on the "
             "generator's fakes and on unigram draws. Raw AUCs and accuracy over the prior: word frequency counts.", "",
             "| arm | peak lr | warm-up | seed | step | gen. acc (unigram) | gen / unigram | matched AUC | matched "
             "context AUC | raw AUC | raw context AUC | disc. acc − prior | tokens/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in doc["arms"].items():
        for c in a["checkpoints"]:
            lines.append(f"| {name} | {a['lr']:g} | {a['warmup_steps']} | {a['seed']} | {c['step']} | "
                         f"{c['gen_acc']:.3f} ({c['unigram_acc']:.3f}) | {c['gen_over_unigram']:.2f} | "
                         f"{c['disc_auc_matched']:.3f} | {c['disc_auc_context_matched']:.3f} | {c['disc_auc']:.3f} | "
                         f"{c['disc_auc_context']:.3f} | {c['disc_gain']:+.4f} | {a['tokens_per_second']:,.0f} |")
    lines += ["", f"Command: `{doc['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a directory written by `tinyelectra prepare` (vocabulary 8192)")
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-rows", type=int, default=1024)
    ap.add_argument("--arms", default="lr1e-4,lr5e-4,lr1e-3,lr2e-3,lr3e-3")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override for every arm")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (pinned; see the docstring)")
    ap.add_argument("--work-dir", default=str(ROOT / "runs" / "short-runs"))
    ap.add_argument("--name", default="short_runs_cpu", help="the result's name (and the runs' folder)")
    ap.add_argument("--out-dir", default=None)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    for name in names:
        arm_settings(name)  # bad names fail before any run
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    work = Path(args.work_dir) / args.name / f"{args.recipe}-{args.steps}"
    command = command_line("benchmarks.lab.short_runs", argv)
    started = time.perf_counter()

    def save() -> Path:
        arms = {p.parent.name: arm_facts(p.parent) for p in work.glob("*/summary.json")}
        doc = {"recipe": args.recipe, "steps": args.steps, "data": args.data, "eval_rows": args.eval_rows,
               "threads": args.threads,
               "arms": dict(sorted(arms.items(), key=lambda a: (a[1]["lr"], a[1]["warmup_steps"], a[1]["seed"]))),
               "wall_seconds_this_invocation": time.perf_counter() - started}
        path = write_result(args.name, doc, torch.device("cpu"),
                            out_dir=Path(args.out_dir) if args.out_dir else RESULTS,
                            command=command)
        md = path.with_suffix(".md")
        tmp = md.with_name(f"{md.name}.tmp-{os.getpid()}")
        tmp.write_text(render(json.loads(path.read_text())), encoding="utf-8")
        os.replace(tmp, md)
        return path

    for name in names:
        run_arm(name, args, work)
        save()
    return json.loads(save().read_text())


if __name__ == "__main__":
    run_main(main)
