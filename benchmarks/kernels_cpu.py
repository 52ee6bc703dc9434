"""Issue 33's kernel variants, measured on the CPU (the card's figures come from the A/B command): the samplers of
train.sampler timed against each other, and what inductor generates for them and for one encoder block (its fused
kernels, read from the generated code), which is what the fused layer-norm / GELU question was decided on.

    python -m benchmarks.kernels_cpu [--rows 304] [--rounds 7] [--threads 1]
      -> benchmarks/results/kernels_cpu.json

- `sampler_eager`: electra.sample_tokens on (rows, V) fp32 logits, gumbel-max (V random numbers per row) against
  inverse-cdf (one per row), and the one-level search the CPU ran before issue 33 (softmax, fp64 prefix sum over V,
  searchsorted: `one_level_fp64`, kept here as the reference), in alternating rounds (common.alternate), with the
  per-round ratios; and whether inverse-cdf draws the very tokens the one-level search drew from the same seed.
- `sampler_inductor`: each sampler compiled by inductor for the CPU: its generated kernels, and the largest buffer it
  allocates (inverse-cdf should write no (rows, V) tensor; Gumbel-max's noise is drawn inside its one kernel).
- `block_inductor`: one electra-small encoder block (hidden 256, FFN 1024, dropout on, a padding mask), forward and
  backward compiled by inductor for the CPU: its fused kernels by name (layer norm with its residual and dropout,
  GELU, softmax) and its extern GEMM calls. CPU inductor fuses as the GPU's does within a kernel's row, except that
  a GPU splits a row reduction from a column reduction (the layer norm's weight gradients) into separate kernels.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from benchmarks.common import alternate, command_line, paired_ratio, run_main, summarize, write_result

from tinyelectra.config import load_recipe
from tinyelectra.electra import sample_tokens
from tinyelectra.model import Block

CPU = torch.device("cpu")


def one_level_fp64(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """The CPU's sampler before issue 33: one fp64 prefix sum over the whole vocabulary, one uniform per row."""
    cdf = torch.softmax(logits.float(), -1).cumsum(-1, dtype=torch.float64)
    u = torch.rand(*cdf.shape[:-1], 1, dtype=torch.float64, generator=generator) * cdf[..., -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_max_(cdf.shape[-1] - 1).squeeze(-1)


def generated(fn, *args) -> list[str]:
    """The source inductor generated while running `fn(*args)` (forward, then backward when there is one)."""
    from torch._inductor.utils import run_and_get_code  # noqa: PLC0415

    torch._dynamo.reset()
    return run_and_get_code(fn, *args)[1]


def inventory(code: str) -> dict:
    """Fused kernels, extern calls and the largest buffer (elements) of one inductor-generated module."""
    kernels = re.findall(r"^(cpp_fused_\w+) = ", code, re.M)
    externs = [a or b for a, b in re.findall(r"extern_kernels\.(\w+)\(|torch\.ops\.(\w+\.\w+)\(", code)]
    sizes = [eval("*".join(shape.split(",")).strip("* ") or "1")  # noqa: S307 - integer shapes from the generated code
             for shape in re.findall(r"empty_strided_cpu\(\(([\d, ]*)\)", code)]
    return {"fused_kernels": len(kernels), "kernel_names": kernels, "extern_calls": externs,
            "largest_buffer_elements": max(sizes, default=0)}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=304, help="masked slots sampled at once (16 rows x 19 slots)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads, set and recorded")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = load_recipe("electra-small")
    V = recipe.model.vocab_size
    logits = torch.randn(args.rows, V, generator=torch.Generator().manual_seed(0)) * 3

    calls = {s: (lambda s=s: sample_tokens(logits, 1.0, None, s)) for s in ("gumbel-max", "inverse-cdf")}
    times = alternate({**calls, "one-level fp64": lambda: one_level_fp64(logits)}, warmup=1, repeats=args.rounds,
                      device=CPU)
    eager: dict = {s: summarize(t) for s, t in times.items()}
    eager["gumbel_over_inverse_cdf"] = paired_ratio(times["gumbel-max"], times["inverse-cdf"])
    eager["one_level_fp64_over_inverse_cdf"] = paired_ratio(times["one-level fp64"], times["inverse-cdf"])
    same = torch.equal(one_level_fp64(logits, torch.Generator().manual_seed(1)),
                       sample_tokens(logits, 1.0, torch.Generator().manual_seed(1), "inverse-cdf"))
    eager["inverse_cdf_draws_the_one_level_tokens"] = same
    print("sampler, eager:", {s: round(v["median_s"] * 1e3, 1) for s, v in eager.items() if isinstance(v, dict)
                              and "median_s" in v}, "ms;",
          f"same tokens as the one-level search: {same}", flush=True)

    compiled = {}
    for s in calls:
        fn = torch.compile(lambda x, s=s: sample_tokens(x, 1.0, None, s), fullgraph=True)
        (code,) = generated(fn, logits)
        compiled[s] = inventory(code)
        print(f"sampler, inductor, {s}:", {k: v for k, v in compiled[s].items() if k != "kernel_names"}, flush=True)

    cfg = recipe.model
    torch.manual_seed(0)
    block = Block(cfg).train()
    x = torch.randn(4, 128, cfg.hidden_size, requires_grad=True)
    mask = torch.ones(4, 1, 1, 128, dtype=torch.bool)
    mask[1, ..., 100:] = False
    step = torch.compile(block, fullgraph=True)
    codes = generated(lambda: step(x, mask).sum().backward())
    block_inv = dict(zip(("forward", "backward"), (inventory(c) for c in codes)))
    for part, inv in block_inv.items():
        print(f"block, inductor, {part}: {inv['fused_kernels']} fused kernels, {len(inv['extern_calls'])} extern calls",
              flush=True)

    payload = {"vocab_size": V, "rows": args.rows, "rounds": args.rounds, "sampler_eager": eager,
               "sampler_inductor": compiled,
               "block_inductor": {"shape": "4 x 128 tokens, hidden 256, 4 heads, FFN 1024, dropout 0.1, one row padded",
                                  **block_inv}}
    path = write_result("kernels_cpu", payload, CPU, out_dir=args.out_dir,
                        command=command_line("benchmarks.kernels_cpu", argv))
    print(f"-> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
