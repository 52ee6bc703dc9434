"""Issue 6, item 2: peak memory of ELECTRA Small / Base / Large training steps under each memory lever, and which
consumer cards (8, 12, 16, 24 GiB) each configuration fits.

    python benchmarks/memory.py [--device cpu|cuda] [--sizes small,base,large]  -> benchmarks/results/memory_<device>.json

What is measured, per size, precision (fp32, bf16; fp16 too on CUDA) and gradient checkpointing (off, on): the
peak tensor memory of one full training step (masking, generator, sampling, discriminator, backward, clip, paper
Adam with its state already allocated) at two micro-batch sizes, at the recipe's sequence length.
- CUDA: torch.cuda.max_memory_allocated.
- CPU: the peak of the bytes held by live tensor storages (`TensorMemory`: every storage an op creates, counted
  until it is freed, plus the weights and optimizer state), i.e. what a GPU's allocator would have to hold. The
  attention runs through F.scaled_dot_product_attention's fused kernel (attention dropout off during the
  measurement), whose memory is that of the GPU's flash / memory-efficient kernels (no T x T matrices kept).
  Hidden-dropout masks are kept as fp32 on the CPU but as 1-byte masks on a GPU, so CPU numbers are slightly
  high for a GPU: upper bounds.
Derived (estimates, labelled so in the JSON): activation memory is linear in the micro-batch (a straight line
through the two measurements); 8-bit AdamW (bitsandbytes) keeps 2 bytes of state per parameter instead of 8
(measured instead when bitsandbytes runs on the CUDA device); a card fits a configuration when its peak plus a
reserve for the CUDA context and allocator fragmentation (--reserve-gib, 0.8 by default) is within the card; the
largest micro-batch that fits follows from the line, and the recipe's batch is then reached with gradient
accumulation.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import weakref
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see step_cpu.py: the CPU is shared with other jobs

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, synthetic_batches, write_result  # noqa: E402

from tinyelectra import runtime  # noqa: E402
from tinyelectra.config import ModelConfig, ObjectiveConfig, OptimConfig, load_recipe  # noqa: E402
from tinyelectra.electra import SpecialIds, combine, loss_terms, mask_batch  # noqa: E402
from tinyelectra.model import Electra, count_parameters  # noqa: E402
from tinyelectra.optim import build_optimizer  # noqa: E402

GIB = 2**30
CARDS_GIB = (8, 12, 16, 24)

# The paper's three sizes (REFERENCE §1): model, objective, sequence length, global batch.
SIZES = {
    "small": (load_recipe("electra-small").model, ObjectiveConfig(), 128, 128),
    "base": (ModelConfig(embedding_size=768, hidden_size=768, num_layers=12, num_heads=12, ffn_size=3072,
                         generator_fraction=1 / 3), ObjectiveConfig(), 512, 256),
    "large": (ModelConfig(embedding_size=1024, hidden_size=1024, num_layers=24, num_heads=16, ffn_size=4096,
                          generator_fraction=0.25), ObjectiveConfig(mask_prob=0.25), 512, 2048),
    # not a paper size: for quick checks and tests
    "tiny": (load_recipe("tiny").model, ObjectiveConfig(), 128, 32),
}
# Micro-batches measured (the line through them is extrapolated): large enough that activations, not the weight
# gradients accumulated at the end of the backward pass, decide the forward+backward peak.
MICRO_BATCHES = {"cpu": {"small": (8, 16), "base": (2, 4), "large": (2, 4), "tiny": (4, 8)},
                 "cuda": {"small": (32, 64), "base": (8, 16), "large": (4, 8), "tiny": (4, 8)}}


class TensorMemory(TorchDispatchMode):
    """Bytes held by live tensor storages: the `baseline` tensors plus every storage an op creates inside the
    block, each counted until it is freed. `peak_bytes` is the most held at once (a device allocator's
    max_memory_allocated, without its rounding). Storages made outside torch ops (torch.from_numpy) and kernels'
    internal scratch buffers are not seen."""

    def __init__(self, baseline: list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current_bytes = 0
        self.peak_bytes = 0
        for t in baseline:
            self._track(t)
        self.baseline_bytes = self.current_bytes

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in self.live:
            return
        self.live[key] = nbytes
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        weakref.finalize(storage, self._release, key, nbytes)

    def _release(self, key: int, nbytes: int) -> None:
        if self.live.get(key) == nbytes:
            del self.live[key]
            self.current_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t)
        return out


def _state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = list(model.parameters()) + list(model.buffers())
    for state in optimizer.state.values():
        out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def measure(cfg: ModelConfig, objective: ObjectiveConfig, micro: int, seq_len: int, precision: str, ckpt: bool,
            device: torch.device, optim_name: str = "adam") -> dict:
    """Peak bytes of one training step in steady state (optimizer state allocated, grads freed)."""
    if device.type == "cpu":  # measure the fused SDPA kernel's memory (what a GPU runs), see the module docstring
        cfg = dataclasses.replace(cfg, attention_dropout=0.0)
    torch.manual_seed(0)
    model = Electra(cfg, objective.kind).to(device).train()
    model.set_grad_checkpointing(ckpt)
    optimizer = build_optimizer(model, OptimConfig(name=optim_name), device.type)
    for p in model.parameters():  # allocate the optimizer state (a step on zero gradients)
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    special = SpecialIds(pad=0, cls=101, sep=102, mask=103)
    ids, types, mask = synthetic_batches(cfg.vocab_size, micro, seq_len, count=1, device=device)[0]
    params = [p for p in model.parameters() if p.requires_grad]
    scaler = torch.amp.GradScaler(device.type, enabled=(precision == "fp16"))

    def forward_backward() -> None:
        m = mask_batch(ids, types, mask, objective, special, cfg.vocab_size)
        with runtime.autocast_context(precision, device):
            terms = loss_terms(model, m, objective)
        scaler.scale(combine(terms, objective, m.mlm_count, m.token_count)).backward()

    def update() -> None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    # Two peaks: forward + backward (grows with the micro-batch) and the update (weights, grads, optimizer state).
    t0 = time.perf_counter()
    if device.type == "cuda":
        forward_backward()  # warm-up: kernels, cuBLAS workspaces
        update()
        torch.cuda.synchronize(device)
        static = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        forward_backward()
        torch.cuda.synchronize(device)
        fb_peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        update()
        torch.cuda.synchronize(device)
        update_peak, kind = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    else:
        tracker = TensorMemory(_state_tensors(model, optimizer))
        with tracker:
            forward_backward()
            fb_peak, tracker.peak_bytes = tracker.peak_bytes, tracker.current_bytes
            update()
        static, update_peak, kind = tracker.baseline_bytes, tracker.peak_bytes, "live tensor storages (TensorMemory)"
    return {"micro_batch": micro, "precision": precision, "grad_checkpointing": ckpt, "optimizer": optim_name,
            "forward_backward_peak_bytes": fb_peak, "update_peak_bytes": update_peak,
            "peak_bytes": max(fb_peak, update_peak), "static_bytes": static, "measured": kind,
            "seconds": round(time.perf_counter() - t0, 2)}


def fit_line(a: dict, b: dict) -> tuple[float, float, float]:
    """(intercept, slope, update peak): forward+backward peak(mb) = intercept + slope * mb through the two
    measurements; the step's peak is max(that, the update's peak), which does not depend on the micro-batch."""
    slope = (b["forward_backward_peak_bytes"] - a["forward_backward_peak_bytes"]) / (b["micro_batch"] - a["micro_batch"])
    return a["forward_backward_peak_bytes"] - slope * a["micro_batch"], slope, max(a["update_peak_bytes"], b["update_peak_bytes"])


def peak_at(fit: tuple[float, float, float], micro: int) -> float:
    intercept, slope, update_peak = fit
    return max(intercept + slope * micro, update_peak)


def card_table(fit: tuple[float, float, float], batch: int, reserve_gib: float) -> dict:
    """For each card: the largest micro-batch that fits and the accumulation steps the recipe's batch then needs."""
    intercept, slope, update_peak = fit
    out = {}
    for gib in CARDS_GIB:
        room = gib * GIB - reserve_gib * GIB
        if update_peak > room:
            max_mb = 0
        else:
            max_mb = batch if slope <= 0 else int((room - intercept) // slope)
        max_mb = max(0, min(max_mb, batch))
        if max_mb >= 1:  # the largest divisor of the batch not above max_mb: equal micro-batches
            max_mb = max(d for d in range(1, max_mb + 1) if batch % d == 0)
        out[f"{gib}GiB"] = {"fits": max_mb >= 1, "max_micro_batch": max_mb,
                            "accumulation_steps": batch // max_mb if max_mb else None}
    return out


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="small,base,large")
    ap.add_argument("--micro-batches", default=None, help="two sizes, e.g. 2,4 (default: MICRO_BATCHES per size)")
    ap.add_argument("--precisions", default=None, help="default: fp32,bf16 (CPU); fp32,bf16,fp16 (CUDA)")
    ap.add_argument("--reserve-gib", type=float, default=0.8, help="CUDA context + fragmentation kept free on a card")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--name", default=None)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = runtime.pick_device(None, args.device)
    precisions = (args.precisions or ("fp32,bf16,fp16" if device.type == "cuda" else "fp32,bf16")).split(",")
    if device.type == "cuda" and "bf16" in precisions and not torch.cuda.is_bf16_supported():
        precisions.remove("bf16")
    if device.type == "cpu":
        runtime.tune_cpu()
    bnb_ok = False
    if device.type == "cuda":
        try:
            import bitsandbytes  # noqa: F401, PLC0415

            bnb_ok = True
        except ImportError:
            pass

    sizes = {}
    for size in args.sizes.split(","):
        cfg, objective, seq_len, batch = SIZES[size]
        n_params = count_parameters(Electra(cfg, objective.kind))
        mbs = [int(x) for x in args.micro_batches.split(",")] if args.micro_batches else list(MICRO_BATCHES[device.type][size])
        rows = []
        for precision in precisions:
            for ckpt in (False, True):
                pair = [measure(cfg, objective, mb, seq_len, precision, ckpt, device) for mb in mbs]
                fit = fit_line(*pair)
                row = {"precision": precision, "grad_checkpointing": ckpt, "measurements": pair,
                       "fit": {"forward_backward_intercept_bytes": fit[0], "activation_bytes_per_sequence": fit[1],
                               "update_peak_bytes": fit[2]}}
                optimizers = {"adam (paper, fp32 state)": (fit, "measured" if device.type == "cuda" else "measured on CPU (upper bound)")}
                if bnb_ok:
                    q = [measure(cfg, objective, mb, seq_len, precision, ckpt, device, "adamw8bit") for mb in mbs]
                    optimizers["adamw8bit"] = (fit_line(*q), "measured")
                else:
                    saved = 6 * n_params  # state alive through both phases
                    optimizers["adamw8bit"] = ((fit[0] - saved, fit[1], fit[2] - saved),
                                               "estimate: 2 instead of 8 bytes of optimizer state per parameter")
                row["cards"] = {name: {"basis": basis, "peak_at_recipe_batch_gib": peak_at(f, batch) / GIB,
                                       **card_table(f, batch, args.reserve_gib)}
                                for name, (f, basis) in optimizers.items()}
                rows.append(row)
                print(f"{size:5s} {precision:4s} ckpt={'on ' if ckpt else 'off'} peak(mb={mbs[0]}) "
                      f"{pair[0]['peak_bytes'] / GIB:6.3f} GiB, +{fit[1] / 2**20:8.1f} MiB per sequence; "
                      + " ".join(f"{k}:{v['max_micro_batch']}" for k, v in row["cards"]["adam (paper, fp32 state)"].items()
                                 if k.endswith("GiB")), flush=True)
        sizes[size] = {"parameters": n_params, "seq_len": seq_len, "recipe_batch": batch, "micro_batches_measured": mbs,
                       "configurations": rows}

    payload = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "what": ("peak of torch.cuda.max_memory_allocated over one steady-state training step" if device.type == "cuda"
                        else "peak bytes of live tensor storages over one steady-state training step, measured on the "
                             "CPU with the fused SDPA attention kernel: upper bounds for a GPU (fp32 dropout masks)"),
               "reserve_gib": args.reserve_gib, "sizes": sizes,
               "estimates": ["peak at other micro-batch sizes: straight line through the two measurements",
                             "adamw8bit rows unless bitsandbytes ran on this CUDA device",
                             f"card fit: peak + {args.reserve_gib} GiB reserve <= card"]}
    name = args.name or f"memory_{device.type}"
    path = write_result(name, payload, device, out_dir=args.out_dir, command=command_line("benchmarks/memory.py", argv))
    print(f"-> {path}")
    return payload


if __name__ == "__main__":
    main()
