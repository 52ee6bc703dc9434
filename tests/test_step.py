"""The step (tinyelectra/step.py) and the policies around it, on the CPU: which compile mode `auto` picks and why
(fake CUDA devices: CI has no GPU), the graph-safe update's fp16 loss scaling against torch.amp.GradScaler on the
same numbers, the global gradient norm computed two ways against torch's clip_grad_norm_, and mask-free attention
for batches without padding (same losses and gradients as the masked path; a padded batch keeps its mask; both
compiled graphs built at start-up)."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import pytest
import torch

from tinyelectra import runtime
from tinyelectra.config import load_recipe
from tinyelectra.data import Batch
from tinyelectra.electra import SpecialIds, combine, loss_terms
from tinyelectra.errors import UserError
from tinyelectra.model import Electra
from tinyelectra.optim import GraphSafeUpdate, apply_update, build_optimizer, param_groups, total_norm
from tinyelectra.step import FP16_HOST_SYNC, Dist, Engine, mask_step

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = ["model.vocab_size=256", "train.seq_len=32", "model.max_positions=32", "model.num_layers=1", "train.batch_size=4"]
SPECIAL = SpecialIds(pad=0, cls=1, sep=2, mask=3)
CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


# ----------------------------------------------------------------------------------------------------------------
# the compile policy


@pytest.mark.parametrize("setting,device,micro_batches,processes,strategy,mode,why", [
    ("auto", GPU, 1, 1, "ddp", "reduce-overhead",
     "auto: inductor + CUDA graphs (one CUDA device, one process, one micro-batch"),
    ("auto", GPU, 4, 1, "ddp", "on", "auto: inductor without CUDA graphs: 4 micro-batches per step"),
    ("auto", GPU, 1, 2, "ddp", "on", "auto: inductor without CUDA graphs: 2 processes (DDP's gradient hooks"),
    ("auto", GPU, 2, 2, "ddp", "on", "2 processes"),
    ("auto", GPU, 1, 1, "deepspeed", "off", "DeepSpeed's engine runs the step"),
    ("auto", CPU, 1, 1, "ddp", "off", "auto: off on the CPU"),
    ("on", GPU, 1, 1, "ddp", "on", "as requested"),
    ("off", GPU, 1, 1, "ddp", "off", "as requested"),
    ("reduce-overhead", GPU, 1, 1, "ddp", "reduce-overhead", "as requested"),
    ("reduce-overhead", CPU, 1, 1, "ddp", "reduce-overhead", "no CUDA graphs on the CPU"),
    ("regional", GPU, 4, 2, "ddp", "regional", "as requested"),
    ("regional", CPU, 1, 1, "ddp", "regional", "as requested"),
    ("regional-graph", GPU, 1, 1, "ddp", "regional-graph", "as requested"),
    ("regional-graph", CPU, 1, 1, "ddp", "regional-graph", "no CUDA graphs on the CPU"),
    ("regional", GPU, 1, 1, "deepspeed", "off", "DeepSpeed's engine runs the step"),
])
def test_auto_picks_cuda_graphs_exactly_where_they_apply(fake_gpu, setting, device, micro_batches, processes, strategy,
                                                         mode, why):
    fake_gpu()
    choice = runtime.choose_compile(setting, device, micro_batches, processes, strategy)
    assert choice.mode == mode and why in choice.why, choice
    assert choice.cuda_graphs == (mode == "reduce-overhead")


def test_explicit_cuda_graphs_where_they_cannot_apply_is_one_clear_error():
    with pytest.raises(UserError, match="one micro-batch per step; this run accumulates 4 micro-batches"):
        runtime.choose_compile("reduce-overhead", GPU, micro_batches=4)
    with pytest.raises(UserError, match="is for one process"):
        runtime.choose_compile("reduce-overhead", GPU, processes=2)
    with pytest.raises(UserError, match="compile 'fast'"):
        runtime.choose_compile("fast", GPU)
    with pytest.raises(UserError, match="regional-graph .CUDA graphs. needs one micro-batch per step"):
        runtime.choose_compile("regional-graph", GPU, micro_batches=2)
    with pytest.raises(UserError, match="regional-graph captures the flat update: add --set train.update=flat"):
        load_recipe("tiny", ["train.compile=regional-graph"])


def toy_engine(device: torch.device, precision: str, accum: int = 1, compile_setting: str = "auto") -> Engine:
    recipe = load_recipe("tiny", [*TOY, f"train.compile={compile_setting}"])
    torch.manual_seed(0)
    model = Electra(recipe.model)
    opt = build_optimizer(model, recipe.optim, "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=(precision == "fp16"))  # the scaler's device does not matter here
    B = recipe.train.batch_size
    return Engine(model, recipe, opt, scaler, Dist(), device, precision, B // accum, accum)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_engine_under_auto_on_one_gpu_runs_cuda_graphs_and_says_why(fake_gpu, precision):
    """One (fake) CUDA device, one micro-batch: the step and the update compiled for CUDA graphs, in bf16 and in fp16
    alike (fp16's loss scaler on the device, no per-step host sync); with 2 micro-batches inductor without graphs,
    the update eager, and the log line says why. Nothing is compiled here (torch.compile is lazy)."""
    fake_gpu()
    engine = toy_engine(GPU, precision)
    assert engine.choice.mode == "reduce-overhead" and engine.graph_update is not None
    note = engine.compile_note
    assert note.startswith("compile: torch.compile (inductor, mode reduce-overhead: CUDA graphs, fullgraph); "
                           "auto: inductor + CUDA graphs (one CUDA device, one process, one micro-batch per step); "
                           "update: clip + paper Adam"), note
    assert ("fp16 loss scaling on the device" in note) == (precision == "fp16")
    assert engine.host_sync_note is None
    assert engine.forward.before_call is torch.compiler.cudagraph_mark_step_begin
    accumulating = toy_engine(GPU, precision, accum=2)
    assert accumulating.choice.mode == "on" and accumulating.graph_update is None
    assert "auto: inductor without CUDA graphs: 2 micro-batches per step" in accumulating.compile_note
    assert accumulating.host_sync_note == (FP16_HOST_SYNC if precision == "fp16" else None)


def test_the_engine_under_auto_on_the_cpu_is_eager_as_before():
    engine = toy_engine(CPU, "fp32")
    assert engine.compile_note == "compile: auto: off on the CPU (compile time outweighs the gain for short runs)"
    assert not engine.compiles and engine.graph_update is None and engine.host_sync_note is None


# ----------------------------------------------------------------------------------------------------------------
# fp16: the loss scaler on the device


def twin_models(n: int = 2):
    recipe = load_recipe("tiny", TOY)
    torch.manual_seed(0)
    models = [Electra(recipe.model) for _ in range(n)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    return recipe, models, [build_optimizer(m, recipe.optim, "cpu") for m in models]


@pytest.mark.parametrize("grad_norm", ["stack", "one-op"])
def test_graph_safe_fp16_update_is_grad_scalers_arithmetic(grad_norm):
    """The graph-safe update with fp16 loss scaling on the device (eager here; compiled it is captured as is) against
    torch.amp.GradScaler + the trainer's apply_update on the same scaled gradients, 9 steps: an inf gradient (step 3)
    and a NaN (step 6) skip the update and halve the scale, every second clean step doubles it (growth_interval 2),
    exactly as GradScaler; weights and moments equal to float rounding, the step counts and paper_step equal, and
    both scalers' state_dicts (what a resume state saves) identical."""
    recipe, models, opts = twin_models()
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2) for _ in range(2)]
    scalers[0].scale(torch.zeros(()))  # GradScaler creates its scale at the first scale() (the trainer's backward)
    update = GraphSafeUpdate(opts[1], 1.0, scaler=scalers[1], grad_norm=grad_norm)
    params = [p for p in models[0].parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(1)
    trace = []
    for step in range(9):
        grads = [torch.randn(p.shape, generator=g) * 2.0**10 * (0.01 if step % 2 else 1.0) for p in params]
        if step in (2, 5):
            grads[3].view(-1)[0] = math.inf if step == 2 else math.nan
        for m, o in zip(models, opts):
            for p, gr in zip(m.parameters(), grads):
                p.grad = gr.clone()
            o.set_lr(1e-3 * (step + 1))
        apply_update(params, opts[0], scalers[0], 1.0)
        update()
        trace.append((scalers[0].get_scale(), scalers[1].get_scale()))
    assert [a for a, _ in trace] == [b for _, b in trace] == [1024, 2048, 1024, 1024, 2048, 1024, 1024, 2048, 2048]
    assert scalers[0].state_dict() == scalers[1].state_dict()
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    sa, sb = opts[0].state_dict(), opts[1].state_dict()
    assert [x["paper_step"] for x in sa["param_groups"]] == [x["paper_step"] for x in sb["param_groups"]] == [7, 7]
    for k in sa["state"]:
        assert float(sa["state"][k]["step"]) == float(sb["state"][k]["step"]) == 7.0
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sa["state"][k][name], sb["state"][k][name], rtol=1e-5, atol=1e-9)


def test_an_overflowing_step_changes_nothing_but_the_scale():
    """The skipped step exactly: weights, both moments and the step counts bit for bit as before, the scale halved."""
    recipe, (model,), (opt,) = twin_models(1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    update = GraphSafeUpdate(opt, 1.0, scaler=scaler)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.set_lr(1e-3)
    update()  # a clean step: creates the state
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    next(model.parameters()).grad.view(-1)[0] = math.inf
    update()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(torch.equal(v, opt.state[p][k]) for p in model.parameters() for k, v in moments[id(p)].items())
    assert scaler.get_scale() == 2.0**15 and opt.state_dict()["param_groups"][0]["paper_step"] == 1


# ----------------------------------------------------------------------------------------------------------------
# the gradient norm: stack of ~300 tensors or one operator


def test_total_norm_both_ways_is_clip_grad_norms():
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(s, generator=g) for s in [(7, 5), (5,), (3, 4, 2), (1,)] * 20]
    params = [torch.zeros_like(t, requires_grad=True) for t in tensors]
    for p, t in zip(params, tensors):
        p.grad = t
    for ord in (2.0, math.inf):
        want = torch.nn.utils.clip_grad_norm_(params, 1e9, norm_type=ord)  # torch's, clipping nothing
        assert want > 1.0
        for how in ("stack", "one-op"):
            torch.testing.assert_close(total_norm(tensors, ord, how), want, rtol=1e-6, atol=0)
    bad = [t.clone() for t in tensors]
    bad[5][0] = math.nan
    assert torch.isnan(total_norm(bad, 2.0, "one-op")) and torch.isnan(total_norm(bad, 2.0, "stack"))


def captured_update_graph(monkeypatch, grad_norm: str):
    """The graph dynamo hands the compiler for the graph-safe update of the toy model (what inductor lowers)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    real = torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda fn, **kw: real(fn, backend=capture, fullgraph=kw.get("fullgraph", False)))
    recipe, (model,), (opt,) = twin_models(1)
    update = GraphSafeUpdate(opt, 1.0, compile_setting="on", grad_norm=grad_norm)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.set_lr(1e-3)
    update()
    monkeypatch.undo()
    torch._dynamo.reset()
    (gm,) = graphs
    n_params = len([p for p in model.parameters() if p.requires_grad])
    stacks = [n for n in gm.graph.nodes if n.target is torch.stack]
    ops = [n for n in gm.graph.nodes if "total_norm" in str(n.target)]
    return n_params, stacks, ops


@pytest.mark.slow
def test_one_op_norm_takes_the_per_tensor_stack_out_of_the_compiled_graph(monkeypatch):
    """"stack" (the default) hands the compiler a torch.stack of one norm per parameter; on CUDA inductor copies each
    input with a kernel of its own (ELECTRA-Small's 306 parameters: the H200 profile's 286 + 20 launches of
    `triton_poi_fused_stack_*` per step). "one-op" leaves no stack in the graph, only tinyelectra::total_norm (aten's
    multi-tensor norm and one batched stack inside). Which is faster is for the next GPU profile (throughput.py
    --grad-norm); this is what each one asks of the compiler."""
    n, stacks, ops = captured_update_graph(monkeypatch, "stack")
    assert len(stacks) == 1 and len(stacks[0].args[0]) == n and not ops
    n, stacks, ops = captured_update_graph(monkeypatch, "one-op")
    assert not stacks and len(ops) == 1 and len(ops[0].args[0]) == n


def test_graph_safe_update_equals_torch_adamw_without_bias_correction_when_bias_correction_cancels():
    """The update against torch.optim.AdamW on the same numbers, one step, no clipping: the paper's Adam (no bias
    correction) equals torch's AdamW at step 1 with lr' = lr * (1 - b1) / sqrt(1 - b2), eps' = eps / sqrt(1 - b2) and
    weight decay wd' = wd * sqrt(1 - b2) / (1 - b1) (optim.py's module docstring), for both gradient norms."""
    for how in ("stack", "one-op"):
        recipe, models, opts = twin_models()
        o = recipe.optim
        b1, b2 = o.beta1, o.beta2
        lr = 1e-3
        decay, skip = param_groups(models[0], o.weight_decay)  # the paper's groups: no decay for biases, LayerNorm
        ref = torch.optim.AdamW([{"params": decay["params"]}, {"params": skip["params"], "weight_decay": 0.0}],
                                lr=lr * (1 - b1) / math.sqrt(1 - b2), betas=(b1, b2), eps=o.eps / math.sqrt(1 - b2),
                                weight_decay=o.weight_decay * math.sqrt(1 - b2) / (1 - b1), foreach=False)
        g = torch.Generator().manual_seed(3)
        for m in models:
            g.manual_seed(3)
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g) * 1e-3  # below the clipping norm
        ref.step()
        opts[1].set_lr(lr)
        GraphSafeUpdate(opts[1], 1.0, grad_norm=how)()
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------------------------------------------
# mask-free attention for batches without padding


def toy_batch(padded_row: int | None, seed: int = 0, length: int = 21) -> Batch:
    """4 rows of 32 tokens; row `padded_row` (if any) is `length` real tokens, then padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 256, (4, 32), generator=g)
    ids[:, 0], ids[:, -1] = SPECIAL.cls, SPECIAL.sep
    mask = torch.ones_like(ids, dtype=torch.bool)
    if padded_row is not None:
        ids[padded_row, length - 1], ids[padded_row, length:] = SPECIAL.sep, SPECIAL.pad
        mask[padded_row, length:] = False
    return Batch(ids, torch.zeros_like(ids), mask, full_rows=mask.all(1).numpy())


def loss_and_grads(model, m, recipe):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # the same dropout masks and samples
    loss = combine(loss_terms(model, m, recipe.objective), recipe.objective, m.mlm_count, m.token_count)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("plain", [False, True])
def test_a_batch_without_padding_gives_the_masked_paths_losses_and_gradients(plain):
    """The same unpadded batch through the encoders with its all-True mask and with none (Masked.full): the same loss
    and gradients (float rounding: the mask adds 0), on the CPU's own attention (dropout on) and on SDPA
    (runtime.plain_cpu_paths: the operators compiled code and the GPU run)."""
    recipe = load_recipe("tiny", TOY)
    torch.manual_seed(0)
    model = Electra(recipe.model).train()
    batch = toy_batch(None)
    (m,), _ = mask_step(batch, recipe, SPECIAL, 0, 0, 4, 1)
    assert m.full and m.encoder_mask is None
    with runtime.plain_cpu_paths() if plain else contextlib.nullcontext():
        free = loss_and_grads(model, m, recipe)
        masked = loss_and_grads(model, dataclasses.replace(m, full=False), recipe)
    torch.testing.assert_close(free[0], masked[0], rtol=1e-6, atol=0)
    for a, b in zip(free[1], masked[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_padded_batch_keeps_its_mask():
    """mask_step reads the host-side flags: a batch with one padded row is masked (and the mask matters: dropping it
    there changes the loss), one micro-batch of full rows in an accumulated step goes without."""
    recipe = load_recipe("tiny", TOY)
    torch.manual_seed(0)
    model = Electra(recipe.model).train()
    (m,), _ = mask_step(toy_batch(2, length=8), recipe, SPECIAL, 0, 0, 4, 1)
    assert not m.full and m.encoder_mask is m.attention_mask
    with_mask = loss_and_grads(model, m, recipe)
    without = loss_and_grads(model, dataclasses.replace(m, full=True), recipe)
    worst = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(without[1], with_mask[1]))
    assert worst > 1e-2, worst  # against at most 1e-5 between the two paths on a batch without padding (above)
    halves, _ = mask_step(toy_batch(3), recipe, SPECIAL, 0, 0, 2, 2)
    assert [h.full for h in halves] == [True, False]
    no_flags = Batch(*(t for t in (toy_batch(None).input_ids, toy_batch(None).token_type_ids,
                                   toy_batch(None).attention_mask)))
    assert not mask_step(no_flags, recipe, SPECIAL, 0, 0, 4, 1)[0][0].full  # flags unknown: masked, as before


def test_prepared_batches_flag_their_full_rows(tmp_path):
    import random

    from tinyelectra.data import PretrainData
    from tinyelectra.prepare import prepare

    rng = random.Random(0)
    words = [f"w{i}" for i in range(80)]
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + " ."
                      for _ in range(rng.randint(2, 8)))
            for _ in range(80)]
    (tmp_path / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    prepare(sources=[str(tmp_path / "c.txt")], out_dir=tmp_path / "d", vocab_size=256, seq_len=32, workers=1)
    data = PretrainData(tmp_path / "d")
    b = data.batch("train", np.arange(min(64, data.num_rows("train"))))
    assert np.array_equal(b.full_rows, b.attention_mask.all(1).numpy())
    assert b.full_rows.any() and not b.full_rows.all()  # both kinds in this corpus
    assert b.to("cpu").full_rows is b.full_rows
    first_full = int(np.argmax(b.full_rows))
    assert b.all_full(slice(first_full, first_full + 1)) and not b.all_full()


@pytest.mark.slow
def test_both_graphs_are_compiled_at_start_up(monkeypatch):
    """verify_compile compiles the step with and without an attention mask (and the update) before training, so the
    first batch of either kind compiles nothing (here with dynamo's aot_eager backend on the CPU): 3 graphs after the
    check, still 3 after steps of both kinds."""
    from torch._dynamo.utils import counters

    from tinyelectra.step import global_counts, new_sums, train_step

    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    engine = toy_engine(CPU, "fp32", compile_setting="reduce-overhead")
    engine.verify_compile(SPECIAL)
    assert "failed" not in engine.compile_note and counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    sums = new_sums(CPU)
    for step, padded in enumerate([None, 1, None, 2]):
        masked, seeds = mask_step(toy_batch(padded, seed=step), engine.recipe, SPECIAL, step, 0, 4, 1)
        engine.optimizer.set_lr(1e-3)
        train_step(engine, masked, seeds, global_counts(masked, engine.dist), contextlib.nullcontext(), sums)
    assert counters["stats"]["unique_graphs"] == 3 and (engine.unpadded_micro_batches, engine.micro_batches) == (2, 4)
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------------------------
# regional compilation and the whole step as one graph (train.compile = regional / regional-graph)


def flat_engine(compile_setting: str, layers: int = 2, update: str = "flat") -> Engine:
    recipe = load_recipe("tiny", [*TOY[:3], f"model.num_layers={layers}", TOY[4], f"train.compile={compile_setting}",
                                  f"train.update={update}"])
    torch.manual_seed(0)
    model = Electra(recipe.model)
    opt = build_optimizer(model, recipe.optim, "cpu")
    return Engine(model, recipe, opt, torch.amp.GradScaler("cpu", enabled=False), Dist(), CPU, "fp32", 4, 1)


def run_steps(engine: Engine, steps: int = 4) -> tuple[list[float], dict[str, float]]:
    """`steps` training steps on batches alternately without and with padding (both compiled kinds), lr 1e-3."""
    from tinyelectra.step import global_counts, new_sums, train_step

    sums, losses = new_sums(CPU), []
    for step in range(steps):
        batch = toy_batch(None if step % 2 == 0 else 1, seed=step)
        masked, seeds = mask_step(batch, engine.recipe, SPECIAL, step, 0, 4, 1)
        engine.optimizer.set_lr(1e-3)
        loss = train_step(engine, masked, seeds, global_counts(masked, engine.dist), contextlib.nullcontext(), sums)
        losses.append(float(loss))
    return losses, {k: float(v) for k, v in sums.items()}


def counting_backend(nodes: list[int]) -> str:
    """A dynamo backend that runs the captured graph eagerly and adds up its operator nodes in `nodes`."""
    def backend(gm, example_inputs):
        nodes.append(sum(n.op == "call_function" for n in gm.graph.nodes))
        return gm.forward

    name = f"tinyelectra_count_{id(nodes)}"
    torch._dynamo.register_backend(backend, name=name)
    return name


@pytest.mark.slow
def test_regional_compilation_traces_the_same_graphs_whatever_the_depth(monkeypatch):
    """Regional compilation compiles each kind of block once per shape and mask kind and reuses it for every layer:
    the graphs handed to the compiler (counted by operator nodes) are the same for 1 and 3 layers. Today's whole-step
    compilation (train.compile=on) hands it graphs that grow with every layer: the control, and why its compile time
    grew 2.8x from 2 to 12 layers (benchmarks/results/compile_time_cpu.json measures both on inductor)."""
    seen = {}
    for setting, update in (("regional", "flat"), ("on", "per-tensor")):
        for layers in (1, 3):
            nodes: list[int] = []
            monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", counting_backend(nodes))
            torch._dynamo.reset()
            engine = flat_engine(setting, layers, update)
            engine.verify_compile(SPECIAL)
            assert "failed" not in engine.compile_note, engine.compile_note
            seen[setting, layers] = sorted(nodes)
    torch._dynamo.reset()
    # 4 Block graphs, 3 others
    assert seen["regional", 1] == seen["regional", 3] and len(seen["regional", 1]) == 7, seen
    block = max(seen["regional", 1])  # a Block's graph, the largest region
    # both whole-step graphs (with and without the attention mask) grow by the 4 blocks that 2 more layers add
    assert all(deep - shallow >= 4 * block for shallow, deep in zip(seen["on", 1], seen["on", 3])), seen


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["regional", "regional-graph"])
def test_regional_and_whole_step_graph_equal_the_eager_step(monkeypatch, setting):
    """The regional step (its blocks compiled, dynamo's aot_eager backend: the same aten graph inductor lowers) and the
    whole-step graph's static step (uncaptured on the CPU: copies into static inputs, the per-step seed, the flat
    update, the sums) against the eager step with the same flat update, same weights, batches and seeds, on the
    operators compiled code runs (runtime.plain_cpu_paths): identical losses, metric sums and weights over steps
    of both kinds (with and without padding)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    with runtime.plain_cpu_paths():
        eager = flat_engine("off")
        want = run_steps(eager)
        engine = flat_engine(setting)
        assert engine.compile_now(SPECIAL)["split"]["graphs"] == 7 == counters["stats"]["unique_graphs"]
        got = run_steps(engine)
    assert counters["stats"]["unique_graphs"] == 7  # all compiled at start-up: nothing while training
    torch._dynamo.reset()
    assert got == want
    assert all(torch.equal(a, b) for a, b in zip(eager.model.parameters(), engine.model.parameters()))
    assert (engine.captured is not None) == (setting == "regional-graph")
    assert "torch.compile per region" in engine.compile_note and "update: flat" in engine.compile_note


@pytest.mark.slow
def test_whole_step_graph_capture_and_replay_logic_on_the_cpu(monkeypatch):
    """The capture's orchestration with a stand-in for torch.cuda.graph (the CPU has no CUDA graphs): a "graph"
    that, recorded, leaves every weight and optimizer state as it was (snapshot and restore around a run, as capture
    runs no kernels) and, replayed, runs the step again writing into the recorded output tensors, the parameters'
    `.grad` left as they were (a CUDA graph's gradients live in its memory pool). Start-up captures
    both batch kinds and changes nothing training computes (weights, moments, step counts, RNG-driven results);
    then replays give the eager step's losses, sums and weights exactly: the step's seed is set before each replay,
    its static inputs are refreshed, its outputs read before the next. A capture that fails leaves the same step
    running uncaptured, said in the compile note."""
    from tinyelectra.step import CapturedStep

    class FakeGraph:
        def __init__(self, body, update):
            self.body, self.update = body, update
            saved = update.snapshot()
            self.outputs = body()
            update.restore(saved)

        def replay(self):  # as a CUDA graph's replay: the parameters' `.grad` as they were (None after capture)
            grads = [p.grad for p in self.update.params]
            for out, new in zip(self.outputs, self.body()):
                out.copy_(new)
            for p, g in zip(self.update.params, grads):
                p.grad = g

    recorded = []

    def record(self, body):
        recorded.append(body)
        graph = FakeGraph(body, self.update)
        return graph, graph.outputs

    monkeypatch.setattr(CapturedStep, "_record", record)
    monkeypatch.setattr(CapturedStep, "_side_stream", lambda self: contextlib.nullcontext())
    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    with runtime.plain_cpu_paths():
        eager = flat_engine("off")
        want = run_steps(eager)
        engine = flat_engine("regional-graph")
        engine.captured.capture = True  # as on a CUDA device
        before = [t.clone() for t in engine.flat_update.snapshot()]
        engine.compile_now(SPECIAL)
        assert len(recorded) == 2 and set(engine.captured.graphs) == {False, True}
        assert all(torch.equal(a, b) for a, b in zip(before, engine.flat_update.snapshot()))
        got = run_steps(engine)
        assert all(p.grad is None for p in engine.flat_update.params)  # the graph's gradients are its own
        # a capture that fails (here: in the middle of the second kind's recording) leaves the step running uncaptured,
        # said so, with nothing training computes changed
        def fail_second(self, body):
            if recorded:
                raise RuntimeError("operation not permitted when stream is capturing")
            return record(self, body)

        assert len(recorded) == 2  # nothing captured again while training
        recorded.clear()
        monkeypatch.setattr(CapturedStep, "_record", fail_second)
        failing = flat_engine("regional-graph")
        failing.captured.capture = True
        failing.compile_now(SPECIAL)
        assert not failing.captured.capture
        assert "capture failed (RuntimeError: operation not permitted" in failing.compile_note
        assert all(torch.equal(a, b) for a, b in zip(before, failing.flat_update.snapshot()))
        uncaptured = run_steps(failing)
        # on CUDA a failure inside the recording cannot fall back (the generator is left marked as capturing): the
        # run stops with one line naming the cause and the setting to use instead
        recorded.clear()
        on_cuda = flat_engine("regional-graph")
        on_cuda.captured.capture, on_cuda.captured.recoverable = True, False
        with pytest.raises(UserError, match=r"^train\.compile=regional-graph: the whole step's CUDA-graph capture "
                                            r"failed \(RuntimeError: operation not permitted .* use "
                                            r"train\.compile=regional "):
            on_cuda.compile_now(SPECIAL)
    torch._dynamo.reset()
    assert len(recorded) == 1  # the CUDA-like engine's first kind, then nothing more (cleared before it)
    assert got == want == uncaptured
    assert all(torch.equal(a, b) for a, b in zip(eager.model.parameters(), engine.model.parameters()))
    assert engine.optimizer.state_dict()["param_groups"][0]["paper_step"] == 4


def test_a_region_that_fails_to_compile_falls_back_to_eager(monkeypatch):
    """A backend failing in the compile check: the note says so and every region's own forward is back."""
    def broken(gm, example_inputs):
        raise RuntimeError("no kernels today")

    torch._dynamo.register_backend(broken, name="tinyelectra_broken")
    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "tinyelectra_broken")
    torch._dynamo.reset()
    engine = flat_engine("regional")
    engine.verify_compile(SPECIAL)
    torch._dynamo.reset()
    assert engine.compile_note.startswith("compile: failed") and "no kernels today" in engine.compile_note
    assert not any("forward" in m.__dict__ for m in engine.model.modules())
    run_steps(engine, 2)  # eager, training


def test_compile_time_split_from_torchs_records():
    """By hand on records shaped as torch's CompilationMetrics (a forward frame and its lazy backward), and on a real
    compilation (dynamo's aot_eager backend: no inductor time)."""
    from types import SimpleNamespace

    frame = SimpleNamespace(dynamo_cumulative_compile_time_us=10_000_000,
                            aot_autograd_cumulative_compile_time_us=7_000_000,
                            inductor_cumulative_compile_time_us=5_000_000, backward_cumulative_compile_time_us=None)
    backward = SimpleNamespace(dynamo_cumulative_compile_time_us=None, inductor_cumulative_compile_time_us=2_000_000,
                               backward_cumulative_compile_time_us=2_500_000)
    runtime_record = SimpleNamespace(runtime_cudagraphify_time_us=1_500_000)
    split = runtime.compile_time_split([frame, backward, runtime_record])
    assert split == {"available": True, "dynamo_s": 3.0, "aot_s": 2.0, "inductor_s": 7.0, "backward_s": 2.5,
                     "cudagraphify_s": 1.5, "graphs": 1}
    assert runtime.compile_split_line({**split, "capture_s": 0.25}) == (
        "compile time: dynamo 3.0 s, AOT autograd 2.0 s, inductor 7.0 s (backward graphs 2.5 s), inductor's CUDA-graph "
        "recording 1.5 s, whole-step CUDA-graph capture 0.2 s; 1 graph(s)")
    torch._dynamo.reset()
    runtime.clear_compile_times()
    f = torch.compile(lambda x: (x * 2).sin().sum(), backend="aot_eager")
    x = torch.ones(3, requires_grad=True)
    f(x).backward()
    real = runtime.compile_time_split()
    torch._dynamo.reset()
    assert real["available"] and real["graphs"] == 1 and real["dynamo_s"] >= 0 and real["inductor_s"] == 0.0, real
