"""The benchmark plumbing (benchmarks/common.py) and the CPU paths of step_cpu.py / throughput.py / memory.py on a
tiny configuration: statistics against hand-computed values, the transformers baseline wired as described (shared
embeddings, tied head, same parameter count as tinyelectra), and result files that name device, commit, command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402

from tinyelectra.config import ModelConfig, load_recipe  # noqa: E402
from tinyelectra.model import Electra, count_parameters  # noqa: E402

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


def test_hf_baseline_step_trains():
    recipe = load_recipe("tiny")
    cfg = ModelConfig(**{**recipe.model.__dict__, "dropout": 0.0, "attention_dropout": 0.0})
    setup = common.StepSetup(cfg, recipe.objective, recipe.optim, torch.device("cpu"))
    hf = common.HFStep(setup)
    before = hf.disc.electra.embeddings.word_embeddings.weight.detach().clone()
    ids, types, mask = common.synthetic_batches(cfg.vocab_size, 4, 32, count=1)[0]
    hf(ids, types, mask)
    assert not torch.equal(before, hf.disc.electra.embeddings.word_embeddings.weight)


def test_step_cpu_writes_a_complete_result(tmp_path):
    import step_cpu

    out = step_cpu.main([*TINY_ARGS, "--out-dir", str(tmp_path), "--name", "t"])
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["precision"] == "fp32" and doc["device"] == "cpu"
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["torch"] == torch.__version__
    assert len(doc["git_commit"]) >= 40
    assert doc["command"] == "python benchmarks/step_cpu.py " + " ".join([*TINY_ARGS, "--out-dir", str(tmp_path), "--name", "t"])
    te, hf = doc["tinyelectra"], doc["transformers"]
    assert te["tokens_per_s"] == pytest.approx(4 * 32 / te["median_s"])
    assert doc["speedup"]["ratio_of_medians"] == pytest.approx(hf["median_s"] / te["median_s"])
    assert doc["meets_target"] == (doc["speedup"]["median_of_round_ratios"] >= 1.8)
    assert out["tokens_per_step"] == 128


@pytest.mark.slow
def test_throughput_cpu_path(tmp_path):
    import throughput

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
    import throughput

    from tinyelectra.errors import UserError

    with pytest.raises(UserError):
        throughput.main([*TINY_ARGS, "--device", "cpu", "--data", str(tmp_path), "--no-memory", "--out-dir", str(tmp_path)])


def test_tensor_memory_counts_live_storages_by_hand():
    import memory

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
    import memory

    gib = memory.GIB
    points = [(1.0 * gib, 0.5 * gib), (2.0 * gib, 0.0)]  # peak(m) = max(1 + 0.5 m, 2) GiB
    t = memory.card_table(points, batch=32, reserve_gib=0.8)
    # 8 GiB: 1 + 0.5 m <= 7.2 -> m <= 12.4 -> the largest divisor of 32 not above it: 8, so 4 accumulation steps
    assert t["8GiB"] == {"fits": True, "max_micro_batch": 8, "accumulation_steps": 4}
    assert t["24GiB"]["max_micro_batch"] == 32 and t["24GiB"]["accumulation_steps"] == 1  # m <= 44 -> 32
    assert memory.card_table([(7.5 * gib, 0.0)], 32, 0.8)["8GiB"]["fits"] is False
    assert memory.peak_at(points, 1) == 2.0 * gib and memory.peak_at(points, 4) == 3.0 * gib


def test_affine_envelope_by_hand():
    import memory

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
    import memory

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
    words = [a + b for a in ("ka", "lo", "mi", "nu", "pe", "ro") for b in ("ba", "de", "fi", "go", "ku", "la", "mo", "ne", "pi", "ru")]
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(6, 16))) + " ." for _ in range(rng.randint(4, 12)))
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


def test_checkpoint_eval_scores_what_the_trainer_scored(toy_data, tmp_path, restore_threads):
    """benchmarks/checkpoint_eval.py loads each saved checkpoint and scores the same held-out rows: its numbers equal
    the ones the trainer recorded in meta.json while the weights were live (fixed masks and samples), and it adds
    the context AUC, which older runs lack."""
    import checkpoint_eval

    from tinyelectra.data import PretrainData

    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "tinyelectra", "train", "--recipe", "tiny", "--data", str(toy_data),
                        "--budget", "16steps", "--device", "cpu", "--out", str(run), "--set", "train.seq_len=64",
                        "--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, TINYELECTRA_CACHE=str(tmp_path / "c")))
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


def test_disc_context_trains_both_implementations_on_the_same_rows(toy_data, tmp_path):
    """benchmarks/disc_context.py on a toy corpus: tinyelectra's discriminator and transformers' ElectraForPreTraining
    each train in their own process and are scored on the same corrupted held-out rows (same token count, same
    all-original prior at every evaluation); the result names both and the ratio of their AUC gains, by hand."""
    import disc_context

    disc_context.main(["--data", str(toy_data), "--recipe", "tiny", "--set", "model.num_layers=1",
                       "--set", "model.vocab_size=256", "--steps", "2", "--eval-every", "1", "--batch-size", "4",
                       "--name", "dc", "--out-dir", str(tmp_path)])
    r = json.loads((tmp_path / "dc.json").read_text())
    te, hf = r["evals"]["tinyelectra"], r["evals"]["transformers"]
    assert [e["step"] for e in te] == [e["step"] for e in hf] == [0, 1, 2]
    for a, b in zip(te, hf):
        assert a["tokens"] == b["tokens"] > 0 and a["prior"] == b["prior"] and 0.5 < a["prior"] < 1
        assert 0.0 <= a["auc"] <= 1.0 and 0.0 <= b["auc"] <= 1.0 and 0.0 <= a["auc_matched"] <= 1.0
    assert r["final_auc_difference_tinyelectra_minus_transformers"] == pytest.approx(te[-1]["auc"] - hf[-1]["auc"], abs=1e-4)
    assert disc_context.auc_gain_ratio(0.6, 0.7) == pytest.approx(0.5) and disc_context.auc_gain_ratio(0.6, 0.505) is None
    assert r["machine"]["cpu"] and r["command"].startswith("python benchmarks/disc_context.py")
    table = [line for line in (tmp_path / "dc.md").read_text().splitlines() if line.startswith("| 2 |")]
    assert table == [f"| 2 | {te[2]['auc_matched']:.4f} | {hf[2]['auc_matched']:.4f} | {te[2]['auc']:.4f} | {hf[2]['auc']:.4f} | "
                     f"{te[2]['acc_minus_prior']:+.4f} | {hf[2]['acc_minus_prior']:+.4f} |"]


# ----------------------------------------------------------------------------------------------------------------
# loss_check.py (the parity check) and the memory and batch helpers of throughput.py
# ----------------------------------------------------------------------------------------------------------------


def test_loss_check_verdict_by_hand():
    import loss_check

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


LOSS_CHECK = ["--device", "cpu", "--recipe", "tiny", "--set", "model.num_layers=1", "--batch", "4", "--seq-len", "32",
              "--threads", "1", "--compile", "reduce-overhead", "--steps", "6"]


@pytest.mark.slow
def test_loss_check_passes_the_real_step_and_fails_a_lost_update(tmp_path, monkeypatch, capsys, restore_threads):
    """benchmarks/loss_check.py with dynamo's aot_eager backend on the CPU (the operators eager runs, so the compiled
    side must match to float rounding): the trainer's compiled step passes (exit 0, JSON); the same with every
    second update of the compiled side lost (as a graph replaying stale memory would) fails with exit code 1 and
    one line naming the difference and the limit."""
    import loss_check

    from tinyelectra import optim

    monkeypatch.setenv("TINYELECTRA_COMPILE_BACKEND", "aot_eager")
    doc = loss_check.main([*LOSS_CHECK, "--out-dir", str(tmp_path), "--name", "ok"])
    assert doc["ok"] and doc["compile_mode"] == "reduce-overhead" and doc["max_rel_loss_difference"] < 1e-5
    assert doc["eager_loss_movement"] > 0.05 and len(doc["losses"]["compiled"]) == 6
    assert "graph-safe" in doc["compile_note"]["compiled"] and doc["compile_note"]["eager"] == "compile: off as requested"
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
    import throughput

    b = throughput.Batches(None, 2000, 8, 32, torch.device("cpu"), padding="alternate")
    first, second = b.batch(), b.batch()
    assert not first.all_full() and second.all_full()
    assert np.array_equal(first.full_rows, first.attention_mask.all(1).numpy())
    ids, types, mask = b()
    assert ids.shape == (8, 32) and mask.dtype == torch.bool


def test_step_checks_fit_the_deadline_by_hand():
    import step_checks

    assert step_checks.plan(540, 0, 300) == 300
    assert step_checks.plan(540, 400, 300) == 140  # cut to what is left
    assert step_checks.plan(540, 490, 300) is None  # under a minute left: skipped
    assert [c[0] for c in step_checks.CHECKS][:2] == ["parity", "both"]  # the parity check first: fail-fast


def test_unpadded_share_by_hand():
    import unpadded_batches

    full = np.array([True] * 6 + [False] * 2)  # 8 rows, 2 padded
    assert unpadded_batches.unpadded_share(full, 8) == 0.0
    assert unpadded_batches.unpadded_share(np.ones(8, dtype=bool), 4) == 1.0
    # batches of 2 from a shuffle: P(both full) = 6/8 * 5/7 = 15/28, over 50 epochs of 4 batches each
    assert abs(unpadded_batches.unpadded_share(full, 2) - 15 / 28) < 0.08


def test_quickstart_benchmark_times_the_readmes_command(tmp_path):
    """benchmarks/quickstart.py runs the README's quick start as written (read from the README, not a copy that can
    drift), only its run folder moved."""
    import re
    import shlex

    import quickstart

    readme = (BENCH.parent / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```bash\n(.*?)```", readme, flags=re.DOTALL).group(1)
    args = quickstart.readme_command()
    assert first_block.strip().endswith(".venv/bin/tinyelectra " + shlex.join(args))
    moved = quickstart.with_out(args, tmp_path / "r")
    assert moved[moved.index("--out") + 1] == str(tmp_path / "r")
    assert [a for a in moved if a != str(tmp_path / "r")] == [a for a in args if a != "runs/quickstart"]
