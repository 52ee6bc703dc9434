"""One pre-training step: what the loop in train.py calls once per optimizer update, and how it is built.

What lives here: the processes (`Dist`), the per-micro-batch seeds and masking (`step_seed`, `mask_step`), the global
counts the paper's loss is a mean over (`global_counts`), model + objective as one module (`PretrainStep`), how a
micro-batch's gradients become an update (`Engine`: our own loop, DDP or DeepSpeed; torch.compile whole or by region
and CUDA graphs; the graph-safe and the flat update), the whole step captured as one CUDA graph (`CapturedStep`),
`train_step` itself, and the micro-batch that fits (`fit_micro_batch`, `probe_step`).
benchmarks/throughput.py and loss_check.py time and check these same functions.

What does not: the loop (train.py), its clocks, logs, checkpoints and resume states (runstate.py); the objective's
mathematics (electra.py); the optimizer's (optim.py); device, precision and compile mechanics (runtime.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tinyelectra import runtime
from tinyelectra.config import Recipe
from tinyelectra.electra import STAT_KEYS, LossTerms, Masked, SpecialIds, combine, loss_terms, mask_batch
from tinyelectra.errors import UserError
from tinyelectra.model import Block, DiscriminatorHead, Electra, Embeddings, GeneratorHead
from tinyelectra.optim import FlatUpdate, GraphSafeUpdate, PaperAdam, apply_update

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
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)))

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
    the metric sums to `sums` (on the device, no host sync); returns this process's loss (summed, detached).
    train.compile=regional-graph: the same step as one captured CUDA graph (`CapturedStep`, one micro-batch)."""
    if engine.captured is not None:
        return engine.captured(masked[0], seeds[0], counts, sums)
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
    (unscale, clip, step, update the loss scale on the host); with train.update=flat, optim.FlatUpdate on every path
    (eager, about ten kernels, between inductor's graphs). train.compile=regional / regional-graph: the repeated
    blocks compiled one by one (runtime.compile_regions); regional-graph also captures the whole step
    (`CapturedStep`). DeepSpeed (ZeRO-2, optional CPU offload): its engine does the data parallelism, accumulation
    boundary, clipping and loss scaling; our loss is already a mean over the whole global batch, so DeepSpeed must not
    divide it by the accumulation steps again."""

    def __init__(self, model: Electra, recipe: Recipe, optimizer, scaler, dist: Dist, device: torch.device,
                 precision: str, micro: int, accum: int) -> None:
        tr = recipe.train
        self.model, self.optimizer, self.scaler, self.dist = model, optimizer, scaler, dist
        self.recipe, self.device, self.precision, self.micro = recipe, device, precision, micro
        self.clip_norm = recipe.optim.clip_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ds, self.graph_update, self.flat_update, self.captured, self._update_note = None, None, None, None, ""
        self.copies: runtime.WeightCopies | None = None  # train.weight_copy=copy under bf16/fp16 (after DeepSpeed's)
        self.micro_batches = self.unpadded_micro_batches = 0  # counted by train_step (host-side flags, no sync)
        module: nn.Module = PretrainStep(model, recipe)
        # the compile policy (runtime.choose_compile): "auto" = inductor + CUDA graphs where graphs apply (one CUDA
        # device, one process, one micro-batch per step), inductor's default mode or eager elsewhere, saying why
        self.choice = runtime.choose_compile(tr.compile, device, accum, dist.world, tr.strategy)
        if tr.strategy == "deepspeed":
            if tr.update == "flat":
                raise UserError("train.update=flat is for train.strategy=ddp (DeepSpeed's engine runs its own update)")
            try:
                import deepspeed
            except ImportError:
                raise UserError("train.strategy=deepspeed needs DeepSpeed: "
                                "pip install 'tinyelectra[deepspeed]'") from None
            config = {
                "train_batch_size": tr.batch_size, "train_micro_batch_size_per_gpu": micro,
                "gradient_accumulation_steps": accum, "gradient_clipping": self.clip_norm,
                "zero_optimization": {"stage": 2,
                                      **({"offload_optimizer": {"device": "cpu"}} if tr.deepspeed_offload else {})},
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
            offload = " with optimizer state offloaded to the CPU" if tr.deepspeed_offload else ""
            self.strategy_note = f"strategy: DeepSpeed ZeRO-2{offload}"
            self._compile_note = "compile: off (DeepSpeed's engine)"
            return
        if tr.weight_copy == "copy" and precision != "fp32":
            self.copies = runtime.WeightCopies(model.matmul_weights(), runtime.autocast_dtype(precision, device))
            model.register_load_state_dict_post_hook(lambda _model, _keys: self.refresh_copies())  # a resume state
        if tr.update == "flat":  # before DDP and compilation: the parameters become views of one flat buffer
            self.flat_update = FlatUpdate(optimizer, self.clip_norm, scaler)
        if dist.enabled:
            module = nn.parallel.DistributedDataParallel(module,
                                                         device_ids=[device.index] if device.type == "cuda" else None)
            self.refresh_copies()  # DDP's construction broadcast rank 0's weights into every process's
        self.module = module
        if self.choice.regional:
            self.forward, self._compile_note = runtime.compile_regions(module, compile_regions_of(model), device)
        else:  # fullgraph: a graph break is a failure (eager, and the note says so), not a silently slower step. DDP:
            # its graph is split at gradient buckets by dynamo's DDP optimizer, so it is compiled without the flag.
            self.forward, self._compile_note = runtime.maybe_compile(module, self.choice.mode, device,
                                                                     fullgraph=not dist.enabled)
        if self.choice.mode == "off" and tr.compile == "auto":
            self._compile_note = f"compile: {self.choice.why}"
        self._why = self.choice.why if tr.compile == "auto" and self.choice.mode != "off" else ""
        if self.choice.cuda_graphs:
            if device.type == "cuda" and hasattr(self.forward, "before_call"):
                # each step's forward starts a new generation of CUDA graph memory: the previous step's outputs
                # (already added to the metric sums) are dead; the gradients feeding the update are not (no marker
                # there)
                self.forward.before_call = torch.compiler.cudagraph_mark_step_begin
            if self.flat_update is None:  # (the flat update runs eager between the graphs, no host sync)
                if not isinstance(optimizer, PaperAdam):
                    self._update_note = f"update: eager ({recipe.optim.name} is not graph-safe)"
                else:  # fp16: the loss scaler's overflow check, skipped step and scale update on the device, captured
                    self.graph_update = GraphSafeUpdate(optimizer, self.clip_norm, self.choice.mode, device,
                                                        scaler=scaler)
        if self.choice.whole_step_graph:
            self.captured = CapturedStep(self)
        self.strategy_note = ("strategy: "
                              f"{'DDP over ' + str(dist.world) + ' processes' if dist.enabled else 'one process'}")

    @property
    def compiles(self) -> bool:
        """Whether torch.compile was asked for (it may still have fallen back to eager: `compile_note` says)."""
        return self.ds is None and self.choice.mode != "off"

    @property
    def compile_note(self) -> str:
        """What runs, as it stands now, and why (for "auto"): a compilation that failed and fell back to eager says
        so."""
        note = runtime.compile_note(self.forward, self._compile_note)
        note += f"; {self._why}" if self.ds is None and self._why else ""
        update = next((u.note for u in (self.flat_update, self.graph_update) if u is not None), self._update_note)
        if self.captured is not None:
            note += f"; {self.captured.note}"
        return f"{note}; {update}" if update else note

    @property
    def weight_note(self) -> str:
        """What train.weight_copy=copy does in this run ("" when it is not asked for)."""
        if self.recipe.train.weight_copy != "copy":
            return ""
        if self.copies is None:
            return "train.weight_copy=copy: no effect in fp32 (no weight is cast)"
        dtype = str(self.copies.copies[0].dtype).replace("torch.", "")
        return (f"weights: the matmuls read {dtype} copies of their {len(self.copies.copies)} fp32 weights, "
                "refreshed after each update (train.weight_copy=copy)")

    def refresh_copies(self) -> None:
        """The low-precision copies from the weights as they are (train.weight_copy=copy; nothing otherwise): after
        each update and whatever else changes the weights (a loaded state, a restore)."""
        if self.copies is not None:
            self.copies.refresh()

    @property
    def host_sync_note(self) -> str | None:
        """fp16's per-step host sync where the loss scaler runs on the host (eager update, DeepSpeed); None otherwise:
        the graph-safe update keeps the scaler on the device."""
        on_device = any(u is not None and u.scaler is not None for u in (self.graph_update, self.flat_update))
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
                           keep_grads=padded, padded=padded,
                           autocast=self.captured.autocast if self.captured is not None else None)
            if self.graph_update is not None:
                self.graph_update.dry_run()
            self.optimizer.zero_grad(set_to_none=True)

        runtime.verify_compiled(trial, objs, reset=lambda: self.optimizer.zero_grad(set_to_none=True))

    def compile_now(self, special: SpecialIds) -> dict:
        """Before training (start-up, outside any budget): point torch.compile at its persistent cache
        (runtime.compile_cache), then `verify_compile` and time it. Returns summary.json's record (the mode that runs
        and why, the seconds, the cache folder) with its log line under "line" ("" when nothing compiles)."""
        record: dict = {"mode": self.choice.mode if self.ds is None else "off", "why": self.choice.why,
                        "seconds": None, "cache": None, "split": None}
        cache_line = runtime.compile_cache() if self.compiles else ""
        if self.compiles:
            runtime.clear_compile_times()
        t0 = time.perf_counter()
        self.verify_compile(special)
        if not self.compiles:
            return {**record, "line": ""}
        record["seconds"] = round(time.perf_counter() - t0, 1)
        record["cache"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if runtime.compile_note(self.forward, "").startswith("compile: failed"):
            record["mode"] = "off"  # fell back to eager: the compile line says why
            return {**record, "line": f"the compile check took {record['seconds']:.1f} s and failed: running eager"}
        capture_s = None
        if self.captured is not None and self.captured.capture:
            t1 = time.perf_counter()
            try:
                self.captured.prepare(special)
            except (torch.OutOfMemoryError, UserError):
                raise
            except Exception as e:  # noqa: BLE001 - a failure before the recording (the warm-up): trains uncaptured
                self.captured.give_up(e)
            capture_s = time.perf_counter() - t1
            record["seconds"] = round(time.perf_counter() - t0, 1)
        record["split"] = {**runtime.compile_time_split(),
                           "capture_s": None if capture_s is None else round(capture_s, 3)}
        variants = ("each region compiled once per shape and mask kind" if self.choice.regional else
                    "two graphs per compiled step: batches with padding (attention mask) and without")
        return {**record, "line": f"compiling took {record['seconds']:.1f} s (start-up, outside the budget; "
                                  f"{variants}); {runtime.compile_split_line(record['split'])}; {cache_line}"}

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
        if self.flat_update is not None:
            self.flat_update()
        elif self.graph_update is not None:
            self.graph_update()
        elif self.ds is None:
            apply_update(self.params, self.optimizer, self.scaler, self.clip_norm)
        self.refresh_copies()


def compile_regions_of(model: Electra) -> list[nn.Module]:
    """What train.compile=regional compiles, each kind once per shape: every encoder Block (discriminator and
    generator), the Embeddings and the two heads."""
    return [m for m in model.modules() if isinstance(m, (Block, Embeddings, GeneratorHead, DiscriminatorHead))]


class CapturedStep:
    """train.compile=regional-graph: the whole step — the forward (its regions compiled), the paper's loss over the
    global batch, the backward and the flat update (optim.FlatUpdate, fp16's loss scaler included) — captured by
    tinyelectra as one CUDA graph per batch kind (with padding, without), at start-up, and replayed every step: one
    launch per step where inductor's CUDA graphs (reduce-overhead) launch a graph per compiled region and the update
    between them.

    Per step, outside the graph: the masked batch copied into the static input tensors of its kind, the global counts
    and the learning rates into theirs, the step's seed set (CUDA graphs replay with the generator's current seed:
    dropout and sampling draw fresh numbers each step, from the same per-step seeds as eager), then the replay and the
    metric sums added. Autocast without its weight cache (it cannot live across replays). The two graphs share one
    memory pool; each step's outputs are read before the next replay.

    On the CPU there are no CUDA graphs: the same static step runs uncaptured (`capture` False), which is what the CPU
    tests compare with the eager step."""

    def __init__(self, engine: "Engine") -> None:
        self.engine, self.update = engine, engine.flat_update
        dev = engine.device
        self.capture = dev.type == "cuda"
        # a failure inside a real capture leaves the CUDA generator marked as capturing (torch's capture_end throws
        # before its epilogue), so the uncaptured step's next random draw would fail: on CUDA the run stops, saying why
        self.recoverable = dev.type != "cuda"
        # mixed precision: autocast without its weight cache (fp32: none at all); the start-up's compile check runs
        # under the same one (torch.compile guards on autocast's state: another would compile every region again)
        self.autocast = runtime.autocast_context(engine.precision, dev, cache=False)
        self.counts = torch.zeros(2, device=dev)
        self.inputs: dict[bool, Masked] = {}  # static inputs, by Masked.full
        self.outputs: dict[bool, list[Tensor]] = {}
        self.graphs: dict = {}
        self.keys: list[str] = []
        self.pool = None
        self.failed = ""
        self.saved: list[Tensor] | None = None  # the update's state while a capture is warming up

    @property
    def note(self) -> str:
        if self.failed:
            return f"the whole step's CUDA-graph capture failed ({self.failed}): it runs uncaptured"
        if not self.capture:
            return "the whole step as one static function (no CUDA graphs on the CPU)"
        return "the whole step (forward, backward, update) captured as one CUDA graph per batch kind"

    def give_up(self, e: BaseException) -> None:
        """After a failed capture: run the same static step uncaptured from now on, the state as it was."""
        self.failed = f"{type(e).__name__}: {runtime._short(e, 160)}"
        self.capture, self.graphs, self.outputs, self.pool = False, {}, {}, None
        if self.saved is not None:
            self.update.restore(self.saved)
            self.engine.refresh_copies()
        self.engine.optimizer.zero_grad(set_to_none=True)
        print(f"the whole step's CUDA-graph capture failed; running it uncaptured. {type(e).__name__}: {str(e)[:4000]}",
              file=sys.stderr)

    def _static(self, m: Masked) -> Masked:
        fields = ("input_ids", "masked_ids", "token_type_ids", "attention_mask", "positions", "targets", "weights")
        static = self.inputs.get(m.full)
        if static is None:
            static = self.inputs[m.full] = Masked(*(getattr(m, f).clone() for f in fields), full=m.full)
        else:
            for f in fields:
                getattr(static, f).copy_(getattr(m, f))
        return static

    def _body(self, m: Masked) -> list[Tensor]:
        """The step's device work on static tensors: forward, loss, backward, update; its outputs (loss, sums)."""
        e = self.engine
        with self.autocast:
            mlm_sum, disc_sum, stats = e.forward(m)
        loss = combine(LossTerms(mlm_sum, disc_sum, stats), e.recipe.objective, self.counts[0], self.counts[1])
        e.scaler.scale(loss).backward()
        self.update.device_step()
        e.refresh_copies()  # captured with the update: the copies are static tensors the graph writes
        self.keys = ["mlm_sum", "disc_sum", *stats]
        return [loss.detach(), mlm_sum.detach(), disc_sum.detach(), *(v.detach() for v in stats.values())]

    def _capture(self, full: bool) -> None:
        """Warm up (compiles what is left, sets up cuBLAS and cuDNN; everything the update changed put back), then
        capture the step for batches of this kind."""
        e, static = self.engine, self.inputs[full]
        self.saved = self.update.snapshot()
        with self._side_stream():
            for _ in range(2):
                self._body(static)
                e.optimizer.zero_grad(set_to_none=True)
        self.update.restore(self.saved)
        e.refresh_copies()
        try:
            self.graphs[full], self.outputs[full] = self._record(lambda: self._body(static))
        except Exception as err:
            if self.recoverable:
                raise
            raise UserError(f"train.compile=regional-graph: the whole step's CUDA-graph capture failed "
                            f"({type(err).__name__}: {runtime._short(err, 300)}); after a failed capture the device's "
                            "random-number state cannot be trusted, so the run stops: use train.compile=regional (the "
                            "same compiled regions without the whole-step graph)") from err
        e.optimizer.zero_grad(set_to_none=True)
        self.saved = None

    @contextlib.contextmanager
    def _side_stream(self):
        """torch.cuda.graph's warm-up: on a side stream, joined back after."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream().wait_stream(side)

    def _record(self, body) -> tuple:
        """(graph, its output tensors): `body` captured into a CUDA graph sharing this step's memory pool."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = body()
        self.pool = graph.pool()
        return graph, outputs

    def prepare(self, special: SpecialIds) -> None:
        """Start-up: capture both kinds on dummy rows (probe_masked), nothing training computes changed."""
        e = self.engine
        for padded in (False, True):
            m = probe_masked(special, e.recipe, e.micro, e.device, padded)
            self._static(m)
            self.counts.copy_(torch.stack([m.mlm_count, m.token_count.float()]))
            self.update.set_lrs()
            self._capture(m.full)

    def __call__(self, m: Masked, seed: int, counts: Tensor, sums: dict[str, Tensor]) -> Tensor:
        static = self._static(m)
        self.counts.copy_(counts)
        self.update.set_lrs()
        if self.capture and m.full not in self.graphs:
            self._capture(m.full)  # prepare() captured both kinds; a safety net, not the plan
        torch.manual_seed(seed)
        if self.capture:  # the graph's gradients live in its memory pool: `p.grad` stays None (released after capture)
            self.graphs[m.full].replay()
            outputs = self.outputs[m.full]
        else:
            outputs = self._body(static)
            self.engine.optimizer.zero_grad(set_to_none=True)
        self.update.finish()
        torch._foreach_add_([sums[k] for k in self.keys], outputs[1:])
        self.engine.micro_batches += 1
        self.engine.unpadded_micro_batches += m.full
        return outputs[0].clone() if self.capture else outputs[0]


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


def probe_masked(special, recipe: Recipe, mb: int, device: torch.device, padded: bool) -> Masked:
    """`mb` dummy rows of the recipe's length, masked; `padded`: the first row ends in two padding tokens."""
    T = recipe.train.seq_len
    ids = torch.full((mb, T), special.cls, device=device)
    ids[:, 1:-1] = torch.randint(1000 % recipe.model.vocab_size, recipe.model.vocab_size, (mb, T - 2), device=device)
    ids[:, -1] = special.sep
    mask = torch.ones_like(ids, dtype=torch.bool)
    if padded and T > 4:
        ids[0, -3], ids[0, -2:], mask[0, -2:] = special.sep, special.pad, False
    return mask_batch(ids, torch.zeros_like(ids), mask, recipe.objective, special, recipe.model.vocab_size,
                      full=not (padded and T > 4))


def probe_step(forward, model: Electra, special, recipe: Recipe, mb: int, device: torch.device, precision: str,
               keep_grads: bool = False, padded: bool = True, autocast=None) -> None:
    """One forward + backward at micro-batch `mb` on dummy rows; gradients are discarded (unless `keep_grads`).
    `padded`: the first row ends in two padding tokens, so the attention mask is passed (as for most real batches);
    else every row is full and no mask is passed (electra.Masked.full). `autocast`: the forward's autocast region
    (default: the precision's, runtime.autocast_context)."""
    m = probe_masked(special, recipe, mb, device, padded)
    with autocast if autocast is not None else runtime.autocast_context(precision, device):
        mlm_sum, disc_sum, _ = forward(m)
    (mlm_sum + disc_sum).backward()
    if not keep_grads:
        model.zero_grad(set_to_none=True)
