"""Eight steps of the `tiny` recipe on the CPU (fixed seed, built-in corpus, a step budget), run once through the
command line: their per-step losses against a golden file, and the seconds summary.json accounts for.

The golden file (tests/fixtures/golden_tiny_losses.json) pins the mathematics of a training step: masking, sampling,
the losses, the paper's Adam, the warm-up. A refactor must reproduce it; a difference means the mathematics changed
(or torch's CPU kernels did). Regenerate it only for a change meant to alter the mathematics, and say so in the
commit:  PYTHONPATH=. python tests/test_tiny_steps.py --write-golden
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "fixtures" / "golden_tiny_losses.json"
ARGS = ["train", "--recipe", "tiny", "--budget", "8steps", "--device", "cpu", "--set", "train.log_every_steps=1"]
# a smaller held-out evaluation keeps the five checkpoints quick; it changes no training number (it touches neither the
# weights nor the data cursor, and every step reseeds its random streams), so the golden file, recorded with the
# recipe's 256 rows, holds
QUICK = ["--set", "train.eval_rows=32"]
REL = 1e-5  # two runs of this code on one machine agree exactly; the tolerance allows other CPUs' rounding


def run_tiny(out: Path, env: dict) -> Path:
    p = subprocess.run([sys.executable, "-m", "tinyelectra", *ARGS, *QUICK, "--out", str(out)], env=env,
                       capture_output=True,
                       text=True, timeout=1800)  # a hang guard, not a speed limit
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-3000:]}"
    return out


def step_losses(run: Path) -> list[dict]:
    """The per-step losses of metrics.jsonl (log_every_steps=1): generator (MLM), discriminator (RTD) and the
    total the step minimised, MLM + disc_weight x RTD (the recipe's weight, 50)."""
    recipe = json.loads((run / "recipe.json").read_text())
    weight = recipe["objective"]["disc_weight"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{"step": r["step"], "gen_loss": r["gen_loss"], "disc_loss": r["disc_loss"],
             "total_loss": r["gen_loss"] + weight * r["disc_loss"]} for r in rows if "event" not in r]


@pytest.fixture(scope="module")
def tiny_run(cli_env, tmp_path_factory) -> Path:
    return run_tiny(tmp_path_factory.mktemp("tiny") / "run", cli_env)


@pytest.mark.cli
@pytest.mark.slow
def test_losses_match_the_golden_file(tiny_run):
    golden = json.loads(GOLDEN.read_text())
    got = step_losses(tiny_run)
    assert [r["step"] for r in got] == [r["step"] for r in golden["steps"]] == list(range(1, 9))
    for want, have in zip(golden["steps"], got):
        for key in ("gen_loss", "disc_loss", "total_loss"):
            assert have[key] == pytest.approx(want[key], rel=REL), (want["step"], key, have[key], want[key])


@pytest.mark.cli
def test_summary_seconds_add_up_to_at_most_the_wall_time(tiny_run):
    """The defect of issue 13: start-up used to include every checkpoint write and evaluation after it, so start-up
    + training + checkpoints exceeded the process's wall time. No speed is asserted."""
    s = json.loads((tiny_run / "summary.json").read_text())
    parts = s["process_seconds"]
    assert set(parts) == {"startup", "training", "evaluation", "checkpoints", "resume_states", "wall"}
    assert all(v >= 0 for v in parts.values()), parts
    assert s["checkpoints"] == ["ckpt-0625", "ckpt-1250", "ckpt-2500", "ckpt-5000", "ckpt-10000"]
    tolerance = 0.01  # each part is rounded to the millisecond
    assert sum(v for k, v in parts.items() if k != "wall") <= parts["wall"] + tolerance, parts
    excluded = s["excluded_seconds"]
    assert excluded["startup_and_first_step"] == pytest.approx(parts["startup"], abs=tolerance)
    assert s["train_seconds"] == pytest.approx(parts["training"], abs=tolerance)
    assert excluded["startup_and_first_step"] + s["train_seconds"] + excluded["checkpoints_eval_state"] \
        <= parts["wall"] + tolerance, (excluded, s["train_seconds"], parts)
    assert parts["evaluation"] + parts["checkpoints"] + parts["resume_states"] \
        <= excluded["checkpoints_eval_state"] + tolerance
    assert parts["evaluation"] > 0 and parts["checkpoints"] > 0  # five checkpoints were evaluated and written
    meta = json.loads((tiny_run / "ckpt-10000" / "meta.json").read_text())
    assert meta["train_seconds"] == pytest.approx(s["train_seconds"], abs=tolerance) and "wall_seconds" not in meta


if __name__ == "__main__" and sys.argv[1:] == ["--write-golden"]:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TINYELECTRA_CACHE=os.environ.get("TINYELECTRA_CACHE", str(Path(tmp) / "cache")))
        steps = step_losses(run_tiny(Path(tmp) / "run", env))
    GOLDEN.write_text(json.dumps({
        "what": "per-step losses (generator = MLM, discriminator = RTD, total = MLM + 50 x RTD) of `tinyelectra "
                + " ".join(ARGS + QUICK) + "` on the built-in corpus with the recipe's seed, written by "
                "tests/test_tiny_steps.py --write-golden. A difference means the mathematics of a step changed.",
        "steps": steps}, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
