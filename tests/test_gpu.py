"""On a CUDA GPU (marker `gpu`; every test here is skipped without one): a 20-step run per precision (with the speed,
peak memory and fp16 host-sync labels of summary.json), exact resume after a SIGKILL with deterministic mode, the
CUDA-graphs mode against the compiled one, no host synchronisation inside a training step, the cuDNN attention probe
fine-tuning runs first, and, with two GPUs or more, one DDP process per GPU.

Written before any GPU ran this code (issue 10): a failure here is a finding to fix, not a flaky test. Runs go
through the real command line on the built-in corpus (prepared once per module) with the tiny recipe.

Budget: the whole `pytest -m gpu` must fit in one 10-minute command on a lent GPU. Estimated, not yet measured, on
one H100: about 7 minutes (corpus preparation 15 s, once; an eager 20-24-step run 20-30 s with Python start-up and
five checkpoint evaluations; a compiled run 60-120 s with a cold inductor cache, much less with a warm one: inductor's
cache directory is shared by the processes). Every subprocess has its own time limit, EAGER_RUN_S or COMPILED_RUN_S,
so one hung run costs at most that and the rest still reports. The SIGKILL test cannot race on a fast card: the run
waits at a named point (inside its 13th update, after step 12 was logged) until the test kills it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")]

EAGER_RUN_S = 120  # one subprocess run of the tiny recipe without compilation (estimated 20-30 s on an H100)
COMPILED_RUN_S = 240  # one compiled run (estimated 60-120 s with a cold inductor cache)
SMALL = ["--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32",
         "--set", "train.log_every_steps=1"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    return dict(os.environ, TINYELECTRA_CACHE=str(tmp_path_factory.mktemp("cache")), PYTHONUNBUFFERED="1")


def run_cli(args: list[str], env: dict, timeout: float = EAGER_RUN_S) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-4000:]}"
    return p


def step_losses(run: Path) -> dict[int, tuple[float, float]]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: (r["gen_loss"], r["disc_loss"]) for r in recs if "event" not in r}


@pytest.mark.parametrize("precision,compile_setting", [("bf16", "auto"), ("fp16", "off"), ("fp32", "off")])
@pytest.mark.cli
def test_twenty_steps_per_precision(env, tmp_path, precision, compile_setting):
    """20 steps on the GPU: finite losses every step, the precision and device recorded, the compiled run labelled
    compiled (not a silent fallback), and the attention kernel named."""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    run = tmp_path / "run"
    run_cli(["train", "--recipe", "tiny", "--budget", "20steps", "--gpu", "0", *SMALL, "--set",
             f"train.precision={precision}",
             "--set", f"train.compile={compile_setting}", "--out", str(run)], env,
            timeout=COMPILED_RUN_S if compile_setting != "off" else EAGER_RUN_S)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["precision"] == precision
    assert 0 < summary["peak_gpu_memory_gib"] < 78 and summary["median_tokens_per_second"] > 0
    sync = summary["host_sync_per_step"]
    assert ("loss scaler" in (sync or "")) == (precision == "fp16"), sync
    assert summary["device"] == torch.cuda.get_device_name(0)
    losses = step_losses(run)
    assert sorted(losses) == list(range(1, 21))
    assert all(math.isfinite(x) for pair in losses.values() for x in pair), losses
    rt = summary["runtime"]
    if compile_setting == "auto":
        assert rt["compile"].startswith("compile: torch.compile (inductor"), rt["compile"]
    assert "unknown" not in rt["attention"] and "CPU" not in rt["attention"], rt["attention"]


# the real command line, waiting inside its 13th optimizer update (step 12 logged, step 13 not) to be killed
WAIT_IN_UPDATE_13 = """
import os, sys, time
from pathlib import Path
import tinyelectra.train as t
real_update, calls = t.Engine.update, [0]
def update(self):
    real_update(self)
    calls[0] += 1
    if calls[0] == 13:
        Path(os.environ["WAITING_MARKER"]).write_text("waiting")
        time.sleep(600)  # the test kills it here
t.Engine.update = update
from tinyelectra.cli import main
sys.argv = ["tinyelectra"] + sys.argv[1:]
main()
"""


@pytest.mark.cli
def test_cuda_resume_is_exact_with_deterministic_mode(env, tmp_path):
    """train.deterministic=true on the GPU (cuBLAS's fixed workspace set before any GPU work, deterministic
    kernels): a run killed with SIGKILL mid-way (inside its 13th update, where it waits however fast the card) and
    resumed gives the uninterrupted run's per-step losses and bit-identical weights."""
    from safetensors.torch import load_file

    args = ["train", "--recipe", "tiny", "--budget", "24steps", "--gpu", "0", *SMALL, "--set",
            "train.deterministic=true",
            "--set", "train.compile=off", "--set", "train.resume_every_seconds=0.01"]
    ref = tmp_path / "ref"
    run_cli([*args, "--out", str(ref)], env)
    run, marker = tmp_path / "killed", tmp_path / "waiting"
    p = subprocess.Popen([sys.executable, "-c", WAIT_IN_UPDATE_13, *args, "--out", str(run)],
                         env=dict(env, WAITING_MARKER=str(marker)), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + EAGER_RUN_S
        while not marker.exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)  # polling a point the run waits at: no race
        assert marker.exists(), f"the run never reached its 13th update (exit {p.poll()})"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert p.returncode == -signal.SIGKILL and max(step_losses(run)) == 12
    run_cli([*args, "--out", str(run), "--resume"], env)
    assert step_losses(run) == step_losses(ref)
    for name in ("ckpt-0625", "ckpt-10000"):
        for part in ("discriminator", "generator"):
            a = load_file(str(ref / name / f"{part}.safetensors"))
            b = load_file(str(run / name / f"{part}.safetensors"))
            assert all(torch.equal(a[k], b[k]) for k in a), f"{name}/{part} differs"


@pytest.mark.cli
def test_cuda_graphs_mode_trains_like_the_compiled_mode(env, tmp_path):
    """train.compile=reduce-overhead (CUDA graphs, graph-safe update) against train.compile=on over 10 steps from
    the same seed: the same losses up to the update's float rounding (a direct paper-Adam formula instead of the
    fused kernel), both labelled compiled."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    out = {}
    for mode in ("on", "reduce-overhead"):
        run = tmp_path / mode
        run_cli(["train", "--recipe", "tiny", "--budget", "10steps", "--gpu", "0", *SMALL, "--set",
                 "train.precision=bf16",
                 "--set", f"train.compile={mode}", "--out", str(run)], env, timeout=COMPILED_RUN_S)
        out[mode] = (step_losses(run), json.loads((run / "summary.json").read_text())["runtime"]["compile"])
    note = out["reduce-overhead"][1]
    assert "CUDA graphs" in note and "failed" not in note, note
    assert "graph-safe" in out["reduce-overhead"][1] and "failed" not in out["on"][1]
    a, b = out["on"][0], out["reduce-overhead"][0]
    assert a.keys() == b.keys() == set(range(1, 11))
    assert a[1] == pytest.approx(b[1], rel=1e-3)  # before any update: the same forward
    for s in a:
        assert a[s][0] == pytest.approx(b[s][0], rel=2e-2) and a[s][1] == pytest.approx(b[s][1], rel=2e-2), (
            s, a[s], b[s])


@pytest.mark.parametrize("compile_setting", ["off", "on"])
def test_no_host_sync_inside_a_training_step(compile_setting):
    """The trainer's step (benchmarks/throughput.py's TrainerStep: masking, forward, backward, clip, paper Adam), bf16,
    after warm-up, under torch.cuda.set_sync_debug_mode("error"): no synchronisation with the host (the loop
    synchronises only on log steps)."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    from benchmarks.throughput import Batches, TrainerStep

    from tinyelectra.config import load_recipe

    recipe = load_recipe("tiny", ["model.num_layers=2", "train.batch_size=8", f"train.compile={compile_setting}",
                                  "train.precision=bf16"])
    device = torch.device("cuda", 0)
    step = TrainerStep(recipe, device, "bf16", Batches(None, recipe.model.vocab_size, 8, 128, device))
    step.first_call()
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert math.isfinite(float(step.last_loss))


def test_the_whole_step_graph_trains_like_the_same_step_uncaptured():
    """train.compile=regional-graph (tinyelectra's own capture of the whole step, forward, backward and the flat update,
    as one CUDA graph per batch kind: step.CapturedStep) against train.compile=regional (the same regional compile
    and flat update, run step by step), 10 steps of batches with and without padding from the same weights and
    per-step seeds, bf16: both kinds captured once, the same losses to bf16 rounding (the replays draw their random
    numbers from the step's seed as the uncaptured step does), and no host synchronisation inside a replayed step."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    from benchmarks.throughput import Batches, TrainerStep

    from tinyelectra.config import load_recipe

    device, losses, steps = torch.device("cuda", 0), {}, {}
    for mode in ("regional", "regional-graph"):
        recipe = load_recipe("tiny", ["model.num_layers=2", "train.batch_size=8", f"train.compile={mode}",
                                      "train.update=flat", "train.precision=bf16"])
        step = steps[mode] = TrainerStep(recipe, device, "bf16", Batches(None, recipe.model.vocab_size, 8, 128, device,
                                                                          padding="alternate"))
        step.first_call()
        losses[mode] = [float(step.last_loss)]
        for _ in range(9):
            step()
            losses[mode].append(float(step.last_loss))
        assert "failed" not in step.compile_note, step.compile_note
    captured = steps["regional-graph"].engine.captured
    assert captured is not None and set(captured.graphs) == {False, True}
    a, b = losses["regional"], losses["regional-graph"]
    assert a[0] == pytest.approx(b[0], rel=1e-3)
    assert all(x == pytest.approx(y, rel=2e-2) for x, y in zip(a, b)), (a, b)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            steps["regional-graph"]()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert math.isfinite(float(steps["regional-graph"].last_loss)) and len(captured.graphs) == 2


def test_cudnn_attention_probe_leaves_finite_masked_gradients():
    """Fine-tuning's set-up runs runtime.guard_cudnn_sdpa once: after it, whatever it decided, a padding-masked bf16
    forward + backward of SDPA at length 192 (length mod 128 = 64: the lengths of torch 2.11's cuDNN regression on
    Hopper) through the default kernel choice has finite gradients. The note names what was switched off, if
    anything."""
    import torch.nn.functional as F

    from tinyelectra import runtime

    device = torch.device("cuda", 0)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        note = runtime.guard_cudnn_sdpa(device)
        assert note == "" or "cuDNN attention off" in note
        assert torch.backends.cuda.cudnn_sdp_enabled() == (before and note == "")
        q, k, v = (torch.randn(2, 4, 192, 64, device=device, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        mask = torch.ones(2, 1, 1, 192, dtype=torch.bool, device=device)
        mask[1, ..., 150:] = False
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float().sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v)), note
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP placement needs two GPUs")
@pytest.mark.cli
def test_ddp_puts_each_process_on_its_own_gpu(env, tmp_path):
    """torchrun --nproc_per_node 2 without --gpu (the README's form): NCCL refuses two processes on one GPU, so a
    run that finishes used cuda:0 and cuda:1; its losses match one process accumulating the same global batch."""
    common = ["--recipe", "tiny", "--budget", "6steps", *SMALL, "--set", "train.compile=off", "--set",
              "train.precision=fp32"]
    one = tmp_path / "one"
    run_cli(["train", *common, "--gpu", "0", "--set", "train.micro_batch_size=4", "--out", str(one)], env)
    two = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(29500 + os.getpid() % 1000), "-m", "tinyelectra", "train", *common, "--out", str(two)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=2 * EAGER_RUN_S)
    assert p.returncode == 0, p.stderr[-4000:]
    a, b = step_losses(one), step_losses(two)
    assert a.keys() == b.keys() == set(range(1, 7))
    for s in a:
        assert a[s][0] == pytest.approx(b[s][0], rel=1e-4) and a[s][1] == pytest.approx(b[s][1], rel=1e-4), (
            s, a[s], b[s])
