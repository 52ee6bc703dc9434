"""Issue 33, item 2 on the CPU: one optimizer update, today's per-tensor update against the flat one.

One update of a recipe's model (clip to the global norm, the paper's Adam, zero the gradients), today's per-tensor
update (optim.apply_update: clip_grad_norm_ + PaperAdam on torch's fused kernel) against the flat one
(optim.FlatUpdate), alternating in one process on the same gradients.

    nice .venv/bin/python -m benchmarks.update_cpu [--recipe electra-small] [--rounds 30] [--threads 1]
      -> benchmarks/results/update_cpu.json

The update alone, not the step: on the CPU the step is some hundred times longer, so this says what the update
costs, not whether a CPU run gets faster. A GPU's figure is `benchmarks/ab.py`'s.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from benchmarks.common import alternate, command_line, paired_ratio, run_main, summarize, write_result

from tinyelectra.config import load_recipe
from tinyelectra.model import Electra, count_parameters
from tinyelectra.optim import FlatUpdate, apply_update, build_optimizer
from tinyelectra.runtime import tune_cpu


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="electra-small")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="update_cpu")
    ap.add_argument("--out-dir", default=None)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    allocator = tune_cpu()  # as the trainer: large temporaries reuse their memory instead of faulting fresh pages
    recipe = load_recipe(args.recipe)
    device = torch.device("cpu")
    torch.manual_seed(0)
    models = [Electra(recipe.model) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [build_optimizer(m, recipe.optim, "cpu") for m in models]
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    flat = FlatUpdate(opts[1], recipe.optim.clip_norm)
    grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) for p in models[0].parameters()]
    params = list(models[0].parameters())

    def per_tensor() -> None:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opts[0].set_lr(1e-4)
        apply_update(params, opts[0], scaler, recipe.optim.clip_norm)

    def flat_update() -> None:
        for p, g in zip(models[1].parameters(), grads):
            p.grad = g.clone()
        opts[1].set_lr(1e-4)
        flat()

    times = alternate({"per_tensor": per_tensor, "flat": flat_update}, args.warmup, args.rounds, device)
    payload = {"recipe": args.recipe, "allocator": allocator, "parameters": count_parameters(models[0]),
               "parameter_tensors": len(params), "rounds": args.rounds, "warmup_rounds": args.warmup,
               "what": "one update each (the gradients' copies into .grad included on both sides), alternating",
               **{k: summarize(v) for k, v in times.items()},
               "flat_speedup": paired_ratio(times["per_tensor"], times["flat"])}
    path = write_result(args.name, payload, device, out_dir=args.out_dir,
                        command=command_line("benchmarks.update_cpu", argv))
    print(f"per-tensor {payload['per_tensor']['median_s'] * 1e3:.2f} ms, flat {payload['flat']['median_s'] * 1e3:.2f} "
          f"ms: {payload['flat_speedup']['median_of_round_ratios']:.2f}x -> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
