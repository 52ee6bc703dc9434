"""One fine-tuning run: a fresh classifier on a pre-trained backbone, trained on one task with one seed by the
paper's protocol (`finetune`, `Finetuner`), its settings (`FinetuneConfig`, a `--set key=value` each) and its
predictions (`predict`). The `glue` command around it (checkpoints, tasks, seeds, glue.json) is glue.py's; the
protocol itself is described there.

Shapes: B batch, T tokens (the batch's longest row), C classes (1 for regression), M examples.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from itertools import islice
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyelectra.errors import Diverged, UserError
from tinyelectra.glue_data import EncodedSplit, get_task


# ----------------------------------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------------------------------


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
        check(self.seed >= 0, "seed", "must be >= 0")

    @classmethod
    def from_overrides(cls, assignments: list[str], config: Path | None = None) -> "FinetuneConfig":
        """The `[finetune]` table of a TOML file (`tinyelectra glue --config`: a file of its own, or a recipe TOML
        that carries one), then the `--set` assignments on top: training's grammar (config.parse_assignment) with one
        section, `finetune.key=value`; the section may be left out (`key=value`)."""
        from tinyelectra.config import parse_assignment, read_toml, section_values

        values: dict[str, Any] = {}
        if config is not None:
            table = read_toml(config).get("finetune")
            if table is None:
                raise UserError(f"{config}: no [finetune] table")
            values = section_values(cls, table, f"{config}: [finetune]")
        values.update(parse_assignment(a, {"finetune": cls}, default_section="finetune")[1:] for a in assignments)
        if values.get("epochs") == 0:  # the default's value, but given it reads as "train for no epochs"
            raise UserError("finetune.epochs=0: no epochs would train nothing; give a number of epochs > 0, or leave "
                            "epochs out for each task's own (3; 10 for RTE and STS-B)")
        return cls(**values)

    def peak_lr(self, hidden_size: int) -> float:
        return self.lr or size_defaults(hidden_size)[1]

    def decay(self, hidden_size: int) -> float:
        return 1.0 if self.layerwise == "none" else self.layerwise_decay or size_defaults(hidden_size)[2]

    def task_epochs(self, task: str) -> float:
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
    from tinyelectra.optim import layerwise_lr_scales, no_decay

    cfg = model.cfg
    scales = layerwise_lr_scales(cfg.num_layers, fc.decay(cfg.hidden_size), official_off_by_one=fc.layerwise == "official")
    groups: dict[tuple[str, bool], dict] = {}
    for name, p in model.named_parameters():
        key = depth_key(name)
        decays = fc.weight_decay > 0 and not no_decay(name, p)
        groups.setdefault((key, decays), {"params": [], "lr_scale": scales[key],
                                          "weight_decay": fc.weight_decay if decays else 0.0})["params"].append(p)
    return list(groups.values())


def _tensors(batch, device):
    import torch

    ids, types, mask = (torch.from_numpy(a).to(device, non_blocking=True)  # (B, T) each
                        for a in (batch.input_ids, batch.token_type_ids, batch.attention_mask))
    return ids, types, mask.bool()  # mask: True = token


def predict(model, enc: EncodedSplit, batch_size: int, device, precision: str) -> np.ndarray:
    """Model outputs for every example of `enc`, in its order: (M, C) float32 (C = 1 for regression)."""
    import torch

    from tinyelectra.runtime import autocast_context

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
    and the loss scaler (fp16 only). `step` is one optimizer update."""

    def __init__(self, backbone, task: str, fc: FinetuneConfig, seed: int, device, precision: str) -> None:
        import torch

        from tinyelectra.config import OptimConfig
        from tinyelectra.model import Classifier
        from tinyelectra.optim import build_optimizer

        self.spec = get_task(task)
        self.device, self.precision, self.clip_norm = device, precision, fc.clip_norm
        torch.manual_seed(seed)  # head initialisation and dropout
        cfg = dataclasses.replace(backbone.config, dropout=fc.dropout)
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
        import torch
        import torch.nn.functional as F

        from tinyelectra.runtime import autocast_context
        from tinyelectra.optim import apply_update

        ids, types, mask = _tensors(batch, self.device)
        with autocast_context(self.precision, self.device):
            out = self.model(ids, types, mask)  # (B, C)
        regression = self.spec.is_regression
        target = torch.from_numpy(batch.labels.astype(np.float32 if regression else np.int64)).to(self.device)
        loss = F.mse_loss(out.float().squeeze(-1), target) if regression else F.cross_entropy(out.float(), target)
        self.scaler.scale(loss).backward()
        self.optimizer.set_lr(lr)
        apply_update(self.params, self.optimizer, self.scaler, self.clip_norm)  # the trainer's unscale, clip, step (optim.py)
        return loss


def _diverged_line(what: str, task: str, seed: int, lr: float, peak_lr: float) -> str:
    return (f"fine-tuning diverged on {task}, seed {seed}: {what} (learning rate {lr:.3g}, peak {peak_lr:.3g}); this "
            "seed's model was dropped (glue.json keeps the tasks and seeds finished before it). Try a lower learning "
            f"rate, e.g. half the peak: --set finetune.lr={peak_lr / 2:.3g}")


def finetune(backbone, task: str, enc: EncodedTask, fc: FinetuneConfig, seed: int, device, precision: str,
             on_step: Callable[[int, float | None], None] | None = None):
    """Fine-tune a fresh Classifier from `backbone` on one task with one seed. Returns (model, facts dict). A loss
    that is not finite (checked where it is read: every 10th step and the last) or non-finite weights at the end
    raise Diverged: nothing of this seed is returned."""
    from tinyelectra.optim import lr_at
    from tinyelectra.runtime import nonfinite_parameters, synchronize

    run = Finetuner(backbone, task, fc, seed, device, precision)
    n = len(enc.train)
    per_epoch, total = plan_steps(n, fc.batch_size, fc.task_epochs(task))
    warmup = fc.warmup_fraction * total  # official: num_train_steps * warmup_proportion (a float)
    losses, last_loss = [], float("nan")
    t0 = time.perf_counter()
    lengths = enc.train.lengths if fc.batching == "length" else None
    for done, idx in enumerate(batch_indices(n, fc.batch_size, total, seed, lengths), start=1):
        # padded to this batch's longest row; the first step runs at lr_at(0) = 0, as the official schedule
        lr = lr_at(done - 1, run.peak_lr, warmup, total)
        loss = run.step(enc.train.batch(idx), lr)
        report_now = done % 10 == 0 or done == total
        if report_now or device.type == "cpu":
            losses.append(loss.item())  # host sync: every step on CPU (free), every 10th on GPU
        if report_now:
            last_loss = sum(losses) / len(losses)
            losses.clear()
            if not math.isfinite(last_loss):
                first = done - (done - 1) % 10 if device.type == "cpu" else done  # the steps whose losses were read
                where = f"step {done}" if first == done else f"steps {first}-{done}"
                raise Diverged(_diverged_line(f"the {task} loss is {last_loss} in {where} of {total}", task, seed, lr,
                                              run.peak_lr))
        if on_step is not None:
            on_step(done, last_loss if report_now else None)
    synchronize(device)
    if names := nonfinite_parameters(run.model):  # a last update that left non-finite weights
        raise Diverged(_diverged_line(f"the weights hold non-finite values after the last step, {total} ({names[0]})",
                                      task, seed, lr, run.peak_lr))
    return run.model, {"steps": total, "steps_per_epoch": per_epoch, "train_rows": n, "peak_lr": run.peak_lr,
                       "warmup_steps": warmup, "final_loss": last_loss, "train_seconds": time.perf_counter() - t0}
