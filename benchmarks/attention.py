"""Issue 10: which attention kernels can run ELECTRA's attention, and what each costs. At the discriminator's and
the generator's shapes (batch x heads x T x head size; Small: 128 x 4 x 128 x 64 and 128 x 1 x 128 x 64), forward +
backward of F.scaled_dot_product_attention with the model's boolean padding mask (B, 1, 1, T) and attention dropout,
under each SDPA backend alone (memory-efficient, cuDNN, math; flash and efficient on the CPU as they exist there),
plus FlashAttention *without* the mask — what flash would cost if the batch had no padding or were unpadded (it
takes no mask at all): the reference for whether packing / unpadding is worth it. A backend that cannot run these
inputs is recorded with torch's reason. `default` is what SDPA picks by itself (torch's dispatcher). `varlen` is
train.attention=varlen (issue 33): the padded rows by their lengths, FlashAttention's variable-length kernel on CUDA
(on the CPU its reference, the rows' sequences as a mask).

    python -m benchmarks.attention --device cuda --recipe electra-small --batch 128 --precision bf16
      -> benchmarks/results/attention_<device>_<precision>.json  (or --name)

Timing: --iters calls back to back, one device synchronisation at the end, median of --rounds rounds.

`gradient_safety` (the GPU suite's checks stage) asks a different question of the same backends: are the output and
the gradients finite, and close to an fp32 math reference, at GLUE-like lengths with a padding mask? torch 2.11's
cuDNN attention backward returns NaN on Hopper for masked inputs whose length mod 128 is 64
(pytorch/pytorch#196678); fine-tuning's dynamic padding meets such lengths.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.nn.functional as F

from benchmarks.common import add_step_arguments, command_line, run_main, step_setup, synchronize, write_result

from tinyelectra import runtime
from tinyelectra.config import load_recipe


def time_case(q, k, v, mask, p: float, backend, device: torch.device, iters: int, rounds: int) -> dict:
    from torch.nn.attention import sdpa_kernel  # noqa: PLC0415

    grad = torch.randn_like(q)
    ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()

    def call() -> None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        out.backward(grad)

    return time_call(call, ctx, device, iters, rounds)


def time_varlen(q, k, v, mask, p: float, device: torch.device, iters: int, rounds: int) -> dict:
    """train.attention=varlen: the same rows as one packed sequence (B*T, heads, head size) through
    model.varlen_attention with the mask's rows' lengths (model.row_segments), forward + backward."""
    from tinyelectra.model import row_segments, varlen_attention  # noqa: PLC0415

    B, nh, T, hd = q.shape
    packed = [t.detach().transpose(1, 2).reshape(B * T, nh, hd).requires_grad_() for t in (q, k, v)]
    grad = torch.randn_like(packed[0])
    cu_seqlens = row_segments(mask.view(B, T))

    def call() -> None:
        varlen_attention(*packed, cu_seqlens, T, p).backward(grad)

    return time_call(call, contextlib.nullcontext(), device, iters, rounds)


def time_call(call, ctx, device: torch.device, iters: int, rounds: int) -> dict:
    """Median and least seconds per `call()` (forward + backward) over `rounds` rounds of `iters` calls, under `ctx`;
    or why it cannot run these inputs."""
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


def sdpa_backends(device: torch.device) -> dict:
    """Each SDPA backend that may exist on `device`, by name (one that cannot run an input says so when asked)."""
    from torch.nn.attention import SDPBackend  # noqa: PLC0415

    if device.type == "cuda":
        return {"flash": SDPBackend.FLASH_ATTENTION, "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cuDNN": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    return {"flash (CPU kernel)": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}


def padding_mask(batch: int, seq_len: int, device: torch.device, padded_every: int, padded_len: int) -> torch.Tensor:
    """A boolean (B, 1, 1, T) mask, True = attend: every `padded_every`-th row (the first included) keeps only its
    first `padded_len` tokens."""
    lengths = torch.full((batch,), seq_len, device=device)
    lengths[::padded_every] = padded_len
    return (torch.arange(seq_len, device=device)[None, :] < lengths[:, None])[:, None, None, :]


def _forward_backward(qkvg: list[torch.Tensor], mask: torch.Tensor, ctx, dtype: torch.dtype) -> list[torch.Tensor]:
    """SDPA's output and the gradients of q, k, v (for the upstream gradient qkvg[3]) in `dtype`, under `ctx`."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in qkvg[:3]]
    with ctx:
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
        out.backward(qkvg[3].to(dtype))
    return [out.detach().float()] + [t.grad.float() for t in leaves]


SAFE_REL_ERROR = 0.05  # bf16 operands land at 1e-3 to 1e-2 against an fp32 reference; NaN or 5% is a broken kernel


def gradient_safety(device: torch.device, dtypes: list[torch.dtype], lengths: list[int], batch: int = 8,
                    heads: int = 4, head_dim: int = 64) -> dict:
    """Forward + backward of SDPA without dropout under each backend alone and under the dispatcher's own choice,
    with a padding mask (a quarter of the rows half padded), at each dtype and length: "ok" when the output and the
    three gradients are finite and within SAFE_REL_ERROR (relative norm) of the math backend's in fp32 on the same
    inputs; else "NaN/inf" or "differs (relative error)"; a backend that cannot run the input: "not available".
    Returns {"cases": {backend: {"<dtype> T=<length>": verdict}}, "safe": [backends ok wherever they ran]}."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    backends: dict = {"default (dispatcher)": None, **sdpa_backends(device)}
    g = torch.Generator(device=device).manual_seed(0)
    cases: dict = {name: {} for name in backends}
    for dtype in dtypes:
        for T in lengths:
            qkvg = [torch.randn(batch, heads, T, head_dim, device=device, dtype=dtype, generator=g) for _ in range(4)]
            mask = padding_mask(batch, T, device, padded_every=4, padded_len=max(1, T // 2))
            reference = _forward_backward(qkvg, mask, sdpa_kernel([SDPBackend.MATH]), torch.float32)
            key = f"{str(dtype).replace('torch.', '')} T={T}"
            for name, backend in backends.items():
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # an unavailable backend warns, then raises
                        ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
                        got = _forward_backward(qkvg, mask, ctx, dtype)
                except RuntimeError as e:
                    cases[name][key] = f"not available ({' '.join(str(e).split())[:120]})"
                    continue
                if not all(bool(torch.isfinite(t).all()) for t in got):
                    cases[name][key] = "NaN/inf"
                    continue
                err = max(float((a - b).norm() / b.norm().clamp_min(1e-12)) for a, b in zip(got, reference))
                cases[name][key] = "ok" if err <= SAFE_REL_ERROR else f"differs (relative error {err:.3g})"
    ran = {n: [v for v in c.values() if not v.startswith("not available")] for n, c in cases.items()}
    return {"cases": cases, "safe": [n for n, vs in ran.items() if vs and all(v == "ok" for v in vs)],
            "unsafe": [n for n, vs in ran.items() if any(v != "ok" for v in vs)],
            "inputs": f"batch {batch}, {heads} heads of {head_dim}, bool mask (B, 1, 1, T) with every 4th row half "
                      "padded, no dropout; reference: the math backend in fp32"}


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
    backends = {n: b for n, b in sdpa_backends(device).items() if n != "flash"}  # flash takes no mask: timed below
    results: dict = {}
    g = torch.Generator(device=device).manual_seed(0)
    for role, c in (("discriminator", cfg), ("generator", cfg.generator())):
        hd = c.hidden_size // c.num_heads
        shape = (batch, c.num_heads, args.seq_len, hd)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
        # ~5% short rows
        mask = padding_mask(batch, args.seq_len, device, padded_every=20, padded_len=args.seq_len // 2)
        p = c.attention_dropout
        row: dict = {"shape_b_h_t_d": list(shape), "dropout": p,
                     "mask": "bool (B, 1, 1, T), every 20th row half padded",
                     "sdpa_choice": runtime.sdpa_kernel(q, k, v, mask, p)}
        row["default"] = time_case(q, k, v, mask, p, None, device, iters, args.rounds)
        for label, b in backends.items():
            row[label] = time_case(q, k, v, mask, p, b, device, iters, args.rounds)
        flash = SDPBackend.FLASH_ATTENTION
        row["flash without mask (reference: no padding / unpadded)"] = time_case(
            q, k, v, None, p, flash, device, iters, args.rounds)
        row["varlen: the rows' lengths (train.attention=varlen)"] = time_varlen(
            q, k, v, mask, p, device, iters, args.rounds)
        results[role] = row
        print(role, {k2: (v2.get("fwd_bwd_ms_median") if isinstance(v2, dict) and "ran" in v2 else None)
                     for k2, v2 in row.items() if isinstance(v2, dict)}, flush=True)
    name = args.name or f"attention_{device.type}_{precision}"
    payload = {"recipe": args.recipe, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "precision": precision, "dtype": str(dtype).replace("torch.", ""), "batch_size": batch,
               "seq_len": args.seq_len, "iters_per_round": iters, "rounds": args.rounds, "results": results}
    path = write_result(name, payload, device, out_dir=args.out_dir, command=command_line("benchmarks.attention", argv))
    print(f"-> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
