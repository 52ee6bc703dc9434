"""Issue 6, item 1: tokens/s of full pre-training steps, tinyelectra's trainer step against transformers'
ElectraForMaskedLM + ElectraForPreTraining wired the common way, on the CPU or a CUDA GPU, alternating in one
process after warm-up. Reports medians, the paired speed-up, peak memory, and on a GPU the hardware MFU.

    python benchmarks/throughput.py                                   # CPU, fp32, 16 x 128, synthetic batches
    python benchmarks/throughput.py --data /path/to/prepared          # batches from `tinyelectra prepare` output
    python benchmarks/throughput.py --device cuda --precision bf16 --batch 128 --compile on
      -> benchmarks/results/throughput_<device>_<precision>[_compile].json  (or --name)

tinyelectra's side is the body of `tinyelectra.train.train`'s loop, built from the trainer's own parts: the next
batch from a `BatchLoader` (or the next synthetic batch), per-step seeds, `mask_batch`, the global counts, the
learning rate, `Engine.forward` (PretrainStep, compiled when asked) under autocast, the scaled backward of
`electra.combine`, and `Engine.update` (unscale, clip 1.0, paper Adam, zero grads), with `runtime.tune_cpu()` on the
CPU as the trainer does. The baseline (benchmarks/common.py, `HFStep`) draws its batches from an identical loader,
uses the same masking function, autocast and precision, torch AdamW, and `torch.compile` on both models when
--compile on. Peak memory: CUDA, torch.cuda.max_memory_allocated over one step of each side; CPU, the peak
resident set of a fresh process that builds one side and runs 3 steps (so the two do not share an allocator).

Hardware MFU (GPU only) uses tinyelectra.flops' hardware convention (matmul FLOPs the model needs; generator head
at the N masked slots only) for both sides: the baseline's extra full-vocabulary work is not credited to it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see step_cpu.py: the CPU is shared with other jobs

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    HFStep,
    PeakMemory,
    StepSetup,
    alternate,
    command_line,
    paired_ratio,
    run_main,
    summarize,
    synchronize,
    synthetic_batches,
    write_result,
)

from tinyelectra import flops, runtime  # noqa: E402
from tinyelectra.config import load_recipe  # noqa: E402
from tinyelectra.electra import SpecialIds, mask_batch  # noqa: E402
from tinyelectra.errors import UserError  # noqa: E402

TARGETS = {"cpu": {"speedup": 2.0}, "cuda": {"speedup": 4.0, "tokens_per_s_small_b128": 1.5e6, "peak_memory_gb_small_b128": 1.5}}


class Batches:
    """The next (input_ids, token_type_ids, attention_mask) on the device: from a prepared data directory through
    tinyelectra's BatchLoader (shuffled, prefetched, pinned), or cycling through synthetic batches."""

    def __init__(self, data_dir: str | None, vocab_size: int, batch: int, seq_len: int, device: torch.device, seed: int = 0):
        self.loader = None
        if data_dir:
            from tinyelectra.data import BatchLoader, PretrainData  # noqa: PLC0415

            data = PretrainData(data_dir)
            if data.seq_len != seq_len or data.vocab_size != vocab_size:
                raise UserError(f"{data_dir}: rows of {data.seq_len} tokens over a {data.vocab_size} vocabulary; the "
                                f"benchmark needs {seq_len} and {vocab_size} (use --seq-len / --recipe to match)")
            self.special = SpecialIds.from_tokenizer(data.tokenizer)
            self.loader = BatchLoader(data, "train", batch, seed, device=device)
            self.source = f"prepared data {data_dir} (BatchLoader, prefetch 2)"
        else:
            self.special = SpecialIds(pad=0, cls=101, sep=102, mask=103)
            self.synthetic = synthetic_batches(vocab_size, batch, seq_len, count=8, seed=seed, device=device)
            self.i = 0
            self.source = "synthetic batches (8 distinct, cycled; BERT special ids)"

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.loader is not None:
            b = next(self.loader)
            return b.input_ids, b.token_type_ids, b.attention_mask
        self.i += 1
        return self.synthetic[(self.i - 1) % len(self.synthetic)]


class TrainerStep:
    """One optimizer step exactly as `tinyelectra.train.train`'s loop runs it (one process, no accumulation)."""

    name = "tinyelectra"

    def __init__(self, recipe, device: torch.device, precision: str, batches: Batches) -> None:
        from tinyelectra.model import Electra  # noqa: PLC0415
        from tinyelectra.optim import build_optimizer, lr_at  # noqa: PLC0415
        from tinyelectra.train import Dist, Engine  # noqa: PLC0415

        self.recipe, self.device, self.batches = recipe, device, batches
        torch.manual_seed(recipe.train.seed)
        self.model = Electra(recipe.model, recipe.objective.kind).to(device).train()
        self.optimizer = build_optimizer(self.model, recipe.optim, device.type)
        scaler = torch.amp.GradScaler(device.type, enabled=(precision == "fp16"))
        B = recipe.train.batch_size
        self.engine = Engine(self.model, recipe, self.optimizer, scaler, Dist(), device, precision, micro=B, accum=1)
        self.compile_note = self.engine.note
        self.autocast = runtime.autocast_context(precision, device)
        self.lr = lambda step: lr_at(step, recipe.optim.lr, recipe.optim.warmup_steps, recipe.train.steps)
        self.sums = {k: torch.zeros((), device=device) for k in ("mlm_sum", "disc_sum")}
        self.step = 1  # past step 0, whose learning rate is 0

    def __call__(self) -> None:
        from tinyelectra.electra import LossTerms, combine  # noqa: PLC0415
        from tinyelectra.train import step_seed  # noqa: PLC0415

        r, seed = self.recipe, self.recipe.train.seed
        ids, types, mask = self.batches()
        torch.manual_seed(step_seed(seed, self.step, 0, 0))
        m = mask_batch(ids, types, mask, r.objective, self.batches.special, r.model.vocab_size)
        counts = torch.stack([m.mlm_count, m.token_count.float()])
        self.optimizer.set_lr(self.lr(self.step))
        torch.manual_seed(step_seed(seed, self.step, 0, 1))
        with self.engine.accumulating(last=True):
            with self.autocast:
                mlm_sum, disc_sum, stats = self.engine.forward(m)
            self.engine.backward(combine(LossTerms(mlm_sum, disc_sum, stats), r.objective, counts[0], counts[1]))
        self.sums["mlm_sum"] += mlm_sum.detach()
        self.sums["disc_sum"] += disc_sum.detach()
        self.engine.update()
        self.step += 1


class BaselineStep:
    """transformers' step (common.HFStep) fed by its own identical loader."""

    name = "transformers"

    def __init__(self, recipe, device: torch.device, precision: str, batches: Batches, compile_mode: str) -> None:
        setup = StepSetup(recipe.model, recipe.objective, recipe.optim, device, precision, special=batches.special)
        self.hf = HFStep(setup, compile_mode="off")
        self.compile_note = "off"
        if compile_mode == "on":  # the usual way: compile each model
            self.hf.gen, note = runtime.maybe_compile(self.hf.gen, "on", device)
            self.hf.disc, _ = runtime.maybe_compile(self.hf.disc, "on", device)
            self.compile_note = note + " (ElectraForMaskedLM and ElectraForPreTraining each)"
        self.batches = batches

    def __call__(self) -> None:
        self.hf(*self.batches())


def build(side: str, args, recipe, device: torch.device, precision: str):
    batches = Batches(args.data, recipe.model.vocab_size, args.batch, args.seq_len, device)
    if side == "tinyelectra":
        return TrainerStep(recipe, device, precision, batches)
    return BaselineStep(recipe, device, precision, batches, args.compile)


def memory_probe(args, recipe, device: torch.device, precision: str) -> dict:
    """(Child process) peak RSS of building one side and running 3 steps."""
    from common import _rss_now_bytes, _rss_peak_bytes  # noqa: PLC0415

    rss_start = _rss_now_bytes()
    step = build(args.memory_probe, args, recipe, device, precision)
    rss_built = _rss_now_bytes()
    for _ in range(3):
        step()
    return {"peak_rss_bytes": _rss_peak_bytes(), "rss_after_import_bytes": rss_start, "rss_after_build_bytes": rss_built}


def cpu_memory(argv: list[str], side: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv, "--memory-probe", side], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="electra-small")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if there is one)")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    ap.add_argument("--compile", default="off", choices=("off", "on"), help="torch.compile both sides")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default: 16 on CPU, 128 on GPU)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--data", default=None, help="a directory written by `tinyelectra prepare` (default: synthetic)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    ap.add_argument("--name", default=None, help="result file name (default throughput_<device>_<precision>[_compile])")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--memory-probe", default=None, choices=("tinyelectra", "transformers"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = runtime.pick_device(None, args.device)
    precision, precision_reason = runtime.pick_precision(args.precision, device)
    matmul_note = runtime.configure_matmul(precision, device)
    allocator_note = runtime.tune_cpu() if device.type == "cpu" else "n/a (CUDA caching allocator)"
    batch = args.batch or (128 if device.type == "cuda" else 16)
    args.batch = batch
    recipe = load_recipe(args.recipe, [f"train.batch_size={batch}", f"train.seq_len={args.seq_len}",
                                       f"train.compile={args.compile}", f"train.precision={precision}"])
    if args.memory_probe:
        print(json.dumps(memory_probe(args, recipe, device, precision)))
        return None

    ours = build("tinyelectra", args, recipe, device, precision)
    theirs = build("transformers", args, recipe, device, precision)
    first_call_s = {}
    for step in (ours, theirs):  # the first call compiles (if asked) and warms the allocator
        t0 = time.perf_counter()
        step()
        synchronize(device)
        first_call_s[step.name] = time.perf_counter() - t0

    def show(r: int, d: dict[str, float]) -> None:
        print(f"round {r:3d}  " + "  ".join(f"{k} {v * 1000:8.1f} ms" for k, v in d.items()), flush=True)

    load_before = os.getloadavg()[0]
    times = alternate({"tinyelectra": ours, "transformers": theirs}, warmup=args.warmup, repeats=args.rounds,
                      device=device, on_round=show)
    tokens_per_step = batch * args.seq_len
    hw_flops_per_token = flops.hardware_train_flops_per_step(recipe.model, recipe.objective, batch, args.seq_len) / tokens_per_step
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak_precision = precision if precision != "fp32" else ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    res: dict = {}
    for step in (ours, theirs):
        s = summarize(times[step.name])
        tps = tokens_per_step / s["median_s"]
        res[step.name] = {**s, "tokens_per_s": tps, "compile_note": step.compile_note,
                          "first_call_s": first_call_s[step.name],
                          "step_seconds": [round(x, 5) for x in times[step.name]]}
        if device_name:
            res[step.name]["hardware_mfu"] = flops.mfu(tps, hw_flops_per_token, device_name, peak_precision)
    if not args.no_memory:
        if device.type == "cuda":
            for step in (ours, theirs):
                with PeakMemory(device) as pm:
                    step()
                res[step.name]["peak_memory_bytes"] = pm.peak_bytes
            res["peak_memory_kind"] = "torch.cuda.max_memory_allocated over one step (weights, optimizer state, activations)"
        else:
            for name in ("tinyelectra", "transformers"):
                res[name]["memory"] = cpu_memory(argv, name)
            res["peak_memory_kind"] = "peak RSS (VmHWM) of a fresh process that builds one side and runs 3 steps"
    res["speedup"] = paired_ratio(times["transformers"], times["tinyelectra"])
    speedup = res["speedup"]["median_of_round_ratios"]
    name = args.name or f"throughput_{device.type}_{precision}{'_compile' if args.compile == 'on' else ''}"
    payload = {
        "recipe": args.recipe, "device": device_name or "cpu", "precision": precision, "precision_reason": precision_reason,
        "matmul": matmul_note, "allocator": allocator_note, "compile": args.compile, "data": ours.batches.source,
        "batch_size": batch, "seq_len": args.seq_len, "tokens_per_step": tokens_per_step, "rounds": args.rounds,
        "warmup_rounds": args.warmup, "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "hardware_flops_per_token": hw_flops_per_token, "mfu_peak_precision": peak_precision if device_name else None,
        "targets": TARGETS[device.type], "meets_speedup_target": speedup >= TARGETS[device.type]["speedup"], **res,
    }
    path = write_result(name, payload, device, out_dir=args.out_dir, command=command_line("benchmarks/throughput.py", argv))
    te, hf = res["tinyelectra"], res["transformers"]
    mfu = f", MFU {te['hardware_mfu']:.1%}" if te.get("hardware_mfu") else ""
    print(f"{device_name or 'cpu'} {precision}: tinyelectra {te['tokens_per_s']:,.0f} tok/s{mfu}, transformers "
          f"{hf['tokens_per_s']:,.0f} tok/s: {speedup:.2f}x -> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
