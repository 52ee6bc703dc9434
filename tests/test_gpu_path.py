"""The GPU path's logic, on the CPU (issue 10): the device each torchrun process takes, the deterministic set-up
(cuBLAS's workspace before any GPU work), a compilation that fails in the forward, the backward or the update
falling back to eager with every label saying so (logs, summary.json, benchmarks/throughput.py), the graph-safe
update against the fused paper Adam, the attention kernel recorded, the whole training step compiling once,
with fullgraph=True, without recompiling as the learning rate moves (CPU inductor); where the trainer waits for the
device (the first step, a time budget's calibration steps: issue 20), summary.json's median speed and peak memory,
and fp16 loss scaling against the divergence guard (fp16 autocast runs on the CPU too).

The GPU itself is exercised by tests/test_gpu.py (marker `gpu`, skipped without CUDA).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from pathlib import Path

import pytest
import torch

from tinyelectra import optim, runtime
from tinyelectra import step as step_mod
from tinyelectra import train as train_mod
from tinyelectra.budget import parse_budget
from tinyelectra.config import load_recipe
from tinyelectra.errors import UserError


# a toy model on toy data: 1 layer, 4 rows of 32 tokens, a 256-entry vocabulary
TOY = ["model.vocab_size=256", "train.seq_len=32", "model.max_positions=32", "model.num_layers=1",
       "train.batch_size=4", "train.eval_rows=8", "train.log_every_steps=1"]


pytestmark = pytest.mark.usefixtures("one_thread")  # toy tensors run on one thread here too


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> Path:
    from tinyelectra.prepare import prepare

    root = tmp_path_factory.mktemp("toy")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(150)]
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(6, 16))) + " ."
                      for _ in range(rng.randint(4, 12))) for _ in range(200)]
    (root / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    prepare(sources=[str(root / "corpus.txt")], out_dir=root / "data", vocab_size=256, seq_len=32, workers=1,
            validation_fraction=0.05)
    return root / "data"


@pytest.fixture()
def restore_determinism():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
              torch.backends.cudnn.deterministic)
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[1], before[2]


def fake_cuda(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H100 80GB HBM3")


def command_device(monkeypatch, tmp_path, gpu=None, device=None, overrides=()) -> dict:
    """Run `train_command` up to the point where training would start (training, data and process-group set-up
    replaced by stubs); returns what it chose: the device, and what `torch.cuda.set_device` was given."""
    seen: dict = {"set_device": []}
    monkeypatch.setattr(train_mod, "train", lambda recipe, bud, data, run_dir, dev, **kw: seen.update(device=dev))
    monkeypatch.setattr(train_mod, "resolve_data", lambda *a, **k: tmp_path / "data")
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: seen.update(backend=a[0]))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen["set_device"].append(torch.device(d)))
    train_mod.train_command("1steps", None, None, "tiny", gpu, device, tmp_path / "run", False, list(overrides), "test")
    return seen


# ----------------------------------------------------------------------------------------------------------------
# defect 1: under torchrun every process on cuda:0


@pytest.mark.parametrize("gpu,device", [(None, None), (0, None), (None, "cuda")])
def test_torchrun_puts_each_process_on_its_local_rank(monkeypatch, tmp_path, gpu, device):
    """`torchrun --nproc_per_node 4 -m tinyelectra train ...` as the README shows it (no --gpu), and with --gpu 0 or
    --device cuda: process LOCAL_RANK=2 trains on cuda:2 (before the fix: cuda:0 without --gpu, i.e. 4 processes on
    one GPU, which NCCL refuses)."""
    fake_cuda(monkeypatch, 4)
    for k, v in {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2"}.items():
        monkeypatch.setenv(k, v)
    seen = command_device(monkeypatch, tmp_path, gpu, device)
    assert seen["device"] == torch.device("cuda", 2)
    assert seen["set_device"] and seen["set_device"][0] == torch.device("cuda", 2)
    assert seen["backend"] == "nccl"


def test_torchrun_on_the_cpu_and_one_process(monkeypatch, tmp_path):
    fake_cuda(monkeypatch, 4)
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    seen = command_device(monkeypatch, tmp_path, device="cpu")
    assert seen["device"] == torch.device("cpu") and seen["backend"] == "gloo"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k)
    # one process: --gpu N
    assert command_device(monkeypatch, tmp_path / "b", gpu=3)["device"] == torch.device("cuda", 3)


def test_torchrun_with_more_processes_than_gpus_is_one_clear_error(monkeypatch):
    fake_cuda(monkeypatch, 2)
    with pytest.raises(UserError, match="LOCAL_RANK 2 .* 2 CUDA GPU"):
        runtime.pick_process_device(None, None, local_rank=2, world=4)


# ----------------------------------------------------------------------------------------------------------------
# defect 2: train.deterministic=true and cuBLAS


def test_deterministic_sets_cublas_workspace_before_the_device_is_chosen(monkeypatch, tmp_path, restore_determinism):
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when its first handle is made; without it a deterministic run
    raises at its first matmul on a GPU. train_command sets it before it even looks for a GPU."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    at_device_choice = []
    real = runtime.pick_device

    def watching(*a, **k):
        at_device_choice.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        return real(*a, **k)

    monkeypatch.setattr(runtime, "pick_device", watching)
    fake_cuda(monkeypatch, 1)
    seen = command_device(monkeypatch, tmp_path, gpu=0, overrides=["train.deterministic=true"])
    assert seen["device"] == torch.device("cuda", 0)
    assert at_device_choice and at_device_choice[0] in (":4096:8", ":16:8")  # cuBLAS's two reproducible settings
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic


def test_deterministic_keeps_a_valid_setting_and_replaces_an_invalid_one(monkeypatch, restore_determinism):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert ":16:8" in runtime.set_deterministic(True)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    runtime.set_deterministic(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    assert runtime.set_deterministic(False) == "" and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


# ----------------------------------------------------------------------------------------------------------------
# defect 3: a failed compilation reported as compiled; a failure in the backward ending the run


def failing_backend(where: str):
    """A torch.compile backend that compiles the forward (eagerly) but whose compiled backward (where="backward")
    or forward (where="forward") raises when it runs, as a Triton kernel that fails to build at first launch does."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def boom(*_a):
        raise RuntimeError(f"simulated: the compiled {where} failed")

    def fw(gm, _inputs):
        return make_boxed_func(boom) if where == "forward" else make_boxed_func(gm.forward)

    def bw(gm, _inputs):
        return make_boxed_func(boom) if where == "backward" else make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=fw, bw_compiler=bw)


def patch_compile(monkeypatch, where: str) -> None:
    real = torch.compile

    def compile_with_failing_backend(obj, **kwargs):
        kwargs.pop("mode", None)  # a custom backend takes no mode
        return real(obj, backend=failing_backend(where), **kwargs)

    monkeypatch.setattr(torch, "compile", compile_with_failing_backend)


def run_train(data: Path, out: Path, overrides: list[str], steps: int = 3) -> dict:
    recipe = load_recipe("tiny", [*TOY, *overrides])
    out.mkdir(parents=True)
    return train_mod.train(recipe, parse_budget(f"{steps}steps"), data, out, torch.device("cpu"))


def losses(run: Path) -> dict:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: (r["gen_loss"], r["disc_loss"]) for r in recs if "event" not in r}


@pytest.mark.parametrize("where", ["backward", "forward"])
@pytest.mark.slow
def test_compile_failure_falls_back_to_eager_and_every_label_says_so(monkeypatch, toy_data, tmp_path, capsys, where):
    """A backend that fails in the backward (before the fix: the exception ended the run) or in the forward: the run
    trains eagerly, with exactly the losses of a compile=off run (the compile check on dummy rows changes nothing),
    and the log line and summary.json say the compilation failed instead of "torch.compile (inductor)"."""
    eager = run_train(toy_data, tmp_path / "eager", ["train.compile=off"])
    capsys.readouterr()
    patch_compile(monkeypatch, where)
    summary = run_train(toy_data, tmp_path / "fallback", ["train.compile=on"])
    err = " ".join(capsys.readouterr().err.split())
    assert "compile: failed" in err and "compile: torch.compile" not in err, err  # the log line
    note = summary["runtime"]["compile"]
    assert note.startswith("compile: failed") and "running eager" in note and f"compiled {where} failed" in note
    saved = json.loads((tmp_path / "fallback" / "summary.json").read_text())
    assert saved["runtime"]["compile"] == note
    assert losses(tmp_path / "fallback") == losses(tmp_path / "eager") and eager["steps"] == summary["steps"] == 3


@pytest.mark.slow
def test_a_compiled_step_that_works_is_labelled_compiled(monkeypatch, toy_data, tmp_path):
    """The same path with a backend that works (aot_eager, as the CPU smoke run uses: no C++ compiler needed), in
    both compile modes: labelled compiled, with the backend named; the same losses as eager (aot_eager runs the
    same aten operators in the same order)."""
    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "aot_eager")
    on = run_train(toy_data, tmp_path / "on", ["train.compile=on"], steps=2)
    assert on["runtime"]["compile"] == ("compile: torch.compile (aot_eager backend from TINYELECTRA_COMPILE_BACKEND, "
                                        "not inductor, fullgraph)")
    # SDPA, compiled
    assert on["runtime"]["attention"] == "attention on the CPU: math (unfused: T x T scores in memory)"
    ro = run_train(toy_data, tmp_path / "ro", ["train.compile=reduce-overhead"], steps=2)
    assert (ro["runtime"]["compile"].startswith("compile: torch.compile (aot_eager backend")
            and "no CUDA graphs" in ro["runtime"]["compile"])
    assert "update: clip + paper Adam as one graph-safe function, torch.compile (aot_eager" in ro["runtime"]["compile"]
    eager = run_train(toy_data, tmp_path / "off", ["train.compile=off"], steps=2)
    assert eager["runtime"]["attention"].startswith("attention on the CPU: tinyelectra's CPU attention")


@pytest.mark.slow
def test_throughput_benchmark_reports_the_fallback(monkeypatch, tmp_path):
    """benchmarks/throughput.py with both sides compiled and a backend failing in the backward: it measures (before
    the fix: the first step raised) and its JSON says which side fell back, instead of "torch.compile (inductor)"."""
    from benchmarks import throughput

    patch_compile(monkeypatch, "backward")
    doc = throughput.main(["--device", "cpu", "--recipe", "tiny", "--batch", "2", "--seq-len", "16", "--rounds", "2",
                           "--warmup", "0", "--compile", "on", "--no-memory", "--threads", "1",
                           "--out-dir", str(tmp_path), "--name", "t"])
    for side in ("tinyelectra", "transformers"):
        assert doc[side]["compile_note"].startswith("compile: failed"), doc[side]["compile_note"]
        assert doc[side]["compiled"] is False
    assert (json.loads((tmp_path / "t.json").read_text())["tinyelectra"]["compile_note"]
            == doc["tinyelectra"]["compile_note"])


# ----------------------------------------------------------------------------------------------------------------
# CUDA graphs made safe by construction: the graph-safe update, and the rules of reduce-overhead


def build_engine(overrides: list[str], accum: int = 1, dist=None):
    from tinyelectra.model import Electra
    from tinyelectra.optim import build_optimizer

    recipe = load_recipe("tiny", [*TOY, *overrides])
    torch.manual_seed(0)
    model = Electra(recipe.model)
    opt = build_optimizer(model, recipe.optim, "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    B = recipe.train.batch_size
    return train_mod.Engine(model, recipe, opt, scaler, dist or train_mod.Dist(), torch.device("cpu"), "fp32",
                            B // accum, accum)


def test_reduce_overhead_refuses_accumulation_and_ddp():
    with pytest.raises(UserError, match="one micro-batch per step"):
        build_engine(["train.compile=reduce-overhead"], accum=2)
    with pytest.raises(UserError, match="one process"):
        build_engine(["train.compile=reduce-overhead"], dist=train_mod.Dist(rank=0, world=2, local_rank=0))


def test_graph_safe_update_equals_the_fused_paper_adam():
    """GraphSafeUpdate (clip + paper Adam with a tensor learning rate, as reduce-overhead compiles it; eager here)
    against the trainer's apply_update (clip_grad_norm_ + PaperAdam on torch's fused kernel), 6 steps with a moving
    learning rate and gradients large enough to be clipped: the same weights and state to float rounding, the
    gradients left as they were; and its dry run changes nothing."""
    from tinyelectra.model import Electra
    from tinyelectra.optim import GraphSafeUpdate, build_optimizer

    recipe = load_recipe("tiny", TOY)
    torch.manual_seed(0)
    models = [Electra(recipe.model) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [build_optimizer(m, recipe.optim, "cpu") for m in models]
    update = GraphSafeUpdate(opts[1], clip_norm=1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    params = [p for p in models[0].parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        grads = [torch.randn(p.shape, generator=g) * (0.01 if step % 2 else 1.0) for p in params]
        lr = 1e-3 * (step + 1)
        for m, o in zip(models, opts):
            for p, gr in zip(m.parameters(), grads):
                p.grad = gr.clone()
            o.set_lr(lr)
        optim.apply_update(params, opts[0], scaler, 1.0)
        if step == 3:  # a dry run (compile check) in the middle changes nothing
            before = ({k: v.clone() for k, v in models[1].state_dict().items()},
                      {id(p): {k: v.clone() for k, v in s.items()} for p, s in opts[1].state.items()})
            update.dry_run()
            assert all(torch.equal(v, models[1].state_dict()[k]) for k, v in before[0].items())
            assert all(torch.equal(v, opts[1].state[p][k]) for p in opts[1].state for k, v in before[1][id(p)].items())
        given = [(p.grad, p.grad._version, p.grad.clone()) for p in models[1].parameters()]
        update()
        # the gradients are only read (clipped copies): inductor skips CUDA graphs for a function that writes in
        # place to an input without a static address ("mutated inputs"), which new gradients every step are not
        assert all(g._version == version and torch.equal(g, copy) for g, version, copy in given), step
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    sa, sb = opts[0].state_dict(), opts[1].state_dict()
    assert [g["paper_step"] for g in sa["param_groups"]] == [g["paper_step"] for g in sb["param_groups"]] == [6, 6]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        assert sa["state"][k].keys() == sb["state"][k].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sa["state"][k][name], sb["state"][k][name], rtol=1e-5, atol=1e-9)
        assert float(sa["state"][k]["step"]) == float(sb["state"][k]["step"]) == 6.0
    assert all(p.grad is None for p in models[1].parameters())


def test_paper_adam_foreach_is_the_paper_formula():
    from test_optim import reference_paper_adam

    from tinyelectra.optim import paper_adam_foreach_, lr_at

    g = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    init = [torch.randn(s, generator=g) for s in shapes]
    steps = 200
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]
    lrs = [lr_at(t, 1e-2, 20, steps + 1) for t in range(1, steps + 1)]
    params = [x.clone() for x in init]
    m, v = [torch.zeros_like(x) for x in init], [torch.zeros_like(x) for x in init]
    lr_t = torch.zeros(())
    for gs, lr in zip(grads, lrs):
        lr_t.fill_(lr)
        paper_adam_foreach_(params, gs, m, v, lr_t, 0.9, 0.999, 1e-6, 0.01)
    want = reference_paper_adam(init, grads, lrs, [([0, 1, 2], 0.01, 1.0)])
    for p, w in zip(params, want):
        assert torch.allclose(p.double(), w, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_reduce_overhead_compiles_the_step_once_without_graph_breaks(toy_data, tmp_path):
    """The whole training step — forward and backward of the ELECTRA objective (masking outside), and the update —
    compiled by the CPU inductor with fullgraph=True (a graph break raises) in reduce-overhead mode (CUDA graphs on
    a GPU), over 5 steps whose learning rate changes every step: exactly three graphs, all compiled at start-up (the
    step with an attention mask, the step without one for batches without padding, the update), no graph break, no
    recompilation while training (the toy data has batches of both kinds), labels saying compiled. About a minute
    of compilation with a cold cache on 2 busy cores."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    at_startup = []
    real_compile_now = step_mod.Engine.compile_now

    def compile_now(self, special):
        out = real_compile_now(self, special)
        at_startup.append(counters["stats"]["unique_graphs"])
        return out

    step_mod.Engine.compile_now = compile_now
    try:
        summary = run_train(toy_data, tmp_path / "ro", ["train.compile=reduce-overhead"], steps=5)
    finally:
        step_mod.Engine.compile_now = real_compile_now
    assert summary["steps"] == 5
    assert at_startup == [3] and counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    note = summary["runtime"]["compile"]
    assert note.startswith("compile: torch.compile (inductor, mode reduce-overhead") and "fullgraph" in note
    assert "update: clip + paper Adam as one graph-safe function, torch.compile" in note and "failed" not in note
    compiled = summary["runtime"]["compiled"]
    assert compiled["mode"] == "reduce-overhead" and compiled["seconds"] > 0 and compiled["cache"]
    recs = [json.loads(x) for x in (tmp_path / "ro" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    lrs = [r["lr"] for r in recs if "event" not in r]
    # a new learning rate every step, no recompile
    assert len(lrs) == 5 and all(a != b for a, b in zip(lrs, lrs[1:])), lrs
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------------------------
# which attention kernel runs


def test_attention_kernel_is_what_sdpa_dispatches():
    from tinyelectra.model import attention_kernel

    cfg = load_recipe("electra-small").model
    cpu = torch.device("cpu")
    train_eager = attention_kernel(cfg, 4, 128, cpu, torch.float32)
    assert "tinyelectra's CPU attention" in train_eager["discriminator"]["kernel"]
    compiled = attention_kernel(cfg, 4, 128, cpu, torch.float32, compiled=True)
    assert compiled["discriminator"]["kernel"].startswith("math")  # SDPA on the CPU: dropout rules out its fused kernel
    assert attention_kernel(cfg, 4, 128, cpu, torch.float32, training=False)["discriminator"]["kernel"] == "flash"
    assert compiled["dropout"] == 0.1 and compiled["generator"]["kernel"] == compiled["discriminator"]["kernel"]


def test_cpu_only_fast_paths_are_off_on_other_devices(monkeypatch):
    """Known good, kept so: the CPU tricks (oneDNN linear, NumPy dropout masks, inverse-CDF sampling, the baddbmm
    attention) run only on CPU tensors. A full forward + backward of the objective on `meta` tensors (standing in for
    CUDA ones: neither is "cpu") with each trick made to raise."""
    from tinyelectra.electra import SpecialIds, combine, loss_terms, mask_batch
    from tinyelectra.model import Electra

    def used(*_a, **_k):
        raise AssertionError("a CPU-only fast path ran off the CPU")

    monkeypatch.setattr(runtime, "cpu_rand", used)
    monkeypatch.setattr(runtime._OneDNNLinear, "apply", used)
    monkeypatch.setattr(torch, "searchsorted", used)
    monkeypatch.setattr(torch, "baddbmm", used)
    recipe = load_recipe("tiny", ["model.num_layers=1"])
    model = Electra(recipe.model).to("meta").train()
    ids = torch.randint(1000, 8000, (2, 16), device="meta")
    m = mask_batch(ids, torch.zeros_like(ids), torch.ones(2, 16, dtype=torch.bool, device="meta"), recipe.objective,
                   SpecialIds(pad=0, cls=101, sep=102, mask=103), recipe.model.vocab_size)
    loss = combine(loss_terms(model, m, recipe.objective), recipe.objective, m.mlm_count, m.token_count)
    loss.backward()
    assert loss.device.type == "meta" and model.embeddings.word.weight.grad is not None


# ----------------------------------------------------------------------------------------------------------------
# host clocks and the device: where the trainer waits for it, what summary.json says about speed and memory


def simulated_clock(monkeypatch, seconds_per_step: float):
    """Training time that advances by `seconds_per_step` at every optimizer update (Engine.update), as in
    test_time_budget.py; returns (clock, [updates so far])."""
    now, updates = [0.0], [0]
    real_update = train_mod.Engine.update

    def update(self):
        real_update(self)
        updates[0] += 1
        now[0] += seconds_per_step

    monkeypatch.setattr(train_mod.Engine, "update", update)
    return (lambda: now[0]), updates


@pytest.mark.parametrize("budget,synced_after", [("3s", [1, 2, 3]), ("6steps", [1])])
def test_the_device_is_waited_for_at_the_first_step_and_the_calibration_steps(monkeypatch, toy_data, tmp_path,
                                                                              budget, synced_after):
    """runtime.synchronize (torch.cuda.synchronize on a GPU) runs after the first step, whose end closes the start-up,
    and after each step of a time budget's calibration (here: 0.25 s per step, planned after two timed steps, at
    step 3), and nowhere else in the loop: a host clock read there times finished kernels, not their launches."""
    clock, updates = simulated_clock(monkeypatch, 0.25)
    synced = []
    monkeypatch.setattr(runtime, "synchronize", lambda device: synced.append(updates[0]))
    recipe = load_recipe("tiny", TOY)
    out = tmp_path / "run"
    out.mkdir()
    summary = train_mod.train(recipe, parse_budget(budget), toy_data, out, torch.device("cpu"), clock=clock)
    assert summary["steps"] > synced_after[-1] + 2, summary["steps"]  # steps after the last sync, none synchronised
    assert synced == synced_after


def test_summary_records_the_median_speed_and_the_peak_memory(toy_data, tmp_path):
    """median_tokens_per_second: the median of the log windows' tokens/s, the first left out (recomputed here from
    metrics.jsonl); peak_gpu_memory_gib: null off CUDA; host_sync_per_step: null without fp16."""
    import statistics

    summary = run_train(toy_data, tmp_path / "run", [], steps=6)
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rates = [r["tokens_per_second"] for r in recs if "event" not in r]
    assert len(rates) == 6 and summary["median_tokens_per_second"] == statistics.median(rates[1:]) > 0
    assert summary["peak_gpu_memory_gib"] is None and summary["host_sync_per_step"] is None
    assert (json.loads((tmp_path / "run" / "summary.json").read_text())["median_tokens_per_second"]
            == summary["median_tokens_per_second"])


def test_median_tokens_per_second_leaves_out_the_first_window():
    from tinyelectra.logs import median_tokens_per_second

    stream = [{"step": 10, "tokens_per_second": 50.0}, {"step": 20, "tokens_per_second": 900.0},
              {"step": 30, "tokens_per_second": 1100.0}, {"step": 40, "tokens_per_second": 1000.0}]
    assert median_tokens_per_second(stream) == 1000.0  # not 950 (the first window: compilation)
    assert median_tokens_per_second(stream[:3]) == 1000.0
    assert median_tokens_per_second(stream[:1]) is None and median_tokens_per_second([]) is None


# ----------------------------------------------------------------------------------------------------------------
# fp16's loss scaling and the divergence guard (fp16 autocast runs on the CPU too; the trainer is told it is fp16)


def fp16_on_the_cpu(monkeypatch, init_scale: float) -> list[tuple[float, float]]:
    """The trainer with fp16 autocast and an enabled loss scaler starting at `init_scale`; returns the list that gets
    each update's (scale before, scale after)."""
    import functools

    monkeypatch.setattr(runtime, "pick_precision",
                        lambda requested, device: ("fp16", "fp16 autocast (test, on the CPU)"))
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=init_scale))
    scales = []
    real_apply = step_mod.apply_update

    def apply(params, optimizer, scaler, clip_norm):
        before = scaler.get_scale()
        norm = real_apply(params, optimizer, scaler, clip_norm)
        scales.append((before, scaler.get_scale()))
        return norm

    monkeypatch.setattr(step_mod, "apply_update", apply)
    return scales


def test_fp16_overflowing_gradients_skip_steps_and_do_not_stop_the_run(monkeypatch, toy_data, tmp_path):
    """A loss scale of 2^40 makes the first steps' fp16 gradients overflow: the scaler skips them and lowers the
    scale, the losses stay finite, and the run finishes (an inf gradient is not a non-finite loss); summary.json names
    fp16's per-step host sync beside the speed."""
    scales = fp16_on_the_cpu(monkeypatch, 2.0**40)
    summary = run_train(toy_data, tmp_path / "run", [], steps=6)
    assert summary["steps"] == 6 and summary["precision"] == "fp16"
    assert scales[0] == (2.0**40, 2.0**39)  # skipped: the scale halved
    assert all(math.isfinite(g) and math.isfinite(d) for g, d in losses(tmp_path / "run").values())
    assert "loss scaler" in summary["host_sync_per_step"] and "host sync per step" in summary["host_sync_per_step"]


def test_fp16_a_nonfinite_loss_stops_the_run_though_the_scaler_skipped_its_step(monkeypatch, toy_data, tmp_path):
    """From the 3rd step on the generator's loss is NaN (injected): its gradients are NaN, so the scaler skips the
    update and the weights stay finite, but the loss is checked where it is read (the log step): the run stops with
    Diverged naming step 3 and the resume state of step 2, and writes no checkpoint or summary after it."""
    from tinyelectra.errors import Diverged

    scales = fp16_on_the_cpu(monkeypatch, 2.0**8)
    forwards = [0]
    real_terms = step_mod.loss_terms

    def nan_from_step_3(model, m, objective, **kwargs):
        forwards[0] += 1
        t = real_terms(model, m, objective, **kwargs)
        return t if forwards[0] < 3 else dataclasses.replace(t, mlm_sum=t.mlm_sum * float("nan"))

    monkeypatch.setattr(step_mod, "loss_terms", nan_from_step_3)
    with pytest.raises(Diverged, match=r"the generator \(MLM\) loss is nan in step 3 .*resume state at step 2") as e:
        run_train(toy_data, tmp_path / "run", [], steps=16)
    assert e.value.exit_code == 3 and len(scales) == 3 and scales[2][1] == scales[2][0] / 2  # step 3: skipped
    assert sorted(p.name for p in (tmp_path / "run").glob("ckpt-*")) == ["ckpt-0625", "ckpt-1250"]  # steps 1 and 2
    assert not (tmp_path / "run" / "summary.json").exists()
