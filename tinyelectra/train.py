"""Pre-training within a budget: the loop, visible in one function (`train`), and the command around it.

Sections of `train`: set-up -> plan -> resume -> loop (mask, forward/backward per micro-batch, update, log,
fraction checkpoints, resume state, time budget) -> finish. Everything the loop needs to continue exactly after an
interruption is in the resume state (weights, optimizer, scaler, data cursor, step, clocks); all randomness of a
step is derived from (seed, step, first global row of the micro-batch), so a resumed run, a run with gradient
accumulation and a DDP run draw the same masks, samples and dropout for the same rows.

Time budgets: the budget counts training time — steps, data loading and logging. Excluded (and reported apart):
start-up (data preparation, building the model, compilation and the first step, which runs at learning rate 0),
and the writing of checkpoints, their held-out evaluation and resume states.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from tinyelectra import budget as budgeting
from tinyelectra.budget import Plan, make_plan, parse_budget
from tinyelectra.config import Recipe, load_recipe, recipe_from_dict
from tinyelectra.electra import STAT_KEYS, LossTerms, Masked, SpecialIds, combine, loss_terms, mask_batch, summarize
from tinyelectra.errors import UserError
from tinyelectra.logs import Log, Progress
from tinyelectra.model import Electra, attention_kernel, count_parameters
from tinyelectra.optim import build_optimizer, lr_at
from tinyelectra.runtime import device_name

CALIBRATION_STEPS = 5  # a time budget is first planned after this many steps (the first step is start-up)
RATE_WINDOW_SECONDS = 10.0  # ... and re-planned from the throughput of the last max(this, 20% of elapsed) seconds


# ----------------------------------------------------------------------------------------------------------------
# processes


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "Dist":
        """torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; a plain process is rank 0 of 1."""
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))


def step_seed(seed: int, step: int, row: int, stream: int) -> int:
    """A seed for one micro-batch of one step: depends only on what the rows are, not on how they were split."""
    return (((seed * 1_000_003 + step) * 1_000_033 + row) * 4 + stream) % (2**63 - 1)


# ----------------------------------------------------------------------------------------------------------------
# the command


def train_command(
    budget: str, data_dir: Path | None, corpus: list[str] | None, recipe_name: str, gpu: int | None,
    device: str | None, out_dir: Path | None, resume: bool, overrides: list[str], command: str,
    init: Path | None = None,
) -> None:
    from tinyelectra import runtime

    dist = Dist.from_env()
    recipe = load_recipe(recipe_name, overrides)
    notes: list[str] = []
    if data_dir is not None:
        recipe = adopt_data_vocab(recipe, data_dir, overrides, notes)
    bud = parse_budget(budget)
    if gpu is not None and device is not None:
        raise UserError("give either --gpu N or --device, not both")
    runtime.set_deterministic(recipe.train.deterministic)  # before anything touches CUDA: cuBLAS reads it once
    dev = runtime.pick_process_device(gpu, device, dist.local_rank, dist.world)  # torchrun: cuda:LOCAL_RANK
    run_dir = out_dir or Path("runs") / f"{recipe.name}-{bud.text}"
    if data_dir is None and corpus and (run_dir / "data" / "manifest.json").is_file():  # prepared by an earlier start
        recipe = adopt_data_vocab(recipe, run_dir / "data", overrides, notes)
    if dist.enabled and not torch.distributed.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    if dist.main:
        _check_run_dir(run_dir, resume, recipe)
    _barrier()
    data_path = resolve_data(data_dir, corpus, recipe, run_dir, dist)
    if corpus and not notes and not resume:  # --corpus with the recipe's data.tokenizer: its vocabulary decides too
        recipe = adopt_data_vocab(recipe, data_path, overrides, notes)
    if dist.main:
        for note in notes:
            print(f"· {note}", file=sys.stderr)
    base = load_recipe(recipe_name)
    overridden = [f"command line: --set {o} (the recipe says {_lookup(base, o)!r})" for o in overrides] + notes
    if recipe.optim.name != "adam":
        overridden.append(f"OFF-RECIPE optimizer {recipe.optim.name}: bias-corrected AdamW, not the paper's Adam "
                          "without bias correction")
    train(recipe, bud, data_path, run_dir, dev, resume=resume, dist=dist, command=command, init=init,
          overridden=overridden)


def adopt_data_vocab(recipe: Recipe, data_dir: Path, overrides: list[str], notes: list[str]) -> Recipe:
    """The prepared data's vocabulary size becomes the model's, so a custom tokenizer needs no
    `--set model.vocab_size=N`; a size given with --set stays (and a mismatch is an error, _check_data). Appends
    the change to `notes` (recipe.json's deviations)."""
    from tinyelectra.data import PretrainData

    size = PretrainData(data_dir).vocab_size
    if size == recipe.model.vocab_size or any(o.split("=", 1)[0].strip() == "model.vocab_size" for o in overrides):
        return recipe
    notes.append(f"model.vocab_size = {size}, the vocabulary of the prepared data {data_dir} (the recipe says "
                 f"{recipe.model.vocab_size})")
    return recipe.with_overrides([f"model.vocab_size={size}"])


def _lookup(recipe: Recipe, assignment: str):
    section, name = assignment.split("=", 1)[0].strip().split(".", 1)
    return getattr(getattr(recipe, section), name)


def _check_run_dir(run_dir: Path, resume: bool, recipe: Recipe) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"cannot write to the output directory {run_dir}: {e.strerror or e}") from None
    has_state = (run_dir / "state" / "LATEST").exists()
    if resume:
        if not has_state:
            raise UserError(f"--resume: no resume state in {run_dir} (nothing to continue; drop --resume to start)")
        saved_raw = json.loads((run_dir / "recipe.json").read_text(encoding="utf-8"))
        saved = json.loads(json.dumps(recipe_from_dict(saved_raw, where="recipe.json").to_dict()))  # older key names
        now = json.loads(json.dumps(recipe.to_dict()))
        saved.pop("deviations", None), now.pop("deviations", None)  # recipe.json's also lists the --set changes
        if saved != now:
            diff = _first_difference(saved, now)
            raise UserError(f"--resume: {run_dir} was trained with another recipe ({diff}); use the same --recipe and --set")
    elif has_state or (run_dir / "plan.json").exists():
        raise UserError(f"{run_dir} already holds a run: continue it with --resume, or choose another --out")


def _first_difference(a, b, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
    return f"{path}: {a!r} there, {b!r} now"


def resolve_data(data_dir: Path | None, corpus: list[str] | None, recipe: Recipe, run_dir: Path, dist: Dist) -> Path:
    """--data as given; --corpus prepared into RUN/data; neither: the built-in corpus, prepared once and cached."""
    from tinyelectra.data import prepare

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
    cache_dir = not corpus  # our own cache: a stale one (older settings) is simply rebuilt
    if dist.main:
        prepare(
            sources=sources, out_dir=target, tokenizer_path=recipe.data.tokenizer or None,
            vocab_size=recipe.model.vocab_size, seq_len=recipe.train.seq_len, casing=recipe.data.casing,
            workers=0, force=cache_dir, seed=recipe.train.seed, command="(prepared by tinyelectra train)",
            validation_fraction=recipe.data.validation_fraction,
        )
    if dist.enabled:
        _barrier()
    return target


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


# ----------------------------------------------------------------------------------------------------------------
# the loop


class PretrainStep(nn.Module):
    """model + objective as one module, so DDP (and torch.compile) see one forward: Masked -> loss sums + stats."""

    def __init__(self, model: Electra, recipe: Recipe) -> None:
        super().__init__()
        self.model = model
        self.objective = recipe.objective

    def forward(self, m: Masked) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        t = loss_terms(self.model, m, self.objective)
        return t.mlm_sum, t.disc_sum, t.stats


class Engine:
    """How a micro-batch's gradients become an update: our own loop (one process or DDP), or DeepSpeed's engine.

    Plain / DDP: `torch.compile` where it helps, DDP's `no_sync` on all but the last micro-batch, then
    `apply_update` (unscale, clip, step, update the loss scale). DeepSpeed (ZeRO-2, optional CPU offload): its
    engine does the data parallelism, accumulation boundary, clipping and loss scaling; our loss is already a mean
    over the whole global batch, so DeepSpeed must not divide it by the accumulation steps again."""

    def __init__(self, model: Electra, recipe: Recipe, optimizer, scaler, dist: Dist, device: torch.device,
                 precision: str, micro: int, accum: int) -> None:
        from tinyelectra import runtime

        from tinyelectra.optim import GraphSafeUpdate, PaperAdam

        tr = recipe.train
        self.model, self.optimizer, self.scaler, self.dist = model, optimizer, scaler, dist
        self.recipe, self.device, self.precision, self.micro = recipe, device, precision, micro
        self.clip_norm = recipe.optim.clip_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ds = None
        self.graph_update = None
        self._update_note = ""
        module: nn.Module = PretrainStep(model, recipe)
        if tr.strategy == "deepspeed":
            try:
                import deepspeed
            except ImportError:
                raise UserError("train.strategy=deepspeed needs DeepSpeed: pip install 'tinyelectra[deepspeed]'") from None
            config = {
                "train_batch_size": tr.batch_size, "train_micro_batch_size_per_gpu": micro,
                "gradient_accumulation_steps": accum, "gradient_clipping": self.clip_norm,
                "zero_optimization": {"stage": 2, **({"offload_optimizer": {"device": "cpu"}} if tr.deepspeed_offload else {})},
                "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
                "bf16": {"enabled": precision == "bf16"}, "fp16": {"enabled": precision == "fp16", "loss_scale": 0},
                "steps_per_print": 1 << 30,
            }
            if not dist.enabled:  # one process without torchrun: give DeepSpeed the environment torchrun would
                import socket

                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", 0))
                    port = sock.getsockname()[1]
                for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                             "MASTER_PORT": str(port)}.items():
                    os.environ.setdefault(k, v)
            self.ds, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
            self.forward = self.ds
            self.strategy_note = f"strategy: DeepSpeed ZeRO-2{' with optimizer state offloaded to the CPU' if tr.deepspeed_offload else ''}"
            self._compile_note = "compile: off (DeepSpeed's engine)"
            return
        if tr.compile == "reduce-overhead":
            # CUDA graphs replay fixed memory: accumulated gradients of an earlier micro-batch would be overwritten,
            # and DDP's gradient hooks would run inside captured regions. Static shapes come from electra.py.
            if accum > 1:
                raise UserError(f"train.compile=reduce-overhead (CUDA graphs) needs one micro-batch per step; this run "
                                f"accumulates {accum} micro-batches of {micro}: use train.compile=on, or a micro-batch "
                                f"of {tr.batch_size // dist.world}")
            if dist.enabled:
                raise UserError("train.compile=reduce-overhead (CUDA graphs) is for one process; with torchrun use train.compile=on")
        if dist.enabled:
            module = nn.parallel.DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
        self.module = module
        # fullgraph: a graph break is a failure (eager, and the note says so), not a silently slower step. DDP: its
        # graph is split at gradient buckets by dynamo's DDP optimizer, so it is compiled without the flag.
        self.forward, self._compile_note = runtime.maybe_compile(module, tr.compile, device, fullgraph=not dist.enabled)
        if tr.compile == "reduce-overhead":
            if device.type == "cuda" and hasattr(self.forward, "before_call"):
                # each step's forward starts a new generation of CUDA graph memory: the previous step's outputs
                # (already added to the metric sums) are dead; the gradients feeding the update are not (no marker there)
                self.forward.before_call = torch.compiler.cudagraph_mark_step_begin
            if precision == "fp16":
                self._update_note = "update: eager (fp16 loss scaling checks for overflow on the host)"
            elif not isinstance(optimizer, PaperAdam):
                self._update_note = f"update: eager ({recipe.optim.name} is not graph-safe)"
            else:
                self.graph_update = GraphSafeUpdate(optimizer, self.clip_norm, tr.compile, device)
        self.strategy_note = f"strategy: {'DDP over ' + str(dist.world) + ' processes' if dist.enabled else 'one process'}"

    @property
    def compile_note(self) -> str:
        """What runs, as it stands now: a compilation that failed and fell back to eager says so."""
        from tinyelectra import runtime

        note = runtime.compile_note(self.forward, self._compile_note)
        update = self.graph_update.note if self.graph_update is not None else self._update_note
        return f"{note}; {update}" if update else note

    @property
    def note(self) -> str:
        return f"{self.strategy_note}; {self.compile_note}"

    def verify_compile(self, special: SpecialIds) -> None:
        """Compile (or fail to) before training: one forward + backward of a dummy micro-batch through the compiled
        step, and the compiled update once at learning rate 0 with the optimizer state put back, so a backend that
        fails in the forward, the backward or the update falls back to eager here, with a note, instead of ending
        the run. Gradients are discarded; nothing that training computes changes (every step reseeds its RNG)."""
        from tinyelectra import runtime

        if self.ds is not None:
            return
        objs = [self.forward] + ([self.graph_update.fn] if self.graph_update is not None else [])

        def trial() -> None:
            _probe(self.forward, self.model, special, self.recipe, self.micro, self.device, self.precision, keep_grads=True)
            if self.graph_update is not None:
                self.graph_update.dry_run()
            self.optimizer.zero_grad(set_to_none=True)

        runtime.verify_compiled(trial, objs, reset=lambda: self.optimizer.zero_grad(set_to_none=True))

    def accumulating(self, last: bool):
        """DDP: reduce gradients only after the last micro-batch of a step."""
        if self.ds is None and self.dist.enabled and not last:
            return self.module.no_sync()
        return contextlib.nullcontext()

    def backward(self, loss: Tensor) -> None:
        if self.ds is not None:
            self.ds.backward(loss, scale_wrt_gas=False)
            self.ds.step()  # a no-op except at the accumulation boundary
        else:
            self.scaler.scale(loss).backward()

    def update(self) -> None:
        if self.graph_update is not None:
            self.graph_update()
        elif self.ds is None:
            apply_update(self.params, self.optimizer, self.scaler, self.clip_norm)


def train(recipe: Recipe, bud: budgeting.Budget, data_dir: Path, run_dir: Path, device: torch.device,
          resume: bool = False, dist: Dist = Dist(), command: str = "", init: Path | None = None,
          overridden: list[str] | None = None) -> dict:
    """Pre-train `recipe` within `bud` on the prepared data; see the module docstring. `overridden` notes the
    command line's `--set` changes: they are written into recipe.json's deviations, so reports show them."""
    from tinyelectra import runtime
    from tinyelectra.checkpoint import load_resume_state, save_checkpoint, save_resume_state
    from tinyelectra.data import BatchLoader, PretrainData
    from tinyelectra.diagnostics import checkpoint_line, evaluate, unigram_distribution

    tr = recipe.train
    log = Log(run_dir, dist.main)
    startup_t0 = time.perf_counter()

    # --- set-up -------------------------------------------------------------------------------------------------
    if dist.enabled and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    log.once(runtime.set_deterministic(tr.deterministic))  # before the first GPU work (train_command did it earlier)
    log.once(runtime.tune_cpu() if device.type == "cpu" else "")
    data = PretrainData(data_dir)
    _check_data(data, recipe, data_dir)
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
                            lambda mb: _probe(probe, model, special, recipe, mb, device, precision))
    accum = rank_batch // micro
    engine = Engine(model, recipe, optimizer, scaler, dist, device, precision, micro, accum)
    engine.verify_compile(special)  # compiles now: a failure in forward, backward or update falls back to eager
    log.once(engine.note)
    attention = attention_kernel(recipe.model, micro, tr.seq_len, device, runtime.autocast_dtype(precision, device),
                                 compiled=engine.compile_note.startswith("compile: torch.compile"))
    log.once(attention["summary"])
    log.once(f"batch: {tr.batch_size} sequences x {tr.seq_len} tokens per step = {dist.world} process(es) x "
             f"{accum} micro-batch(es) of {micro}")
    loader = BatchLoader(data, "train", tr.batch_size, tr.seed, device=device,
                         row_range=(dist.rank * rank_batch, (dist.rank + 1) * rank_batch))

    # --- plan -----------------------------------------------------------------------------------------------------
    if dist.main:  # what an interrupted write left behind (never renamed into place, so never loadable)
        for stale in [*run_dir.glob("*.tmp-*"), *(run_dir / "state").glob("*.tmp-*")]:
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    if resume:
        plan = Plan.load(run_dir / "plan.json")
        if plan.budget != bud.text:
            raise UserError(f"--resume: {run_dir} was planned for --budget {plan.budget}, not {bud.text}")
        if tr.strategy == "deepspeed":
            raise UserError("--resume is not supported with train.strategy=deepspeed yet (its optimizer state has no "
                            "plain, safely loadable format); the fraction checkpoints are complete and usable")
        state = load_resume_state(run_dir, model, optimizer, scaler, loader, device)
        step, tokens_seen, train_seconds = state["step"], state["tokens_seen"], state["train_seconds"]
        other_seconds = state["other_seconds"]
        done_ckpts = set(state["checkpoints"])
        log.truncate_after(step)
        log.once(f"resumed from step {step} ({train_seconds:.1f} s of training time spent)")
    else:
        plan = make_plan(bud, recipe)
        if dist.main:
            saved = recipe.to_dict()
            saved["deviations"] = saved["deviations"] + list(overridden or [])
            (run_dir / "recipe.json").write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
            plan.save(run_dir / "plan.json")
        step, tokens_seen, train_seconds, other_seconds, done_ckpts = 0, 0, 0.0, 0.0, set()
    log.plan(plan, recipe, model, precision, device, command)

    # --- loop -----------------------------------------------------------------------------------------------------
    stop = StopFlag()
    sums = {k: torch.zeros((), device=device) for k in STAT_KEYS}
    # tokens_seen counts real tokens (attention mask), not padding: summed on the device, read at host syncs
    tokens_base, real_tokens = tokens_seen, torch.zeros((), dtype=torch.int64, device=device)
    seen = lambda: tokens_base + int(real_tokens.item())  # noqa: E731  (host sync: log steps, checkpoints, states)
    window_t0, window_step, window_tokens = time.perf_counter(), step, tokens_seen
    last_state_save = time.perf_counter()
    clock_started = step > 0  # the first step (compilation, allocator warm-up) is start-up, not budget
    clock_t0 = time.perf_counter()
    train_seconds_at_clock = train_seconds
    calib_step0 = step
    recent: collections.deque = collections.deque()  # (training seconds, step): the recent throughput
    autocast = runtime.autocast_context(precision, device)
    unigram = None  # the training rows' word frequencies, for the held-out evaluation's baselines
    progress = Progress(plan, step, dist.main)
    model.train()
    while step < plan.total_steps:
        # one optimizer step: this process's rows of the global batch, split into micro-batches
        batch = next(loader)
        masked: list[Masked] = []
        for i in range(accum):
            rows = slice(i * micro, (i + 1) * micro)
            torch.manual_seed(step_seed(tr.seed, step, dist.rank * rank_batch + i * micro, 0))
            masked.append(mask_batch(batch.input_ids[rows], batch.token_type_ids[rows], batch.attention_mask[rows],
                                     recipe.objective, special, recipe.model.vocab_size))
        # the means of the paper's loss are over the whole global batch: count it before any backward
        counts = torch.stack([sum(m.mlm_count for m in masked), sum(m.token_count for m in masked).float()])
        if dist.enabled:
            torch.distributed.all_reduce(counts)
        lr = lr_at(step, recipe.optim.lr, plan.warmup_steps, plan.total_steps)
        optimizer.set_lr(lr)
        for i, m in enumerate(masked):
            torch.manual_seed(step_seed(tr.seed, step, dist.rank * rank_batch + i * micro, 1))
            with engine.accumulating(last=(i == accum - 1)):
                with autocast:
                    mlm_sum, disc_sum, stats = engine.forward(m)
                loss = combine(LossTerms(mlm_sum, disc_sum, stats), recipe.objective, counts[0], counts[1])
                engine.backward(loss * dist.world)  # DDP averages over processes
            sums["mlm_sum"] += mlm_sum.detach()
            sums["disc_sum"] += disc_sum.detach()
            for k, v in stats.items():
                sums[k] += v
        engine.update()
        step += 1
        real_tokens += counts[1].long()  # the global batch's real tokens (all-reduced above)

        # clocks: the first step is start-up; after it, training time accumulates
        now = time.perf_counter()
        if not clock_started:
            clock_started, clock_t0, calib_step0 = True, now, step
            log.once(f"start-up took {now - startup_t0:.1f} s (excluded from the budget)")
            window_t0, window_step, window_tokens = now, step, seen()
        train_seconds = train_seconds_at_clock + (now - clock_t0)

        # a time budget: the steps that still fit, from the recent throughput (every step; DDP: on log steps,
        # with rank 0's clock broadcast so that every process keeps the same plan and learning rate)
        if plan.budget_kind == "time" and clock_started:
            recent.append((train_seconds, step))
            while len(recent) > 2 and recent[-1][0] - recent[0][0] > max(RATE_WINDOW_SECONDS, 0.2 * train_seconds):
                recent.popleft()
            calibrated = step - calib_step0 >= CALIBRATION_STEPS
            if calibrated and (not dist.enabled or step % tr.log_every_steps == 0):
                (t0, s0), (t1, s1) = recent[0], recent[-1]
                rate = (s1 - s0) / max(t1 - t0, 1e-9) if s1 > s0 else (step - calib_step0) / max(train_seconds, 1e-9)
                seconds = train_seconds
                if dist.enabled:
                    shared = torch.tensor([rate, seconds], dtype=torch.float64, device=device)
                    torch.distributed.broadcast(shared, 0)
                    rate, seconds = shared.tolist()
                plan = replan(bud, recipe, plan, step, seconds, rate)
                if plan.status == "provisional":  # the first measurement fixes the warm-up
                    plan.status = "final"
                    if dist.main:
                        plan.save(run_dir / "plan.json")
                    log.once(f"time budget: measured {rate:.3f} steps/s -> about {plan.total_steps} steps, "
                             f"warm-up {plan.warmup_steps}")
                progress.replan(plan)

        # logging (host sync only here)
        if step % tr.log_every_steps == 0 or step == plan.total_steps or stop.requested:
            host = reduce_sums(sums, dist)
            window_seconds = max(time.perf_counter() - window_t0, 1e-9)
            tokens_seen = seen()
            tok_s = (tokens_seen - window_tokens) / window_seconds  # real tokens
            positions_s = (step - window_step) * tr.tokens_per_step / window_seconds  # padding included: MFU
            rec = log_record(step, host, lr, tok_s, tokens_seen, train_seconds, plan, precision, device, positions_s)
            log.metrics(rec)
            progress.update(step, rec)
            for k in sums:
                sums[k].zero_()
            window_t0, window_step, window_tokens = time.perf_counter(), step, tokens_seen

        # fraction checkpoints (only once the plan is final)
        other_t0 = time.perf_counter()
        for (name, ckpt_step), fraction in zip(plan.checkpoint_steps.items(), budgeting.FRACTIONS):
            # a time budget's slices are slices of its time; others are slices of the steps
            reached = (train_seconds >= fraction * bud.value or step >= plan.total_steps) if plan.budget_kind == "time" \
                else step >= ckpt_step
            if plan.status == "final" and reached and name not in done_ckpts:
                if unigram is None:  # counted once per process
                    unigram = unigram_distribution(data, special)
                ev = evaluate(model, data, recipe, special, device, autocast, micro, unigram)
                meta = {"name": name, "step": step, "fraction": fraction, "fraction_of_steps": step / plan.total_steps,
                        "fraction_of_budget_seconds": train_seconds / bud.value if plan.budget_kind == "time" else None,
                        "tokens_seen": seen(),
                        "train_flops_paper": step * plan.train_flops_paper_per_step,
                        "train_flops_hardware": step * plan.train_flops_hardware_per_step,
                        "wall_seconds": train_seconds, "eval": ev, "precision": precision, "device": device_name(device),
                        "budget": plan.budget, "recipe": recipe.name}
                if dist.main:
                    save_checkpoint(run_dir / name, model, recipe, meta, data.path / "tokenizer")
                log.metrics({"event": "checkpoint", **meta})
                progress.note(checkpoint_line(name, ev))
                done_ckpts.add(name)
                last_state_save = 0.0  # write a resume state right after a checkpoint
        # resume state: every few minutes, after checkpoints, at the end, and when asked to stop
        if dist.main and engine.ds is None and (time.perf_counter() - last_state_save >= tr.resume_every_seconds
                                                or stop.requested or step == plan.total_steps):
            save_resume_state(run_dir, model, optimizer, scaler, loader, step=step, tokens_seen=seen(),
                       train_seconds=train_seconds, other_seconds=other_seconds, checkpoints=sorted(done_ckpts),
                       recipe=recipe)
            last_state_save = time.perf_counter()
        spent = time.perf_counter() - other_t0
        other_seconds += spent
        clock_t0 += spent  # checkpoint, evaluation and state writes are not training time
        if stop.requested:
            progress.close()
            log.once(f"stopped by {stop.signal_name} at step {step}; continue with: tinyelectra train ... --out {run_dir} --resume")
            _cleanup(dist)
            sys.exit(130 if stop.signal_name == "SIGINT" else 143)

    # --- finish -----------------------------------------------------------------------------------------------------
    progress.close()
    summary = {
        "recipe": recipe.name, "budget": plan.budget, "steps": step, "tokens_seen": seen(),
        "train_flops_paper": step * plan.train_flops_paper_per_step,
        "train_flops_hardware": step * plan.train_flops_hardware_per_step,
        "train_seconds": train_seconds, "budget_seconds": plan.budget_seconds,
        "excluded_seconds": {"startup_and_first_step": None if resume else round(clock_started and (clock_t0 - startup_t0) or 0, 3),
                             "checkpoints_eval_state": round(other_seconds, 3)},
        "precision": precision, "device": device_name(device), "parameters": count_parameters(model),
        "checkpoints": sorted(done_ckpts, key=lambda n: int(n.split("-")[1])), "final_lr": lr_at(step, recipe.optim.lr, plan.warmup_steps, plan.total_steps),
        "conventions": plan.conventions,
        "runtime": {"strategy": engine.strategy_note, "compile": engine.compile_note, "attention": attention["summary"],
                    "deterministic": tr.deterministic},
    }
    if dist.main:
        plan.save(run_dir / "plan.json")  # a time budget's plan as it ended (the steps that fitted)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        log.summary(summary, plan)
    _cleanup(dist)
    return summary


def initial_weights(path: Path, recipe: Recipe) -> Electra:
    """Weights to continue pre-training from: our checkpoint, an export directory, or a transformers directory."""
    from tinyelectra.checkpoint import is_checkpoint, load_checkpoint
    from tinyelectra.hf import electra_from_hf

    path = Path(path)
    if not path.exists():
        raise UserError(f"--init {path}: no such file or directory")
    if recipe.objective.kind != "electra":
        raise UserError("--init continues ELECTRA pre-training; the recipe's objective is not electra")
    if is_checkpoint(path):
        model, ckpt_recipe, _ = load_checkpoint(path)
        if ckpt_recipe.model != recipe.model:
            raise UserError(f"--init {path}: {_first_difference(dataclasses.asdict(ckpt_recipe.model), dataclasses.asdict(recipe.model), 'model')}")
        return model
    if (path / "discriminator").is_dir():  # a `tinyelectra export` directory
        gen = path / "generator" if (path / "generator").is_dir() else None
        model, _ = electra_from_hf(path / "discriminator", gen, cfg=recipe.model)
    else:
        model, _ = electra_from_hf(path, None, cfg=recipe.model)
    if model.cfg.sharing != recipe.model.sharing:
        raise UserError(f"--init {path}: its generator and discriminator embeddings are {'not ' if model.cfg.sharing == 'none' else ''}"
                        f"shared, the recipe says sharing = {recipe.model.sharing!r}")
    return model


def apply_update(params: list[Tensor], optimizer, scaler: torch.amp.GradScaler, clip_norm: float) -> Tensor:
    """Unscale, clip the global norm, step (skipped by the scaler on inf/NaN), update the scale, zero the grads.
    The learning rate was set before (`optimizer.set_lr`)."""
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(params, clip_norm if clip_norm > 0 else float("inf"), foreach=True)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return norm


def replan(bud: budgeting.Budget, recipe: Recipe, plan: Plan, step: int, train_seconds: float, rate: float) -> Plan:
    """A time budget's plan: the steps already done plus those that fit in the rest of the budget at `rate`.
    The first such plan fixes the warm-up; later ones move only the end (and with it the checkpoint steps, the
    decay and the expected tokens and FLOPs), so the learning rate reaches zero when the budget runs out."""
    total = step + max(0, int(round(rate * max(bud.value - train_seconds, 0.0))))
    new = make_plan(bud, recipe, steps_per_second=rate, total_steps=max(total, 1))
    new.status = plan.status
    if plan.status == "final":
        new.warmup_steps, new.notes = plan.warmup_steps, plan.notes
    else:
        new.notes.append(f"throughput measured after the first step: {rate:.3f} steps/s; re-measured as the run goes")
    new.expected_wall_seconds = bud.value
    return new


def reduce_sums(sums: dict[str, Tensor], dist: Dist) -> dict[str, float]:
    vec = torch.stack([sums[k] for k in STAT_KEYS]).float()
    if dist.enabled:
        torch.distributed.all_reduce(vec)
    values = vec.tolist()  # host sync: only on log steps
    return dict(zip(STAT_KEYS, values))


def log_record(step: int, s: dict[str, float], lr: float, tokens_per_second: float, tokens_seen: int,
               train_seconds: float, plan: Plan, precision: str, device: torch.device,
               positions_per_second: float | None = None) -> dict:
    """One metrics.jsonl line. tokens_seen / tokens_per_second count real tokens (padding excluded);
    positions_per_second counts every position of the (B, T) batches, padding included, which is what MFU needs."""
    from tinyelectra import flops

    positions_per_second = tokens_per_second if positions_per_second is None else positions_per_second
    rec: dict = {"step": step, "lr": lr, "tokens_seen": tokens_seen, "train_seconds": round(train_seconds, 3),
                 "tokens_per_second": round(tokens_per_second, 1), "positions_per_second": round(positions_per_second, 1),
                 "train_flops_paper": step * plan.train_flops_paper_per_step,
                 "train_flops_hardware": step * plan.train_flops_hardware_per_step}
    rec["gen_loss"] = s["mlm_sum"] / max(s["mlm_count"], 1.0)
    if s["disc_count"]:
        rec["disc_loss"] = s["disc_sum"] / s["disc_count"]
    rec.update(summarize(s))
    if device.type == "cuda":
        per_token = plan.train_flops_hardware_per_step / plan.tokens_per_step
        rec["mfu"] = flops.mfu(positions_per_second, per_token, torch.cuda.get_device_name(device), precision)
    return rec


def fit_micro_batch(requested: int, rank_batch: int, device: torch.device, probe) -> int:
    """The micro-batch: as the recipe says; or, when it says 0 on a GPU, the largest divisor of this process's batch
    whose training step fits in memory (same global batch, accumulated: the same mathematics)."""
    if requested:
        if rank_batch % requested:
            raise UserError(f"train.micro_batch_size {requested} does not divide the per-process batch {rank_batch}")
        return requested
    if device.type != "cuda":
        return rank_batch
    candidates = [d for d in range(rank_batch, 0, -1) if rank_batch % d == 0]
    for mb in candidates:
        try:
            probe(mb)
            return mb
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    raise UserError("not even one sequence per micro-batch fits in GPU memory; try train.grad_checkpointing=true")


def _probe(forward, model: Electra, special, recipe: Recipe, mb: int, device: torch.device, precision: str,
           keep_grads: bool = False) -> None:
    """One forward + backward at micro-batch `mb` on dummy rows; gradients are discarded (unless `keep_grads`)."""
    from tinyelectra import runtime

    T = recipe.train.seq_len
    ids = torch.full((mb, T), special.cls, device=device)
    ids[:, 1:-1] = torch.randint(1000 % recipe.model.vocab_size, recipe.model.vocab_size, (mb, T - 2), device=device)
    ids[:, -1] = special.sep
    tt = torch.zeros_like(ids)
    am = torch.ones_like(ids, dtype=torch.bool)
    m = mask_batch(ids, tt, am, recipe.objective, special, recipe.model.vocab_size)
    with runtime.autocast_context(precision, device):
        mlm_sum, disc_sum, _ = forward(m)
    (mlm_sum + disc_sum).backward()
    if not keep_grads:
        model.zero_grad(set_to_none=True)


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


def _cleanup(dist: Dist) -> None:
    if dist.enabled and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------------------------------------------
# signals, logs and the progress display


class StopFlag:
    """SIGINT / SIGTERM ask the loop to finish its step, save a resume state and exit; a second SIGINT aborts."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
