"""A budget ("4d", "90m", "1.4e18flops", "62500steps", "paper") becomes one Plan: total steps, warm-up,
checkpoint steps at 1/16 .. 1 of the run, expected tokens, FLOPs in both conventions and training time.

The five checkpoints are snapshots of ONE run (the paper's Table 1 "partial training" rows): the schedule spans the
whole budget, so the 6.25% checkpoint of a 4-day run is not a separately scheduled 6-hour run (a smaller budget).

Step, FLOP and `paper` budgets are fixed before the first step, so a run reproduces. A time budget is a separately
scheduled shorter run, not the paper's schedule: the steps that fit in that much training time at the speed measured
over the first steps, on the paper's schedule shape (lr * min(1, step / warm-up) * (1 - step / total), warm-up and
decay at once). Its schedule is then fixed, and re-planned only when the run would end more than REPLAN_TOLERANCE of
the budget away from it (`TimeBudgetPlanner`: the machine's speed changed), so that a stall or noise never moves the
learning rate; plan.json lists every re-plan. By design it does not reproduce.

Where a run stops is another question than its schedule: `--stop-after` (`parse_stop`: a step count or this
command's time, repeatable, the first reached wins) ends a run of any schedule early, cleanly and resumably, e.g. the
paper's 1M-step schedule stopped at its 6.25% checkpoint with the paper's learning rate there (`--budget paper
--stop-after 62500steps`), or four days of training run over several evenings (`--stop-after 6h`, then `--resume`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tinyelectra import flops
from tinyelectra.config import Recipe
from tinyelectra.errors import UserError
from tinyelectra.files import write_atomic

FRACTIONS = flops.TABLE1_FRACTIONS  # the five checkpoints are the paper's Table 1 fractions (1/16 .. 1)
_TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_STEP_SUFFIX = {"": 1, "k": 1_000, "K": 1_000, "M": 1_000_000}
_EXAMPLES = "e.g. 4d, 36h, 90m, 45s, 1.4e18flops, 62500steps, 1Msteps or paper"
_STOP_EXAMPLES = "a step count or a time: e.g. 62500steps, 1Msteps, 6h, 90m"


def checkpoint_name(fraction: float) -> str:
    """ckpt-0625 ... ckpt-10000: the fraction x 10^4, so names sort by fraction."""
    return f"ckpt-{round(fraction * 10_000):04d}"


# the run's weights at step 0 (train --initial-checkpoint): the no-pre-training control
INITIAL_CHECKPOINT = "ckpt-0000"


def stop_checkpoint_name(step: int, total_steps: int) -> str:
    """The checkpoint where a --stop-after ends a run at `step` of a `total_steps` schedule: its share of the schedule
    in ten-thousandths, rounded down, between 1 and 9,999 (ckpt-0000 is the initial weights) and never a fraction
    checkpoint's name (one less): a stop at step 40,000 of 1M is ckpt-0400, at 62,550 ckpt-0624."""
    fractions = {round(f * 10_000) for f in FRACTIONS}
    n = max(1, min(step * 10_000 // total_steps, 9_999))
    while n in fractions:
        n -= 1
    return f"ckpt-{n:04d}"


@dataclass(frozen=True)
class Budget:
    kind: str  # time | flops | steps | paper
    value: float  # seconds, paper-convention FLOPs, or steps (0 for paper)
    text: str


def parse_budget(text: str) -> Budget:
    """'paper', a time ('4d', '90m', '1h30m', '2d12h', '1h30m15s': units d h m s, largest first, each once), FLOPs
    ('1.4e18flops') or steps ('62500steps', '1Msteps') -> a Budget; anything else is one UserError."""
    try:
        return _read_budget(text)
    except _Unreadable as e:
        raise UserError(f"budget {e.what}" + (f" ({_EXAMPLES})" if e.examples else "")) from None


class _Unreadable(Exception):
    """What is wrong with a budget's text (`what`, naming it), and whether the examples of the form help (`examples`):
    each command puts its own words and examples around it (parse_budget, parse_stop)."""

    def __init__(self, what: str, examples: bool = True) -> None:
        super().__init__(what)
        self.what, self.examples = what, examples


def _read_budget(text: str) -> Budget:
    """parse_budget's reading of `text`, shared with parse_stop; raises _Unreadable."""
    t = text.strip()
    if t == "paper":
        return Budget("paper", 0.0, t)
    units = "dhms"  # the order a time is written in
    pattern = r"([+-]?)\s*" + "".join(rf"(?:([0-9]*\.?[0-9]+)\s*{u}\s*)?" for u in units)
    if (m := re.fullmatch(pattern, t)) and any(m.groups()[1:]):
        seconds = sum(float(n) * _TIME_UNITS[u] for n, u in zip(m.groups()[1:], units) if n is not None)
        return Budget("time", _positive(-seconds if m.group(1) == "-" else seconds, t), t)
    if m := re.fullmatch(r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*flops", t, flags=re.IGNORECASE):
        return Budget("flops", _positive(float(m.group(1)), t), t)
    if m := re.fullmatch(r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKM]?)\s*steps?", t):
        steps = _positive(float(m.group(1)), t) * _STEP_SUFFIX[m.group(2)]
        if steps > MAX_BUDGET_STEPS:
            raise _Unreadable(f"{text!r}: more than {MAX_BUDGET_STEPS:.0e} steps")
        if steps != int(steps):
            raise _Unreadable(f"{text!r}: a step count must be a whole number", examples=False)
        return Budget("steps", float(int(steps)), t)
    raise _Unreadable(f"{text!r} is not understood")


@dataclass(frozen=True)
class Stop:
    """Where this command stops its run before the schedule's end (`--stop-after`): after step `value` (kind
    "steps"), or after the first step that ends `value` seconds after the command started (kind "time": this
    command's wall time, start-up included, as a session on a machine is counted)."""

    kind: str  # steps | time
    value: float
    text: str

    def describe(self) -> str:
        if self.kind == "steps":
            return f"after step {int(self.value):,}"
        return f"after {_duration(self.value)} of this command (start-up included)"


def parse_stop(text: str) -> Stop:
    """--stop-after's value: a step count ('62500steps', '1Msteps') or a time ('6h', '1h30m'); one UserError else."""
    try:
        b = _read_budget(text)
    except _Unreadable as e:
        raise UserError(f"--stop-after: {e.what} ({_STOP_EXAMPLES})") from None
    if b.kind not in ("steps", "time"):
        raise UserError(f"--stop-after {text!r}: {_STOP_EXAMPLES} (the schedule itself is --budget's)")
    return Stop(b.kind, b.value, b.text)


def _duration(seconds: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{seconds / n:g}{unit}"
    return f"{seconds:g} s"


MAX_BUDGET_STEPS = 10**15  # beyond any run; a larger number is a typo (and 1e400 is infinity)


def _positive(x: float, text: str) -> float:
    if not math.isfinite(x):
        raise _Unreadable(f"{text!r} is not a finite number")
    if x <= 0:
        raise _Unreadable(f"{text!r} must be positive")
    return x


@dataclass
class Plan:
    budget: str
    budget_kind: str
    recipe: str
    total_steps: int | None  # None: a time budget before its speed is measured (status "provisional")
    warmup_steps: int
    checkpoint_steps: dict[str, int]  # checkpoint name -> step after which it is written ({} while provisional)
    batch_size: int
    seq_len: int
    tokens_per_step: int
    expected_tokens: int | None
    train_flops_paper_per_step: float
    train_flops_hardware_per_step: float
    train_flops_paper: float | None
    train_flops_hardware: float | None
    budget_seconds: float | None = None  # wall-clock budgets only
    steps_per_second: float | None = None  # measured (time budgets) or last known
    expected_train_seconds: float | None = None  # training time only: start-up, checkpoints and evaluation not counted
    status: str = "final"  # provisional (time budget before its throughput is measured) | final
    conventions: dict[str, str] = field(default_factory=lambda: {
        "paper": flops.PAPER_CONVENTION, "hardware": flops.HARDWARE_CONVENTION})
    notes: list[str] = field(default_factory=list)
    resumed_with_changes: list[dict] = field(default_factory=list)  # settings a --resume changed: step, key, old, new
    resumed_with_runtime_changes: list[dict] = field(default_factory=list)  # the same, of config.RUNTIME_SETTINGS
    replans: list[dict] = field(default_factory=list)  # a time budget's re-plans: step, total and warm-up steps, speed
    stop: list[dict] = field(default_factory=list)  # where the latest command stops the run (--stop-after; `stop_plan`)
    stopped: list[dict] = field(default_factory=list)  # each stop before the schedule's end: step, why, share, lr

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "Plan":
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in d.items() if k in names})
        except TypeError as e:
            raise UserError(f"{where}: not a tinyelectra plan ({e})") from None

    @classmethod
    def load(cls, path: Path) -> "Plan":
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{path}: missing") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: damaged (not valid JSON: {str(e)[:120]})") from None
        if not isinstance(d, dict):
            raise UserError(f"{path}: damaged (not a JSON object)")
        return cls.from_dict(d, str(path))

    def finished(self, step: int) -> bool:
        return self.total_steps is not None and step >= self.total_steps

    def schedule_text(self) -> str:
        """The schedule in words: "1,000,000 steps, warm-up 10,000, --budget paper"."""
        if self.total_steps is None:
            return f"the steps that fit in --budget {self.budget}, planned once the speed is measured"
        return f"{self.total_steps:,} steps, warm-up {self.warmup_steps:,}, --budget {self.budget}"


def stop_plan(stops: list[Stop], plan: Plan, lr_at_step: Callable[[int], float]) -> list[dict]:
    """plan.json's `stop`: each --stop-after of this command, a step stop with its share of the schedule and the
    learning rate the schedule has there (`lr_at_step`, the schedule's formula)."""
    out = []
    for s in stops:
        if s.kind == "steps":
            step = int(s.value)
            share = step / plan.total_steps if plan.total_steps else None
            out.append({"after": s.text, "kind": "steps", "step": step, "fraction_of_schedule": share,
                        "lr": lr_at_step(step) if plan.total_steps else None})
        else:
            out.append({"after": s.text, "kind": "time", "seconds": s.value,
                        "counts": "this command's wall time, start-up included"})
    return out


def stops_text(stops: list[dict]) -> str:
    """plan.json's `stop` in words: "after step 62,500 (6.25% of the schedule, learning rate 4.69e-04) or after 6h of
    this command (start-up included), whichever comes first"."""
    said = []
    for s in stops:
        if s["kind"] == "steps":
            where = (f" ({100 * s['fraction_of_schedule']:.4g}% of the schedule, learning rate {s['lr']:.3g})"
                     if s.get("fraction_of_schedule") is not None else "")
            said.append(f"after step {s['step']:,}{where}")
        else:
            said.append(Stop("time", s["seconds"], s["after"]).describe())
    return " or ".join(said) + (", whichever comes first" if len(said) > 1 else "")


WARMUP_SHARE_CAP = 0.1  # a shorter run warms up for at most this share of its steps ...
WARMUP_FLOOR_SHARE = 0.5  # ... but the paper's Adam warms up for at least min(1 / (1 - beta2), this share) of it


def adam_warmup_floor(recipe: Recipe, total_steps: int) -> int:
    """The shortest warm-up under which the paper's Adam (no bias correction) behaves: 1 / (1 - beta2) steps (1,000
    for beta2 = 0.999), at most half of the run; 0 for the bias-corrected optimizers, which need none.

    Why: without bias correction the update is (1 - b1^t) / sqrt(1 - b2^t) times bias-corrected Adam's: 6.5x near
    step 10, 3.2x at 100, 1.26x at 1,000, about 1 after a few thousand; a warm-up much shorter than 1 / (1 - b2) does
    not keep lr x that factor below the peak. Measured: a 60-step warm-up kept `tiny`'s discriminator at its prior,
    the 300-step floor did not (benchmarks/lab/README.md, the warm-up floor)."""
    if recipe.optim.name != "adam":
        return 0
    return min(math.ceil(1.0 / (1.0 - recipe.optim.beta2)), round(WARMUP_FLOOR_SHARE * total_steps))


def _capped_warmup(recipe: Recipe, total_steps: int) -> int:
    return min(recipe.optim.warmup_steps, round(WARMUP_SHARE_CAP * total_steps))


def warmup_for(recipe: Recipe, total_steps: int) -> int:
    """The recipe's warm-up in steps (the paper: 10,000), as the official code keeps it whatever the run's length,
    but never more than 10% of a shorter run, and, with the paper's Adam, never less than `adam_warmup_floor`."""
    return max(_capped_warmup(recipe, total_steps), adam_warmup_floor(recipe, total_steps))


def _warmup_note(recipe: Recipe, total: int, warmup: int) -> str | None:
    if warmup == recipe.optim.warmup_steps:
        return None
    capped = _capped_warmup(recipe, total)
    if warmup > capped:
        return (f"warm-up {warmup} steps: the recipe's {recipe.optim.warmup_steps} capped at {WARMUP_SHARE_CAP:.0%} of "
                f"this {total}-step run would be {capped}, raised to the paper's Adam's minimum (1 / (1 - beta2) "
                f"steps, at most half the run: no bias correction)")
    return (f"warm-up {warmup} steps: the recipe's {recipe.optim.warmup_steps}, capped at {WARMUP_SHARE_CAP:.0%} of "
            f"this {total}-step run")


def checkpoint_schedule(total_steps: int, written: dict[str, int] | None = None) -> dict[str, int]:
    """The step after which each fraction checkpoint is written. Those already `written` stay where they were; the
    others go to their fraction of `total_steps`, each at least one step after the one before and leaving a step for
    each one after it, so that every checkpoint has its own step whenever the run has at least five steps (with
    fewer, some share a step; `make_plan` notes it). The last one is the run's end."""
    written = written or {}
    out: dict[str, int] = {}
    previous = 0
    for i, fraction in enumerate(FRACTIONS):
        name = checkpoint_name(fraction)
        if name in written:
            step = written[name]
        else:
            step = max(round(total_steps * fraction), previous + 1, 1)
            step = min(step, max(total_steps - (len(FRACTIONS) - 1 - i), 1))  # room for the later ones
        out[name] = step
        previous = step
    return out


# a checkpoint whose share of the steps is further than this share of its fraction from it is named
FRACTION_TOLERANCE = 0.25


def fractions_off(checkpoint_steps: dict[str, int], total_steps: int) -> dict[str, dict]:
    """The checkpoints (name -> step) whose share of a `total_steps`-step run is off their fraction by more than
    FRACTION_TOLERANCE of it: name -> {fraction, fraction_of_steps, why} (summary.json's `checkpoints_off_fraction`;
    reports mark them). Why: the run was too short for five distinct fractions (the checkpoint is where
    `checkpoint_schedule` puts it for this many steps), or a time budget's plan put it there before the run's length
    was known (the speed measured or changed later)."""
    best = checkpoint_schedule(total_steps)
    off = {}
    for fraction in FRACTIONS:
        name = checkpoint_name(fraction)
        step = checkpoint_steps.get(name)
        if step is None or abs(step / total_steps - fraction) <= FRACTION_TOLERANCE * fraction:
            continue
        if step == best[name]:
            why = (f"the run's {total_steps} steps are too few for distinct fractions (one step is "
                   f"{100 / total_steps:.3g}% of it, and each checkpoint has its own step)")
        else:
            why = ("a time budget's checkpoint goes where the plan of the moment puts it, and this run's length was "
                   "planned after that (its speed was measured, or changed, later)")
        off[name] = {"fraction": fraction, "fraction_of_steps": step / total_steps, "why": why}
    return off


def fractions_off_text(off: dict[str, dict]) -> str:
    """`fractions_off`'s answer in words, the checkpoints grouped by why: "ckpt-0625 at 12.5% of the steps,
    ckpt-1250 at 25.0%: why; ..."."""
    groups: dict[str, list[str]] = {}
    for name, o in off.items():
        at = f"{100 * o['fraction_of_steps']:.1f}%" + ("" if groups.get(o["why"]) else " of the steps")
        groups.setdefault(o["why"], []).append(f"{name} at {at}")
    return "; ".join(f"{', '.join(names)}: {why}" for why, names in groups.items())


def changes_text(changes: list[dict]) -> str:
    """A Plan's `resumed_with_changes` (or `resumed_with_runtime_changes`) in words: "optim.lr 1e+08 -> 0.0001 at
    step 1; train.grad_checkpointing false -> true at step 6; ..." (each value as `--set` writes it)."""
    shown = lambda v: f"{v:g}" if isinstance(v, float) else json.dumps(v).strip('"')  # noqa: E731
    return "; ".join(f"{c['key']} {shown(c['old'])} -> {shown(c['new'])} at step {c['step']}" for c in changes)


def _schedule_note(total: int, steps: dict[str, int]) -> str | None:
    at = ", ".join(f"{k}@{v}" for k, v in steps.items())
    if len(set(steps.values())) < len(steps):
        return f"only {total} step(s): five distinct checkpoints need at least five steps, so some share one ({at})"
    if steps != {n: max(1, round(total * f)) for n, f in zip(steps, FRACTIONS)}:
        return (f"{total} steps: fractions less than a step apart are moved apart, each checkpoint on its own "
                f"step ({at})")
    return None


def make_plan(budget: Budget, recipe: Recipe, steps_per_second: float | None = None,
              total_steps: int | None = None) -> Plan:
    """The plan for `budget`. A time budget needs the measured `steps_per_second` (else it is provisional: no step
    count yet), or the `total_steps` decided from it."""
    tr = recipe.train
    paper_step = flops.paper_train_flops_per_step(recipe.model, recipe.objective, tr.batch_size, tr.seq_len)
    hw_step = flops.hardware_train_flops_per_step(recipe.model, recipe.objective, tr.batch_size, tr.seq_len)
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
        if total > MAX_BUDGET_STEPS:
            raise UserError(f"budget {budget.text}: {total:.3e} steps of {recipe.name}, more than "
                            f"{MAX_BUDGET_STEPS:.0e}")
    elif total_steps is not None:
        total = total_steps
    elif steps_per_second is not None:
        total = max(1, int(budget.value * steps_per_second))
    else:  # unknown until measured: the trainer runs on until it has measured its speed
        total = None
    common = dict(budget=budget.text, budget_kind=budget.kind, recipe=recipe.name, total_steps=total,
                  batch_size=tr.batch_size, seq_len=tr.seq_len, tokens_per_step=tr.tokens_per_step,
                  train_flops_paper_per_step=paper_step, train_flops_hardware_per_step=hw_step)
    if total is None:
        return Plan(**common, warmup_steps=recipe.optim.warmup_steps, checkpoint_steps={}, expected_tokens=None,
                    train_flops_paper=None, train_flops_hardware=None, budget_seconds=budget.value,
                    status="provisional",
                    notes=["time budget: the steps are planned from the speed measured over the first steps"])
    warmup = warmup_for(recipe, total)
    ckpts = checkpoint_schedule(total)
    return Plan(**common, warmup_steps=warmup, checkpoint_steps=ckpts, expected_tokens=total * tr.tokens_per_step,
                train_flops_paper=paper_step * total, train_flops_hardware=hw_step * total,
                budget_seconds=budget.value if budget.kind == "time" else None, steps_per_second=steps_per_second,
                expected_train_seconds=total / steps_per_second if steps_per_second else None,
                notes=[n for n in (_warmup_note(recipe, total, warmup), _schedule_note(total, ckpts)) if n])


# ------------------------------------------------------------------------------------------------------------------
# a time budget as the run goes

CALIBRATION_STEPS = 5  # a time budget is first planned after this many timed steps (the first step is start-up) ...
CALIBRATION_SHARE = 0.03  # ... or after 2 of them, once they took this share of the budget (slow steps: 6.25% is near)
RATE_WINDOW_SECONDS = 10.0  # ... and re-planned from the speed of the last max(this, 20% of elapsed) seconds
SPEED_CHANGE_FACTOR = 1.5  # a measured speed this many times faster or slower than the last one announced is logged
REPLAN_TOLERANCE = 0.02  # the schedule stays as planned while the run would end within this share of the budget of it
MAX_PLAN_EVENTS = 20  # speed changes recorded in plan.json's notes (the log has them all)


class TimeBudgetPlanner:
    """A time budget's plan, kept true while the machine's speed changes. `after_step` is the trainer's one call:
    once enough steps are timed, the first plan; after it the schedule stays fixed while the run, at its recent
    speed, would end within REPLAN_TOLERANCE of the budget (a stall or noise changes nothing: the learning rate is
    the schedule's formula over fixed steps). When it would not, `replan` sets the end to the steps done plus those
    that fit in the remaining time (at least one per checkpoint still to write), moves the unwritten checkpoints to
    their fractions of the new end, and re-plans the warm-up until it is over, so one noisy early measurement fixes
    nothing. No clock is read here: the trainer passes its training time (tests simulate it)."""

    def __init__(self, bud: Budget, recipe: Recipe, plan: Plan, step: int) -> None:
        self.bud, self.recipe, self.plan = bud, recipe, plan
        self.step0 = step  # the first timed step: after start-up, or where the run resumed
        self.recent: deque[tuple[float, int]] = deque()  # (training seconds, step)
        self.announced_rate = plan.steps_per_second if plan.status == "final" else None
        self.events = [n for n in plan.notes if n.startswith(("speed changed", "the budget's time"))]
        self.stretched = any(n.startswith("the budget's time") for n in self.events)
        self.first_warmup: int | None = None  # the warm-up the first measurement planned
        self.seconds0: float | None = None  # training seconds at the first recorded step
        self.planned_at: tuple[float, int] | None = None  # (training seconds, step) of the last (re-)plan

    @property
    def measuring(self) -> bool:
        """True until the first speed is measured (the calibration steps): the trainer waits for the device at the
        end of each of them, so the first plan comes from finished steps, not from launched ones."""
        return self.announced_rate is None

    def after_step(self, step: int, train_seconds: float, done: set[str], replan_now: bool = True,
                   share: Callable[[float, float], tuple[float, float]] | None = None) -> list[str] | None:
        """Time the step and, once the speed is known (CALIBRATION_STEPS) and `replan_now` (DDP: log steps only),
        `replan` from the recent speed when the plan is provisional or off the budget by more than REPLAN_TOLERANCE.
        `share` gives rank 0's (speed, training seconds) so every process keeps the same plan. Returns the re-plan's
        log lines (the new plan is `self.plan`), or None when it did not re-plan."""
        self.recent.append((train_seconds, step))
        window = max(RATE_WINDOW_SECONDS, 0.2 * train_seconds)
        while len(self.recent) > 2 and self.recent[-1][0] - self.recent[0][0] > window:
            self.recent.popleft()
        if self.seconds0 is None:
            self.seconds0 = train_seconds
        timed = step - self.step0
        if not replan_now or timed < 2 or (
                timed < CALIBRATION_STEPS and train_seconds - self.seconds0 < CALIBRATION_SHARE * self.bud.value):
            return None
        (t0, s0), (t1, s1) = self.recent[0], self.recent[-1]
        rate = (s1 - s0) / max(t1 - t0, 1e-9)
        if share is not None:
            rate, train_seconds = share(rate, train_seconds)
        if self.on_track(step, train_seconds, rate):
            return None
        return self.replan(step, train_seconds, rate, done)

    def on_track(self, step: int, train_seconds: float, rate: float) -> bool:
        """Whether the plan, final, ends within REPLAN_TOLERANCE of the budget at the recent `rate` steps/s from
        `step`, or at the speed since the plan was made: a stall slows the recent speed for a while, not the speed
        since the plan (its seconds count once, in the time spent); a change of the machine's speed moves both."""
        plan = self.plan
        if plan.status != "final" or plan.total_steps is None:
            return False
        if self.planned_at is None:  # a resumed run's plan: kept, and its speed measured from here
            self.planned_at = (train_seconds, step)
            return True
        left, tolerance = max(plan.total_steps - step, 0), REPLAN_TOLERANCE * self.bud.value
        seconds0, step0 = self.planned_at
        since = (step - step0) / (train_seconds - seconds0) if train_seconds > seconds0 and step > step0 else rate
        return any(abs(train_seconds + left / max(r, 1e-12) - self.bud.value) <= tolerance for r in (rate, since))

    def replan(self, step: int, train_seconds: float, rate: float, done: set[str]) -> list[str]:
        """Re-plan at `step` after `train_seconds` of training time at `rate` steps/s; `done`: checkpoints written."""
        old = self.plan
        written = {n: old.checkpoint_steps[n] for n in done}
        fit = step + int(round(rate * max(self.bud.value - train_seconds, 0.0)))
        total = max(fit, step + max(len(FRACTIONS) - len(written) - 1, 0), 1)
        new = make_plan(self.bud, self.recipe, steps_per_second=rate, total_steps=total)
        lines: list[str] = []
        if old.status == "final" and step >= old.warmup_steps:  # the warm-up is over: it stays what it was
            new.warmup_steps = old.warmup_steps
            warmup_notes = [n for n in old.notes if n.startswith("warm-up")]
        else:  # still warming up: the warm-up follows the plan (and ends here if the new plan's is already past)
            planned = new.warmup_steps
            new.warmup_steps = max(planned, step)
            note = _warmup_note(self.recipe, total, planned) or f"warm-up {planned} steps"
            if planned < step:
                note = (f"warm-up {step} steps: it ended at step {step}, where the re-planned {total}-step run wanted "
                        f"{planned}")
            if self.first_warmup is not None and new.warmup_steps != self.first_warmup:
                note += f" (re-planned while it lasted; the first measurement planned {self.first_warmup})"
            warmup_notes = [note]
        new.checkpoint_steps = checkpoint_schedule(total, written)
        # what this plan expects: the time spent plus its remaining steps at this speed (the budget, unless the run
        # is stretched so that each checkpoint has its own step, or the budget is already spent)
        new.expected_train_seconds = train_seconds + (total - step) / max(rate, 1e-12)
        where = f"at step {step} ({train_seconds:.0f} s of {self.bud.value:.0f} s)"
        if self.announced_rate is None:
            lines.append(f"time budget: measured {rate:.3g} steps/s -> about {total:,} steps, warm-up "
                         f"{new.warmup_steps:,}, checkpoints at steps "
                         f"{', '.join(str(v) for v in new.checkpoint_steps.values())}; re-planned as the speed "
                         "changes. A time budget's step count follows the machine's speed and load, so it does not "
                         "reproduce (a step budget does)")
            self.announced_rate = rate
            self.first_warmup = new.warmup_steps
        elif max(rate / self.announced_rate, self.announced_rate / max(rate, 1e-12)) >= SPEED_CHANGE_FACTOR:
            self._event(lines, f"speed changed from {self.announced_rate:.3g} to {rate:.3g} steps/s {where}: the run "
                        f"is re-planned to about {total:,} steps (was {old.total_steps:,})")
            self.announced_rate = rate
        if total > fit and not self.stretched:
            self._event(lines, f"the budget's time is nearly spent {where} with {len(FRACTIONS) - len(written)} "
                        f"checkpoint(s) still to write: the run takes {total - fit} step(s) more than fit, so that "
                        "each checkpoint has its own step")
            self.stretched = True
        new.notes = warmup_notes + list(self.events)
        new.resumed_with_changes = old.resumed_with_changes
        new.resumed_with_runtime_changes = old.resumed_with_runtime_changes
        new.stop, new.stopped = old.stop, old.stopped
        self.planned_at = (train_seconds, step)
        new.replans = old.replans + [{"step": step, "total_steps": total, "warmup_steps": new.warmup_steps,
                                      "steps_per_second": round(rate, 4)}][:max(MAX_PLAN_EVENTS - len(old.replans), 0)]
        self.plan = new
        return lines

    def _event(self, lines: list[str], line: str) -> None:
        """A line for the log, and for plan.json's notes while they hold fewer than MAX_PLAN_EVENTS."""
        lines.append(line)
        if len(self.events) < MAX_PLAN_EVENTS:
            self.events.append(line)
