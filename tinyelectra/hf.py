"""Conversion to and from transformers' ELECTRA classes, and `tinyelectra export`.

Our modules and transformers' differ only in names (the maps under "state dicts") and in one layout choice: we fuse
query/key/value into one `qkv` linear layer (rows [query; key; value], each head-major as transformers').

Export writes DIR/discriminator (ElectraForPreTraining) and DIR/generator (ElectraForMaskedLM), each with config.json,
model.safetensors (transformers' save_pretrained), the tokenizer files and a README.md; an MLM checkpoint writes only
DIR/generator, the full-size masked LM, from which any Electra* class loads its encoder. Import reads such directories
(or a downloaded google/electra-* folder, safetensors or pytorch_model.bin) into an `Electra` for continued
pre-training (`electra_from_hf`) or a `Classifier`'s backbone (`load_backbone`, which also reads our checkpoints).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
import re
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import torch
from torch import Tensor

from tinyelectra.checkpoint import (check_tokenizer, check_vocab_rows, is_checkpoint, load_checkpoint,
                                   read_checkpoint_config, read_weights, verify_checkpoint)
from tinyelectra.config import ModelConfig
from tinyelectra.errors import UserError
from tinyelectra.files import check_writable, first_line, staged_dir
from tinyelectra.model import Electra
from tinyelectra.runfolder import Written, delete_recorded, delete_temporaries, holding
from tinyelectra.tokenizer import PROFILE_FILE, Tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "tokenizer.model")


class Backbone(NamedTuple):
    """What a `Classifier` needs: its shape and the state dicts of its `Embeddings` and `Encoder` modules."""

    config: ModelConfig
    embeddings: dict[str, Tensor]
    encoder: dict[str, Tensor]
    tokenizer_dir: Path | None  # a directory `Tokenizer.load` and `AutoTokenizer` read, or None when there is none


# ---------------------------------------------------------------------------------------------------- configs
def hf_config(cfg: ModelConfig, pad_token_id: int = 0):
    """The `ElectraConfig` of a model of shape `cfg` (for the generator, pass `cfg.generator()`)."""
    from transformers import ElectraConfig

    return ElectraConfig(
        vocab_size=cfg.vocab_size, embedding_size=cfg.embedding_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_size,
        hidden_act="gelu",  # exact (erf) GELU, as our F.gelu
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        max_position_embeddings=cfg.max_positions, type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps, pad_token_id=pad_token_id, tie_word_embeddings=True,
    )


def read_hf_config(directory: Path) -> dict[str, Any]:
    """config.json of a transformers directory, checked to describe an ELECTRA encoder we can run exactly."""
    d = Path(directory)
    if not d.exists():
        raise UserError(f"{d}: no such directory")
    if not d.is_dir():
        raise UserError(f"{d}: not a directory (expected a transformers ELECTRA directory or a tinyelectra checkpoint)")
    path = d / "config.json"
    if not path.is_file():
        raise UserError(f"{d}: not an ELECTRA model directory (no config.json)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: not a model configuration")
    if raw.get("format") == "tinyelectra-checkpoint":
        raise UserError(f"{d}: a tinyelectra checkpoint, not a transformers directory (use load_checkpoint or "
                        "`tinyelectra export`)")
    model_type = raw.get("model_type")
    if model_type != "electra":
        raise UserError(f"{d}: config.json describes a {model_type!r} model, not ELECTRA (model_type \"electra\")")
    for key, want, why in (("hidden_act", "gelu", "tinyelectra's encoder uses exact GELU"),
                           ("position_embedding_type", "absolute", "tinyelectra uses absolute position embeddings"),
                           ("is_decoder", False, "tinyelectra's encoder is bidirectional")):
        if key in raw and raw[key] != want:
            raise UserError(f"{path}: {key} = {raw[key]!r} is not supported ({why})")
    return raw


def model_config_from_hf(where: Path) -> tuple[dict[str, Any], ModelConfig]:
    """`read_hf_config(where)` and our ModelConfig from it (transformers' defaults for absent keys)."""
    from transformers import ElectraConfig

    raw = read_hf_config(where)
    defaults = ElectraConfig()
    get = lambda key: raw.get(key, getattr(defaults, key))  # noqa: E731
    hidden = get("hidden_size")
    try:
        return raw, ModelConfig(
            vocab_size=get("vocab_size"), embedding_size=raw.get("embedding_size", hidden), hidden_size=hidden,
            num_layers=get("num_hidden_layers"), num_heads=get("num_attention_heads"),
            ffn_size=get("intermediate_size"),
            max_positions=get("max_position_embeddings"), type_vocab_size=get("type_vocab_size"),
            dropout=float(get("hidden_dropout_prob")), attention_dropout=float(get("attention_probs_dropout_prob")),
            layer_norm_eps=float(get("layer_norm_eps")), generator_fraction=1.0,
        )
    except UserError as e:
        raise UserError(f"{where}/config.json: {e}") from None
    except TypeError as e:
        raise UserError(f"{where}/config.json: unexpected value types ({e})") from None


# ---------------------------------------------------------------------------------------------------- state dicts
def _parts(pairs) -> tuple[tuple[str, str], ...]:
    """(ours, transformers) module pairs -> the same pairs for their .weight and .bias."""
    return tuple((f"{o}.{p}", f"{h}.{p}") for o, h in pairs for p in ("weight", "bias"))


_LAYER_MAP = (("attn_out", "attention.output.dense"), ("norm1", "attention.output.LayerNorm"),  # inside one block
              ("ffn_in", "intermediate.dense"), ("ffn_out", "output.dense"), ("norm2", "output.LayerNorm"))
_EMB_MAP = (("word.weight", "embeddings.word_embeddings.weight"),
            ("position.weight", "embeddings.position_embeddings.weight"),
            ("token_type.weight", "embeddings.token_type_embeddings.weight"),
            *_parts([("norm", "embeddings.LayerNorm")]))
_DISC_HEAD = _parts([("dense", "discriminator_predictions.dense"),
                     ("out", "discriminator_predictions.dense_prediction")])
_GEN_HEAD = (*_parts([("dense", "generator_predictions.dense"), ("norm", "generator_predictions.LayerNorm")]),
             ("bias", "generator_lm_head.bias"))  # generator_lm_head.weight is the word embeddings (tied)
_QKV = ("query", "key", "value")


def _encoder_map(num_layers: int, project: bool) -> tuple[tuple[str, str], ...]:
    """(Encoder key, ElectraModel key) of every encoder tensor but the fused qkv."""
    blocks = [(f"layers.{i}.{o}", f"encoder.layer.{i}.{h}") for i in range(num_layers) for o, h in _LAYER_MAP]
    return _parts(blocks + ([("project", "embeddings_project")] if project else []))


def backbone_to_hf(emb: dict[str, Tensor], enc: dict[str, Tensor], num_layers: int) -> dict[str, Tensor]:
    """Embeddings + Encoder state dicts -> ElectraModel keys (no "electra." prefix)."""
    out = {hf: emb[ours] for ours, hf in _EMB_MAP}
    out.update({hf: enc[ours] for ours, hf in _encoder_map(num_layers, "project.weight" in enc)})
    for i in range(num_layers):
        for part in ("weight", "bias"):
            qkv = enc[f"layers.{i}.qkv.{part}"].chunk(3, dim=0)  # rows [query; key; value]
            out.update({f"encoder.layer.{i}.attention.self.{n}.{part}": t for n, t in zip(_QKV, qkv)})
    return out


def backbone_from_hf(sd: dict[str, Tensor], num_layers: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """ElectraModel keys (no "electra." prefix) -> (Embeddings state dict, Encoder state dict)."""
    enc = {ours: sd[hf] for ours, hf in _encoder_map(num_layers, "embeddings_project.weight" in sd)}
    for i in range(num_layers):
        for part in ("weight", "bias"):
            qkv = [sd[f"encoder.layer.{i}.attention.self.{n}.{part}"] for n in _QKV]
            enc[f"layers.{i}.qkv.{part}"] = torch.cat(qkv, dim=0)
    return {ours: sd[hf] for ours, hf in _EMB_MAP}, enc


def _sub(sd: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def _to_hf(emb: dict[str, Tensor], enc: dict[str, Tensor], num_layers: int, head: dict[str, Tensor],
           head_map) -> dict[str, Tensor]:
    out = {f"electra.{k}": v for k, v in backbone_to_hf(emb, enc, num_layers).items()}
    return out | {hf: head[ours] for ours, hf in head_map}


def discriminator_to_hf(model) -> dict[str, Tensor]:
    """An `Electra`'s discriminator as an ElectraForPreTraining state dict."""
    if model.discriminator is None:
        raise UserError("an MLM checkpoint has no discriminator to export")
    return _to_hf(model.embeddings.state_dict(), model.discriminator.state_dict(), model.cfg.num_layers,
                  model.disc_head.state_dict(), _DISC_HEAD)


def generator_to_hf(model) -> dict[str, Tensor]:
    """An `Electra`'s generator (or MLM model) as an ElectraForMaskedLM state dict."""
    emb = model.generator_embeddings.state_dict()
    out = _to_hf(emb, model.generator_encoder.state_dict(), model.gen_cfg.num_layers, model.gen_head.state_dict(),
                 _GEN_HEAD)
    return out | {"generator_lm_head.weight": emb["word.weight"]}  # tied


def _hf_model(cls_name: str, cfg: ModelConfig, state: dict[str, Tensor], pad_token_id: int):
    import transformers

    with quiet_transformers():
        hf = getattr(transformers, cls_name)(hf_config(cfg, pad_token_id))
    hf.load_state_dict(state, strict=True)
    return hf.eval()


def to_hf_discriminator(model, pad_token_id: int = 0):
    """A transformers ElectraForPreTraining (eval mode) holding a copy of `model`'s discriminator."""
    return _hf_model("ElectraForPreTraining", model.cfg, discriminator_to_hf(model), pad_token_id)


def to_hf_generator(model, pad_token_id: int = 0):
    """A transformers ElectraForMaskedLM (eval mode) holding a copy of `model`'s generator (or MLM model)."""
    return _hf_model("ElectraForMaskedLM", model.gen_cfg, generator_to_hf(model), pad_token_id)


# -------------------------------------------------------------------------------------------- reading transformers dirs
@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' load reports and progress bars off for the block (we check what was loaded ourselves)."""
    from transformers.utils import logging as hf_logging

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def _weights_vocab_rows(d: Path) -> int | None:
    """Rows of the word-embedding matrix in d/model.safetensors, read from the header only (None if not found)."""
    from safetensors import safe_open

    # missing (pytorch_model.bin) or damaged: from_pretrained says so
    with contextlib.suppress(Exception), safe_open(str(d / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            if key.endswith("embeddings.word_embeddings.weight"):
                return int(f.get_slice(key).get_shape()[0])
    return None


def _load_hf(cls, d: Path, raw: dict[str, Any]):
    """`cls.from_pretrained(d)` on the CPU, as fp32, with every failure turned into one UserError; eval mode."""
    from safetensors import SafetensorError

    rows = _weights_vocab_rows(d)
    if rows is not None:
        check_vocab_rows(rows, raw.get("vocab_size"), d)
    try:
        with quiet_transformers():
            model, info = cls.from_pretrained(str(d), output_loading_info=True)
    except pickle.UnpicklingError:  # not torch's text: it advises weights_only=False, which runs what the file holds
        raise UserError(f"{d}: damaged weights file (not a readable PyTorch weights file)") from None
    except OSError as e:
        raise UserError(f"{d}: no readable weights ({_reason(e)})") from None
    except (SafetensorError, EOFError) as e:
        raise UserError(f"{d}: damaged weights file ({_reason(e)})") from None
    except (RuntimeError, ValueError) as e:
        raise UserError(f"{d}: weights do not match config.json ({_reason(e)})") from None
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise UserError(f"{d}: not a complete {cls.__name__} checkpoint; missing weights: {shown}")
    return model.float().eval()  # fp32 whatever the stored dtype (our modules hold fp32 master weights)


def _reason(e: BaseException) -> str:
    """The first line of a loader's error, unless it is torch's advice to load with weights_only=False."""
    return "not a readable PyTorch weights file" if "weights_only" in str(e) else first_line(e)


def load_backbone(path: Path) -> Backbone:
    """A tinyelectra checkpoint (its discriminator, or the MLM encoder) or a transformers ELECTRA directory
    (discriminator, generator or any Electra* model) as a `Classifier` backbone."""
    p = Path(path)
    if is_checkpoint(p):
        recipe, objective = read_checkpoint_config(p)
        verify_checkpoint(p)
        name = "discriminator" if objective == "electra" else "generator"
        sd = read_weights(p / f"{name}.safetensors", recipe.model.vocab_size)
        cfg = dataclasses.replace(recipe.model, generator_fraction=1.0, sharing="embeddings")
        emb, enc = _sub(sd, "embeddings."), _sub(sd, f"{name}.")
        tokenizer_dir = p / "tokenizer" if (p / "tokenizer").is_dir() else None
    else:
        from transformers import ElectraModel

        raw, cfg = model_config_from_hf(p)
        emb, enc = backbone_from_hf(_load_hf(ElectraModel, p, raw).state_dict(), cfg.num_layers)
        tokenizer_dir = p if any((p / n).is_file() for n in TOKENIZER_FILES) else None
    if tokenizer_dir is not None:
        check_tokenizer(tokenizer_dir, cfg.vocab_size)  # against the model's vocabulary size
    return Backbone(cfg, emb, enc, tokenizer_dir)


def electra_from_hf(discriminator_dir: Path, generator_dir: Path | None = None, cfg: ModelConfig | None = None):
    """An `Electra` (objective "electra") from transformers directories, for continued pre-training.

    With `generator_dir`, its generator is loaded too: the width multiplier is read from the two configs, and the
    embeddings are shared when the two directories hold equal embedding tables (as google's releases do), else
    kept separate (sharing "none"). Without it, the generator is freshly initialised at `cfg.generator_fraction`
    (default 1/4, the paper's Small). A given `cfg` (e.g. a recipe's) must match the directories' shapes.
    Returns (model in eval mode, the ModelConfig it was built with).
    """
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    dd = Path(discriminator_dir)
    raw_d, disc_cfg = model_config_from_hf(dd)
    sd_d = _load_hf(ElectraForPreTraining, dd, raw_d).state_dict()
    emb, disc_enc = backbone_from_hf(_sub(sd_d, "electra."), disc_cfg.num_layers)
    parts = [("embeddings", emb), ("discriminator", disc_enc), ("disc_head", {o: sd_d[h] for o, h in _DISC_HEAD})]
    fraction, sharing = (0.25, "embeddings") if cfg is None else (cfg.generator_fraction, cfg.sharing)
    if generator_dir is not None:
        gd = Path(generator_dir)
        raw_g, gen_cfg = model_config_from_hf(gd)
        fraction = _generator_fraction(disc_cfg, gen_cfg, gd)
        sd_g = _load_hf(ElectraForMaskedLM, gd, raw_g).state_dict()
        g_emb, g_enc = backbone_from_hf(_sub(sd_g, "electra."), gen_cfg.num_layers)
        if not torch.equal(sd_g["generator_lm_head.weight"], sd_g["electra.embeddings.word_embeddings.weight"]):
            raise UserError(f"{gd}: generator output layer is not tied to its word embeddings (tinyelectra always ties "
                            "them)")
        shared = all(torch.equal(emb[k], g_emb[k]) for k in emb)
        sharing = "embeddings" if shared else "none"
        if not shared and gen_cfg.embedding_size != gen_cfg.hidden_size:
            raise UserError(f"{gd}: the generator's embeddings differ from the discriminator's, so they are untied; an "
                            f"untied generator has embeddings of its own hidden width ({gen_cfg.hidden_size}, the "
                            f"official layout), not {gen_cfg.embedding_size}")
        parts += [("gen_embeddings", g_emb), ("generator_encoder", g_enc),
                  ("gen_head", {o: sd_g[h] for o, h in _GEN_HEAD})]
    full_cfg = dataclasses.replace(disc_cfg, generator_fraction=fraction, sharing=sharing)
    if cfg is not None:  # a recipe's shape must be the directory's (more positions are fine)
        for name in ("vocab_size", "embedding_size", "hidden_size", "num_layers", "num_heads", "ffn_size",
                     "type_vocab_size"):
            if getattr(cfg, name) != getattr(full_cfg, name):
                raise UserError(f"{dd}: {name} is {getattr(full_cfg, name)} but the recipe says {getattr(cfg, name)}")
        if full_cfg.max_positions < cfg.max_positions:
            raise UserError(f"{dd}: max_position_embeddings {full_cfg.max_positions} < the recipe's "
                            f"{cfg.max_positions}")
        full_cfg = dataclasses.replace(cfg, sharing=sharing, generator_fraction=fraction)
    model = Electra(full_cfg, objective="electra")
    with torch.no_grad():
        for name, state in parts:
            if getattr(model, name) is not None:  # gen_embeddings is None when the embeddings are shared
                getattr(model, name).load_state_dict(state, strict=True)
    return model.eval(), full_cfg


def _generator_fraction(disc: ModelConfig, gen: ModelConfig, where: Path) -> float:
    """The width multiplier that turns `disc` into `gen` under ModelConfig.generator()'s (the official) rule."""
    if gen.embedding_size not in (disc.embedding_size, gen.hidden_size):
        raise UserError(f"{where}: generator embedding_size {gen.embedding_size} is neither the discriminator's "
                        f"{disc.embedding_size} (shared embeddings) nor its own hidden size {gen.hidden_size} (untied)")
    for name in ("vocab_size", "num_layers", "max_positions", "type_vocab_size"):
        if getattr(gen, name) != getattr(disc, name):
            raise UserError(f"{where}: generator {name} {getattr(gen, name)} differs from the discriminator's "
                            f"{getattr(disc, name)}" + (" (vocabulary size mismatch)" if name == "vocab_size" else ""))
    fraction = gen.hidden_size / disc.hidden_size
    try:
        derived = dataclasses.replace(disc, generator_fraction=fraction).generator()
    except UserError as e:
        raise UserError(f"{where}: generator shape cannot be derived from the discriminator's ({e})") from None
    if (derived.hidden_size, derived.ffn_size, derived.num_heads) != (gen.hidden_size, gen.ffn_size, gen.num_heads):
        raise UserError(f"{where}: generator (hidden {gen.hidden_size}, FFN {gen.ffn_size}, heads {gen.num_heads}) "
                        f"does not have the official generator shape (hidden = fraction x the discriminator's, FFN = "
                        f"4 x hidden, heads = hidden // 64; {fraction:g} gives "
                        f"{derived.hidden_size}/{derived.ffn_size}/{derived.num_heads})")
    return fraction


# ---------------------------------------------------------------------------------------------------- export
def _yaml(value: str) -> str:
    """`value` as a YAML scalar: as it is when it is a plain word (apache-2.0, ko), else double-quoted with JSON's
    escapes, which YAML's double-quoted style reads the same (a ':', '#', quote, newline or leading '-' in a
    --license or --language can then not change the card's metadata)."""
    plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9._+-]*", value) and value.lower() not in (
        "yes", "no", "true", "false", "on", "off", "null", "y", "n")
    return value if plain else json.dumps(value)


def _model_card(kind: str, cls_name: str, recipe, meta: dict[str, Any], languages: list[str] | None,
                license_id: str | None, language_source: str) -> str:
    lines = ["---"] + (["language:"] + [f"- {_yaml(code)}" for code in languages] if languages else [])  # hub metadata
    lines += [f"license: {_yaml(license_id or 'other')}", "library_name: transformers"]
    lines += ["pipeline_tag: fill-mask"] if kind == "generator" else []
    lines += ["tags:", "- electra", "- tinyelectra", "---", "", f"# {recipe.name}: ELECTRA {kind}", "",
              f"Pre-trained with tinyelectra (objective {recipe.objective.kind!r}, recipe {recipe.name!r}).", "",
              "| field | value |", "|---|---|"]
    lines += [f"| {k} | {meta[k]:.4g} |" if isinstance(meta[k], float) and "flops" in k else f"| {k} | {meta[k]} |"
              for k in ("step", "fraction", "tokens_seen", "train_flops_paper", "train_flops_hardware", "train_seconds")
              if k in meta]
    lines += [
        "", "train_flops_paper counts FLOPs in the ELECTRA paper's convention (dense embedding look-ups, backward = "
        "forward).",
        "", "```python", f"from transformers import {cls_name}, AutoTokenizer",
        f"model = {cls_name}.from_pretrained(PATH)", "tokenizer = AutoTokenizer.from_pretrained(PATH)", "```", "",
    ]
    if kind == "generator" and recipe.objective.kind == "electra" and recipe.model.generator_fraction < 1.0:
        lines += [f"This generator is {recipe.model.generator_fraction:g}x the discriminator's width: it exists to "
                  "train the discriminator, which is the model to fine-tune.", ""]
    lines += [f"Language: {', '.join(languages)} ({language_source})." if languages else
              "Language: not recorded (`tinyelectra export --language CODE` adds it).",
              f"License: {license_id}." if license_id else
              "License: not given at export (`tinyelectra export --license ID`); it follows from the pre-training "
              "text's terms.", ""]
    return "\n".join(lines)


def _write_hf_dir(hf_model, out: Path, tokenizer, card: str, max_positions: int) -> None:
    with quiet_transformers():
        hf_model.save_pretrained(str(out))
    if tokenizer is not None:
        # model_max_length = the model's positions: tok(text, truncation=True) never gives more than it takes
        tokenizer.save(out, model_max_length=max_positions)
    (out / "README.md").write_text(card, encoding="utf-8")
    # Read it back with transformers itself: what we promise is that from_pretrained gives exactly these tensors.
    with quiet_transformers():
        again = type(hf_model).from_pretrained(str(out)).float()
    want, got = hf_model.state_dict(), again.state_dict()
    if want.keys() != got.keys() or not all(torch.equal(want[k], got[k]) for k in want):
        raise RuntimeError(f"{out}: transformers did not read back the weights it was given")


def export(model, recipe, meta: dict[str, Any], tokenizer_dir: Path | None, out_dir: Path,
           languages: list[str] | None = None, license_id: str | None = None) -> list[Path]:
    """Write `model` as transformers directories under `out_dir` (new or empty, and writable: checked before any
    work), each atomically; returns the directories written. The model card's languages are `languages`, else those
    `prepare` recorded beside the tokenizer."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: exists and is not a directory; choose a new directory")
    # one command writes a folder at a time: export holds --out's lock (inside it, through a link to a folder) from
    # before its first byte to its end; each part appears only complete (staged_dir inside --out)
    with holding(out_dir, "--out", reserves=("discriminator", "generator")):
        written = Written(out_dir, "export")
        held = [*written.foreign(out_dir), *(p for p in (out_dir / "discriminator", out_dir / "generator")
                                             if p.exists())]
        if held:
            raise UserError(f"--out {out_dir}: already exists and is not empty ({min(held).relative_to(out_dir)}); "
                            "choose a new directory")
        delete_temporaries(out_dir, "export")  # what an export killed mid-way left: its staging folders
        check_writable(out_dir, "--out")
        try:
            return _export(model, recipe, meta, tokenizer_dir, out_dir, languages, license_id, written)
        except BaseException:  # all or nothing: a part already in place goes too (--out held nothing else of export's)
            delete_recorded(out_dir, ("export",))
            raise


def _export(model, recipe, meta: dict[str, Any], tokenizer_dir: Path | None, out_dir: Path,
            languages: list[str] | None, license_id: str | None, written: Written) -> list[Path]:
    tokenizer, pad_id, source = None, 0, "given at export"
    if tokenizer_dir is not None:
        tokenizer = Tokenizer.load(tokenizer_dir)
        pad_id = tokenizer.pad_id
        profile = Path(tokenizer_dir) / PROFILE_FILE
        if not languages and profile.is_file():
            languages = json.loads(profile.read_text(encoding="utf-8")).get("languages") or []
            source = "guessed by `tinyelectra prepare` from the scripts of the pre-training text"
    parts = []
    if model.discriminator is not None:
        parts.append(("discriminator", "ElectraForPreTraining", to_hf_discriminator(model, pad_id)))
    parts.append(("generator", "ElectraForMaskedLM", to_hf_generator(model, pad_id)))
    for kind, cls_name, hf_model in parts:
        with staged_dir(out_dir / kind, "export", written) as tmp:
            card = _model_card(kind, cls_name, recipe, meta, languages, license_id, source)
            _write_hf_dir(hf_model, tmp, tokenizer, card, recipe.model.max_positions)
    return [out_dir / kind for kind, _, _ in parts]


def export_command(checkpoint: Path, out_dir: Path, languages: list[str] | None = None,
                   license_id: str | None = None) -> None:
    """`tinyelectra export CKPT --out DIR [--language CODE ...] [--license ID]`. Refuses a checkpoint without its
    tokenizer (an export that cannot encode text is not usable)."""
    from safetensors import SafetensorError

    model, recipe, meta = load_checkpoint(Path(checkpoint))
    tokenizer_dir = Path(checkpoint) / "tokenizer"
    if not tokenizer_dir.is_dir():
        raise UserError(f"{checkpoint}: no tokenizer/ directory beside the weights; an export without its tokenizer "
                        f"cannot encode text (copy the tokenizer/ of the data it was trained on into {checkpoint})")
    try:
        written = export(model, recipe, meta, tokenizer_dir, out_dir, languages, license_id)
    except SafetensorError as e:  # transformers writes the weights through safetensors, which drops the errno
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else "write failed"
        raise UserError(f"--out {out_dir}: cannot write the export ({detail}); nothing was left behind") from None
    for d in written:
        cls_name = "ElectraForPreTraining" if d.name == "discriminator" else "ElectraForMaskedLM"
        print(f"wrote {d} ({cls_name}; from_pretrained('{d}'))")
