"""The discriminator's plateau (benchmarks/plateau.py): optim.disc_lr_scale, and a bounded-step check that the tiny
recipe's discriminator with the opt-in its deviations name (optim.lr=3e-4) leaves its all-"original" prior on a
generated grammar, so the plateau never silently returns.

What the benchmark measured (benchmarks/results/plateau_cpu.md): replaced-token detection alone on unigram
replacements, tiny's shape, a generated grammar; ELECTRA's discriminator (ours and transformers' alike) stays at its
prior for 2,000 steps at the CPU recipes' optimizer (the paper's Adam at 3e-3) and at AdamW 1e-3, while a plain
pre-LN encoder with PyTorch's initialisation leaves it in 200-300; at the paper's Adam at 3e-4 it leaves it after
1,000-1,700 steps of 32 rows.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from tinyelectra.config import load_recipe
from tinyelectra.errors import UserError
from tinyelectra.model import Electra
from tinyelectra.optim import build_optimizer, no_decay, param_groups

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import plateau  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------- the opt-in
def test_disc_lr_scale_puts_exactly_the_discriminator_body_at_the_scaled_rate():
    """Every parameter of the discriminator's encoder and head (and nothing else: not the shared embeddings, not the
    generator) is stepped at lr x 0.1; weight decay is split as without the scale; the default keeps the paper's
    two groups."""
    recipe = load_recipe("mini", ["optim.disc_lr_scale=0.1"])
    model = Electra(recipe.model)
    names = {id(p): n for n, p in model.named_parameters()}
    opt = build_optimizer(model, recipe.optim, "cpu")
    opt.set_lr(3e-3)
    seen = 0
    for g in opt.param_groups:
        for p in g["params"]:
            seen += 1
            name = names[id(p)]
            want_lr = 3e-4 if name.startswith(("discriminator.", "disc_head.")) else 3e-3
            assert g["paper_lr"] == pytest.approx(want_lr, rel=1e-12), name
            assert g["weight_decay"] == (0.0 if no_decay(name, p) else recipe.optim.weight_decay), name
    assert seen == len(names)
    paper = param_groups(model, 0.01)
    assert len(paper) == 2 and all("lr_scale" not in g for g in paper)  # disc_lr_scale = 1: the groups as before


def test_disc_lr_scale_steps_the_discriminator_a_tenth_as_far():
    """The first step of the paper's Adam moves a parameter by lr x m / (sqrt(v) + eps), the same for both runs
    given the same gradient; with the scale, a discriminator parameter moves exactly 0.1 x as far, a generator or
    embedding parameter exactly as far."""
    cfg = dataclasses.replace(load_recipe("tiny").model, vocab_size=64, max_positions=16)
    moved = {}
    for scale in (1.0, 0.1):
        torch.manual_seed(0)
        model = Electra(cfg)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = build_optimizer(model, load_recipe("tiny", [f"optim.disc_lr_scale={scale}"]).optim, "cpu")
        opt.set_lr(1e-3)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        moved[scale] = {n: (p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters()}
    for n, d in moved[0.1].items():
        want = 0.1 if n.startswith(("discriminator.", "disc_head.")) else 1.0
        assert d == pytest.approx(want * moved[1.0][n], rel=1e-4), n


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5"])
def test_disc_lr_scale_out_of_range_is_one_clear_error(value):
    with pytest.raises(UserError, match=r"optim.disc_lr_scale: must be in \(0, 1\]"):
        load_recipe("tiny", [f"optim.disc_lr_scale={value}"])


def test_the_papers_recipes_keep_one_rate():
    for name in ("electra-small", "electra-base", "electra-large"):
        assert load_recipe(name).optim.disc_lr_scale == 1.0


# ---------------------------------------------------------------------------------------------------- the plateau, in CI
OPT_IN = ["optim.lr=3e-4"]  # what the tiny recipe's deviations name for a discriminator that learns context
STEPS = 2500  # the bound: measured escapes of this configuration at 1,000-1,700 steps (the test's docstring)
BATCH = 32  # rows of 32 tokens a step (tiny's 16 rows of 128 carry twice the tokens); with 16 rows the escape came
# later and less reliably (1,700, 2,400, not within 2,500: benchmarks/results/plateau_cpu.md)
LEFT_AT = 0.7  # matched AUC; at the prior, every run of the ablation measured 0.45-0.59, after the escape 0.8-0.9


@pytest.mark.slow
def test_tiny_discriminator_with_the_opt_in_leaves_the_prior_on_a_grammar():
    """The tiny recipe's discriminator, with the opt-in its deviations name, leaves its all-"original" prior on the
    generated grammar within STEPS steps: its held-out AUC matched by token id (0.5 = no context) reaches LEFT_AT.

    The bound, from benchmarks/results/plateau_cpu.md (32 rows of 32, the paper's Adam at 3e-4, 100-step warm-up):
    the benchmark's ELECTRA end left the prior at step 1,000, 1,300 and 1,000 on grammar0, 1 and 2; this test's own
    configuration (tinyelectra's Electra, grammar0) at 1,600-1,700 with seed 0 (0.621, 0.840), 1,100 with seed 1 (0.700)
    (benchmarks/results/plateau_test_config_cpu.json).
    Without the opt-in (tiny's 3e-3) the same discriminator stays at its prior: 0.48-0.53 along all 2,500 steps here
    (0.499 at the end), 0.475-0.522 along 2,000 in the benchmark, as every arm of the ablation at that rate: this test
    then fails. Passing, it took 3-5 minutes on the loaded 2-core machine (failing, 9): the plateau is that long even
    at the best rate measured."""
    curve = plateau.tiny_curve(OPT_IN, STEPS, BATCH, LEFT_AT)
    last = max(curve)
    assert curve[last] >= LEFT_AT, f"matched AUC by step: {curve} ({OPT_IN})"
