"""GLUE on this CPU: fine-tune a checkpoint on RTE, MRPC, STS-B and CoLA with 3 seeds each (the paper's protocol,
`tinyelectra glue`) and record scores, seconds and settings; before that, predict how long it will take, and measure
what dynamic padding saves against padding every batch to 128 tokens.

    /tmp/venv/bin/python benchmarks/glue_cpu.py --checkpoint runs/X/ckpt-10000 [--glue-dir ../shared/data/glue]
        [--tasks rte,mrpc,stsb,cola] [--seeds 3] [--estimate-only] [--shape checkpoint|electra-small]
        -> benchmarks/results/glue_cpu.json   (glue.json files under --out, default runs/glue_cpu/)

The estimate is exact about the work and measured about the speed:
- work: for each task and seed, the batches fine-tuning will draw (finetune.batch_indices, the same seeded order) and
  each batch's padded width after tokenization with the checkpoint's tokenizer; plus dev/test inference;
- speed: one full training step (forward, backward, clip, paper Adam) of the model timed at batch 32 and widths
  16 ... 128, and inference at batch 128; the time of every planned batch is interpolated from those.
- the A/B: real training batches of each task run with dynamic padding and padded to 128, alternating in one
  process (benchmarks/common.alternate), reported as the ratio of medians and the median of per-round ratios;
- contention: the share of its cores the process got while timing (CPU seconds / wall seconds) is recorded, with
  the estimate scaled by it as the figure for an otherwise idle machine.
The same work is also predicted under the opt-in departures (`batching=length`, CPU `precision=bf16`, timed too when
the CPU has fast bf16), so the cost of the paper's exact protocol is visible beside them.
`--shape electra-small` times a randomly initialised ELECTRA-Small classifier (the paper's shape) with the
checkpoint's tokenizer, to plan for a Small checkpoint before one exists. Timings on a shared machine are noisy:
the load average is recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, paired_ratio, summarize, write_result  # noqa: E402

from tinyelectra import finetune, glue  # noqa: E402
from tinyelectra.config import ModelConfig  # noqa: E402
from tinyelectra.glue_data import get_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GLUE = ROOT.parent / "shared" / "data" / "glue"
WIDTHS = (16, 32, 48, 64, 96, 128)


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def random_backbone(cfg: ModelConfig, tokenizer_dir: Path):
    """A randomly initialised backbone of shape `cfg` (timing only: speed does not depend on the weights)."""
    from tinyelectra.hf import Backbone
    from tinyelectra.model import Classifier

    torch.manual_seed(0)
    m = Classifier(cfg, 2)
    return Backbone(cfg, m.embeddings.state_dict(), m.encoder.state_dict(), tokenizer_dir)


def synthetic_batch(enc, batch_size: int, width: int, rng: np.random.Generator):
    """Real rows of `enc` cut or padded to exactly `width` tokens (timing only)."""
    from tinyelectra.glue_data import PaddedBatch

    idx = rng.choice(len(enc), size=batch_size, replace=len(enc) < batch_size)
    b = enc.batch(idx, pad_to=max(width, int(enc.lengths[idx].max())))
    cut = lambda a: np.ascontiguousarray(a[:, :width])  # noqa: E731
    mask = cut(b.attention_mask)
    mask[:, 0] = 1
    return PaddedBatch(cut(b.input_ids), cut(b.token_type_ids), mask, b.labels)


def time_steps(backbone, task: str, enc, fc, device, repeats: int, precision: str) -> dict[int, float]:
    """Median seconds of one training step at batch fc.batch_size for each width in WIDTHS."""
    run = finetune.Finetuner(backbone, task, fc, 0, device, precision)
    rng = np.random.default_rng(0)
    batches = {w: synthetic_batch(enc, fc.batch_size, w, rng) for w in WIDTHS}
    fns = {str(w): (lambda b=batches[w]: run.step(b, 1e-5)) for w in WIDTHS}
    times = alternate(fns, warmup=1, repeats=repeats, device=device)
    return {w: statistics.median(times[str(w)]) for w in WIDTHS}


def time_inference(backbone, task: str, enc, fc, device, repeats: int, precision: str) -> dict[int, float]:
    """Median seconds of one evaluation forward at batch fc.eval_batch_size for each width in WIDTHS."""
    from tinyelectra.model import Classifier
    from tinyelectra.runtime import autocast_context

    model = Classifier(backbone.config, get_task(task).num_labels).eval()
    rng = np.random.default_rng(1)
    batches = {w: synthetic_batch(enc, fc.eval_batch_size, w, rng) for w in WIDTHS}

    def forward(b):
        with torch.no_grad(), autocast_context(precision, device):
            model(*finetune._tensors(b, device))

    fns = {str(w): (lambda b=batches[w]: forward(b)) for w in WIDTHS}
    times = alternate(fns, warmup=1, repeats=repeats, device=device)
    return {w: statistics.median(times[str(w)]) for w in WIDTHS}


def interp(table: dict[int, float], width: float, rows: int, full: int) -> float:
    """Interpolated seconds at `width`, scaled by rows/full for a short last batch."""
    w = sorted(table)
    return float(np.interp(width, w, [table[k] for k in w])) * rows / full


def plan_task(task: str, enc, fc, seeds: list[int], step_s: dict, infer_s: dict) -> dict:
    """The exact batches of every seed and their predicted seconds; inference of dev and test sets."""
    n = len(enc.train)
    per_epoch, total = finetune.plan_steps(n, fc.batch_size, fc.task_epochs(task))
    lengths = enc.train.lengths
    real_tokens = padded_dynamic = 0
    seconds_dynamic = seconds_fixed = 0.0
    grouped = lengths if fc.batching == "length" else None
    for seed in seeds:
        for idx in finetune.batch_indices(n, fc.batch_size, total, seed, grouped):
            width = int(lengths[idx].max())
            real_tokens += int(lengths[idx].sum())
            padded_dynamic += width * len(idx)
            seconds_dynamic += interp(step_s, width, len(idx), fc.batch_size)
            seconds_fixed += interp(step_s, fc.max_length, len(idx), fc.batch_size)
    eval_sets = [*enc.dev.values(), *enc.test]
    infer = 0.0
    for e in eval_sets:  # sorted by length in finetune.predict
        order = np.sort(e.lengths)
        for start in range(0, len(e), fc.eval_batch_size):
            chunk = order[start:start + fc.eval_batch_size]
            infer += interp(infer_s, int(chunk.max()), len(chunk), fc.eval_batch_size)
    infer *= len(seeds)
    return {
        "train_rows": n, "epochs": fc.task_epochs(task), "steps_per_seed": total, "steps_per_epoch": per_epoch,
        "mean_tokens_per_row": float(lengths.mean()), "truncated_rows": enc.train.truncated,
        "tokens_real": real_tokens, "tokens_padded_dynamic": padded_dynamic,
        "tokens_padded_fixed": total * len(seeds) * fc.batch_size * fc.max_length,
        "eval_rows_per_seed": sum(len(e) for e in eval_sets),
        "predicted_train_seconds": seconds_dynamic, "predicted_train_seconds_fixed128": seconds_fixed,
        "predicted_eval_seconds": infer, "predicted_seconds": seconds_dynamic + infer,
    }


def padding_ab(backbone, task: str, enc, fc, device, rounds: int) -> dict:
    """Real training batches (seed 0's first ones) with dynamic padding vs padded to max_length, alternating."""
    run = finetune.Finetuner(backbone, task, fc, 0, device, "bf16" if fc.precision == "bf16" else "fp32")
    n = len(enc.train)
    idxs = list(finetune.batch_indices(n, fc.batch_size, min(8, math.ceil(n / fc.batch_size)), 0))
    idxs = [i for i in idxs if len(i) == fc.batch_size] or idxs
    dyn = [enc.train.batch(i) for i in idxs]
    fixed = [enc.train.batch(i, pad_to=fc.max_length) for i in idxs]
    k = {"dynamic": 0, "fixed128": 0}

    def step(kind, batches):
        run.step(batches[k[kind] % len(batches)], 1e-5)
        k[kind] += 1

    times = alternate({"dynamic": lambda: step("dynamic", dyn), "fixed128": lambda: step("fixed128", fixed)},
                      warmup=1, repeats=rounds, device=device)
    return {"task": task, "batches": len(idxs), "mean_width_dynamic": float(np.mean([b.input_ids.shape[1] for b in dyn])),
            "dynamic": summarize(times["dynamic"]), "fixed128": summarize(times["fixed128"]),
            "speedup_dynamic_over_fixed": paired_ratio(times["fixed128"], times["dynamic"])}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="a ckpt-* directory or a transformers ELECTRA directory")
    ap.add_argument("--glue-dir", type=Path, default=DEFAULT_GLUE)
    ap.add_argument("--tasks", default="rte,mrpc,stsb,cola")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--estimate-only", action="store_true", help="predict the time; do not fine-tune")
    ap.add_argument("--shape", choices=("checkpoint", "electra-small"), default="checkpoint",
                    help="time the checkpoint's own model, or a random ELECTRA-Small (for planning)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per width")
    ap.add_argument("--ab-rounds", type=int, default=4, help="A/B rounds per task")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--max-train-rows", type=int, default=None, help="quick check only: not the measurement")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="fine-tuning key=value (quick checks)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "glue_cpu")
    ap.add_argument("--name", default="glue_cpu")
    ap.add_argument("--note", default="", help="what the checkpoint is (stored in the result)")
    ap.add_argument("--results-dir", type=Path, default=None)
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    from tinyelectra.hf import load_backbone
    from tinyelectra.runtime import tune_cpu
    from tinyelectra.tokenizer import Tokenizer

    allocator = tune_cpu()
    device = torch.device("cpu")
    fc = finetune.FinetuneConfig.from_overrides(args.overrides)
    tasks = [get_task(t).name for t in args.tasks.split(",")]
    seeds = list(range(fc.seed, fc.seed + args.seeds))
    backbone = load_backbone(args.checkpoint)
    if backbone.tokenizer_dir is None:
        raise SystemExit(f"{args.checkpoint}: no tokenizer")
    tokenizer = Tokenizer.load(backbone.tokenizer_dir)
    timed = backbone if args.shape == "checkpoint" else random_backbone(ModelConfig(), backbone.tokenizer_dir)
    print(f"timing a {args.shape} model: hidden {timed.config.hidden_size}, {timed.config.num_layers} layers; "
          f"{torch.get_num_threads()} threads; load average {load_average()}")

    t0 = time.perf_counter()
    data = {t: glue.read_task(t, args.glue_dir, args.max_train_rows, fc.test_predictions) for t in tasks}
    enc = {t: glue.encode_task(tokenizer, data[t], fc.max_length) for t in tasks}
    prep_seconds = time.perf_counter() - t0
    precision = "bf16" if fc.precision == "bf16" else "fp32"
    precisions = ["fp32", "bf16"] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ["fp32"]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    step_s = {p: time_steps(timed, tasks[0], enc[tasks[0]].train, fc, device, args.repeats, p) for p in precisions}
    infer_s = {p: time_inference(timed, tasks[0], enc[tasks[0]].train, fc, device, args.repeats, p) for p in precisions}
    timing_cpu_seconds, timing_wall_seconds = time.process_time() - cpu0, time.perf_counter() - wall0
    plan = {t: plan_task(t, enc[t], fc, seeds, step_s[precision], infer_s[precision]) for t in tasks}
    total_pred = sum(p["predicted_seconds"] for p in plan.values())
    total_fixed = sum(p["predicted_train_seconds_fixed128"] + p["predicted_eval_seconds"] for p in plan.values())
    variants = {}  # the same work under the opt-in departures, predicted from the same timings
    for batching in ("random", "length"):
        for p in precisions:
            v = dataclasses.replace(fc, batching=batching)
            variants[f"batching={batching}, precision={p}"] = sum(
                plan_task(t, enc[t], v, seeds, step_s[p], infer_s[p])["predicted_seconds"] for t in tasks) / 3600
    ab = {t: padding_ab(timed, t, enc[t], fc, device, args.ab_rounds) for t in tasks}
    for t, p in plan.items():
        print(f"{t}: {p['steps_per_seed']} steps/seed x {len(seeds)} seeds, {p['mean_tokens_per_row']:.0f} tokens/row, "
              f"predicted {p['predicted_seconds'] / 60:.1f} min (padded to 128: {p['predicted_train_seconds_fixed128'] / 60:.1f} min)")
    share = timing_cpu_seconds / (timing_wall_seconds * torch.get_num_threads())
    print(f"predicted total {total_pred / 3600:.2f} h with dynamic padding, {total_fixed / 3600:.2f} h padded to 128; "
          f"this process got {share:.0%} of its {torch.get_num_threads()} core(s) while timing "
          f"(uncontended: about {total_pred * share / 3600:.2f} h)")
    for t, r in ab.items():
        print(f"  A/B {t}: dynamic padding {r['speedup_dynamic_over_fixed']['median_of_round_ratios']:.2f}x faster "
              f"than 128 (mean width {r['mean_width_dynamic']:.0f})")
    for name, hours in variants.items():
        print(f"  {name}: {hours:.2f} h")

    payload: dict = {
        "device": "cpu", "precision": precision, "threads": torch.get_num_threads(), "allocator": allocator,
        "load_average_start": load_average(), "checkpoint": str(args.checkpoint.resolve()), "note": args.note,
        "checkpoint_meta": glue.checkpoint_meta(glue.find_checkpoints(args.checkpoint)[0]),
        "timed_shape": {"kind": args.shape, **dataclasses.asdict(timed.config)},
        "tasks": tasks, "seeds": seeds, "max_train_rows": args.max_train_rows,
        "protocol": glue.protocol_dict(fc, backbone.config.hidden_size, tasks, args.max_train_rows),
        "tokenize_seconds": prep_seconds,
        "step_seconds_by_width": {p: {str(w): s for w, s in t.items()} for p, t in step_s.items()},
        "inference_seconds_by_width": {p: {str(w): s for w, s in t.items()} for p, t in infer_s.items()},
        "estimate": {"settings": f"batching={fc.batching}, precision={precision}", "per_task": plan,
                     "total_seconds": total_pred, "total_seconds_fixed128": total_fixed,
                     "total_hours": total_pred / 3600, "variants_hours": variants,
                     "cpu_share_while_timing": share,
                     "total_hours_if_uncontended": total_pred * share / 3600,
                     "note": "cpu_share = process CPU seconds / (wall seconds x threads) during the timing; the "
                             "uncontended figure assumes time scales with it (other jobs shared the cores)"},
        "padding_ab": ab,
        "measured": None,
    }
    if not args.estimate_only:
        if args.shape != "checkpoint":
            raise SystemExit("--shape electra-small is for --estimate-only (the measurement fine-tunes the checkpoint)")
        t0 = time.perf_counter()
        paths = glue.glue_command(
            checkpoint=args.checkpoint, glue_dir=args.glue_dir, use_hf=False, tasks=",".join(tasks), seeds=args.seeds,
            out_dir=args.out, gpu=None, device="cpu", max_train_rows=args.max_train_rows, overrides=args.overrides,
            command=" ".join([Path(sys.executable).name, *sys.argv]))
        wall = time.perf_counter() - t0
        result = json.loads(paths[0].read_text())
        measured = {}
        for t in tasks:
            e = result["tasks"][t]
            measured[t] = {
                "paper_metric": e["paper_metric"], "median_paper": e["median_paper"], "std_paper": e["std_paper"],
                "glue_metric": e["glue_metric"], "median_glue": e["median_glue"], "std_glue": e["std_glue"],
                "seed_paper_scores": [s["paper_score"] for s in e["seeds"]],
                "seed_glue_scores": [s["glue_score"] for s in e["seeds"]],
                "train_seconds": sum(s["train_seconds"] for s in e["seeds"]),
                "eval_seconds": sum(s["eval_seconds"] for s in e["seeds"]),
                "predicted_seconds": plan[t]["predicted_seconds"],
            }
        payload["measured"] = {"per_task": measured, "averages": result["averages"], "wall_seconds": wall,
                               "glue_json": str(paths[0]), "meta": result["meta"],
                               "load_average_end": load_average()}
        print(f"measured {wall / 3600:.2f} h (predicted {total_pred / 3600:.2f} h); "
              + "; ".join(f"{t} {m['median_paper']:.1f}" for t, m in measured.items()))
    path = write_result(args.name, payload, device, out_dir=args.results_dir)
    print(f"-> {path}")
    return payload


if __name__ == "__main__":
    main()
