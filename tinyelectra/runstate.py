"""What a pre-training run keeps between steps, and what the loop writes from it. `Launch` is the run before its
set-up (recipe, budget, --stop-after, folder, log, clock: what a failure during start-up is said with); `RunState`,
built once the set-up is done (`RunState.begin`: a new plan, or everything the resume state holds), holds the step,
the tokens seen, the clocks, the log window and the checkpoints written. It writes ckpt-0000 when asked, the
metrics.jsonl lines (`log_window`), the fraction checkpoints, the checkpoint where a --stop-after ends the run and
the resume states (`write_due`), and summary.json (`finish`: the schedule, and where and why this command stopped
it), and says in one line what stopped a run (a --stop-after, divergence, an interruption, a failed allocation, a
full disk) with what was kept and how to continue. Not here: the loop itself and what it trains with (train.py:
`train`, `set_up`), the step (step.py), the checkpoint and resume-state formats (checkpoint.py).

A stop (--stop-after, SIGINT, SIGTERM) between two log steps logs nothing: the log window in progress goes into the
resume state, so the resumed run writes the uninterrupted run's metrics.jsonl lines.

Divergence guard, without a per-step host sync: the losses are checked where they are read anyway (each log step),
and the window's losses and the weights before every checkpoint and resume state is written; a non-finite one stops
the run (`Diverged`, exit code 3) before anything is written from it, naming what was kept and what to try. fp16's
loss scaler still skips steps whose gradients overflow: an inf gradient is not a non-finite loss.

Time budgets count training time: steps, data loading and logging. Excluded (reported apart): start-up (data
preparation, building the model, compilation and the first step, at learning rate 0), and writing checkpoints, their
held-out evaluation and resume states. summary.json: `train_seconds` (the budget's clock, the whole run's; a
checkpoint's meta.json holds it at its step), `excluded_seconds` (the whole run's), and `process_seconds`
(`ProcessSeconds`: this process's parts, never more than its wall time in `train`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import glob
import os
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from tinyelectra import budget as budgeting
from tinyelectra import flops, runtime
from tinyelectra.budget import Plan, make_plan
from tinyelectra.checkpoint import (due_checkpoints, is_checkpoint, latest_state, load_resume_state, save_checkpoint,
                                   save_resume_state)
from tinyelectra.config import RUNTIME_SETTINGS, Recipe, differences, recipe_from_dict
from tinyelectra.data import BatchLoader, PretrainData
from tinyelectra.diagnostics import checkpoint_line, evaluate, unigram_distribution
from tinyelectra.electra import STAT_KEYS, SpecialIds, summarize
from tinyelectra.errors import Diverged, Interrupted, UserError
from tinyelectra.files import os_error_line, write_json
from tinyelectra.logs import Log, Progress, median_tokens_per_second
from tinyelectra.model import Electra, count_parameters
from tinyelectra.optim import lr_at
from tinyelectra.runfolder import DATASET_FILE, Written, data_record, delete_temporaries, record_data
from tinyelectra.runtime import device_name
from tinyelectra.step import Dist, Engine, new_sums

FRACTION_OF = {budgeting.checkpoint_name(f): f for f in budgeting.FRACTIONS}  # "ckpt-0625": 0.0625, ...
# the files train writes in its run folder (with DATASET_FILE, tensorboard/, state/ and the checkpoints)
RUN_FILES = ("recipe.json", "plan.json", "summary.json", "metrics.jsonl")


@dataclass
class ProcessSeconds:
    """Where this process's time in `train` went, each second in one part at most (summary.json's "process_seconds").
    start-up: from `train`'s entry to the end of the first step (resumed: to the start of its loop); training: the
    budget's time; `wall`: from `train`'s entry to its summary, at least the sum of the parts."""

    startup: float | None = None
    training: float = 0.0
    evaluation: float = 0.0
    checkpoints: float = 0.0
    resume_states: float = 0.0
    wall: float = 0.0


@dataclass
class Parts:
    """What the loop trains with (built by train.set_up): the prepared data, the model, its optimizer, loss scaler and
    step (`engine`), this process's loader, and how a step is split (`micro` sequences x `accum` micro-batches of this
    process's `rank_batch` rows); `compiled`, `attention` and `cpu_threads` are the set-up's notes for summary.json."""

    data: PretrainData
    special: SpecialIds
    precision: str
    autocast: contextlib.AbstractContextManager
    model: Electra
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    engine: Engine
    loader: BatchLoader
    rank_batch: int
    micro: int
    accum: int
    compiled: dict
    attention: dict
    cpu_threads: int | None


class Launch:
    """A run before its set-up: its recipe, budget and --stop-after, folder, device, processes, command, clock and
    log; the micro-batch once `set_up` knows it (what a failed allocation during start-up was for)."""

    def __init__(self, recipe: Recipe, bud: budgeting.Budget, stops: list[budgeting.Stop], run_dir: Path,
                 device: torch.device, dist: Dist, command: str, clock: Callable[[], float]) -> None:
        self.recipe, self.bud, self.stops = recipe, bud, stops
        self.run_dir, self.device, self.dist = run_dir, device, dist
        self.command = command  # as given: the lines that say how to continue quote it
        self.clock = clock  # measures training time (tests pass a simulated one)
        self.log = Log(run_dir, dist.main)
        self.written = Written(run_dir, "train")  # the record of what it writes there (runfolder.py); rank 0 only
        self.startup_t0 = clock()  # train()'s entry: start-up, this process's wall time and time stops count from here
        self.continue_with = _rerun_command(command, run_dir, ["--resume"])  # the command that continues this run
        self.micro: int | None = None  # sequences per micro-batch, once set_up knows (what a failed allocation was for)

    def record_run_files(self) -> None:
        """On record before any is written: the run's files and folders that are not checkpoints or resume states
        (those are recorded file by file as they are written: checkpoint.py), TensorBoard's event files by this
        process's pattern (their names are known only once written)."""
        run_dir, written = self.run_dir, self.written
        written.add(*(run_dir / n for n in (*RUN_FILES, DATASET_FILE)))
        written.add(run_dir / "tensorboard", kind="dir")
        written.add(f"tensorboard/events.out.tfevents.*.{glob.escape(socket.gethostname())}.{os.getpid()}.*",
                    kind="glob")

    @contextlib.contextmanager
    def failures_during_startup(self, resume: bool) -> Iterator[None]:
        """An allocation that failed (the model's weights, or a GPU probe's micro-batch) as one line with what to
        try; an interruption noted with how to start or continue the run."""
        try:
            yield
        except RuntimeError as e:
            if (asked := allocation_failure(e)) is None:
                raise
            raise UserError(
                out_of_memory_line(asked, self.device, self.recipe, self.micro, where="during start-up")
                + _out_of_memory_next(self.command, self.run_dir, self.recipe, self.micro, resume)) from None
        except Interrupted as e:
            where = (f"its resume state ({self.run_dir / 'state'}) is unchanged; continue with: {self.continue_with}"
                     if resume else "no resume state yet: run the same command again to start it"
                     + (" (--resume does the same)" if (self.run_dir / "plan.json").exists() else ""))
            self.log.once(f"interrupted ({e.signal_name}) during start-up: {where}")
            raise


@dataclass
class Start:
    """Where the loop starts: a new run's step 0, or what its resume state holds (`state_dir`), with the settings a
    --resume changed."""

    plan: Plan
    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0
    other_seconds: float = 0.0
    checkpoints: set[str] = dataclasses.field(default_factory=set)
    window: dict = dataclasses.field(default_factory=lambda: {"step": 0, "sums": {}})  # the log window it cut
    state_dir: Path | None = None
    changes: list[dict] = dataclasses.field(default_factory=list)
    runtime_changes: list[dict] = dataclasses.field(default_factory=list)


def new_start(launch: Launch, overridden: list[str] | None) -> Start:
    """A new run: its plan, and (rank 0) the run folder with recipe.json (with `overridden`, the --set changes, among
    its deviations) and plan.json."""
    plan = make_plan(launch.bud, launch.recipe)
    if launch.dist.main:  # the run directory appears only now, when the set-up has accepted everything
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.record_run_files()
        launch.log.truncate_after(0)  # a run that stopped during start-up and starts again
        saved = launch.recipe.to_dict()
        saved["deviations"] = saved["deviations"] + list(overridden or [])
        write_json(launch.run_dir / "recipe.json", saved)
        plan.save(launch.run_dir / "plan.json")
    return Start(plan)


def resumed_start(launch: Launch, parts: Parts, state: dict) -> Start:
    """A resumed run: its resume state (`state`: its trainer.json, read and checked by checkpoint.read_state_info)
    loaded into the model, optimizer and loader; the settings this --resume changes, said and recorded in the plan."""
    recipe, run_dir, log = launch.recipe, launch.run_dir, launch.log
    if recipe.train.strategy == "deepspeed":
        raise UserError("--resume is not supported with train.strategy=deepspeed yet (its optimizer state has "
                        "no plain, safely loadable format); the fraction checkpoints are complete and usable")
    state_dir = latest_state(run_dir)
    load_resume_state(state_dir, state, parts.model, parts.optimizer, parts.scaler, parts.loader, launch.device)
    plan = (Plan.from_dict(state["plan"], str(state_dir / "trainer.json")) if "plan" in state
            else Plan.load(run_dir / "plan.json"))
    if plan.budget != launch.bud.text:
        raise UserError(f"--resume: {run_dir} was planned for --budget {plan.budget}, not {launch.bud.text}")
    step = state["step"]
    if launch.dist.main:
        launch.record_run_files()
    log.truncate_after(step)
    log.once(f"resumed from step {step} ({state['train_seconds']:.1f} s of training time spent)")
    found = [{"step": step, "key": key, "old": old, "new": new} for key, old, new in differences(
        comparable_settings(state["recipe"], str(state_dir / "trainer.json")),
        comparable_settings(recipe.to_dict(), "--set"))]
    changes = [c for c in found if c["key"] not in RUNTIME_SETTINGS]
    runtime_changes = [c for c in found if c["key"] in RUNTIME_SETTINGS]
    plan.resumed_with_changes += changes
    plan.resumed_with_runtime_changes += runtime_changes
    if changes:
        log.once(f"resumed with changed settings: {budgeting.changes_text(changes)}; from here on this is not the "
                 "recipe's run (plan.json, summary.json and the report say so)")
    if runtime_changes:
        log.once(f"resumed with changed runtime settings: {budgeting.changes_text(runtime_changes)}; still the "
                 "recipe's run: they change how the steps are computed, not what (plan.json and summary.json "
                 "record them)")
    done = set(state["checkpoints"])
    later = [n for n in plan.checkpoint_steps if n not in done and (run_dir / n).is_dir()]
    if later:
        log.once(f"{', '.join(later)}: written after this resume state; kept until the run writes them again")
    return Start(plan, step, state["tokens_seen"], state["train_seconds"], state["other_seconds"], done,
                 state.get("window") or {"step": step, "sums": {}}, state_dir, changes, runtime_changes)


class RunState:
    """One process's run between steps, built once its set-up is done (`begin`): the loop reads `step`, `plan`,
    `sums` and `real_tokens` and adds to them; the methods keep the clocks, write what is due and check before
    writing (see the module docstring)."""

    @classmethod
    def begin(cls, launch: Launch, parts: Parts, state: dict | None, overridden: list[str] | None,
              initial_checkpoint: bool = False) -> RunState:
        """A new run (recipe.json, plan.json; `state` None) or the resumed one (its resume state: `state`, its
        trainer.json), then what starting writes: the data record, ckpt-0000 when asked (`initial_checkpoint`, at
        step 0), a resume state (a resumed run only when its settings changed), the plan table."""
        if launch.dist.main:  # what an interrupted write left behind (never renamed into place, so never loadable)
            delete_temporaries(launch.run_dir, "train")
        start = resumed_start(launch, parts, state) if state is not None else new_start(launch, overridden)
        return cls(launch, parts, start, initial_checkpoint)

    def __init__(self, launch: Launch, parts: Parts, start: Start, initial_checkpoint: bool) -> None:
        self.recipe, self.bud, self.stops, self.run_dir = launch.recipe, launch.bud, launch.stops, launch.run_dir
        self.device, self.dist, self.command, self.clock, self.log = (launch.device, launch.dist, launch.command,
                                                                      launch.clock, launch.log)
        self.startup_t0, self.continue_with = launch.startup_t0, launch.continue_with
        self.written = launch.written  # the record of what this run writes in its folder (rank 0)
        self.parts, self.resumed = parts, start.state_dir is not None
        self.process_seconds = ProcessSeconds()
        self.plan = start.plan  # a time budget's re-plans replace it (`replan`)
        self.plan.stop = budgeting.stop_plan(self.stops, self.plan, self.lr_at)  # this command's, not an earlier one's
        self.step = start.step
        # tokens_seen counts real tokens (attention mask), not padding: summed on the device, read at host syncs
        self.tokens_base = start.tokens_seen  # tokens seen before this process's steps
        self.real_tokens = torch.zeros((), dtype=torch.int64, device=self.device)  # ... and during them
        self.train_seconds = start.train_seconds  # the budget's clock, the whole run's
        self.other_seconds = start.other_seconds  # checkpoints, their evaluation and resume states (excluded)
        self.done_ckpts = set(start.checkpoints)  # the fraction checkpoints written
        self.sums = new_sums(self.device)  # the current log window's metric sums, on the device
        self.window_step = start.window["step"]  # the step the current log window started after
        # the log window a stop cut: its first steps' sums (rank 0's: DDP saves no other process's, so a resumed DDP
        # run's first window is the mean over rank 0's rows of its first steps and every row of the later ones)
        for k, v in start.window["sums"].items() if self.dist.main else ():
            self.sums[k].fill_(v)
        self.state_saved: tuple[int, Path] | None = (self.step, start.state_dir) if start.state_dir else None
        self.stopped = ""  # "stopped by SIGTERM" once the loop's own stop is under way
        # the training rows' word frequencies, for the held-out evaluation's baselines
        self.unigram: Tensor | None = None
        self._starting_writes(start, initial_checkpoint)

        # the loop's clocks, from here: training time is `clock() - clock_t0`, moved on by excluded time. A resumed
        # run's start-up ends here; a new run's at the end of its first step (compilation, allocator warm-up)
        clock = self.clock
        self.last_state_save = self.clock_t0 = clock()
        self.clock_started = self.step > 0
        if self.clock_started:  # resumed: the first step is training time
            self.process_seconds.startup = self.clock_t0 - self.startup_t0
        self.train_seconds_at_clock = self.train_seconds
        # the log window's tokens/s: over the steps timed in it
        self.window_t0, self.rate_step, self.window_tokens = clock(), self.step, self.tokens_seen()
        self.window_records: list[dict] = []  # this process's log lines: the median tokens/s of summary.json
        self.planner = (budgeting.TimeBudgetPlanner(self.bud, self.recipe, self.plan, self.step)
                        if self.plan.budget_kind == "time" else None)
        # DDP: rank 0's speed and clock, for the planner
        self.share = (lambda rate, seconds: _from_rank0((rate, seconds), self.device)) if self.dist.enabled else None
        self.progress = Progress(self.plan, self.step, self.dist.main, clock=clock)

    def _starting_writes(self, start: Start, initial_checkpoint: bool) -> None:
        """The data record; ckpt-0000 (asked for, at step 0); a resume state right after start-up (or a change of
        settings): from here on the run continues so; the events of a --resume that changed settings; the plan."""
        run_dir, dist, log, plan, changes = self.run_dir, self.dist, self.log, self.plan, start.changes
        if dist.main:  # the data it trains on (runfolder.check_data compares a --resume's with it)
            record_data(run_dir, self.parts.data)
            if self.resumed:  # a stopped run's summary: no longer what the run is (its stops stay in plan.json)
                (run_dir / "summary.json").unlink(missing_ok=True)
        if initial_checkpoint and self.step == 0:
            self.write_initial_checkpoint()
        elif initial_checkpoint and not is_checkpoint(run_dir / budgeting.INITIAL_CHECKPOINT):
            log.once(f"--initial-checkpoint: this run is at step {self.step:,}, its initial weights are gone; "
                     f"{budgeting.INITIAL_CHECKPOINT} is written when a run starts (start over with --force for it)")
        if not self.resumed or changes or start.runtime_changes:
            self.save_state()
        for event, these in (("resumed_with_changes", changes),
                             ("resumed_with_runtime_changes", start.runtime_changes)):
            if these:
                log.metrics({"event": event, "step": self.step, "changes": these})
        if dist.main:
            plan.save(run_dir / "plan.json")  # this command's stop (and the changes of a --resume)
        log.plan(plan, self.recipe, self.parts.model, self.parts.precision, self.device, self.command)

    def lr_at(self, step: int) -> float:
        """The learning rate the plan's schedule has at `step` (the paper's formula; optim.lr_at)."""
        plan = self.plan
        return lr_at(step, self.recipe.optim.lr, plan.warmup_steps, plan.total_steps or math.inf)

    def tokens_seen(self) -> int:
        return self.tokens_base + int(self.real_tokens.item())  # host sync: log steps, checkpoints, states

    # --- the divergence guard -----------------------------------------------------------------------------------------
    def check_finite(self, losses: dict[str, float], weights: bool, where: str = "") -> None:
        """The divergence guard: `losses` (gen_loss, disc_loss: of the current log window, or `where` they were
        measured) and, with `weights`, the model's parameters must be finite; else Diverged, naming the steps,
        what was kept and what to try."""
        step, recipe = self.step, self.recipe
        loss_names = {"gen_loss": "generator (MLM) loss" if recipe.objective.kind == "electra" else "MLM loss",
                      "disc_loss": "discriminator (replaced-token detection) loss"}
        first = self.window_step + 1
        where = where or (f"in step {step}" if first >= step else f"in steps {first}-{step}")
        bad = [f"the {loss_names[k]} is {v}" for k, v in losses.items() if not math.isfinite(v)]
        what = f"{' and '.join(bad)} {where}" if bad else ""
        if not what and weights and (names := runtime.nonfinite_parameters(self.parts.model)):
            what = f"the weights hold non-finite values after step {step} ({names[0]}" + (
                f" and {len(names) - 1} more)" if len(names) > 1 else ")")
        if what:
            lr = self.lr_at(max(step - 1, 0))
            message = _diverged_line(what, lr, recipe.optim.lr, self.state_saved, self.done_ckpts, self.run_dir,
                                     self.command)
            self.log.metrics({"event": "diverged", "step": step, "message": message})
            raise Diverged(message)

    def check_before_writing(self) -> None:
        """`check_finite` before a checkpoint or resume state: the weights, and the losses of the log window in
        progress (one process only: under DDP the windows' losses are checked at log steps, all-reduced, and a
        process's own window, read here, could stop it alone)."""
        sums = self.sums
        pair = [] if self.dist.enabled else torch.stack([sums["mlm_sum"], sums["disc_sum"]]).tolist()  # host sync
        self.check_finite(dict(zip(("gen_loss", "disc_loss"), pair)), weights=True)

    # --- the clocks ---------------------------------------------------------------------------------------------------
    def time_step(self) -> None:
        """The clocks after a step: the first step is start-up; after it, training time accumulates. The end of the
        first step and of a time budget's calibration steps are timed on finished work: wait for the device (host
        sync)."""
        planner = self.planner
        if not self.clock_started or (planner is not None and planner.measuring):
            runtime.synchronize(self.device)
        now = self.clock()
        if not self.clock_started:
            self.clock_started, self.clock_t0 = True, now
            self.process_seconds.startup = now - self.startup_t0
            if planner is not None:
                planner.step0 = self.step
            self.log.once(f"start-up took {self.process_seconds.startup:.1f} s (excluded from the budget)")
            self.window_t0, self.rate_step, self.window_tokens = now, self.step, self.tokens_seen()
        self.train_seconds = self.train_seconds_at_clock + (now - self.clock_t0)

    def replan(self) -> None:
        """A time budget's re-plan when its end moved off the budget (DDP: on log steps, from rank 0's clock): its
        lines to the log; plan.json follows the first measurement and every re-plan."""
        dist = self.dist
        log_step = self.step % self.recipe.train.log_every_steps == 0
        lines = self.planner.after_step(self.step, self.train_seconds, self.done_ckpts, share=self.share,
                                        replan_now=not dist.enabled or log_step)
        if lines is None:
            return
        self.plan = new_plan = self.planner.plan
        new_plan.stop = budgeting.stop_plan(self.stops, new_plan, self.lr_at)  # a step stop's share of the new schedule
        for line in lines:
            self.progress.note(line)
        if dist.main:
            new_plan.save(self.run_dir / "plan.json")
        self.progress.replan(new_plan)

    def stop_reached(self) -> str:
        """After this step: the --stop-after that ends this command here ("--stop-after 62500steps"), or "". Never at
        the schedule's end (the run finishes there), nor before a time budget's schedule is known. A time stop reads
        this process's clock (DDP: rank 0's, on log steps, so that every process stops after the same step)."""
        if not self.stops or self.plan.total_steps is None or self.plan.finished(self.step):
            return ""
        reached = [s for s in self.stops if s.kind == "steps" and self.step >= s.value]
        timed = [s for s in self.stops if s.kind == "time"]
        if timed and not reached and (not self.dist.enabled or self.step % self.recipe.train.log_every_steps == 0):
            elapsed = self.clock() - self.startup_t0
            if self.dist.enabled:
                elapsed = _from_rank0((elapsed,), self.device)[0]
            reached = [s for s in timed if elapsed >= s.value]
        return f"--stop-after {reached[0].text}" if reached else ""

    # --- what the loop writes -----------------------------------------------------------------------------------------
    def log_window(self, lr: float) -> None:
        """One metrics.jsonl line for the steps since the last (host sync only here); a new window starts."""
        step, sums, parts, plan = self.step, self.sums, self.parts, self.plan
        tokens_seen = self.tokens_seen()  # a host sync: the window's steps are done before the clock is read
        window_seconds = max(self.clock() - self.window_t0, 1e-9)
        tok_s = (tokens_seen - self.window_tokens) / window_seconds  # real tokens
        positions_s = (step - self.rate_step) * self.recipe.train.tokens_per_step / window_seconds  # padding too: MFU
        rec = log_record(step, sums, self.dist, lr, tok_s, tokens_seen, self.train_seconds, plan, parts.precision,
                         self.device, positions_s)
        losses = {k: rec[k] for k in ("gen_loss", "disc_loss") if k in rec}
        self.check_finite(losses, weights=False)  # read anyway: no extra sync
        self.log.metrics(rec)
        self.window_records.append(rec)
        self.progress.update(step, rec)
        for k in sums:
            sums[k].zero_()
        self.window_t0, self.window_step, self.rate_step, self.window_tokens = self.clock(), step, step, tokens_seen

    def write_due(self, stop_requested: bool, stop_after: str = "") -> None:
        """The fraction checkpoints due at this step, each on its own step; where a --stop-after ends the run
        (`stop_after`), a checkpoint of its weights too; a resume state every train.resume_every_seconds, after a
        checkpoint, on a stop and at the end. Neither is training time: the clocks move on by the seconds they took.
        The log window in progress is not logged on a stop: the resume state keeps it, so the resumed run logs
        the uninterrupted run's lines."""
        clock = self.clock
        other_t0 = clock()
        due = due_checkpoints(self.plan, self.step, self.done_ckpts)
        for name in due:
            self.write_checkpoint(name)
        if stop_after:
            self.write_stop_checkpoint(stop_after)
        state_t0 = clock()
        if (state_t0 - self.last_state_save >= self.recipe.train.resume_every_seconds or due or stop_requested
                or stop_after or self.plan.finished(self.step)):
            self.save_state()
            self.last_state_save = clock()
            self.process_seconds.resume_states += self.last_state_save - state_t0
        spent = clock() - other_t0
        self.other_seconds += spent
        self.clock_t0 += spent
        self.window_t0 += spent  # the log window's tokens/s counts training time too

    def _save_checkpoint(self, name: str, fraction: float, more: dict, startup: bool = False) -> dict:
        """A checkpoint of the weights at this step: its held-out evaluation, its directory (rank 0) and its
        metrics.jsonl event; returns the evaluation. `fraction`: of the schedule; `more`: meta.json's other facts;
        `startup`: written during start-up, whose seconds it is part of (process_seconds)."""
        clock, step, plan, parts, recipe = self.clock, self.step, self.plan, self.parts, self.recipe
        self.check_before_writing()  # never a checkpoint of non-finite weights, nor one written after a non-finite loss
        eval_t0 = clock()
        if self.unigram is None:  # counted once per process
            self.unigram = unigram_distribution(parts.data, parts.special)
        ev = evaluate(parts.model, parts.data, recipe, parts.special, self.device, parts.autocast, parts.micro,
                      self.unigram)
        self.check_finite({k: ev[k] for k in ("gen_loss", "disc_loss") if k in ev}, weights=False,
                          where=f"on the held-out rows (the evaluation of {name}, after step {step})")
        write_t0 = clock()
        if not startup:  # one written during start-up is start-up's time (process_seconds.startup)
            self.process_seconds.evaluation += write_t0 - eval_t0
        meta = {"name": name, "step": step, "fraction": fraction,
                "fraction_of_steps": step / plan.total_steps if plan.total_steps else None,
                "fraction_of_budget_seconds": (self.train_seconds / self.bud.value if plan.budget_kind == "time"
                                               else None),
                "tokens_seen": self.tokens_seen(),
                "train_flops_paper": step * plan.train_flops_paper_per_step,
                "train_flops_hardware": step * plan.train_flops_hardware_per_step,
                "train_seconds": self.train_seconds, "eval": ev, "precision": parts.precision,
                "device": device_name(self.device), "budget": plan.budget, "recipe": recipe.name, **more}
        if self.dist.main:
            save_checkpoint(self.run_dir / name, parts.model, recipe, meta, parts.data.path / "tokenizer", self.written)
        self.log.metrics({"event": "checkpoint", **meta})
        write_seconds = clock() - write_t0
        if not startup:
            self.process_seconds.checkpoints += write_seconds
        return ev

    def write_checkpoint(self, name: str) -> None:
        """The fraction checkpoint `name` at this step; plan.json says where it is."""
        ev = self._save_checkpoint(name, FRACTION_OF[name], {})
        self.progress.note(checkpoint_line(name, ev))
        self.done_ckpts.add(name)
        self.plan.checkpoint_steps[name] = self.step
        if self.dist.main:
            self.plan.save(self.run_dir / "plan.json")

    def write_initial_checkpoint(self) -> None:
        """ckpt-0000: the run's weights at step 0, before any training (those the first resume state holds), with
        the held-out evaluation of untrained weights: the no-pre-training control for GLUE."""
        ev = self._save_checkpoint(budgeting.INITIAL_CHECKPOINT, 0.0, {
            "note": "the run's initial weights (step 0, before any training): the no-pre-training control"},
                                   startup=True)
        self.log.once(checkpoint_line(budgeting.INITIAL_CHECKPOINT, ev))

    def write_stop_checkpoint(self, why: str) -> None:
        """Where a --stop-after ends the run before its schedule's end: a checkpoint of the weights there (none when
        a fraction checkpoint was just written at this step), named by its share of the schedule
        (budget.stop_checkpoint_name), and the stop in plan.json's `stopped`."""
        step, plan = self.step, self.plan
        here = [n for n in self.done_ckpts if plan.checkpoint_steps.get(n) == step]
        name = here[0] if here else budgeting.stop_checkpoint_name(step, plan.total_steps)
        if not here:
            ev = self._save_checkpoint(name, step / plan.total_steps, {"stopped_by": why})
            self.progress.note(checkpoint_line(name, ev))
        plan.stopped.append({"step": step, "why": why, "fraction_of_schedule": step / plan.total_steps,
                             "lr": self.lr_at(step), "checkpoint": name})
        if self.dist.main:
            plan.save(self.run_dir / "plan.json")

    def save_state(self) -> None:
        """A resume state holding everything the loop needs to continue exactly (rank 0; not with DeepSpeed), the
        log window in progress included, never of non-finite weights or after a non-finite loss (`check_finite`:
        every process, the same answer)."""
        self.check_before_writing()
        parts = self.parts
        if self.dist.main and parts.engine.ds is None:
            sums = {k: v.item() for k, v in self.sums.items()}  # host sync: state writes only
            window = {"step": self.window_step, "sums": sums}
            self.state_saved = (self.step, save_resume_state(
                self.run_dir, parts.model, parts.optimizer, parts.scaler, parts.loader, self.written, step=self.step,
                tokens_seen=self.tokens_seen(), train_seconds=self.train_seconds, other_seconds=self.other_seconds,
                checkpoints=sorted(self.done_ckpts), plan=self.plan.to_dict(), window=window, recipe=self.recipe,
                data=data_record(parts.data)))

    # --- the finish ---------------------------------------------------------------------------------------------------
    def finish(self, stopped_by: str = "") -> dict:
        """summary.json (rank 0, with plan.json as it ended) and the summary on the console; returns the summary.
        `stopped_by`: the --stop-after that ended this command before the schedule's end (the run continues with
        --resume)."""
        step, plan, parts, recipe, device, dist = self.step, self.plan, self.parts, self.recipe, self.device, self.dist
        engine, process_seconds, train_seconds = parts.engine, self.process_seconds, self.train_seconds
        self.progress.close()
        process_seconds.training = train_seconds - self.train_seconds_at_clock
        process_seconds.wall = self.clock() - self.startup_t0
        total = plan.total_steps or step
        fractions_of_steps = {n: plan.checkpoint_steps[n] / total for n in sorted(self.done_ckpts, key=FRACTION_OF.get)}
        off_fraction = budgeting.fractions_off({n: plan.checkpoint_steps[n] for n in fractions_of_steps}, total)
        if plan.budget_kind == "time" and not stopped_by:  # the plan as it ended: what happened
            plan.expected_train_seconds = train_seconds
        peak_gib, reserved_gib = runtime.peak_gpu_memory_gib(device), runtime.peak_gpu_reserved_gib(device)
        rows = parts.data.num_rows("train")
        stop = plan.stopped[-1] if stopped_by else None
        summary = {
            "recipe": recipe.name, "budget": plan.budget, "steps": step, "tokens_seen": self.tokens_seen(),
            "status": "stopped" if stopped_by else "finished",
            # what the schedule is, and where (and why) this command stopped it
            "schedule": {"total_steps": plan.total_steps, "warmup_steps": plan.warmup_steps, "peak_lr": recipe.optim.lr,
                         "budget": plan.budget, "budget_kind": plan.budget_kind,
                         "formula": "peak_lr * min(1, step / warmup_steps) * (1 - step / total_steps)"},
            "stopped": stop, "stops": plan.stopped,
            "train_flops_paper": step * plan.train_flops_paper_per_step,
            "train_flops_hardware": step * plan.train_flops_hardware_per_step,
            "train_seconds": train_seconds, "budget_seconds": plan.budget_seconds,
            # the whole run's, resumes included
            "excluded_seconds": {"startup_and_first_step": (None if self.resumed
                                                            else round(process_seconds.startup or 0.0, 3)),
                                 "checkpoints_eval_state": round(self.other_seconds, 3)},
            "process_seconds": {k: None if v is None else round(v, 3)  # this process's, from train()'s entry
                                for k, v in dataclasses.asdict(process_seconds).items()},
            # the prepared data trained on: its path, fingerprint and files (runfolder.py; rank 0 read them)
            "data": data_record(parts.data) if dist.main else None,
            # how often the data repeats: passes over the training rows, and the unique text tokens they hold
            "data_repetition": {"train_rows": rows,
                                "unique_tokens": (parts.data.manifest.get("tokens") or {}).get("train"),
                                "passes": step * recipe.train.batch_size / rows},
            "precision": parts.precision, "device": device_name(device), "parameters": count_parameters(parts.model),
            "checkpoints": list(fractions_of_steps),
            "checkpoint_steps": {n: plan.checkpoint_steps[n] for n in fractions_of_steps},
            "checkpoint_fractions_of_steps": fractions_of_steps,
            # name -> its fraction, its share of the steps, and why they differ
            "checkpoints_off_fraction": off_fraction,
            "initial_checkpoint": (budgeting.INITIAL_CHECKPOINT
                                   if is_checkpoint(self.run_dir / budgeting.INITIAL_CHECKPOINT) else None),
            "resumed_with_changes": plan.resumed_with_changes,  # settings a --resume changed: step, key, old, new
            "resumed_with_runtime_changes": plan.resumed_with_runtime_changes,  # config.RUNTIME_SETTINGS it changed
            "final_lr": self.lr_at(step),
            "conventions": plan.conventions,
            "runtime": {"strategy": engine.strategy_note, "compile": engine.compile_note,
                        "attention": parts.attention["summary"], "compiled": parts.compiled,
                        "deterministic": recipe.train.deterministic, "cpu_threads": parts.cpu_threads,
                        "micro_batches_without_padding": [engine.unpadded_micro_batches, engine.micro_batches]},
            # speed and memory: this process's logging windows after its first (start-up and compilation left out)
            "median_tokens_per_second": median_tokens_per_second(self.window_records),
            "peak_gpu_memory_gib": None if peak_gib is None else round(peak_gib, 3),  # tensors (max_memory_allocated)
            # what the caching allocator held: tensors, cached blocks and CUDA graphs' private pools
            # (max_memory_reserved)
            "peak_gpu_memory_reserved_gib": None if reserved_gib is None else round(reserved_gib, 3),
            "host_sync_per_step": engine.host_sync_note,
        }
        if off_fraction:
            self.log.once(f"checkpoints off their fractions: {budgeting.fractions_off_text(off_fraction)} "
                          "(summary.json: checkpoints_off_fraction)")
        if stop:
            onward = _rerun_command(self.command, self.run_dir, ["--resume"], drop_stop=True)
            # the stop's checkpoint, unless it is the fraction checkpoint written at this step (already listed)
            where = " (the last where it stopped)" if stop["checkpoint"] in self.done_ckpts \
                else f"; checkpoint {stop['checkpoint']}"
            self.log.once(f"stopped by {stopped_by} at step {step:,}, {100 * stop['fraction_of_schedule']:.4g}% of the "
                          f"schedule ({plan.schedule_text()}; learning rate there {stop['lr']:.3g}): "
                          f"{self.saved_text()}{where}; continue with: {onward} (with "
                          "another --stop-after, or none to run to the end)")
        if dist.main:
            plan.save(self.run_dir / "plan.json")  # a time budget's plan as it ended (the steps that fitted)
            write_json(self.run_dir / "summary.json", summary)
            last = stop["checkpoint"] if stop else list(fractions_of_steps)[-1]
            self.log.summary(summary, plan, next_commands(self.run_dir, device, last, stopped=bool(stop)))
        dist.leave()
        return summary

    # --- what stops a run: one line, saying what was kept and how to continue -----------------------------------------
    @contextlib.contextmanager
    def failures_in_loop(self) -> Iterator[None]:
        """Divergence (its line says it all), an interruption (the loop's own stop, or a second Ctrl-C: out at once,
        from wherever the step was), out of memory in a step or a checkpoint's evaluation, a full disk or a location
        that became read-only: the progress display closed, and one line naming what was kept."""
        try:
            yield
        except Diverged:
            self.progress.close()
            raise
        except Interrupted as e:
            self.progress.close()
            how = self.stopped or f"interrupted ({e.signal_name})"
            self.log.once(f"{how} at step {self.step}: {self.saved_text()}; continue with: {self.continue_with}")
            raise
        except RuntimeError as e:
            self.progress.close()
            if (asked := allocation_failure(e)) is None:
                raise
            what = out_of_memory_line(asked, self.device, self.recipe, self.parts.micro,
                                      where=f"after step {self.step}")
            resumable = self.state_saved is not None
            then = _out_of_memory_next(self.command, self.run_dir, self.recipe, self.parts.micro, resumable)
            raise UserError(f"{what}; training stopped: {self.saved_text()}{then}") from None
        except OSError as e:
            self.progress.close()
            room = "make room, then " if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
            raise UserError(f"{os_error_line(e)}; training stopped at step {self.step}: {self.saved_text()}; "
                            f"{room}continue with: {self.continue_with}") from None

    def saved_text(self) -> str:
        """What this process has kept: its last resume state and the checkpoints written."""
        return _saved_text(self.state_saved, self.done_ckpts)


def comparable_settings(raw: dict, where: str) -> dict:
    """A recipe's settings as two runs are compared: as this version writes them (older key names read as their new
    ones), in JSON's types, without the deviations (recipe.json's also list the --set changes)."""
    settings = json.loads(json.dumps(recipe_from_dict(raw, where=where).to_dict()))
    settings.pop("deviations")
    return settings


def _from_rank0(values: tuple[float, ...], device: torch.device) -> tuple[float, ...]:
    """DDP: rank 0's values on every process (a broadcast)."""
    shared = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.broadcast(shared, 0)
    return tuple(shared.tolist())


def log_record(step: int, sums: dict[str, Tensor], dist: Dist, lr: float, tokens_per_second: float,
               tokens_seen: int, train_seconds: float, plan: Plan, precision: str, device: torch.device,
               positions_per_second: float) -> dict:
    """One metrics.jsonl line from the window's metric sums (all-reduced). tokens_seen / tokens_per_second count
    real tokens (padding excluded); positions_per_second counts every position of the (B, T) batches, padding
    included, which is what MFU needs."""
    vec = torch.stack([sums[k] for k in STAT_KEYS]).float()
    if dist.enabled:
        torch.distributed.all_reduce(vec)
    s = dict(zip(STAT_KEYS, vec.tolist()))  # host sync: only on log steps
    rec: dict = {"step": step, "lr": lr, "tokens_seen": tokens_seen, "train_seconds": round(train_seconds, 3),
                 "tokens_per_second": round(tokens_per_second, 1),
                 "positions_per_second": round(positions_per_second, 1),
                 "train_flops_paper": step * plan.train_flops_paper_per_step,
                 "train_flops_hardware": step * plan.train_flops_hardware_per_step,
                 "gen_loss": s["mlm_sum"] / max(s["mlm_count"], 1.0)}
    if s["disc_count"]:
        rec["disc_loss"] = s["disc_sum"] / s["disc_count"]
    rec.update(summarize(s))
    if device.type == "cuda":
        per_token = plan.train_flops_hardware_per_step / plan.tokens_per_step
        rec["mfu"] = flops.mfu(positions_per_second, per_token, torch.cuda.get_device_name(device), precision)
    return rec


# ----------------------------------------------------------------------------------------------------------------
# the lines that say how a run stopped, and what comes next


def _rerun_command(command: str, run_dir: Path, extra: list[str], without_set: str = "",
                   drop_stop: bool = False) -> str:
    """The command given, with --out (when it had none), without --force, --resume, a `--set KEY=...` whose key
    is `without_set` and (`drop_stop`) its --stop-after, then the words `extra`."""
    import shlex

    words, kept = shlex.split(command) if command else ["tinyelectra", "train", "..."], []
    for word in words:
        if drop_stop and kept and kept[-1] == "--stop-after":  # the option's value: both go
            kept.pop()
            continue
        if drop_stop and word.startswith("--stop-after="):
            continue
        value = word.removeprefix("--set=")
        if without_set and value.split("=", 1)[0].strip() == without_set:
            if kept and kept[-1] == "--set" and value == word:
                kept.pop()
            continue
        if word not in ("--force", "--resume"):
            kept.append(word)
    if "--out" not in kept and not any(w.startswith("--out=") for w in kept):
        kept += ["--out", str(run_dir)]
    return shlex.join(kept + extra)


def _diverged_line(what: str, lr: float, peak_lr: float, state_saved: tuple[int, Path] | None, done: set[str],
                   run_dir: Path, command: str) -> str:
    """Diverged's one line: what is not finite and where, what was kept, and what to try: half the peak learning
    rate, continuing from the last resume state (`--resume --set optim.lr=...`), or starting over without one."""
    lower = ["--set", f"optim.lr={peak_lr / 2:.3g}"]
    if state_saved is not None:
        how = (f"continue from the resume state at step {state_saved[0]} with it: "
               f"{_rerun_command(command, run_dir, ['--resume', *lower], without_set='optim.lr')} (or start over with "
               "it: --force instead of --resume)")
    else:
        how = f"start over with it: {_rerun_command(command, run_dir, [*lower, '--force'], without_set='optim.lr')}"
    return (f"training diverged: {what} (learning rate {lr:.3g}, peak {peak_lr:.3g}); stopped before writing anything "
            f"after it ({_saved_text(state_saved, done)}). Try a lower learning rate, e.g. half the peak, and {how}")


def next_commands(run_dir: Path, device: torch.device, last_checkpoint: str,
                  stopped: bool = False) -> list[tuple[str, str]]:
    """What a finished (or `stopped`) run is for, as (command, what it does) for this run's paths, shell-quoted:
    export, fine-tune every checkpoint (the stop's) on GLUE (on this run's device), report."""
    import shlex

    run = shlex.quote(str(run_dir))
    where = "--device cpu" if device.type == "cpu" else f"--gpu {device.index or 0}"
    last = shlex.quote(str(run_dir / last_checkpoint))
    return [
        (f"tinyelectra export {last} --out {shlex.quote(str(run_dir / 'hf'))}",
         f"the {'checkpoint where it stopped' if stopped else 'final checkpoint'} as a transformers model"),
        (f"tinyelectra glue --checkpoint {last if stopped else run} --glue-dir GLUE_DIR {where}",
         f"fine-tune {'it' if stopped else 'each checkpoint'} on GLUE (GLUE_DIR: the classic glue_data folder; or --hf "
         "instead)"),
        (f"tinyelectra report {run}", "after glue: GLUE against FLOPs, beside the paper's Table 1"),
    ]


def _saved_text(state_saved: tuple[int, Path] | None, done: set[str]) -> str:
    kept = f"; checkpoints {', '.join(sorted(done, key=FRACTION_OF.get))}" if done else ""
    if state_saved is None:
        return f"no resume state was written{kept}"
    return f"saved: resume state at step {state_saved[0]} ({state_saved[1]}){kept}"


def allocation_failure(e: RuntimeError) -> str | None:
    """What an allocation that failed asked for ("tried to allocate 2.00 GiB"; "" when torch does not say), or None
    when `e` is not one (a GPU's torch.OutOfMemoryError, the CPU allocator's RuntimeError)."""
    text = str(e)
    if not isinstance(e, torch.OutOfMemoryError) and "can't allocate memory" not in text:
        return None
    if found := re.search(r"allocate (\d+) bytes", text):  # the CPU allocator's words
        return f"tried to allocate {int(found.group(1)) / 2**30:,.1f} GiB"
    found = re.search(r"allocate ([\d.]+ [KMGTP]?i?B)", text)  # CUDA's
    return f"tried to allocate {found.group(1)}" if found else ""


def out_of_memory_line(asked: str, device: torch.device, recipe: Recipe, micro: int | None, where: str) -> str:
    """What did not fit in memory (`micro` None: the model's weights; else a training step of `micro` sequences),
    `where`, how much was `asked`, and what to try: a smaller micro-batch, gradient checkpointing, a smaller model."""
    memory = f"{'GPU' if device.type == 'cuda' else device.type.upper()} memory{f' ({asked})' if asked else ''}"
    if micro is None:
        return (f"the model of recipe {recipe.name} does not fit in {memory} {where}; try a smaller model (--set "
                "model.hidden_size, model.num_layers, model.vocab_size)")
    tries = ([f"a smaller micro-batch (--set train.micro_batch_size={micro // 2}: the same global batch, accumulated)"]
             if micro > 1 else [])
    tries += [] if recipe.train.grad_checkpointing else ["gradient checkpointing (--set train.grad_checkpointing=true)"]
    tries += ["a smaller model"]
    return (f"a training step of {micro} sequences x {recipe.train.seq_len} tokens does not fit in {memory} {where}; "
            f"try {', '.join(tries[:-1])}{' or ' if len(tries) > 1 else ''}{tries[-1]}")


def _out_of_memory_next(command: str, run_dir: Path, recipe: Recipe, micro: int | None, resumable: bool) -> str:
    """The end of an out-of-memory line: this run's command with the first of `out_of_memory_line`'s tries that
    keeps it the recipe's run (half the micro-batch, else gradient checkpointing: config.RUNTIME_SETTINGS),
    continuing from its resume state (`resumable`: --resume) or run again (no state yet). When only a smaller model
    is left, a run with a resume state says that this is another run (--force)."""
    if micro is None or (micro == 1 and recipe.train.grad_checkpointing):
        return ("; a smaller model is another run: start over with --force (or choose another --out)" if resumable
                else "")
    setting, what = ((f"train.micro_batch_size={micro // 2}", "half the micro-batch") if micro > 1
                     else ("train.grad_checkpointing=true", "gradient checkpointing"))
    again = _rerun_command(command, run_dir, [*(["--resume"] if resumable else []), "--set", setting],
                           without_set=setting.split("=")[0])
    return f"; {'continue from the resume state' if resumable else 'run it again'} with {what}: {again}"

