"""runtime.py: device and precision choice (with fake CUDA devices), compile fallback, the CPU allocator tuning
(measured by page faults in a child process), seeding, the oneDNN linear against F.linear, and the GPU path's
helpers with fake CUDA calls (device sync, peak memory, non-finite weights, the cuDNN attention probe's decision)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tinyelectra import runtime
from tinyelectra.errors import UserError


def test_pick_device_cpu_and_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert runtime.pick_device(None, None) == torch.device("cpu")
    assert runtime.pick_device(None, "cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="--device cpu"):
        runtime.pick_device(3, None)
    with pytest.raises(UserError, match="--device cpu"):
        runtime.pick_device(None, "cuda")
    with pytest.raises(UserError, match="not both"):
        runtime.pick_device(0, "cpu")
    with pytest.raises(UserError):
        runtime.pick_device(None, "banana")


def test_pick_device_gpu_index(fake_gpu):
    fake_gpu(count=2)
    assert runtime.pick_device(1, None) == torch.device("cuda", 1)
    assert runtime.pick_device(None, "cuda:1") == torch.device("cuda", 1)
    assert runtime.pick_device(None, None) == torch.device("cuda", 0)
    with pytest.raises(UserError, match="2 CUDA GPU"):
        runtime.pick_device(3, None)


def test_pick_precision_cpu():
    cpu = torch.device("cpu")
    assert runtime.pick_precision("auto", cpu)[0] == "fp32"
    assert runtime.pick_precision("fp32", cpu)[0] == "fp32"
    assert runtime.pick_precision("bf16", cpu)[0] == "bf16"  # explicit request: allowed (CPUs with bf16 units)
    with pytest.raises(UserError):
        runtime.pick_precision("fp16", cpu)
    with pytest.raises(UserError):
        runtime.pick_precision("fp8", cpu)


@pytest.mark.parametrize("units", [True, False])
def test_cpu_bf16_is_one_policy_that_says_whether_it_is_fast(monkeypatch, units):
    """Pre-training and fine-tuning share this policy (glue had a second one that refused): bf16 on the CPU runs when
    asked, and the reason says whether the CPU has the units that make it fast."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: units)
    precision, reason = runtime.pick_precision("bf16", torch.device("cpu"))
    assert precision == "bf16" and ("slower than fp32" in reason) is not units


@pytest.mark.parametrize("name,capability,expected", [
    ("Tesla V100-SXM2-16GB", (7, 0), "fp16"),
    ("Tesla T4", (7, 5), "fp16"),
    ("NVIDIA GeForce RTX 2080 Ti", (7, 5), "fp16"),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "bf16"),
    ("NVIDIA H100 80GB HBM3", (9, 0), "bf16"),
])
def test_pick_precision_auto_on_gpus(fake_gpu, name, capability, expected):
    fake_gpu(name, capability)
    precision, reason = runtime.pick_precision("auto", torch.device("cuda", 0))
    assert precision == expected
    assert name in reason and "\n" not in reason


def test_bf16_refused_on_volta(fake_gpu):
    fake_gpu("Tesla V100-SXM2-16GB", (7, 0), 16)
    with pytest.raises(UserError, match="bf16"):
        runtime.pick_precision("bf16", torch.device("cuda", 0))


def test_autocast_context():
    cpu = torch.device("cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with runtime.autocast_context("fp32", cpu):
        assert (a @ b).dtype == torch.float32
    with runtime.autocast_context("bf16", cpu):
        assert (a @ b).dtype == torch.bfloat16 and torch.is_autocast_cache_enabled()
    with runtime.autocast_context("bf16", cpu, cache=False):  # CUDA-graph replays: no cache of the weights' casts
        assert (a @ b).dtype == torch.bfloat16 and not torch.is_autocast_cache_enabled()
    assert torch.is_autocast_cache_enabled()


def test_maybe_compile_off_and_auto_on_cpu():
    def f(x):
        return x + 1

    obj, note = runtime.maybe_compile(f, "off", torch.device("cpu"))
    assert obj is f and "off" in note
    obj, note = runtime.maybe_compile(f, "auto", torch.device("cpu"))
    assert obj is f and "CPU" in note
    with pytest.raises(UserError):
        runtime.maybe_compile(f, "fast", torch.device("cpu"))


def test_maybe_compile_falls_back_when_first_call_fails(monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", lambda fn, **_: broken)
    obj, note = runtime.maybe_compile(lambda x: x * 2, "on", torch.device("cpu"))
    assert "inductor" in note
    assert obj(torch.tensor(3.0)).item() == 6.0  # eager result despite the failure
    assert "failed" in obj.note
    assert obj(torch.tensor(4.0)).item() == 8.0


def test_maybe_compile_module_falls_back_and_keeps_attributes(monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("no triton")

    monkeypatch.setattr(torch, "compile", lambda fn, **_: broken)
    lin = torch.nn.Linear(2, 1)
    obj, _ = runtime.maybe_compile(lin, "on", torch.device("cpu"))
    x = torch.ones(3, 2)
    assert torch.equal(obj(x), lin(x)) and "failed" in obj.note
    assert obj.weight is lin.weight


_FAULTS_SCRIPT = """
import resource, sys, torch
from tinyelectra.runtime import tune_cpu
if sys.argv[1] == "tuned":
    print(tune_cpu(), file=sys.stderr)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # a training step's pattern: several large temporaries alive together, then all freed
    a = torch.empty(10 * 2**20).fill_(1.0)  # 40 MiB each: above glibc's largest default mmap threshold (32 MiB)
    b = torch.empty(10 * 2**20).fill_(1.0)
    c = a + b
    del a, b, c
for _ in range(4):  # warm-up: the heap grows until freed blocks coalesce into reusable ones
    step()
before = faults()
for _ in range(3):
    step()
print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt tuning is Linux-only")
@pytest.mark.cli
@pytest.mark.slow
def test_tune_cpu_stops_page_faults_on_reallocation():
    """With glibc defaults each 40 MiB temporary is a fresh mmap: 10,240 page faults (4 KiB pages) each, 3 per
    step. After tune_cpu() freed blocks stay in the heap and, after a few warm-up steps, are reused: here none of the
    three faults again; on the CI machine one of them still did (30,720 faults in 3 steps against 92,169), so the
    assertion asks for fewer than half the default's faults, which an untuned allocator never reaches."""
    def run(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1])

    default, tuned = run("default"), run("tuned")
    pages_per_step = 3 * 40 * 2**20 // 4096
    assert default > 2 * pages_per_step  # transparent huge pages could lower this, but not below a pass per step
    assert tuned * 2 < default


@pytest.mark.parametrize("shape,bias", [((6, 5), True), ((2, 3, 5), True), ((2, 3, 5), False)])
def test_linear_matches_f_linear_forward_and_backward(shape, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, requires_grad=True)
    w = torch.randn(4, 5, generator=g, requires_grad=True)
    b = torch.randn(4, generator=g, requires_grad=True) if bias else None
    gy = torch.randn(*shape[:-1], 4, generator=g)
    ours = runtime.linear(x, w, b)
    ours.backward(gy)
    got = [t.grad.clone() for t in (x, w, b) if t is not None]
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    ref = F.linear(x, w, b)
    ref.backward(gy)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    for a, r in zip(got, [t.grad for t in (x, w, b) if t is not None]):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_linear_under_autocast_uses_autocast_dtype():
    x, w = torch.randn(3, 4), torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert runtime.linear(x, w).dtype == torch.bfloat16


@pytest.mark.parametrize("n_out,k_in", [(4, 9), (9, 4)])
def test_weight_gradient_in_both_orientations(n_out, k_in):
    """The weight gradient g^T x (N, K): oneDNN copies whichever operand is narrower, both ways equal to the matmul."""
    g = torch.Generator().manual_seed(1)
    g2, x2 = torch.randn(7, n_out, generator=g), torch.randn(7, k_in, generator=g)
    torch.testing.assert_close(runtime._weight_grad(g2, x2), g2.t() @ x2, rtol=1e-5, atol=1e-5)


def test_cpu_dropout_keeps_share_scales_and_follows_torch_seed():
    """runtime.dropout (NumPy PCG64 masks): values are 0 or x / (1 - p), about 1 - p of them kept, the mask fixed by
    torch.manual_seed like F.dropout's, and no dropout outside training."""
    x, p = torch.full((200, 500), 2.0), 0.1
    torch.manual_seed(3)
    a = runtime.dropout(x, p, True)
    torch.manual_seed(3)
    b = runtime.dropout(x, p, True)
    assert torch.equal(a, b)
    assert torch.all((a == 0) | torch.isclose(a, torch.tensor(2.0 / (1 - p))))
    kept = (a != 0).float().mean().item()
    assert abs(kept - (1 - p)) < 0.005  # 100,000 draws: the standard error is 0.001
    assert runtime.dropout(x, p, False) is x


# ----------------------------------------------------------------------------------------------------------------
# the GPU path's helpers, with fake CUDA calls


def test_synchronize_waits_for_cuda_devices_only(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    runtime.synchronize(torch.device("cpu"))
    runtime.synchronize(torch.device("cuda", 1))
    assert waited == [torch.device("cuda", 1)]


def test_peak_gpu_memory_is_the_allocators_maximum_in_gib(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30 + 2**29)
    assert runtime.peak_gpu_memory_gib(torch.device("cuda", 0)) == 3.5
    assert runtime.peak_gpu_memory_gib(torch.device("cpu")) is None


def test_nonfinite_parameters_names_them():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    assert runtime.nonfinite_parameters(model) == []
    with torch.no_grad():
        model[1].bias[0] = float("nan")
        model[0].weight[2, 1] = float("-inf")
    assert runtime.nonfinite_parameters(model) == ["0.weight", "1.bias"]


@pytest.mark.parametrize("probe_says,switched_off", [(False, True), (True, False), (RuntimeError("no kernel"), False)])
def test_cudnn_attention_is_switched_off_only_when_its_gradients_are_not_finite(monkeypatch, probe_says, switched_off):
    """The decision of runtime.guard_cudnn_sdpa (fine-tuning's set-up on CUDA), with a fake probe: non-finite
    gradients switch cuDNN attention off and say so; finite ones, or no cuDNN attention at all, change nothing.
    On the CPU the probe does not run."""
    calls, disabled = [], []

    def probe(device):
        calls.append(device)
        if isinstance(probe_says, Exception):
            raise probe_says
        return probe_says

    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda on: disabled.append(on))
    note = runtime.guard_cudnn_sdpa(torch.device("cuda", 0), probe=probe)
    assert calls == [torch.device("cuda", 0)] and disabled == ([False] if switched_off else [])
    assert ("cuDNN attention off" in note) == switched_off and ("192" in note) == switched_off
    assert runtime.guard_cudnn_sdpa(torch.device("cpu"), probe=probe) == "" and len(calls) == 1


# ----------------------------------------------------------------------------------------------------------------
# the card guide: one policy of the compute capability (tinyelectra/docs/gpus.md shows it)

# name, compute capability (NVIDIA's published list, developer.nvidia.com/cuda-gpus), memory in GiB
CARDS = {
    "V100 16 GB": ("Tesla V100-SXM2-16GB", (7, 0), 15.8),
    "V100 32 GB": ("Tesla V100-SXM2-32GB", (7, 0), 31.7),
    "T4": ("Tesla T4", (7, 5), 14.6),
    "RTX 3090": ("NVIDIA GeForce RTX 3090", (8, 6), 23.7),
    "RTX 4090": ("NVIDIA GeForce RTX 4090", (8, 9), 23.6),
    "A100 40 GB": ("NVIDIA A100-SXM4-40GB", (8, 0), 39.4),
    "A100 80 GB": ("NVIDIA A100-SXM4-80GB", (8, 0), 79.2),
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), 79.2),
}
# what --gpu 0 must pick on each: precision, FlashAttention, GEMMs pinned to cuBLAS, the CUDA 12.6 wheel
EXPECTED = {"V100 16 GB": ("fp16", False, True, True), "V100 32 GB": ("fp16", False, True, True),
            "T4": ("fp16", False, True, False), "RTX 3090": ("bf16", True, False, False),
            "RTX 4090": ("bf16", True, False, False), "A100 40 GB": ("bf16", True, False, False),
            "A100 80 GB": ("bf16", True, False, False), "H100": ("bf16", True, False, False)}


@pytest.mark.parametrize("card", list(CARDS))
def test_the_card_guide_is_what_the_runtime_picks(fake_gpu, card):
    """Given a card's properties, the runtime's own choices: bf16 from Ampere (8.0) on, fp16 with loss scaling on
    V100/T4 (no bf16 units); inductor + CUDA graphs on all of them (one process, one micro-batch); FlashAttention
    (train.attention=varlen) only from 8.0; below 8.0 inductor's GEMMs pinned to cuBLAS (Triton has no tensor-core
    matmuls there), seen through torch's own test of which GEMM kernels inductor may use; the V100 needs torch's
    CUDA 12.6 build (the 12.8 and 13.0 builds dropped sm_70)."""
    import torch._inductor.config as inductor_config
    from torch._inductor import utils as inductor_utils

    from tinyelectra.model import varlen_blocker

    name, capability, memory = CARDS[card]
    precision, flash, pinned, cu126 = EXPECTED[card]
    fake_gpu(name, capability, memory)
    gpu = torch.device("cuda", 0)
    policy = runtime.card_of(gpu)
    assert (policy.precision, policy.flash, policy.pins_gemms, "cu126" in policy.wheel) == EXPECTED[card]
    assert name in policy.label and f"{capability[0]}.{capability[1]}" in policy.label
    assert runtime.pick_precision("auto", gpu)[0] == precision
    if precision == "fp16":
        with pytest.raises(UserError, match="no bf16"):
            runtime.pick_precision("bf16", gpu)
    assert runtime.choose_compile("auto", gpu).mode == "reduce-overhead"  # one process, one micro-batch
    assert runtime.choose_compile("auto", gpu, micro_batches=2).mode == "on"
    assert (varlen_blocker(capability, [64, 64]) == "") == flash
    # a user's max_autotune
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON,CPP"):
        assert (runtime.configure_inductor_gemms(gpu) != "") == pinned
        assert inductor_utils._use_autotune_backend("TRITON") != pinned
    assert inductor_config.max_autotune is False and inductor_utils.use_aten_gemm_kernels()  # the default: cuBLAS


def test_a_card_older_than_volta_trains_eager(fake_gpu):
    """Pascal (6.x): inductor's Triton needs 7.0+, so "auto" runs eager instead of failing at the first compile."""
    fake_gpu("Tesla P100-PCIE-16GB", (6, 0), 15.9)
    choice = runtime.choose_compile("auto", torch.device("cuda", 0))
    assert choice.mode == "off" and "7.0+" in choice.why
    assert runtime.pick_precision("auto", torch.device("cuda", 0))[0] == "fp16"
