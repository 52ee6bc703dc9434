"""The parity check: does the compiled training step (with CUDA graphs, as `tinyelectra train` runs it by default on
one GPU) compute what the eager step computes? Fail-fast: exit 0 and a JSON when it does, exit 1 and one line on
stderr when it does not (the JSON is written either way), exit 2 on bad input.

    python -m benchmarks.loss_check --device cuda --recipe electra-small --batch 128 --seq-len 128 --precision bf16 \
        --compile auto --steps 20
        -> benchmarks/results/loss_check_<device>_<precision>_<mode>.json (or --name)

Sides, each `benchmarks/throughput.py`'s `TrainerStep` (the trainer's own Engine, mask_step and train_step) from the
same initial weights, on the same batches with the same per-step seeds, N steps at a constant learning rate (a tenth
of the recipe's peak unless --lr; the weights must move for the update to be checked too, and not chaotically: the
paper's Adam has no bias correction, so its first steps move each weight by about 3 x lr, which the recipe's warm-up
tames; at the tiny recipe's peak its bf16 losses spiked within 6 steps on the CPU, eager and compiled apart, while at
a tenth they moved by 36% in 10 steps with eager and compiled 1e-4 apart):
  eager      train.compile=off, in --precision;
  compiled   train.compile=--compile ("auto" resolved as the trainer resolves it: inductor + CUDA graphs on one GPU);
  reference  eager in fp32 (TF32 off), only when --precision is bf16 or fp16: the yardstick of rounding.
The batches alternate between rows without padding and rows padded as the official builder pads 5% of them, so both
compiled graphs (no attention mask / mask) are compared. Dropout is off on every side by default: inductor may draw
dropout's masks in another order than eager (its random numbers would differ, not its mathematics); the Gumbel noise
of sampling is the one random draw left inside the compiled step, and with inductor's `fallback_random` it comes from
the same generator call as eager's. On the CPU the eager side runs the plain torch operators
(runtime.plain_cpu_paths), not the CPU-only fast paths, so that it draws what compiled code draws.

With dropout ON (`--dropout recipe`) the two sides' random draws may differ, so losses cannot be compared to
rounding; the check becomes statistical (`dropout_verdict`), on the configuration that trains (the compiled code as
it runs, without `fallback_random`): at learning rate 0 (the weights stay), one batch, masked once, is stepped
--repeats times with a fresh per-step seed each time (the dropout masks and the generator's samples change, nothing
else), on each side. It fails when the compiled losses repeat (a CUDA graph replaying the random numbers it was
recorded with: the dropout masks frozen), when their mean differs from eager's by more than Z = 4 standard errors
plus rounding (dropout applied at another rate or unscaled, a lost mask), or when their spread differs from eager's
(the log of the variance ratio beyond Z x sqrt(4 / (K - 1)), its normal approximation for K samples). Rounding
allowance: FLOOR relative in fp32; in bf16/fp16, 2 x the fp32 eager reference's mean difference from eager, as above.

The verdict, on the per-step relative loss difference |L_compiled - L_eager| / |L_eager|, maximum over the steps:
  limit = 2 x (the same maximum for the fp32 reference against eager) + FLOOR
Why: a compiled bf16 step rounds to bf16 at fewer points than the eager one (inductor fuses elementwise work in fp32),
so its distance from eager bf16 is expected to be at most about eager bf16's own distance from fp32, which the
reference measures in the same run on the same card; 2x is the margin. FLOOR (1e-4 relative) is the limit of an fp32
check, which has no reference: inductor reorders fp32 sums (a loss sums ~1e4-1e5 terms) and Adam carries such
differences into the next steps; measured on the CPU (inductor, fp32, tiny recipe with 1 layer, 4 x 32, 20 steps:
benchmarks/results/loss_check_cpu_fp32_inductor.json) the two sides stayed 1.3e-7 apart while the losses moved 37%.
A difference above it is not rounding: a stale graph input, a lost or doubled update, a dropped mask. The check also
fails when the eager losses moved by less than the limit over the steps (it could not have seen a difference), and
when any loss is not finite.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from benchmarks.common import add_step_arguments, command_line, run_main, step_setup, synchronize, write_result
from benchmarks.throughput import Batches, TrainerStep

from tinyelectra import runtime
from tinyelectra.config import load_recipe

FLOOR = 1e-4  # relative; see the module docstring
REFERENCE_FACTOR = 2.0
Z = 4.0  # standard errors: a false alarm about once in 16,000 checks of equal distributions (normal losses)


def run(step: TrainerStep, steps: int) -> list[float]:
    """`steps` losses of `step`: its compile check and first step, then the rest (a host sync per step: not timed)."""
    losses = []
    step.first_call()
    losses.append(float(step.last_loss))
    for _ in range(steps - 1):
        step()
        losses.append(float(step.last_loss))
    return losses


def relative(a: list[float], b: list[float]) -> list[float]:
    """|a - b| / |b| per step."""
    return [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)]


def verdict(eager: list[float], compiled: list[float], reference: list[float] | None) -> dict:
    """The check on per-step losses (see the module docstring): the limit, the differences, and `ok` with the one line
    that says why not."""
    finite = all(math.isfinite(x) for x in eager + compiled + (reference or []))
    diff = max(relative(compiled, eager)) if finite else math.inf
    ref = max(relative(reference, eager)) if finite and reference else 0.0
    limit = REFERENCE_FACTOR * ref + FLOOR
    moved = max(relative(eager, [eager[0]] * len(eager))) if finite else 0.0
    out = {"max_rel_loss_difference": diff, "max_rel_reference_difference": ref if reference else None,
           "limit": limit, "eager_loss_movement": moved, "finite": finite,
           "worst_step": 1 + max(range(len(eager)), key=lambda i: relative(compiled, eager)[i]) if finite else None}
    if not finite:
        line = "a loss is not finite (eager or compiled)"
    elif diff > limit:
        line = (f"the compiled step's losses differ from eager's by {diff:.3g} (relative, step {out['worst_step']}), "
                f"more than the limit {limit:.3g}"
                + (f" (2 x the fp32 reference's {ref:.3g} + {FLOOR:g})" if reference else ""))
    elif moved <= limit:
        line = (f"inconclusive: the eager losses moved by only {moved:.3g} over {len(eager)} steps, not more than the "
                f"limit {limit:.3g} (raise --steps or --lr)")
    else:
        line = ""
    return {**out, "ok": not line, "line": line}


def mean_sd(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def dropout_verdict(eager: list[float], compiled: list[float], reference: list[float] | None = None) -> dict:
    """The statistical check with dropout on (module docstring): K losses per side of one batch at learning rate 0,
    each step with its own seed. Returns the figures and `ok` with the one line that says why not."""
    k = len(eager)
    finite = all(math.isfinite(x) for x in eager + compiled + (reference or []))
    out: dict = {"repeats": k, "finite": finite, "z": Z}
    if not finite or k < 3 or len(compiled) != k:
        return {**out, "ok": False, "line": "a loss is not finite (eager or compiled)" if not finite else
                f"need at least 3 repeats per side, got {k} and {len(compiled)}"}
    (me, se), (mc, sc) = mean_sd(eager), mean_sd(compiled)
    rounding = REFERENCE_FACTOR * abs(mean_sd(reference)[0] - me) + FLOOR * abs(me) if reference else FLOOR * abs(me)
    mean_limit = Z * math.sqrt((se**2 + sc**2) / k) + rounding
    spread_limit = Z * math.sqrt(4.0 / (k - 1))
    distinct = len(set(compiled))
    log_ratio = math.log(sc**2 / se**2) if sc > 0 and se > 0 else (-math.inf if se > 0 else math.nan)
    out.update({"eager_mean": me, "eager_sd": se, "compiled_mean": mc, "compiled_sd": sc, "mean_difference": mc - me,
                "mean_limit": mean_limit, "rounding_allowance": rounding, "log_variance_ratio": log_ratio,
                "spread_limit": spread_limit, "compiled_distinct_losses": distinct})
    if se == 0:
        line = "inconclusive: the eager losses do not vary between seeds (is dropout off in this configuration?)"
    elif distinct <= k // 2:
        line = (f"the compiled step's losses repeat ({distinct} distinct of {k} seeds): its random numbers (dropout "
                "masks, samples) are not drawn afresh each step")
    elif abs(mc - me) > mean_limit:
        line = (f"the compiled step's mean loss {mc:.6g} differs from eager's {me:.6g} by {abs(mc - me):.3g}, more "
                f"than {Z:g} standard errors plus rounding ({mean_limit:.3g})")
    elif not abs(log_ratio) <= spread_limit:
        line = (f"the compiled step's losses spread differently from eager's (sd {sc:.3g} vs {se:.3g}: log variance "
                f"ratio {log_ratio:.3g} beyond {spread_limit:.3g})")
    else:
        line = ""
    return {**out, "ok": not line, "line": line}


def dropout_samples(step: TrainerStep, repeats: int, first_call: bool = True) -> list[float]:
    """`repeats` losses of `step` at learning rate 0 on one batch masked once, each with its own seed (the trainer's
    per-step seeds of steps 1000, 1001, ...); its compile check and first step first (unless done: `first_call`)."""
    from tinyelectra.step import global_counts, mask_step, step_seed, train_step  # noqa: PLC0415

    lr = step.lr
    step.lr = lambda _step: 0.0
    if first_call:
        step.first_call()
    recipe, engine = step.recipe, step.engine
    batch = step.batches.batch()
    masked, _ = mask_step(batch, recipe, step.batches.special, 0, 0, len(batch.input_ids), 1)
    counts = global_counts(masked, engine.dist)
    losses = []
    for i in range(repeats):
        step.optimizer.set_lr(0.0)
        seed = step_seed(recipe.train.seed, 1000 + i, 0, 1)
        losses.append(float(train_step(engine, masked, [seed], counts, step.autocast, step.sums)))
    step.lr = lr
    return losses


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(ap)
    ap.add_argument("--compile", default="on", choices=("auto", "on", "reduce-overhead", "regional", "regional-graph"),
                    help="the compiled side's train.compile (auto: as `tinyelectra train` resolves it; regional-graph "
                         "needs --set train.update=flat)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=None,
                    help="constant learning rate (default: a tenth of the recipe's peak)")
    ap.add_argument("--dropout", default="off", choices=("off", "recipe"),
                    help="off: no dropout on any side, losses compared to rounding (default); recipe: the recipe's "
                         "dropout, the statistical check (dropout_verdict)")
    ap.add_argument("--repeats", type=int, default=32, help="--dropout recipe: seeds per side (default 32)")
    ap.add_argument("--set", action="append", default=[], help="recipe overrides, e.g. model.num_layers=1")
    return ap


def build(recipe_name: str, overrides: list[str], device: torch.device, precision: str, batch: int, seq_len: int,
          lr: float | None) -> TrainerStep:
    recipe = load_recipe(recipe_name, [*overrides, f"train.precision={precision}"])
    batches = Batches(None, recipe.model.vocab_size, batch, seq_len, device, seed=0, padding="alternate")
    step = TrainerStep(recipe, device, precision, batches)  # the recipe's seed: the same initial weights on every side
    constant = recipe.optim.lr / 10 if lr is None else lr
    step.lr = lambda _step: constant
    return step


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    device, precision, _, batch = step_setup(args)
    if device.type == "cpu":
        runtime.tune_cpu()
    if args.steps < 2:
        from tinyelectra.errors import UserError  # noqa: PLC0415

        raise UserError("--steps must be at least 2 (the losses must move for the check to see anything)")
    mode = runtime.choose_compile(args.compile, device).mode  # one process, one micro-batch: as the trainer decides
    base = [*args.set, f"train.batch_size={batch}", f"train.seq_len={args.seq_len}"]
    if args.dropout == "off":
        base += ["model.dropout=0.0", "model.attention_dropout=0.0"]
    import torch._inductor.config as inductor_config  # noqa: PLC0415

    if args.dropout == "off":
        inductor_config.fallback_random = True  # the compiled side draws its random numbers as eager does
    elif args.repeats < 3:
        from tinyelectra.errors import UserError  # noqa: PLC0415

        raise UserError("--repeats must be at least 3")
    sides = {"eager": ("off", precision), "compiled": (mode, precision)}
    if precision != "fp32":
        sides["reference"] = ("off", "fp32")
    steps, losses, seconds, notes = {}, {}, {}, {}
    for label, (compile_mode, prec) in sides.items():
        runtime.configure_matmul(prec, device)  # fp32: TF32 off, the reference's true fp32
        plain = runtime.plain_cpu_paths() if device.type == "cpu" else contextlib.nullcontext()
        with plain:
            steps[label] = build(args.recipe, [*base, f"train.compile={compile_mode}"], device, prec, batch,
                                 args.seq_len, args.lr)
            t0 = time.perf_counter()
            losses[label] = (run(steps[label], args.steps) if args.dropout == "off" else
                             dropout_samples(steps[label], args.repeats))
            synchronize(device)
        seconds[label] = time.perf_counter() - t0
        notes[label] = steps[label].compile_note
        print(f"{label} ({prec}): {notes[label]}; losses {losses[label][0]:.5f} ... {losses[label][-1]:.5f}",
              flush=True)
    v = (verdict if args.dropout == "off" else dropout_verdict)(
        losses["eager"], losses["compiled"], losses.get("reference"))
    weights = max((a - b).abs().max().item() for a, b in zip(steps["eager"].model.state_dict().values(),
                                                               steps["compiled"].model.state_dict().values()))
    name = args.name or (f"loss_check_{device.type}_{precision}_{args.compile}"
                         + ("_dropout" if args.dropout != "off" else ""))
    payload = {
        "recipe": args.recipe, "overrides": base,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision, "compile": args.compile, "compile_mode": mode, "batch_size": batch,
        "seq_len": args.seq_len,
        "steps": args.steps if args.dropout == "off" else args.repeats, "learning_rate": steps["eager"].lr(0),
        "dropout": args.dropout, "inductor_fallback_random": args.dropout == "off",
        "batches": steps["eager"].batches.source,
        "compile_note": notes, "seconds": seconds, "losses": losses, **{k: v[k] for k in v if k != "line"},
        "why": v["line"] or None, "max_abs_weight_difference_at_end": weights,
        "max_abs_loss_difference": max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"])),
        "first_step_abs_difference": abs(losses["eager"][0] - losses["compiled"][0]),
        "tolerance": (f"limit = {REFERENCE_FACTOR:g} x (max relative difference of the eager fp32 reference) + "
                      f"{FLOOR:g}"
                      if args.dropout == "off" else
                      f"statistical (dropout on, lr 0, one batch, {args.repeats} seeds per side): mean within {Z:g} "
                      f"standard errors + rounding, log variance ratio within {Z:g} x sqrt(4 / (K - 1)), fresh draws"),
    }
    path = write_result(name, payload, device, out_dir=args.out_dir, command=command_line(__spec__.name, argv))
    if not v["ok"]:
        print(f"loss check failed: {v['line']} ({path})", file=sys.stderr)
        sys.exit(1)
    if args.dropout == "off":
        print(f"eager vs {args.compile} ({mode}): max relative loss difference {v['max_rel_loss_difference']:.3g} <= "
              f"limit {v['limit']:.3g} over {args.steps} steps (losses moved {v['eager_loss_movement']:.3g}) -> {path}")
    else:
        print(f"eager vs {args.compile} ({mode}), dropout on: mean loss {v['compiled_mean']:.6g} vs "
              f"{v['eager_mean']:.6g} (limit {v['mean_limit']:.3g}), sd {v['compiled_sd']:.3g} vs {v['eager_sd']:.3g}, "
              f"{v['compiled_distinct_losses']} distinct losses of {v['repeats']} -> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
