"""Every shipped recipe loads, prints its FLOPs and plans a short run; no two resolve to the same configuration.

The recipes are read from the repository's recipes/ (test_packaging checks that the installed package data is the same
files), so the test checks this checkout's recipes even where an editable install points at another one."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tinyelectra.budget import make_plan, parse_budget
from tinyelectra.config import SECTIONS, load_recipe
from tinyelectra.flops import flops_command, paper_train_flops_per_step

RECIPES = {p.stem: str(p) for p in sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.toml"))}
SHIPPED = list(RECIPES)


def test_recipes_are_shipped():
    assert {"electra-small", "electra-base", "electra-large", "bert-small", "tiny", "mini"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_recipe_loads_and_prints_its_flops(name, capsys):
    recipe = load_recipe(RECIPES[name])
    assert recipe.name == name and recipe.description and recipe.deviations
    flops_command(recipe_name=RECIPES[name], steps=None, batch=None, seq_len=None, overrides=[])
    out = capsys.readouterr().out
    assert name in out and "train FLOPs per step" in out


@pytest.mark.parametrize("name", SHIPPED)
def test_recipe_plans_a_small_budget(name):
    recipe = load_recipe(RECIPES[name])
    tr = recipe.train
    step_flops = paper_train_flops_per_step(recipe.model, recipe.objective, tr.batch_size, tr.seq_len)
    plans = {
        "steps": make_plan(parse_budget("200steps"), recipe),
        "time": make_plan(parse_budget("10m"), recipe, steps_per_second=0.5),
        "flops": make_plan(parse_budget(f"{200.5 * step_flops:.6e}flops"), recipe),
    }
    for kind, plan in plans.items():
        assert plan.total_steps in (200, 300), kind  # 10 minutes at 0.5 steps/s: 300
        assert 0 < plan.warmup_steps <= plan.total_steps // 2, kind
        steps = list(plan.checkpoint_steps.values())
        assert len(steps) == 5 and steps == sorted(set(steps)) and steps[-1] == plan.total_steps, kind


def test_no_two_recipes_resolve_to_the_same_configuration():
    """A recipe that differs from another only in its name and prose is the same run under two names."""
    resolved = {name: {s: load_recipe(RECIPES[name]).to_dict()[s] for s in SECTIONS} for name in SHIPPED}
    same = [(a, b) for a, b in itertools.combinations(SHIPPED, 2) if resolved[a] == resolved[b]]
    assert not same
