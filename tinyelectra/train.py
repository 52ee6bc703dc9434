"""Pre-training within a budget: the loop, visible in one function (`train`), and the command around it.

Sections of `train`: set-up -> plan -> resume -> loop -> finish. The loop, one step at a time: `mask_step`,
`global_counts`, the learning rate, `train_step` (step.py: the step, its Engine, compile and CUDA-graph policy;
benchmarks/throughput.py times the same), the clocks, the time
budget's re-plan, a log line, the fraction checkpoints (checkpoint.due_checkpoints) and resume states that are due.
The resume state holds everything needed to continue exactly; all randomness of a step is derived from (seed, step,
first global row of the micro-batch), so a resumed, an accumulating and a DDP run draw the same for the same rows.

Divergence guard, without a per-step host sync: the losses are checked where they are read anyway (each log step),
and the window's losses and the weights before every checkpoint and resume state is written; a non-finite one stops
the run (`Diverged`, exit code 3) before anything is written from it, naming what was kept and what to try. fp16's
loss scaler still skips steps whose gradients overflow: an inf gradient is not a non-finite loss.
Host syncs: log steps, checkpoints and resume states, and the device is waited for at the end of the first step and
of a time budget's calibration steps (host clocks otherwise time kernel launches); fp16 adds the loss scaler's
overflow check on every step where the update runs eager (step.Engine.host_sync_note; under CUDA graphs the scaler
runs on the device), and its speed figures say so. Compiling (step.Engine.compile_now) is start-up.

Time budgets count training time: steps, data loading and logging. Excluded (reported apart): start-up (data
preparation, building the model, compilation and the first step, at learning rate 0), and writing checkpoints, their
held-out evaluation and resume states. summary.json: `train_seconds` (the budget's clock, the whole run's; a
checkpoint's meta.json holds it at its step), `excluded_seconds` (the whole run's), and `process_seconds`
(`ProcessSeconds`: this process's parts, never more than its wall time in `train`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from tinyelectra import budget as budgeting
from tinyelectra import flops, runtime
from tinyelectra.budget import Plan, make_plan, parse_budget
from tinyelectra.checkpoint import (
    CKPT_NAME, due_checkpoints, is_checkpoint, latest_state, load_checkpoint, load_resume_state, read_state_info,
    save_checkpoint, save_resume_state,
)
from tinyelectra.config import RUNTIME_SETTINGS, Recipe, difference_text, differences, load_recipe, recipe_from_dict
from tinyelectra.data import BatchLoader, PretrainData, heldout_warning
from tinyelectra.diagnostics import checkpoint_line, evaluate, unigram_distribution
from tinyelectra.electra import STAT_KEYS, SpecialIds, summarize
from tinyelectra.errors import Diverged, Interrupted, UserError
from tinyelectra.files import check_writable, os_error_line, path_part, write_json
from tinyelectra.logs import Log, Progress, make_console, median_tokens_per_second
from tinyelectra.model import Electra, attention_kernel, count_parameters
from tinyelectra.optim import build_optimizer, lr_at
from tinyelectra.runfolder import DATASET_FILE, LOCK_NAME, check_data, data_record, holding, record_data, user_of
from tinyelectra.runtime import device_name
from tinyelectra.step import (
    Dist, Engine, PretrainStep, fit_micro_batch, global_counts, mask_step, new_sums, probe_step, train_step,
)

# ----------------------------------------------------------------------------------------------------------------
# processes


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




# ----------------------------------------------------------------------------------------------------------------
# the command


def train_command(
    budget: str, data_dir: Path | None, corpus: list[str] | None, recipe_name: str, gpu: int | None,
    device: str | None, out_dir: Path | None, resume: bool, overrides: list[str], command: str,
    init: Path | None = None, force: bool = False,
) -> dict | None:
    dist = Dist.from_env()
    bud = parse_budget(budget)
    recipe = load_recipe(recipe_name, overrides)
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
    with holding(run_dir, "--out", enabled=dist.main and (run_dir.exists() or not resume)):
        mode = open_run_dir(run_dir, resume, force, recipe, bud, make_console()) if dist.main else None
        if dist.enabled and torch.distributed.is_initialized():  # every process does what rank 0 decided
            shared = [mode]
            torch.distributed.broadcast_object_list(shared, 0)
            mode = shared[0]
        if mode == "done":
            dist.leave()
            return None
        data_path = resolve_data(data_dir, corpus, recipe, run_dir, dist, force=force)
        if corpus and not notes and mode != "resume":  # --corpus with the recipe's data.tokenizer: its vocabulary decides too
            recipe = adopt_data_vocab(recipe, data_path, overrides, notes)
        if dist.main and mode == "resume" and (unchecked := check_data(run_dir, PretrainData(data_path))):
            print(f"· {unchecked}", file=sys.stderr)  # else the data the run trained on, or one line naming both
        if dist.main:
            for note in notes:
                print(f"· {note}", file=sys.stderr)
        base = load_recipe(recipe_name)
        overridden = [f"command line: --set {o} (the recipe says {_lookup(base, o)!r})" for o in overrides] + notes
        if recipe.optim.name != "adam":
            overridden.append(f"OFF-RECIPE optimizer {recipe.optim.name}: bias-corrected AdamW, not the paper's Adam "
                              "without bias correction")
        return train(recipe, bud, data_path, run_dir, dev, resume=(mode == "resume"), dist=dist, command=command,
                     init=init, overridden=overridden)


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

RUN_FILES = ("plan.json", "recipe.json", "summary.json", "metrics.jsonl")  # written by train (with state/, ckpt-*)
DERIVED = ("glue", "tensorboard", "report.md", "report.json", "glue_vs_compute.png", "pretraining_curves.png")
FRACTION_OF = {budgeting.checkpoint_name(f): f for f in budgeting.FRACTIONS}  # "ckpt-0625": 0.0625, ...
# what `--resume --set` may change (a diverged run continued at a lower learning rate): the peak learning rate (the
# schedule's shape and steps stay the plan's) and the clipping norm, both read afresh at every step and held in no
# saved state. Recorded: plan.json's and summary.json's `resumed_with_changes`, metrics.jsonl, the report. The
# runtime settings (config.RUNTIME_SETTINGS: the micro-batch, gradient checkpointing, ...) never tell two runs apart;
# a --resume that changes them records `resumed_with_runtime_changes` instead.
CHANGEABLE_ON_RESUME = ("optim.lr", "optim.clip_norm")


def open_run_dir(run_dir: Path, resume: bool, force: bool, recipe: Recipe, bud: budgeting.Budget, console) -> str:
    """What to do with --out: "start" (a new run), "resume" (continue from its resume state), or "done" (the same
    finished run: nothing to do). A run that stopped before its first resume state starts again from step 0, with or
    without --resume, keeping the checkpoints it wrote until the new run writes them again. --force deletes the earlier
    run first; nothing else here deletes anything. Raises UserError when --out holds another run or cannot be written."""
    say = lambda text: console.print(f"[dim]·[/dim] {text}", highlight=False)  # noqa: E731
    if resume and not run_dir.exists():
        raise UserError(f"--resume: {run_dir} does not exist (nothing to continue; drop --resume to start a new run)")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--out {run_dir}: exists and is not a directory")
    items = sorted(p for p in run_dir.iterdir() if p.name != LOCK_NAME) if run_dir.is_dir() else []
    ckpts = sorted((p.name for p in items if p.is_dir() and CKPT_NAME.match(p.name)), key=lambda n: int(n[5:]))
    has_run = any((run_dir / n).exists() for n in (*RUN_FILES, "state")) or bool(ckpts)
    others = [p for p in items if not _written_by_train(p)]
    taken = [p.name for p in others if p.name in (*RUN_FILES, *DERIVED, "state", "data", DATASET_FILE)
             or CKPT_NAME.match(p.name)]  # a name the run writes, holding something else: never replaced unasked
    if taken:
        raise UserError(f"--out {run_dir}: {taken[0]} is not what tinyelectra writes under that name, and the run would "
                        "replace it; move it away, or choose another --out")
    if others and not has_run:
        what = ("a prepared dataset (give it as --data)" if (run_dir / "manifest.json").is_file() else
                f"files that are not a tinyelectra run ({', '.join(p.name for p in others[:3])}"
                f"{f' and {len(others) - 3} more' if len(others) > 3 else ''})")
        raise UserError(f"--out {run_dir}: holds {what}; a run goes into a new or empty folder, or its own")
    if force and has_run:
        removed = [p for p in items if p not in others and p.name != "data"]  # --corpus data is checked, not deleted
        for p in removed:  # RUN/glue while `tinyelectra glue` writes it
            if p.is_dir() and (user := user_of(p)):
                raise UserError(f"--force: {p} is in use by {user}; wait for it, or stop it, before starting over")
        for p in removed:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        kept = f"; kept what it did not write: {', '.join(p.name for p in others)}" if others else ""
        say(f"--force: deleted the earlier run in {run_dir} ({', '.join(p.name for p in removed)}){kept}")
        has_run, ckpts = False, []
    check_writable(run_dir, "--out")
    if not has_run:
        if resume:
            raise UserError(f"--resume: {run_dir} holds no run (nothing to continue; drop --resume to start one)")
        return "start"

    state_dir = latest_state(run_dir)
    strict = state_dir is not None  # a run with a resume state must be checked exactly; one without can restart
    saved_recipe = _read_record(run_dir / "recipe.json", strict)
    saved_plan = _read_record(run_dir / "plan.json", strict)
    if saved_recipe is not None:
        try:
            saved_recipe = _settings(saved_recipe, str(run_dir / "recipe.json"))
        except UserError:
            if strict:
                raise
            saved_recipe = None
    info = read_state_info(state_dir) if state_dir is not None else None
    total = ((info or {}).get("plan") or saved_plan or {}).get("total_steps")
    finished = info is not None and (run_dir / "summary.json").is_file() and total is not None and info["step"] >= total
    continuing = resume and info is not None and not finished  # may change CHANGEABLE_ON_RESUME
    if info is not None:  # the recipe in effect at the resume state: an earlier --resume may have changed it
        saved_recipe = _settings(info["recipe"], str(state_dir / "trainer.json"))
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
            return "start"
        kept = f"; kept {', '.join(ckpts)} until the run writes them again" if ckpts else ""
        say(f"{run_dir}: the run stopped before its first resume state (during start-up): starting it again from step 0{kept}")
        return "start"
    if finished:
        say(f"{run_dir} already holds this run, finished ({info['step']:,} steps; {', '.join(ckpts) or 'no checkpoints'}): "
            "nothing to do. To train it again from the start: --force")
        return "done"
    if not resume:
        raise UserError(f"{run_dir} holds an unfinished run (resume state at step {info['step']:,}"
                        f"{f' of {total:,}' if total else ''}): continue it with --resume, or start over with --force "
                        f"(deletes it)")
    return "resume"


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
    `saved_recipe` is `_settings`'s; differences in the `changeable` keys do not count."""
    if saved_recipe is not None:
        now = _settings(recipe.to_dict(), "--set")
        found = [d for d in differences(saved_recipe, now) if d[0] not in changeable]
        if found:
            there, here = saved_recipe.get("name"), now.get("name")
            how = ", this command gives recipe" if there != here else " with other settings than this command's recipe"
            return f"{run_dir} was trained with recipe {there!r}{how} {here!r} ({difference_text(found[0])})"
    if saved_plan is not None and saved_plan.get("budget") != bud.text:
        return f"{run_dir} was planned for --budget {saved_plan.get('budget')}, this command gives --budget {bud.text}"
    return None


def _settings(raw: dict, where: str) -> dict:
    """A recipe's settings as two runs are compared: as this version writes them (older key names read as their new
    ones), in JSON's types, without the deviations (recipe.json's also list the --set changes)."""
    settings = json.loads(json.dumps(recipe_from_dict(raw, where=where).to_dict()))
    settings.pop("deviations")
    return settings


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
          overridden: list[str] | None = None, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Pre-train `recipe` within `bud` on the prepared data; see the module docstring. `overridden` notes the
    command line's `--set` changes: they are written into recipe.json's deviations, so reports show them. `clock`
    measures training time (tests pass a simulated one to change the speed at will)."""
    tr = recipe.train
    log = Log(run_dir, dist.main)
    startup_t0 = clock()  # train()'s entry: start-up and this process's wall time count from here
    process_seconds = ProcessSeconds()
    continue_with = _rerun_command(command, run_dir, ["--resume"])  # the command that continues this run
    step, state_saved = 0, None  # the last resume state written by this process (its step and directory)
    micro: int | None = None  # sequences per micro-batch, once the model is built (what a failed allocation was for)
    try:
        # --- set-up ---------------------------------------------------------------------------------------------
        log.once(runtime.set_deterministic(tr.deterministic))  # before the first GPU work (train_command did it earlier)
        log.once(runtime.tune_cpu() if device.type == "cpu" else "")
        cpu_threads_line, cpu_threads = runtime.openmp_note()
        log.once(cpu_threads_line if device.type == "cpu" else "")
        data = PretrainData(data_dir)
        _check_data(data, recipe, data_dir)
        log.once(f"warning: {data_dir}: {heldout}" if (heldout := heldout_warning(data.num_rows("validation"), None)) else "")
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
        micro = fit_micro_batch(tr.micro_batch_size, rank_batch, device,
                                lambda mb: probe_step(probe, model, special, recipe, mb, device, precision))
        accum = rank_batch // micro
        engine = Engine(model, recipe, optimizer, scaler, dist, device, precision, micro, accum)
        compiled = engine.compile_now(special)  # a failure in forward, backward or update falls back to eager
        log.once(f"{engine.strategy_note}; {engine.compile_note}")  # the mode that runs, and why
        log.once(compiled.pop("line"))  # how long compiling took, and where its cache is
        log.once(engine.host_sync_note or "")
        attention = attention_kernel(recipe.model, micro, tr.seq_len, device, runtime.autocast_dtype(precision, device),
                                     compiled=engine.compile_note.startswith("compile: torch.compile"))
        log.once(attention["summary"])
        log.once(f"batch: {tr.batch_size} sequences x {tr.seq_len} tokens per step = {dist.world} process(es) x "
                 f"{accum} micro-batch(es) of {micro}")
        loader = BatchLoader(data, "train", tr.batch_size, tr.seed, device=device,
                             row_range=(dist.rank * rank_batch, (dist.rank + 1) * rank_batch))

        # --- plan: a new one, or the one the resume state holds ---------------------------------------------------
        if dist.main:  # what an interrupted write left behind (never renamed into place, so never loadable)
            for stale in [*run_dir.glob("*.tmp-*"), *(run_dir / "state").glob("*.tmp-*")]:
                shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
        sums = new_sums(device)  # the current log window's metric sums
        window_step = 0  # the step the current log window started after
        if resume:
            if tr.strategy == "deepspeed":
                raise UserError("--resume is not supported with train.strategy=deepspeed yet (its optimizer state has "
                                "no plain, safely loadable format); the fraction checkpoints are complete and usable")
            state_dir = latest_state(run_dir)
            state = load_resume_state(state_dir, model, optimizer, scaler, loader, device)
            plan = (Plan.from_dict(state["plan"], str(state_dir / "trainer.json")) if "plan" in state
                    else Plan.load(run_dir / "plan.json"))
            if plan.budget != bud.text:
                raise UserError(f"--resume: {run_dir} was planned for --budget {plan.budget}, not {bud.text}")
            step, tokens_seen, train_seconds = state["step"], state["tokens_seen"], state["train_seconds"]
            other_seconds, done_ckpts = state["other_seconds"], set(state["checkpoints"])
            window = state.get("window") or {"step": step, "sums": {}}
            window_step = window["step"]
            for k, v in window["sums"].items():  # the log window the interruption cut: its first steps' sums
                sums[k].fill_(v)
            state_saved = (step, state_dir)
            log.truncate_after(step)
            log.once(f"resumed from step {step} ({train_seconds:.1f} s of training time spent)")
            found = [{"step": step, "key": key, "old": old, "new": new} for key, old, new in differences(
                _settings(state["recipe"], str(state_dir / "trainer.json")), _settings(recipe.to_dict(), "--set"))]
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
            later = [n for n in plan.checkpoint_steps if n not in done_ckpts and (run_dir / n).is_dir()]
            if later:
                log.once(f"{', '.join(later)}: written after this resume state; kept until the run writes them again")
        else:
            plan = make_plan(bud, recipe)
            step, tokens_seen, train_seconds, other_seconds, done_ckpts = 0, 0, 0.0, 0.0, set()
            changes, runtime_changes = [], []
            if dist.main:  # the run directory appears only now, when the set-up has accepted everything
                run_dir.mkdir(parents=True, exist_ok=True)
                log.truncate_after(0)  # a run that stopped during start-up and starts again
                saved = recipe.to_dict()
                saved["deviations"] = saved["deviations"] + list(overridden or [])
                write_json(run_dir / "recipe.json", saved)
                plan.save(run_dir / "plan.json")
        if dist.main:  # the data it trains on (runfolder.check_data compares a --resume's with it)
            record_data(run_dir, data)

        def check_before_writing() -> None:
            """`check_finite` before a checkpoint or resume state: the weights, and the losses of the log window in
            progress (one process only: under DDP the windows' losses are checked at log steps, all-reduced, and a
            process's own window, read here, could stop it alone)."""
            pair = [] if dist.enabled else torch.stack([sums["mlm_sum"], sums["disc_sum"]]).tolist()  # host sync
            check_finite(dict(zip(("gen_loss", "disc_loss"), pair)), weights=True)

        # tokens_seen counts real tokens (attention mask), not padding: summed on the device, read at host syncs
        tokens_base, real_tokens = tokens_seen, torch.zeros((), dtype=torch.int64, device=device)
        seen = lambda: tokens_base + int(real_tokens.item())  # noqa: E731  (host sync: log steps, checkpoints, states)

        loss_names = {"gen_loss": "generator (MLM) loss" if recipe.objective.kind == "electra" else "MLM loss",
                      "disc_loss": "discriminator (replaced-token detection) loss"}

        def check_finite(losses: dict[str, float], weights: bool, where: str = "") -> None:
            """The divergence guard: `losses` (gen_loss, disc_loss: of the current log window, or `where` they were
            measured) and, with `weights`, the model's parameters must be finite; else Diverged, naming the steps,
            what was kept and what to try."""
            first = window_step + 1
            where = where or (f"in step {step}" if first >= step else f"in steps {first}-{step}")
            bad = [f"the {loss_names[k]} is {v}" for k, v in losses.items() if not math.isfinite(v)]
            what = f"{' and '.join(bad)} {where}" if bad else ""
            if not what and weights and (names := runtime.nonfinite_parameters(model)):
                what = f"the weights hold non-finite values after step {step} ({names[0]}" + (
                    f" and {len(names) - 1} more)" if len(names) > 1 else ")")
            if what:
                lr = lr_at(max(step - 1, 0), recipe.optim.lr, plan.warmup_steps, plan.total_steps or math.inf)
                message = _diverged_line(what, lr, recipe.optim.lr, state_saved, done_ckpts, run_dir, command)
                log.metrics({"event": "diverged", "step": step, "message": message})
                raise Diverged(message)

        def save_state() -> None:
            """A resume state holding everything the loop needs to continue exactly (rank 0; not with DeepSpeed),
            never of non-finite weights or after a non-finite loss (`check_finite`: every process, the same answer)."""
            nonlocal state_saved
            check_before_writing()
            if dist.main and engine.ds is None:
                window = {"step": window_step, "sums": {k: v.item() for k, v in sums.items()}}  # host sync: state writes only
                state_saved = (step, save_resume_state(
                    run_dir, model, optimizer, scaler, loader, step=step, tokens_seen=seen(),
                    train_seconds=train_seconds, other_seconds=other_seconds, checkpoints=sorted(done_ckpts),
                    plan=plan.to_dict(), window=window, recipe=recipe))

        if not resume or changes or runtime_changes:
            save_state()  # right after start-up (or a change of settings): from here on the run continues so
        for event, these in (("resumed_with_changes", changes), ("resumed_with_runtime_changes", runtime_changes)):
            if these:
                log.metrics({"event": event, "step": step, "changes": these})
        if (changes or runtime_changes) and dist.main:
            plan.save(run_dir / "plan.json")
        log.plan(plan, recipe, model, precision, device, command)
    except RuntimeError as e:  # an allocation that failed: the model's weights, or a GPU probe's micro-batch
        if (asked := allocation_failure(e)) is None:
            raise
        raise UserError(out_of_memory_line(asked, device, recipe, micro, where="during start-up")
                        + _out_of_memory_next(command, run_dir, recipe, micro, resume or state_saved is not None)) from None
    except Interrupted as e:
        where = (f"its resume state ({run_dir / 'state'}) is unchanged; continue with: {continue_with}" if resume
                 else "no resume state yet: run the same command again to start it"
                 + (" (--resume does the same)" if (run_dir / "plan.json").exists() else ""))
        log.once(f"interrupted ({e.signal_name}) during start-up: {where}")
        raise

    # --- loop -----------------------------------------------------------------------------------------------------
    stop = StopFlag()
    last_state_save = clock()
    clock_started = step > 0  # the first step (compilation, allocator warm-up) is start-up, not budget
    clock_t0 = clock()
    if clock_started:  # resumed: start-up ends here, the first step is training time
        process_seconds.startup = clock_t0 - startup_t0
    train_seconds_at_clock = train_seconds
    window_t0, rate_step, window_tokens = clock(), step, seen()  # tokens/s of a log window: over the steps timed in it
    window_records: list[dict] = []  # this process's log lines: the median tokens/s of summary.json
    stopped = ""  # "stopped by SIGTERM" once the loop's own stop is under way
    planner = budgeting.TimeBudgetPlanner(bud, recipe, plan, step) if plan.budget_kind == "time" else None
    share = (lambda rate, seconds: _from_rank0((rate, seconds), device)) if dist.enabled else None
    autocast = runtime.autocast_context(precision, device)
    unigram = None  # the training rows' word frequencies, for the held-out evaluation's baselines
    progress = Progress(plan, step, dist.main, clock=clock)

    def adopt(new_plan: Plan, lines: list[str]) -> Plan:
        """A time budget's re-plan: its lines to the log; plan.json follows the first measurement and speed changes."""
        for line in lines:
            progress.note(line)
        if lines and dist.main:
            new_plan.save(run_dir / "plan.json")
        progress.replan(new_plan)
        return new_plan

    def log_window(lr: float) -> None:
        """One metrics.jsonl line for the steps since the last (host sync only here); a new window starts."""
        nonlocal window_t0, window_step, rate_step, window_tokens
        tokens_seen = seen()  # a host sync: the window's steps are done before the clock is read
        window_seconds = max(clock() - window_t0, 1e-9)
        tok_s = (tokens_seen - window_tokens) / window_seconds  # real tokens
        positions_s = (step - rate_step) * tr.tokens_per_step / window_seconds  # padding included: MFU
        rec = log_record(step, sums, dist, lr, tok_s, tokens_seen, train_seconds, plan, precision, device, positions_s)
        check_finite({k: rec[k] for k in ("gen_loss", "disc_loss") if k in rec}, weights=False)  # read anyway: no extra sync
        log.metrics(rec)
        window_records.append(rec)
        progress.update(step, rec)
        for k in sums:
            sums[k].zero_()
        window_t0, window_step, rate_step, window_tokens = clock(), step, step, tokens_seen

    def write_checkpoint(name: str) -> None:
        """The fraction checkpoint `name` at this step: its held-out evaluation, its directory (rank 0), plan.json."""
        nonlocal unigram
        check_before_writing()  # never a checkpoint of non-finite weights, nor one written after a non-finite loss
        eval_t0 = clock()
        if unigram is None:  # counted once per process
            unigram = unigram_distribution(data, special)
        ev = evaluate(model, data, recipe, special, device, autocast, micro, unigram)
        check_finite({k: ev[k] for k in ("gen_loss", "disc_loss") if k in ev}, weights=False,
                     where=f"on the held-out rows (the evaluation of {name}, after step {step})")
        write_t0 = clock()
        process_seconds.evaluation += write_t0 - eval_t0
        meta = {"name": name, "step": step, "fraction": FRACTION_OF[name],
                "fraction_of_steps": step / plan.total_steps,
                "fraction_of_budget_seconds": train_seconds / bud.value if plan.budget_kind == "time" else None,
                "tokens_seen": seen(),
                "train_flops_paper": step * plan.train_flops_paper_per_step,
                "train_flops_hardware": step * plan.train_flops_hardware_per_step,
                "train_seconds": train_seconds, "eval": ev, "precision": precision, "device": device_name(device),
                "budget": plan.budget, "recipe": recipe.name}
        if dist.main:
            save_checkpoint(run_dir / name, model, recipe, meta, data.path / "tokenizer")
        log.metrics({"event": "checkpoint", **meta})
        progress.note(checkpoint_line(name, ev))
        done_ckpts.add(name)
        plan.checkpoint_steps[name] = step  # plan.json says where each checkpoint is
        if dist.main:
            plan.save(run_dir / "plan.json")
        process_seconds.checkpoints += clock() - write_t0

    model.train()
    try:
        while not plan.finished(step):
            # one optimizer step: this process's rows of the global batch, split into micro-batches
            masked, seeds = mask_step(next(loader), recipe, special, step, dist.rank * rank_batch, micro, accum)
            counts = global_counts(masked, dist)
            lr = lr_at(step, recipe.optim.lr, plan.warmup_steps, plan.total_steps or math.inf)
            optimizer.set_lr(lr)
            train_step(engine, masked, seeds, counts, autocast, sums)
            step += 1
            real_tokens += counts[1].long()  # the global batch's real tokens (all-reduced above)

            # clocks: the first step is start-up; after it, training time accumulates. The end of the first step and
            # of a time budget's calibration steps are timed on finished work: wait for the device (host sync)
            if not clock_started or (planner is not None and planner.measuring):
                runtime.synchronize(device)
            now = clock()
            if not clock_started:
                clock_started, clock_t0 = True, now
                process_seconds.startup = now - startup_t0
                if planner is not None:
                    planner.step0 = step
                log.once(f"start-up took {process_seconds.startup:.1f} s (excluded from the budget)")
                window_t0, rate_step, window_tokens = now, step, seen()
            train_seconds = train_seconds_at_clock + (now - clock_t0)

            # a time budget: re-planned from the recent speed (every step; DDP: on log steps, from rank 0's clock)
            if planner is not None:
                lines = planner.after_step(step, train_seconds, done_ckpts, share=share,
                                           replan_now=not dist.enabled or step % tr.log_every_steps == 0)
                if lines is not None:
                    plan = adopt(planner.plan, lines)
            if step % tr.log_every_steps == 0 or plan.finished(step) or stop.requested:
                log_window(lr)

            # fraction checkpoints, each on its own step; a resume state every train.resume_every_seconds, after a
            # checkpoint, on a stop and at the end. Neither is training time
            other_t0 = clock()
            due = due_checkpoints(plan, step, done_ckpts)
            for name in due:
                write_checkpoint(name)
            state_t0 = clock()
            if state_t0 - last_state_save >= tr.resume_every_seconds or due or stop.requested or plan.finished(step):
                save_state()
                last_state_save = clock()
                process_seconds.resume_states += last_state_save - state_t0
            spent = clock() - other_t0
            other_seconds += spent
            clock_t0 += spent
            window_t0 += spent  # the log window's tokens/s counts training time too
            if stop.requested:
                stopped = f"stopped by {stop.signal_name}"
                dist.leave()
                raise Interrupted(stop.signal_name)
    except Diverged:  # check_finite: its line says it all
        progress.close()
        raise
    except Interrupted as e:  # the stop above, or a second Ctrl-C: out at once, from wherever the step was
        progress.close()
        how = stopped or f"interrupted ({e.signal_name})"
        log.once(f"{how} at step {step}: {_saved_text(state_saved, done_ckpts)}; continue with: {continue_with}")
        raise
    except RuntimeError as e:  # out of memory in a step (or a checkpoint's evaluation)
        progress.close()
        if (asked := allocation_failure(e)) is None:
            raise
        raise UserError(f"{out_of_memory_line(asked, device, recipe, micro, where=f'after step {step}')}; training "
                        f"stopped: {_saved_text(state_saved, done_ckpts)}"
                        f"{_out_of_memory_next(command, run_dir, recipe, micro, state_saved is not None)}") from None
    except OSError as e:  # a full disk, a location that became read-only, ...
        progress.close()
        room = "make room, then " if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
        raise UserError(f"{os_error_line(e)}; training stopped at step {step}: {_saved_text(state_saved, done_ckpts)}; "
                        f"{room}continue with: {continue_with}") from None

    # --- finish -----------------------------------------------------------------------------------------------------
    progress.close()
    process_seconds.training = train_seconds - train_seconds_at_clock
    process_seconds.wall = clock() - startup_t0
    fractions_of_steps = {n: plan.checkpoint_steps[n] / step for n in sorted(done_ckpts, key=FRACTION_OF.get)}
    off_fraction = budgeting.fractions_off({n: plan.checkpoint_steps[n] for n in fractions_of_steps}, step)
    if plan.budget_kind == "time":  # the plan as it ended: what happened
        plan.expected_train_seconds = train_seconds
    peak_gib, reserved_gib = runtime.peak_gpu_memory_gib(device), runtime.peak_gpu_reserved_gib(device)
    summary = {
        "recipe": recipe.name, "budget": plan.budget, "steps": step, "tokens_seen": seen(),
        "train_flops_paper": step * plan.train_flops_paper_per_step,
        "train_flops_hardware": step * plan.train_flops_hardware_per_step,
        "train_seconds": train_seconds, "budget_seconds": plan.budget_seconds,
        "excluded_seconds": {"startup_and_first_step": None if resume else round(process_seconds.startup or 0.0, 3),
                             "checkpoints_eval_state": round(other_seconds, 3)},  # the whole run's, resumes included
        "process_seconds": {k: None if v is None else round(v, 3)  # this process's, from train()'s entry
                            for k, v in dataclasses.asdict(process_seconds).items()},
        "data": data_record(data),  # the prepared data trained on: its path and fingerprint (runfolder.py)
        "precision": precision, "device": device_name(device), "parameters": count_parameters(model),
        "checkpoints": list(fractions_of_steps), "checkpoint_steps": {n: plan.checkpoint_steps[n] for n in fractions_of_steps},
        "checkpoint_fractions_of_steps": fractions_of_steps,
        "checkpoints_off_fraction": off_fraction,  # name -> its fraction, its share of the steps, and why they differ
        "resumed_with_changes": plan.resumed_with_changes,  # settings a --resume changed: step, key, old, new
        "resumed_with_runtime_changes": plan.resumed_with_runtime_changes,  # config.RUNTIME_SETTINGS it changed
        "final_lr": lr_at(step, recipe.optim.lr, plan.warmup_steps, plan.total_steps),
        "conventions": plan.conventions,
        "runtime": {"strategy": engine.strategy_note, "compile": engine.compile_note, "attention": attention["summary"],
                    "compiled": compiled, "deterministic": tr.deterministic, "cpu_threads": cpu_threads,
                    "micro_batches_without_padding": [engine.unpadded_micro_batches, engine.micro_batches]},
        # speed and memory: this process's logging windows after its first (start-up and compilation left out)
        "median_tokens_per_second": median_tokens_per_second(window_records),
        "peak_gpu_memory_gib": None if peak_gib is None else round(peak_gib, 3),  # tensors (max_memory_allocated)
        # what the caching allocator held: tensors, cached blocks and CUDA graphs' private pools (max_memory_reserved)
        "peak_gpu_memory_reserved_gib": None if reserved_gib is None else round(reserved_gib, 3),
        "host_sync_per_step": engine.host_sync_note,
    }
    if off_fraction:
        log.once(f"checkpoints off their fractions: {budgeting.fractions_off_text(off_fraction)} (summary.json: "
                 "checkpoints_off_fraction)")
    if dist.main:
        plan.save(run_dir / "plan.json")  # a time budget's plan as it ended (the steps that fitted)
        write_json(run_dir / "summary.json", summary)
        log.summary(summary, plan, next_commands(run_dir, device, list(fractions_of_steps)[-1]))
    dist.leave()
    return summary


def _rerun_command(command: str, run_dir: Path, extra: list[str], without_set: str = "") -> str:
    """The command given, with --out (when it had none), without --force, --resume and a `--set KEY=...` whose key
    is `without_set`, then the words `extra`."""
    import shlex

    words, kept = shlex.split(command) if command else ["tinyelectra", "train", "..."], []
    for word in words:
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


def next_commands(run_dir: Path, device: torch.device, last_checkpoint: str) -> list[tuple[str, str]]:
    """What a finished run is for, as (command, what it does) for this run's paths, shell-quoted: export,
    fine-tune every checkpoint on GLUE (on this run's device), report."""
    import shlex

    run = shlex.quote(str(run_dir))
    where = "--device cpu" if device.type == "cpu" else f"--gpu {device.index or 0}"
    return [
        (f"tinyelectra export {shlex.quote(str(run_dir / last_checkpoint))} --out {shlex.quote(str(run_dir / 'hf'))}",
         "the final checkpoint as a transformers model"),
        (f"tinyelectra glue --checkpoint {run} --glue-dir GLUE_DIR {where}",
         "fine-tune each checkpoint on GLUE (GLUE_DIR: the classic glue_data folder; or --hf instead)"),
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
        return "; a smaller model is another run: start over with --force (or choose another --out)" if resumable else ""
    setting, what = ((f"train.micro_batch_size={micro // 2}", "half the micro-batch") if micro > 1
                     else ("train.grad_checkpointing=true", "gradient checkpointing"))
    again = _rerun_command(command, run_dir, [*(["--resume"] if resumable else []), "--set", setting],
                           without_set=setting.split("=")[0])
    return f"; {'continue from the resume state' if resumable else 'run it again'} with {what}: {again}"


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
            raise UserError(f"--init {path}: {difference_text(differences(dataclasses.asdict(ckpt_recipe.model), dataclasses.asdict(recipe.model), 'model')[0])}")
        return model
    export = (path / "discriminator").is_dir()  # a `tinyelectra export` directory
    gen = path / "generator" if export and (path / "generator").is_dir() else None
    model, _ = electra_from_hf(path / "discriminator" if export else path, gen, cfg=recipe.model)
    if model.cfg.sharing != recipe.model.sharing:
        raise UserError(f"--init {path}: its generator and discriminator embeddings are {'not ' if model.cfg.sharing == 'none' else ''}"
                        f"shared, the recipe says sharing = {recipe.model.sharing!r}")
    return model


# ----------------------------------------------------------------------------------------------------------------
# one step (the loop's; benchmarks/throughput.py times the same functions)


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
                 "tokens_per_second": round(tokens_per_second, 1), "positions_per_second": round(positions_per_second, 1),
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


def _check_data(data, recipe: Recipe, data_dir: Path) -> None:
    if data.vocab_size != recipe.model.vocab_size:
        raise UserError(
            f"{data_dir} was prepared with a {data.vocab_size}-entry tokenizer but recipe {recipe.name} has "
            f"model.vocab_size = {recipe.model.vocab_size}; prepare again with --vocab-size "
            f"{recipe.model.vocab_size} or --set model.vocab_size={data.vocab_size}")
    if data.seq_len != recipe.train.seq_len:
        raise UserError(
            f"{data_dir} holds {data.seq_len}-token examples but recipe {recipe.name} trains on train.seq_len = "
            f"{recipe.train.seq_len}; prepare again with --seq-len {recipe.train.seq_len} or --set train.seq_len={data.seq_len}")
    if data.num_rows("train") < recipe.train.batch_size:
        raise UserError(f"{data_dir} has {data.num_rows('train')} training examples, fewer than one batch of {recipe.train.batch_size}")
    for split in data.manifest["splits"]:  # a damaged shard stops the set-up, not step 1 or the first checkpoint
        data.verify(split)


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
