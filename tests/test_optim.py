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


def adam_problem(steps: int = 300):
    """Four tensors, `steps` steps of random gradients, the schedule's learning rates and three parameter groups
    (indices, weight decay, lr scale): what the paper-Adam tests give both the optimizer and the reference."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2), (11,)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) * (0.1 + i % 3) for s in shapes] for i in range(steps)]
    lrs = [lr_at(t, 1e-2, warmup_steps=30, total_steps=steps + 1) for t in range(1, steps + 1)]
    groups = [([0, 2], 0.01, 1.0), ([1], 0.0, 1.0), ([3], 0.05, 0.5)]
    return init, grads, lrs, groups


def adam_on(init, groups, cls=PaperAdam, **kwargs):
    """Fresh parameters holding `init`, and a `cls` optimizer over them in `groups` (lr 1e-2, the paper's betas,
    eps)."""
    params = [nn.Parameter(x.clone()) for x in init]
    opt = cls([{"params": [params[i] for i in idx], "weight_decay": wd, "lr_scale": scale}
               for idx, wd, scale in groups], lr=1e-2, betas=(0.9, 0.999), eps=1e-6, **kwargs)
    return params, opt


def feed(params, opt, grads, lrs, step) -> None:
    """Each step's gradients into `params`, its learning rate into `opt`, then `step()`."""
    for g_step, lr in zip(grads, lrs):
        for p, g in zip(params, g_step):
            p.grad = g.clone()
        opt.set_lr(lr)
        step()


@pytest.mark.parametrize("fused", [True, False])  # torch's fused CPU kernel and the multi-tensor (foreach) path
def test_paper_adam_equals_the_paper_formula(fused):
    init, grads, lrs, groups = adam_problem()
    params, opt = adam_on(init, groups, weight_decay=0.0, fused=fused)
    feed(params, opt, grads, lrs, opt.step)
    want = reference_paper_adam(init, grads, lrs, groups)
    for p, w in zip(params, want):
        # fp32 rounding over 300 steps: ~2e-6
        assert torch.allclose(p.double(), w, rtol=0, atol=1e-5), (p.double() - w).abs().max()
    # Control: torch's bias-corrected AdamW on the same inputs lands measurably elsewhere.
    params2, opt2 = adam_on(init, groups, cls=TorchAdamW)
    feed(params2, opt2, grads, lrs, opt2.step)
    assert max((p.double() - w).abs().max().item() for p, w in zip(params2, want)) > 1e-3


def test_paper_adam_first_step_by_hand():
    """Step 1 without bias correction: m = 0.1 g, v = 0.001 g^2, so the update is lr * 0.1 g / (sqrt(0.001) |g| +
    eps)."""
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
    model = Electra(ModelConfig(vocab_size=300, embedding_size=16, hidden_size=32, num_layers=2, num_heads=2,
                                ffn_size=64, max_positions=32))
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


# ----------------------------------------------------------------------------------------------------------------
# the flat update (train.update = flat): one buffer, one norm, one fused pass


FLAT_TOY = ["model.vocab_size=256", "train.seq_len=32", "model.max_positions=32", "model.num_layers=1",
            "train.batch_size=4"]


def flat_twins(layers: int = 1, clip: float = 1.0, scaled: bool = False):
    """Two identical toy models and their paper Adams: [0] stepped by today's update (optim.apply_update: torch's
    clip_grad_norm_ + PaperAdam on the fused kernel; with `scaled`, GradScaler's unscale, skip and scale update),
    [1] by FlatUpdate."""
    from tinyelectra.config import load_recipe
    from tinyelectra.optim import FlatUpdate

    recipe = load_recipe("tiny", [*FLAT_TOY[:3], f"model.num_layers={layers}", FLAT_TOY[4], f"optim.clip_norm={clip}"])
    torch.manual_seed(0)
    models = [Electra(recipe.model) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [build_optimizer(m, recipe.optim, "cpu") for m in models]
    scalers = [torch.amp.GradScaler("cpu", enabled=scaled, init_scale=2.0**10, growth_interval=2) for _ in range(2)]
    if scaled:
        scalers[0].scale(torch.zeros(()))  # GradScaler creates its scale at the first scale() (the trainer's backward)
    return models, opts, scalers, FlatUpdate(opts[1], clip, scaler=scalers[1] if scaled else None)


def drive(models, opts, scalers, flat, steps: int, clip: float, scale: float = 1.0, bad: dict | None = None) -> None:
    """`steps` updates of both twins on the same random gradients (alternately 1 and 0.001 times N(0, 1): above and
    below the clipping norm of 1), `bad` {step: value} putting an inf or NaN into one gradient at that step."""
    from tinyelectra.optim import apply_update

    params = list(models[0].parameters())
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        grads = [torch.randn(p.shape, generator=g) * scale * (0.001 if step % 2 else 1.0) for p in params]
        if bad and step in bad:
            grads[3].view(-1)[0] = bad[step]
        for m, o in zip(models, opts):
            for p, gr in zip(m.parameters(), grads):
                p.grad = gr.clone()
            o.set_lr(1e-3 * (1 + step % 5))
        apply_update(params, opts[0], scalers[0], clip)
        flat()


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_flat_update_is_todays_update_over_many_steps(clip):
    """FlatUpdate against today's update (clip_grad_norm_ + PaperAdam on torch's fused kernel) on the same gradients,
    200 steps, clipping active on every other step (clip 1.0) or off (clip 0), the paper's weight-decay groups (the toy
    model has both): weights, both moments, step counts and paper_step equal. The arithmetic is the same but for
    float rounding in three places (the norm's summation order, the clip factor applied as a division, PaperAdam's
    per-step lr / eps / decay folded for its bias correction against the kernel's exact 1s), each a few ulps of one
    step's update, which is at most ~3.2 lr = 1.6e-2 here (the paper's Adam at step 1: (1-b1)/sqrt(1-b2) lr): 200 steps
    of a few ulps stay far below 5e-6, while the smallest real difference checked below (a lost decay group, the clip
    forgotten) moves weights by more than 1e-4."""
    models, opts, scalers, flat = flat_twins(clip=clip)
    drive(models, opts, scalers, flat, 200, clip)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=5e-6)
    sa, sb = opts[0].state_dict(), opts[1].state_dict()
    assert [g["paper_step"] for g in sa["param_groups"]] == [g["paper_step"] for g in sb["param_groups"]] == [200, 200]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        assert float(sa["state"][k]["step"]) == float(sb["state"][k]["step"]) == 200.0
        torch.testing.assert_close(sa["state"][k]["exp_avg"], sb["state"][k]["exp_avg"], rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(sa["state"][k]["exp_avg_sq"], sb["state"][k]["exp_avg_sq"], rtol=1e-4, atol=1e-12)
    # controls: the tolerance sees the differences that matter
    models, opts, scalers, flat = flat_twins(clip=clip)
    flat.groups = [(a, b, b1, b2, eps, 0.0) for a, b, b1, b2, eps, _ in flat.groups]  # weight decay lost
    drive(models, opts, scalers, flat, 200, clip)
    assert max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[1].parameters())) > 1e-4
    if clip:
        models, opts, scalers, flat = flat_twins(clip=clip)
        flat.clip_norm = 0.0  # the clip forgotten
        drive(models, opts, scalers, flat, 20, clip)
        assert max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[1].parameters())) > 1e-4


def test_flat_update_is_the_paper_formula():
    """Against the float64 paper Adam (no bias correction, decay only on the decay group, group learning rates) of this
    file, 300 steps without clipping: the same bound as PaperAdam's own test (fp32 rounding over 300 steps ~2e-6)."""
    from tinyelectra.optim import FlatUpdate

    init, grads, lrs, groups = adam_problem()
    params, opt = adam_on(init, groups, weight_decay=0.0, fused=True)
    flat = FlatUpdate(opt, clip_norm=0.0)
    feed(params, opt, grads, lrs, flat)
    want = reference_paper_adam(init, grads, lrs, groups)
    for p, w in zip(params, want):
        assert torch.allclose(p.double(), w, rtol=0, atol=1e-5), (p.double() - w).abs().max()


def test_flat_update_lives_in_flat_buffers_and_its_kernel_count_does_not_grow_with_depth():
    """What makes it one pass: every parameter is a view of one weight buffer (and Adam's state of two moment
    buffers), and the update dispatches the same number of aten operators for a 1-layer and a 4-layer model (the
    gradients gathered by one cat, one norm, one fused kernel call per parameter group). Today's update dispatches
    more with every layer (per-tensor norms and products): the control."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tinyelectra.optim import apply_update

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not func.is_view  # views (a gradient's reshape) launch nothing
            return func(*args, **(kwargs or {}))

    counts, today = {}, {}
    for layers in (1, 4):
        models, opts, scalers, flat = flat_twins(layers=layers)
        storages = {p.untyped_storage().data_ptr() for p in models[1].parameters()}
        assert storages == {flat.weights.untyped_storage().data_ptr()}
        base = flat.weights.data_ptr()  # every span 16-byte aligned (the toy model has 1-element and odd-sized tensors)
        assert all((p.data_ptr() - base) % 16 == 0 for p in models[1].parameters())
        assert any(p.numel() % 4 for p in models[1].parameters())  # ... so the gaps are there to see
        state = opts[1].state[next(models[1].parameters())]
        assert state["exp_avg"].untyped_storage().data_ptr() == flat.exp_avg.untyped_storage().data_ptr()
        for m in models:
            for p in m.parameters():
                p.grad = torch.ones_like(p)
        with Count() as c:
            flat()
        counts[layers] = c.ops
        with Count() as c:
            apply_update(list(models[0].parameters()), opts[0], scalers[0], 1.0)
        today[layers] = c.ops
    assert counts[1] == counts[4] <= 16, counts
    assert today[4] > today[1], today


def test_flat_fp16_update_is_grad_scalers_arithmetic():
    """fp16: FlatUpdate with the loss scaler on the device against GradScaler + today's update on the same scaled
    gradients, 9 steps: an inf (step 3) and a NaN (step 6) skip the update and halve the scale, every second clean step
    doubles it (growth_interval 2): the same scales step by step, identical scaler state_dicts (what a resume state
    saves), the same step counts, weights to float rounding (the bound of the test above)."""
    models, opts, scalers, flat = flat_twins(scaled=True)
    trace = []
    real = flat.device_step

    def traced():
        real()
        trace.append(scalers[1].get_scale())

    flat.device_step = traced
    drive(models, opts, scalers, flat, 9, 1.0, scale=2.0**10, bad={2: math.inf, 5: math.nan})
    assert trace == [1024, 2048, 1024, 1024, 2048, 1024, 1024, 2048, 2048]  # the scale after each step
    assert scalers[0].state_dict() == scalers[1].state_dict()
    assert scalers[0].get_scale() == scalers[1].get_scale()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=5e-6)
    sa, sb = opts[0].state_dict(), opts[1].state_dict()
    assert [g["paper_step"] for g in sa["param_groups"]] == [g["paper_step"] for g in sb["param_groups"]] == [7, 7]
    assert all(float(sa["state"][k]["step"]) == float(sb["state"][k]["step"]) == 7.0 for k in sa["state"])


def test_flat_update_resumes_bit_identically_and_shares_todays_state_format():
    """A resume state written by the flat update (torch.save of the optimizer's state_dict, as runstate does) loaded
    into a fresh model, optimizer and FlatUpdate continues bit for bit as the run that never stopped; the same state
    loads into today's update (the format is PaperAdam's: per-parameter exp_avg, exp_avg_sq, step) with identical
    tensors, and a state today's update wrote loads into the flat buffers."""
    import io


    def stepped(n: int, models, opts, scalers, flat):
        drive(models, opts, scalers, flat, n, 1.0)
        return models, opts, flat

    full = stepped(12, *flat_twins())
    half_models, half_opts, _ = stepped(6, *flat_twins())
    buf = io.BytesIO()
    torch.save({"model": half_models[1].state_dict(), "optimizer": half_opts[1].state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    models, opts, scalers, flat = flat_twins()
    models[1].load_state_dict(saved["model"])
    opts[1].load_state_dict(saved["optimizer"])  # the post-hook copies it into the flat buffers
    assert opts[1].state_dict()["param_groups"][0]["paper_step"] == 6
    assert all(torch.equal(opts[1].state[p]["exp_avg"], half_opts[1].state[q]["exp_avg"])
               for p, q in zip(models[1].parameters(), half_models[1].parameters()))
    exp_avg = opts[1].state[next(models[1].parameters())]["exp_avg"]
    assert exp_avg.untyped_storage().data_ptr() == flat.exp_avg.data_ptr()
    # the remaining 6 steps on the same gradients as the uninterrupted run's steps 7-12
    g = torch.Generator().manual_seed(1)
    params = list(models[1].parameters())
    for step in range(12):
        grads = [torch.randn(p.shape, generator=g) * (0.001 if step % 2 else 1.0) for p in params]
        if step < 6:
            continue
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        opts[1].set_lr(1e-3 * (1 + step % 5))
        flat()
    assert all(torch.equal(a, b) for a, b in zip(full[0][1].parameters(), models[1].parameters()))
    # the format is today's: the flat state loads into today's update and back
    plain = Electra(models[1].cfg)
    plain_opt = build_optimizer(plain, OptimConfig(lr=3e-3, warmup_steps=1000), "cpu")
    plain_opt.load_state_dict(saved["optimizer"])
    back_models, back_opts, _, _ = flat_twins()
    back_opts[1].load_state_dict(plain_opt.state_dict())
    for p, q in zip(plain.parameters(), back_models[1].parameters()):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(plain_opt.state[p][k], back_opts[1].state[q][k])


def test_flat_update_refuses_a_missing_gradient():
    models, opts, scalers, flat = flat_twins()
    for p in models[1].parameters():
        p.grad = torch.ones_like(p)
    next(models[1].parameters()).grad = None
    with pytest.raises(RuntimeError, match="without a gradient"):
        flat()
