"""The benchmark plumbing (benchmarks/common.py) and the CPU paths of step_cpu.py / throughput.py / memory.py on a
tiny configuration: statistics against hand-computed values, the transformers baseline wired as described (shared
embeddings, tied head, same parameter count as tinyelectra), and result files that name device, commit, command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

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
# quality.py: the CPU paths at a toy scale
# ----------------------------------------------------------------------------------------------------------------

import os  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402

from tinyelectra.errors import UserError  # noqa: E402



@pytest.fixture(scope="module")
def quality_data(tmp_path_factory) -> Path:
    """A prepared toy corpus (WordPiece of 256 entries, rows of 64 tokens) made of the synthetic tasks' words."""
    import quality

    from tinyelectra.prepare import prepare

    root = tmp_path_factory.mktemp("quality-data")
    rng = random.Random(0)
    words = [*quality._FILLER, *quality._NOUNS, *(w for ws in quality._CUES.values() for w in ws)]
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


def quality_args(data: Path, tmp_path: Path) -> list[str]:
    return ["--preset", "tiny", "--steps", "12", "--data", str(data), "--recipe-set", "model.vocab_size=256",
            "--recipe-set", "train.seq_len=64", "--recipe-set", "model.num_layers=2", "--recipe-set", "train.batch_size=8",
            "--recipe-set", "train.eval_rows=32", "--synthetic-glue", "--seeds", "2", "--max-train-rows", "96",
            "--glue-set", "epochs=1", "--device", "cpu", "--threads", "1", "--work-dir", str(tmp_path / "w"),
            "--out-dir", str(tmp_path / "res"), "--name", "q"]


def test_quality_dry_run_is_the_papers_plan_and_writes_nothing(tmp_path, capsys):
    import quality

    doc = quality.main(["--dry-run", "--device", "cpu", "--data", "builtin", "--out-dir", str(tmp_path / "res"),
                        "--work-dir", str(tmp_path / "w")])
    e, m, mp, r = doc["electra"], doc["mlm"], doc["mlm-paper"], doc["random-init"]
    assert (e["recipe"], e["steps"], e["tokens"]) == ("electra-small", 62_500, 62_500 * 128 * 128)
    # the official flops_computation.py: 1.294e18 for ELECTRA-Small's 1M steps (generator hidden 64); 6.25% of it
    assert e["train_flops_paper"] == pytest.approx(1.294e18 / 16, rel=5e-4)
    # equal compute in each convention: the MLM's FLOPs never exceed ELECTRA's and fall short by less than one step
    assert e["train_flops_hardware"] - m["train_flops_hardware_per_step"] < m["train_flops_hardware"] <= e["train_flops_hardware"]
    assert e["train_flops_paper"] - mp["train_flops_paper_per_step"] < mp["train_flops_paper"] <= e["train_flops_paper"]
    assert (m["recipe"], m["objective"], m["matched_convention"]) == ("bert-small", "mlm", "hardware")
    assert (mp["recipe"], mp["objective"], mp["matched_convention"]) == ("bert-small", "mlm", "paper")
    # paper convention charges ELECTRA its dense embedding look-ups twice (two encoders): more MLM steps there
    assert mp["steps"] > m["steps"] > e["steps"]
    # the paper's BERT-Small: 1.45M steps for ELECTRA-Small's 1.4e18 FLOPs (gen. hidden 128: 1.424e18), within 1%
    assert mp["train_flops_paper_per_step"] * 1.45e6 == pytest.approx(1.424e18, rel=0.01)
    assert r["steps"] == 0 and r["train_flops_hardware"] == 0.0  # the control is not pre-trained
    assert doc["differences"] == ["the built-in smoke-test corpus (Python's documentation) instead of a Wikipedia-scale corpus"]
    assert not (tmp_path / "res").exists() and not (tmp_path / "w").exists()
    assert "62,500 steps" in capsys.readouterr().out


def test_quality_cpu_preset_plans_mini_at_equal_hardware_flops():
    import quality

    doc = quality.main(["--dry-run", "--device", "cpu", "--preset", "cpu", "--steps", "6000"])
    e, m = doc["electra"], doc["mlm"]
    assert e["recipe"] == m["recipe"] == "mini" and m["objective"] == "mlm"
    # by hand from the per-step costs: the most MLM steps whose hardware FLOPs fit in ELECTRA's
    assert m["steps"] == int(6000 * e["train_flops_hardware_per_step"] // m["train_flops_hardware_per_step"])


def test_quality_rejects_an_mlm_side_that_is_not_mlm_and_mismatched_data():
    import quality

    with pytest.raises(UserError, match="objective"):
        quality.main(["--dry-run", "--device", "cpu", "--mlm-recipe", "tiny"])  # tiny as it is: ELECTRA
    with pytest.raises(UserError, match="same data"):
        quality.main(["--dry-run", "--device", "cpu", "--electra-set", "train.seq_len=64"])


def test_synthetic_tasks_follow_their_rules(tmp_path):
    import quality

    assert quality.write_synthetic_glue(tmp_path, train_rows=50, dev_rows=10) == ["sst2", "rte"]
    rows = [r.split("\t") for r in (tmp_path / "SST-2" / "train.tsv").read_text().splitlines()[1:]]
    for words, label in rows:  # exactly one cue word, whose polarity is the label
        cues = [w for w in words.split() if w in quality._CUES[0] + quality._CUES[1]]
        assert len(cues) == 1 and (cues[0] in quality._CUES[1]) == (label == "1")
    rows = [r.split("\t") for r in (tmp_path / "RTE" / "dev.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 10 and {r[3] for r in rows} == {"entailment", "not_entailment"}
    for _, s1, s2, label in rows:
        (noun,) = [w for w in s2.split() if w in quality._NOUNS]
        assert (noun in s1.split()) == (label == "entailment")


@pytest.mark.slow
def test_quality_tiny_end_to_end_then_reused(quality_data, tmp_path, restore_threads):
    """Tiny ELECTRA, tiny MLMs at equal hardware and at equal paper FLOPs, and the untrained control, 2 synthetic
    tasks x 2 seeds: the result file agrees with what the trainer and `tinyelectra glue` wrote; running it again
    reuses every run and its fine-tuning."""
    import quality

    args = quality_args(quality_data, tmp_path)
    quality.main(args)
    doc = json.loads((tmp_path / "res" / "q.json").read_text())
    assert doc["complete"] is True and doc["experiment"]["is_paper_configuration"] is False
    assert "12 ELECTRA steps, not 62,500" in doc["experiment"]["differences"]
    assert doc["command"] == "python benchmarks/quality.py " + " ".join(args)
    assert doc["machine"]["cores"] >= 1 and len(doc["git_commit"]) >= 40 and doc["device"] == "cpu"
    assert len(doc["git_commit_at_start"]) >= 40  # the code that ran (others may commit while it runs)
    runs = doc["runs"]
    assert set(runs) == {"electra", "mlm", "mlm-paper", "random-init"}
    e, m, mp, r = runs["electra"], runs["mlm"], runs["mlm-paper"], runs["random-init"]
    for arm in (e, m, mp):
        summary = json.loads((Path(arm["run_dir"]) / "summary.json").read_text())
        pre = arm["pretraining"]
        assert pre["steps"] == summary["steps"] == arm["plan"]["steps"]
        assert pre["tokens_seen"] == summary["tokens_seen"] and 0 < pre["tokens_seen"] <= pre["steps"] * 8 * 64  # no padding
        assert pre["train_flops_paper"] == summary["train_flops_paper"]
        assert (Path(arm["run_dir"]) / "report.md").is_file()
        assert "verdict" in pre["held_out_eval_at_end"] and len(pre["held_out_eval_by_checkpoint"]) == 5
    assert e["pretraining"]["steps"] == 12 and m["plan"]["objective"] == "mlm"
    assert "disc_auc" in e["pretraining"]["held_out_eval_at_end"] and "unigram_acc" in m["pretraining"]["held_out_eval_at_end"]
    # equal compute, by hand from the per-step costs: each MLM runs the most steps that fit in ELECTRA's FLOPs
    e_hw, e_paper = 12 * e["plan"]["train_flops_hardware_per_step"], 12 * e["plan"]["train_flops_paper_per_step"]
    assert m["pretraining"]["steps"] == int(e_hw // m["plan"]["train_flops_hardware_per_step"])
    assert mp["pretraining"]["steps"] == int(e_paper // mp["plan"]["train_flops_paper_per_step"])
    assert m["pretraining"]["train_flops_hardware"] <= e_hw and mp["pretraining"]["train_flops_paper"] <= e_paper
    ratio = doc["experiment"]["equal_compute"]["mlm_over_electra"]
    assert ratio["mlm"]["hardware"] == pytest.approx(m["pretraining"]["train_flops_hardware"] / e_hw)
    assert ratio["mlm-paper"]["paper"] == pytest.approx(mp["pretraining"]["train_flops_paper"] / e_paper)
    # the control: the ELECTRA run's initial weights, never trained, fine-tuned the same way
    assert r["pretraining"]["steps"] == 0 and r["train"]["state_before"] == "fresh"
    init = load_file(str(Path(r["run_dir"]) / "ckpt-0" / "discriminator.safetensors"))
    trained = load_file(str(Path(e["run_dir"]) / "ckpt-10000" / "discriminator.safetensors"))
    assert init.keys() == trained.keys() and any(not torch.equal(init[k], trained[k]) for k in init)
    # GLUE: medians, spreads and averages recomputed from glue.json's per-seed scores
    averages, per_seed = {}, {}
    for label, arm in runs.items():
        g = json.loads(quality.glue_json_path(quality.Arm(label, "", [], run_dir=Path(arm["run_dir"]))).read_text())
        medians = {}
        for task in ("sst2", "rte"):
            seeds = [s["paper_score"] for s in g["tasks"][task]["seeds"]]
            assert len(seeds) == 2 and g["tasks"][task]["train_rows"] == 96
            assert arm["glue"]["tasks"][task]["median"] == pytest.approx(statistics.median(seeds))
            assert arm["glue"]["tasks"][task]["std"] == pytest.approx(statistics.stdev(seeds))
            medians[task] = statistics.median(seeds)
        averages[label] = statistics.fmean(medians.values())
        per_seed[label] = [statistics.fmean(g["tasks"][t]["seeds"][k]["paper_score"] for t in ("sst2", "rte")) for k in range(2)]
        assert arm["glue"]["average"] == pytest.approx(averages[label])
    for key, c in doc["comparisons"].items():
        a, b = key.split("_minus_")
        assert c["average_gap"] == pytest.approx(averages[a] - averages[b])
        diffs = [x - y for x in per_seed[a] for y in per_seed[b]]
        assert (c["per_seed_average_gap_min"], c["per_seed_average_gap_max"]) == pytest.approx((min(diffs), max(diffs)))
    assert set(doc["comparisons"]) == {"electra_minus_mlm", "electra_minus_mlm-paper", "electra_minus_random-init",
                                       "mlm_minus_random-init", "mlm-paper_minus_random-init"}
    assert doc["paper_reference"]["electra_small_6.25pct"]["glue_dev_8_tasks"] == 74.1
    assert doc["paper_reference"]["full_budget_gap"] == pytest.approx(79.9 - 75.1)
    md = (tmp_path / "res" / "q.md").read_text()
    assert "NOT the paper's 6.25% experiment" in md and "SYNTHETIC" in md and "no pre-training" in md
    for label in runs:
        assert f"{averages[label]:.1f}" in md

    again = quality.main(args)  # finished runs and tasks are reused, numbers unchanged
    assert all(again["runs"][a]["train_reused"]["state_before"] == "finished" for a in runs)
    assert again["runs"]["electra"]["glue"]["tasks"] == e["glue"]["tasks"]
    with pytest.raises(UserError, match="holds another run"):
        quality.main([*args, "--steps", "13"])


def test_checkpoint_eval_scores_what_the_trainer_scored(quality_data, tmp_path, restore_threads):
    """benchmarks/checkpoint_eval.py loads each saved checkpoint and scores the same held-out rows: its numbers equal
    the ones the trainer recorded in meta.json while the weights were live (fixed masks and samples), and it adds
    the context AUC, which older runs lack."""
    import checkpoint_eval

    from tinyelectra.data import PretrainData

    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "tinyelectra", "train", "--recipe", "tiny", "--data", str(quality_data),
                        "--budget", "16steps", "--device", "cpu", "--out", str(run), "--set", "train.seq_len=64",
                        "--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, TINYELECTRA_CACHE=str(tmp_path / "c")))
    assert p.returncode == 0, p.stderr[-2000:]
    rows = checkpoint_eval.score_run(run, PretrainData(quality_data), rows=32, micro=8)
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows) and len(rows) == 5
    for r in rows:
        recorded = json.loads((run / r["checkpoint"] / "meta.json").read_text())["eval"]
        for key in ("disc_acc", "baseline_acc", "disc_auc", "gen_acc", "unigram_acc", "disc_loss", "gen_loss"):
            assert r[key] == pytest.approx(recorded[key], rel=1e-5, abs=1e-6), key
        assert 0.0 <= r["disc_auc_context"] <= 1.0
    md = checkpoint_eval.markdown("t", rows)
    assert md.count("\n| ckpt-") == 5 and "context AUC" in md


def test_disc_context_trains_both_implementations_on_the_same_rows(quality_data, tmp_path):
    """benchmarks/disc_context.py on a toy corpus: tinyelectra's discriminator and transformers' ElectraForPreTraining
    each train in their own process and are scored on the same corrupted held-out rows (same token count, same
    all-original prior at every evaluation); the result names both and the ratio of their AUC gains, by hand."""
    import disc_context

    disc_context.main(["--data", str(quality_data), "--recipe", "tiny", "--set", "model.num_layers=1",
                       "--set", "model.vocab_size=256", "--steps", "2", "--eval-every", "1", "--batch-size", "4",
                       "--name", "dc", "--out-dir", str(tmp_path)])
    r = json.loads((tmp_path / "dc.json").read_text())
    te, hf = r["evals"]["tinyelectra"], r["evals"]["transformers"]
    assert [e["step"] for e in te] == [e["step"] for e in hf] == [0, 1, 2]
    for a, b in zip(te, hf):
        assert a["tokens"] == b["tokens"] > 0 and a["prior"] == b["prior"] and 0.5 < a["prior"] < 1
        assert 0.0 <= a["auc"] <= 1.0 and 0.0 <= b["auc"] <= 1.0
    assert r["final_auc_difference_tinyelectra_minus_transformers"] == pytest.approx(te[-1]["auc"] - hf[-1]["auc"], abs=1e-4)
    assert disc_context.auc_gain_ratio(0.6, 0.7) == pytest.approx(0.5) and disc_context.auc_gain_ratio(0.6, 0.505) is None
    assert r["machine"]["cpu"] and r["command"].startswith("python benchmarks/disc_context.py")
    table = [line for line in (tmp_path / "dc.md").read_text().splitlines() if line.startswith("| 2 |")]
    assert table == [f"| 2 | {te[2]['auc']:.4f} | {hf[2]['auc']:.4f} | {te[2]['acc_minus_prior']:+.4f} | "
                     f"{hf[2]['acc_minus_prior']:+.4f} |"]
