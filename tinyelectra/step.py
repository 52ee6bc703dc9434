"""One pre-training step: what the loop in train.py calls once per optimizer update, and how it is built.

What lives here: the processes (`Dist`), the per-micro-batch seeds and masking (`step_seed`, `mask_step`), the global
counts the paper's loss is a mean over (`global_counts`), model + objective as one module (`PretrainStep`), how a
micro-batch's gradients become an update (`Engine`: our own loop, DDP or DeepSpeed; torch.compile and CUDA graphs;
the graph-safe update), `train_step` itself, and the micro-batch that fits (`fit_micro_batch`, `probe_step`).
benchmarks/throughput.py and loss_check.py time and check these same functions.

What does not: the loop (train.py), its clocks, logs, checkpoints and resume states (runstate.py); the objective's
mathematics (electra.py); the optimizer's (optim.py); device, precision and compile mechanics (runtime.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tinyelectra import runtime
from tinyelectra.config import Recipe
from tinyelectra.electra import STAT_KEYS, LossTerms, Masked, SpecialIds, combine, loss_terms, mask_batch
from tinyelectra.errors import UserError
from tinyelectra.model import Electra
from tinyelectra.optim import GraphSafeUpdate, PaperAdam, apply_update

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

    def leave(self) -> None:
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def step_seed(seed: int, step: int, row: int, stream: int) -> int:
    """A seed for one micro-batch of one step: depends only on what the rows are, not on how they were split."""
    return (((seed * 1_000_003 + step) * 1_000_033 + row) * 4 + stream) % (2**63 - 1)


# ----------------------------------------------------------------------------------------------------------------
# one step (the loop's; benchmarks/throughput.py times the same functions)


def mask_step(batch, recipe: Recipe, special: SpecialIds, step: int, first_row: int, micro: int,
              accum: int) -> tuple[list[Masked], list[int]]:
    """This process's rows of one step (`first_row`: their first row in the global batch), split into `accum`
    micro-batches of `micro` rows and masked; with each micro-batch's seed (`step_seed`) for sampling and dropout."""
    masked, seeds = [], []
    for i in range(accum):
        rows, row = slice(i * micro, (i + 1) * micro), first_row + i * micro
        torch.manual_seed(step_seed(recipe.train.seed, step, row, 0))
        masked.append(mask_batch(batch.input_ids[rows], batch.token_type_ids[rows], batch.attention_mask[rows],
                                 recipe.objective, special, recipe.model.vocab_size, full=_all_full(batch, rows)))
        seeds.append(step_seed(recipe.train.seed, step, row, 1))
    return masked, seeds


def _all_full(batch, rows: slice) -> bool:
    """Whether `batch`'s rows `rows` hold no padding, from its host-side flags (data.Batch.full_rows); False when
    the batch does not carry them."""
    return batch.all_full(rows) if hasattr(batch, "all_full") else False


def global_counts(masked: list[Masked], dist: Dist) -> Tensor:
    """(masked positions, real tokens) of the whole global batch: the paper's loss is a mean over it, so it is
    counted before any backward (all-reduced over processes)."""
    counts = torch.stack([sum(m.mlm_count for m in masked), sum(m.token_count for m in masked).float()])
    if dist.enabled:
        torch.distributed.all_reduce(counts)
    return counts


def new_sums(device: torch.device) -> dict[str, Tensor]:
    """Zeroed metric sums (`electra.STAT_KEYS`), on the device, for `train_step` to add to."""
    return {k: torch.zeros((), device=device) for k in STAT_KEYS}


def train_step(engine: "Engine", masked: list[Masked], seeds: list[int], counts: Tensor, autocast,
               sums: dict[str, Tensor]) -> Tensor:
    """One optimizer update over this process's micro-batches: each seeded, forward under `autocast`, the paper's loss
    over the global batch (`counts`) and its backward; then `Engine.update` (the learning rate was set before). Adds
    the metric sums to `sums` (on the device, no host sync); returns this process's loss (summed, detached)."""
    world = engine.dist.world
    total = None
    for i, (m, seed) in enumerate(zip(masked, seeds)):
        torch.manual_seed(seed)
        with engine.accumulating(last=(i == len(masked) - 1)):
            with autocast:
                mlm_sum, disc_sum, stats = engine.forward(m)
            loss = combine(LossTerms(mlm_sum, disc_sum, stats), engine.recipe.objective, counts[0], counts[1])
            engine.backward(loss * world)  # DDP averages over processes
        sums["mlm_sum"] += mlm_sum.detach()
        sums["disc_sum"] += disc_sum.detach()
        for k, v in stats.items():
            sums[k] += v
        total = loss.detach() if total is None else total + loss.detach()
        engine.micro_batches += 1
        engine.unpadded_micro_batches += m.full
    engine.update()
    return total


# ----------------------------------------------------------------------------------------------------------------
# the model, the compiled step and the update


class PretrainStep(nn.Module):
    """model + objective as one module, so DDP (and torch.compile) see one forward: Masked -> loss sums + stats; with
    the recipe's kernel variants (train.sampler, train.attention)."""

    def __init__(self, model: Electra, recipe: Recipe) -> None:
        super().__init__()
        self.model = model
        self.objective, self.sampler = recipe.objective, recipe.train.sampler
        model.set_attention(recipe.train.attention)

    def forward(self, m: Masked) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        t = loss_terms(self.model, m, self.objective, sampler=self.sampler)
        return t.mlm_sum, t.disc_sum, t.stats


class Engine:
    """How a micro-batch's gradients become an update: our own loop (one process or DDP), or DeepSpeed's engine.

    Plain / DDP: `torch.compile` as `runtime.choose_compile` decides (with "auto": CUDA graphs on one GPU with one
    micro-batch per step), DDP's `no_sync` on all but the last micro-batch, then the update: under CUDA graphs the
    graph-safe one (optim.GraphSafeUpdate: clip + paper Adam, fp16's loss scaling on the device), else `apply_update`
    (unscale, clip, step, update the loss scale on the host). DeepSpeed (ZeRO-2, optional CPU offload): its
    engine does the data parallelism, accumulation boundary, clipping and loss scaling; our loss is already a mean
    over the whole global batch, so DeepSpeed must not divide it by the accumulation steps again."""

    def __init__(self, model: Electra, recipe: Recipe, optimizer, scaler, dist: Dist, device: torch.device,
                 precision: str, micro: int, accum: int) -> None:
        tr = recipe.train
        self.model, self.optimizer, self.scaler, self.dist = model, optimizer, scaler, dist
        self.recipe, self.device, self.precision, self.micro = recipe, device, precision, micro
        self.clip_norm = recipe.optim.clip_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ds, self.graph_update, self._update_note = None, None, ""
        self.micro_batches = self.unpadded_micro_batches = 0  # counted by train_step (host-side flags, no sync)
        module: nn.Module = PretrainStep(model, recipe)
        # the compile policy (runtime.choose_compile): "auto" = inductor + CUDA graphs where graphs apply (one CUDA
        # device, one process, one micro-batch per step), inductor's default mode or eager elsewhere, saying why
        self.choice = runtime.choose_compile(tr.compile, device, accum, dist.world, tr.strategy)
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
        if dist.enabled:
            module = nn.parallel.DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
        self.module = module
        # fullgraph: a graph break is a failure (eager, and the note says so), not a silently slower step. DDP: its
        # graph is split at gradient buckets by dynamo's DDP optimizer, so it is compiled without the flag.
        self.forward, self._compile_note = runtime.maybe_compile(module, self.choice.mode, device, fullgraph=not dist.enabled)
        if self.choice.mode == "off" and tr.compile == "auto":
            self._compile_note = f"compile: {self.choice.why}"
        self._why = self.choice.why if tr.compile == "auto" and self.choice.mode != "off" else ""
        if self.choice.cuda_graphs:
            if device.type == "cuda" and hasattr(self.forward, "before_call"):
                # each step's forward starts a new generation of CUDA graph memory: the previous step's outputs
                # (already added to the metric sums) are dead; the gradients feeding the update are not (no marker there)
                self.forward.before_call = torch.compiler.cudagraph_mark_step_begin
            if not isinstance(optimizer, PaperAdam):
                self._update_note = f"update: eager ({recipe.optim.name} is not graph-safe)"
            else:  # fp16: the loss scaler's overflow check, skipped step and scale update on the device, captured too
                self.graph_update = GraphSafeUpdate(optimizer, self.clip_norm, self.choice.mode, device, scaler=scaler)
        self.strategy_note = f"strategy: {'DDP over ' + str(dist.world) + ' processes' if dist.enabled else 'one process'}"

    @property
    def compiles(self) -> bool:
        """Whether torch.compile was asked for (it may still have fallen back to eager: `compile_note` says)."""
        return self.ds is None and self.choice.mode != "off"

    @property
    def compile_note(self) -> str:
        """What runs, as it stands now, and why (for "auto"): a compilation that failed and fell back to eager says so."""
        note = runtime.compile_note(self.forward, self._compile_note)
        note += f"; {self._why}" if self.ds is None and self._why else ""
        update = self.graph_update.note if self.graph_update is not None else self._update_note
        return f"{note}; {update}" if update else note

    @property
    def host_sync_note(self) -> str | None:
        """fp16's per-step host sync where the loss scaler runs on the host (eager update, DeepSpeed); None otherwise:
        the graph-safe update keeps the scaler on the device."""
        on_device = self.graph_update is not None and self.graph_update.scaler is not None
        return FP16_HOST_SYNC if self.precision == "fp16" and not on_device else None

    def verify_compile(self, special: SpecialIds) -> None:
        """Compile (or fail to, falling back to eager with a note) before training: a dummy micro-batch's forward and
        backward, once with full rows (no attention mask: electra.Masked.full) and once with a padded row (the mask),
        so that both graphs are compiled in the start-up and not in the first batch of each kind; and the update once
        at learning rate 0 with the state put back. Nothing training computes changes."""
        if self.ds is not None:
            return
        objs = [self.forward] + ([self.graph_update.fn] if self.graph_update is not None else [])

        def trial() -> None:
            for padded in (False, True):
                probe_step(self.forward, self.model, special, self.recipe, self.micro, self.device, self.precision,
                           keep_grads=padded, padded=padded)
            if self.graph_update is not None:
                self.graph_update.dry_run()
            self.optimizer.zero_grad(set_to_none=True)

        runtime.verify_compiled(trial, objs, reset=lambda: self.optimizer.zero_grad(set_to_none=True))

    def compile_now(self, special: SpecialIds) -> dict:
        """Before training (start-up, outside any budget): point torch.compile at its persistent cache
        (runtime.compile_cache), then `verify_compile` and time it. Returns summary.json's record (the mode that runs
        and why, the seconds, the cache folder) with its log line under "line" ("" when nothing compiles)."""
        record: dict = {"mode": self.choice.mode if self.ds is None else "off", "why": self.choice.why,
                        "seconds": None, "cache": None}
        cache_line = runtime.compile_cache() if self.compiles else ""
        t0 = time.perf_counter()
        self.verify_compile(special)
        if not self.compiles:
            return {**record, "line": ""}
        record["seconds"] = round(time.perf_counter() - t0, 1)
        record["cache"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if runtime.compile_note(self.forward, "").startswith("compile: failed"):
            record["mode"] = "off"  # fell back to eager: the compile line says why
            return {**record, "line": f"the compile check took {record['seconds']:.1f} s and failed: running eager"}
        variants = "two graphs per compiled step: batches with padding (attention mask) and without"
        return {**record, "line": f"compiling took {record['seconds']:.1f} s (start-up, outside the budget; {variants}); "
                                  f"{cache_line}"}

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


# the per-step host sync of fp16 runs, named where their speed is printed and recorded (log, summary.json)
FP16_HOST_SYNC = ("fp16: the loss scaler checks the gradients for overflow on the host every step (one host sync per "
                  "step, included in tokens/s)")


# ----------------------------------------------------------------------------------------------------------------
# the micro-batch that fits


def fit_micro_batch(requested: int, rank_batch: int, device: torch.device, probe) -> int:
    """The micro-batch: as the recipe says; or, when it says 0 on a GPU, the largest divisor of this process's batch
    whose training step fits in memory (same global batch, accumulated: the same mathematics)."""
    if requested:
        if rank_batch % requested:
            raise UserError(f"train.micro_batch_size {requested} does not divide the per-process batch {rank_batch}")
        return requested
    if device.type != "cuda":
        return rank_batch
    for mb in [d for d in range(rank_batch, 0, -1) if rank_batch % d == 0]:
        try:
            probe(mb)
            return mb
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    raise UserError("not even one sequence per micro-batch fits in GPU memory; try train.grad_checkpointing=true")


def probe_step(forward, model: Electra, special, recipe: Recipe, mb: int, device: torch.device, precision: str,
               keep_grads: bool = False, padded: bool = True) -> None:
    """One forward + backward at micro-batch `mb` on dummy rows; gradients are discarded (unless `keep_grads`).
    `padded`: the first row ends in two padding tokens, so the attention mask is passed (as for most real batches);
    else every row is full and no mask is passed (electra.Masked.full)."""
    T = recipe.train.seq_len
    ids = torch.full((mb, T), special.cls, device=device)
    ids[:, 1:-1] = torch.randint(1000 % recipe.model.vocab_size, recipe.model.vocab_size, (mb, T - 2), device=device)
    ids[:, -1] = special.sep
    mask = torch.ones_like(ids, dtype=torch.bool)
    if padded and T > 4:
        ids[0, -3], ids[0, -2:], mask[0, -2:] = special.sep, special.pad, False
    m = mask_batch(ids, torch.zeros_like(ids), mask, recipe.objective, special, recipe.model.vocab_size,
                   full=not (padded and T > 4))
    with runtime.autocast_context(precision, device):
        mlm_sum, disc_sum, _ = forward(m)
    (mlm_sum + disc_sum).backward()
    if not keep_grads:
        model.zero_grad(set_to_none=True)
