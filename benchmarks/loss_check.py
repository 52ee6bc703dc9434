"""Issue 10: does the compiled training step compute what the eager one computes? Two trainer steps
(benchmarks/throughput.py's `TrainerStep`: the trainer's own parts) from the same initial weights on the same
batches and seeds, one eager and one compiled (--compile on | reduce-overhead), N steps each: per-step losses, their
largest absolute and relative differences, and the largest weight difference at the end.

    python benchmarks/loss_check.py --device cuda --recipe electra-small --batch 128 --precision bf16 --steps 20
      -> benchmarks/results/loss_check_<device>_<precision>_<compile>.json  (or --name)

The compiled side is built with `torch._inductor.config.fallback_random = True`, so that its dropout masks and
Gumbel noise come from the same generator calls as eager's (inductor otherwise draws its own random numbers and the
two runs would differ by their randomness, not by compilation). Differences are reported, not judged: bf16 rounding
alone moves losses in the third significant digit; fp32 should agree far more closely.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_step_arguments, command_line, run_main, step_setup, synchronize, write_result  # noqa: E402
from throughput import Batches, TrainerStep  # noqa: E402

from tinyelectra import runtime  # noqa: E402
from tinyelectra.config import load_recipe  # noqa: E402


def run(step: TrainerStep, steps: int) -> list[float]:
    losses = []
    step.first_call()  # the compile check, then step 1
    losses.append(float(step.last_loss))
    for _ in range(steps - 1):
        step()
        losses.append(float(step.last_loss))  # host sync every step: fine here, nothing is timed
    return losses


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(ap)
    ap.add_argument("--compile", default="on", choices=("on", "reduce-overhead"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], help="recipe overrides, e.g. model.num_layers=1")
    return ap


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    device, precision, _, batch = step_setup(args)
    runtime.configure_matmul(precision, device)
    if device.type == "cpu":
        runtime.tune_cpu()
    base = [*args.set, f"train.batch_size={batch}", f"train.seq_len={args.seq_len}", f"train.precision={precision}"]
    import torch._inductor.config as inductor_config  # noqa: PLC0415

    inductor_config.fallback_random = True  # the compiled side draws its random numbers as eager does
    sides, losses, seconds = {}, {}, {}
    for label, mode in (("eager", "off"), ("compiled", args.compile)):
        recipe = load_recipe(args.recipe, [*base, f"train.compile={mode}"])
        batches = Batches(None, recipe.model.vocab_size, batch, args.seq_len, device, seed=0)
        sides[label] = TrainerStep(recipe, device, precision, batches)  # same seed: same initial weights
        t0 = time.perf_counter()
        losses[label] = run(sides[label], args.steps)
        synchronize(device)
        seconds[label] = time.perf_counter() - t0
        print(f"{label}: {sides[label].compile_note}; losses {losses[label][0]:.4f} ... {losses[label][-1]:.4f}", flush=True)
    diffs = [abs(a - b) for a, b in zip(losses["eager"], losses["compiled"])]
    rel = [d / max(abs(a), 1e-12) for d, a in zip(diffs, losses["eager"])]
    weights = max((a - b).abs().max().item() for a, b in zip(sides["eager"].model.state_dict().values(),
                                                               sides["compiled"].model.state_dict().values()))
    name = args.name or f"loss_check_{device.type}_{precision}_{args.compile}"
    payload = {
        "recipe": args.recipe, "overrides": args.set, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision, "compile": args.compile, "batch_size": batch, "seq_len": args.seq_len, "steps": args.steps,
        "inductor_fallback_random": True,
        "compile_note": {k: v.compile_note for k, v in sides.items()}, "seconds": seconds,
        "losses": losses, "max_abs_loss_difference": max(diffs), "max_rel_loss_difference": max(rel),
        "first_step_abs_difference": diffs[0], "max_abs_weight_difference_at_end": weights,
        "finite": all(map(lambda x: x == x and abs(x) != float("inf"), losses["eager"] + losses["compiled"])),
    }
    if device.type == "cpu":
        payload["note"] = ("CPU: eager uses the CPU-only fast paths (oneDNN matmuls, NumPy dropout masks, inverse-CDF "
                           "sampling), which compilation bypasses, so the two sides draw different random numbers: the "
                           "difference here is randomness, not compilation. On a GPU both sides take the same paths.")
    path = write_result(name, payload, device, out_dir=args.out_dir, command=command_line("benchmarks/loss_check.py", argv))
    print(f"eager vs {args.compile}: max |loss difference| {max(diffs):.3g} (relative {max(rel):.3g}) over {args.steps} "
          f"steps; max weight difference {weights:.3g} -> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
