"""Issue 6, item 2: peak memory of ELECTRA Small / Base / Large training steps under each memory lever, and which
consumer cards (8, 12, 16, 24 GiB) each configuration fits.

    python -m benchmarks.memory [--device cpu|cuda] [--sizes small,base,large]
      -> benchmarks/results/memory_<device>.json

What is measured, per size, precision (fp32, bf16; fp16 too on CUDA) and gradient checkpointing (off, on): every
tensor storage one full training step (masking, generator, sampling, discriminator, backward, clip, paper Adam
with its state already allocated) creates and frees, at two micro-batch sizes, at the recipe's sequence length
(`TensorMemory`, a dispatch mode: the bytes a device allocator must hold, without its rounding; on CUDA the
allocator's max_memory_allocated is recorded beside it). The two steps make the same allocations in the same
order and each tensor's size is affine in the micro-batch, so together they give the step's peak at any
micro-batch (`affine_envelope`); --validate checks the prediction against a third, measured size.
On the CPU the attention runs through F.scaled_dot_product_attention's fused kernel (attention dropout off during
the measurement), whose memory is that of the GPU's flash / memory-efficient kernels (no T x T matrices kept).
Hidden-dropout masks are fp32 on the CPU but 1-byte masks on a GPU, so CPU numbers are slightly high for a GPU:
upper bounds.
Estimates (labelled so in the JSON): 8-bit AdamW (bitsandbytes) keeps 2 bytes of state per parameter instead of
8 (measured instead when bitsandbytes runs on the CUDA device); a card fits a configuration when its peak plus a
reserve for the CUDA context and allocator fragmentation (--reserve-gib, 0.8 by default) is within the card; the
recipe's batch is reached with gradient accumulation over the largest micro-batch that fits.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import weakref

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see step_cpu.py: the CPU is shared with other jobs

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks.common import command_line, synthetic_batches, write_result

from tinyelectra import runtime
from tinyelectra.config import ModelConfig, ObjectiveConfig, OptimConfig, load_recipe
from tinyelectra.electra import SpecialIds, combine, loss_terms, mask_batch
from tinyelectra.model import Electra, count_parameters
from tinyelectra.optim import build_optimizer
from tinyelectra.optim import apply_update

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
# Micro-batches measured. Two give every tensor's size as an affine function of the micro-batch (see
# `affine_envelope`); a third (--validate) checks the prediction.
MICRO_BATCHES = {"cpu": {"small": (2, 4), "base": (1, 2), "large": (1, 2), "tiny": (2, 4)},
                 "cuda": {"small": (8, 16), "base": (4, 8), "large": (2, 4), "tiny": (2, 4)}}


class TensorMemory(TorchDispatchMode):
    """Bytes held by live tensor storages: the `baseline` tensors plus every storage an op creates inside the
    block, each counted until it is freed. `peak_bytes` is the most held at once (a device allocator's
    max_memory_allocated, without its rounding); `events` is the timeline: ("+", i, nbytes) when allocation i is
    made, ("-", i, 0) when it is freed. Storages made outside torch ops (torch.from_numpy) and kernels' internal
    scratch buffers are not seen."""

    def __init__(self, baseline: list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live: dict[int, tuple[int, int]] = {}  # data_ptr -> (nbytes, allocation index)
        self.events: list[tuple[str, int, int]] = []
        self.allocations = 0
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
        index, self.allocations = self.allocations, self.allocations + 1
        self.live[key] = (nbytes, index)
        self.events.append(("+", index, nbytes))
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        weakref.finalize(storage, self._release, key, index)

    def _release(self, key: int, index: int) -> None:
        entry = self.live.get(key)
        if entry is not None and entry[1] == index:
            del self.live[key]
            self.events.append(("-", index, 0))
            self.current_bytes -= entry[0]

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


_WARMED = False


def measure(cfg: ModelConfig, objective: ObjectiveConfig, micro: int, seq_len: int, precision: str, ckpt: bool,
            device: torch.device, optim_name: str = "adam") -> dict:
    """One training step in steady state (optimizer state allocated, grads freed), tracked by TensorMemory; on
    CUDA also torch.cuda.max_memory_allocated of the same step."""
    global _WARMED
    if not _WARMED:  # one-time lazy work (runtime.linear's self-check, ...) must not appear in a tracked step
        _WARMED = True
        measure(SIZES["tiny"][0], ObjectiveConfig(), 1, 16, precision, ckpt, device, optim_name)
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

    def step() -> None:
        m = mask_batch(ids, types, mask, objective, special, cfg.vocab_size)
        with runtime.autocast_context(precision, device):
            terms = loss_terms(model, m, objective)
        scaler.scale(combine(terms, objective, m.mlm_count, m.token_count)).backward()
        apply_update(params, optimizer, scaler, 1.0)  # the trainer's update: unscale, clip, step, zero the grads

    t0 = time.perf_counter()
    out: dict = {}
    if device.type == "cuda":
        step()  # warm-up: kernels, cuBLAS workspaces
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        out["cuda_max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    tracker = TensorMemory(_state_tensors(model, optimizer))
    with tracker:
        step()
    return {"micro_batch": micro, "precision": precision, "grad_checkpointing": ckpt, "optimizer": optim_name,
            "peak_bytes": tracker.peak_bytes, "static_bytes": tracker.baseline_bytes, **out,
            "seconds": round(time.perf_counter() - t0, 2), "events": tracker.events}


def affine_envelope(a: dict, b: dict) -> list[tuple[float, float]]:
    """Live bytes after every allocation of the step as C + D * micro_batch, from two measurements of the same
    step at two micro-batch sizes: the steps make the same allocations in the same order (static shapes), and
    each tensor's size is affine in the micro-batch (activations grow with it, weights, gradients and optimizer
    state do not), so two sizes determine every tensor at any size. The peak at micro-batch m is
    max(C + D * m) over the returned points."""
    ea, eb, ma, mb = _canonical(a["events"]), _canonical(b["events"]), a["micro_batch"], b["micro_batch"]
    if [e[:2] for e in ea] != [e[:2] for e in eb]:
        raise RuntimeError("the two steps allocated differently; cannot extrapolate")
    size: dict[int, tuple[float, float]] = {}
    C = D = 0.0
    points = []
    for (kind, i, na), (_, _, nb) in zip(ea, eb):
        if kind == "+":
            d = (nb - na) / (mb - ma)
            size[i] = (na - d * ma, d)
            C, D = C + size[i][0], D + d
            points.append((C, D))
        else:
            c, d = size.pop(i)
            C, D = C - c, D - d
    return points


def _canonical(events: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Frees between two allocations sorted by allocation index: their order cannot change a peak, and some come
    in hash order (autocast's weight-cast cache is cleared all at once)."""
    out: list[tuple[str, int, int]] = []
    frees: list[tuple[str, int, int]] = []
    for e in events:
        if e[0] == "-":
            frees.append(e)
            continue
        out += sorted(frees, key=lambda f: f[1])
        frees = []
        out.append(e)
    return out + sorted(frees, key=lambda f: f[1])


def peak_at(points: list[tuple[float, float]], micro: int) -> float:
    return max(c + d * micro for c, d in points)


def card_table(points: list[tuple[float, float]], batch: int, reserve_gib: float) -> dict:
    """For each card: the largest micro-batch dividing the recipe's batch whose peak + reserve fits, and the
    gradient-accumulation steps the recipe's batch then needs."""
    divisors = [d for d in range(1, batch + 1) if batch % d == 0]
    peaks = {d: peak_at(points, d) for d in divisors}
    out = {}
    for gib in CARDS_GIB:
        fitting = [d for d in divisors if peaks[d] + reserve_gib * GIB <= gib * GIB]
        max_mb = max(fitting) if fitting else 0
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
    ap.add_argument("--validate", default="small,tiny",
                    help="sizes whose prediction is checked against a third, measured micro-batch (2x the second)")
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
        mbs = ([int(x) for x in args.micro_batches.split(",")] if args.micro_batches
               else list(MICRO_BATCHES[device.type][size]))
        rows = []
        for precision in precisions:
            for ckpt in (False, True):
                pair = [measure(cfg, objective, mb, seq_len, precision, ckpt, device) for mb in mbs]
                points = affine_envelope(*pair)
                row = {"precision": precision, "grad_checkpointing": ckpt,
                       "measurements": [{k: v for k, v in m.items() if k != "events"} for m in pair]}
                if size in args.validate.split(","):  # predict a third micro-batch from the first two, then measure it
                    check = measure(cfg, objective, 2 * mbs[1], seq_len, precision, ckpt, device)
                    predicted = peak_at(points, check["micro_batch"])
                    row["validation"] = {"micro_batch": check["micro_batch"], "predicted_peak_bytes": predicted,
                                         "measured_peak_bytes": check["peak_bytes"],
                                         "relative_error": predicted / check["peak_bytes"] - 1}
                basis = "measured" if device.type == "cuda" else "measured on the CPU (upper bound for a GPU)"
                optimizers = {"adam (paper, fp32 state)": (points, basis)}
                if bnb_ok:
                    q = [measure(cfg, objective, mb, seq_len, precision, ckpt, device, "adamw8bit") for mb in mbs]
                    optimizers["adamw8bit"] = (affine_envelope(*q), "measured")
                else:
                    saved = 6 * n_params  # the state is alive for the whole step
                    optimizers["adamw8bit"] = ([(c - saved, d) for c, d in points],
                                               "estimate: 2 instead of 8 bytes of optimizer state per parameter")
                row["cards"] = {name: {"basis": b, "peak_at_recipe_batch_gib": peak_at(p, batch) / GIB,
                                       "peak_at_micro_batch_1_gib": peak_at(p, 1) / GIB,
                                       **card_table(p, batch, args.reserve_gib)}
                                for name, (p, b) in optimizers.items()}
                rows.append(row)
                cards = row["cards"]["adam (paper, fp32 state)"]
                val = (f" (predicted vs measured at {row['validation']['micro_batch']}: "
                       f"{row['validation']['relative_error']:+.2%})"
                       if "validation" in row else "")
                print(f"{size:5s} {precision:4s} ckpt={'on ' if ckpt else 'off'} peak at batch {batch}: "
                      f"{cards['peak_at_recipe_batch_gib']:7.2f} GiB{val}; max micro-batch per card: "
                      + " ".join(f"{k}:{v['max_micro_batch']}" for k, v in cards.items() if k.endswith("GiB")),
                      flush=True)
        sizes[size] = {"parameters": n_params, "seq_len": seq_len, "recipe_batch": batch, "micro_batches_measured": mbs,
                       "configurations": rows}

    payload = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "what": ("peak bytes of live tensor storages over one steady-state training step (TensorMemory; the "
                        "CUDA allocator's own max_memory_allocated is recorded beside each measurement)"
                        if device.type == "cuda"
                        else "peak bytes of live tensor storages over one steady-state training step, measured on the "
                             "CPU with the fused SDPA attention kernel: upper bounds for a GPU (fp32 dropout masks)"),
               "reserve_gib": args.reserve_gib, "sizes": sizes,
               "estimates": ["peaks at micro-batches not measured: every tensor's size is affine in the micro-batch, "
                             "so two measured sizes give the whole step at any size (affine_envelope); --validate "
                             "checks a third size",
                             "adamw8bit rows unless bitsandbytes ran on this CUDA device",
                             f"card fit: peak + {args.reserve_gib} GiB reserve <= card"]}
    name = args.name or f"memory_{device.type}"
    path = write_result(name, payload, device, out_dir=args.out_dir, command=command_line("benchmarks.memory", argv))
    print(f"-> {path}")
    return payload


if __name__ == "__main__":
    main()
