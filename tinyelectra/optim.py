"""Optimizers and schedules: the paper's Adam (no bias correction), parameter groups, warm-up + linear decay,
and layer-wise learning-rate decay for fine-tuning.

The paper's Adam (official optimization.py, "AdamWeightDecayOptimizer"):
    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr * (m / (sqrt(v) + eps) + wd * p)
with no bias correction. torch's AdamW computes lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) and p *= 1 - lr*wd, so
running torch's fused (or multi-tensor) AdamW with, at each step t,
    lr' = lr * bc1 / sqrt(bc2),   eps' = eps / sqrt(bc2),   wd' = wd * sqrt(bc2) / bc1
(bc1 = 1 - b1^t, bc2 = 1 - b2^t) gives exactly the paper's update, in one fused kernel per step.

How a step is applied: `apply_update` (eager: GradScaler, clip_grad_norm_, PaperAdam), `GraphSafeUpdate` (per-tensor,
a tensor learning rate: compiled under CUDA graphs) or `FlatUpdate` (train.update = flat: flat buffers, one norm, the
fused kernel once per parameter group at a step count where its bias corrections are exactly 1).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

import torch
from torch import nn

from tinyelectra.config import OptimConfig
from tinyelectra.errors import UserError
from tinyelectra.runtime import compile_note, maybe_compile


def lr_at(step: int, peak_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The official schedule: warm-up and linear decay applied at the same time; 0 at step 0 and at the end."""
    warm = min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0
    return peak_lr * warm * max(0.0, 1.0 - step / total_steps)


def no_decay(name: str, param: nn.Parameter) -> bool:
    """LayerNorm weights and every bias are excluded from weight decay (official code: 'LayerNorm', 'bias')."""
    return param.ndim < 2 or name.endswith("bias") or ".norm" in name or name.startswith("norm")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: the parameters with weight decay, then those without (no_decay); a shared parameter once."""
    groups: dict[bool, list[nn.Parameter]] = {False: [], True: []}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        groups[no_decay(name, p)].append(p)
    return [{"params": groups[skip], "weight_decay": 0.0 if skip else weight_decay} for skip in (False, True)]


class PaperAdam(torch.optim.AdamW):
    """Adam without bias correction and with decoupled weight decay, as the paper, on torch's fused AdamW kernel.

    Each parameter group counts its own steps (`paper_step` in the group, saved with the optimizer state): torch
    counts per parameter, and an engine may step the groups one at a time (DeepSpeed's ZeRO does)."""

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 fused: bool | None = None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused,
                         foreach=None if fused else True)
        for g in self.param_groups:
            g["paper_lr"], g["paper_eps"], g["paper_wd"], g["paper_step"] = g["lr"], g["eps"], g["weight_decay"], 0
        # fp16 loss scaling: a fused kernel would skip an overflowing update *inside* the kernel (torch's own step
        # count rolls back) while paper_step advanced, desynchronising the bias-correction cancellation. Without
        # this flag GradScaler checks for inf/NaN itself and does not call step() at all on an overflow.
        self._step_supports_amp_scaling = False

    @property
    def paper_step(self) -> int:
        return max(g["paper_step"] for g in self.param_groups)

    def state_dict(self) -> dict:  # type: ignore[override]
        """torch's, with each group's `paper_step` read from its parameters' step counts (on the device) first: the
        graph-safe fp16 update skips an overflowing step on the device, where the host cannot see it (one host sync,
        only where a state is saved). Every other path keeps the two equal anyway."""
        for g in self.param_groups:
            steps = [self.state[p]["step"] for p in g["params"] if "step" in self.state.get(p, {})]
            if steps:
                g["paper_step"] = int(torch.stack([t.float().to(steps[0].device) for t in steps]).max().item())
        return super().state_dict()

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


def paper_adam_foreach_(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                        exp_avg_sqs: list[torch.Tensor], lr: torch.Tensor, beta1: float, beta2: float, eps: float,
                        weight_decay: float) -> None:
    """One step of the paper's Adam (the module docstring's formula) on lists of tensors, `lr` a 0-dim tensor on their
    device. Only `lr` changes between steps, so torch.compile captures this once and a CUDA graph replays it
    (PaperAdam.step's per-step float lr, eps and weight decay would recompile per step inside a captured region)."""
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(exp_avgs, denom)
    if weight_decay:
        torch._foreach_add_(update, params, alpha=weight_decay)
    torch._foreach_mul_(update, lr)
    torch._foreach_sub_(params, update)


GRAD_NORMS = ("stack", "one-op")  # how the compiled update computes the global gradient norm (see total_norm)


@torch.library.custom_op("tinyelectra::total_norm", mutates_args=())
def _total_norm_op(tensors: list[torch.Tensor], ord: float) -> torch.Tensor:
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors, ord)), ord)


@_total_norm_op.register_fake
def _(tensors: list[torch.Tensor], ord: float) -> torch.Tensor:
    return tensors[0].new_empty((), dtype=torch.float32)


def total_norm(tensors: list[torch.Tensor], ord: float = 2.0, how: str = "stack") -> torch.Tensor:
    """The `ord`-norm of all `tensors` together (0-dim, fp32 tensors): clip_grad_norm_'s arithmetic, per-tensor norms
    by torch's multi-tensor kernel (`_foreach_norm`), then the norm of those. `how`:
      "stack": as written here, traced by torch.compile: inductor calls `_foreach_norm` (3 + 1 launches for ~300
               tensors on CUDA) and lowers the `torch.stack` of its ~300 0-dim results into one copy kernel per tensor
               (the H200 profile: benchmarks/results/h200-2026-11-26/README.md).
      "one-op": the same three calls as one custom operator (`tinyelectra::total_norm`) that inductor does not look
               into: eager `_foreach_norm`, aten's stack (batched copies: a few launches) and the last norm.
    The same mathematics; the last reduction's summation order may differ (float rounding). Which one pays is for a
    GPU profile to say (benchmarks/throughput.py --grad-norm)."""
    if how == "one-op":
        return _total_norm_op(tensors, float(ord))
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors, ord)), ord)


def grad_norm_setting() -> str:
    """TINYELECTRA_GRAD_NORM (stack | one-op; default stack): how the graph-safe update computes the gradient norm."""
    how = os.environ.get("TINYELECTRA_GRAD_NORM", "stack")
    if how not in GRAD_NORMS:
        raise UserError(f"TINYELECTRA_GRAD_NORM={how!r}: use {' or '.join(GRAD_NORMS)}")
    return how


def paper_adam_masked_(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                       exp_avg_sqs: list[torch.Tensor], lr: torch.Tensor, beta1: float, beta2: float, eps: float,
                       weight_decay: float, skip: torch.Tensor) -> None:
    """`paper_adam_foreach_` on copies, written back only where `skip` (a 0-dim bool tensor) is False: a step whose
    gradients overflowed leaves the weights and both moments exactly as they were, decided on the device (no host
    sync), as torch.amp.GradScaler's skipped `optimizer.step()` does."""
    ps, ms, vs = ([t.clone() for t in ts] for ts in (params, exp_avgs, exp_avg_sqs))
    paper_adam_foreach_(ps, grads, ms, vs, lr, beta1, beta2, eps, weight_decay)
    for olds, news in ((params, ps), (exp_avgs, ms), (exp_avg_sqs, vs)):
        for old, new in zip(olds, news):
            old.copy_(torch.where(skip, old, new))


class GraphSafeUpdate:
    """One optimizer step — clip to the global norm, then the paper's Adam — whose only per-step input is the learning
    rate, in 0-dim device tensors (one per group): compiled (e.g. "reduce-overhead", CUDA graphs) it is captured once;
    the per-step bookkeeping (`paper_step`, the lr fill, zeroing gradients) stays outside. It steps a PaperAdam on
    the optimizer's own state (as torch's fused AdamW keeps it), so resume states are the same whichever path wrote
    them; it equals `apply_update` to float rounding (tests/test_gpu_path.py compares them).

    fp16 (`scaler`: an enabled torch.amp.GradScaler): its dynamic loss scaling on the device, on the scaler's own
    scale and growth-tracker tensors: unscale, the overflow check (a NaN or inf in any gradient), the skipped step
    (weights, moments and step counts kept, via `paper_adam_masked_`) and the scale's update (halved after an
    overflow, doubled after `growth_interval` clean steps, as `torch._amp_update_scale_`), with no host sync, so CUDA
    graphs capture it too. The scaler's state_dict and `scale()` read the same tensors; PaperAdam.state_dict reads
    the step counts the device kept (tests/test_gpu_path.py compares all of it with GradScaler + apply_update)."""

    def __init__(self, optimizer: PaperAdam, clip_norm: float, compile_setting: str = "off",
                 device: torch.device | None = None, scaler: torch.amp.GradScaler | None = None,
                 grad_norm: str | None = None) -> None:
        if not isinstance(optimizer, PaperAdam):
            raise UserError("a graph-safe update needs the paper's Adam (optim.name = adam), not "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.clip_norm = float(clip_norm)
        self.grad_norm = grad_norm or grad_norm_setting()
        first = next(p for g in optimizer.param_groups for p in g["params"])
        device = device or first.device
        self.lrs = [torch.zeros((), device=first.device) for _ in optimizer.param_groups]
        self.constants = tuple((float(g["betas"][0]), float(g["betas"][1]), float(g["paper_eps"]), float(g["paper_wd"]))
                               for g in optimizer.param_groups)
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        if self.scaler is not None:
            # creates its scale and growth tracker on the device
            self.scaler.scale(torch.zeros((), device=first.device))
            self.scaling = (float(self.scaler.get_growth_factor()), float(self.scaler.get_backoff_factor()),
                            int(self.scaler.get_growth_interval()))
        self.compiled = compile_setting != "off"
        self.fn, note = maybe_compile(self._step, compile_setting, device, fullgraph=True) if self.compiled \
            else (self._step, "compile: off")
        self._note = note.replace("compile: ", "", 1)

    @property
    def note(self) -> str:
        what = "clip + paper Adam" + (" + fp16 loss scaling on the device" if self.scaler is not None else "")
        norm = "" if self.grad_norm == "stack" else f", gradient norm as {self.grad_norm}"
        return (f"update: {what} as one graph-safe function{norm}, "
                + compile_note(self.fn, self._note).replace("compile: ", "", 1))

    def _step(self, params, grads, exp_avgs, exp_avg_sqs, steps, lrs, scaling=()) -> None:
        """The step on per-group lists (`_lists`), `lrs` 0-dim tensors, `scaling` fp16's (scale, growth tracker) or ().
        finetune.StaticStep calls it inside its own captured CUDA graph."""
        flat = [g for group in grads for g in group]
        coef, skip = None, None
        if scaling:  # fp16: the gradients are the scaled loss's; torch.amp.GradScaler's arithmetic, on the device
            scale, tracker = scaling
            inv_scale = scale.double().reciprocal().float()  # as GradScaler.unscale_: exact for its powers of two
            total = total_norm(flat, 2.0, self.grad_norm)  # of the scaled gradients: NaN if any gradient is NaN
            skip = torch.isnan(total) | ~torch.isfinite(total_norm(flat, math.inf, self.grad_norm))  # any NaN or inf
            total = total * inv_scale  # the unscaled gradients' norm (scaling by a power of two is exact)
            coef = inv_scale
        if self.clip_norm > 0:  # torch.nn.utils.clip_grad_norm_'s arithmetic, without its host-side grouping
            if not scaling:
                total = total_norm(flat, 2.0, self.grad_norm)
            clip = torch.clamp(self.clip_norm / (total + 1e-6), max=1.0)
            # inv_scale * clip: exact, so (g * inv) * clip == g * (inv * clip)
            coef = clip if coef is None else coef * clip
        if coef is not None:
            # scaled copies: CUDA graphs are skipped for a function that writes in place to an input whose address is
            # not static ("mutated inputs"), and the gradients are new tensors every step
            grads = [torch._foreach_mul(group, coef) if group else group for group in grads]
        for i, (beta1, beta2, eps, wd) in enumerate(self.constants):
            if params[i]:
                if skip is None:
                    paper_adam_foreach_(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], lrs[i], beta1, beta2, eps, wd)
                    torch._foreach_add_(steps[i], 1.0)
                else:
                    paper_adam_masked_(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], lrs[i], beta1, beta2, eps, wd,
                                       skip)
                    torch._foreach_add_(steps[i], (~skip).float())
        if scaling:  # torch._amp_update_scale_'s rule, with tensors
            growth, backoff, interval = self.scaling
            clean = tracker + 1
            due = ~skip & (clean == interval)
            grown = scale * growth
            scale.copy_(torch.where(skip, scale * backoff, torch.where(due & torch.isfinite(grown), grown, scale)))
            tracker.copy_(torch.where(skip | due, torch.zeros_like(tracker), clean))

    def _lists(self) -> tuple:
        """Per group: the parameters with gradients, their gradients and state (created as torch's fused AdamW
        would)."""
        out: tuple = ([], [], [], [], [])
        for g in self.optimizer.param_groups:
            ps = [p for p in g["params"] if p.grad is not None]
            for p in ps:
                st = self.optimizer.state[p]
                if "exp_avg" not in st:
                    st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if self.compiled:  # CUDA graphs: weights and state updated in place at fixed addresses
                    self._mark_static(p, st["exp_avg"], st["exp_avg_sq"], st["step"])
            out[0].append(ps)
            out[1].append([p.grad for p in ps])
            out[2].append([self.optimizer.state[p]["exp_avg"] for p in ps])
            out[3].append([self.optimizer.state[p]["exp_avg_sq"] for p in ps])
            out[4].append([self.optimizer.state[p]["step"] for p in ps])
        return out

    def _scaling(self) -> tuple:
        """fp16: the scaler's (scale, growth tracker) tensors, which this update reads and writes; () otherwise."""
        if self.scaler is None:
            return ()
        state = (self.scaler._scale, self.scaler._growth_tracker)  # GradScaler's own tensors: its state_dict reads them
        if self.compiled:
            self._mark_static(*state)
        return state

    @staticmethod
    def _mark_static(*tensors: torch.Tensor) -> None:
        for t in tensors:
            if getattr(t, "_dynamo_static_input_type", None) is None:  # not marked yet (e.g. state loaded on resume)
                torch._dynamo.mark_static_address(t)

    def _run(self, lrs: list[float], lists: tuple) -> None:
        for t, lr in zip(self.lrs, lrs):
            t.fill_(lr)  # outside the captured function: the only per-step input is this tensor's value
        if self.compiled:
            self._mark_static(*self.lrs)
        self.fn(*lists, self.lrs, self._scaling())

    @torch.no_grad()
    def __call__(self) -> None:
        """Step with the learning rates `optimizer.set_lr` gave, then zero the gradients. `paper_step` counts the
        call; under fp16 a step skipped on the device is taken back where the host reads it (PaperAdam.state_dict)."""
        self._run([g["paper_lr"] for g in self.optimizer.param_groups], self._lists())
        for g in self.optimizer.param_groups:
            g["paper_step"] += 1
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def dry_run(self) -> None:
        """The (compiled) step once at learning rate 0, the parameters, optimizer state and loss scale put back
        exactly: it compiles — or fails to, before training — without changing anything."""
        lists = self._lists()
        state = [t for part in (lists[0], *lists[2:]) for group in part for t in group] + list(self._scaling())
        saved = [t.clone() for t in state]
        self._run([0.0] * len(self.lrs), lists)
        for t, c in zip(state, saved):
            t.copy_(c)


# bias corrections 1 - beta^t at this step count are exactly 1 in float32 and float64 (beta^(2^40) underflows to 0 for
# every beta < 1 - 1e-9): torch's fused AdamW kernel run at it computes the paper's Adam, with no per-step constants
FLAT_ALIGN = 4  # elements (16 bytes of fp32) each parameter's span starts on: a 1-element bias would leave every
#                later parameter misaligned, and inductor compiles misaligned inputs without vectorised loads
NO_BIAS_CORRECTION_STEP = 2.0**40


class FlatUpdate:
    """The update as one pass (train.update = flat): the weights, Adam's two moments and the step counts in flat fp32
    buffers, each parameter (and each optimizer state tensor) a view into them, parameter group by parameter group;
    each step the gradients gathered into a flat buffer of their own (one multi-tensor copy, `torch._foreach_copy_`,
    into a buffer allocated once, cheaper than a fresh `torch.cat` per step), the clip's global norm one reduction over
    it, and the paper's Adam one pass of torch's fused AdamW kernel per parameter group (two for pre-training: decay,
    no decay) — eager aten kernels, out of inductor, about ten launches per step whatever the number of parameters
    (the per-tensor update's grow with depth; both counted in benchmarks/NOTES.md, issue 33). No host sync: the learning
    rates are 0-dim device tensors filled before the step, so the step can be captured in a CUDA graph as it is.

    The paper's Adam on torch's fused kernel: run at a step count of 2^40 (NO_BIAS_CORRECTION_STEP) the kernel's bias
    corrections are exactly 1, so it computes m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p = p (1 - lr wd) -
    lr m / (sqrt(v) + eps): the paper's formula (optim.py's docstring) with no per-step lr, eps or decay to fold in.
    The clip's factor min(1, clip / (norm + 1e-6)) reaches the kernel as its `grad_scale` (the gradients are divided
    by 1 / factor, one rounding more than clip_grad_norm_'s product; a factor of 1 is exact). The same mathematics as
    `apply_update`; the float rounding differs (the norm's summation order, the clip's division, the kernel's fixed
    bias corrections): tests/test_optim.py bounds it over many steps.

    fp16 (`scaler`: an enabled GradScaler): GradScaler's own kernels on the flat gradient, on its own scale and
    growth-tracker tensors: `_amp_foreach_non_finite_check_and_unscale_` (the overflow check and the unscale, one
    pass), the fused kernel's `found_inf` (an overflowing step leaves weights, moments and step counts as they
    were) and `_amp_update_scale_`: GradScaler's arithmetic, on the device.

    Resume states: the optimizer's state is PaperAdam's (per-parameter `exp_avg`, `exp_avg_sq`, `step`, views into
    the buffers), so its state_dict is the same format whichever update wrote it; a loaded state is copied into the
    buffers (a load_state_dict post-hook). Every parameter must have a gradient at every step (torch's Adam would skip
    one without; the flat pass cannot): a missing one is an error, not a silent zero."""

    def __init__(self, optimizer: PaperAdam, clip_norm: float, scaler: torch.amp.GradScaler | None = None) -> None:
        if not isinstance(optimizer, PaperAdam):
            raise UserError("train.update=flat needs the paper's Adam (optim.name = adam), not "
                            f"{type(optimizer).__name__}")
        self.optimizer, self.clip_norm = optimizer, float(clip_norm)
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        if any(p.dtype != torch.float32 for p in self.params) or len({p.device for p in self.params}) != 1:
            raise UserError("train.update=flat needs fp32 parameters on one device")
        dev = self.params[0].device
        self.spans, self.groups, start = [], [], 0
        for g in optimizer.param_groups:
            first = start
            for p in g["params"]:
                start = -(-start // FLAT_ALIGN) * FLAT_ALIGN  # 16-byte aligned: compiled kernels vectorise their loads
                self.spans.append((start, start + p.numel()))
                start += p.numel()
            self.groups.append((first, start, float(g["betas"][0]), float(g["betas"][1]), float(g["paper_eps"]),
                                float(g["paper_wd"])))
        self.weights = torch.zeros(start, device=dev)  # the gaps stay 0: no gradient, no moment, no decay moves them
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.weights), torch.zeros_like(self.weights)
        self.grads = torch.zeros_like(self.weights)  # each step's gradients, gathered
        self.grad_views = [self.grads[a:b].view_as(p) for p, (a, b) in zip(self.params, self.spans)]
        self.steps = torch.zeros(len(self.params), device=dev)
        with torch.no_grad():
            for p, (a, b) in zip(self.params, self.spans):
                self.weights[a:b].copy_(p.detach().reshape(-1))
                p.data = self.weights[a:b].view_as(p)  # the same Parameter object, now a view: the model is unchanged
        self.lrs = [torch.zeros((), device=dev) for _ in self.groups]
        self.no_bias_correction = torch.full((), NO_BIAS_CORRECTION_STEP, device=dev)
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        if self.scaler is not None:
            self.scaler.scale(torch.zeros((), device=dev))  # creates its scale and growth tracker on the device
            self.found_inf = torch.zeros(1, device=dev)
            self.scaling = (float(self.scaler.get_growth_factor()), float(self.scaler.get_backoff_factor()),
                            int(self.scaler.get_growth_interval()))
        self.adopt_state()
        optimizer.register_load_state_dict_post_hook(lambda _opt: self.adopt_state())

    @property
    def note(self) -> str:
        fp16 = " + fp16 loss scaling on the device" if self.scaler is not None else ""
        return (f"update: flat (weights, gradients and Adam's moments in flat buffers; clip + paper Adam{fp16} in "
                f"{len(self.groups)} fused pass(es), eager, out of inductor)")

    @torch.no_grad()
    def adopt_state(self) -> None:
        """Point the optimizer's per-parameter state at views of the buffers, copying in what it held (a loaded
        resume state, or steps taken by another update); a parameter without state starts at zero."""
        for i, (p, (a, b)) in enumerate(zip(self.params, self.spans)):
            st = self.optimizer.state[p]
            views = {"step": self.steps[i], "exp_avg": self.exp_avg[a:b].view_as(p),
                     "exp_avg_sq": self.exp_avg_sq[a:b].view_as(p)}
            for k, view in views.items():
                if k in st and st[k] is not view:
                    view.copy_(st[k].reshape(view.shape))
                elif k not in st:
                    view.zero_()
                st[k] = view

    def set_lrs(self) -> None:
        """The learning rates `optimizer.set_lr` gave, into the device tensors the step reads (no host sync)."""
        for t, g in zip(self.lrs, self.optimizer.param_groups):
            t.fill_(g["paper_lr"])

    @torch.no_grad()
    def device_step(self) -> None:
        """The step's device work (graph-capturable): gather, (fp16: check and unscale), norm, clip factor, Adam."""
        param_grads = [p.grad for p in self.params]
        if missing := sum(g is None for g in param_grads):
            raise RuntimeError(f"train.update=flat: {missing} parameter(s) without a gradient this step")
        torch._foreach_copy_(self.grad_views, param_grads)
        grads = self.grads  # (P,) one flat gradient
        found_inf = None
        if self.scaler is not None:
            found_inf = self.found_inf.zero_()
            inv_scale = self.scaler._scale.double().reciprocal().float()  # as GradScaler.unscale_
            torch._amp_foreach_non_finite_check_and_unscale_([grads], found_inf, inv_scale)
        divide = None
        if self.clip_norm > 0:  # clip_grad_norm_'s factor, as a divisor for the kernel
            norm = torch.linalg.vector_norm(grads)
            divide = (norm + 1e-6).div(self.clip_norm).clamp(min=1.0)  # 1 / min(1, clip / (norm + 1e-6))
        for (a, b, beta1, beta2, eps, wd), lr in zip(self.groups, self.lrs):
            if b > a:
                torch._fused_adamw_([self.weights[a:b]], [grads[a:b]], [self.exp_avg[a:b]], [self.exp_avg_sq[a:b]], [],
                                    [self.no_bias_correction], lr=lr, beta1=beta1, beta2=beta2, weight_decay=wd,
                                    eps=eps, amsgrad=False, maximize=False, grad_scale=divide, found_inf=found_inf)
        if found_inf is None:
            self.steps.add_(1.0)
        else:
            self.steps.add_(1.0 - found_inf)
            growth, backoff, interval = self.scaling
            torch._amp_update_scale_(self.scaler._scale, self.scaler._growth_tracker, found_inf, growth, backoff,
                                     interval)

    def finish(self) -> None:
        """The host's part after a step: the groups' step counts (`paper_step`; a step fp16 skipped on the device is
        taken back where the host reads it: PaperAdam.state_dict). The gradients are the caller's to release (a
        replayed CUDA graph has none in `p.grad`: step.CapturedStep)."""
        for g in self.optimizer.param_groups:
            g["paper_step"] += 1

    def __call__(self) -> None:
        """One step with the learning rates `optimizer.set_lr` gave, then the gradients released."""
        self.set_lrs()
        self.device_step()
        self.finish()
        self.optimizer.zero_grad(set_to_none=True)

    def _changed_by_step(self) -> tuple[torch.Tensor, ...]:
        """Everything a step changes: weights, moments, step counts and fp16's scale and growth tracker."""
        scaling = (self.scaler._scale, self.scaler._growth_tracker) if self.scaler is not None else ()
        return (self.weights, self.exp_avg, self.exp_avg_sq, self.steps, *scaling)

    def snapshot(self) -> list[torch.Tensor]:
        """Copies of everything a step changes: `restore` puts them back."""
        return [t.clone() for t in self._changed_by_step()]

    @torch.no_grad()
    def restore(self, saved: list[torch.Tensor]) -> None:
        for t, c in zip(self._changed_by_step(), saved):
            t.copy_(c)


def apply_update(params: list[torch.Tensor], optimizer, scaler: torch.amp.GradScaler, clip_norm: float) -> torch.Tensor:
    """Unscale, clip the global norm, step (skipped by the scaler on inf/NaN), update the scale, zero the grads.
    The learning rate was set before (`optimizer.set_lr`)."""
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(params, clip_norm if clip_norm > 0 else float("inf"), foreach=True)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return norm


class TorchAdamW(torch.optim.AdamW):
    """torch's bias-corrected AdamW (fused where available) with the same set_lr interface. Off-recipe."""

    def set_lr(self, lr: float) -> None:
        for g in self.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)


def build_optimizer(model_or_groups: nn.Module | list[dict], cfg: OptimConfig,
                    device_type: str) -> torch.optim.Optimizer:
    """The recipe's optimizer over `model`'s parameters (or given groups, e.g. layer-wise LR groups)."""
    groups = param_groups(model_or_groups, cfg.weight_decay) if isinstance(model_or_groups, nn.Module) \
        else model_or_groups
    kw = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    fused = device_type in ("cuda", "cpu")  # torch has fused AdamW kernels for both
    if cfg.name == "adam":
        return PaperAdam(groups, **kw, fused=fused)
    if cfg.name == "adamw":
        return TorchAdamW(groups, **kw, fused=fused)
    try:
        import bitsandbytes as bnb  # noqa: PLC0415
    except ImportError:
        raise UserError("optim.name = adamw8bit needs bitsandbytes: pip install 'tinyelectra[bnb]'") from None
    opt = bnb.optim.AdamW8bit(groups, **kw)
    opt.set_lr = TorchAdamW.set_lr.__get__(opt)  # type: ignore[attr-defined]
    return opt


def layerwise_lr_scales(num_layers: int, decay: float, official_off_by_one: bool = False) -> dict[str, float]:
    """Learning-rate multipliers by depth for fine-tuning (the paper's fine-tuning appendix; official
    model/optimization.py).

    Depth 0 is the embeddings (and the E->H projection), layer j is depth j+1, the task head is the top.
    The paper's intended form puts the head at depth L+1, so the top layer gets decay^1; the official code puts
    it at L+2, so the top layer gets decay^2 (its maintainer confirmed the off-by-one).
    Returns {"embeddings": s, "head": 1.0, "layer.0": s, ...}."""
    top = num_layers + 2 if official_off_by_one else num_layers + 1
    return {"embeddings": decay**top, "head": 1.0,
            **{f"layer.{j}": decay ** (top - (j + 1)) for j in range(num_layers)}}
