"""The kernel variants of issue 33 (train.sampler, train.attention, train.weight_copy), each against today's path on
the CPU: the same loss and gradients where the mathematics is the same (bit for bit for the weight copies), and the
switch reaching the step. The samplers' distributions
are tested in test_objective.py (chi-square against the softmax and against the Gumbel-max sampler).

Reference: the boolean padding mask (B, 1, 1, T) through SDPA (model._attention), today's default; for the rows'
lengths, hand-written cu_seqlens."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from tinyelectra import runtime
from tinyelectra.config import load_recipe
from tinyelectra.data import Batch
from tinyelectra.electra import SpecialIds
from tinyelectra.errors import UserError
from tinyelectra.model import Electra, row_segments, varlen_attention, varlen_blocker
from tinyelectra.step import PretrainStep, mask_step

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = ["model.vocab_size=256", "train.seq_len=32", "model.max_positions=32", "model.num_layers=2", "train.batch_size=4"]
SPECIAL = SpecialIds(pad=0, cls=1, sep=2, mask=3)


def padded_batch(lengths: list[int], T: int = 32, seed: int = 0) -> Batch:
    """Rows of `lengths` real tokens ([CLS] ... [SEP]), then padding, as the data builder lays them out."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 256, (len(lengths), T), generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    ids[:, 0] = SPECIAL.cls
    for b, n in enumerate(lengths):
        ids[b, n - 1] = SPECIAL.sep
    ids[~mask] = SPECIAL.pad
    return Batch(ids, torch.zeros_like(ids), mask, full_rows=mask.all(1).numpy())


def step_loss_and_grads(recipe, batch: Batch, seed: int = 0):
    """One training micro-batch through PretrainStep (dropout on, the recipe's switches): loss, gradients."""
    torch.manual_seed(seed)
    model = Electra(recipe.model).train()
    step = PretrainStep(model, recipe)
    (m,), _ = mask_step(batch, recipe, SPECIAL, 0, 0, len(batch.input_ids), 1)
    torch.manual_seed(7)  # the same dropout masks and samples for every variant
    mlm_sum, disc_sum, _ = step(m)
    loss = mlm_sum / m.mlm_count + 50.0 * disc_sum / m.token_count
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_row_segments_by_hand():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    # row 0: [0, 4) real, [4, 4) no padding; row 1: [4, 6) real, [6, 8) padding; row 2: [8, 11), [11, 12)
    assert row_segments(mask).tolist() == [0, 4, 4, 6, 8, 11, 12]
    assert row_segments(mask).dtype == torch.int32  # what FlashAttention's varlen kernel takes


@pytest.mark.parametrize("plain", [False, True])
def test_varlen_attention_gives_the_masked_paths_loss_and_gradients(plain):
    """A padded batch (one full row, three padded), dropout on, two layers: the rows' lengths give the boolean mask's
    loss and every gradient, on the CPU's own attention and on SDPA (runtime.plain_cpu_paths); the variant draws the
    same dropout masks here (same shapes), so equal means equal up to float rounding."""
    batch = padded_batch([32, 20, 9, 27])
    with runtime.plain_cpu_paths() if plain else contextlib.nullcontext():
        ref = step_loss_and_grads(load_recipe("tiny", TOY), batch)
        var = step_loss_and_grads(load_recipe("tiny", TOY + ["train.attention=varlen"]), batch)
    torch.testing.assert_close(var[0], ref[0], rtol=1e-6, atol=0)
    for name, g in ref[1].items():
        torch.testing.assert_close(var[1][name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_the_rows_lengths_matter():
    """Control: the same batch with segments that ignore the padding (each row one sequence of T tokens, i.e. no
    mask) changes the gradients, so the test above would see segments built wrong."""
    recipe = load_recipe("tiny", TOY + ["train.attention=varlen"])
    batch = padded_batch([32, 20, 9, 27])
    ref = step_loss_and_grads(recipe, batch)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tinyelectra.model.row_segments", lambda mask: row_segments(torch.ones_like(mask)))
        bad = step_loss_and_grads(recipe, batch)
    worst = max(float((bad[1][n] - g).abs().max() / g.abs().max()) for n, g in ref[1].items())
    assert worst > 1e-2, worst


def test_varlen_attention_under_gradient_checkpointing_and_compile():
    """Recomputed blocks (gradient checkpointing) and a whole-graph trace (fullgraph, aot_eager: no graph break in
    row_segments or the packed layout) give the eager variant's loss and gradients."""
    recipe = load_recipe("tiny", TOY + ["train.attention=varlen"])
    batch = padded_batch([32, 20, 9, 27])
    torch.manual_seed(0)
    model = Electra(recipe.model).train()
    model.set_grad_checkpointing(True)
    step = PretrainStep(model, recipe)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    (m,), _ = mask_step(batch, recipe, SPECIAL, 0, 0, 4, 1)
    with runtime.plain_cpu_paths():  # what compiled code runs: the test compares eager and compiled on the same ops
        torch.manual_seed(7)
        eager_ref = step_loss_and_grads(recipe, batch)
        torch.manual_seed(7)
        mlm_sum, disc_sum, _ = compiled(m)
    loss = mlm_sum / m.mlm_count + 50.0 * disc_sum / m.token_count
    loss.backward()
    torch.testing.assert_close(loss.detach(), eager_ref[0], rtol=1e-6, atol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager_ref[1][name], rtol=1e-5, atol=1e-7, msg=name)


def test_unknown_attention_kind_is_refused():
    with pytest.raises(UserError, match="train.attention"):
        load_recipe("tiny", ["train.attention=flex"])
    with pytest.raises(UserError, match="mask or varlen"):
        Electra(load_recipe("tiny", TOY).model).set_attention("flex")


def test_gpus_and_heads_flash_cannot_run_are_named():
    """FlashAttention's limits (torch's flash kernels: sm80+, head size a multiple of 8 up to 256): electra-small's
    heads (64, the generator's too) on an H100 pass; a T4 (7.5), heads of 4 and of 320 are refused with the reason."""
    cfg = load_recipe("electra-small").model
    gen = cfg.generator()
    assert varlen_blocker((9, 0), [cfg.hidden_size // cfg.num_heads, gen.hidden_size // gen.num_heads]) == ""
    assert "7.5" in varlen_blocker((7, 5), [64, 64])
    assert "[4, 320]" in varlen_blocker((8, 0), [64, 4, 320])


@pytest.mark.parametrize("sampler", ["inverse-cdf", "gumbel-max"])
def test_the_sampler_setting_reaches_the_step(sampler):
    """On the CPU `auto` samples by inverse CDF: `inverse-cdf` gives its loss exactly, `gumbel-max` other draws (other
    replacements, another discriminator loss) from the same seed."""
    batch = padded_batch([32, 20, 9, 27])
    auto = step_loss_and_grads(load_recipe("tiny", TOY), batch)
    chosen = step_loss_and_grads(load_recipe("tiny", TOY + [f"train.sampler={sampler}"]), batch)
    assert (chosen[0] == auto[0]) == (sampler == "inverse-cdf"), (chosen[0], auto[0])


def test_the_cuda_branch_is_a_call_torchs_flash_varlen_kernel_accepts():
    """Without a card: the CUDA branch of varlen_attention traced on fake CUDA tensors (torch's meta kernels of
    aten._flash_attention_forward / _backward check the arguments' shapes and dtypes): the packed views of the fused
    qkv projection, int32 cu_seqlens (2B + 1), bf16; the output (B*T, heads, head size) and the backward's gradients
    of the same shapes. The kernels' values are checked on a card
    (test_flash_varlen_equals_the_masked_sdpa_on_a_gpu)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    B, T, nh, hd = 4, 128, 4, 64
    with FakeTensorMode():
        q, k, v = torch.empty(B * T, 3, nh, hd, device="cuda", dtype=torch.bfloat16).unbind(1)
        cu = row_segments(torch.ones(B, T, dtype=torch.bool, device="cuda"))
        out = varlen_attention(q, k, v, cu, T, 0.1)
        assert out.shape == (B * T, nh, hd) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, T, T, 0.1, False, False)
        grads = torch.ops.aten._flash_attention_backward(torch.empty_like(out), q, k, v, out, lse, cu, cu, T, T, 0.1,
                                                         False, rng, unused)
        assert [g.shape for g in grads] == [(B * T, nh, hd)] * 3 and cu.shape == (2 * B + 1,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention's variable-length kernel needs a CUDA GPU")
def test_flash_varlen_equals_the_masked_sdpa_on_a_gpu():
    """bf16 on the card, no dropout: the flash varlen kernel's outputs at real tokens and its q/k/v gradients (the
    padding's are 0 in both: its outputs get no gradient) against SDPA with the boolean padding mask."""
    B, T, nh, hd = 4, 128, 4, 64
    lengths = torch.tensor([128, 77, 5, 100], device="cuda")
    mask = torch.arange(T, device="cuda")[None, :] < lengths[:, None]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, nh, hd, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    out = varlen_attention(*(t.view(B * T, nh, hd) for t in (q, k, v)), row_segments(mask), T, 0.0).view(B, T, nh, hd)
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask[:, None, None, :]).transpose(1, 2)
    w = mask[:, :, None, None].to(out.dtype)
    torch.testing.assert_close(out * w, ref * w, rtol=2e-2, atol=2e-2)
    grads = [torch.autograd.grad((o * w * torch.linspace(-1, 1, hd, device="cuda")).sum().float(), (q, k, v))
             for o in (out, ref)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_the_attention_report_names_the_variant():
    """The log line and summary.json say what padded batches run: the rows' lengths and, off CUDA, the reference."""
    from tinyelectra.model import attention_kernel

    cfg = load_recipe("electra-small").model
    report = attention_kernel(cfg, 4, 128, torch.device("cpu"), torch.float32, attention="varlen")
    assert report["mask"].startswith("the rows' lengths") and "reference" in report["discriminator"]["kernel"]
    assert report["without_padding"]["mask"] == "none"  # batches without padding: no mask, no lengths, as before
    assert attention_kernel(cfg, 4, 128, torch.device("cpu"), torch.float32)["mask"].startswith("bool")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA path of the inverse-CDF sampler needs a CUDA GPU")
def test_inverse_cdf_sampler_under_cuda_graphs_matches_softmax():
    """Compiled by inductor with CUDA graphs (mode reduce-overhead), as a training step runs it: each replay draws anew
    (two replays differ) and 100,000 draws over V = 300 (three blocks) pass Pearson's chi-square against the softmax."""
    from scipy.stats import chi2

    from tinyelectra.electra import sample_tokens

    V, n = 300, 100_000
    logits = torch.randn(V, generator=torch.Generator().manual_seed(0)).cuda()
    fn = torch.compile(lambda x: sample_tokens(x, 1.0, None, "inverse-cdf"), mode="reduce-overhead", fullgraph=True)
    x = logits.expand(n, -1).contiguous()
    draws = [fn(x).clone() for _ in range(3)]  # the first call records, the others replay
    assert not torch.equal(draws[1], draws[2])
    counts = torch.bincount(draws[2], minlength=V).double().cpu()
    p = torch.softmax(logits.double().cpu(), -1)
    assert chi2.sf(float(((counts - n * p) ** 2 / (n * p)).sum()), V - 1) > 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention's variable-length kernel needs a CUDA GPU")
def test_compiled_varlen_block_equals_the_eager_masked_block_on_a_gpu():
    """One encoder block under bf16 autocast, compiled by inductor with the rows' lengths, against the eager block
    with the boolean mask (dropout off: the same numbers expected up to bf16 rounding): outputs at real tokens and
    the weights' gradients; then with dropout on, compiled, its outputs and gradients finite."""
    from tinyelectra.model import Block

    cfg = load_recipe("electra-small").model
    torch.manual_seed(0)
    block = Block(cfg).cuda().eval()  # eval: dropout off
    x = torch.randn(4, 128, cfg.hidden_size, device="cuda")
    mask = torch.arange(128, device="cuda")[None, :] < torch.tensor([128, 77, 5, 100], device="cuda")[:, None]
    w = mask[..., None].float()

    def run(fn, *args):
        block.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(x, *args)
        (out * w).pow(2).sum().backward()
        return out.detach() * w, [p.grad.clone() for p in block.parameters()]

    ref = run(block, mask[:, None, None, :])
    got = run(torch.compile(block, fullgraph=True), None, row_segments(mask))
    for a, b in zip([got[0], *got[1]], [ref[0], *ref[1]]):
        assert float((a - b).norm() / b.norm()) < 2e-2  # bf16 operands: ~1e-3 to 1e-2 between two kernels
    block.train()
    out, grads = run(torch.compile(block, fullgraph=True), None, row_segments(mask))
    assert out.isfinite().all() and all(g.isfinite().all() for g in grads)


# ----------------------------------------------------------------------------------------------------------------
# train.weight_copy=copy: the matmuls read low-precision copies of the weights, refreshed after each update, instead of
# autocast's cast of every weight at every use. CPU autocast runs the linear layers in bf16, so the two paths are
# compared bit for bit here.

CPU = torch.device("cpu")


def bf16_engine(weight_copy: str, update: str = "per-tensor", compile_setting: str = "off", layers: int = 2,
                sets: tuple[str, ...] = ()):
    """A toy Engine training in bf16 autocast on the CPU (dropout on), the recipe's seed's weights."""
    from tinyelectra.optim import build_optimizer
    from tinyelectra.step import Dist, Engine

    recipe = load_recipe("tiny", TOY + [f"model.num_layers={layers}", f"train.update={update}",
                                        f"train.compile={compile_setting}", f"train.weight_copy={weight_copy}",
                                        *sets])
    torch.manual_seed(0)
    model = Electra(recipe.model)
    opt = build_optimizer(model, recipe.optim, "cpu")
    return Engine(model, recipe, opt, torch.amp.GradScaler("cpu", enabled=False), Dist(), CPU, "bf16", 4, 1)


def bf16_steps(engine, steps: int = 3, first: int = 0, cache: bool = True):
    """Steps `first`, `first` + 1, ... (batches alternately without and with padding, lr 1e-3) under bf16 autocast
    (`cache`: with its weight cache, torch's default): (losses, each step's gradients as the update received them, the
    weights after)."""
    from tinyelectra.step import global_counts, new_sums, train_step

    grads, update = [], engine.update

    def keep_grads_then_update():
        grads.append([p.grad.clone() for p in engine.params])
        update()

    engine.update = keep_grads_then_update
    sums, losses = new_sums(CPU), []
    for step in range(first, first + steps):
        batch = padded_batch([32, 32, 32, 32] if step % 2 == 0 else [32, 20, 9, 27], seed=step)
        masked, seeds = mask_step(batch, engine.recipe, SPECIAL, step, 0, 4, 1)
        engine.optimizer.set_lr(1e-3)
        losses.append(train_step(engine, masked, seeds, global_counts(masked, engine.dist),
                                 runtime.autocast_context("bf16", CPU, cache=cache), sums))
    engine.update = update
    return losses, grads, [p.detach().clone() for p in engine.params]


def same(a, b) -> bool:
    """Bit-identical, tensor by tensor, through nested lists."""
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def copies_are_fresh(engine) -> bool:
    return all(torch.equal(c, m.detach().to(c.dtype)) for c, m in zip(engine.copies.copies, engine.copies.masters))


@pytest.mark.parametrize("update", ["per-tensor", "flat"])
def test_weight_copies_give_autocasts_losses_gradients_and_weights_bit_for_bit(update):
    """Three bf16 steps (dropout on, batches with and without padding), both updates: the losses, every gradient
    the update receives and the weights after each step are bit-identical to autocast casting every weight at every
    use; the copies hold the weights' bf16 rounding after every update."""
    cast_engine, copy_engine = bf16_engine("cast", update), bf16_engine("copy", update)
    cast, copy = bf16_steps(cast_engine), bf16_steps(copy_engine)
    assert cast_engine.copies is None and copies_are_fresh(copy_engine)
    # each Linear's weight and bias (two encoders of 2 blocks of 4 and a projection, 3 in the heads), and the generator
    # head's tied word embeddings and bias
    assert len(copy_engine.copies.copies) == 2 * (2 * (4 * 2 + 1) + 3) + 2
    assert {c.dtype for c in copy_engine.copies.copies} == {torch.bfloat16}
    assert same(cast, copy)
    assert not same(cast[1][0], cast[1][1]) and not same(cast[2], [p.detach() for p in bf16_engine("cast").params])
    assert "bfloat16 copies of their 44 fp32 weights" in copy_engine.weight_note


def test_a_weight_read_twice_gets_each_uses_gradient_cast_as_without_autocasts_cache():
    """model.sharing=all: the generator is the discriminator's encoder, so one forward reads its weights twice. The
    copies give each use's bf16 gradient to the master cast to fp32 and summed there: autocast's arithmetic without
    its weight cache (as the whole-step graph runs it, step.CapturedStep), bit for bit. With the cache (eager's
    default) autocast casts such a weight once and sums the two uses' gradients in bf16 before the cast: there the
    copies' steps are not bit-identical (the losses of this test's second step differ in the fifth digit)."""
    sharing = ("model.sharing=all", "model.generator_fraction=1.0")
    copy = bf16_steps(bf16_engine("copy", sets=sharing))
    assert same(copy, bf16_steps(bf16_engine("cast", sets=sharing), cache=False))
    assert not same(copy[0], bf16_steps(bf16_engine("cast", sets=sharing))[0])


def test_the_copies_take_autocasts_casts_off_the_weights():
    """One bf16 step, every aten operator seen by a dispatch mode: autocast casts each weight the matmuls read
    (aten._to_copy of an fp32 weight) once per forward; with the copies no weight is cast, the step dispatches
    exactly that many casts fewer, and the copies' refresh is one multi-tensor copy (aten._foreach_copy_)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self, weights):
            super().__init__()
            self.weights, self.seen = {w.data_ptr() for w in weights}, Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen[func] += 1
            if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 and \
                    args[0].data_ptr() in self.weights:
                self.seen["weight casts"] += 1
            return func(*args, **(kwargs or {}))

    counts = {}
    for kind in ("cast", "copy"):
        engine = bf16_engine(kind)
        with Ops([m for _, _, m in engine.model.matmul_weights()]) as ops:
            bf16_steps(engine, steps=1)
        counts[kind] = ops.seen
    reads = len(engine.copies.copies)
    assert counts["cast"]["weight casts"] == reads and counts["copy"]["weight casts"] == 0
    casts, refresh = torch.ops.aten._to_copy.default, torch.ops.aten._foreach_copy_.default
    assert counts["cast"][casts] - counts["copy"][casts] == reads
    assert counts["copy"][refresh] == 1 + counts["cast"][refresh]


@pytest.mark.parametrize("update", ["per-tensor", "flat"])
def test_a_loaded_resume_state_refreshes_the_copies(update):
    """A run's weights and optimizer state after two steps loaded into a fresh engine (what checkpoint.load_resume_state
    does: model.load_state_dict, optimizer.load_state_dict): its copies are the loaded weights' (not the fresh
    ones'), and its third step is the uninterrupted run's bit for bit."""
    import copy

    run = bf16_engine("copy", update)
    bf16_steps(run, steps=2)
    model_state, optimizer_state = copy.deepcopy(run.model.state_dict()), copy.deepcopy(run.optimizer.state_dict())
    want = bf16_steps(run, steps=1, first=2)
    resumed = bf16_engine("copy", update)
    resumed.model.load_state_dict(model_state)
    resumed.optimizer.load_state_dict(optimizer_state)
    assert copies_are_fresh(resumed)
    assert same(bf16_steps(resumed, steps=1, first=2), want)


def test_the_copies_stay_out_of_state_dicts_and_counts():
    """The copies are plain attributes: the model's state_dict (checkpoints, resume states, exports), its split
    discriminator / generator state dicts, its parameters, buffers and parameter count, and the optimizer's state
    are those of a model without them."""
    from tinyelectra.model import count_parameters

    engine, plain = bf16_engine("copy"), bf16_engine("cast")
    bf16_steps(engine, steps=1)
    bf16_steps(plain, steps=1)
    model = engine.model
    assert list(model.state_dict()) == list(plain.model.state_dict())
    assert {t.dtype for t in model.state_dict().values()} == {torch.float32}
    assert list(model.discriminator_state_dict()) == list(plain.model.discriminator_state_dict())
    assert list(model.generator_state_dict()) == list(plain.model.generator_state_dict())
    assert count_parameters(model) == count_parameters(plain.model) and not list(model.buffers())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.model.named_parameters()]
    ours, theirs = engine.optimizer.state_dict(), plain.optimizer.state_dict()
    assert ours["param_groups"] == theirs["param_groups"] and ours["state"].keys() == theirs["state"].keys()


def test_weight_copy_is_a_no_op_in_fp32_and_refused_where_it_cannot_apply():
    from tinyelectra.optim import build_optimizer
    from tinyelectra.step import Dist, Engine

    recipe = load_recipe("tiny", TOY + ["train.weight_copy=copy"])
    model = Electra(recipe.model)
    engine = Engine(model, recipe, build_optimizer(model, recipe.optim, "cpu"),
                    torch.amp.GradScaler("cpu", enabled=False), Dist(), CPU, "fp32", 4, 1)
    assert engine.copies is None and engine.weight_note == ("train.weight_copy=copy: no effect in fp32 (no weight is "
                                                            "cast)")
    assert all(m.weight_copy is None for m in model.modules() if isinstance(m, runtime.Linear))
    with pytest.raises(UserError, match="train.weight_copy: must be cast or copy, not 'bf16'"):
        load_recipe("tiny", ["train.weight_copy=bf16"])
    with pytest.raises(UserError, match="train.weight_copy: copy is for train.strategy=ddp"):
        load_recipe("tiny", ["train.weight_copy=copy", "train.strategy=deepspeed"])


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["regional", "regional-graph", "on"])
def test_compiled_steps_read_the_copies_as_they_cast(monkeypatch, setting):
    """Regional compilation (aot_eager: the aten graph inductor lowers), the whole step as one static function (CPU:
    uncaptured) and the whole compiled step: with the copies, the losses, gradients and weights of the same compiled
    step casting every weight, bit for bit; the copies are graph inputs, so as many graphs compile (the regions once
    per kind for every layer) and none while training. Against the eager step: equal to float rounding only, with or
    without copies (in bf16 the compiled backward rounds otherwise than eager's: measured, the gradients of the first
    step differ by up to 3e-3 for casts and copies alike; bit for bit in fp32, test_step.py)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "aot_eager")
    runs = {}
    with runtime.plain_cpu_paths():
        eager = bf16_steps(bf16_engine("copy", "flat"))
        for kind in ("cast", "copy"):
            torch._dynamo.reset()
            counters.clear()
            engine = bf16_engine(kind, "flat", setting)
            engine.compile_now(SPECIAL)
            graphs = counters["stats"]["unique_graphs"]
            runs[kind] = bf16_steps(engine), graphs, counters["stats"]["unique_graphs"]
            assert "failed" not in engine.compile_note, engine.compile_note
        fresh = copies_are_fresh(engine)
        for c in engine.copies.copies:  # the compiled step reads them: zeros give every logit 0
            c.zero_()
        zeroed = bf16_steps(engine, steps=1, first=3)[0][0]
    torch._dynamo.reset()
    assert float(zeroed) == pytest.approx(math.log(256) + 50 * math.log(2), rel=1e-6)  # ln V + disc_weight ln 2
    assert same(runs["copy"][0], runs["cast"][0]) and fresh
    assert runs["copy"][1:] == runs["cast"][1:] == ((7, 7) if setting != "on" else (2, 2))
    torch.testing.assert_close(runs["copy"][0][0], eager[0], rtol=1e-3, atol=0)
