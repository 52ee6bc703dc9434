"""tinyelectra's measurements, run from the repository root as `python -m benchmarks.NAME` (nothing edits sys.path).

- benchmarks/ itself: the product's measurements (speed, memory, FLOPs, parity of the compiled step), each writing
  benchmarks/results/NAME.json with machine, commit and command (`common`).
- benchmarks/gpu_check/: the GPU-check harness behind `bash benchmarks/gpu_suite.sh` (the two commands of a GPU lease).
- benchmarks/lab/: experiment notebooks (why the discriminator plateaus, short learning-rate runs, ...) and their
  results, kept as records of what each found (benchmarks/lab/README.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: `python -m benchmarks.NAME` resolves from here


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the checkout at the end of PYTHONPATH, for a child started as `python -m
    benchmarks.NAME` from any folder. At the end, so that a package laid out before it on the path (the GPU suite's
    installed copy of tinyelectra) still comes first."""
    env = dict(os.environ if env is None else env)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in parts:
        env["PYTHONPATH"] = os.pathsep.join([*parts, str(ROOT)])
    return env
