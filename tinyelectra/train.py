"""Pre-training within a budget: the loop, visible in one function (`train`), and the command around it.

Sections of `train`: set-up (`set_up`: the data, the model, its step) -> plan and resume (`RunState.begin`) -> loop
-> finish (`RunState.finish`: summary.json). The loop, one step at a time: `mask_step`, `global_counts`, the learning
rate, `train_step` (step.py: the step, its Engine, compile and CUDA-graph policy; benchmarks/throughput.py times the
same), the clocks, the time budget's re-plan, a log line, a --stop-after reached (`RunState.stop_reached`), the
fraction checkpoints (checkpoint.due_checkpoints), the stop's checkpoint and the resume states that are due. What the
loop keeps between steps, what it writes and the divergence guard are runstate.py's; the run folder's state when the
command starts (`open_run_dir`) is here. The resume state holds everything needed to continue exactly; all randomness of
a step is derived from (seed, step, first global row of the micro-batch), so a resumed, an accumulating and a DDP run
draw the same for the same rows.

Host syncs: log steps, checkpoints and resume states, and the device is waited for at the end of the first step and
of a time budget's calibration steps (host clocks otherwise time kernel launches); fp16 adds the loss scaler's
overflow check on every step where the update runs eager (step.Engine.host_sync_note; under CUDA graphs the scaler
runs on the device), and its speed figures say so. Compiling (step.Engine.compile_now) is start-up, and so is the
first step; time budgets count training time only (runstate.py says what is excluded and where it is reported).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tinyelectra import budget as budgeting
from tinyelectra import runtime
from tinyelectra.budget import parse_budget, parse_stop
from tinyelectra.checkpoint import CKPT_NAME, is_checkpoint, latest_state, load_checkpoint, read_state_info
from tinyelectra.config import RUNTIME_SETTINGS, Recipe, difference_text, differences, load_recipe
from tinyelectra.data import BatchLoader, PretrainData, heldout_warning
from tinyelectra.electra import SpecialIds
from tinyelectra.errors import Interrupted, UserError
from tinyelectra.files import check_writable, path_part
from tinyelectra.logs import make_console
from tinyelectra.model import Electra, attention_kernel
from tinyelectra.optim import build_optimizer
from tinyelectra.runfolder import (BOOKKEEPING, DATASET_FILE, DERIVED_BY, RECORD_NAME, check_data, covered, delete_run,
                                   foreign, holding)
from tinyelectra.runstate import RUN_FILES, Launch, Parts, RunState, comparable_settings
from tinyelectra.step import (Dist, Engine, PretrainStep, fit_micro_batch, global_counts, mask_step, probe_step,
                              train_step)


# ----------------------------------------------------------------------------------------------------------------
# the command


def train_command(
    budget: str, data_dir: Path | None, corpus: list[str] | None, recipe_name: str, gpu: int | None,
    device: str | None, out_dir: Path | None, resume: bool, overrides: list[str], command: str,
    init: Path | None = None, force: bool = False, stop_after: list[str] | None = None,
    initial_checkpoint: bool = False,
) -> dict | None:
    dist = Dist.from_env()
    bud = parse_budget(budget)
    stops = [parse_stop(t) for t in stop_after or []]
    recipe = load_recipe(recipe_name, overrides)
    check_stops(stops, bud, recipe)
    notes: list[str] = []
    if data_dir is not None:
        recipe = adopt_data_vocab(recipe, data_dir, overrides, notes)
    if gpu is not None and device is not None:
        raise UserError("give either --gpu N or --device, not both")
    runtime.set_deterministic(recipe.train.deterministic)  # before anything touches CUDA: cuBLAS reads it once
    dev = runtime.pick_process_device(gpu, device, dist.local_rank, dist.world)  # torchrun: cuda:LOCAL_RANK
    run_dir = out_dir or Path("runs") / f"{path_part(recipe.name, 'recipe name')}-{bud.text}"
    if data_dir is None and corpus and (run_dir / "data" / "manifest.json").is_file():  # prepared by an earlier start
        recipe = adopt_data_vocab(recipe, run_dir / "data", overrides, notes)
    if dist.enabled and not torch.distributed.is_initialized():  # torchrun: join the process group
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    # one writer per run folder: rank 0 (the only one that writes) holds its lock until the command ends; a --resume
    # of a folder that does not exist takes none (open_run_dir refuses it, creating nothing)
    # (all of it under --force, until the earlier run is deleted: no other command starts in it meanwhile)
    with holding(run_dir, "--out", enabled=dist.main and (run_dir.exists() or not resume),
                 reserves=("*",) if force else TRAIN_WRITES) as lock:
        # `state`: a --resume's trainer.json, read and its files checked once, here, for the whole start-up
        mode, state = open_run_dir(run_dir, resume, force, recipe, bud, make_console()) if dist.main else (None, None)
        if lock is not None:
            lock.reserve(TRAIN_WRITES)
        if dist.enabled and torch.distributed.is_initialized():  # every process does what rank 0 decided
            shared = [mode, state]
            torch.distributed.broadcast_object_list(shared, 0)
            mode, state = shared
        if mode == "resume" and (reached := stop_already_reached(stops, run_dir, state["step"])):
            mode = "done"
            if dist.main:
                print(f"· {reached}", file=sys.stderr)
        if mode == "done":
            dist.leave()
            return None
        data_path = resolve_data(data_dir, corpus, recipe, run_dir, dist, force=force)
        # --corpus with the recipe's data.tokenizer: its vocabulary decides too
        if corpus and not notes and mode != "resume":
            recipe = adopt_data_vocab(recipe, data_path, overrides, notes)
        if dist.main:
            for note in notes:
                print(f"· {note}", file=sys.stderr)
        base = load_recipe(recipe_name)
        overridden = [f"command line: --set {o} (the recipe says {_lookup(base, o)!r})" for o in overrides] + notes
        if recipe.optim.name != "adam":
            overridden.append(f"OFF-RECIPE optimizer {recipe.optim.name}: bias-corrected AdamW, not the paper's Adam "
                              "without bias correction")
        return train(recipe, bud, data_path, run_dir, dev, resume=(mode == "resume"), dist=dist, command=command,
                     init=init, overridden=overridden, stops=stops, initial_checkpoint=initial_checkpoint, state=state)


def check_stops(stops: list[budgeting.Stop], bud: budgeting.Budget, recipe: Recipe) -> None:
    """--stop-after against the schedule, before anything is written: a step past a fixed schedule's end is an error
    (the run ends there first); DeepSpeed's runs cannot be resumed, so they cannot be stopped early either."""
    if not stops:
        return
    if recipe.train.strategy == "deepspeed":
        raise UserError("--stop-after with train.strategy=deepspeed: its runs cannot be resumed yet, so a stop would "
                        "end them; run without it")
    total = budgeting.make_plan(bud, recipe).total_steps  # None for a time budget: known once its speed is measured
    for s in stops:
        if s.kind == "steps" and total is not None and s.value > total:
            raise UserError(f"--stop-after {s.text}: after the end of the {total:,}-step schedule of --budget "
                            f"{bud.text} (the run ends there: drop --stop-after, or give a step up to {total:,})")


def stop_already_reached(stops: list[budgeting.Stop], run_dir: Path, at: int) -> str:
    """A --resume (of a run at step `at`) whose step stop the run has already reached: what to say instead of
    training (nothing to do)."""
    steps = [s for s in stops if s.kind == "steps"]
    if not steps:
        return ""
    first = min(steps, key=lambda s: s.value)
    if at < first.value:
        return ""
    return (f"{run_dir} is at step {at:,}, already past --stop-after {first.text}: nothing to do; continue with "
            "--resume and a later --stop-after, or none to run to the end")


def adopt_data_vocab(recipe: Recipe, data_dir: Path, overrides: list[str], notes: list[str]) -> Recipe:
    """The prepared data's vocabulary size becomes the model's, so a custom tokenizer needs no
    `--set model.vocab_size=N`; a size given with --set stays (and a mismatch is an error, _check_data). Appends
    the change to `notes` (recipe.json's deviations)."""
    size = PretrainData(data_dir).vocab_size
    if size == recipe.model.vocab_size or any(o.split("=", 1)[0].strip() == "model.vocab_size" for o in overrides):
        return recipe
    notes.append(f"model.vocab_size = {size}, the vocabulary of the prepared data {data_dir} (the recipe says "
                 f"{recipe.model.vocab_size})")
    return recipe.with_overrides([f"model.vocab_size={size}"])


def _lookup(recipe: Recipe, assignment: str):
    section, name = assignment.split("=", 1)[0].strip().split(".", 1)
    return getattr(getattr(recipe, section), name)


# ----------------------------------------------------------------------------------------------------------------
# the run directory: always continuable or restartable, never emptied without --force

DERIVED = ("glue", "tensorboard", "report.md", "report.json", "glue_vs_compute.png", "pretraining_curves.png")
# the names train writes in its folder: no other command may take one as its own folder while train holds the run's
TRAIN_WRITES = (*RUN_FILES, DATASET_FILE, "state", "data", "tensorboard", "ckpt-*")
# what `--resume --set` may change (a diverged run continued at a lower learning rate): the peak learning rate (the
# schedule's shape and steps stay the plan's) and the clipping norm, both read afresh at every step and held in no
# saved state. Recorded: plan.json's and summary.json's `resumed_with_changes`, metrics.jsonl, the report. The
# runtime settings (config.RUNTIME_SETTINGS: the micro-batch, gradient checkpointing, ...) never tell two runs apart;
# a --resume that changes them records `resumed_with_runtime_changes` instead.
CHANGEABLE_ON_RESUME = ("optim.lr", "optim.clip_norm")


def open_run_dir(run_dir: Path, resume: bool, force: bool, recipe: Recipe, bud: budgeting.Budget,
                 console) -> tuple[str, dict | None]:
    """What to do with --out: "start" (a new run), "resume" (continue from its resume state), or "done" (the same
    finished run: nothing to do), and with "resume" the resume state's trainer.json (else None), read and its files
    checked here once for the whole command (checkpoint.read_state_info). A run that stopped before its first resume
    state starts again from step 0, with or without --resume, keeping the checkpoints it wrote until the new run writes
    them again. --force deletes the earlier run first (what the run folder's records list: runfolder.delete_run);
    nothing else here deletes anything. Raises UserError when --out holds another run or cannot be written."""
    say = lambda text: console.print(f"[dim]·[/dim] {text}", highlight=False)  # noqa: E731
    if resume and not run_dir.exists():
        raise UserError(f"--resume: {run_dir} does not exist (nothing to continue; drop --resume to start a new run)")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--out {run_dir}: exists and is not a directory")
    items = sorted(p for p in run_dir.iterdir() if p.name not in BOOKKEEPING) if run_dir.is_dir() else []
    ckpts = sorted((p.name for p in items if p.is_dir() and CKPT_NAME.match(p.name)), key=lambda n: int(n[5:]))
    has_run = any((run_dir / n).exists() for n in (*RUN_FILES, "state")) or bool(ckpts)
    recorded = (run_dir / RECORD_NAME).is_file()  # written by this version, which records what it writes
    if recorded:  # what the record lists, and folders other tinyelectra commands write (a record or lock of their own)
        files, dirs = covered(run_dir, DERIVED_BY)
        ours = {p.relative_to(run_dir).parts[0] for p in (*files, *(d for d in dirs if not any(d.iterdir())))}
        others = [p for p in items if p.name not in ours and not (p.is_dir() and set(os.listdir(p)) & set(BOOKKEEPING))]
    else:  # written before records existed: by the names and kinds train writes
        others = [p for p in items if not _written_by_train(p)]
    # a name the run writes, holding something else: never replaced unasked
    taken = [p.name for p in others if p.name in TRAIN_WRITES or CKPT_NAME.match(p.name)]
    if taken:
        raise UserError(f"--out {run_dir}: {taken[0]} is not what tinyelectra writes under that name, and the run "
                        "would replace it; move it away, or choose another --out")
    if others and not has_run:
        what = ("a prepared dataset (give it as --data)" if (run_dir / "manifest.json").is_file() else
                f"files that are not a tinyelectra run ({', '.join(p.name for p in others[:3])}"
                f"{f' and {len(others) - 3} more' if len(others) > 3 else ''})")
        raise UserError(f"--out {run_dir}: holds {what}; a run goes into a new or empty folder, or its own")
    if force and has_run:
        if not recorded:
            raise UserError(f"--force: {run_dir} was written by an earlier tinyelectra, which kept no record of the "
                            f"files it wrote ({RECORD_NAME}), and --force deletes only what a record lists: delete the "
                            "earlier run yourself, or choose another --out")
        for name in (budgeting.checkpoint_name(f) for f in budgeting.FRACTIONS):  # what the new run writes again
            if mine := foreign(run_dir, run_dir / name, ("train",)) if (run_dir / name).is_dir() else []:
                raise UserError(f"--force: {run_dir / name} holds {mine[0].relative_to(run_dir)}"
                                f"{f' and {len(mine) - 1} more' if len(mine) > 1 else ''}, which the run's record does "
                                f"not list, and the new run writes {name} again: move it away first (nothing was "
                                "deleted)")
        deleted, kept = delete_run(run_dir)  # --corpus data (prepare's) is checked, not deleted
        more = f" and {len(kept) - 12} more" if len(kept) > 12 else ""
        kept_text = f"; kept everything else: {', '.join(kept[:12])}{more}" if kept else ""
        say(f"--force: deleted the earlier run in {run_dir} ({', '.join(deleted)}){kept_text}")
        has_run, ckpts = False, []
    check_writable(run_dir, "--out")
    if not has_run:
        if resume:
            raise UserError(f"--resume: {run_dir} holds no run (nothing to continue; drop --resume to start one)")
        return "start", None

    state_dir = latest_state(run_dir)
    strict = state_dir is not None  # a run with a resume state must be checked exactly; one without can restart
    saved_recipe = _read_record(run_dir / "recipe.json", strict)
    saved_plan = _read_record(run_dir / "plan.json", strict)
    if saved_recipe is not None:
        try:
            saved_recipe = comparable_settings(saved_recipe, str(run_dir / "recipe.json"))
        except UserError:
            if strict:
                raise
            saved_recipe = None
    info = read_state_info(state_dir) if state_dir is not None else None
    total = ((info or {}).get("plan") or saved_plan or {}).get("total_steps")
    finished = info is not None and (run_dir / "summary.json").is_file() and total is not None and info["step"] >= total
    continuing = resume and info is not None and not finished  # may change CHANGEABLE_ON_RESUME
    if info is not None:  # the recipe in effect at the resume state: an earlier --resume may have changed it
        saved_recipe = comparable_settings(info["recipe"], str(state_dir / "trainer.json"))
    mismatch = _run_mismatch(run_dir, saved_recipe, saved_plan, recipe, bud,
                             changeable=RUNTIME_SETTINGS + (CHANGEABLE_ON_RESUME if continuing else ()))
    if mismatch and (info is not None or resume or ckpts):
        may = (f" (--resume may change only {' and '.join(CHANGEABLE_ON_RESUME)}, and how the steps are computed: "
               f"{', '.join(RUNTIME_SETTINGS)})") if continuing else ""
        raise UserError(f"{'--resume: ' if resume else ''}{mismatch}; use the same --recipe, --set and --budget{may}, "
                        "choose another --out, or start over with --force")
    if info is None:  # it stopped during start-up, before its first resume state
        if mismatch:  # nothing of value there: this command's run replaces it
            say(f"{run_dir}: an earlier run stopped during start-up, before its first resume state ({mismatch}): "
                "starting this one")
            return "start", None
        kept = f"; kept {', '.join(ckpts)} until the run writes them again" if ckpts else ""
        say(f"{run_dir}: the run stopped before its first resume state (during start-up): starting it again from step "
            f"0{kept}")
        return "start", None
    if finished:
        say(f"{run_dir} already holds this run, finished ({info['step']:,} steps; "
            f"{', '.join(ckpts) or 'no checkpoints'}): nothing to do. To train it again from the start: --force")
        return "done", None
    if not resume:
        raise UserError(f"{run_dir} holds an unfinished run (resume state at step {info['step']:,}"
                        f"{f' of {total:,}' if total else ''}): continue it with --resume, or start over with --force "
                        f"(deletes it)")
    if not recorded:
        say(f"{run_dir} was written by an earlier tinyelectra, which kept no record of its files: the checkpoints and "
            "resume state it wrote stay until you delete them (this run records what it writes from now on)")
    return "resume", info


def _written_by_train(p: Path) -> bool:
    """Whether `p`, in a run folder, is one of the things `train` writes there (by its name and kind; a checkpoint
    folder by its config.json): what --force may delete, and what makes a folder a run's."""
    name, is_dir = p.name, p.is_dir() and not p.is_symlink()
    files = [*RUN_FILES, DATASET_FILE, *(n for n in DERIVED if "." in n)]
    temporary = re.fullmatch(r"\.(.+)\.\w+\.tmp", name)  # write_atomic's, left by a process killed while writing
    if name in files or (temporary and temporary.group(1) in files):
        return p.is_file()
    if name in ("state", "glue", "tensorboard") or re.fullmatch(r"(ckpt-\d{4,5}|state|data)\.(tmp|old)-\d+", name):
        return is_dir
    if name == "data":  # --corpus, prepared into the run
        return is_dir and (p / "manifest.json").is_file()
    return is_dir and CKPT_NAME.match(name) is not None and is_checkpoint(p)


def _read_record(path: Path, strict: bool) -> dict | None:
    """recipe.json / plan.json of a run: a dict; None when absent or unreadable and not `strict`; else a UserError."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        return d
    except (ValueError, UnicodeDecodeError, OSError) as e:
        if strict:
            what = "missing" if isinstance(e, FileNotFoundError) else f"damaged ({str(e)[:120]})"
            raise UserError(f"{path}: {what}; the run cannot be checked against this command (restore it, or start "
                            "over with --force)") from None
    return None


def _run_mismatch(run_dir: Path, saved_recipe: dict | None, saved_plan: dict | None, recipe: Recipe,
                  bud: budgeting.Budget, changeable: tuple[str, ...] = ()) -> str | None:
    """Why this command is not the run in `run_dir` (another recipe, --set or budget), naming both; None if it is.
    `saved_recipe` is `comparable_settings`'s; differences in the `changeable` keys do not count."""
    if saved_recipe is not None:
        now = comparable_settings(recipe.to_dict(), "--set")
        found = [d for d in differences(saved_recipe, now) if d[0] not in changeable]
        if found:
            there, here = saved_recipe.get("name"), now.get("name")
            how = ", this command gives recipe" if there != here else " with other settings than this command's recipe"
            return f"{run_dir} was trained with recipe {there!r}{how} {here!r} ({difference_text(found[0])})"
    if saved_plan is not None and saved_plan.get("budget") != bud.text:
        return f"{run_dir} was planned for --budget {saved_plan.get('budget')}, this command gives --budget {bud.text}"
    return None



def resolve_data(data_dir: Path | None, corpus: list[str] | None, recipe: Recipe, run_dir: Path, dist: Dist,
                 force: bool = False) -> Path:
    """--data as given; --corpus prepared into RUN/data; neither: the built-in corpus, prepared once and cached."""
    from tinyelectra.prepare import prepare

    if data_dir is not None and corpus:
        raise UserError("give either --data or --corpus, not both")
    if data_dir is not None:
        return data_dir
    if corpus:
        target, sources = run_dir / "data", list(corpus)
    else:
        cache = Path(os.environ.get("TINYELECTRA_CACHE", Path.home() / ".cache" / "tinyelectra"))
        tag = f"builtin-v{recipe.model.vocab_size}-t{recipe.train.seq_len}-{recipe.data.casing}"
        target, sources = cache / tag, ["builtin"]
    cache_dir = not corpus or force  # our own cache: a stale one (older settings) is simply rebuilt
    if dist.main:
        prepare(
            sources=sources, out_dir=target, tokenizer_path=recipe.data.tokenizer or None,
            vocab_size=recipe.model.vocab_size, seq_len=recipe.train.seq_len, casing=recipe.data.casing,
            workers=0, force=cache_dir, seed=recipe.train.seed, command="(prepared by tinyelectra train)",
            validation_fraction=recipe.data.validation_fraction,
        )
    if dist.enabled and torch.distributed.is_initialized():
        torch.distributed.barrier()
    return target



# ----------------------------------------------------------------------------------------------------------------
# the loop


def train(recipe: Recipe, bud: budgeting.Budget, data_dir: Path, run_dir: Path, device: torch.device,
          resume: bool = False, dist: Dist = Dist(), command: str = "", init: Path | None = None,
          overridden: list[str] | None = None, clock: Callable[[], float] = time.perf_counter,
          stops: list[budgeting.Stop] | None = None, initial_checkpoint: bool = False,
          state: dict | None = None) -> dict:
    """Pre-train `recipe` within `bud` on the prepared data, stopping early at the first of `stops` reached
    (--stop-after); see the module docstring. `overridden` notes the command line's `--set` changes: they are
    written into recipe.json's deviations, so reports show them. `initial_checkpoint`: write ckpt-0000, the weights
    at step 0. `clock` measures training time (tests pass a simulated one to change the speed at will). `state`: on
    `resume`, the resume state's trainer.json as train_command read and checked it (open_run_dir); read here if not
    given."""
    launch = Launch(recipe, bud, stops or [], run_dir, device, dist, command, clock)  # the run before its set-up
    # --- set-up, plan, resume: out of memory or an interruption here is one line saying what is kept
    # -------------------
    with launch.failures_during_startup(resume):
        state = (state or read_state_info(latest_state(run_dir))) if resume else None  # the resume state's record
        p = set_up(launch, data_dir, init, state)  # the data, the model, its optimizer and step, this process's loader
        # a new plan (recipe.json, plan.json) or the resume state's; ckpt-0000 if asked; a resume state
        run = RunState.begin(launch, p, state, overridden, initial_checkpoint)

    # --- loop ---------------------------------------------------------------------------------------------------------
    stop = StopFlag()
    p.model.train()
    stopped_by = ""  # the --stop-after that ends this command before the schedule's end
    with run.failures_in_loop():  # divergence, an interruption, out of memory, a full disk: one line each
        while not run.plan.finished(run.step) and not stopped_by:
            # one optimizer step: this process's rows of the global batch, split into micro-batches
            masked, seeds = mask_step(next(p.loader), recipe, p.special, run.step, dist.rank * p.rank_batch, p.micro,
                                      p.accum)
            counts = global_counts(masked, dist)
            lr = run.lr_at(run.step)  # the schedule's formula (optim.lr_at)
            p.optimizer.set_lr(lr)
            train_step(p.engine, masked, seeds, counts, p.autocast, run.sums)
            run.step += 1
            run.real_tokens += counts[1].long()  # the global batch's real tokens (all-reduced above)

            run.time_step()  # the first step is start-up; after it, training time accumulates
            if run.planner is not None:  # a time budget: re-planned when its end moved off the budget
                run.replan()
            if run.step % recipe.train.log_every_steps == 0 or run.plan.finished(run.step):
                run.log_window(lr)  # one metrics.jsonl line (host sync); its losses must be finite
            stopped_by = run.stop_reached()  # --stop-after: this command ends here (the run continues with --resume)
            # fraction checkpoints, each on its own step, and one where a --stop-after ends the run; a resume state
            # every train.resume_every_seconds, after a checkpoint, on a stop and at the end. Neither is training time
            run.write_due(stop.requested, stopped_by)
            if stop.requested:  # the step is done and its resume state written: out, saying how to continue
                run.stopped = f"stopped by {stop.signal_name}"
                dist.leave()
                raise Interrupted(stop.signal_name)

    # --- finish -------------------------------------------------------------------------------------------------------
    return run.finish(stopped_by)  # summary.json, plan.json as it ended, and what to run next


def set_up(launch: Launch, data_dir: Path, init: Path | None, state: dict | None) -> Parts:
    """What the loop trains with: the prepared data (checked; on a resume, against the resume state `state`, its
    trainer.json), the model (the recipe's seed; --init's weights on a new run), its optimizer and loss scaler, the
    micro-batch that fits (`launch.micro` as soon as it is known: what a failed allocation was for), the step's Engine
    (compiled now: start-up), this process's loader. Each choice is a log line."""
    resume = state is not None
    recipe, device, dist, log = launch.recipe, launch.device, launch.dist, launch.log
    tr = recipe.train
    log.once(runtime.set_deterministic(tr.deterministic))  # before the first GPU work (train_command did it earlier)
    log.once(runtime.tune_cpu() if device.type == "cpu" else "")
    cpu_threads_line, cpu_threads = runtime.openmp_note()
    log.once(cpu_threads_line if device.type == "cpu" else "")
    data = PretrainData(data_dir)
    _check_data(data, recipe, data_dir, dist.main)
    if resume and dist.main:  # the data the run trained on, file by file, or one line naming both
        log.once(check_data(launch.run_dir, data, state))
    log.once(f"warning: {data_dir}: {heldout}"
             if (heldout := heldout_warning(data.num_rows("validation"), None)) else "")
    special = SpecialIds.from_tokenizer(data.tokenizer)
    precision, precision_reason = runtime.pick_precision(tr.precision, device)
    log.once(f"precision: {precision} ({precision_reason}); {runtime.configure_matmul(precision, device)}")
    if tr.batch_size % dist.world:
        raise UserError(f"train.batch_size {tr.batch_size} is not divisible by {dist.world} processes")
    rank_batch = tr.batch_size // dist.world

    torch.manual_seed(tr.seed)
    model = Electra(recipe.model, recipe.objective.kind)
    if init is not None and not resume:
        model.load_state_dict(initial_weights(init, recipe).state_dict())
        log.once(f"initial weights: {init} (continued pre-training)")
    model = model.to(device)
    model.set_grad_checkpointing(tr.grad_checkpointing)
    optimizer = build_optimizer(model, recipe.optim, device.type)
    if recipe.optim.name != "adam":
        log.once(f"optimizer: {recipe.optim.name} — OFF-RECIPE (the paper's Adam has no bias correction)")
    scaler = torch.amp.GradScaler(device.type, enabled=(precision == "fp16"))
    probe = PretrainStep(model, recipe)
    micro = launch.micro = fit_micro_batch(tr.micro_batch_size, rank_batch, device,
                                        lambda mb: probe_step(probe, model, special, recipe, mb, device, precision))
    accum = rank_batch // micro
    engine = Engine(model, recipe, optimizer, scaler, dist, device, precision, micro, accum)
    compiled = engine.compile_now(special)  # a failure in forward, backward or update falls back to eager
    log.once(f"{engine.strategy_note}; {engine.compile_note}")  # the mode that runs, and why
    log.once(compiled.pop("line"))  # how long compiling took, and where its cache is
    log.once(engine.host_sync_note or "")
    log.once(engine.weight_note)
    attention = attention_kernel(recipe.model, micro, tr.seq_len, device, runtime.autocast_dtype(precision, device),
                                 compiled=engine.compile_note.startswith("compile: torch.compile"),
                                 attention=tr.attention)
    log.once(attention["summary"])
    log.once(f"batch: {tr.batch_size} sequences x {tr.seq_len} tokens per step = {dist.world} process(es) x "
             f"{accum} micro-batch(es) of {micro}")
    loader = BatchLoader(data, "train", tr.batch_size, tr.seed, device=device,
                         row_range=(dist.rank * rank_batch, (dist.rank + 1) * rank_batch))
    return Parts(data=data, special=special, precision=precision, autocast=runtime.autocast_context(precision, device),
                 model=model, optimizer=optimizer, scaler=scaler, engine=engine, loader=loader, rank_batch=rank_batch,
                 micro=micro, accum=accum, compiled=compiled, attention=attention, cpu_threads=cpu_threads)


def initial_weights(path: Path, recipe: Recipe) -> Electra:
    """Weights to continue pre-training from: our checkpoint, an export directory, or a transformers directory."""
    from tinyelectra.hf import electra_from_hf

    path = Path(path)
    if not path.exists():
        raise UserError(f"--init {path}: no such file or directory")
    if recipe.objective.kind != "electra":
        raise UserError("--init continues ELECTRA pre-training; the recipe's objective is not electra")
    if is_checkpoint(path):
        model, ckpt_recipe, _ = load_checkpoint(path)
        if ckpt_recipe.model != recipe.model:
            first = differences(dataclasses.asdict(ckpt_recipe.model), dataclasses.asdict(recipe.model), "model")[0]
            raise UserError(f"--init {path}: {difference_text(first)}")
        return model
    export = (path / "discriminator").is_dir()  # a `tinyelectra export` directory
    gen = path / "generator" if export and (path / "generator").is_dir() else None
    model, _ = electra_from_hf(path / "discriminator" if export else path, gen, cfg=recipe.model)
    if model.cfg.sharing != recipe.model.sharing:
        raise UserError(f"--init {path}: its generator and discriminator embeddings are "
                        f"{'not ' if model.cfg.sharing == 'none' else ''}shared, the recipe says sharing = "
                        f"{recipe.model.sharing!r}")
    return model


def _check_data(data, recipe: Recipe, data_dir: Path, main: bool) -> None:
    if data.vocab_size != recipe.model.vocab_size:
        raise UserError(
            f"{data_dir} was prepared with a {data.vocab_size}-entry tokenizer but recipe {recipe.name} has "
            f"model.vocab_size = {recipe.model.vocab_size}; prepare again with --vocab-size "
            f"{recipe.model.vocab_size} or --set model.vocab_size={data.vocab_size}")
    if data.seq_len != recipe.train.seq_len:
        raise UserError(
            f"{data_dir} holds {data.seq_len}-token examples but recipe {recipe.name} trains on train.seq_len = "
            f"{recipe.train.seq_len}; prepare again with --seq-len {recipe.train.seq_len} or --set "
            f"train.seq_len={data.seq_len}")
    if data.num_rows("train") < recipe.train.batch_size:
        raise UserError(f"{data_dir} has {data.num_rows('train')} training examples, fewer than one batch of "
                        f"{recipe.train.batch_size}")
    if main:  # every shard's bytes read now: a damaged one stops the set-up, not step 1 or the first checkpoint
        data.check_files()


# ----------------------------------------------------------------------------------------------------------------
# signals


class StopFlag:
    """SIGINT / SIGTERM ask the loop to finish its step, save a resume state and exit; a second SIGINT aborts."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise Interrupted("SIGINT")
        self.requested = True
        self.signal_name = signal.Signals(signum).name
