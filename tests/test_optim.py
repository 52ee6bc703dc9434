"""Optimizers and schedules (optim.py) against hand-written references.

PaperAdam must equal the official AdamWeightDecayOptimizer's formula (no bias correction, decoupled decay):
    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr * (m / (sqrt(v) + eps) + wd * p)
implemented here in float64, independently of torch.optim.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tinyelectra.config import ModelConfig, OptimConfig
from tinyelectra.model import Electra, GeneratorHead
from tinyelectra.optim import PaperAdam, TorchAdamW, build_optimizer, layerwise_lr_scales, lr_at, param_groups


pytestmark = pytest.mark.usefixtures("one_thread")


def reference_paper_adam(params, grads_per_step, lrs, groups, b1=0.9, b2=0.999, eps=1e-6):
    """float64 paper Adam. `groups`: list of (indices into params, weight_decay, lr_scale)."""
    p = [x.double().clone() for x in params]
    m = [torch.zeros_like(x) for x in p]
    v = [torch.zeros_like(x) for x in p]
    for grads, lr in zip(grads_per_step, lrs):
        for idx, wd, scale in groups:
            for i in idx:
                g = grads[i].double()
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                p[i] = p[i] - lr * scale * (m[i] / (v[i].sqrt() + eps) + wd * p[i])
    return p


@pytest.mark.parametrize("fused", [True, False])  # torch's fused CPU kernel and the multi-tensor (foreach) path
def test_paper_adam_equals_the_paper_formula(fused):
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2), (11,)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    steps = 300
    grads = [[torch.randn(s, generator=gen) * (0.1 + i % 3) for s in shapes] for i in range(steps)]
    lrs = [lr_at(t, 1e-2, warmup_steps=30, total_steps=steps + 1) for t in range(1, steps + 1)]
    groups = [([0, 2], 0.01, 1.0), ([1], 0.0, 1.0), ([3], 0.05, 0.5)]
    params = [nn.Parameter(x.clone()) for x in init]
    opt = PaperAdam(
        [{"params": [params[i] for i in idx], "weight_decay": wd, "lr_scale": scale} for idx, wd, scale in groups],
        lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, fused=fused,
    )
    for g_step, lr in zip(grads, lrs):
        for p, g in zip(params, g_step):
            p.grad = g.clone()
        opt.set_lr(lr)
        opt.step()
    want = reference_paper_adam(init, grads, lrs, groups)
    for p, w in zip(params, want):
        assert torch.allclose(p.double(), w, rtol=0, atol=1e-5), (p.double() - w).abs().max()  # fp32 rounding over 300 steps: ~2e-6
    # Control: torch's bias-corrected AdamW on the same inputs lands measurably elsewhere.
    params2 = [nn.Parameter(x.clone()) for x in init]
    opt2 = TorchAdamW([{"params": [params2[i] for i in idx], "weight_decay": wd, "lr_scale": scale} for idx, wd, scale in groups],
                      lr=1e-2, betas=(0.9, 0.999), eps=1e-6)
    for g_step, lr in zip(grads, lrs):
        for p, g in zip(params2, g_step):
            p.grad = g.clone()
        opt2.set_lr(lr)
        opt2.step()
    assert max((p.double() - w).abs().max().item() for p, w in zip(params2, want)) > 1e-3


def test_paper_adam_first_step_by_hand():
    """Step 1 without bias correction: m = 0.1 g, v = 0.001 g^2, so the update is lr * 0.1 g / (sqrt(0.001) |g| + eps)."""
    p = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    p.grad = torch.tensor([0.5, 0.25], dtype=torch.float64)
    opt = PaperAdam([p], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, fused=False)
    opt.step()
    want = [1.0 - 0.1 * 0.05 / (math.sqrt(0.001) * 0.5 + 1e-6), -2.0 - 0.1 * 0.025 / (math.sqrt(0.001) * 0.25 + 1e-6)]
    assert torch.allclose(p.detach(), torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # bias-corrected Adam would have moved each entry by ~lr = 0.1; the paper's moves by ~0.1 * 0.1 / 0.0316 = 0.316
    assert abs(p.detach()[0].item() - 1.0) > 0.3


def test_paper_adam_resumes_exactly():
    torch.manual_seed(0)
    grads = [torch.randn(6) for _ in range(20)]
    a = nn.Parameter(torch.ones(6))
    opt_a = PaperAdam([a], lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, fused=True)
    for g in grads:
        a.grad = g.clone()
        opt_a.step()
    b = nn.Parameter(torch.ones(6))
    opt_b = PaperAdam([b], lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, fused=True)
    for g in grads[:10]:
        b.grad = g.clone()
        opt_b.step()
    state = opt_b.state_dict()
    c = nn.Parameter(b.detach().clone())
    opt_c = PaperAdam([c], lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, fused=True)
    opt_c.load_state_dict(state)
    assert opt_c.paper_step == 10
    for g in grads[10:]:
        c.grad = g.clone()
        opt_c.step()
    assert torch.equal(a.detach(), c.detach())


def _expected_no_decay(model: nn.Module) -> set[int]:
    """By module type: LayerNorm weights and biases, every bias (Linear's and the generator's output bias)."""
    skip = set()
    for mod in model.modules():
        if isinstance(mod, nn.LayerNorm):
            skip |= {id(mod.weight), id(mod.bias)}
        elif isinstance(mod, nn.Linear) and mod.bias is not None:
            skip.add(id(mod.bias))
        elif isinstance(mod, GeneratorHead):
            skip.add(id(mod.bias))
    return skip


def test_weight_decay_excludes_layernorm_and_biases():
    model = Electra(ModelConfig(vocab_size=300, embedding_size=16, hidden_size=32, num_layers=2, num_heads=2, ffn_size=64, max_positions=32))
    decay, skip = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and skip["weight_decay"] == 0.0
    want_skip = _expected_no_decay(model)
    assert {id(p) for p in skip["params"]} == want_skip
    all_params = {id(p) for p in model.parameters()}
    assert {id(p) for p in decay["params"]} == all_params - want_skip
    assert id(model.embeddings.word.weight) in {id(p) for p in decay["params"]}  # embeddings are decayed, as official
    # Behaviour: with zero gradients the only change is decay, p *= 1 - lr * wd, and only on the decayed group.
    opt = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.01), "cpu")
    before = {id(p): p.detach().clone() for p in model.parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.set_lr(0.1)
    opt.step()
    for p in model.parameters():
        factor = 1.0 if id(p) in want_skip else 1 - 0.1 * 0.01
        assert torch.allclose(p.detach(), before[id(p)] * factor, rtol=1e-6, atol=1e-9)


def test_lr_schedule_hand_values():
    # Official: lr * min(1, step / warmup) * (1 - step / total), warm-up and decay at the same time.
    peak, warm, total = 5e-4, 10_000, 1_000_000
    cases = {0: 0.0, 5_000: 5e-4 * 0.5 * 0.995, 10_000: 5e-4 * 0.99, 500_000: 2.5e-4, 750_000: 1.25e-4, 1_000_000: 0.0}
    for step, want in cases.items():
        assert lr_at(step, peak, warm, total) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert lr_at(1_000_001, peak, warm, total) == 0.0  # never negative past the end
    assert lr_at(5, 1.0, 0, 10) == pytest.approx(0.5)  # no warm-up


def test_layerwise_lr_scales_intended_and_official():
    # 12 layers, decay 0.8. Intended: head 1, top layer 0.8, layer 0 0.8^12, embeddings 0.8^13.
    s = layerwise_lr_scales(12, 0.8)
    assert s["head"] == 1.0
    assert s["layer.11"] == pytest.approx(0.8)
    assert s["layer.10"] == pytest.approx(0.64)
    assert s["layer.0"] == pytest.approx(0.068719476736)  # 0.8^12
    assert s["embeddings"] == pytest.approx(0.0549755813888)  # 0.8^13
    # Official code (off by one, confirmed by its maintainer): every depth one more power of the decay.
    o = layerwise_lr_scales(12, 0.8, official_off_by_one=True)
    assert o["head"] == 1.0
    assert o["layer.11"] == pytest.approx(0.64)
    assert o["layer.0"] == pytest.approx(0.0549755813888)  # 0.8^13
    assert o["embeddings"] == pytest.approx(0.04398046511104)  # 0.8^14
    assert len(s) == len(o) == 14
