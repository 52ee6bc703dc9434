"""A budget ("4d", "90m", "1.4e18flops", "62500steps", "paper") becomes one Plan: total steps, warm-up,
checkpoint steps at 1/16 .. 1 of the run, expected tokens, FLOPs in both conventions and wall time.

The five checkpoints are snapshots of ONE run (the paper's Table 1 "partial training" rows): the learning-rate
schedule spans the whole budget, so the 6.25% checkpoint of a 4-day run is not the same model as a separately
scheduled 6-hour run (which is simply a smaller budget, with its own warm-up and decay to zero).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tinyelectra import flops
from tinyelectra.config import Recipe
from tinyelectra.errors import UserError

FRACTIONS = (0.0625, 0.125, 0.25, 0.5, 1.0)
_TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_STEP_SUFFIX = {"": 1, "k": 1_000, "K": 1_000, "M": 1_000_000}
_EXAMPLES = "e.g. 4d, 36h, 90m, 45s, 1.4e18flops, 62500steps, 1Msteps or paper"


def checkpoint_name(fraction: float) -> str:
    """ckpt-0625 ... ckpt-10000: the fraction x 10^4, so names sort by fraction."""
    return f"ckpt-{round(fraction * 10_000):04d}"


@dataclass(frozen=True)
class Budget:
    kind: str  # time | flops | steps | paper
    value: float  # seconds, paper-convention FLOPs, or steps (0 for paper)
    text: str


def parse_budget(text: str) -> Budget:
    t = text.strip()
    if t == "paper":
        return Budget("paper", 0.0, t)
    m = re.fullmatch(r"([+-]?[0-9]*\.?[0-9]+)\s*([smhd])", t)
    if m:
        return Budget("time", _positive(float(m.group(1)), t) * _TIME_UNITS[m.group(2)], t)
    m = re.fullmatch(r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*flops", t, flags=re.IGNORECASE)
    if m:
        return Budget("flops", _positive(float(m.group(1)), t), t)
    m = re.fullmatch(r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKM]?)\s*steps?", t)
    if m:
        steps = _positive(float(m.group(1)), t) * _STEP_SUFFIX[m.group(2)]
        if steps != int(steps):
            raise UserError(f"budget {text!r}: a step count must be a whole number")
        return Budget("steps", float(int(steps)), t)
    raise UserError(f"budget {text!r} is not understood ({_EXAMPLES})")


def _positive(x: float, text: str) -> float:
    if x <= 0:
        raise UserError(f"budget {text!r} must be positive ({_EXAMPLES})")
    return x


@dataclass
class Plan:
    budget: str
    budget_kind: str
    recipe: str
    total_steps: int
    warmup_steps: int
    checkpoint_steps: dict[str, int]  # checkpoint name -> step after which it is written
    batch_size: int
    seq_len: int
    tokens_per_step: int
    expected_tokens: int
    train_flops_paper_per_step: float
    train_flops_hardware_per_step: float
    train_flops_paper: float
    train_flops_hardware: float
    budget_seconds: float | None = None  # wall-clock budgets only
    steps_per_second: float | None = None  # measured (time budgets) or last known
    expected_wall_seconds: float | None = None
    status: str = "final"  # provisional (time budget before its throughput is measured) | final
    conventions: dict[str, str] = field(default_factory=lambda: {
        "paper": flops.PAPER_CONVENTION, "hardware": flops.HARDWARE_CONVENTION})
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json() + "\n", encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "Plan":
        return cls(**json.loads(path.read_text(encoding="utf-8")))


PROVISIONAL_STEPS = 1 << 62  # a time budget's step count before its throughput is measured
WARMUP_SHARE_CAP = 0.1  # a shorter run warms up for at most this share of its steps ...
WARMUP_FLOOR_SHARE = 0.5  # ... but the paper's Adam warms up for at least min(1 / (1 - beta2), this share) of it


def adam_warmup_floor(recipe: Recipe, total_steps: int) -> int:
    """The shortest warm-up under which the paper's Adam (no bias correction) behaves: 1 / (1 - beta2) steps (1,000
    for beta2 = 0.999), at most half of the run; 0 for the bias-corrected optimizers, which need none.

    Why: without bias correction the update is m / sqrt(v) with m and v still warming up themselves, which makes it
    (1 - b1^t) / sqrt(1 - b2^t) times bias-corrected Adam's: up to 6.5x near step 10, 3.2x at step 100, 1.26x at step
    1,000 (the second moment's memory, 1 / (1 - b2) steps), about 1 after a few thousand. The paper's 10,000-step
    warm-up keeps lr x that factor below the peak learning rate; a warm-up much shorter than 1 / (1 - b2) does not:
    measured on `tiny` at 5e-4 over 600 steps (benchmarks/results/short_runs_cpu.json), a 60-step warm-up kept the
    discriminator exactly at its all-"original" prior (recall 0 at every checkpoint), while a 300-step one (the floor,
    capped at half the run) left it (+0.0075 at step 150) and behaved like bias-corrected AdamW (+0.0043)."""
    if recipe.optim.name != "adam":
        return 0
    return min(math.ceil(1.0 / (1.0 - recipe.optim.beta2)), round(WARMUP_FLOOR_SHARE * total_steps))


def warmup_for(recipe: Recipe, total_steps: int) -> int:
    """The recipe's warm-up in steps (the paper: 10,000), as the official code keeps it whatever the run's length,
    but never more than 10% of a shorter run, and, with the paper's Adam, never less than `adam_warmup_floor`."""
    capped = min(recipe.optim.warmup_steps, round(WARMUP_SHARE_CAP * total_steps))
    return max(capped, adam_warmup_floor(recipe, total_steps))


def make_plan(budget: Budget, recipe: Recipe, steps_per_second: float | None = None, total_steps: int | None = None) -> Plan:
    """The plan for `budget`. A time budget needs the measured `steps_per_second` (else it is provisional), or
    the `total_steps` decided from it."""
    tr = recipe.train
    paper_step = flops.paper_train_flops_per_step(recipe.model, recipe.objective, tr.batch_size, tr.seq_len)
    hw_step = flops.hardware_train_flops_per_step(recipe.model, recipe.objective, tr.batch_size, tr.seq_len)
    status = "final"
    notes: list[str] = []
    if budget.kind == "paper":
        total = tr.steps
    elif budget.kind == "steps":
        total = int(budget.value)
    elif budget.kind == "flops":
        total = int(budget.value // paper_step)
        if total < 1:
            raise UserError(
                f"budget {budget.text}: one step of {recipe.name} costs {paper_step:.3e} FLOPs (paper convention); "
                "the budget does not buy a single step")
    elif total_steps is not None:
        total = total_steps
    else:
        if steps_per_second is None:  # unknown until measured: run on until the trainer measures it
            status = "provisional"
            total = PROVISIONAL_STEPS
        else:
            total = max(1, int(budget.value * steps_per_second))
    warmup = warmup_for(recipe, total)
    if warmup != recipe.optim.warmup_steps and status == "final":
        capped = min(recipe.optim.warmup_steps, round(WARMUP_SHARE_CAP * total))
        if warmup > capped:
            notes.append(f"warm-up {warmup} steps: the recipe's {recipe.optim.warmup_steps} capped at "
                         f"{WARMUP_SHARE_CAP:.0%} of this {total}-step run would be {capped}, raised to the paper's "
                         f"Adam's minimum (1 / (1 - beta2) steps, at most half the run: no bias correction)")
        else:
            notes.append(f"warm-up {warmup} steps: the recipe's {recipe.optim.warmup_steps}, capped at "
                         f"{WARMUP_SHARE_CAP:.0%} of this {total}-step run")
    ckpts = {checkpoint_name(f): max(1, round(total * f)) for f in FRACTIONS}
    expected_wall = None
    if steps_per_second:
        expected_wall = total / steps_per_second
    return Plan(
        budget=budget.text, budget_kind=budget.kind, recipe=recipe.name, total_steps=total, warmup_steps=warmup,
        checkpoint_steps=ckpts, batch_size=tr.batch_size, seq_len=tr.seq_len, tokens_per_step=tr.tokens_per_step,
        expected_tokens=total * tr.tokens_per_step, train_flops_paper_per_step=paper_step,
        train_flops_hardware_per_step=hw_step, train_flops_paper=paper_step * total,
        train_flops_hardware=hw_step * total, budget_seconds=budget.value if budget.kind == "time" else None,
        steps_per_second=steps_per_second, expected_wall_seconds=expected_wall, status=status, notes=notes,
    )
