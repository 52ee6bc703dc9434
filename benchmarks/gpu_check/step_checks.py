"""The step's GPU checks for one lease, in one command: the parity check first (fail-fast), then the figures that
decide the step's defaults, each check with its own time limit, skipped once the deadline is near. ELECTRA-Small,
128 x 128, on the card's precision (bf16 where it has bf16).

    python -m benchmarks.gpu_check.step_checks [--deadline 540] [--out-dir benchmarks/results/step-checks] \
        [--only parity,both]

  parity     loss_check.py --compile auto: the CUDA-graph step computes the eager step (exit 1 stops everything)
  both       throughput.py --compile auto --sides both --profile 2: tinyelectra and transformers each at its best
             (inductor + CUDA graphs), paired rounds, peak memory with the graph pools, kernel table
  grad_norm  throughput.py --compile auto --sides tinyelectra --grad-norm one-op --profile 2: A/B against `both`
             (the update's gradient norm as one operator instead of a 306-input stack)
  no_padding throughput.py --compile auto --sides tinyelectra --padding none --profile 2: every batch without
             padding (no attention mask, FlashAttention eligible): what mask-free attention is worth at most
  fp16       loss_check.py and throughput.py in fp16 (the V100/T4 path: loss scaling on the device under graphs)

All share one inductor cache (DIR/inductor-cache), so the first check's compile serves the later ones. Each check
writes its own JSON into DIR; DIR/step_checks.json lists every check's command, exit code and seconds (rewritten
after each), "skipped: deadline" for what did not fit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import ROOT, child_env

SHAPE = ["--device", "cuda", "--recipe", "electra-small", "--batch", "128", "--seq-len", "128"]
TIMING = ["--rounds", "6", "--warmup", "2", "--calls-per-round", "20", "--profile", "2"]
# (name, module of benchmarks/, arguments, limit in seconds): the cold compile with CUDA graphs took 112 s on an H200
# (one graph; the step now has two, with and without an attention mask); the later checks find most of it in the cache
CHECKS = [
    ("parity", "loss_check", [*SHAPE, "--compile", "auto", "--steps", "20"], 300),
    ("both", "throughput", [*SHAPE, "--compile", "auto", "--sides", "both", *TIMING], 300),
    ("grad_norm", "throughput",
     [*SHAPE, "--compile", "auto", "--sides", "tinyelectra", "--grad-norm", "one-op", *TIMING], 180),
    ("no_padding", "throughput",
     [*SHAPE, "--compile", "auto", "--sides", "tinyelectra", "--padding", "none", *TIMING], 180),
    ("fp16_parity", "loss_check", [*SHAPE, "--precision", "fp16", "--compile", "auto", "--steps", "20"], 300),
    ("fp16", "throughput",
     [*SHAPE, "--precision", "fp16", "--compile", "auto", "--sides", "tinyelectra", *TIMING], 240),
]


def plan(deadline_s: float, elapsed_s: float, limit_s: float) -> float | None:
    """The time a check may take: its limit, cut to what is left before the deadline; None when under a minute is
    left."""
    left = deadline_s - elapsed_s
    return None if left < 60 else min(limit_s, left)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for all checks together")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results" / "step-checks"))
    ap.add_argument("--only", default="", help="comma-separated check names (default: all, in order)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = child_env(dict(os.environ, PYTHONUNBUFFERED="1"))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(out / "inductor-cache"))
    wanted = [n for n in args.only.split(",") if n] or [c[0] for c in CHECKS]
    record: dict = {"deadline_s": args.deadline, "checks": {}}
    t0 = time.monotonic()
    for name, module, arguments, limit in CHECKS:
        if name not in wanted:
            continue
        allowed = plan(args.deadline, time.monotonic() - t0, limit)
        if allowed is None:
            record["checks"][name] = {"status": "skipped: deadline"}
            continue
        command = [sys.executable, "-m", f"benchmarks.{module}", *arguments, "--out-dir", str(out), "--name", name]
        started = time.monotonic()
        with open(out / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=allowed).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        seconds = round(time.monotonic() - started, 1)
        record["checks"][name] = {"command": " ".join(command[1:]), "exit": rc, "seconds": seconds, "limit_s": allowed}
        (out / "step_checks.json").write_text(json.dumps(record, indent=2) + "\n")
        print(f"{name}: exit {rc} in {seconds} s", flush=True)
        if name == "parity" and rc != 0:
            print("the parity check failed: the CUDA-graph step does not compute the eager step; stopping",
                  file=sys.stderr)
            return 1
    (out / "step_checks.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
