"""Issue 10: which attention kernels can run ELECTRA's attention, and what each costs. At the discriminator's and
the generator's shapes (batch x heads x T x head size; Small: 128 x 4 x 128 x 64 and 128 x 1 x 128 x 64), forward +
backward of F.scaled_dot_product_attention with the model's boolean padding mask (B, 1, 1, T) and attention dropout,
under each SDPA backend alone (memory-efficient, cuDNN, math; flash and efficient on the CPU as they exist there),
plus FlashAttention *without* the mask — what flash would cost if the batch had no padding or were unpadded (it
takes no mask at all): the reference for whether packing / unpadding is worth it. A backend that cannot run these
inputs is recorded with torch's reason. `default` is what SDPA picks by itself (torch's dispatcher).

    python benchmarks/attention.py --device cuda --recipe electra-small --batch 128 --precision bf16
      -> benchmarks/results/attention_<device>_<precision>.json  (or --name)

Timing: --iters calls back to back, one device synchronisation at the end, median of --rounds rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_step_arguments, command_line, run_main, step_setup, synchronize, write_result  # noqa: E402

from tinyelectra import runtime  # noqa: E402
from tinyelectra.config import load_recipe  # noqa: E402


def time_case(q, k, v, mask, p: float, backend, device: torch.device, iters: int, rounds: int) -> dict:
    from torch.nn.attention import sdpa_kernel  # noqa: PLC0415

    grad = torch.randn_like(q)
    ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()

    def call() -> None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        out.backward(grad)

    try:
        with ctx, warnings.catch_warnings(record=True) as caught:  # torch gives its reasons as warnings
            warnings.simplefilter("always")
            call()  # warm-up; raises when the backend cannot run these inputs
            synchronize(device)
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(iters):
                    call()
                synchronize(device)
                times.append((time.perf_counter() - t0) / iters)
    except RuntimeError as e:
        reasons = [" ".join(str(w.message).split())[:300] for w in caught]
        return {"ran": False, "reason": " ".join(str(e).split())[:300], "torch_warnings": reasons[:8]}
    return {"ran": True, "fwd_bwd_ms_median": statistics.median(times) * 1000, "fwd_bwd_ms_min": min(times) * 1000}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(ap)
    ap.add_argument("--iters", type=int, default=None, help="calls per round (default 50 on GPU, 3 on CPU)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    from torch.nn.attention import SDPBackend  # noqa: PLC0415

    device, precision, _, batch = step_setup(args)
    dtype = runtime.autocast_dtype(precision, device)
    iters = args.iters or (50 if device.type == "cuda" else 3)
    cfg = load_recipe(args.recipe).model
    backends = {"memory-efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    if device.type == "cuda":
        backends["cuDNN"] = SDPBackend.CUDNN_ATTENTION
    else:
        backends["flash (CPU kernel)"] = SDPBackend.FLASH_ATTENTION
    results: dict = {}
    g = torch.Generator(device=device).manual_seed(0)
    for role, c in (("discriminator", cfg), ("generator", cfg.generator())):
        hd = c.hidden_size // c.num_heads
        shape = (batch, c.num_heads, args.seq_len, hd)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
        lengths = torch.full((batch,), args.seq_len, device=device)
        lengths[: max(1, batch // 20)] = args.seq_len // 2  # ~5% short rows, as the official builder's
        mask = (torch.arange(args.seq_len, device=device)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
        p = c.attention_dropout
        row: dict = {"shape_b_h_t_d": list(shape), "dropout": p, "mask": "bool (B, 1, 1, T), ~5% rows half padded",
                     "sdpa_choice": runtime.sdpa_kernel(q, k, v, mask, p)}
        row["default"] = time_case(q, k, v, mask, p, None, device, iters, args.rounds)
        for label, b in backends.items():
            row[label] = time_case(q, k, v, mask, p, b, device, iters, args.rounds)
        flash = SDPBackend.FLASH_ATTENTION
        row["flash without mask (reference: no padding / unpadded)"] = time_case(q, k, v, None, p, flash, device, iters, args.rounds)
        results[role] = row
        print(role, {k2: (v2.get("fwd_bwd_ms_median") if isinstance(v2, dict) and "ran" in v2 else None)
                     for k2, v2 in row.items() if isinstance(v2, dict)}, flush=True)
    name = args.name or f"attention_{device.type}_{precision}"
    payload = {"recipe": args.recipe, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "precision": precision, "dtype": str(dtype).replace("torch.", ""), "batch_size": batch,
               "seq_len": args.seq_len, "iters_per_round": iters, "rounds": args.rounds, "results": results}
    path = write_result(name, payload, device, out_dir=args.out_dir, command=command_line("benchmarks/attention.py", argv))
    print(f"-> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
