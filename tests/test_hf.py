"""transformers interop and checkpoints: our Electra equals ElectraForPreTraining / ElectraForMaskedLM on the same
weights (export and import, a small config and the Small shape), `tinyelectra export` writes directories that
from_pretrained and AutoTokenizer load offline, and bad inputs give one clear UserError each.

The reference outputs come from transformers' own ELECTRA implementation, not from our code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tinyelectra import hf
from tinyelectra.checkpoint import checkpoint_name, load_checkpoint, save_checkpoint
from tinyelectra.config import ModelConfig, Recipe, recipe_from_dict
from tinyelectra.errors import UserError
from tinyelectra.model import Classifier, Electra

transformers = pytest.importorskip("transformers")
from transformers import AutoTokenizer, ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining  # noqa: E402

TOL = 1e-5  # issue 3: max absolute difference in fp32, eval mode
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "##s", "##ing", "a", "b",
         "c"]

# google/electra-small-discriminator's config.json as published (transformers 4.x keys), and its generator's.
PUBLISHED_SMALL_DISCRIMINATOR = {
    "architectures": ["ElectraForPreTraining"], "attention_probs_dropout_prob": 0.1, "embedding_size": 128,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 256, "initializer_range": 0.02,
    "intermediate_size": 1024, "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "electra",
    "num_attention_heads": 4, "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
    "summary_activation": "gelu", "summary_last_dropout": 0.1, "summary_type": "first", "summary_use_proj": True,
    "type_vocab_size": 2, "vocab_size": 30522,
}
# Small++: full width
PUBLISHED_SMALL_GENERATOR = {**PUBLISHED_SMALL_DISCRIMINATOR, "architectures": ["ElectraForMaskedLM"]}

TINY = ModelConfig(vocab_size=119, embedding_size=16, hidden_size=32, num_layers=2, num_heads=4, ffn_size=48,
                   max_positions=64, generator_fraction=0.5)


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------- helpers
def randomize(module: torch.nn.Module, seed: int) -> None:
    """Non-trivial values everywhere (init leaves biases at 0 and LayerNorm at 1, which would hide mapping bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def batch(vocab: int, B: int, T: int, seed: int = 0):
    """[CLS] tokens [SEP] tokens [SEP] then padding, two segments, rows of different lengths (row 0 full)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(104, vocab, (B, T), generator=g)
    lengths = [T] + [int(x) for x in torch.randint(T // 4, T, (B - 1,), generator=g)]
    mask = torch.zeros(B, T, dtype=torch.bool)
    types = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n // 2], ids[b, n - 1] = 101, 102, 102
        ids[b, n:] = 0
        mask[b, :n] = True
        types[b, n // 2 + 1 : n] = 1
    return ids, types, mask


def max_diff_discriminator(ours: Electra, theirs, ids, types, mask) -> float:
    with torch.no_grad():
        a = ours.discriminator_logits(ids, types, mask)  # (B, T)
        b = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).logits
    assert a.shape == b.shape
    return (a - b)[mask].abs().max().item()  # per-token logits at every real token


def max_diff_generator(ours: Electra, theirs, ids, types, mask) -> float:
    B, T = ids.shape
    with torch.no_grad():
        a = ours.generator_logits(ids, types, mask, torch.arange(T).expand(B, T))  # (B, T, V): all positions
        b = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).logits
    assert a.shape == b.shape
    return (a - b)[mask].abs().max().item()


def make_tokenizer(tmp: Path) -> Path:
    from tinyelectra.tokenizer import RESERVED_TOKENS, Tokenizer

    (tmp / "vocab.txt").write_text("\n".join(RESERVED_TOKENS + WORDS) + "\n", encoding="utf-8")
    Tokenizer.load(tmp / "vocab.txt").save(tmp / "tok")
    return tmp / "tok"


def tiny_model(cfg: ModelConfig = TINY, objective: str = "electra", seed: int = 0) -> Electra:
    torch.manual_seed(seed)
    m = Electra(cfg, objective=objective)
    randomize(m, seed + 1)
    return m.eval()


def recipe_for(cfg: ModelConfig, objective: str = "electra") -> Recipe:
    raw = Recipe().to_dict()
    raw["model"] = dataclasses.asdict(cfg)
    raw["objective"]["kind"] = objective
    raw["train"]["seq_len"] = min(raw["train"]["seq_len"], cfg.max_positions)
    return recipe_from_dict(raw)


# ----------------------------------------------------------------------------------------- export: ours -> transformers
@pytest.mark.parametrize("sharing,fraction,embedding", [("embeddings", 0.5, 16), ("none", 0.5, 16), ("all", 1.0, 16),
                                                        ("embeddings", 0.5, 32)])
def test_export_equals_transformers_small_config(sharing, fraction, embedding):
    cfg = dataclasses.replace(TINY, sharing=sharing, generator_fraction=fraction, embedding_size=embedding)
    m = tiny_model(cfg)
    ids, types, mask = batch(cfg.vocab_size, 4, 24)
    assert max_diff_discriminator(m, hf.to_hf_discriminator(m), ids, types, mask) <= TOL
    assert max_diff_generator(m, hf.to_hf_generator(m), ids, types, mask) <= TOL


def test_mapping_is_sensitive():
    """Negative control: a conversion that mixed up the fused rows (here value <-> query) must show a large
    difference."""
    m = tiny_model()
    d = hf.to_hf_discriminator(m)
    ids, types, mask = batch(TINY.vocab_size, 4, 24)
    layer = d.electra.encoder.layer[0].attention.self
    with torch.no_grad():
        q = layer.query.weight.clone()
        layer.query.weight.copy_(layer.value.weight)
        layer.value.weight.copy_(q)
    assert max_diff_discriminator(m, d, ids, types, mask) > 1e-3


@pytest.mark.slow
def test_export_equals_transformers_small_shape():
    m = tiny_model(ModelConfig())  # the paper's Small: vocab 30522, 12 x 256, generator 1/4
    ids, types, mask = batch(30522, 2, 128, seed=3)
    d = hf.to_hf_discriminator(m)
    assert d.num_parameters() == 13_549_057  # the paper's Small discriminator (Appendix A shape)
    assert max_diff_discriminator(m, d, ids, types, mask) <= TOL
    g = hf.to_hf_generator(m)
    assert g.config.hidden_size == 64 and g.config.num_attention_heads == 1 and g.config.intermediate_size == 256
    assert max_diff_generator(m, g, ids, types, mask) <= TOL


# ----------------------------------------------------------------------------------------- import: transformers -> ours
def save_hf_pair(tmp: Path, disc_cfg: dict, gen_cfg: dict, seed: int = 0, shared: bool = True):
    """A transformers discriminator + generator directory pair with random weights (embeddings shared, as google's)."""
    torch.manual_seed(seed)
    disc = ElectraForPreTraining(ElectraConfig(**{k: v for k, v in disc_cfg.items() if k != "architectures"}))
    gen = ElectraForMaskedLM(ElectraConfig(**{k: v for k, v in gen_cfg.items() if k != "architectures"}))
    randomize(disc, seed + 1)
    randomize(gen, seed + 2)
    if shared:
        gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    gen.tie_weights()
    for model, name, raw in ((disc, "disc", disc_cfg), (gen, "gen", gen_cfg)):
        model.save_pretrained(tmp / name)
        (tmp / name / "config.json").write_text(json.dumps(raw, indent=2), encoding="utf-8")  # the published file as-is
    return disc.eval(), gen.eval()


def small_hf_cfg(**kw) -> dict:
    base = {"model_type": "electra", "vocab_size": 119, "embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 48, "max_position_embeddings": 64, "hidden_act": "gelu"}
    return base | kw


@pytest.mark.parametrize("shared", [True, False])
def test_import_equals_transformers_small_config(tmp_path, shared):
    disc, gen = save_hf_pair(tmp_path, small_hf_cfg(),
                             small_hf_cfg(hidden_size=16, num_attention_heads=1, intermediate_size=64), shared=shared)
    m, cfg = hf.electra_from_hf(tmp_path / "disc", tmp_path / "gen")
    assert cfg.generator_fraction == 0.5 and cfg.sharing == ("embeddings" if shared else "none")
    ids, types, mask = batch(119, 4, 24, seed=5)
    assert max_diff_discriminator(m, disc, ids, types, mask) <= TOL
    assert max_diff_generator(m, gen, ids, types, mask) <= TOL


def test_import_discriminator_only(tmp_path):
    """Without a generator directory the discriminator is exact and a fresh generator of the recipe's width is added."""
    disc, _ = save_hf_pair(tmp_path, small_hf_cfg(),
                           small_hf_cfg(hidden_size=16, num_attention_heads=1, intermediate_size=64))
    recipe_cfg = dataclasses.replace(TINY, generator_fraction=0.25)
    m, cfg = hf.electra_from_hf(tmp_path / "disc", cfg=recipe_cfg)
    assert cfg == recipe_cfg and m.gen_cfg.hidden_size == 8 and m.gen_cfg.num_heads == 1
    ids, types, mask = batch(119, 4, 24, seed=5)
    assert max_diff_discriminator(m, disc, ids, types, mask) <= TOL
    with pytest.raises(UserError, match="hidden_size is 32 but the recipe says 64"):
        hf.electra_from_hf(tmp_path / "disc", cfg=dataclasses.replace(TINY, hidden_size=64))


def test_import_pytorch_model_bin_and_backbone(tmp_path):
    """An older download holds pytorch_model.bin, not safetensors; the backbone feeds a Classifier exactly."""
    disc, _ = save_hf_pair(tmp_path, small_hf_cfg(),
                           small_hf_cfg(hidden_size=16, num_attention_heads=1, intermediate_size=64))
    (tmp_path / "disc" / "model.safetensors").unlink()
    torch.save(disc.state_dict(), tmp_path / "disc" / "pytorch_model.bin")
    bb = hf.load_backbone(tmp_path / "disc")
    assert bb.tokenizer_dir is None
    clf = Classifier(bb.config, num_labels=3).eval()
    clf.load_backbone(bb.embeddings, bb.encoder)
    ids, types, mask = batch(119, 4, 24, seed=6)
    with torch.no_grad():
        ours = clf.encoder(clf.embeddings(ids, types), mask)
        theirs = disc.electra(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).last_hidden_state
    assert (ours - theirs)[mask].abs().max().item() <= TOL
    assert clf(ids, types, mask).shape == (4, 3)


@pytest.mark.slow
def test_import_published_small_layout(tmp_path):
    """A google/electra-small-* folder (Small++: full-width generator) with the published config.json, vocab 30522."""
    disc, gen = save_hf_pair(tmp_path, PUBLISHED_SMALL_DISCRIMINATOR, PUBLISHED_SMALL_GENERATOR, seed=7)
    assert disc.num_parameters() == 13_549_057
    m, cfg = hf.electra_from_hf(tmp_path / "disc", tmp_path / "gen")
    assert (cfg.vocab_size, cfg.hidden_size, cfg.generator_fraction, cfg.sharing) == (30522, 256, 1.0, "embeddings")
    ids, types, mask = batch(30522, 2, 128, seed=8)
    assert max_diff_discriminator(m, disc, ids, types, mask) <= TOL
    assert max_diff_generator(m, gen, ids, types, mask) <= TOL


# ----------------------------------------------------------------------------------------------- checkpoints and export
META = {"step": 625, "fraction": 0.0625, "tokens_seen": 625 * 32 * 64, "train_flops_paper": 1.0e12,
        "train_flops_hardware": 2.0e12, "wall_seconds": 12.5}


def test_checkpoint_round_trip(tmp_path):
    tok = make_tokenizer(tmp_path)
    m = tiny_model()
    ck = save_checkpoint(tmp_path / "run" / checkpoint_name(0.0625), m, recipe_for(TINY), META, tok)
    assert ck.name == "ckpt-0625" and checkpoint_name(1.0) == "ckpt-10000"
    assert sorted(p.name for p in ck.iterdir()) == ["config.json", "discriminator.safetensors", "generator.safetensors",
                                                   "meta.json", "sha256.json", "tokenizer"]
    assert [p.name for p in ck.parent.iterdir()] == ["ckpt-0625"]  # no temporary directory left behind
    m2, recipe, meta = load_checkpoint(ck)
    # META is an old checkpoint's: its training seconds come back under today's name (checkpoint.read_meta)
    renamed = {k: v for k, v in META.items() if k != "wall_seconds"} | {"train_seconds": META["wall_seconds"]}
    assert meta == renamed and recipe.model == TINY
    a, b = m.state_dict(), m2.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Saving again over an existing checkpoint replaces it whole.
    m3 = tiny_model(seed=9)
    save_checkpoint(ck, m3, recipe_for(TINY), META | {"step": 700}, tok)
    m4, _, meta4 = load_checkpoint(ck)
    assert meta4["step"] == 700 and torch.equal(m4.embeddings.word.weight, m3.embeddings.word.weight)
    assert [p.name for p in ck.parent.iterdir()] == ["ckpt-0625"]


def test_export_command_end_to_end(tmp_path, capsys):
    tok = make_tokenizer(tmp_path)
    m = tiny_model()
    ck = save_checkpoint(tmp_path / "ckpt-10000", m, recipe_for(TINY), META, tok)
    out = tmp_path / "export"
    hf.export_command(ck, out)
    assert "discriminator" in capsys.readouterr().out
    ids, types, mask = batch(TINY.vocab_size, 4, 24, seed=2)
    disc = ElectraForPreTraining.from_pretrained(out / "discriminator", local_files_only=True).eval()
    gen = ElectraForMaskedLM.from_pretrained(out / "generator", local_files_only=True).eval()
    assert max_diff_discriminator(m, disc, ids, types, mask) <= TOL
    assert max_diff_generator(m, gen, ids, types, mask) <= TOL
    assert gen.generator_lm_head.weight.data_ptr() == gen.electra.embeddings.word_embeddings.weight.data_ptr()  # tied
    # AutoTokenizer reads the copied files and agrees with our tokenizer (plus [CLS] ... [SEP]).
    from tinyelectra.tokenizer import Tokenizer

    text = "the quick brown foxes jumps over the lazy dog"
    ours = Tokenizer.load(tok).encode_batch([text])[0]
    for part in ("discriminator", "generator"):
        auto = AutoTokenizer.from_pretrained(out / part, local_files_only=True)
        assert auto(text)["input_ids"] == [101] + ours + [102]
        assert (out / part / "README.md").is_file()
        # META is an old checkpoint's (wall_seconds): the card says what it always was, training seconds
        assert "| train_seconds | 12.5 |" in (out / part / "README.md").read_text()
    # The exported discriminator is itself a valid backbone source, identical to the checkpoint's.
    a, b = hf.load_backbone(ck), hf.load_backbone(out / "discriminator")
    assert a.config == b.config and a.tokenizer_dir == ck / "tokenizer" and b.tokenizer_dir == out / "discriminator"
    for x, y in ((a.embeddings, b.embeddings), (a.encoder, b.encoder)):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    with pytest.raises(UserError, match="not empty"):
        hf.export_command(ck, out)


def test_model_card_metadata_keeps_license_and_language_as_given(tmp_path):
    """--license and --language go into the card's YAML front matter: a value with a colon, a newline, a quote or a
    '#' stays one value (before, `mit\nlicense: evil` became a second key and '#' began a comment)."""
    import yaml

    tok = make_tokenizer(tmp_path)
    ck = save_checkpoint(tmp_path / "ckpt-10000", tiny_model(), recipe_for(TINY), META, tok)
    license_id, languages = 'mit\nlicense: evil # "x"', ["en", "pt: br", "- ko"]
    hf.export_command(ck, tmp_path / "export", languages=languages, license_id=license_id)
    card = (tmp_path / "export" / "discriminator" / "README.md").read_text(encoding="utf-8")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == license_id and front["language"] == languages
    assert front["library_name"] == "transformers" and front["tags"] == ["electra", "tinyelectra"]
    plain = hf.export_command(ck, tmp_path / "export2", languages=["ko"], license_id="apache-2.0")  # plain: unquoted
    assert plain is None and "license: apache-2.0\n" in (tmp_path / "export2" / "generator" / "README.md").read_text()


def test_an_export_killed_midway_leaves_nothing_after_the_next(tmp_path, capsys):
    """A killed export leaves, inside --out, its lock, its record and a staging folder (PART.tmp-PID): the next export
    of that --out takes the lock over, removes the folder (on record as the export's) and writes the export; nothing
    is left beside --out."""
    tok = make_tokenizer(tmp_path)
    ck = save_checkpoint(tmp_path / "ckpt-10000", tiny_model(), recipe_for(TINY), META, tok)
    out = tmp_path / "models" / "export"
    staged = out / "discriminator.tmp-99999999"
    staged.mkdir(parents=True)
    (staged / "model.safetensors").write_bytes(b"half")
    (out / ".tinyelectra.lock").write_text('{"command": "tinyelectra export", "pid": 99999999}')
    (out / ".tinyelectra.written").write_text('{"by": "export", "dir": "discriminator"}\n')
    hf.export_command(ck, out)
    assert "taking over the lock left by tinyelectra export (pid 99999999" in capsys.readouterr().err
    assert sorted(p.name for p in out.parent.iterdir()) == ["export"]
    assert sorted(p.name for p in out.iterdir()) == [".tinyelectra.written", "discriminator", "generator"]


def test_export_mlm_checkpoint(tmp_path):
    cfg = dataclasses.replace(TINY, generator_fraction=1.0)
    m = tiny_model(cfg, objective="mlm")
    ck = save_checkpoint(tmp_path / "ckpt-10000", m, recipe_for(cfg, "mlm"), META, None)
    assert not (ck / "discriminator.safetensors").exists()
    written = hf.export(*load_checkpoint(ck), None, tmp_path / "export")
    assert [p.name for p in written] == ["generator"]
    assert sorted(os.listdir(tmp_path / "export")) == [".tinyelectra.written", "generator"]  # and its record
    gen = ElectraForMaskedLM.from_pretrained(tmp_path / "export" / "generator").eval()
    ids, types, mask = batch(cfg.vocab_size, 3, 20, seed=4)
    assert max_diff_generator(m, gen, ids, types, mask) <= TOL
    bb = hf.load_backbone(ck)  # the MLM encoder is the backbone
    assert torch.equal(bb.encoder["layers.0.qkv.weight"], m.generator.layers[0].qkv.weight)


# ---------------------------------------------------------------------------------------------------- bad input
def test_not_electra_directories(tmp_path):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522}))
    with pytest.raises(UserError, match="'bert' model, not ELECTRA"):
        hf.load_backbone(bert)
    with pytest.raises(UserError, match="'bert' model"):
        load_checkpoint(bert)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    with pytest.raises(UserError, match="no config.json"):
        hf.load_backbone(junk)
    with pytest.raises(UserError, match="no config.json"):
        load_checkpoint(junk)
    (junk / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        hf.load_backbone(junk)
    with pytest.raises(UserError, match="no such"):
        hf.load_backbone(tmp_path / "missing")
    electra_no_weights = tmp_path / "noweights"
    ElectraConfig(**{k: v for k, v in small_hf_cfg().items() if k != "model_type"}).save_pretrained(electra_no_weights)
    with pytest.raises(UserError, match="no readable weights"):
        hf.load_backbone(electra_no_weights)
    with pytest.raises(UserError, match="transformers ELECTRA directory, not a tinyelectra checkpoint"):
        load_checkpoint(electra_no_weights)
    damaged = tmp_path / "damaged"
    save_hf_pair(damaged, small_hf_cfg(), small_hf_cfg(hidden_size=16, num_attention_heads=1, intermediate_size=64))
    (damaged / "disc" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(UserError, match="damaged weights file"):
        hf.load_backbone(damaged / "disc")
    act = tmp_path / "relu"
    act.mkdir()
    (act / "config.json").write_text(json.dumps(small_hf_cfg(hidden_act="relu")))
    with pytest.raises(UserError, match="hidden_act"):
        hf.load_backbone(act)


def as_written_before_checksums(ck: Path) -> None:
    """A checkpoint as written before checksums existed: no sha256.json and no marker in config.json saying one was."""
    (ck / "sha256.json").unlink(missing_ok=True)
    raw = json.loads((ck / "config.json").read_text())
    raw.pop("checksums")
    (ck / "config.json").write_text(json.dumps(raw))


def test_run_directory_and_missing_files(tmp_path):
    m = tiny_model()
    ck = save_checkpoint(tmp_path / "run" / "ckpt-0625", m, recipe_for(TINY), META, None)
    with pytest.raises(UserError, match="run directory.*ckpt-0625"):
        load_checkpoint(tmp_path / "run")
    (ck / "discriminator.safetensors").unlink()
    with pytest.raises(UserError, match="missing discriminator.safetensors"):
        load_checkpoint(ck)
    (ck / "discriminator.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="discriminator.safetensors: damaged .*sha256"):
        load_checkpoint(ck)
    (ck / "sha256.json").unlink()  # its absence is damage: config.json says one was written
    with pytest.raises(UserError, match="no sha256.json.*incomplete or damaged"):
        load_checkpoint(ck)
    as_written_before_checksums(ck)  # a checkpoint written before checksums: the reader's own check
    with pytest.raises(UserError, match="not a readable safetensors"):
        load_checkpoint(ck)


def test_vocabulary_size_mismatches(tmp_path):
    # weights vs config (checkpoint): config.json claims a different vocab_size than the tensors have
    m = tiny_model()
    ck = save_checkpoint(tmp_path / "ckpt-10000", m, recipe_for(TINY), META, None)
    raw = json.loads((ck / "config.json").read_text())
    raw["recipe"]["model"]["vocab_size"] = 200
    (ck / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="config.json: damaged"):  # an edited file no longer matches its checksum
        load_checkpoint(ck)
    as_written_before_checksums(ck)  # ... without checksums (an older checkpoint), the sizes are still checked
    with pytest.raises(UserError, match="vocabulary size mismatch.*119.*200"):
        load_checkpoint(ck)
    with pytest.raises(UserError, match="vocabulary size mismatch"):
        hf.load_backbone(ck)
    # tokenizer vs weights: a 119-token tokenizer beside a 150-row model
    tok = make_tokenizer(tmp_path)
    big = dataclasses.replace(TINY, vocab_size=150)
    ck2 = save_checkpoint(tmp_path / "ckpt-5000", tiny_model(big), recipe_for(big), META, tok)
    with pytest.raises(UserError, match="tokenizer has 119 tokens, the model 150"):
        load_checkpoint(ck2)
    with pytest.raises(UserError, match="tokenizer has 119 tokens"):
        hf.load_backbone(ck2)
    # weights vs config (transformers directory)
    save_hf_pair(tmp_path / "hf", small_hf_cfg(),
                 small_hf_cfg(hidden_size=16, num_attention_heads=1, intermediate_size=64))
    (tmp_path / "hf" / "disc" / "config.json").write_text(json.dumps(small_hf_cfg(vocab_size=200)))
    with pytest.raises(UserError, match="vocabulary size mismatch.*119.*200"):
        hf.load_backbone(tmp_path / "hf" / "disc")
    # generator vs discriminator vocabularies
    save_hf_pair(tmp_path / "hf2", small_hf_cfg(),
                 small_hf_cfg(vocab_size=120, hidden_size=16, num_attention_heads=1, intermediate_size=64),
                 shared=False)
    with pytest.raises(UserError, match="vocabulary size mismatch"):
        hf.electra_from_hf(tmp_path / "hf2" / "disc", tmp_path / "hf2" / "gen")


def test_tied_weights_between_different_sizes_rejected(tmp_path):
    with pytest.raises(UserError, match="sharing.*generator_fraction = 1.0"):
        ModelConfig(sharing="all", generator_fraction=0.25)
    m = tiny_model()
    ck = save_checkpoint(tmp_path / "ckpt-10000", m, recipe_for(TINY), META, None)
    raw = json.loads((ck / "config.json").read_text())
    raw["recipe"]["model"]["sharing"] = "all"  # a hand-edited config asking to tie a 0.5-width generator
    (ck / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="'all' ties every generator weight"):
        load_checkpoint(ck)
    # a generator without the official shape (FFN 4 x hidden, heads hidden // 64) cannot be derived either
    save_hf_pair(tmp_path / "hf", small_hf_cfg(),
                 small_hf_cfg(hidden_size=16, num_attention_heads=4, intermediate_size=48))
    with pytest.raises(UserError, match="does not have the official generator shape"):
        hf.electra_from_hf(tmp_path / "hf" / "disc", tmp_path / "hf" / "gen")


@pytest.mark.cli
def test_cli_export_bad_input_exits_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-m", "tinyelectra", "export", str(tmp_path), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "no config.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
