"""The GPU suite's logic, checked on the CPU: its labels read from recorded H100 profiles and logs
(tests/fixtures/gpu/, sources cited there), MFU against the datasheet and against the measured matrix-product peak,
the plan's arithmetic, the GLUE protocol comparison, every GPU stage's command accepted by the program it runs (the
paths the CPU smoke run cannot take), and the pack's round trip. benchmarks/ scripts are imported as modules."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

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
            "compiled": {**common, "compile": "on", "tinyelectra": side("compiled_bf16", 2.0e6, peak_memory_bytes=1.25 * 2**30)},
            "cudagraphs": {**common, "compile": "reduce-overhead", "tinyelectra": side(
                "cudagraphs_skipped", 1.9e6, cuda_graphs={"label": throughput.cuda_graphs_label(0.0, reasons)})}}
    for name, doc in docs.items():
        (d / f"{name}.json").write_text(json.dumps(doc))
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
    assert "transformers compiled" in doc["unmeasured"]


# ----------------------------------------------------------------------------------------------------------------
# The plan and the clock
# ----------------------------------------------------------------------------------------------------------------


def test_gpu_plan_fits_the_deadline_and_pretrain_gets_the_rest():
    plan = suite.gpu_plan()
    assert plan["total_s"] == suite.DEADLINE_S["gpu"] == 570
    # by hand: unpack 20 + env 45 + checks 45 + eager 60 + compiled 150 + glue 90 = 410 fixed, 20 for the summary
    assert plan["stages"]["pretrain"] == 570 - 20 - 410 == plan["pretrain_stage_s"]
    assert plan["pretrain_train_s"] == 140 - suite.PRETRAIN_OVERHEAD_S
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


# ----------------------------------------------------------------------------------------------------------------
# The GPU commands, checked against the programs they run (the smoke run takes the CPU's branches)
# ----------------------------------------------------------------------------------------------------------------


def gpu_run(tmp_path: Path, compiled: bool, checkpoints: list[str]) -> suite.Run:
    (tmp_path / "out").mkdir()
    run = suite.Run("gpu", tmp_path / "lease", tmp_path / "out", tmp_path / "w")
    (run.pack / "pretrain").mkdir(parents=True)
    (run.pack / "pretrain" / "manifest.json").write_text("{}")
    (run.pack / "pack.json").write_text(json.dumps({"glue": {"tasks": {"cola": {}, "sst2": {}, "rte": {}}}}))
    (run.stage_dir / "compiled.json").write_text(json.dumps({"tinyelectra": {
        "compiled": compiled, "compile_note": "compile: torch.compile (inductor, fullgraph)" if compiled else
        "compile: failed in the first forward + backward (BackendCompilerFailed: ...); running eager"}}))
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
    g = suite.glue_figures(d, baseline, {"pretrain": {"tokenizer_fingerprint": "tok"}})
    assert g["checkpoint"] == "ckpt-10000" and g["tasks"]["cola"] == {"metric": "matthews_corr", "pre-trained": 20.0,
                                                                       "ckpt-0625": 5.0, "no pre-training": 10.0}
    assert g["averages"] == {"pre-trained": 20.0, "ckpt-0625": 5.0, "no pre-training": 10.0}
    assert g["pretrained_better_on"] == "1 of 1 tasks" and g["protocol_differences_from_baseline"] == []


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
