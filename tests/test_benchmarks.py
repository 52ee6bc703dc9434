"""The benchmark plumbing (benchmarks/common.py) and the CPU paths of step_cpu.py / throughput.py / memory.py on a
tiny configuration: statistics against hand-computed values, the transformers baseline wired as described (shared
embeddings, tied head, same parameter count as tinyelectra), and result files that name device, commit, command."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import common
from tinyelectra.config import ModelConfig, load_recipe
from tinyelectra.model import Electra, count_parameters

TINY_ARGS = ["--recipe", "tiny", "--batch", "4", "--seq-len", "32", "--rounds", "2", "--warmup", "1"]


def test_summarize_and_paired_ratio_by_hand():
    s = common.summarize([3.0, 1.0, 2.0, 4.0])
    assert s["median_s"] == 2.5 and s["min_s"] == 1.0 and s["n"] == 4
    r = common.paired_ratio([4.0, 9.0, 2.0], [2.0, 3.0, 2.0])  # per-round 2, 3, 1
    assert r["median_of_round_ratios"] == 2.0
    assert r["ratio_of_medians"] == 4.0 / 2.0


def test_alternate_flips_the_order_every_round():
    calls: list[str] = []
    times = common.alternate({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             warmup=1, repeats=3, device=torch.device("cpu"))
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then A B, B A, A B
    assert len(times["a"]) == len(times["b"]) == 3


def test_synthetic_batches_look_like_the_builder():
    ids, types, mask = common.synthetic_batches(1000 + 50, 8, 32, count=1, seed=3)[0]
    assert (ids[:, 0] == 101).all()
    assert ((ids == 102).sum(1) == 2).all()  # [CLS] A [SEP] B [SEP]
    assert torch.equal(mask, ids != 0)
    assert ((types == 1) <= mask).all()


def test_hf_baseline_wiring_matches_tinyelectra_parameters():
    cfg = load_recipe("tiny").model
    setup = common.StepSetup(cfg, load_recipe("tiny").objective, load_recipe("tiny").optim, torch.device("cpu"))
    hf = common.HFStep(setup)
    assert hf.gen.electra.embeddings is hf.disc.electra.embeddings
    assert hf.gen.generator_lm_head.weight is hf.disc.electra.embeddings.word_embeddings.weight
    hf_count = sum(p.numel() for p in {id(p): p for m in (hf.gen, hf.disc) for p in m.parameters()}.values())
    assert hf_count == count_parameters(Electra(cfg))
    assert sum(p.numel() for p in hf.params) == hf_count  # the optimizer sees every parameter once


@pytest.mark.slow
def test_hf_baseline_step_trains():
    recipe = load_recipe("tiny")
    cfg = ModelConfig(**{**recipe.model.__dict__, "dropout": 0.0, "attention_dropout": 0.0})
    setup = common.StepSetup(cfg, recipe.objective, recipe.optim, torch.device("cpu"))
    hf = common.HFStep(setup)
    before = hf.disc.electra.embeddings.word_embeddings.weight.detach().clone()
    ids, types, mask = common.synthetic_batches(cfg.vocab_size, 4, 32, count=1)[0]
    hf(ids, types, mask)
    assert not torch.equal(before, hf.disc.electra.embeddings.word_embeddings.weight)


@pytest.mark.slow
def test_step_cpu_writes_a_complete_result(tmp_path):
    from benchmarks import step_cpu

    out = step_cpu.main([*TINY_ARGS, "--out-dir", str(tmp_path), "--name", "t"])
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["precision"] == "fp32" and doc["device"] == "cpu"
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["torch"] == torch.__version__
    assert len(doc["git_commit"]) >= 40
    assert doc["command"] == "python -m benchmarks.step_cpu " + " ".join([*TINY_ARGS, "--out-dir", str(tmp_path),
                                                                         "--name", "t"])
    te, hf = doc["tinyelectra"], doc["transformers"]
    assert te["tokens_per_s"] == pytest.approx(4 * 32 / te["median_s"])
    assert doc["speedup"]["ratio_of_medians"] == pytest.approx(hf["median_s"] / te["median_s"])
    assert doc["meets_target"] == (doc["speedup"]["median_of_round_ratios"] >= 1.8)
    assert out["tokens_per_step"] == 128


@pytest.mark.slow
def test_throughput_cpu_path(tmp_path):
    from benchmarks import throughput

    doc = throughput.main([*TINY_ARGS, "--device", "cpu", "--no-memory", "--out-dir", str(tmp_path), "--name", "t"])
    assert doc["device"] == "cpu" and doc["precision"] == "fp32"
    assert "hardware_mfu" not in doc["tinyelectra"]  # no peak FLOP/s for a CPU
    assert doc["tinyelectra"]["tokens_per_s"] == pytest.approx(4 * 32 / doc["tinyelectra"]["median_s"])
    assert json.loads((tmp_path / "t.json").read_text())["speedup"] == doc["speedup"]
    # CPU peak memory: a fresh process builds one side and runs 3 steps
    mem = throughput.cpu_memory([*TINY_ARGS, "--device", "cpu"], "tinyelectra")
    assert "error" not in mem, mem
    n_params = count_parameters(Electra(load_recipe("tiny").model))
    # training holds at least fp32 weights, gradients and Adam's two moments: 16 bytes per parameter
    assert mem["peak_rss_bytes"] - mem["rss_after_import_bytes"] >= 16 * n_params


def test_throughput_rejects_a_directory_that_is_not_prepared_data(tmp_path):
    from benchmarks import throughput

    from tinyelectra.errors import UserError

    with pytest.raises(UserError):
        throughput.main([*TINY_ARGS, "--device", "cpu", "--data", str(tmp_path), "--no-memory", "--out-dir",
                         str(tmp_path)])


def test_tensor_memory_counts_live_storages_by_hand():
    from benchmarks import memory

    base = torch.zeros(1000)  # 4,000 bytes of "weights"
    with memory.TensorMemory([base]) as tm:
        a = torch.ones(256, 1024)  # 1 MiB
        b = a * 2  # 2 MiB live
        v = b.view(-1)  # a view: no new storage
        del a  # 1 MiB live
        c = torch.ones(512, 1024)  # 3 MiB live: the peak
        del b, v, c
    assert tm.baseline_bytes == 4000
    assert tm.peak_bytes == 4000 + 3 * 2**20
    assert tm.current_bytes == 4000


def test_card_table_by_hand():
    from benchmarks import memory

    gib = memory.GIB
    points = [(1.0 * gib, 0.5 * gib), (2.0 * gib, 0.0)]  # peak(m) = max(1 + 0.5 m, 2) GiB
    t = memory.card_table(points, batch=32, reserve_gib=0.8)
    # 8 GiB: 1 + 0.5 m <= 7.2 -> m <= 12.4 -> the largest divisor of 32 not above it: 8, so 4 accumulation steps
    assert t["8GiB"] == {"fits": True, "max_micro_batch": 8, "accumulation_steps": 4}
    assert t["24GiB"]["max_micro_batch"] == 32 and t["24GiB"]["accumulation_steps"] == 1  # m <= 44 -> 32
    assert memory.card_table([(7.5 * gib, 0.0)], 32, 0.8)["8GiB"]["fits"] is False
    assert memory.peak_at(points, 1) == 2.0 * gib and memory.peak_at(points, 4) == 3.0 * gib


def test_affine_envelope_by_hand():
    from benchmarks import memory

    # micro-batch 1: weights 100 B, an activation of 10 B, a temporary of 5 B; the activation is freed last
    a = {"micro_batch": 1, "events": [("+", 0, 100), ("+", 1, 10), ("+", 2, 5), ("-", 2, 0), ("-", 1, 0)]}
    b = {"micro_batch": 2, "events": [("+", 0, 100), ("+", 1, 20), ("+", 2, 10), ("-", 1, 0), ("-", 2, 0)]}
    points = memory.affine_envelope(a, b)  # frees in another order: same peaks
    assert points == [(100, 0), (100, 10), (100, 15)]
    assert memory.peak_at(points, 4) == 160
    c = {"micro_batch": 2, "events": [("+", 0, 100), ("+", 1, 20), ("-", 1, 0), ("+", 2, 10)]}
    with pytest.raises(RuntimeError):
        memory.affine_envelope(a, c)


@pytest.mark.slow
def test_memory_cpu_path_on_tiny(tmp_path):
    """The affine model of two measured micro-batches predicts a third, measured one."""
    from benchmarks import memory

    doc = memory.main(["--sizes", "tiny", "--precisions", "fp32", "--out-dir", str(tmp_path), "--name", "m"])
    rows = doc["sizes"]["tiny"]["configurations"]
    off, on = rows
    assert off["grad_checkpointing"] is False and on["grad_checkpointing"] is True
    for row in rows:
        assert abs(row["validation"]["relative_error"]) < 0.01, row["validation"]
    paper = "adam (paper, fp32 state)"
    assert on["cards"][paper]["peak_at_recipe_batch_gib"] < off["cards"][paper]["peak_at_recipe_batch_gib"]
    assert off["cards"]["adamw8bit"]["peak_at_recipe_batch_gib"] < off["cards"][paper]["peak_at_recipe_batch_gib"]
    m1, m2 = off["measurements"]
    assert m2["peak_bytes"] > m1["peak_bytes"] > m1["static_bytes"]
    # weights + optimizer state: fp32 params, exp_avg, exp_avg_sq (12 bytes per parameter) at least
    assert m1["static_bytes"] >= 12 * doc["sizes"]["tiny"]["parameters"]
    assert (tmp_path / "m.json").is_file()


# ----------------------------------------------------------------------------------------------------------------
# checkpoint_eval.py and disc_context.py: the CPU paths at a toy scale
# ----------------------------------------------------------------------------------------------------------------

import os  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> Path:
    """A prepared toy corpus (WordPiece of 256 entries, rows of 64 tokens) of 60 made-up words."""
    from tinyelectra.prepare import prepare

    root = tmp_path_factory.mktemp("toy-data")
    rng = random.Random(0)
    words = [a + b for a in ("ka", "lo", "mi", "nu", "pe", "ro")
             for b in ("ba", "de", "fi", "go", "ku", "la", "mo", "ne", "pi", "ru")]
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(6, 16))) + " ."
                      for _ in range(rng.randint(4, 12)))
            for _ in range(300)]
    (root / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    prepare(sources=[str(root / "corpus.txt")], out_dir=root / "data", vocab_size=256, seq_len=64, workers=1,
            validation_fraction=0.05)
    return root / "data"


@pytest.fixture()
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.cli
@pytest.mark.slow
def test_checkpoint_eval_scores_what_the_trainer_scored(toy_data, tmp_path, restore_threads):
    """benchmarks/lab/checkpoint_eval.py loads each saved checkpoint and scores the same held-out rows: its numbers
    equal the ones the trainer recorded in meta.json while the weights were live (fixed masks and samples), and it adds
    the context AUC, which older runs lack."""
    from benchmarks.lab import checkpoint_eval

    from tinyelectra.data import PretrainData

    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "tinyelectra", "train", "--recipe", "tiny", "--data", str(toy_data),
                        "--budget", "16steps", "--device", "cpu", "--out", str(run), "--set", "train.seq_len=64",
                        "--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TINYELECTRA_CACHE=str(tmp_path / "c")))
    assert p.returncode == 0, p.stderr[-2000:]
    rows = checkpoint_eval.score_run(run, PretrainData(toy_data), rows=32, micro=8)
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows) and len(rows) == 5
    for r in rows:
        recorded = json.loads((run / r["checkpoint"] / "meta.json").read_text())["eval"]
        for key in ("disc_acc", "baseline_acc", "disc_auc", "gen_acc", "unigram_acc", "disc_loss", "gen_loss"):
            assert r[key] == pytest.approx(recorded[key], rel=1e-5, abs=1e-6), key
        assert 0.0 <= r["disc_auc_context"] <= 1.0
    md = checkpoint_eval.markdown("t", rows)
    assert md.count("\n| ckpt-") == 5 and "context AUC" in md


@pytest.mark.slow
def test_disc_context_trains_both_implementations_on_the_same_rows(toy_data, tmp_path):
    """benchmarks/lab/disc_context.py on a toy corpus: tinyelectra's discriminator and transformers'
    ElectraForPreTraining each train in their own process and are scored on the same corrupted held-out rows (same token
    count, same all-original prior at every evaluation); the result names both and the ratio of their AUC gains, by
    hand."""
    from benchmarks.lab import disc_context

    disc_context.main(["--data", str(toy_data), "--recipe", "tiny", "--set", "model.num_layers=1",
                       "--set", "model.vocab_size=256", "--steps", "2", "--eval-every", "1", "--batch-size", "4",
                       "--name", "dc", "--out-dir", str(tmp_path)])
    r = json.loads((tmp_path / "dc.json").read_text())
    te, hf = r["evals"]["tinyelectra"], r["evals"]["transformers"]
    assert [e["step"] for e in te] == [e["step"] for e in hf] == [0, 1, 2]
    for a, b in zip(te, hf):
        assert a["tokens"] == b["tokens"] > 0 and a["prior"] == b["prior"] and 0.5 < a["prior"] < 1
        assert 0.0 <= a["auc"] <= 1.0 and 0.0 <= b["auc"] <= 1.0 and 0.0 <= a["auc_matched"] <= 1.0
    assert r["final_auc_difference_tinyelectra_minus_transformers"] == pytest.approx(
        te[-1]["auc"] - hf[-1]["auc"], abs=1e-4)
    assert disc_context.auc_gain_ratio(0.6, 0.7) == pytest.approx(0.5)
    assert disc_context.auc_gain_ratio(0.6, 0.505) is None
    assert r["machine"]["cpu"] and r["command"].startswith("python -m benchmarks.lab.disc_context")
    table = [line for line in (tmp_path / "dc.md").read_text().splitlines() if line.startswith("| 2 |")]
    assert table == [f"| 2 | {te[2]['auc_matched']:.4f} | {hf[2]['auc_matched']:.4f} | {te[2]['auc']:.4f} | "
                     f"{hf[2]['auc']:.4f} | {te[2]['acc_minus_prior']:+.4f} | {hf[2]['acc_minus_prior']:+.4f} |"]


# ----------------------------------------------------------------------------------------------------------------
# loss_check.py (the parity check) and the memory and batch helpers of throughput.py
# ----------------------------------------------------------------------------------------------------------------


def test_loss_check_verdict_by_hand():
    from benchmarks import loss_check

    eager = [40.0, 36.0, 30.0]
    same = loss_check.verdict(eager, [40.0, 36.0, 30.0], None)
    assert same["ok"] and same["max_rel_loss_difference"] == 0.0 and same["limit"] == loss_check.FLOOR
    assert same["eager_loss_movement"] == pytest.approx(0.25)
    off = loss_check.verdict(eager, [40.0, 36.0, 30.3], None)  # 1% at step 3
    assert not off["ok"] and off["worst_step"] == 3 and "differ from eager's by 0.01 (relative, step 3)" in off["line"]
    # bf16: the limit follows the fp32 reference (0.5% off at step 2): 2 x 0.005 + FLOOR
    ref = [40.0, 36.18, 30.0]
    within = loss_check.verdict(eager, [40.0, 36.0, 30.24], ref)
    assert within["limit"] == pytest.approx(2 * 0.005 + loss_check.FLOOR) and within["ok"]
    assert not loss_check.verdict(eager, [40.0, 36.0, 30.4], ref)["ok"]
    flat = loss_check.verdict([40.0, 40.0, 40.0], [40.0, 40.0, 40.0], None)
    assert not flat["ok"] and flat["line"].startswith("inconclusive")
    assert not loss_check.verdict(eager, [40.0, float("nan"), 30.0], None)["ok"]


def test_dropout_verdict_by_hand():
    """The statistical check with dropout on (loss_check.dropout_verdict) on drawn samples: equal distributions pass,
    and fail at most at the rate Z = 4 allows (200 seeded trials of 32 per side: none expected, at most 1 allowed);
    a compiled side whose losses repeat (a graph replaying frozen random numbers), a shifted mean (dropout unscaled
    or at another rate) and a tripled spread fail, each with its line; eager losses that do not vary are inconclusive;
    a NaN fails."""
    from benchmarks import loss_check

    g = torch.Generator().manual_seed(0)

    def draw(mean=3.0, sd=0.02, k=32):
        return (mean + sd * torch.randn(k, generator=g, dtype=torch.float64)).tolist()

    false_alarms = sum(not loss_check.dropout_verdict(draw(), draw())["ok"] for _ in range(200))
    assert false_alarms <= 1, false_alarms
    eager = draw()
    ok = loss_check.dropout_verdict(eager, draw())
    assert ok["ok"] and ok["compiled_distinct_losses"] == 32 and ok["repeats"] == 32
    assert ok["mean_limit"] == pytest.approx(4 * math.sqrt((ok["eager_sd"] ** 2 + ok["compiled_sd"] ** 2) / 32)
                                             + loss_check.FLOOR * abs(ok["eager_mean"]))
    frozen = loss_check.dropout_verdict(eager, [3.01] * 32)
    assert not frozen["ok"] and "repeat (1 distinct of 32 seeds)" in frozen["line"]
    shifted = loss_check.dropout_verdict(eager, draw(mean=3.03))
    assert not shifted["ok"] and "mean loss" in shifted["line"]
    wide = loss_check.dropout_verdict(eager, draw(sd=0.06))
    assert not wide["ok"] and "spread differently" in wide["line"]
    assert loss_check.dropout_verdict([3.0] * 32, draw())["line"].startswith("inconclusive")
    assert not loss_check.dropout_verdict(eager, [math.nan] + draw(k=31))["ok"]
    # bf16: the rounding allowance follows the fp32 reference's mean difference from eager
    ref = [x + 0.001 for x in eager]
    assert loss_check.dropout_verdict(eager, draw(), ref)["rounding_allowance"] == pytest.approx(
        2 * 0.001 + loss_check.FLOOR * abs(sum(eager) / 32), rel=1e-6)


@pytest.mark.slow
def test_loss_check_with_dropout_on_passes_and_catches_frozen_random_numbers(tmp_path, monkeypatch, capsys,
                                                                             restore_threads):
    """--dropout recipe on the CPU (dynamo's aot_eager backend): the compiled step with the recipe's dropout passes the
    statistical check; the same with the compiled side's random numbers frozen (every step run with one seed, as a
    CUDA graph replaying the masks it was recorded with would) fails, exit code 1, one line."""
    from benchmarks import loss_check

    from tinyelectra import step as step_mod

    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "aot_eager")
    args = [*LOSS_CHECK[:-2], "--dropout", "recipe", "--repeats", "8", "--out-dir", str(tmp_path)]
    doc = loss_check.main([*args, "--name", "ok"])
    assert doc["ok"] and doc["dropout"] == "recipe" and doc["compiled_distinct_losses"] == 8, doc["why"]
    assert doc["eager_sd"] > 0 and not doc["inductor_fallback_random"]
    capsys.readouterr()
    real = step_mod.train_step

    def frozen(engine, masked, seeds, *rest):
        return real(engine, masked, [0] if engine.compiles else seeds, *rest)

    monkeypatch.setattr(step_mod, "train_step", frozen)
    with pytest.raises(SystemExit) as e:
        loss_check.main([*args, "--name", "frozen"])
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "losses repeat (1 distinct of 8 seeds)" in err[0], err


LOSS_CHECK = ["--device", "cpu", "--recipe", "tiny", "--set", "model.num_layers=1", "--batch", "4", "--seq-len", "32",
              "--threads", "1", "--compile", "reduce-overhead", "--steps", "6"]


@pytest.mark.slow
def test_loss_check_passes_the_real_step_and_fails_a_lost_update(tmp_path, monkeypatch, capsys, restore_threads):
    """benchmarks/loss_check.py with dynamo's aot_eager backend on the CPU (the operators eager runs, so the compiled
    side must match to float rounding): the trainer's compiled step passes (exit 0, JSON); the same with every
    second update of the compiled side lost (as a graph replaying stale memory would) fails with exit code 1 and
    one line naming the difference and the limit."""
    from benchmarks import loss_check

    from tinyelectra import optim

    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "aot_eager")
    doc = loss_check.main([*LOSS_CHECK, "--out-dir", str(tmp_path), "--name", "ok"])
    assert doc["ok"] and doc["compile_mode"] == "reduce-overhead" and doc["max_rel_loss_difference"] < 1e-5
    assert doc["eager_loss_movement"] > 0.05 and len(doc["losses"]["compiled"]) == 6
    assert "graph-safe" in doc["compile_note"]["compiled"]
    assert doc["compile_note"]["eager"] == "compile: off as requested"
    assert json.loads((tmp_path / "ok.json").read_text())["ok"] is True
    capsys.readouterr()

    real_call, calls = optim.GraphSafeUpdate.__call__, [0]

    def lose_every_second(self):
        calls[0] += 1
        if calls[0] % 2:
            return real_call(self)
        self.optimizer.zero_grad(set_to_none=True)

    monkeypatch.setattr(optim.GraphSafeUpdate, "__call__", lose_every_second)
    with pytest.raises(SystemExit) as e:
        loss_check.main([*LOSS_CHECK, "--out-dir", str(tmp_path), "--name", "lost"])
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("loss check failed: the compiled step's losses differ from eager's"), err
    assert json.loads((tmp_path / "lost.json").read_text())["ok"] is False


def test_held_memory_figures_by_hand():
    assert common.held_figures((100, 50, 1000), (400, 120, 1500)) == {
        "peak_reserved_bytes": 300, "peak_allocated_bytes": 70, "device_used_bytes_at_end": 500}
    held = common.HeldMemory(torch.device("cpu"))
    with held:
        pass
    assert held.figures == {"peak_reserved_bytes": None, "peak_allocated_bytes": None, "device_used_bytes_at_end": None}


def test_synthetic_batches_padding_modes():
    full = [mask.all(1) for _, _, mask in common.synthetic_batches(2000, 64, 32, count=4, seed=1, padding="none")]
    assert all(f.all() for f in full)
    alt = [mask.all(1) for _, _, mask in common.synthetic_batches(2000, 64, 32, count=4, seed=1, padding="alternate")]
    assert [bool(f.all()) for f in alt] == [False, True, False, True]
    builder = torch.cat([m.all(1) for _, _, m in common.synthetic_batches(2000, 64, 32, count=20, seed=1)])
    assert 0.0 < 1 - builder.float().mean() < 0.1  # about 5% short rows, as the official builder


def test_throughput_batches_carry_their_full_rows():
    from benchmarks import throughput

    b = throughput.Batches(None, 2000, 8, 32, torch.device("cpu"), padding="alternate")
    first, second = b.batch(), b.batch()
    assert not first.all_full() and second.all_full()
    assert np.array_equal(first.full_rows, first.attention_mask.all(1).numpy())
    ids, types, mask = b()
    assert ids.shape == (8, 32) and mask.dtype == torch.bool


@pytest.mark.gpu_check
def test_step_checks_fit_the_deadline_by_hand():
    from benchmarks.gpu_check import step_checks

    assert step_checks.plan(540, 0, 300) == 300
    assert step_checks.plan(540, 400, 300) == 140  # cut to what is left
    assert step_checks.plan(540, 490, 300) is None  # under a minute left: skipped
    assert [c[0] for c in step_checks.CHECKS][:2] == ["parity", "both"]  # the parity check first: fail-fast


def test_unpadded_share_by_hand():
    from benchmarks import unpadded_batches

    full = np.array([True] * 6 + [False] * 2)  # 8 rows, 2 padded
    assert unpadded_batches.unpadded_share(full, 8) == 0.0
    assert unpadded_batches.unpadded_share(np.ones(8, dtype=bool), 4) == 1.0
    # batches of 2 from a shuffle: P(both full) = 6/8 * 5/7 = 15/28, over 50 epochs of 4 batches each
    assert abs(unpadded_batches.unpadded_share(full, 2) - 15 / 28) < 0.08


# ----------------------------------------------------------------------------------------------------------------
# ab.py (issue 33's A/B command) and the kernel classes of throughput.py


def test_kernel_classes_read_the_issues_table_from_kernel_names():
    """The names issue 33's H100 table cites (and names as cuBLAS, cuDNN and inductor print them) land in its classes;
    the split-K reduces are counted apart inside GEMM; an unknown name is "other"."""
    from benchmarks import throughput

    rows = [("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 3, 1.0, "GEMM"),
            ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", 2, 0.5, "GEMM"),
            ("triton_per_fused_add_native_dropout_native_layer_norm_3", 4, 0.4, "layer norm + residual + dropout"),
            ("triton_poi_fused_gelu_backward_sum_5", 1, 0.3, "GELU"),
            ("triton_red_fused__log_softmax_argmax_rand_7", 1, 0.6, "sampling, masking + losses"),
            ("triton_poi_fused_stack_12", 286, 0.3, "optimizer: norm, clip, Adam"),
            ("triton_poi_fused__to_copy_4", 307, 0.46, "casts and copies"),
            ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
             1, 0.2, "attention"),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 5, 0.1, "other")]
    classes = throughput.kernel_classes([{"name": n, "calls_per_step": c, "ms_per_step": ms} for n, c, ms, _ in rows])
    for name, _, _, label in rows:
        one = {"name": name, "calls_per_step": 1, "ms_per_step": 1.0}
        assert list(throughput.kernel_classes([one])) == [label], name
    assert classes["GEMM"] == {"kernels_per_step": 5, "ms_per_step": 1.5, "split_k_reduce_kernels_per_step": 2,
                               "split_k_reduce_ms_per_step": 0.5}
    assert classes["optimizer: norm, clip, Adam"]["kernels_per_step"] == 286
    assert classes["other"]["kernels_per_step"] == 5


def test_ab_plan_rounds_and_ratios_by_hand():
    from benchmarks import ab

    from tinyelectra.errors import UserError

    args = ab.parser().parse_args(["--variants", "regional", "--variant", "fused=model.dropout=0.0,train.update=flat"])
    assert ab.plan(args) == {"default": [], "regional": ab.VARIANTS["regional"],
                             "fused": ["model.dropout=0.0", "train.update=flat"]}
    with pytest.raises(UserError, match="unknown variant 'nope'"):
        ab.plan(ab.parser().parse_args(["--variants", "nope"]))
    with pytest.raises(UserError, match="write NAME=SET"):
        ab.plan(ab.parser().parse_args(["--variant", "bare"]))
    assert [ab.rotated(["a", "b", "c"], r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    r = ab.ratios({"default": [2.0, 4.0, 2.0], "x": [1.0, 3.0, 3.0]})
    assert r["default"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert r["x"] == {"median": 0.75, "min": 0.5, "max": 1.5}  # per round 0.5, 0.75, 1.5
    slices = ab.core_slices(3, 2)  # this machine's cores, however many
    assert len(slices) == 5 and all(len(s) >= 1 for s in slices) and all(len(s) == 1 for s in slices[3:])
    # the lease's card: 16 cores, 7 compiling children, 2 eager references
    slices = ab.core_slices(7, 2, cores=list(range(16)))
    assert slices[0] == [2, 3, 4, 5, 6, 7, 8]  # the default: half of the 14 spare cores
    assert all(len(s) == 2 for s in slices[1:7]) and {c for s in slices[1:7] for c in s} == set(range(9, 16))
    assert slices[7:] == [[0], [1]]
    assert ab.core_slices(1, 0, cores=[0, 1, 2]) == [[0, 1, 2]]
    assert ab.core_slices(2, 2, cores=[0, 1]) == [[0], [1], [0], [1]]  # too few: shared
    assert set(ab.LEASE_VARIANTS) <= set(ab.VARIANTS) and ab.VARIANTS["rg-varlen"] == [
        "train.compile=regional-graph", "train.update=flat", "train.attention=varlen"]


def test_ab_waits_for_builds_a_bounded_time_and_keeps_the_others(monkeypatch):
    """ab.builds: the children that answer are kept; one whose child failed and one still compiling when the time
    runs out are named with their reasons, so that a lease's command measures the rest (fake children: no clock but
    the wait itself)."""
    from benchmarks import ab

    class Fake:
        def __init__(self, name, answer):
            self.name, self.answer = name, answer

        def read_later(self, answers):
            if self.answer is not None:  # None: still compiling, never answers
                answers.put((self.name, self.answer))

    children = {"default": Fake("default", {"built": {"note": "ok"}}),
                "broken": Fake("broken", RuntimeError("broken: the child ended (exit 2): error: no")),
                "slow": Fake("slow", None)}
    built, failed = ab.builds(children, 0.2)
    assert built == {"default": {"note": "ok"}}
    assert failed == {"broken": "broken: the child ended (exit 2): error: no",
                      "slow": "not built within 0 s: still compiling when the rest of the time was needed"}
    assert ab.ratios({"x": [1.0]}) == {}  # no default measured: no ratios, not an error


@pytest.mark.slow
def test_ab_cpu_smoke_runs_every_part(tmp_path):
    """`benchmarks/ab.py --cpu-smoke` (toy size, dynamo's aot_eager backend), the default against the whole-step
    graph's variant (regional compile, the flat update, the static step): every part measured for both (cold and
    cached compile, losses against the eager step, paired timing, kernel table), the default's time ratio to itself
    exactly 1, one JSON naming the device, commit and command. A third variant whose child fails as it builds
    (DeepSpeed with the flat update: a valid recipe, refused by the step) is dropped with its reason and takes nothing
    else down."""
    from benchmarks import ab

    doc = ab.main(["--cpu-smoke", "--variants", "default,regional-graph", "--variant",
                   "broken=train.strategy=deepspeed,train.update=flat",
                   "--out-dir", str(tmp_path), "--name", "t"])
    assert not doc["complete"] and doc["device"] == "cpu"
    assert [s.split(": ")[:2] for s in doc["skipped"]] == [["broken", "build"]], doc["skipped"]
    assert "train.update=flat is for train.strategy=ddp" in doc["variants"]["broken"]["failed"]
    assert "step" not in doc["variants"]["broken"]
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["command"].startswith("python -m benchmarks.ab --cpu-smoke") and saved["machine"]["cores"] >= 1
    for name in ("default", "regional-graph"):
        v = doc["variants"][name]
        assert v["losses"]["ok"] and len(v["losses"]["samples"]) == ab.SMOKE["repeats"], v["losses"]
        assert v["step"]["rounds"] == ab.SMOKE["rounds"] and v["step"]["ms_median"] > 0
        assert v["kernels"]["classes"] and v["cold"]["mode"] and "cached" in v
    assert doc["variants"]["default"]["step"]["time_vs_default"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    graph = doc["variants"]["regional-graph"]
    # 7 graphs: a Block per width (discriminator, generator) with and without the attention mask, embeddings, 2 heads
    assert graph["cold"]["split"]["graphs"] == 7 and graph["cached"]["seconds"] > 0
    assert "the whole step as one static function" in graph["note"]


def test_quickstart_benchmark_times_the_readmes_command(tmp_path):
    """benchmarks/quickstart.py runs the README's quick start as written (read from the README, not a copy that can
    drift), only its run folder moved."""
    import re
    import shlex

    from benchmarks import ROOT, quickstart

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```bash\n(.*?)```", readme, flags=re.DOTALL).group(1)
    args = quickstart.readme_command()
    assert first_block.strip().endswith(".venv/bin/tinyelectra " + shlex.join(args))
    moved = quickstart.with_out(args, tmp_path / "r")
    assert moved[moved.index("--out") + 1] == str(tmp_path / "r")
    assert [a for a in moved if a != str(tmp_path / "r")] == [a for a in args if a != "runs/quickstart"]
