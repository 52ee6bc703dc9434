"""The no-pre-training side of the GPU suite's GLUE comparison: the weights the suite's pre-training run starts from
(its recipe and seed, the pack's tokenizer and vocabulary), saved as that run's step-0 checkpoint, `ckpt-0000`, with
the held-out diagnostics of the untrained weights. `bash benchmarks/gpu_suite.sh --finish` fine-tunes it beside the
pre-trained checkpoint in the same processes, with the same protocol, on the same card.

    python -m benchmarks.gpu_check.glue_baseline --data WORK/pack/pretrain --out WORK/init/ckpt-0000 [--mode gpu|smoke]

(Before the GPU fine-tuned both sides, this side was computed beforehand on the CPU with 1,000 training rows and one
seed: glue_no_pretraining_cpu.json, retired with that mode; in git history at commit 0f79abe.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.common import run_main, save_initial_checkpoint
from benchmarks.gpu_check import suite

from tinyelectra.checkpoint import is_checkpoint


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the unpacked pack's pretrain/ (written by tinyelectra prepare)")
    ap.add_argument("--out", required=True, help="the checkpoint folder to write (its name: ckpt-0000)")
    ap.add_argument("--mode", default="gpu", choices=("gpu", "smoke"), help="whose recipe: the GPU run's or the smoke run's")
    ap.add_argument("--threads", type=int, default=4, help="CPU threads (it runs beside the GPU stages and their compiles)")
    return ap


def main(argv: list[str] | None = None) -> Path:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    if is_checkpoint(out):
        print(f"{out}: already written")
        return out
    import torch  # noqa: PLC0415

    torch.set_num_threads(max(1, args.threads))
    t0 = time.perf_counter()
    recipe = suite.pretrain_recipe(args.mode, Path(args.data))
    save_initial_checkpoint(recipe, Path(args.data), out, "no pre-training: the initial weights of the suite's pretrain "
                            "stage (same recipe, seed and tokenizer)")
    print(f"no pre-training: {recipe.name}'s initial weights -> {out} ({time.perf_counter() - t0:.1f} s)")
    return out


if __name__ == "__main__":
    run_main(main)
