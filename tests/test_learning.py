"""Learning that shows (issue 9): a short CPU run on real text leaves its priors, measured on held-out rows.

The `tiny` recipe, trained through the real command line for a step budget (no wall-clock assertion: the same run on
a fast or a loaded machine) on ten English Wikipedia shards from ../shared: at its end the held-out discriminator
beats answering "original" everywhere by a stated margin and ranks replaced tokens well above chance, and the
generator's held-out loss has left the uniform guess (its accuracy sits at the unigram answer's). Before issue 9 a
run like it (600 steps of tiny at 5e-4 with the paper's Adam and a 10%-of-the-run warm-up) left the discriminator
exactly at its prior from the first checkpoint on (benchmarks/results/short_runs_cpu.json, arm paper-10pct).
Without ../shared the test skips and says why.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("TINYELECTRA_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
ENWIKI_SHARDS = sorted((SHARED / "enwiki").glob("AA_wiki_0[0-9].gz"))
STEPS = 600  # 600 x 16 x 128 = 1.2M token slots: the ten shards' 1.5M training tokens seen less than once
EVAL_ROWS = 512  # asked for; ten shards with 3% of the documents held out give 328 rows (8 documents)
# Margins stated in the terms, with room under what was measured for this exact run on three seeds (see the
# docstring of test_short_run_leaves_its_priors).
DISC_MARGIN = 0.010  # held-out discriminator accuracy above the all-original prior
MIN_AUC = 0.75  # ranking of its own generator's replacements (0.5 = chance)
GEN_LOSS_BELOW_UNIFORM = 0.5  # nats under ln(8,192) = 9.01, the loss of a uniform guess


def run_cli(args: list[str], env: dict) -> None:
    p = subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=env, capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"


@pytest.mark.slow
def test_short_run_leaves_its_priors(tmp_path):
    """tiny, 600 steps of 16 x 128 on ten enwiki shards (vocabulary 8,192, 328 held-out rows), measured on this
    project's 2-core CPU for seeds 0 (the default, this test), 1 and 2: held-out discriminator accuracy above the
    all-original prior (0.8516) by +0.0115, +0.0130, +0.0118; AUC 0.810, 0.807, 0.812; context AUC 0.511, 0.509,
    0.511; generator loss 8.01, 8.01, 8.02 nats (uniform: 9.01) at accuracy 0.053, 0.045, 0.053 (unigram: 0.053).
    At 300 steps the gain was only +0.005 and +0.006 (seeds 0, 1), hence 600.

    What this does and does not show: the discriminator has left its prior and ranks its generator's replacements
    well, but its context AUC (ranking unigram draws put in the masked slots) stays near 0.5 and the generator sits at
    the unigram answer: at this compute the discriminator has learned to spot a weak generator's unlikely words, not
    context (diagnostics.verdict says so)."""
    if not ENWIKI_SHARDS:
        pytest.skip(f"needs ten English Wikipedia shards in {SHARED}/enwiki (set TINYELECTRA_SHARED_DATA)")
    env = dict(os.environ, TINYELECTRA_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    data, run = tmp_path / "enwiki10", tmp_path / "run"
    run_cli(["prepare", "--corpus", *map(str, ENWIKI_SHARDS), "--out", str(data), "--vocab-size", "8192",
             "--workers", "1", "--validation-fraction", "0.03"], env)
    run_cli(["train", "--recipe", "tiny", "--data", str(data), "--budget", f"{STEPS}steps", "--device", "cpu",
             "--out", str(run), "--set", f"train.eval_rows={EVAL_ROWS}"], env)
    held_out = json.loads((data / "manifest.json").read_text())["splits"]["validation"]["rows"]
    final = json.loads((run / "ckpt-10000" / "meta.json").read_text())["eval"]
    assert final["rows"] == min(EVAL_ROWS, held_out) >= 300
    gain = final["disc_acc"] - final["baseline_acc"]
    assert gain >= DISC_MARGIN, final
    assert final["disc_auc"] >= MIN_AUC, final
    assert final["gen_loss"] <= math.log(8192) - GEN_LOSS_BELOW_UNIFORM, final
    assert final["learned"] and final["verdict"].startswith("learned")
    assert 0.0 <= final["disc_auc_context"] <= 1.0
    plan = json.loads((run / "plan.json").read_text())
    assert plan["warmup_steps"] == STEPS // 2  # the paper's Adam: min(1 / (1 - beta2), half the run)
