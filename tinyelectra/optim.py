"""Optimizers and schedules: the paper's Adam (no bias correction), parameter groups, warm-up + linear decay,
and layer-wise learning-rate decay for fine-tuning.

The paper's Adam (official optimization.py, "AdamWeightDecayOptimizer"):
    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr * (m / (sqrt(v) + eps) + wd * p)
with no bias correction. torch's AdamW computes lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) and p *= 1 - lr*wd, so
running torch's fused (or multi-tensor) AdamW with, at each step t,
    lr' = lr * bc1 / sqrt(bc2),   eps' = eps / sqrt(bc2),   wd' = wd * sqrt(bc2) / bc1
(bc1 = 1 - b1^t, bc2 = 1 - b2^t) gives exactly the paper's update, in one fused kernel per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from tinyelectra.config import OptimConfig
from tinyelectra.errors import UserError


def lr_at(step: int, peak_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The official schedule: warm-up and linear decay applied at the same time; 0 at step 0 and at the end."""
    warm = min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0
    return peak_lr * warm * max(0.0, 1.0 - step / total_steps)


def no_decay(name: str, param: nn.Parameter) -> bool:
    """LayerNorm weights and every bias are excluded from weight decay (official code: 'LayerNorm', 'bias')."""
    return param.ndim < 2 or name.endswith("bias") or ".norm" in name or name.startswith("norm")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, skip = [], []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (skip if no_decay(name, p) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": skip, "weight_decay": 0.0}]


class PaperAdam(torch.optim.AdamW):
    """Adam without bias correction and with decoupled weight decay, as the paper, on torch's fused AdamW kernel.

    Each parameter group counts its own steps (`paper_step` in the group, saved with the optimizer state): torch
    counts per parameter, and an engine may step the groups one at a time (DeepSpeed's ZeRO does)."""

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float], eps: float, weight_decay: float, fused: bool | None = None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused, foreach=None if fused else True)
        for g in self.param_groups:
            g["paper_lr"], g["paper_eps"], g["paper_wd"], g["paper_step"] = g["lr"], g["eps"], g["weight_decay"], 0
        # fp16 loss scaling: a fused kernel would skip an overflowing update *inside* the kernel (torch's own step
        # count rolls back) while paper_step advanced, desynchronising the bias-correction cancellation. Without
        # this flag GradScaler checks for inf/NaN itself and does not call step() at all on an overflow.
        self._step_supports_amp_scaling = False

    @property
    def paper_step(self) -> int:
        return max(g["paper_step"] for g in self.param_groups)

    def set_lr(self, lr: float) -> None:
        for g in self.param_groups:
            g["paper_lr"] = lr * g.get("lr_scale", 1.0)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        for g in self.param_groups:
            g["paper_step"] += 1
            t = g["paper_step"]
            b1, b2 = g["betas"]
            bc1, bc2 = 1.0 - b1**t, 1.0 - b2**t
            g["lr"] = g["paper_lr"] * bc1 / math.sqrt(bc2)
            g["eps"] = g["paper_eps"] / math.sqrt(bc2)
            g["weight_decay"] = g["paper_wd"] * math.sqrt(bc2) / bc1
        return super().step(closure)


class TorchAdamW(torch.optim.AdamW):
    """torch's bias-corrected AdamW (fused where available) with the same set_lr interface. Off-recipe."""

    def set_lr(self, lr: float) -> None:
        for g in self.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)


def build_optimizer(model_or_groups: nn.Module | list[dict], cfg: OptimConfig, device_type: str) -> torch.optim.Optimizer:
    """The recipe's optimizer over `model`'s parameters (or given groups, e.g. layer-wise LR groups)."""
    groups = param_groups(model_or_groups, cfg.weight_decay) if isinstance(model_or_groups, nn.Module) else model_or_groups
    betas = (cfg.beta1, cfg.beta2)
    fused = device_type in ("cuda", "cpu")  # torch has fused AdamW kernels for both
    if cfg.name == "adam":
        opt: torch.optim.Optimizer = PaperAdam(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused)
    elif cfg.name == "adamw":
        opt = TorchAdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused)
    else:
        try:
            import bitsandbytes as bnb  # noqa: PLC0415
        except ImportError:
            raise UserError("optim.name = adamw8bit needs bitsandbytes: pip install 'tinyelectra[bnb]'") from None
        opt = bnb.optim.AdamW8bit(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
        opt.set_lr = TorchAdamW.set_lr.__get__(opt)  # type: ignore[attr-defined]
    return opt


def layerwise_lr_scales(num_layers: int, decay: float, official_off_by_one: bool = False) -> dict[str, float]:
    """Learning-rate multipliers by depth for fine-tuning (REFERENCE §5).

    Depth 0 is the embeddings (and the E->H projection), layer j is depth j+1, the task head is the top.
    The paper's intended form puts the head at depth L+1, so the top layer gets decay^1; the official code puts
    it at L+2, so the top layer gets decay^2 (its maintainer confirmed the off-by-one).
    Returns {"embeddings": s, "layer.0": s, ..., "head": 1.0}.
    """
    top = num_layers + 2 if official_off_by_one else num_layers + 1
    scales = {"embeddings": decay ** (top - 0), "head": 1.0}
    for j in range(num_layers):
        scales[f"layer.{j}"] = decay ** (top - (j + 1))
    return scales
