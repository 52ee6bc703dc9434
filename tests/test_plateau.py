"""The discriminator's plateau (benchmarks/lab/plateau.py): a bounded-step check that the tiny
recipe's discriminator with the opt-in its deviations name (optim.lr=3e-4) leaves its all-"original" prior on a
generated grammar, so the plateau never silently returns.

What the benchmark measured (benchmarks/lab/results/plateau_cpu.md): replaced-token detection alone on unigram
replacements, tiny's shape, a generated grammar; ELECTRA's discriminator (ours and transformers' alike) stays at its
prior for 2,000 steps at the CPU recipes' optimizer (the paper's Adam at 3e-3) and at AdamW 1e-3, while a plain
pre-LN encoder with PyTorch's initialisation leaves it in 200-300; at the paper's Adam at 3e-4 it leaves it after
1,000-1,700 steps of 32 rows.
"""

from __future__ import annotations

import pytest

from benchmarks.lab import plateau

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------------------------------- the plateau, in CI
OPT_IN = ["optim.lr=3e-4"]  # what the tiny recipe's deviations name for a discriminator that learns context
STEPS = 2500  # the bound: measured escapes of this configuration at 1,000-1,700 steps (the test's docstring)
BATCH = 32  # rows of 32 tokens a step (tiny's 16 rows of 128 carry twice the tokens); with 16 rows the escape came
# later and less reliably (1,700, 2,400, not within 2,500: benchmarks/lab/results/plateau_cpu.md)
LEFT_AT = 0.7  # matched AUC; at the prior, every run of the ablation measured 0.45-0.59, after the escape 0.8-0.9


@pytest.mark.slow
def test_tiny_discriminator_with_the_opt_in_leaves_the_prior_on_a_grammar():
    """The tiny recipe's discriminator, with the opt-in its deviations name, leaves its all-"original" prior on the
    generated grammar within STEPS steps: its held-out AUC matched by token id (0.5 = no context) reaches LEFT_AT.

    The bound, from benchmarks/lab/results/plateau_cpu.md (32 rows of 32, the paper's Adam at 3e-4, 100-step warm-up):
    the benchmark's ELECTRA end left the prior at step 1,000, 1,300 and 1,000 on grammar0, 1 and 2; this test's own
    configuration (tinyelectra's Electra, grammar0) at 1,600-1,700 with seed 0 (0.621, 0.840), 1,100 with seed 1 (0.700)
    (benchmarks/lab/results/plateau_test_config_cpu.json).
    Without the opt-in (tiny's 3e-3) the same discriminator stays at its prior: 0.48-0.53 along all 2,500 steps here
    (0.499 at the end), 0.475-0.522 along 2,000 in the benchmark, as every arm of the ablation at that rate: this test
    then fails. Passing, it took 3-5 minutes on the loaded 2-core machine (failing, 9): the plateau is that long even
    at the best rate measured."""
    curve = plateau.tiny_curve(OPT_IN, STEPS, BATCH, LEFT_AT)
    last = max(curve)
    assert curve[last] >= LEFT_AT, f"matched AUC by step: {curve} ({OPT_IN})"


def test_the_report_keeps_its_hand_written_findings(tmp_path):
    """`plateau.py report` writes the tables again from the run files; the findings (what they show, written by hand
    into plateau_cpu.md, not held in the code) are carried over as they are, up to the first generated paragraph."""
    md = tmp_path / "plateau_cpu.md"
    assert plateau.findings(md, "Generated.") == "## Findings\n\n(to be written from the tables below)"
    md.write_text("# Title\n\n## Findings\n\n1. **Not a defect.** Both sit at the prior.\n\nGenerated. | table |\n")
    assert plateau.findings(md, "Generated.") == "## Findings\n\n1. **Not a defect.** Both sit at the prior."
