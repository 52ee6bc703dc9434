"""Issue 3's acceptance benchmark: one full ELECTRA-Small pre-training step (masking, generator, Gumbel sampling,
discriminator, backward, clip, optimizer) at batch 16 x 128 in fp32 on this CPU, tinyelectra against transformers'
ElectraForMaskedLM + ElectraForPreTraining wired the common way (benchmarks/common.py, `HFStep`), alternating in
one process after warm-up. Target: >= 1.8x tokens/s.

    /tmp/venv/bin/python -m benchmarks.step_cpu [--rounds 20] [--allocator tuned|default]
      -> benchmarks/results/step_cpu.json

Both sides run in the same process under the same allocator settings: `--allocator tuned` (default) applies
tinyelectra.runtime.tune_cpu() (what the trainer does) for both; `default` leaves glibc as it is.
Batches are synthetic (BERT special ids, 5% short rows), the same sequence for both sides.
"""

from __future__ import annotations

import argparse
import os
import sys

# Other jobs share this machine's cores: spinning OpenMP workers then wait for descheduled peers (a 2-thread step
# measured 3.5x slower at load 9). Sleeping waits cost little when the machine is idle. Read at torch's import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from benchmarks.common import StepSetup, command_line, compare_steps, synthetic_batches, write_result

from tinyelectra.config import load_recipe
from tinyelectra.runtime import tune_cpu

TARGET_SPEEDUP = 1.8


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="electra-small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=20, help="timed A/B rounds after warm-up")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--allocator", choices=("tuned", "default"), default="tuned")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch CPU threads, set and recorded (default: one per core)")
    ap.add_argument("--name", default="step_cpu", help="result file name (benchmarks/results/NAME.json)")
    ap.add_argument("--out-dir", default=None)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)  # pinned, and recorded by machine() in the result
    allocator_note = tune_cpu() if args.allocator == "tuned" else "CPU allocator: glibc defaults"
    recipe = load_recipe(args.recipe)
    device = torch.device("cpu")
    setup = StepSetup(recipe.model, recipe.objective, recipe.optim, device, precision="fp32")
    batches = synthetic_batches(recipe.model.vocab_size, args.batch, args.seq_len, count=8)
    res = compare_steps(setup, batches, rounds=args.rounds, warmup=args.warmup, measure_memory=False)
    speedup = res["speedup"]["median_of_round_ratios"]
    payload = {"recipe": args.recipe, "device": "cpu", "precision": "fp32", "allocator": allocator_note,
               "data": "synthetic batches (8 distinct, cycled; same sequence for both sides)",
               "target_speedup": TARGET_SPEEDUP, "meets_target": speedup >= TARGET_SPEEDUP, **res}
    path = write_result(args.name, payload, device, out_dir=args.out_dir, command=command_line(__spec__.name, argv))
    te, hf = res["tinyelectra"], res["transformers"]
    print(f"tinyelectra {te['tokens_per_s']:.0f} tok/s (median {te['median_s'] * 1000:.0f} ms), transformers "
          f"{hf['tokens_per_s']:.0f} tok/s (median {hf['median_s'] * 1000:.0f} ms): {speedup:.2f}x "
          f"(target {TARGET_SPEEDUP}x) -> {path}")
    return payload


if __name__ == "__main__":
    main()
