"""Issue 9: does the discriminator learn context at CPU scale, and does tinyelectra's learn it as transformers' does?

Replaced-token detection alone, with fixed replacements: 15% of the positions (tinyelectra's `mask_batch`) take a
draw from the training data's unigram distribution, the words a generator that has learned only frequencies would
write. By its identity alone such a draw looks like any original token, so a held-out ROC-AUC above 0.5 means the
discriminator uses context, but only once token identity is taken out: [CLS]/[SEP] are never replaced and a draw
equal to the original counts as "original" (more often for frequent words), so a scorer of identity alone ranks above
0.5 on every real token. The matched AUC (replaced vs original occurrences of the same token id, specials left out:
diagnostics.py) is the context number; the raw one is shown beside it. (In a full ELECTRA run the early generator writes
*unlikely* words, which a discriminator spots by identity alone; once the generator improves, only context is left: see
benchmarks/lab/results/mini_electra_checkpoints_cpu.md, where the AUC falls from 0.80 to 0.55 as the generator learns.)

Two implementations of the same discriminator (a recipe's model, `mini` by default) train side by side, each in its
own process with one thread, on the same batches and the same corruptions: tinyelectra's `Electra` (embeddings,
discriminator encoder and binary head) and transformers' `ElectraForPreTraining` (built from `hf.hf_config`, its
own initialisation). Both use torch's AdamW (bias-corrected, weight decay 0.01 on every tensor), a 100-step
linear warm-up then a constant rate, clipping at 1.0, dropout on. Every `--eval-every` steps: held-out AUC and
accuracy minus the all-original prior on the same corrupted validation rows.

    python -m benchmarks.lab.disc_context --data data/enwiki-v8k --steps 800 [--lr 5e-4] [--recipe mini]
      -> benchmarks/lab/results/disc_context_cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks import child_env
from benchmarks.common import command_line, run_main, write_result
from benchmarks.lab import RESULTS

from tinyelectra import hf
from tinyelectra.config import load_recipe
from tinyelectra.data import PretrainData
from tinyelectra.diagnostics import unigram_distribution
from tinyelectra.electra import SpecialIds, mask_batch
from tinyelectra.errors import UserError
from tinyelectra.metrics import roc_auc
from tinyelectra.model import Electra

ARMS = ("tinyelectra", "transformers")
WARMUP_STEPS = 100
EVAL_BATCHES = 16  # of --batch-size validation rows
UNIGRAM_ROWS = 5000  # training rows whose word frequencies the replacements are drawn from


def corrupt(batch, objective, special, freqs: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(fake ids, labels): the chosen positions take unigram draws; a draw equal to the original is "original"."""
    m = mask_batch(batch.input_ids, batch.token_type_ids, batch.attention_mask, objective, special, len(freqs), g)
    draws = torch.multinomial(freqs, m.positions.numel(), replacement=True, generator=g).view_as(m.positions)
    fake = batch.input_ids.scatter(1, m.positions, torch.where(m.weights > 0, draws, m.targets))
    return fake, (fake != batch.input_ids).float()


def build(arm: str, cfg):
    """(module, forward(batch, fake ids) -> (B, T) logits) for one implementation."""
    if arm == "tinyelectra":
        model = Electra(cfg)
        model.generator = model.gen_head = None  # RTD alone: no generator, nothing of it in the optimizer
        return model, lambda b, fake: model.discriminator_logits(fake, b.token_type_ids, b.attention_mask)
    from transformers import ElectraForPreTraining  # noqa: PLC0415

    model = ElectraForPreTraining(hf.hf_config(cfg))
    return model, lambda b, fake: model(input_ids=fake, token_type_ids=b.token_type_ids,
                                        attention_mask=b.attention_mask.long()).logits


def train_arm(args) -> list[dict]:
    """One implementation's run; returns its evaluations."""
    torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe, args.set)
    data = PretrainData(args.data)
    tok = data.tokenizer
    special = SpecialIds.from_tokenizer(tok)
    cfg = recipe.model
    if tok.vocab_size > cfg.vocab_size:
        raise UserError(f"{args.data}: vocabulary {tok.vocab_size} > the recipe's {cfg.vocab_size}")
    freqs = unigram_distribution(data, special, rows=UNIGRAM_ROWS)
    torch.manual_seed(args.seed)
    model, forward = build(args.arm_only, cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    B = args.batch_size
    eval_batches = min(EVAL_BATCHES, data.num_rows("validation") // B)
    if eval_batches == 0:
        raise UserError(f"{args.data}: fewer held-out rows than one batch of {B}")
    val = [data.batch("validation", np.arange(i * B, (i + 1) * B)) for i in range(eval_batches)]
    g_val = torch.Generator().manual_seed(args.seed + 2)
    val_fake = [corrupt(b, recipe.objective, special, freqs, g_val) for b in val]
    g_train = torch.Generator().manual_seed(args.seed + 1)
    order = np.random.default_rng(args.seed)
    n_train = data.num_rows("train")

    def evaluate(step: int, seconds: float) -> dict:
        model.eval()
        scores, labels, ids = [], [], []
        with torch.no_grad():
            for b, (fake, lab) in zip(val, val_fake):
                keep = b.attention_mask
                scores.append(forward(b, fake)[keep].float())
                labels.append(lab[keep])
                ids.append(fake[keep])
        model.train()
        s, y, i = torch.cat(scores), torch.cat(labels), torch.cat(ids)
        prior = float(1.0 - y.mean())
        acc = float(((s > 0).float() == y).float().mean())
        words = ~torch.isin(i, torch.tensor([special.pad, special.cls, special.sep, special.mask]))
        return {"step": step, "auc": round(roc_auc(s.numpy(), y.numpy()), 4),
                "auc_matched": round(roc_auc(s[words].numpy(), y[words].numpy(), i[words].numpy()), 4),
                "acc_minus_prior": round(acc - prior, 4),
                "prior": round(prior, 4), "tokens": len(y), "seconds": round(seconds, 1)}

    evals, t0 = [], time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            evals.append(evaluate(step, time.perf_counter() - t0))
            print(json.dumps({"arm": args.arm_only, **evals[-1]}), file=sys.stderr, flush=True)
        if step == args.steps:
            break
        b = data.batch("train", order.integers(0, n_train, B))  # the same rows on both sides: same seed, same draws
        fake, lab = corrupt(b, recipe.objective, special, freqs, g_train)
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / WARMUP_STEPS)
        w = b.attention_mask.float()
        loss = (F.binary_cross_entropy_with_logits(forward(b, fake).float(), lab, reduction="none") * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return evals


def auc_gain_ratio(ours: float, theirs: float) -> float | None:
    """(AUC - 0.5) of ours over theirs; None while either is within 0.01 of chance (a ratio of noise)."""
    return round((ours - 0.5) / (theirs - 0.5), 3) if min(ours, theirs) > 0.51 else None


def write_markdown(json_path: Path) -> Path:
    """NAME.md beside NAME.json: the two implementations' held-out curves side by side."""
    r = json.loads(Path(json_path).read_text())
    te, hf_ = r["evals"]["tinyelectra"], r["evals"]["transformers"]
    tokens = f"{te[0]['tokens']:,} tokens, " if "tokens" in te[0] else ""
    lines = [f"# Does the discriminator learn context? ({r['recipe']}, {r['steps']} steps of {r['batch_size']} rows)",
             "",
             f"{r['what']}. Optimizer: {r['optimizer']}, peak lr {r['lr']}. Held-out: {r['evaluation']} "
             f"({tokens}all-original prior {te[0]['prior']:.4f}). Machine: {r['machine']['cpu']}, "
             f"commit {r['git_commit'][:7]}, `{r['command']}`.", "",
             "| step | matched AUC tinyelectra | matched AUC transformers | raw AUC tinyelectra | raw AUC transformers "
             "| acc − prior tinyelectra | acc − prior transformers |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {a['step']} | {a.get('auc_matched', float('nan')):.4f} | {b.get('auc_matched', float('nan')):.4f} | "
              f"{a['auc']:.4f} | {b['auc']:.4f} | {a['acc_minus_prior']:+.4f} | {b['acc_minus_prior']:+.4f} |"
              for a, b in zip(te, hf_)]
    ratio = auc_gain_ratio(te[-1]["auc"], hf_[-1]["auc"])  # from the curves: result files of every version have them
    lines += ["", f"At the end: AUC tinyelectra − transformers {te[-1]['auc'] - hf_[-1]['auc']:+.4f}; "
              f"AUC gain over chance, tinyelectra / transformers: {'-' if ratio is None else f'{ratio:.3f}'}.", ""]
    out = Path(json_path).with_suffix(".md")
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a prepared data directory (tinyelectra prepare)")
    ap.add_argument("--recipe", default="mini", help="whose model shape (default mini)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a recipe field")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per implementation (each runs in its own process)")
    ap.add_argument("--name", default="disc_context_cpu")
    ap.add_argument("--out-dir", type=Path, default=None, help="where NAME.json goes (default benchmarks/lab/results)")
    ap.add_argument("--arm-only", choices=ARMS, help=argparse.SUPPRESS)  # internal: one implementation, JSON on stdout
    args = ap.parse_args(argv)
    if args.arm_only:
        print(json.dumps(train_arm(args)))
        return None
    argv = sys.argv[1:] if argv is None else argv
    procs = {arm: subprocess.Popen([sys.executable, "-m", __spec__.name, *argv, "--arm-only", arm],
                                   stdout=subprocess.PIPE,
                                  text=True, env=child_env())
             for arm in ARMS}
    evals = {}
    for arm, p in procs.items():
        out, _ = p.communicate()
        if p.returncode != 0:
            raise UserError(f"the {arm} run failed (exit {p.returncode})")
        evals[arm] = json.loads(out)
    last = {arm: e[-1] for arm, e in evals.items()}
    payload = {
        "what": "replaced-token detection alone with unigram replacements (context is the only signal): tinyelectra's "
                "discriminator vs transformers' ElectraForPreTraining, same batches, corruptions and optimizer",
        "recipe": args.recipe, "data": args.data, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
        "torch_threads_per_implementation": args.threads, "seed": args.seed,
        "optimizer": f"torch AdamW (bias-corrected), weight decay 0.01, {WARMUP_STEPS}-step warm-up then constant, "
        "clip 1.0",
        "evaluation": f"up to {EVAL_BATCHES} x {args.batch_size} validation rows (the same on both sides), every real "
        "token",
        "recipe_overrides": args.set,
        "evals": evals,
        "final_auc_difference_tinyelectra_minus_transformers": round(
            last["tinyelectra"]["auc"] - last["transformers"]["auc"], 4),
        "final_auc_gain_ratio_tinyelectra_over_transformers": auc_gain_ratio(
            last["tinyelectra"]["auc"], last["transformers"]["auc"]),
    }
    path = write_result(args.name, payload, out_dir=args.out_dir or RESULTS, command=command_line(__spec__.name, argv))
    write_markdown(path)
    print(f"{path}: final AUC tinyelectra {last['tinyelectra']['auc']}, transformers {last['transformers']['auc']}")
    return payload


if __name__ == "__main__":
    run_main(main)
