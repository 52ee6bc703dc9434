"""Tests of tinyelectra.glue (`tinyelectra glue`): a tiny checkpoint fine-tuned end to end on a slice of the real RTE
(JSON schema, dev/test row counts from ../shared/data/README.md, GLUE submission file), the same checkpoint exported
to transformers' format giving the same scores, learning on synthetic tasks that chance cannot pass (classification
and STS-B-style regression), the protocol's pieces against hand-computed values (layer-wise LR scales in the
paper's and the official code's forms, LR by model size, seed medians), dynamic padding equal to fixed padding,
reuse of finished tasks, and one-line errors for bad input.

The checkpoints are built here: an `Electra` of a miniature shape (2 layers, hidden 64) with a WordPiece trained on
a few KB of text, saved with `save_checkpoint` exactly as the trainer does. Weights are random: the tests check the
machinery and learning, not pre-training quality.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import random
import re
import socket
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
import torch


SHARED_DATA = Path(os.environ.get("TINYELECTRA_SHARED_DATA",
                                  Path(__file__).resolve().parents[1].parent / "shared" / "data"))
GLUE_DIR = SHARED_DATA / "glue"
needs_glue = pytest.mark.skipif(not (GLUE_DIR / "RTE" / "train.tsv").is_file(),
                                reason=f"real GLUE data not found at {GLUE_DIR} (set TINYELECTRA_SHARED_DATA)")

FILLER = ("the a of and to in is was it for on with as by at from this that movie film story plot actor scene "
          "music light water city road house").split()
POSITIVE = ("good", "great", "superb", "wonderful", "brilliant")
NEGATIVE = ("bad", "awful", "terrible", "boring", "dreadful")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on 2 cores shared with other jobs, torch's second spinning thread makes these small
    models several times slower. Results do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------------------------
# Builders (also used by test_report.py)
# ----------------------------------------------------------------------------------------------------------------


def sentiment_sentence(rng: random.Random, label: int) -> str:
    """Filler words and exactly one cue word whose polarity is the label."""
    words = [rng.choice(FILLER) for _ in range(rng.randint(3, 9))]
    words.insert(rng.randrange(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
    return " ".join(words)


def write_sst2_like(glue_dir: Path, train_rows: int, dev_rows: int, seed: int = 0) -> Path:
    """An SST-2-format folder (sentence<TAB>label, header) with a task a model must learn: the cue word decides."""
    rng = random.Random(seed)
    folder = glue_dir / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", train_rows), ("dev", dev_rows)):
        labels = [i % 2 for i in range(n)]
        rng.shuffle(labels)
        lines = ["sentence\tlabel"] + [f"{sentiment_sentence(rng, y)}\t{y}" for y in labels]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return glue_dir


def write_stsb_like(glue_dir: Path, train_rows: int, dev_rows: int, seed: int = 0) -> Path:
    """An STS-B-format folder whose score (0-5) is the number of positive cue words across the two sentences."""
    rng = random.Random(seed)
    folder = glue_dir / "STS-B"
    folder.mkdir(parents=True, exist_ok=True)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    for name, n in (("train", train_rows), ("dev", dev_rows)):
        lines = [header]
        for i in range(n):
            k = rng.randint(0, 5)
            cues = [rng.choice(POSITIVE) for _ in range(k)]
            split = rng.randint(0, k)
            a = [rng.choice(FILLER) for _ in range(rng.randint(2, 5))] + cues[:split]
            b = [rng.choice(FILLER) for _ in range(rng.randint(2, 5))] + cues[split:]
            rng.shuffle(a)
            rng.shuffle(b)
            lines.append(f"{i}\tmain\tx\t2012\t{i}\tnone\tnone\t{' '.join(a)}\t{' '.join(b)}\t{float(k):.3f}")
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return glue_dir


def tokenizer_texts() -> list[str]:
    rng = random.Random(1)
    texts = [sentiment_sentence(rng, i % 2) for i in range(600)]
    rte = GLUE_DIR / "RTE" / "train.tsv"
    if rte.is_file():  # real English as well, so RTE's words are in the vocabulary
        for line in rte.read_text(encoding="utf-8").splitlines()[1:400]:
            texts += line.split("\t")[1:3]
    return texts


def make_checkpoint(directory: Path, vocab_size: int = 400, seed: int = 0, fraction: float = 1.0, step: int = 100,
                    tokenizer=None) -> Path:
    """A tinyelectra checkpoint of a miniature ELECTRA (random weights) with its tokenizer, as the trainer saves it."""
    from tinyelectra.checkpoint import save_checkpoint
    from tinyelectra.config import load_recipe
    from tinyelectra.model import Electra
    from tinyelectra.tokenizer import Tokenizer

    tok = tokenizer or Tokenizer.train(tokenizer_texts(), vocab_size=vocab_size, lowercase=True)
    tok_dir = directory.parent / f".tok-{directory.name}"
    tok.save(tok_dir)
    recipe = load_recipe("tiny", [
        f"model.vocab_size={tok.vocab_size}", "model.embedding_size=32", "model.hidden_size=64",
        "model.num_layers=2", "model.num_heads=2", "model.ffn_size=128", "model.max_positions=128",
        "model.generator_fraction=0.5",
    ])
    torch.manual_seed(seed)
    model = Electra(recipe.model)
    meta = {"name": directory.name, "step": step, "fraction": fraction, "tokens_seen": step * 32 * 128,
            "train_flops_paper": step * 1.0e9, "train_flops_hardware": step * 0.6e9, "wall_seconds": step * 0.5,
            "precision": "fp32", "device": "test cpu", "budget": f"{step}steps", "recipe": "tiny-test"}
    return save_checkpoint(directory, model, recipe, meta, tok_dir)


def make_run(run_dir: Path, fractions=(0.5, 1.0)) -> Path:
    """A run directory with plan.json and fraction checkpoints (random weights, one shared tokenizer)."""
    from tinyelectra.budget import checkpoint_name
    from tinyelectra.tokenizer import Tokenizer

    run_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.train(tokenizer_texts(), vocab_size=400, lowercase=True)
    total = 200
    for i, f in enumerate(fractions):
        make_checkpoint(run_dir / checkpoint_name(f), seed=i, fraction=f, step=round(total * f), tokenizer=tok)
    (run_dir / "plan.json").write_text(json.dumps({"budget": f"{total}steps", "budget_kind": "steps",
                                                   "total_steps": total}), encoding="utf-8")
    return run_dir


def run_glue(checkpoint: Path, glue_dir: Path | None, out: Path, tasks: str, seeds: int = 1,
             max_train_rows: int | None = None, overrides: list[str] | None = None) -> list[Path]:
    from tinyelectra.glue import GlueSettings, glue_command

    return glue_command(GlueSettings(checkpoint=checkpoint, glue_dir=glue_dir, use_hf=False, tasks=tasks, seeds=seeds,
                                     out_dir=out, gpu=None, device="cpu", max_train_rows=max_train_rows,
                                     overrides=list(overrides or []), command="pytest"))


# ----------------------------------------------------------------------------------------------------------------
# End to end on real RTE, and through a transformers export
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt-10000")


@pytest.fixture(scope="module")
def rte_result(ckpt, tmp_path_factory) -> dict:
    if not (GLUE_DIR / "RTE" / "train.tsv").is_file():
        pytest.skip(f"real GLUE data not found at {GLUE_DIR} (set TINYELECTRA_SHARED_DATA)")
    out = tmp_path_factory.mktemp("rte-out")
    paths = run_glue(ckpt, GLUE_DIR, out, "rte", seeds=2, max_train_rows=48, overrides=["epochs=1"])
    assert paths == [out / "ckpt-10000" / "glue.json"]
    return json.loads(paths[0].read_text())


def test_checkpoint_meta_reads_train_seconds_and_the_older_wall_seconds(tmp_path):
    """Checkpoints written before the rename call the training seconds wall_seconds; glue.json says train_seconds."""
    from tinyelectra.glue import CheckpointRef, checkpoint_meta

    ref = CheckpointRef(path=tmp_path, name="ckpt-10000", kind="tinyelectra", run_dir=None)
    for key in ("train_seconds", "wall_seconds"):
        (tmp_path / "meta.json").write_text(json.dumps({"step": 5, key: 2.5, "other": 1}))
        assert checkpoint_meta(ref) == {"step": 5, "train_seconds": 2.5}


@needs_glue
@pytest.mark.slow
def test_rte_slice_end_to_end_schema(rte_result, ckpt):
    r = rte_result
    assert r["format"] == "tinyelectra-glue" and r["complete"] is True
    assert r["checkpoint"]["name"] == "ckpt-10000" and r["checkpoint"]["kind"] == "tinyelectra"
    assert r["meta"]["step"] == 100 and r["meta"]["fraction"] == 1.0 and r["meta"]["train_flops_paper"] == 1.0e11
    assert r["device"].startswith("CPU (") and r["device"].endswith(" threads)")
    assert r["precision"] == "fp32" and r["command"] == "pytest"
    assert r["seeds"] == [0, 1]
    p = r["protocol"]
    assert p["peak_lr"] == 3e-4 and p["layerwise"] == "intended" and p["layerwise_decay"] == 0.8
    assert p["epochs"] == {"rte": 1.0} and p["max_train_rows"] == 48 and p["settings"]["batch_size"] == 32
    t = r["tasks"]["rte"]
    assert t["paper_metric"] == "accuracy" and t["glue_metric"] == "accuracy"
    assert t["train_rows"] == 48 and t["steps_per_epoch"] == 2 and t["steps"] == 2  # ceil(48 / 32)
    assert len(t["seeds"]) == 2
    for s in t["seeds"]:
        assert set(s) >= {"seed", "paper_score", "glue_score", "metrics", "train_seconds", "eval_seconds", "steps"}
        assert 0.0 <= s["paper_score"] <= 100.0 and s["paper_score"] == s["metrics"]["accuracy"]
        assert s["train_seconds"] > 0
        # a dev accuracy on RTE's 277 dev rows is a multiple of 100/277
        assert abs(s["paper_score"] * 277 / 100 - round(s["paper_score"] * 277 / 100)) < 1e-6
    scores = [s["paper_score"] for s in t["seeds"]]
    assert t["median_paper"] == pytest.approx(statistics.median(scores))
    assert t["std_paper"] == pytest.approx(statistics.stdev(scores))
    assert r["averages"]["paper"] == {"score": t["median_paper"], "tasks": ["rte"], "label": "GLUE-1: rte"}
    # row counts published in ../shared/data/README.md
    assert r["data"]["rte"]["dev"]["rows"] == 277 and r["data"]["rte"]["train"]["rows_in_file"] == 2490
    # test predictions: RTE.tsv with 3000 rows, labels spelled as in the files, from the median seed
    sub = Path(t["test_predictions"]["files"][0])
    assert sub.name == "RTE.tsv"
    lines = sub.read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 3001
    assert {line.split("\t")[1] for line in lines[1:]} <= {"entailment", "not_entailment"}
    assert [line.split("\t")[0] for line in lines[1:4]] == ["0", "1", "2"]
    assert t["test_predictions"]["seed"] in (0, 1)


@needs_glue
@pytest.mark.slow
def test_transformers_export_fine_tunes_the_same_way(rte_result, ckpt, tmp_path):
    """`tinyelectra export` output (transformers format) gives the same weights, so seed 0 gives the same scores."""
    from tinyelectra.checkpoint import load_checkpoint
    from tinyelectra.hf import export

    model, recipe, meta = load_checkpoint(ckpt)
    export(model, recipe, meta, ckpt / "tokenizer", tmp_path / "export")
    paths = run_glue(tmp_path / "export", GLUE_DIR, tmp_path / "out", "rte", seeds=1, max_train_rows=48,
                     overrides=["epochs=1", "test_predictions=false"])
    r = json.loads(paths[0].read_text())
    assert r["checkpoint"]["kind"] == "transformers" and r["checkpoint"]["path"].endswith("discriminator")
    assert r["meta"] == {}
    ours = rte_result["tasks"]["rte"]["seeds"][0]
    theirs = r["tasks"]["rte"]["seeds"][0]
    assert theirs["seed"] == ours["seed"] == 0
    assert theirs["paper_score"] == pytest.approx(ours["paper_score"], abs=1e-9)
    assert theirs["final_loss"] == pytest.approx(ours["final_loss"], rel=1e-4)
    assert "test_predictions" not in r["tasks"]["rte"]


def test_mnli_scores_matched_and_mismatched_and_writes_mnli_and_ax_submissions(ckpt, tmp_path):
    """On the small MNLI/AX fixtures written in the real format (tests/fixtures/glue)."""
    fixtures = Path(__file__).resolve().parent / "fixtures" / "glue"
    paths = run_glue(ckpt, fixtures, tmp_path / "out", "mnli", seeds=3, overrides=["epochs=1"])
    r = json.loads(paths[0].read_text())
    t = r["tasks"]["mnli"]
    rows = lambda name: len((fixtures / name).read_text(encoding="utf-8").strip().splitlines()) - 1  # noqa: E731
    for s in t["seeds"]:
        assert set(s["splits"]) == {"dev_matched", "dev_mismatched"}
        assert s["splits"]["dev_matched"]["examples"] == rows("MNLI/dev_matched.tsv")
        assert s["splits"]["dev_mismatched"]["examples"] == rows("MNLI/dev_mismatched.tsv")
        assert s["paper_score"] == s["splits"]["dev_matched"]["paper_score"]  # the task's number is matched
    mism = [s["splits"]["dev_mismatched"]["paper_score"] for s in t["seeds"]]
    assert t["splits"]["dev_mismatched"]["median_paper"] == pytest.approx(statistics.median(mism))
    files = {Path(f).name: Path(f) for f in t["test_predictions"]["files"]}
    assert set(files) == {"MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"}
    for name, source in (("MNLI-m.tsv", "MNLI/test_matched.tsv"), ("MNLI-mm.tsv", "MNLI/test_mismatched.tsv"),
                         ("AX.tsv", "diagnostic/diagnostic.tsv")):
        lines = files[name].read_text().splitlines()
        assert len(lines) - 1 == rows(source)
        assert {line.split("\t")[1] for line in lines[1:]} <= {"entailment", "neutral", "contradiction"}


# ----------------------------------------------------------------------------------------------------------------
# It learns
# ----------------------------------------------------------------------------------------------------------------


def test_fine_tuning_learns_a_task_chance_cannot_pass(ckpt, tmp_path):
    """Balanced 2-class dev set of 200 rows: chance is 50%, P(>= 90% correct by luck) < 1e-30."""
    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=480, dev_rows=200)
    paths = run_glue(ckpt, glue_dir, tmp_path / "out", "sst2", seeds=1, overrides=["epochs=8"])
    t = json.loads(paths[0].read_text())["tasks"]["sst2"]
    # 8 epochs: from random weights, 3 epochs (45 steps) reached 90% with one tokenizer and 69.5% with another (the
    # fixture's vocabulary depends on whether ../shared's RTE text is there)
    assert t["steps"] == 120  # 8 epochs x 15 batches of 32
    assert t["median_paper"] >= 90.0, t
    assert t["seeds"][0]["final_loss"] < 0.5  # mean of the last 10 steps; ln 2 = 0.69 is the loss of knowing nothing


def test_regression_learns_with_swapped_pairs(ckpt, tmp_path):
    """STS-B-style: the 0-5 score counts cue words over both sentences; Spearman of an untrained head is ~0."""
    glue_dir = write_stsb_like(tmp_path / "glue", train_rows=300, dev_rows=150)
    paths = run_glue(ckpt, glue_dir, tmp_path / "out", "stsb", seeds=1, overrides=["epochs=6"])
    r = json.loads(paths[0].read_text())
    t = r["tasks"]["stsb"]
    assert t["train_rows"] == 600  # the swapped order added (official double_unordered)
    assert r["protocol"]["swapped_pairs"] == ["stsb"]
    assert t["paper_metric"] == "spearman" and t["glue_metric"] == "pearson_spearman_mean"
    m = t["seeds"][0]["metrics"]
    assert t["median_glue"] == pytest.approx((m["pearson"] + m["spearman"]) / 2)
    assert t["median_paper"] > 75.0, m  # about 93 with this seed and data


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU has no fast bf16")
def test_cpu_bf16_is_opt_in_and_still_learns(ckpt, tmp_path):
    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=480, dev_rows=200)
    paths = run_glue(ckpt, glue_dir, tmp_path / "out", "sst2", seeds=1, overrides=["epochs=3", "precision=bf16"])
    r = json.loads(paths[0].read_text())
    assert r["precision"] == "bf16" and "not the paper's fp32" in r["precision_reason"]
    assert r["tasks"]["sst2"]["median_paper"] >= 90.0


# ----------------------------------------------------------------------------------------------------------------
# Protocol pieces against hand-computed values
# ----------------------------------------------------------------------------------------------------------------


def test_lr_and_decay_by_model_size():
    from tinyelectra.finetune import FinetuneConfig, size_defaults

    assert size_defaults(256) == ("small", 3e-4, 0.8)  # the paper's fine-tuning appendix
    assert size_defaults(768) == ("base", 1e-4, 0.8)
    assert size_defaults(1024) == ("large", 5e-5, 0.9)
    fc = FinetuneConfig.from_overrides(["lr=2e-4", "layerwise=none"])
    assert fc.peak_lr(256) == 2e-4 and fc.decay(256) == 1.0
    assert FinetuneConfig().task_epochs("rte") == 10 and FinetuneConfig().task_epochs("stsb") == 10
    assert FinetuneConfig().task_epochs("cola") == 3 and FinetuneConfig(epochs=0.5).task_epochs("rte") == 0.5


def test_fine_tuning_set_is_trainings_grammar():
    """One --set grammar (issue 13): `finetune.key=value` as train's `section.key=value`, the section optional; the
    same errors for a wrong section, key or value as the recipe's --set."""
    from tinyelectra.config import load_recipe
    from tinyelectra.errors import UserError
    from tinyelectra.finetune import FinetuneConfig

    assert FinetuneConfig.from_overrides(["finetune.lr=2e-4", "batch_size=16", "finetune.batching = length"]) == \
        FinetuneConfig(lr=2e-4, batch_size=16, batching="length")
    for bad, says in [("optim.lr=1e-4", "unknown section 'optim' (sections: finetune)"),
                      ("finetune.learning_rate=1", "unknown key 'learning_rate' in [finetune]"),
                      ("finetune.batch_size=many", "'many' is not a valid int"), ("lr", "expected section.key=value")]:
        with pytest.raises(UserError, match=re.escape(says)):
            FinetuneConfig.from_overrides([bad])
    with pytest.raises(UserError, match=re.escape("unknown key 'learning_rate' in [optim]")):
        load_recipe("tiny", ["optim.learning_rate=1"])


def test_fine_tuning_settings_from_a_finetune_table(tmp_path):
    """`tinyelectra glue --config F.toml`: the [finetune] table of a file of its own or of a recipe TOML (which still
    loads as a recipe), --set on top; wrong keys, types and values are the same one-line errors."""
    from tinyelectra.config import load_recipe, recipe_toml
    from tinyelectra.errors import UserError
    from tinyelectra.finetune import FinetuneConfig

    own = tmp_path / "ft.toml"
    own.write_text('[finetune]\nlr = 2e-4\nbatching = "length"\nepochs = 2\n')
    assert FinetuneConfig.from_overrides([], own) == FinetuneConfig(lr=2e-4, batching="length", epochs=2.0)
    assert FinetuneConfig.from_overrides(["finetune.lr=1e-4"], own) == FinetuneConfig(
        lr=1e-4, batching="length", epochs=2.0)
    recipe = tmp_path / "with-finetune.toml"
    recipe.write_text(recipe_toml(load_recipe("tiny")) + '\n[finetune]\nlayerwise = "official"\n')
    assert load_recipe(str(recipe)).model == load_recipe("tiny").model
    assert FinetuneConfig.from_overrides([], recipe).layerwise == "official"
    for text, says in [("[finetune]\nlearning_rate = 1\n", "[finetune].learning_rate: unknown key"),
                       ("[finetune]\nbatch_size = \"many\"\n", "[finetune].batch_size: expected int"),
                       ("[finetune]\nlayerwise = \"sideways\"\n",
                        "finetune.layerwise: must be intended, official or none"),
                       ("[model]\nhidden_size = 1\n", "no [finetune] table"), ("lr = ", "not valid TOML")]:
        own.write_text(text)
        with pytest.raises(UserError, match=re.escape(says)):
            FinetuneConfig.from_overrides([], own)
    with pytest.raises(UserError, match="cannot be read"):
        FinetuneConfig.from_overrides([], tmp_path / "missing.toml")
    with pytest.raises(UserError, match=re.escape("'many' is not a valid int")):
        load_recipe("tiny", ["train.batch_size=many"])


@pytest.mark.parametrize("form, expected", [
    # 2 layers, decay 0.8. Intended: head depth 3 -> top layer 0.8, layer 0 0.64, embeddings 0.512.
    ("intended", {"head": 1.0, "layer.1": 0.8, "layer.0": 0.64, "embeddings": 0.512}),
    # Official code: head at depth L + 2 = 4 -> top layer 0.64, layer 0 0.512, embeddings 0.4096.
    ("official", {"head": 1.0, "layer.1": 0.64, "layer.0": 0.512, "embeddings": 0.4096}),
])
def test_layerwise_groups_give_each_parameter_its_depth_lr(form, expected):
    from tinyelectra.config import ModelConfig, OptimConfig
    from tinyelectra.finetune import FinetuneConfig, layerwise_groups
    from tinyelectra.model import Classifier
    from tinyelectra.optim import build_optimizer

    cfg = ModelConfig(vocab_size=300, embedding_size=32, hidden_size=64, num_layers=2, num_heads=2, ffn_size=128,
                      max_positions=64)
    model = Classifier(cfg, 2)
    fc = FinetuneConfig(layerwise=form)
    groups = layerwise_groups(model, fc)
    opt = build_optimizer(groups, OptimConfig(name="adam", lr=3e-4, weight_decay=0.0), "cpu")
    opt.set_lr(3e-4)
    owner = {}
    for g in opt.param_groups:
        assert g["weight_decay"] == 0.0
        for p in g["params"]:
            assert id(p) not in owner
            owner[id(p)] = g
    names = dict(model.named_parameters())
    assert set(owner) == {id(p) for p in names.values()}  # every parameter exactly once
    for name, p in names.items():
        want = expected["embeddings" if name.startswith(("embeddings.", "encoder.project.")) else
                        "head" if name.startswith("head.") else f"layer.{name.split('.')[2]}"]
        assert owner[id(p)]["paper_lr"] == pytest.approx(3e-4 * want), name


def test_weight_decay_groups_skip_layernorm_and_bias():
    from tinyelectra.config import ModelConfig
    from tinyelectra.finetune import FinetuneConfig, layerwise_groups
    from tinyelectra.model import Classifier

    cfg = ModelConfig(vocab_size=300, embedding_size=32, hidden_size=64, num_layers=2, num_heads=2, ffn_size=128,
                      max_positions=64)
    model = Classifier(cfg, 3)
    names = {id(p): n for n, p in model.named_parameters()}
    for g in layerwise_groups(model, FinetuneConfig(weight_decay=0.01)):
        for p in g["params"]:
            n = names[id(p)]
            skip = n.endswith("bias") or ".norm" in n
            assert g["weight_decay"] == (0.0 if skip else 0.01), n


def test_batches_random_as_numpy_permutations_and_length_grouped_with_less_padding():
    from tinyelectra.finetune import batch_indices

    n, bs = 1000, 32
    random_batches = list(batch_indices(n, bs, 64, seed=7))  # 2 epochs of ceil(1000 / 32) = 32 batches
    rng = np.random.default_rng(7)
    for epoch in range(2):
        order = rng.permutation(n)
        for b in range(32):
            assert np.array_equal(random_batches[epoch * 32 + b], order[b * bs:(b + 1) * bs])
    lengths = np.random.default_rng(0).integers(5, 129, size=n)
    grouped = list(batch_indices(n, bs, 64, seed=7, lengths=lengths))
    assert len(grouped) == 64 and all(len(b) <= bs for b in grouped)
    for epoch in range(2):  # every row once per epoch
        assert np.array_equal(np.sort(np.concatenate(grouped[epoch * 32:(epoch + 1) * 32])), np.arange(n))
    padded = lambda batches: sum(len(b) * int(lengths[b].max()) for b in batches)  # noqa: E731
    assert padded(grouped) < 0.75 * padded(random_batches)
    assert padded(grouped) >= int(lengths.sum()) * 2  # never below the real tokens (2 epochs)


def test_seed_summary_median_std_and_median_seed():
    from tinyelectra.glue import median_seed_index, summarize_task

    seeds = [{"paper_score": v, "glue_score": v + 1} for v in (60.0, 70.0, 65.0)]
    s = summarize_task("rte", seeds)
    assert s["median_paper"] == 65.0 and s["median_glue"] == 66.0
    assert s["std_paper"] == pytest.approx(5.0)  # sample std of 60, 65, 70
    assert median_seed_index([60.0, 70.0, 65.0]) == 2
    assert median_seed_index([4.0, 1.0, 3.0, 2.0]) == 3  # even count: the lower middle (2.0)
    assert summarize_task("cola", [{"paper_score": 50.0, "glue_score": 50.0}])["std_paper"] is None
    mnli = [{"paper_score": v, "glue_score": v,
             "splits": {"dev_mismatched": {"paper_score": v - 1, "glue_score": v - 1}}}
            for v in (80.0, 82.0, 81.0)]
    assert summarize_task("mnli", mnli)["splits"]["dev_mismatched"]["median_paper"] == 80.0


def test_averages_leave_wnli_out_and_name_their_tasks():
    from tinyelectra.glue import task_averages

    tasks = {t: {"median_paper": v, "median_glue": v + 2} for t, v in
             (("cola", 40.0), ("sst2", 80.0), ("mrpc", 75.0), ("stsb", 70.0), ("rte", 55.0), ("wnli", 10.0))}
    a = task_averages(tasks)
    assert a["paper"]["score"] == pytest.approx((40 + 80 + 75 + 70 + 55) / 5)
    assert a["paper"]["label"] == "GLUE-5: cola, mrpc, rte, sst2, stsb"
    assert a["glue"]["score"] == pytest.approx((40 + 80 + 75 + 70 + 55) / 5 + 2)
    assert set(a["excluded"]) == {"wnli"}


def test_dynamic_padding_equals_padding_to_128(ckpt):
    """Same [CLS] outputs whether a batch is padded to its longest row or to 128 tokens (eval mode, fp32)."""
    from tinyelectra.glue_data import encode_pairs
    from tinyelectra.hf import load_backbone
    from tinyelectra.model import Classifier
    from tinyelectra.tokenizer import Tokenizer

    bb = load_backbone(ckpt)
    tok = Tokenizer.load(bb.tokenizer_dir)
    rng = random.Random(3)
    a = [sentiment_sentence(rng, i % 2) for i in range(16)]
    b = [" ".join(rng.choice(FILLER) for _ in range(rng.randint(1, 20))) for _ in range(16)]
    enc = encode_pairs(tok, a, b, max_length=128)
    assert enc.lengths.max() < 64  # the comparison is meaningful: lots of padding at 128
    torch.manual_seed(0)
    model = Classifier(bb.config, 3)
    model.load_backbone(bb.embeddings, bb.encoder)
    model.eval()
    outs = []
    for pad_to in (None, 128):
        batch = enc.batch(np.arange(16), pad_to=pad_to)
        with torch.no_grad():
            outs.append(model(torch.from_numpy(batch.input_ids), torch.from_numpy(batch.token_type_ids),
                              torch.from_numpy(batch.attention_mask).bool()))
    assert outs[0].shape == outs[1].shape == (16, 3)
    assert (outs[0] - outs[1]).abs().max().item() < 1e-5


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints, tasks, reuse
# ----------------------------------------------------------------------------------------------------------------


@needs_glue
def test_all_means_the_tasks_with_train_and_dev_files():
    from tinyelectra.glue import choose_tasks

    chosen, skipped = choose_tasks("all", GLUE_DIR, use_hf=False)
    # ../shared/data/README.md: CoLA, SST-2, MRPC, STS-B, RTE and WNLI have train + dev; QNLI lacks train,
    # QQP has only dev.partial.tsv, MNLI is missing.
    assert chosen == ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"]
    assert set(skipped) == {"qqp", "mnli", "qnli"}
    assert "train.tsv" in skipped["qnli"] and "MNLI" in skipped["mnli"]


def test_run_directory_fine_tunes_every_checkpoint_and_reuses_finished_tasks(tmp_path, capsys):
    run = make_run(tmp_path / "run", fractions=(0.5, 1.0))
    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=40, dev_rows=20)
    paths = run_glue(run, glue_dir, None, "sst2", seeds=1, overrides=["epochs=1"])
    assert paths == [run / "glue" / "ckpt-5000" / "glue.json", run / "glue" / "ckpt-10000" / "glue.json"]
    first = [json.loads(p.read_text()) for p in paths]
    assert [r["meta"]["fraction"] for r in first] == [0.5, 1.0]
    assert [r["meta"]["step"] for r in first] == [100, 200]
    if importlib.util.find_spec("tensorboard") is not None:  # each checkpoint's score beside the pre-training curves
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(run / "tensorboard"))
        events.Reload()
        logged = sorted((e.step, round(e.value, 3)) for e in events.Scalars("glue/sst2"))  # one event file each
        assert logged == [(r["meta"]["step"], round(r["tasks"]["sst2"]["median_paper"], 3)) for r in first]
    capsys.readouterr()
    run_glue(run / "ckpt-10000", glue_dir, None, "sst2", seeds=1, overrides=["epochs=1"])  # default out: RUN/glue
    assert "reusing" in capsys.readouterr().out
    again = json.loads(paths[1].read_text())
    assert again["tasks"]["sst2"]["seeds"] == first[1]["tasks"]["sst2"]["seeds"]  # not retrained
    write_sst2_like(glue_dir, train_rows=40, dev_rows=20, seed=5)  # other rows: nothing to reuse
    run_glue(run / "ckpt-10000", glue_dir, None, "sst2", seeds=1, overrides=["epochs=1"])
    assert "reusing" not in capsys.readouterr().out
    run_glue(run / "ckpt-10000", glue_dir, None, "sst2", seeds=1, overrides=["epochs=1", "lr=1e-4"])
    changed = json.loads(paths[1].read_text())
    assert changed["protocol"]["peak_lr"] == 1e-4
    assert (changed["tasks"]["sst2"]["seeds"][0]["train_seconds"]
            != first[1]["tasks"]["sst2"]["seeds"][0]["train_seconds"])


def test_interrupted_glue_keeps_every_finished_seed(ckpt, tmp_path, monkeypatch, capsys):
    """SIGTERM while the third of three seeds fine-tunes: exit 143, the two finished seeds are in glue.json (with the
    test predictions they need), the message says what was kept; the same command again trains only the third seed
    and ends as one complete result."""
    import signal

    from tinyelectra import cli, glue

    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=24, dev_rows=12)
    (glue_dir / "SST-2" / "test.tsv").write_text("index\tsentence\n0\ta good film\n1\ta bad film\n", encoding="utf-8")
    out = tmp_path / "out"
    real, calls = glue.FinetuneJob, []

    def job(*args, **kwargs):
        calls.append(args[4])  # the seed
        if len(calls) == 3 and interrupt:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at once, mid-seed
        return real(*args, **kwargs)

    monkeypatch.setattr(glue, "FinetuneJob", job)
    argv = ["tinyelectra", "glue", "--checkpoint", str(ckpt), "--glue-dir", str(glue_dir), "--tasks", "sst2",
            "--seeds", "3", "--device", "cpu", "--out", str(out), "--set", "epochs=1"]
    monkeypatch.setattr(sys, "argv", argv)
    interrupt, handler = True, signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 143
    printed = capsys.readouterr()
    assert "kept 2 finished seed(s) of unfinished tasks" in printed.out and "interrupted (SIGTERM)" in printed.err
    partial = json.loads((out / "ckpt-10000" / "glue.json").read_text())
    assert [r["seed"] for r in partial["partial"]["sst2"]["seeds"]] == [0, 1] and "sst2" not in partial["tasks"]
    assert signal.getsignal(signal.SIGTERM) is handler  # the command line puts the process's handler back

    interrupt, calls[:] = False, []
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code in (0, None)
    assert calls == [2]  # only the unfinished seed is trained again
    done = json.loads((out / "ckpt-10000" / "glue.json").read_text())
    assert done["complete"] and "partial" not in done
    assert done["tasks"]["sst2"]["seeds"][:2] == partial["partial"]["sst2"]["seeds"]
    assert [r["seed"] for r in done["tasks"]["sst2"]["seeds"]] == [0, 1, 2]
    assert (out / "ckpt-10000" / "submission").is_dir() and not (out / "ckpt-10000" / "partial").exists()


# ----------------------------------------------------------------------------------------------------------------
# Bad input: one clear line each
# ----------------------------------------------------------------------------------------------------------------


def _cli_error(argv: list[str], capsys) -> str:
    from tinyelectra import cli

    old = sys.argv
    sys.argv = ["tinyelectra", *argv]
    try:
        with pytest.raises(SystemExit) as exc:
            cli.main()
    finally:
        sys.argv = old
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_missing_task_directory(ckpt, tmp_path, capsys):
    glue_dir = write_sst2_like(tmp_path / "glue", 8, 8)
    err = _cli_error(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(glue_dir), "--tasks", "rte",
                      "--device", "cpu", "--out", str(tmp_path / "o")], capsys)
    assert "RTE" in err and "glue_data" in err


def test_wrong_columns(ckpt, tmp_path, capsys):
    folder = tmp_path / "glue" / "RTE"
    folder.mkdir(parents=True)
    for name in ("train", "dev"):
        (folder / f"{name}.tsv").write_text("id\tpremise\thypothesis\tlabel\n0\ta\tb\tentailment\n")
    err = _cli_error(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(tmp_path / "glue"), "--tasks", "rte",
                      "--device", "cpu", "--out", str(tmp_path / "o")], capsys)
    assert "sentence1" in err and "missing" in err


def test_checkpoint_that_is_not_electra(tmp_path, capsys):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 128}))
    err = _cli_error(["glue", "--checkpoint", str(bert), "--glue-dir", str(tmp_path), "--device", "cpu"], capsys)
    assert "not ELECTRA" in err and "bert" in err
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    err = _cli_error(["glue", "--checkpoint", str(junk), "--glue-dir", str(tmp_path), "--device", "cpu"], capsys)
    assert "not a run directory" in err


def test_tokenizer_that_does_not_match_the_checkpoint(ckpt, tmp_path, capsys):
    import shutil

    from tinyelectra.tokenizer import Tokenizer

    bad = tmp_path / "ckpt-10000"
    shutil.copytree(ckpt, bad)
    shutil.rmtree(bad / "tokenizer")
    Tokenizer.train(tokenizer_texts(), vocab_size=300, lowercase=True).save(bad / "tokenizer")
    glue_dir = write_sst2_like(tmp_path / "glue", 8, 8)
    err = _cli_error(["glue", "--checkpoint", str(bad), "--glue-dir", str(glue_dir), "--tasks", "sst2",
                      "--device", "cpu", "--out", str(tmp_path / "o")], capsys)
    assert "300" in err and "400" in err and "mismatch" in err


def test_glue_data_source_is_required_and_set_keys_are_checked(ckpt, tmp_path, capsys):
    err = _cli_error(["glue", "--checkpoint", str(ckpt), "--device", "cpu"], capsys)
    assert "--glue-dir" in err and "--hf" in err
    err = _cli_error(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(tmp_path), "--device", "cpu",
                      "--set", "learning_rate=1"], capsys)
    assert "learning_rate" in err and "lr" in err
    err = _cli_error(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(tmp_path), "--device", "cpu",
                      "--set", "layerwise=sideways"], capsys)
    assert "intended, official or none" in err
    err = _cli_error(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(tmp_path), "--device", "cpu",
                      "--config", str(tmp_path / "nope.toml")], capsys)
    assert "nope.toml: cannot be read" in err


# ----------------------------------------------------------------------------------------------------------------
# Fixed shapes (length buckets, a filled last batch), CUDA-graph-ready steps, several jobs at once
# ----------------------------------------------------------------------------------------------------------------


def _no_dropout(ckpt):
    """The checkpoint's backbone with attention dropout off (finetune.dropout turns the hidden dropout off): the
    same mathematics gives the same numbers, whatever the padding or the order the jobs run in."""
    import dataclasses

    from tinyelectra.hf import load_backbone

    bb = load_backbone(ckpt)
    return bb._replace(config=dataclasses.replace(bb.config, attention_dropout=0.0))


def _sentiment_task(tok, rows: int, seed: int = 0):
    from tinyelectra.finetune import EncodedTask
    from tinyelectra.glue_data import encode_pairs

    rng = random.Random(seed)
    labels = np.array([i % 2 for i in range(rows)])
    text = [sentiment_sentence(rng, y) + " " + " ".join(rng.choice(FILLER) for _ in range(rng.randint(0, 30)))
            for y in labels]
    return EncodedTask(train=encode_pairs(tok, text, None, labels, max_length=128), dev={}, test=[])


def test_static_schedule_fills_the_last_batch_and_buckets_the_widths():
    """70 rows, batch 32: batches of 32, 32 and 6 real rows each epoch (the eager path's); the short one is filled up
    to 32 with copies of its own rows weighted 0; widths are the batch's longest row rounded up to 16, at most the
    table's 48; the learning rates are lr_at x each group's scale, rounded to float32 as the update reads them."""
    from tinyelectra.finetune import batch_indices, static_schedule
    from tinyelectra.optim import lr_at

    lengths = np.random.default_rng(1).integers(5, 41, size=70)
    lengths[3] = 45  # one long row: its batch is 48 wide
    s = static_schedule(lengths, 32, 6, seed=4, peak_lr=3e-4, warmup=0.6, lr_scales=[1.0, 0.8, 0.64], bucket=16, cap=48)
    eager = list(batch_indices(70, 32, 6, 4))
    assert s.rows.shape == s.weights.shape == (6, 32) and s.lrs.shape == (6, 3)
    for step, idx in enumerate(eager):
        real = len(idx)
        assert real == (6 if step % 3 == 2 else 32)
        assert np.array_equal(s.rows[step, :real], idx) and set(s.rows[step, real:]) <= set(idx)
        assert s.weights[step].tolist() == [1.0] * real + [0.0] * (32 - real)
        longest = int(lengths[idx].max())
        assert s.widths[step] == min(48, -(-longest // 16) * 16) >= longest
        assert s.lrs[step].tolist() == [np.float32(lr_at(step, 3e-4, 0.6, 6) * k) for k in (1.0, 0.8, 0.64)]
    assert s.lrs[0].tolist() == [0.0, 0.0, 0.0]  # the first step at lr 0, as the official schedule
    assert 48 in s.widths.tolist()


def test_a_filled_bucketed_batch_gives_the_loss_and_gradients_of_the_real_rows(ckpt):
    """One step's loss and every parameter's gradient: the eager path's 6-row batch padded to its longest row, and
    the static path's 32-row batch (26 fillers weighted 0) padded to the 16-token bucket, from the same weights."""
    import torch.nn.functional as F

    from tinyelectra.finetune import (
        FinetuneConfig, Finetuner, StaticStep, batch_indices, device_split, static_schedule,
    )
    from tinyelectra.tokenizer import Tokenizer

    bb = _no_dropout(ckpt)
    task = _sentiment_task(Tokenizer.load(bb.tokenizer_dir), 70)
    fc = FinetuneConfig(dropout=0.0, batch_size=32, length_bucket=16)
    dev = torch.device("cpu")
    eager, static = (Finetuner(bb, "sst2", fc, 0, dev, "fp32") for _ in range(2))
    idx = list(batch_indices(70, 32, 3, 0))[2]  # the epoch's last batch: 6 rows
    assert len(idx) == 6
    b = task.train.batch(idx)
    out = eager.model(torch.from_numpy(b.input_ids), torch.from_numpy(b.token_type_ids),
                      torch.from_numpy(b.attention_mask).bool())
    loss = F.cross_entropy(out, torch.from_numpy(b.labels.astype(np.int64)))
    loss.backward()
    data = device_split(task.train, False, 16, bb.config.max_positions, dev)
    sched = static_schedule(task.train.lengths, 32, 3, 0, 3e-4, 0.3, [1.0] * len(static.optimizer.param_groups), 16,
                            data.width)
    step = StaticStep(static, data, sched, capture=False)
    step.counter.fill_(2)
    width = int(sched.widths[2])
    assert width > b.input_ids.shape[1] and width % 16 == 0  # more padding than the eager batch, and 26 fillers
    padded = step.loss(width)
    padded.backward()
    assert padded.item() == pytest.approx(loss.item(), abs=1e-6)
    for (name, p), q in zip(eager.model.named_parameters(), static.model.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name


def test_static_and_eager_runs_end_with_the_same_weights(ckpt):
    """A whole run (2 epochs of 70 rows: 6 steps, two short batches, warm-up, clipping, the paper's Adam): the
    static path (fixed shapes, the step on the device, GraphSafeUpdate's update) ends where the eager one does."""
    from tinyelectra.finetune import FinetuneConfig, finetune
    from tinyelectra.tokenizer import Tokenizer

    bb = _no_dropout(ckpt)
    task = _sentiment_task(Tokenizer.load(bb.tokenizer_dir), 70)
    fc = FinetuneConfig(dropout=0.0, epochs=2, length_bucket=8)
    runs = {mode: finetune(bb, "sst2", task, fc, 0, torch.device("cpu"), "fp32", mode=mode)
            for mode in ("eager", "static")}
    (me, fe), (ms, fs) = runs["eager"], runs["static"]
    assert fe["steps"] == fs["steps"] == 6 and fs["step"].startswith("static")
    # eager: steps 1-6 read; static: the last 10 (all 6)
    assert fs["final_loss"] == pytest.approx(fe["final_loss"], abs=1e-5)
    for (name, p), q in zip(me.named_parameters(), ms.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name


def test_jobs_in_flight_together_end_as_they_do_alone(ckpt):
    """Three seeds interleaved step by step (run_jobs, 3 in flight) end exactly where each ends run alone."""
    from tinyelectra.finetune import FinetuneConfig, FinetuneJob, run_jobs
    from tinyelectra.tokenizer import Tokenizer

    bb = _no_dropout(ckpt)
    task = _sentiment_task(Tokenizer.load(bb.tokenizer_dir), 40)
    fc = FinetuneConfig(dropout=0.0, epochs=2, length_bucket=8)
    dev = torch.device("cpu")
    results = {}
    for concurrent in (1, 3):
        done = {}
        start = lambda s, stream, shared=concurrent > 1: FinetuneJob(bb, "sst2", task, fc, s, dev, "fp32", "static",  # noqa: E731
                                                                   stream=stream, shared_rng=shared)
        stats = run_jobs(list(range(3)), start, lambda s, job, d=done: d.__setitem__(s, job.finish()[0]), concurrent,
                         dev)
        assert stats["most_in_flight"] == concurrent and stats["steps"] == 3 * 4
        results[concurrent] = done
    for seed in range(3):
        for p, q in zip(results[1][seed].parameters(), results[3][seed].parameters()):
            assert torch.equal(p, q)
    assert not torch.equal(next(results[1][0].head.parameters()), next(results[1][1].head.parameters()))  # seeds differ


def test_step_modes_by_device_and_precision():
    from tinyelectra.errors import UserError
    from tinyelectra.finetune import AUTO_CONCURRENT, FinetuneConfig, concurrency, step_mode

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)  # step_mode reads the device's type only
    auto = FinetuneConfig()
    assert step_mode(auto, cpu, "fp32")[0] == "eager" and step_mode(auto, cuda, "bf16")[0] == "graphs"
    assert step_mode(auto, cuda, "fp16") == ("eager", "auto: eager under fp16 (its loss scaler checks for overflow on "
                                                      "the host, which a CUDA graph cannot)")
    assert concurrency(auto, "graphs") == AUTO_CONCURRENT and concurrency(auto, "eager") == 1
    assert concurrency(FinetuneConfig(concurrent=5), "eager") == 5
    with pytest.raises(UserError, match="finetune.step=graphs needs a CUDA device"):
        step_mode(FinetuneConfig(step="graphs"), cpu, "fp32")
    with pytest.raises(UserError, match="does not run under fp16"):
        step_mode(FinetuneConfig(step="static"), cuda, "fp16")
    with pytest.raises(UserError, match="finetune.step: must be auto, eager, static or graphs"):
        FinetuneConfig.from_overrides(["step=fast"])


def test_glue_with_static_steps_and_jobs_in_flight_records_how_it_ran(ckpt, tmp_path):
    """`tinyelectra glue --set step=static --set concurrent=4` on the CPU: 2 tasks x 3 seeds interleaved, every seed
    recorded, the protocol naming the buckets and the filled batch, glue.json saying what ran (jobs, steps, steps/s)."""
    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=40, dev_rows=20)
    cola = glue_dir / "CoLA"
    cola.mkdir()
    rows = (glue_dir / "SST-2" / "train.tsv").read_text().splitlines()[1:]
    dev_rows = (glue_dir / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    # CoLA's headerless layout: source, label, mark, text
    for name, lines in (("train.tsv", rows), ("dev.tsv", dev_rows)):
        (cola / name).write_text("".join(f"src\t{ln.split(chr(9))[1]}\t\t{ln.split(chr(9))[0]}\n" for ln in lines))
    paths = run_glue(ckpt, glue_dir, tmp_path / "out", "cola,sst2", seeds=3,
                     overrides=["epochs=1", "step=static", "concurrent=4"])
    r = json.loads(paths[0].read_text())
    assert r["complete"] and [len(r["tasks"][t]["seeds"]) for t in ("cola", "sst2")] == [3, 3]
    assert [s["seed"] for s in r["tasks"]["sst2"]["seeds"]] == [0, 1, 2]
    assert r["protocol"]["step"] == "static (as requested)"
    assert "length buckets of 32 tokens" in r["protocol"]["padding"]
    assert "weighted 0" in r["protocol"]["padding"] and r["protocol"]["concurrent_jobs"].startswith("up to 4")
    ft = r["fine_tuning"]
    assert (ft["step"], ft["jobs"], ft["most_in_flight"], ft["steps"]) == ("static", 6, 4, 6 * 2)  # 40 rows: 2 steps
    assert ft["steps_per_second"] > 0


def test_task_seeds_give_a_task_fewer_seeds_and_reuse_only_the_same_seeds(ckpt, tmp_path, capsys):
    """`--task-seeds sst2=1` with --seeds 2 (the GPU suite's trim of its longest task): SST-2 trains seed 0 alone,
    CoLA both seeds, glue.json names the trimmed task's seeds; the same command again reuses both tasks; sst2=2 then
    retrains SST-2 (other seeds than the finished entry's) and reuses CoLA. Bad values are one UserError line."""
    from tinyelectra.errors import UserError
    from tinyelectra.glue import parse_task_seeds

    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=40, dev_rows=20)
    cola = glue_dir / "CoLA"
    cola.mkdir()
    for name in ("train.tsv", "dev.tsv"):  # CoLA's headerless layout: source, label, mark, text
        lines = (glue_dir / "SST-2" / name).read_text().splitlines()[1:]
        (cola / name).write_text("".join(f"src\t{ln.split(chr(9))[1]}\t\t{ln.split(chr(9))[0]}\n" for ln in lines))

    def run(spec: str) -> dict:
        from tinyelectra.glue import GlueSettings, glue_command

        paths = glue_command(GlueSettings(checkpoint=ckpt, glue_dir=glue_dir, use_hf=False, tasks="cola,sst2", seeds=2,
                                          out_dir=tmp_path / "out", gpu=None, device="cpu", max_train_rows=None,
                                          overrides=["epochs=1", "step=static", "concurrent=3"], command="pytest",
                                          task_seeds=spec))
        return json.loads(paths[0].read_text())

    r = run("sst2=1")
    assert r["complete"] and r["seeds"] == [0, 1] and r["task_seeds"] == {"sst2": [0]}
    assert [s["seed"] for s in r["tasks"]["sst2"]["seeds"]] == [0]
    assert [s["seed"] for s in r["tasks"]["cola"]["seeds"]] == [0, 1]
    assert r["fine_tuning"]["jobs"] == 3 and r["tasks"]["sst2"]["std_paper"] is None  # one seed: no spread
    capsys.readouterr()
    again = run("SST-2=1")
    assert capsys.readouterr().out.count("reusing the results") == 2 and again["tasks"] == r["tasks"]
    more = run("")
    out = capsys.readouterr().out
    assert "ckpt-10000 cola: reusing" in out and "ckpt-10000 sst2: reusing" not in out and "task_seeds" not in more
    assert [s["seed"] for s in more["tasks"]["sst2"]["seeds"]] == [0, 1] and more["tasks"]["cola"] == r["tasks"]["cola"]
    assert parse_task_seeds(" sst2=1 , cola=2", ["cola", "sst2"], 2) == {"sst2": 1, "cola": 2}
    for spec, msg in (("sst2", "expected TASK=N"), ("sst2=x", "expected TASK=N"), ("mnli=1", "not among the tasks run"),
                      ("sst2=0", "needs 1 to 2 seeds"), ("sst2=3", "needs 1 to 2 seeds"),
                      ("nope=1", "expected TASK=N")):
        with pytest.raises(UserError, match=msg):
            parse_task_seeds(spec, ["cola", "sst2"], 2)


# ----------------------------------------------------------------------------------------------------------------
# What each seed says beside its score; a second learning rate; RUN/tensorboard only when it may be written
# ----------------------------------------------------------------------------------------------------------------


def write_unlearnable(glue_dir: Path, train_rows: int, dev_rows: int) -> Path:
    """An SST-2-format task a model cannot learn: every row the same sentence, labels 2:1 at random (independent of
    the text). Every row gets the same [CLS] output in eval mode, so every dev row the same class, whatever happened."""
    rng = random.Random(3)
    folder = glue_dir / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", train_rows), ("dev", dev_rows)):
        labels = [1 if rng.random() < 2 / 3 else 0 for _ in range(n)]
        lines = ["sentence\tlabel"] + [f"the film was a film\t{y}" for y in labels]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return glue_dir


@pytest.mark.slow
def test_a_seed_that_answers_one_class_is_named_beside_its_loss_curve_and_class_counts(ckpt, tmp_path, capsys):
    """Issue 34: CoLA predicted one class on all six runs and nothing said so. A job that cannot learn (labels
    independent of the text) is flagged in glue.json, the console line and the report; every seed keeps its loss every
    10 steps (the last point is the final loss it reports) and its dev rows per class, which add up to the dev rows."""
    from tinyelectra.finetune import LOSS_EVERY
    from tinyelectra.report import report_command

    glue_dir = write_unlearnable(tmp_path / "glue", train_rows=64, dev_rows=30)
    capsys.readouterr()
    paths = run_glue(ckpt, glue_dir, tmp_path / "out", "sst2", seeds=2, overrides=["epochs=6"])  # 12 steps a seed
    said = capsys.readouterr().out
    t = json.loads(paths[0].read_text())["tasks"]["sst2"]
    assert t["one_class_seeds"] == [0, 1]
    for s in t["seeds"]:
        counts = s["predicted_classes"]
        assert set(counts) == {"negative", "positive"} and sum(counts.values()) == 30  # every dev row, once
        assert s["one_class"] in counts and counts[s["one_class"]] == 30
        assert [step for step, _ in s["loss_curve"]] == [10, 12] and LOSS_EVERY == 10
        assert s["loss_curve"][-1][1] == pytest.approx(s["final_loss"])
        assert all(np.isfinite(x) for _, x in s["loss_curve"])
    line = next(x for x in said.splitlines() if x.startswith("ckpt-10000 sst2: accuracy median"))
    assert "ONE CLASS for every dev row: 2 of 2 seeds" in line, line
    report_command(tmp_path / "out", None)
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"(ONE CLASS: {t['seeds'][0]['one_class']!r} for every row)" in md
    learned = json.loads(run_glue(ckpt, write_sst2_like(tmp_path / "g2", 64, 40), tmp_path / "o2", "sst2",
                                  overrides=["epochs=1", "step=static"])[0].read_text())["tasks"]["sst2"]["seeds"][0]
    assert sum(learned["predicted_classes"].values()) == 40 and learned["loss_curve"][-1] == [2, learned["final_loss"]]


def test_released_lr_is_a_second_arm_kept_apart_from_the_papers_protocol(ckpt, tmp_path, capsys):
    """`--released-lr sst2`: SST-2 fine-tuned twice in one process, by the paper's protocol (3e-4, weight decay 0) into
    OUT/CKPT/glue.json and with the released code's learning rate and weight decay (configure_finetuning.py: 1e-4,
    0.01) into OUT/CKPT/released-lr/glue.json, which the report lists apart; the averages stay the paper protocol's; the
    same command again reuses both; a task not run is one line."""
    from tinyelectra.errors import UserError
    from tinyelectra.glue import GlueSettings, glue_command
    from tinyelectra.report import build_report

    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=40, dev_rows=20)

    def run(released: str) -> list[dict]:
        settings = GlueSettings(checkpoint=ckpt, glue_dir=glue_dir, tasks="sst2", seeds=1, out_dir=tmp_path / "out",
                                device="cpu", overrides=["epochs=3"], command="pytest", released_lr=released)
        return [json.loads(p.read_text()) for p in glue_command(settings)]

    paper, arm = run("sst2")
    assert (paper["protocol"]["settings"]["lr"], paper["protocol"]["settings"]["weight_decay"]) == (0.0, 0.0)
    assert paper["tasks"]["sst2"]["peak_lr"] == 3e-4 and "arm" not in paper["protocol"]
    assert arm["tasks"]["sst2"]["peak_lr"] == 1e-4 and arm["protocol"]["settings"]["weight_decay"] == 0.01
    assert "released code's learning rate" in arm["protocol"]["arm"]
    assert (tmp_path / "out" / "ckpt-10000" / "released-lr" / "glue.json").is_file()
    assert arm["tasks"]["sst2"]["seeds"][0]["final_loss"] != paper["tasks"]["sst2"]["seeds"][0]["final_loss"]
    rep = build_report(tmp_path / "out")
    assert [c["name"] for c in rep["checkpoints"]] == ["ckpt-10000"]  # one checkpoint, its arm beside it
    assert rep["checkpoints"][0]["released_lr"]["settings"] == {"lr": 1e-4, "weight_decay": 0.01}
    capsys.readouterr()
    assert run("SST-2")[1]["tasks"] == arm["tasks"] and capsys.readouterr().out.count("reusing the results") == 2
    with pytest.raises(UserError, match="rte is not among the tasks run"):
        run("rte")


def test_released_lr_reads_each_checkpoint_once_and_every_job_starts_from_its_weights(tmp_path, monkeypatch):
    """`--released-lr` fine-tunes each checkpoint a second time in the same process from one read of its weights and
    tokenizer (they were read once per arm), whose fingerprint (the key of the shared encodings) is computed once (it
    was computed again at every look-up of an encoding): every job of either arm starts from the weights as saved on
    disk, the second arm's after the first arm's jobs trained (steps at a learning rate above 0: their weights moved),
    so no job's training leaks into the weights the arms share."""
    from tinyelectra import glue
    from tinyelectra.hf import load_backbone
    from tinyelectra.tokenizer import Tokenizer

    run = make_run(tmp_path / "run", fractions=(0.5, 1.0))
    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=40, dev_rows=12)  # 2 steps an epoch: steps 1+ move
    saved = {name: load_backbone(run / name) for name in ("ckpt-5000", "ckpt-10000")}
    reads, starts, moved, fingerprints = [], [], [], []
    fingerprint = Tokenizer.fingerprint

    def counted(tokenizer) -> str:
        fingerprints.append(fingerprint(tokenizer))
        return fingerprints[-1]

    def read(path):
        reads.append(Path(path).name)
        return load_backbone(path)

    def weights(model) -> dict:
        return {f"embeddings.{k}": v.detach().clone() for k, v in model.embeddings.state_dict().items()} | \
            {f"encoder.{k}": v.detach().clone() for k, v in model.encoder.state_dict().items()}

    def same(state: dict, backbone) -> bool:
        disk = {f"embeddings.{k}": v for k, v in backbone.embeddings.items()} | \
            {f"encoder.{k}": v for k, v in backbone.encoder.items()}
        return state.keys() == disk.keys() and all(torch.equal(state[k], disk[k]) for k in disk)

    class Job(glue.FinetuneJob):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.what = kwargs["on_step"].what  # "ckpt-5000 (released-lr) sst2 seed 1/2"
            starts.append((self.what, weights(self.run.model)))

        def finish(self):
            model, facts = super().finish()
            moved.append((self.what, not same(weights(model), saved[self.what.split()[0]])))
            return model, facts

    monkeypatch.setattr(glue, "load_backbone", read)
    monkeypatch.setattr(glue, "FinetuneJob", Job)
    monkeypatch.setattr(Tokenizer, "fingerprint", counted)
    paths = glue.glue_command(glue.GlueSettings(checkpoint=run, glue_dir=glue_dir, tasks="sst2", seeds=2, device="cpu",
                                                overrides=["epochs=2"], command="pytest", released_lr="sst2"))
    assert len(paths) == 4 and all(json.loads(p.read_text())["complete"] for p in paths)
    assert sorted(reads) == ["ckpt-10000", "ckpt-5000"]  # once each, for both arms
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]  # once each; the run's one tokenizer
    arms = ["(released-lr)" in what for what, _ in starts]
    assert arms == [False] * 4 + [True] * 4  # the second arm's jobs start after the first arm's trained
    assert all(m for _, m in moved) and len(moved) == 8
    for what, state in starts:
        assert same(state, saved[what.split()[0]]), f"{what} did not start from the saved weights"


def test_duplicate_task_seeds_keys_are_one_line(ckpt, tmp_path, capsys):
    """Issue 35: `--task-seeds rte=1,rte=2` kept the last; now an error naming the task, exit 2, nothing run."""
    glue_dir = write_sst2_like(tmp_path / "glue", 8, 8)
    err = _cli_error(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(glue_dir), "--tasks", "sst2", "--seeds", "2",
                      "--task-seeds", "sst2=1,SST-2=2", "--device", "cpu", "--out", str(tmp_path / "o")], capsys)
    assert "sst2 is given twice" in err and not (tmp_path / "o" / "ckpt-10000" / "glue.json").exists()


def test_run_tensorboard_events_go_on_the_runs_record_once(tmp_path):
    """Each task's score in RUN/tensorboard is a new events file named by host and pid; one line of RUN's record
    covers them all (it was appended again after every task: 4 identical lines for 2 checkpoints x 2 tasks), and every
    events file is covered (train --force deletes them with the run)."""
    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard is not installed (an extra): glue writes no RUN/tensorboard without it")
    from tinyelectra.runfolder import RECORD_NAME, covered

    run = make_run(tmp_path / "run", fractions=(0.5, 1.0))
    glue_dir = write_stsb_like(write_sst2_like(tmp_path / "glue", train_rows=24, dev_rows=12), 12, 12)
    run_glue(run, glue_dir, tmp_path / "out", "sst2,stsb", overrides=["epochs=1"])
    lines = [json.loads(x) for x in (run / RECORD_NAME).read_text().splitlines()]
    pattern = f"tensorboard/events.out.tfevents.*.{glob.escape(socket.gethostname())}.{os.getpid()}.*"
    assert [x for x in lines if x.get("glob", "").startswith("tensorboard/")] == [{"by": "glue", "glob": pattern}]
    events = set((run / "tensorboard").iterdir())
    assert len(events) == 4 and events <= covered(run, ("glue",))[0]  # one file per (checkpoint, task)


@pytest.mark.parametrize("how", ["held by another command", "not writable"])
def test_glue_writes_run_tensorboard_only_under_the_runs_lock(tmp_path, capsys, how):
    """Issue 35: glue wrote RUN/tensorboard without RUN's lock, even with --out elsewhere (beside a `train --force` its
    events landed in the new run; on a read-only run it crashed from the writer thread after the first task). Now a
    run folder another command holds, or one that cannot be written, gets one line, RUN is left as it was, and every
    task's result is in glue.json."""
    from tinyelectra.runfolder import holding

    run = make_run(tmp_path / "run", fractions=(1.0,))
    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=24, dev_rows=12)
    write_stsb_like(glue_dir, train_rows=12, dev_rows=12)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with contextlib.ExitStack() as stack:
        if how == "not writable":  # root writes through modes: a file where the folder would be cannot be written into
            (run / "tensorboard").write_text("not a folder\n")
            before = sorted(p.relative_to(run) for p in run.rglob("*"))
        else:
            stack.enter_context(holding(run, "--out"))  # the lock train holds while it runs
        capsys.readouterr()
        paths = run_glue(run, glue_dir, tmp_path / "out", "sst2,stsb", overrides=["epochs=1"])
    said = capsys.readouterr().out
    r = json.loads(paths[0].read_text())
    assert r["complete"] and set(r["tasks"]) == {"sst2", "stsb"}
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # RUN as it was: no tensorboard events
    notes = [x for x in said.splitlines() if "GLUE scores not added to" in x]
    assert len(notes) == 1 and str(run / "tensorboard") in notes[0], said
    assert ("in use by" if how == "held by another command" else "not a directory") in notes[0]
