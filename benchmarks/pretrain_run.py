"""A real pre-training run through the command line, summarised: loss and accuracy curves, throughput, checkpoints.

    python benchmarks/pretrain_run.py --recipe electra-small --data /work/data/enwiki-30522 --budget 20m \
        --out /work/runs/electra-small-enwiki-20m [--name train_enwiki_cpu_20m] [-- extra train args]

Runs `tinyelectra train` (unless --summarize-only), then writes benchmarks/results/NAME.json: the machine, commit and
command, the plan, summary.json, the curves from metrics.jsonl (every logged step), the held-out evaluation of each
fraction checkpoint, and the median tokens/s over the run. The curves are the run's own numbers, not smoothed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, write_result  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="electra-small")
    ap.add_argument("--data", required=True)
    ap.add_argument("--budget", default="20m")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--name", default="train_enwiki_cpu_20m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--summarize-only", action="store_true", help="Only summarise an existing run directory.")
    ap.add_argument("extra", nargs="*", help="More `tinyelectra train` arguments (after --).")
    args = ap.parse_args()

    train_cmd = [sys.executable, "-m", "tinyelectra", "train", "--recipe", args.recipe, "--data", args.data,
                 "--budget", args.budget, "--device", args.device, "--out", str(args.out), *args.extra]
    wall = None
    if not args.summarize_only:
        t0 = time.perf_counter()
        subprocess.run(train_cmd, check=True)
        wall = time.perf_counter() - t0

    run = args.out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "event" not in r]
    ckpts = [r for r in records if r.get("event") == "checkpoint"]
    curve_keys = ("step", "train_seconds", "tokens_seen", "lr", "gen_loss", "disc_loss", "gen_acc", "disc_acc",
                  "disc_precision", "disc_recall", "replaced_frac", "tokens_per_second", "train_flops_paper")
    summary = json.loads((run / "summary.json").read_text())
    payload = {
        "what": f"{args.recipe} pre-trained on {args.data} for --budget {args.budget} on {args.device}",
        "train_command": " ".join(train_cmd[1:]).replace("-m tinyelectra", "tinyelectra", 1),
        "plan": json.loads((run / "plan.json").read_text()),
        "summary": summary,
        "process_wall_seconds": wall,
        "median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in steps[1:]) if len(steps) > 1 else None,
        "checkpoints": [{**{k: c.get(k) for k in ("name", "step", "fraction", "tokens_seen", "train_flops_paper",
                                                   "train_flops_hardware", "eval")},
                         "train_seconds": c.get("train_seconds", c.get("wall_seconds"))} for c in ckpts],  # older: wall_seconds
        "curves": [{k: r.get(k) for k in curve_keys} for r in steps],
    }
    path = write_result(args.name, payload, command=command_line())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
