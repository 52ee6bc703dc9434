"""What a run's checkpoints learned, scored again with today's diagnostics (issue 9, item 3).

Every checkpoint of a run directory is scored on the same held-out rows with `diagnostics.evaluate`: discriminator
accuracy beside its all-"original" prior, ROC-AUC against the run's own generator and on unigram draws put in the
masked slots, both also matched by token id (the numbers word frequency cannot fool), and generator accuracy beside
the unigram answer. Useful for runs written before a metric existed, and to score more rows than the run did.
Threads are pinned (--threads, default 1): this was measured on a shared 2-core machine.

    python -m benchmarks.lab.checkpoint_eval --run runs/quality-cpu/electra --data data/enwiki-v8k --rows 1024 \
        --name mini_electra_checkpoints_cpu   -> benchmarks/results/NAME.json and NAME.md
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path

import torch

from benchmarks.common import run_main, write_result
from benchmarks.lab import RESULTS

from tinyelectra.checkpoint import checkpoint_dirs, load_checkpoint
from tinyelectra.data import PretrainData
from tinyelectra.diagnostics import evaluate, unigram_distribution
from tinyelectra.electra import SpecialIds
from tinyelectra.errors import UserError


def score_run(run_dir: Path, data: PretrainData, rows: int, micro: int = 64) -> list[dict]:
    """One row per checkpoint, in step order: step, tokens seen and the `evaluate` metrics on `rows` held-out rows."""
    special = SpecialIds.from_tokenizer(data.tokenizer)
    unigram = unigram_distribution(data, special)
    out = []
    for ckpt in checkpoint_dirs(run_dir):
        model, recipe, meta = load_checkpoint(ckpt)
        recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, eval_rows=rows))
        ev = evaluate(model, data, recipe, special, torch.device("cpu"), contextlib.nullcontext(), micro, unigram)
        out.append({"checkpoint": ckpt.name, "step": meta.get("step"), "tokens_seen": meta.get("tokens_seen"), **ev})
    return sorted(out, key=lambda r: r["step"] or 0)


def markdown(title: str, rows: list[dict]) -> str:
    lines = [f"# {title}", "", f"Held-out rows per checkpoint: {rows[0]['rows'] if rows else 0}.", "",
             "| checkpoint | step | disc. acc − prior | AUC (own generator), raw / matched | context AUC (unigram "
             "draws), raw / matched | recall | gen. acc (unigram) | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['checkpoint']} | {r['step']} | {r['disc_acc'] - r['baseline_acc']:+.4f} | "
                     f"{r['disc_auc']:.3f} / {r['disc_auc_matched']:.3f} | {r['disc_auc_context']:.3f} / "
                     f"{r['disc_auc_context_matched']:.3f} | {r['disc_recall']:.3f} | "
                     f"{r['gen_acc']:.3f} ({r['unigram_acc']:.3f}) | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a run directory (its ckpt-* are scored)")
    ap.add_argument("--data", type=Path, required=True, help="the prepared data the run trained on")
    ap.add_argument("--rows", type=int, default=1024, help="held-out rows per checkpoint")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (pinned)")
    ap.add_argument("--name", required=True, help="result name: benchmarks/results/NAME.json and .md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not checkpoint_dirs(args.run):
        raise UserError(f"{args.run}: no checkpoints to score")
    rows = score_run(args.run, PretrainData(args.data), args.rows)
    path = write_result(args.name, {"run": str(args.run), "data": str(args.data), "checkpoints": rows}, out_dir=RESULTS)
    (RESULTS / f"{args.name}.md").write_text(markdown(f"Checkpoints of {args.run.name}, scored again", rows))
    print(path)


if __name__ == "__main__":
    run_main(main)
