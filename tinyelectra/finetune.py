"""One fine-tuning run: a fresh classifier on a pre-trained backbone, trained on one task with one seed by the
paper's protocol (`FinetuneJob`, `finetune`), its settings (`FinetuneConfig`, a `--set key=value` each), its
predictions (`predict`), and several runs in flight at once (`run_jobs`). The `glue` command around it
(checkpoints, tasks, seeds, glue.json) is glue.py's; the protocol itself is described there.

How a step runs (`finetune.step`, chosen by `step_mode`; the one description of it, which glue.py points to). With the
attention mask excluding padded keys, absolute positions and per-token LayerNorm, the [CLS] output is the same function
of the real tokens however far a row is padded (tests/test_glue.py checks it to 1e-5), so the modes differ in speed:
- eager: each batch padded to its longest row, the epoch's last batch smaller, the host launching every kernel
  (the CPU's choice: no wasted work on padding);
- static: fixed shapes. Each batch is padded to its longest row rounded up to a length bucket (32 tokens: 4 shapes
  at length 128), and a short last batch is filled up to the batch size with copies of its own rows weighted 0, so
  the loss (a weighted mean over rows) and its gradients are those of the real rows (tests/test_glue.py checks it).
  Every step is decided before the first (`static_schedule`: rows, weights, width, learning rates) and lives on the
  device with the training split, so one step is one call with no host work: the step counter, the gather of the
  batch, the forward, the loss, the backward, clipping and the paper's Adam all run on the device;
- graphs: static, each bucket's step captured once as a CUDA graph (torch.cuda.graph, no compiler: no compile wait)
  and replayed: one launch per step instead of hundreds (CUDA's choice; fp16 stays eager, its loss scaler checks
  overflows on the host).
Several jobs (checkpoint, task, seed) run at once in one process (`finetune.concurrent`), each on its own CUDA
stream: a batch of 32 x 128 leaves most of a large GPU idle, and the streams' kernels overlap. Evaluation batches are
formed from length-sorted rows, and the predictions put back in file order. Every job keeps its training loss every
LOSS_EVERY steps (the loss curve glue.json holds).

Shapes: B batch, T tokens (the batch's width), C classes (1 for regression), M examples, S steps, G parameter groups.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from tinyelectra.config import OptimConfig, parse_assignment, read_toml, section_values
from tinyelectra.errors import Diverged, UserError
from tinyelectra.glue_data import EncodedSplit, TaskSpec, get_task
from tinyelectra.model import Classifier
from tinyelectra.optim import (
    GraphSafeUpdate, apply_update, build_optimizer, layerwise_lr_scales, lr_at, no_decay,
)
from tinyelectra.runtime import autocast_context, nonfinite_parameters


# ----------------------------------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------------------------------


STEP_MODES = ("auto", "eager", "static", "graphs")
AUTO_CONCURRENT = 32  # jobs in flight with CUDA graphs when finetune.concurrent is 0 (fewer when memory runs short)
LOSS_EVERY = 10  # steps: an eager job on a GPU reads its loss (a host sync) every this many; the loss curve's spacing


def size_defaults(hidden_size: int) -> tuple[str, float, float]:
    """(size name, peak LR, layer-wise decay) by the encoder's hidden size (the paper's fine-tuning appendix)."""
    if hidden_size <= 256:
        return "small", 3e-4, 0.8
    if hidden_size <= 768:
        return "base", 1e-4, 0.8
    return "large", 5e-5, 0.9


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tuning settings; 0 means "the protocol's value" where a comment says so. Set with `--set finetune.key=value`
    (or `--set key=value`)."""

    lr: float = 0.0  # peak learning rate; 0 = by model size (size_defaults)
    layerwise: str = "intended"  # intended (paper) | official (released code's off-by-one) | none
    layerwise_decay: float = 0.0  # 0 = by model size (0.8; 0.9 for Large)
    weight_decay: float = 0.0  # decoupled, never on LayerNorm or biases
    warmup_fraction: float = 0.1  # share of the steps with the LR warming up
    clip_norm: float = 1.0  # global gradient norm; 0 disables
    batch_size: int = 32  # sequences per step
    batching: str = "random"  # random (paper) | length (length-grouped batches: ~2x less padding; not the paper's)
    max_length: int = 128  # tokens, [CLS] and [SEP]s included
    epochs: float = 0.0  # 0 = the task's (3; 10 for RTE and STS-B)
    dropout: float = 0.1  # hidden dropout in the encoder and before the head
    eval_batch_size: int = 128  # sequences per evaluation forward
    precision: str = "auto"  # auto (CPU fp32; GPU bf16, or fp16 + loss scaling without bf16) | fp32 | bf16 | fp16
    # (bf16 on a CPU is opt-in: about 1.8x faster steps where AVX512-BF16/AMX exist, but not the paper's fp32)
    step: str = "auto"  # auto (CUDA: graphs, fp16 eager; CPU: eager) | eager | static | graphs (module docstring)
    length_bucket: int = 32  # tokens: static batches are padded to a multiple of this (4 shapes at length 128)
    concurrent: int = 0  # jobs in flight at once in one process, each on its own CUDA stream; 0 = auto (1, or up
    # to AUTO_CONCURRENT with CUDA graphs while memory lasts)
    seed: int = 0  # first seed; seeds are seed, seed+1, ...
    test_predictions: bool = True  # write GLUE submission files for test splits that exist

    def __post_init__(self) -> None:
        def check(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise UserError(f"finetune.{key}: {msg}")

        check(self.lr >= 0, "lr", "must be >= 0 (0 = by model size)")
        check(self.layerwise in ("intended", "official", "none"), "layerwise", "must be intended, official or none")
        check(0 <= self.layerwise_decay <= 1, "layerwise_decay", "must be in [0, 1] (0 = by model size)")
        check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        check(0 <= self.warmup_fraction < 1, "warmup_fraction", "must be in [0, 1)")
        check(self.clip_norm >= 0, "clip_norm", "must be >= 0")
        check(self.batch_size > 0, "batch_size", "must be > 0")
        check(self.batching in ("random", "length"), "batching", "must be random or length")
        check(8 <= self.max_length <= 512, "max_length", "must be between 8 and 512")
        check(self.epochs >= 0, "epochs", "must be >= 0 (0 = the task's)")
        check(0 <= self.dropout < 1, "dropout", "must be in [0, 1)")
        check(self.eval_batch_size > 0, "eval_batch_size", "must be > 0")
        check(self.precision in ("auto", "fp32", "bf16", "fp16"), "precision", "must be auto, fp32, bf16 or fp16")
        check(self.step in STEP_MODES, "step", f"must be {', '.join(STEP_MODES[:-1])} or {STEP_MODES[-1]}")
        check(1 <= self.length_bucket <= 512, "length_bucket", "must be between 1 and 512 tokens")
        check(self.concurrent >= 0, "concurrent", "must be >= 0 (0 = auto)")
        check(self.seed >= 0, "seed", "must be >= 0")

    @classmethod
    def from_overrides(cls, assignments: list[str], config: Path | None = None) -> "FinetuneConfig":
        """The `[finetune]` table of a TOML file (`tinyelectra glue --config`: a file of its own, or a recipe TOML
        that carries one), then the `--set` assignments on top: training's grammar (config.parse_assignment) with one
        section, `finetune.key=value`; the section may be left out (`key=value`)."""
        values: dict[str, Any] = {}
        if config is not None:
            table = read_toml(config).get("finetune")
            if table is None:
                raise UserError(f"{config}: no [finetune] table")
            values = section_values(cls, table, f"{config}: [finetune]")
        values.update(parse_assignment(a, {"finetune": cls}, default_section="finetune")[1:] for a in assignments)
        if values.get("epochs") == 0:  # the default's value, but given it reads as "train for no epochs"
            raise UserError("finetune.epochs=0: 0 epochs would train nothing; give a number of epochs > 0, or leave "
                            "epochs out for each task's own (3; 10 for RTE and STS-B)")
        return cls(**values)

    def peak_lr(self, hidden_size: int) -> float:
        return self.lr or size_defaults(hidden_size)[1]

    def decay(self, hidden_size: int) -> float:
        return 1.0 if self.layerwise == "none" else self.layerwise_decay or size_defaults(hidden_size)[2]

    def task_epochs(self, task: TaskSpec | str) -> float:
        return self.epochs or float(get_task(task).epochs)


@dataclass
class EncodedTask:
    """A task's splits encoded for the model (glue.encode_task): train, dev by split name, test."""

    train: EncodedSplit
    dev: dict[str, EncodedSplit]
    test: list[EncodedSplit]


# ----------------------------------------------------------------------------------------------------------------
# One fine-tuning run
# ----------------------------------------------------------------------------------------------------------------


def depth_key(param_name: str) -> str:
    """A Classifier parameter's key in `optim.layerwise_lr_scales`: embeddings (also the E->H projection),
    layer.j, or head."""
    if param_name.startswith(("embeddings.", "encoder.project.")):
        return "embeddings"
    if param_name.startswith("encoder.layers."):
        return "layer." + param_name.split(".")[2]
    if param_name.startswith("head."):
        return "head"
    raise ValueError(f"no depth for parameter {param_name}")


def layerwise_groups(model, fc: FinetuneConfig) -> list[dict]:
    """Parameter groups with their `lr_scale` (layer-wise decay) and weight decay (none on LayerNorm and biases)."""
    cfg = model.cfg
    scales = layerwise_lr_scales(cfg.num_layers, fc.decay(cfg.hidden_size),
                                 official_off_by_one=fc.layerwise == "official")
    groups: dict[tuple[str, bool], dict] = {}
    for name, p in model.named_parameters():
        key = depth_key(name)
        decays = fc.weight_decay > 0 and not no_decay(name, p)
        groups.setdefault((key, decays), {"params": [], "lr_scale": scales[key],
                                          "weight_decay": fc.weight_decay if decays else 0.0})["params"].append(p)
    return list(groups.values())


def _tensors(batch, device):
    ids, types, mask = (torch.from_numpy(a).to(device, non_blocking=True)  # (B, T) each
                        for a in (batch.input_ids, batch.token_type_ids, batch.attention_mask))
    return ids, types, mask.bool()  # mask: True = token


def predict(model, enc: EncodedSplit, batch_size: int, device, precision: str) -> np.ndarray:
    """Model outputs for every example of `enc`, in its order: (M, C) float32 (C = 1 for regression)."""
    was_training = model.training
    model.eval()
    order = np.argsort(enc.lengths, kind="stable")  # similar lengths together: little padding
    chunks = []
    with torch.no_grad():
        for start in range(0, len(enc), batch_size):
            ids, types, mask = _tensors(enc.batch(order[start:start + batch_size]), device)
            with autocast_context(precision, device):
                chunks.append(model(ids, types, mask).float().cpu().numpy())  # (B, C)
    model.train(was_training)
    values = np.concatenate(chunks) if chunks else np.empty((0, 1), dtype=np.float32)  # in `order`
    out = np.empty_like(values)
    out[order] = values
    return out


def plan_steps(num_rows: int, batch_size: int, epochs: float) -> tuple[int, int]:
    """(steps per epoch, total steps): every row once per epoch, the last batch of an epoch possibly smaller."""
    per_epoch = math.ceil(num_rows / batch_size)
    return per_epoch, max(1, math.ceil(epochs * per_epoch))


MEGABATCH = 50  # batches per length-sorted group in "length" batching (as transformers' LengthGroupedSampler)


def batch_indices(num_rows: int, batch_size: int, total_steps: int, seed: int,
                  lengths: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """The rows of every training step: a fresh permutation per epoch (numpy, seeded), cut into batches. With
    `lengths` (batching = "length", not the paper's): each group of MEGABATCH batches' rows is sorted by length
    (longest first) before the cut, and the batches shuffled: every row once per epoch, similar lengths together."""
    rng = np.random.default_rng(seed)

    def epochs() -> Iterator[np.ndarray]:
        while True:
            order = rng.permutation(num_rows)
            if lengths is None:
                yield from (order[j:j + batch_size] for j in range(0, num_rows, batch_size))
                continue
            batches = []
            for start in range(0, num_rows, batch_size * MEGABATCH):
                chunk = order[start:start + batch_size * MEGABATCH]
                chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
                batches += [chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size)]
            yield from (batches[i] for i in rng.permutation(len(batches)))

    return islice(epochs(), total_steps)  # (B,) each


class Finetuner:
    """One (task, seed) run's state: a fresh Classifier on the backbone, the paper's Adam with layer-wise LR groups,
    and the loss scaler (fp16 only). `step` is one optimizer update of the eager path. `shared_rng`: other jobs run
    beside this one, so the head is initialised from a CPU generator of its own and the global generators (dropout)
    are left as they are."""

    def __init__(self, backbone, task: TaskSpec | str, fc: FinetuneConfig, seed: int, device, precision: str,
                 shared_rng: bool = False) -> None:
        self.spec = get_task(task)
        self.device, self.precision, self.clip_norm = device, precision, fc.clip_norm
        cfg = dataclasses.replace(backbone.config, dropout=fc.dropout)
        if shared_rng:
            with torch.random.fork_rng(devices=[]):  # the CPU generator only, put back afterwards
                torch.random.default_generator.manual_seed(seed)
                self.model = Classifier(cfg, self.spec.num_labels)
        else:
            torch.manual_seed(seed)  # head initialisation and dropout
            self.model = Classifier(cfg, self.spec.num_labels)
        self.model.load_backbone(backbone.embeddings, backbone.encoder)
        self.model.to(device).train()
        self.peak_lr = fc.peak_lr(cfg.hidden_size)
        optim_cfg = OptimConfig(name="adam", lr=self.peak_lr, weight_decay=fc.weight_decay, clip_norm=fc.clip_norm,
                                warmup_steps=0)
        self.optimizer = build_optimizer(layerwise_groups(self.model, fc), optim_cfg, device.type)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")  # bf16 needs no scaling

    def step(self, batch, lr: float):
        """Forward, loss (cross-entropy, or MSE for regression, in fp32), backward, clip, update at `lr`.
        Returns the loss tensor (no host sync)."""
        ids, types, mask = _tensors(batch, self.device)
        with autocast_context(self.precision, self.device):
            out = self.model(ids, types, mask)  # (B, C)
        regression = self.spec.is_regression
        target = torch.from_numpy(batch.labels.astype(np.float32 if regression else np.int64)).to(self.device)
        loss = F.mse_loss(out.float().squeeze(-1), target) if regression else F.cross_entropy(out.float(), target)
        self.scaler.scale(loss).backward()
        self.optimizer.set_lr(lr)
        # the trainer's unscale, clip, step (optim.py)
        apply_update(self.params, self.optimizer, self.scaler, self.clip_norm)
        return loss


def _diverged_line(what: str, task: str, seed: int, lr: float, peak_lr: float) -> str:
    return (f"fine-tuning diverged on {task}, seed {seed}: {what} (learning rate {lr:.3g}, peak {peak_lr:.3g}); this "
            "seed's model was dropped (glue.json keeps the tasks and seeds finished before it). Try a lower learning "
            f"rate, e.g. half the peak: --set finetune.lr={peak_lr / 2:.3g}")


# ----------------------------------------------------------------------------------------------------------------
# Fixed shapes: the static and CUDA-graph steps
# ----------------------------------------------------------------------------------------------------------------


def step_mode(fc: FinetuneConfig, device, precision: str) -> tuple[str, str]:
    """(eager | static | graphs, why) for `fc.step` on `device` at `precision`; a combination that cannot run is a
    UserError."""
    cuda = device.type == "cuda"
    if fc.step == "auto":
        if not cuda:
            return "eager", "auto: eager on the CPU (each batch padded to its longest row: no work on padding)"
        if precision == "fp16":
            return "eager", ("auto: eager under fp16 (its loss scaler checks for overflow on the host, which a CUDA "
                             "graph cannot)")
        return "graphs", "auto: CUDA graphs on a CUDA device (fixed shapes, one launch per step)"
    if fc.step in ("static", "graphs") and precision == "fp16":
        raise UserError(f"finetune.step={fc.step} does not run under fp16 (its loss scaler checks for overflow on the "
                        "host); use bf16 or fp32, or finetune.step=eager")
    if fc.step == "graphs" and not cuda:
        raise UserError("finetune.step=graphs needs a CUDA device; on the CPU use static (the same fixed-shape steps, "
                        "not captured) or eager")
    return fc.step, "as requested"


def concurrency(fc: FinetuneConfig, mode: str) -> int:
    """Jobs in flight at once: the setting, or by default AUTO_CONCURRENT with CUDA graphs and 1 otherwise (the host
    launching each kernel is the limit there, not the device)."""
    return fc.concurrent or (AUTO_CONCURRENT if mode == "graphs" else 1)


def bucket_width(longest: int, bucket: int, cap: int) -> int:
    """A static batch's width: its longest row rounded up to a multiple of `bucket` tokens, at most `cap`."""
    return min(int(cap), -(-int(longest) // bucket) * bucket)


@dataclass
class StaticSchedule:
    """Every step of one job, decided before the first (the same batches, in the same order, as the eager path's)."""

    rows: np.ndarray  # (S, B) int64: rows of the training split; a short last batch filled with copies of its rows
    weights: np.ndarray  # (S, B) float32: 1 for a real row, 0 for a filler
    widths: np.ndarray  # (S,) int64: tokens, the batch's longest row rounded up to the bucket
    lrs: np.ndarray  # (S, G) float32: each parameter group's learning rate (schedule x layer-wise scale)


def static_schedule(lengths: np.ndarray, batch_size: int, total_steps: int, seed: int, peak_lr: float, warmup: float,
                    lr_scales: list[float], bucket: int, cap: int, length_batching: bool = False) -> StaticSchedule:
    rows, weights, widths, lrs = [], [], [], []
    for step, idx in enumerate(batch_indices(len(lengths), batch_size, total_steps, seed,
                                             lengths if length_batching else None)):
        real = len(idx)
        rows.append(np.concatenate([idx, idx[np.arange(batch_size - real) % real]]))  # (B,)
        weights.append(np.arange(batch_size) < real)
        widths.append(bucket_width(lengths[idx].max(), bucket, cap))
        lr = lr_at(step, peak_lr, warmup, total_steps)  # the first step at lr_at(0) = 0, as the eager path
        lrs.append([lr * s for s in lr_scales])  # rounded to float32 as GraphSafeUpdate's fill does
    return StaticSchedule(np.asarray(rows, dtype=np.int64), np.asarray(weights, dtype=np.float32),
                          np.asarray(widths, dtype=np.int64), np.asarray(lrs, dtype=np.float32))


@dataclass
class DeviceSplit:
    """A training split on the device, every row padded to `width` (its longest row rounded up to the bucket): the
    static steps gather their batches from it. Read-only; jobs of the same task share it."""

    ids: Any  # (M, W) int64
    types: Any  # (M, W) int64
    mask: Any  # (M, W) bool, True = token
    labels: Any  # (M,) int64 class ids, or float32 scores for regression
    width: int


def device_split(enc: EncodedSplit, regression: bool, bucket: int, max_positions: int, device) -> DeviceSplit:
    width = min(int(max_positions), bucket_width(int(enc.lengths.max()), bucket, 1 << 30))
    b = enc.batch(np.arange(len(enc)), pad_to=width)
    labels = b.labels.astype(np.float32 if regression else np.int64)
    # plain (blocking) copies, nothing computed on the device: jobs on other CUDA streams read these at once
    ids, types, mask, target = (torch.from_numpy(a).to(device) for a in (b.input_ids, b.token_type_ids,
                                                                         b.attention_mask.astype(bool), labels))
    return DeviceSplit(ids, types, mask, target, width)


def _stream(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class StaticStep:
    """The fixed-shape steps of one job: its schedule in device tensors beside the shared training split, a step
    counter and every step's loss on the device. `_step(width)` is one whole step (gather, forward, weighted loss,
    backward, clip, the paper's Adam, counter) with no host work: run as it is (static), or captured once per width
    as a CUDA graph and replayed (graphs)."""

    def __init__(self, run: Finetuner, data: DeviceSplit, sched: StaticSchedule, capture: bool, stream=None) -> None:
        dev = run.device
        self.run, self.data, self.widths, self.stream = run, data, sched.widths, stream
        with _stream(stream):
            self.rows = torch.from_numpy(sched.rows).to(dev)  # (S, B)
            self.weights = torch.from_numpy(sched.weights).to(dev)  # (S, B)
            self.lrs = torch.from_numpy(sched.lrs).to(dev)  # (S, G)
            self.counter = torch.zeros((), dtype=torch.int64, device=dev)  # steps done
            self.losses = torch.full((len(sched.widths),), float("nan"), device=dev)  # (S,) every step's loss
        self.update = GraphSafeUpdate(run.optimizer, run.clip_norm)  # uncompiled: the CUDA graph captures it
        self.autocast = autocast_context(run.precision, dev, cache=False)  # no weight cache across graph replays
        self.graphs: dict[int, Any] = {}
        self.done = 0
        self.note = "static: fixed shapes, run step by step"
        self.capture_seconds = 0.0
        if capture:
            self._capture()

    def loss(self, width: int):
        """The loss of the step the counter points at: a weighted mean over the batch's rows (fillers weigh 0)."""
        i = self.counter.view(1)
        rows = self.rows.index_select(0, i).view(-1)  # (B,)
        d = self.data
        ids, types, mask = (t[:, :width].index_select(0, rows) for t in (d.ids, d.types, d.mask))  # (B, T) each
        with self.autocast:
            out = self.run.model(ids, types, mask).float()  # (B, C)
        target = d.labels.index_select(0, rows)  # (B,)
        if self.run.spec.is_regression:
            per_row = (out.squeeze(-1) - target).square()
        else:
            per_row = F.cross_entropy(out, target, reduction="none")  # (B,)
        w = self.weights.index_select(0, i).view(-1)  # (B,)
        return (per_row * w).sum() / w.sum()

    def _step(self, width: int) -> None:
        loss = self.loss(width)
        loss.backward()
        i = self.counter.view(1)
        with torch.no_grad():
            lrs = self.lrs.index_select(0, i).view(-1)  # (G,)
            self.update._step(*self.update._lists(), list(lrs.unbind(0)))  # clip, then the paper's Adam
            self.losses.index_copy_(0, i, loss.detach().view(1))
            self.counter.add_(1)

    def advance(self) -> None:
        width = int(self.widths[self.done])
        with _stream(self.stream):
            if self.graphs:
                self.graphs[width].replay()
            else:
                self._step(width)
                self.run.optimizer.zero_grad(set_to_none=True)
        self.done += 1

    def host_losses(self) -> np.ndarray:
        with _stream(self.stream):
            return self.losses.cpu().numpy()  # waits for this job's stream only

    def _capture(self) -> None:
        """One step per width, untimed, to set up what a capture cannot (cuBLAS workspaces, attention plans, the
        optimizer state); the weights and the optimizer state put back; then one CUDA graph per width, sharing one
        memory pool (they never run at once). A capture that fails leaves the job static, said in `note`."""
        t0 = time.perf_counter()
        widths = sorted({int(w) for w in self.widths})
        params = self.run.params
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
        try:
            if self.stream is None:
                self.stream = torch.cuda.Stream(self.run.device)
            self.stream.wait_stream(torch.cuda.current_stream(self.run.device))
            with _stream(self.stream):
                for width in widths:
                    self._step(width)
                    self.run.optimizer.zero_grad(set_to_none=True)
                self._reset(saved)
            pool = None  # torch.cuda.graph synchronizes the device on entry: the copies from `saved` are done
            for width in widths:
                self.run.optimizer.zero_grad(set_to_none=True)  # the captured backward writes fresh gradients
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                    self._step(width)
                pool = pool or graph.pool()
                self.graphs[width] = graph
            self.note = f"CUDA graphs: {len(widths)} captured (widths {', '.join(map(str, widths))})"
        except RuntimeError as e:
            self.graphs.clear()
            torch.cuda.synchronize(self.run.device)
            self.run.optimizer.zero_grad(set_to_none=True)
            with _stream(self.stream):
                self._reset(saved)
            self.stream.synchronize()  # `saved` is freed on return: the copies from it must be done
            self.note = f"static: the CUDA-graph capture failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        self.capture_seconds = time.perf_counter() - t0

    def _reset(self, saved: list) -> None:
        """The weights as they were, the optimizer state empty (as before any step), the counter and losses cleared."""
        with torch.no_grad():
            for p, s in zip(self.run.params, saved):
                p.copy_(s)
            for state in self.run.optimizer.state.values():
                for t in state.values():
                    if torch.is_tensor(t):
                        t.zero_()
            self.counter.zero_()
            self.losses.fill_(float("nan"))


# ----------------------------------------------------------------------------------------------------------------
# One job, and several at once
# ----------------------------------------------------------------------------------------------------------------


class FinetuneJob:
    """One (task, seed) fine-tuning run, one step per `advance()` (True once the last step is launched); `finish()`
    checks its losses and weights and returns (model, facts). The static and graph modes read no loss back until
    the end (one host sync per job); the eager path reads every LOSS_EVERY-th step's (every step's on the CPU).
    `curve`: [step, loss] every LOSS_EVERY steps, the mean of the losses read since the last point."""

    def __init__(self, backbone, task: TaskSpec | str, enc: EncodedTask, fc: FinetuneConfig, seed: int, device,
                 precision: str, mode: str = "eager", data: DeviceSplit | None = None, stream=None,
                 shared_rng: bool = False, on_step: Callable[[int, float | None], None] | None = None) -> None:
        self.task, self.seed, self.fc = get_task(task), seed, fc
        self.device, self.mode, self.stream = device, mode, stream
        self.on_step = on_step
        self.t0 = time.perf_counter()
        self.run = Finetuner(backbone, self.task, fc, seed, device, precision, shared_rng=shared_rng)
        self.train_rows = n = len(enc.train)
        self.steps_per_epoch, self.total = plan_steps(n, fc.batch_size, fc.task_epochs(self.task))
        self.warmup = fc.warmup_fraction * self.total  # official: num_train_steps * warmup_proportion (a float)
        self.done, self.last_loss, self.curve = 0, float("nan"), []
        self.static: StaticStep | None = None
        lengths = enc.train.lengths
        if mode == "eager":
            self.train = enc.train
            self.batches = batch_indices(n, fc.batch_size, self.total, seed,
                                         lengths if fc.batching == "length" else None)
            self.losses: list[float] = []
            self.note = "eager: each batch padded to its longest row"
        else:
            if data is None:
                data = device_split(enc.train, self.task.is_regression, fc.length_bucket,
                                    self.run.model.cfg.max_positions, device)
            scales = [g.get("lr_scale", 1.0) for g in self.run.optimizer.param_groups]
            sched = static_schedule(lengths, fc.batch_size, self.total, seed, self.run.peak_lr, self.warmup, scales,
                                    fc.length_bucket, data.width, fc.batching == "length")
            self.static = StaticStep(self.run, data, sched, capture=mode == "graphs", stream=stream)
            self.stream = self.static.stream
            self.note = self.static.note

    def _diverged(self, what: str, step: int) -> Diverged:
        lr = lr_at(step, self.run.peak_lr, self.warmup, self.total)
        return Diverged(_diverged_line(what, self.task.name, self.seed, lr, self.run.peak_lr))

    def advance(self) -> bool:
        if self.static is not None:
            self.static.advance()
            self.done += 1
            if self.on_step is not None and self.done < self.total:  # the last one with its loss, from finish()
                self.on_step(self.done, None)
            return self.done >= self.total
        idx = next(self.batches)  # padded to this batch's longest row
        # step 0 at lr_at(0) = 0, as the official schedule
        lr = lr_at(self.done, self.run.peak_lr, self.warmup, self.total)
        with _stream(self.stream):
            loss = self.run.step(self.train.batch(idx), lr)
        self.done += 1
        report_now = self.done % LOSS_EVERY == 0 or self.done == self.total
        if report_now or self.device.type == "cpu":
            self.losses.append(loss.item())  # host sync: every step on CPU (free), every LOSS_EVERY-th on GPU
        if report_now:
            self.last_loss = sum(self.losses) / len(self.losses)
            self.curve.append([self.done, self.last_loss])
            self.losses.clear()
            if not math.isfinite(self.last_loss):
                done = self.done
                first = done - (done - 1) % LOSS_EVERY if self.device.type == "cpu" else done  # the steps read
                where = f"step {done}" if first == done else f"steps {first}-{done}"
                raise self._diverged(f"the {self.task.name} loss is {self.last_loss} in {where} of {self.total}",
                                     done - 1)
        if self.on_step is not None:
            self.on_step(self.done, self.last_loss if report_now else None)
        return self.done >= self.total

    def finish(self):
        """Wait for this job's last step; a non-finite loss (static modes: the first one, by step) or non-finite
        weights raise Diverged. Returns (model, facts)."""
        if self.static is not None:
            losses = self.static.host_losses()  # (S,)
            bad = np.flatnonzero(~np.isfinite(losses))
            if bad.size:
                k = int(bad[0])
                raise self._diverged(f"the {self.task.name} loss is {losses[k]} at step {k + 1} of {self.total}", k)
            self.last_loss = float(losses[-LOSS_EVERY:].mean())
            ends = [*range(LOSS_EVERY, self.total, LOSS_EVERY), self.total]
            self.curve = [[end, float(losses[max(0, end - LOSS_EVERY):end].mean())] for end in ends]
            if self.on_step is not None:
                self.on_step(self.done, self.last_loss)
        elif self.stream is not None:
            self.stream.synchronize()
        if self.device.type == "cuda" and self.stream is None:
            torch.cuda.synchronize(self.device)
        with _stream(self.stream):
            names = nonfinite_parameters(self.run.model)
        if names:  # a last update that left non-finite weights
            raise self._diverged(f"the weights hold non-finite values after the last step, {self.total} ({names[0]})",
                                 self.total - 1)
        facts = {"steps": self.total, "steps_per_epoch": self.steps_per_epoch, "train_rows": self.train_rows,
                 "peak_lr": self.run.peak_lr, "warmup_steps": self.warmup, "final_loss": self.last_loss,
                 "loss_curve": self.curve, "train_seconds": time.perf_counter() - self.t0, "step": self.note}
        if self.static is not None and self.static.capture_seconds:
            facts["capture_seconds"] = self.static.capture_seconds
        return self.run.model, facts

    def on_own_stream(self):
        """A context for work that must follow this job's steps (its evaluation), on its stream."""
        return _stream(self.stream)


def finetune(backbone, task: TaskSpec | str, enc: EncodedTask, fc: FinetuneConfig, seed: int, device, precision: str,
             on_step: Callable[[int, float | None], None] | None = None, mode: str | None = None):
    """Fine-tune a fresh Classifier from `backbone` on one task with one seed, alone. Returns (model, facts); a loss
    or weights that are not finite raise Diverged: nothing of this seed is returned."""
    mode = mode or step_mode(fc, device, precision)[0]
    job = FinetuneJob(backbone, task, enc, fc, seed, device, precision, mode, on_step=on_step)
    while not job.advance():
        pass
    return job.finish()


Unit = TypeVar("Unit")


def run_jobs(units: list[Unit], start: Callable[[Unit, Any], FinetuneJob], done: Callable[[Unit, FinetuneJob], None],
             concurrent: int, device) -> dict[str, Any]:
    """Run one job per unit of work, `start(unit, stream)` building it when a slot frees up, up to `concurrent` in
    flight, one step of each in turn; `done(unit, job)` takes each as its last step is launched (finish, evaluate,
    record). On CUDA with more than one in flight each job has its own stream, and no job starts while the memory left
    is under twice the largest one's so far. Returns what ran: jobs, most in flight, steps, seconds, steps per
    second."""
    cuda = device.type == "cuda"
    pending, active = list(units), []
    footprint, most, steps = 0, 0, 0
    t0 = time.perf_counter()
    while pending or active:
        while pending and len(active) < concurrent and (not active or not cuda or _room_for(device, footprint)):
            before = torch.cuda.memory_reserved(device) if cuda else 0
            unit = pending.pop(0)
            active.append((unit, start(unit, torch.cuda.Stream(device) if cuda and concurrent > 1 else None)))
            if cuda:
                footprint = max(footprint, torch.cuda.memory_reserved(device) - before)
        most = max(most, len(active))
        for entry in list(active):
            unit, job = entry
            if job.advance():
                active = [a for a in active if a is not entry]
                steps += job.total
                done(unit, job)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    return {"jobs": len(units), "concurrent": concurrent, "most_in_flight": most, "steps": steps,
            "seconds": seconds, "steps_per_second": steps / seconds if seconds > 0 else None}


def _room_for(device, footprint: int) -> bool:
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free + cached >= 2 * footprint
