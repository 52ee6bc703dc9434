"""Every shipped recipe loads, prints its FLOPs and plans a short run; no two resolve to the same configuration.

The recipes are read from the repository's recipes/ (test_packaging checks that the installed package data is the same
files), so the test checks this checkout's recipes even where an editable install points at another one."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tinyelectra.budget import make_plan, parse_budget
from tinyelectra.config import SECTIONS, load_recipe, recipe_command
from tinyelectra.errors import UserError
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


def test_recipe_list_and_show_are_the_plain_forms(capsys, monkeypatch):
    """`recipe list` and `recipe show NAME` (what other tools take) print what `recipe` and `recipe NAME` print;
    the listing keeps a description's first clause whole, "(Clark et al. 2020, ...)" included."""
    import sys

    from tinyelectra import cli

    def run(*args: str) -> str:
        monkeypatch.setattr(sys, "argv", ["tinyelectra", "recipe", *args])
        with pytest.raises(SystemExit) as e:
            cli.main()
        assert e.value.code == 0
        return capsys.readouterr().out

    listing = run()
    assert run("list") == listing and run("show", "tiny") == run("tiny")
    assert [line.split()[0] for line in listing.splitlines()] == SHIPPED
    small = next(line for line in listing.splitlines() if line.startswith("electra-small "))
    assert small.endswith("ELECTRA-Small exactly as the paper trained it (Clark et al. 2020, Table 1 and Appendix A)")
    with pytest.raises(UserError, match="unknown recipe 'nope'"):
        recipe_command("nope", [])


@pytest.mark.parametrize("text,seconds", [("4d", 345_600), ("36h", 129_600), ("90m", 5_400), ("45s", 45),
                                          ("1h30m", 5_400), ("2d12h", 216_000), ("1h30m15s", 5_415), ("1.5h", 5_400),
                                          ("1h 30m", 5_400)])
def test_time_budgets_in_several_units(text, seconds):
    budget = parse_budget(text)
    assert budget.kind == "time" and budget.value == seconds


@pytest.mark.parametrize("text", ["30m1h", "1h1h", "1m30", "h", "-1h30m", "0h0m"])
def test_time_budgets_that_are_not_understood_or_not_positive(text):
    with pytest.raises(UserError, match=f"budget '{text}'"):
        parse_budget(text)


def test_a_recipe_saved_with_the_deleted_disc_lr_scale_still_loads_at_the_papers_one_rate():
    """Runs and checkpoints written while optim.disc_lr_scale existed (commits 540b8d6 to 0f79abe) saved it in their
    recipe.json, at 1 unless a run asked otherwise: 1 reads as today's recipe (one rate for the whole model); any
    other value is a run this code cannot reproduce, one clear error."""
    from tinyelectra.config import recipe_from_dict

    saved = load_recipe("tiny").to_dict()
    old = {**saved, "optim": {**saved["optim"], "disc_lr_scale": 1.0}}
    assert recipe_from_dict(old) == recipe_from_dict(saved)
    with pytest.raises(UserError, match="disc_lr_scale: unknown key"):
        recipe_from_dict({**saved, "optim": {**saved["optim"], "disc_lr_scale": 0.1}})
