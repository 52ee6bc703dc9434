"""Korean, Japanese, Chinese and Portuguese, end to end: the default tokenizer keeps kana voicing marks, Hangul
syllables and accents; `prepare` trains SentencePiece models; exports load in transformers with [CLS] A [SEP] B [SEP],
token types, round trips, model_max_length, fill-mask and a fine-tuned sequence classifier.

The text is real and comes from outside the repository: the translated messages of the Debian packages installed on
this machine (/usr/share/locale/{ko,ja,zh_CN,pt_BR}/LC_MESSAGES/*.mo: apt, dpkg, coreutils, glibc, PostgreSQL, ...;
about 1 MB per language), read with gettext. Tests skip with the reason where those files are absent.
"""

from __future__ import annotations

import dataclasses
import gettext
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

from tinyelectra import data as D
from tinyelectra import prepare as P
from tinyelectra.tokenizer import Tokenizer, choose_casing, read_sentencepiece, text_profile

LOCALE_DIR = Path(os.environ.get("TINYELECTRA_LOCALE_DIR", "/usr/share/locale"))
LOCALES = {"ko": "ko", "ja": "ja", "zh": "zh_CN", "pt": "pt_BR"}
REPO = Path(__file__).resolve().parents[1]


def real_lines(lang: str, max_chars: int = 10**9) -> list[str]:
    """Distinct translated message lines of one language, whitespace-normalised, in a fixed order."""
    files = sorted((LOCALE_DIR / LOCALES[lang] / "LC_MESSAGES").glob("*.mo"))
    lines: dict[str, None] = {}
    chars = 0
    for path in files:
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # msgid -> msgstr
        except (OSError, UnicodeDecodeError, ValueError):  # a catalog in a legacy charset: not UTF-8 text
            continue
        for key, text in catalog.items():
            if not key or not isinstance(text, str):
                continue  # the header entry
            for line in text.split("\n"):
                line = " ".join(line.split())
                if len(line) >= 4 and line not in lines:
                    lines[line] = None
                    chars += len(line)
        if chars >= max_chars:
            break
    return list(lines)


@pytest.fixture(scope="module")
def texts() -> dict[str, list[str]]:
    out = {lang: real_lines(lang, 400_000) for lang in LOCALES}
    short = [lang for lang, lines in out.items() if sum(map(len, lines)) < 100_000]
    if short:
        pytest.skip(f"no translated messages for {', '.join(short)} under {LOCALE_DIR} (Debian's locale files; "
                    f"set TINYELECTRA_LOCALE_DIR)")
    return out


def squeeze(text: str) -> str:
    """The text without spaces and without the control characters BERT's normaliser removes (BEL, ZWJ, ...)."""
    return "".join(c for c in "".join(text.split()) if unicodedata.category(c) not in ("Cc", "Cf"))


def write_corpus(path: Path, lines: list[str], lines_per_document: int = 40) -> Path:
    docs = ["\n".join(lines[i : i + lines_per_document]) for i in range(0, len(lines), lines_per_document)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------- casing
def test_auto_casing_is_cased_for_korean_japanese_chinese_portuguese_and_uncased_for_english(texts):
    from pydoc_data.topics import topics

    english = [line for t in sorted(topics) for line in topics[t].split("\n") if line.strip()]
    eng = text_profile(english)
    assert choose_casing("auto", eng)[0] is True and eng["changed_share"] < 0.0005 and eng["languages"] == ["en"]
    for lang, lines in texts.items():
        profile = text_profile(lines)
        lowercase, reason, warning = choose_casing("auto", profile)
        assert lowercase is False and warning is None, (lang, reason)
        # what uncased would do, from Unicode's own decomposition: Hangul syllables and voiced kana decompose
        if lang != "zh":  # Han has no case and no accents; the others lose letters
            assert profile["changed_share"] > 0.02, (lang, profile)
        forced = choose_casing("uncased", profile)
        assert forced[0] is True and (forced[2] is not None) == (lang != "zh"), (lang, forced)  # no case in Han
    assert text_profile(texts["ko"])["languages"] == ["ko"]
    assert text_profile(texts["ja"])["languages"] == ["ja"]
    assert text_profile(texts["zh"])["languages"] == ["zh"]
    assert text_profile(texts["pt"])["languages"] == []  # Latin with accents: not guessed


MINIMAL_PAIRS = {  # the words: uncased normalisation gives both members the same ids
    "ja": [("ガラス", "カラス"), ("パン", "ハン"), ("ビール", "ヒール")],
    "pt": [("pôr", "por"), ("avó", "avô"), ("é", "e")],
}


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["ko", "ja", "zh", "pt"])
def test_default_prepare_keeps_voicing_marks_hangul_syllables_and_accents(texts, tmp_path, lang):
    """`prepare` with its defaults on real text: a cased WordPiece (the manifest says why), whose decode gives back
    every character (spaces aside); forcing --casing uncased is the negative control that loses them."""
    lines = texts[lang]
    corpus = write_corpus(tmp_path / f"{lang}.txt", lines)
    m = P.prepare([str(corpus)], tmp_path / "data", vocab_size=6000, seq_len=64, validation_fraction=0.0, quiet=True)
    casing = m["tokenizer"]["casing"]
    assert casing["lowercase"] is False and casing["requested"] == "auto" and casing["reason"].startswith("auto: cased")
    assert m["tokenizer"]["alphabet"]["coverage"] >= 0.9999
    assert m["tokenizer"]["text"]["languages"] == ([] if lang == "pt" else [lang])
    tok = D.PretrainData(tmp_path / "data").tokenizer
    ids = tok.encode_batch(lines)
    unk = sum(row.count(tok.unk_id) for row in ids) / sum(map(len, ids))
    assert unk < 0.002, unk
    lost = [line for row, line in zip(ids, lines) if tok.unk_id not in row
            and squeeze(tok.decode(row)) != squeeze(line)]
    assert not lost, lost[:3]
    for a, b in MINIMAL_PAIRS.get(lang, []):
        assert tok.encode_batch([a]) != tok.encode_batch([b]), (a, b)
    if lang == "ko":
        assert squeeze(tok.decode(tok.encode_batch(["한국어는 한글로 적는다"])[0])) == "한국어는한글로적는다"

    uncased = Tokenizer.train(lines, 6000, lowercase=True)  # what the old default did
    if lang == "ja":
        assert uncased.encode_batch(["ガラス"]) == uncased.encode_batch(["カラス"])
    if lang == "pt":
        assert uncased.encode_batch(["pôr"]) == uncased.encode_batch(["por"])
    if lang == "ko":
        assert squeeze(uncased.decode(uncased.encode_batch(["한국어"])[0])) != "한국어"  # jamo
        assert unicodedata.normalize("NFC", squeeze(uncased.decode(uncased.encode_batch(["한국어"])[0]))) == "한국어"


@pytest.mark.slow
def test_fill_ratio_is_reported_and_packing_fills_short_paragraphs(texts, tmp_path, capsys):
    """Korean text with a blank line after every paragraph (the issue's legal text: 8% real tokens): prepare says
    how little of the examples is text and how to fix it; --pack-documents fills them, same tokens, same split."""
    corpus = write_corpus(tmp_path / "ko.txt", texts["ko"][:6000], lines_per_document=1)
    m = P.prepare([str(corpus)], tmp_path / "one", vocab_size=3000, seq_len=128, validation_fraction=0.05)
    said = " ".join(capsys.readouterr().err.split())
    data = D.PretrainData(tmp_path / "one")
    lengths = data.rows("train", np.arange(data.num_rows("train")))[1][:, 1].astype(np.int64)  # real tokens per row
    assert m["fill_ratio"]["train"] == round(lengths.sum() / (len(lengths) * 128), 4) < 0.2  # from the rows themselves
    assert f"only {100 * m['fill_ratio']['train']:.0f}% of the token slots hold text" in said
    assert "add --pack-documents" in said
    packed = P.prepare([str(corpus)], tmp_path / "packed", vocab_size=3000, seq_len=128, validation_fraction=0.05,
                       pack_documents=True)
    assert "hold text" not in " ".join(capsys.readouterr().err.split())
    assert packed["fill_ratio"]["train"] > 0.8 and packed["pack_documents"] is True
    assert packed["examples"]["train"] < m["examples"]["train"] / 4
    assert packed["documents"] == m["documents"]  # the same held-out documents
    # (the builder cuts segments to fit T, as the official one: packing keeps most of the tokens too)
    assert packed["tokens"]["train"] >= 0.9 * m["tokens"]["train"]
    P.prepare([str(corpus)], tmp_path / "again", vocab_size=3000, seq_len=128, validation_fraction=0.05,
                      pack_documents=True, quiet=True, workers=2, chunk_chars=50_000)
    P.prepare([str(corpus)], tmp_path / "one-worker", vocab_size=3000, seq_len=128, validation_fraction=0.05,
                    pack_documents=True, quiet=True, workers=1, chunk_chars=50_000)
    for split in ("train", "validation"):  # byte-identical for any number of workers
        assert (np.load(tmp_path / "again" / f"{split}-00000.ids.npy")
                == np.load(tmp_path / "one-worker" / f"{split}-00000.ids.npy")).all()


@pytest.mark.slow
def test_chinese_alphabet_scales_with_vocabulary(texts):
    """BERT's fixed 1,000-character alphabet left half of Chinese's ideographs out (a whole word became [UNK]);
    the alphabet now covers 99.99% of character occurrences when the vocabulary has room."""
    lines = texts["zh"]
    tok = Tokenizer.train(lines, 8000, lowercase=False)
    facts = tok.alphabet
    assert facts["characters"] > 1000 and facts["coverage"] >= 0.9999 and facts["characters"] <= (8000 - 104) // 3
    small = Tokenizer.train(lines, 2000, lowercase=False)  # room for (2000 - 104) // 3 = 632 characters only
    assert small.alphabet["characters"] == 632 and small.alphabet["coverage"] < 0.9999
    rows = tok.encode_batch(lines)
    assert sum(r.count(tok.unk_id) for r in rows) / sum(map(len, rows)) < 0.001


# ---------------------------------------------------------------------------------------------------- SentencePiece
@pytest.fixture(scope="module")
def sentencepiece_data(texts, tmp_path_factory) -> Path:
    """`tinyelectra prepare --tokenizer-type sentencepiece` (the README's command) on the four languages."""
    tmp = tmp_path_factory.mktemp("sp")
    mixed = [line for lang in LOCALES for line in texts[lang][:2500]]
    corpus = write_corpus(tmp / "mixed.txt", mixed)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "tinyelectra", "prepare", "--corpus", str(corpus), "--out",
                        str(tmp / "data"),
                        "--tokenizer-type", "sentencepiece", "--vocab-size", "6000", "--seq-len", "64",
                        "--validation-fraction", "0.05"], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    said = " ".join(r.stderr.split())
    assert "6000-entry SentencePiece unigram model" in said and "of their token slots filled" in said
    return tmp / "data"


@pytest.mark.slow
@pytest.mark.cli
def test_prepare_trains_a_sentencepiece_model_with_bert_special_pieces(texts, sentencepiece_data):
    m = json.loads((sentencepiece_data / "manifest.json").read_text(encoding="utf-8"))
    assert m["tokenizer"]["kind"] == "sentencepiece" and m["tokenizer"]["vocab_size"] == 6000
    assert m["tokenizer"]["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert m["tokenizer"]["sentencepiece"] == {"model": "unigram", "byte_fallback": True, "character_coverage": 0.9999}
    pieces, settings = read_sentencepiece((sentencepiece_data / "tokenizer" / "tokenizer.model").read_bytes())
    assert [p for p, _, _ in pieces[:5]] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert settings["byte_fallback"] == 1 and sum(kind == 6 for _, _, kind in pieces) == 256  # <0x00> ... <0xFF>
    data = D.PretrainData(sentencepiece_data)
    tok = data.tokenizer
    for lang, lines in texts.items():
        rows = tok.encode_batch(lines[:2500])
        assert all(tok.unk_id not in r for r in rows)  # byte fallback: never [UNK]
        assert [tok.decode(r) for r in rows] == lines[:2500], lang  # identity normalisation: exact round trips
    unseen = "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 鬱 ㉿"  # characters absent from the text: UTF-8 byte pieces, decoded back
    assert tok.decode(tok.encode_batch([unseen])[0]) == unseen
    b = data.batch("train", np.arange(min(64, data.num_rows("train"))))
    assert (b.input_ids[:, 0] == tok.cls_id).all() and m["fill_ratio"]["train"] > 0.5


@pytest.mark.slow
def test_sentencepiece_bpe_and_its_transformers_copy_agree_on_real_text(texts):
    """The tokenizers copy written for transformers encodes exactly as SentencePiece (unigram and BPE)."""
    sample = [line for lang in LOCALES for line in texts[lang][:1500]]
    for model in ("bpe", "unigram"):
        tok = Tokenizer.train_sentencepiece(sample, 3000, model_type=model)
        copy = tok.hf_tokenizer()
        held_out = [line for lang in LOCALES for line in texts[lang][1500:2500]]
        ours = tok.encode_batch(held_out)
        theirs = [e.ids for e in copy.encode_batch(held_out, add_special_tokens=False)]
        assert ours == theirs, model
        assert [copy.decode(r) for r in theirs[:500]] == held_out[:500]


# ---------------------------------------------------------------------------------------------------- export
def tiny_checkpoint(tmp: Path, tokenizer_dir: Path, vocab_size: int, max_positions: int = 64) -> Path:
    from tinyelectra.checkpoint import save_checkpoint
    from tinyelectra.config import ModelConfig, Recipe, recipe_from_dict
    from tinyelectra.model import Electra

    cfg = ModelConfig(vocab_size=vocab_size, embedding_size=32, hidden_size=64, num_layers=2, num_heads=2, ffn_size=128,
                      max_positions=max_positions, generator_fraction=0.5)
    raw = Recipe().to_dict()
    raw["model"] = dataclasses.asdict(cfg)
    raw["train"]["seq_len"] = max_positions
    torch.manual_seed(0)
    meta = {"step": 10, "fraction": 1.0, "tokens_seen": 1000, "train_flops_paper": 1e9, "train_flops_hardware": 2e9,
            "wall_seconds": 1.0}
    return save_checkpoint(tmp / "ckpt-10000", Electra(cfg), recipe_from_dict(raw), meta, tokenizer_dir)


def expectations(tok: Tokenizer, texts: dict[str, list[str]], max_positions: int, exact: bool) -> dict:
    pairs = []
    for lang in LOCALES:
        for a, b in zip(texts[lang][10:40:2], texts[lang][11:41:2]):
            ia, ib = tok.encode_batch([a, b])
            if len(ia) + len(ib) + 3 <= max_positions:
                pairs.append([a, b, ia, ib])
    trips = [line for lang in LOCALES for line in texts[lang][:200] if tok.unk_id not in tok.encode_batch([line])[0]]
    return {"max_positions": max_positions, "cls_id": tok.cls_id, "sep_id": tok.sep_id, "pairs": pairs,
            "round_trip": trips, "round_trip_ignoring_spaces": not exact}


@pytest.mark.slow
@pytest.mark.cli
def test_sentencepiece_export_works_in_transformers(texts, sentencepiece_data, tmp_path):
    """What a user of the export relies on, checked by transformers alone (tests/check_export.py): pairs get
    [CLS] A [SEP] B [SEP] and token types, byte-fallback pieces decode to text (never "<0xEC>"), decode(encode(x))
    is x, model_max_length is the model's positions, fill-mask runs; then a sequence classifier fine-tunes."""
    from tinyelectra.hf import export_command

    tok = Tokenizer.load(sentencepiece_data / "tokenizer")
    ckpt = tiny_checkpoint(tmp_path, sentencepiece_data / "tokenizer", tok.vocab_size)
    export_command(ckpt, tmp_path / "export", license_id="apache-2.0")
    card = (tmp_path / "export" / "discriminator" / "README.md").read_text(encoding="utf-8")
    front = card.split("---\n")[1]
    assert front.startswith("language:\n- ko\n- ja\n")
    assert "license: apache-2.0" in front and "library_name: transformers" in front
    want = expectations(tok, texts, 64, exact=True)
    assert len(want["pairs"]) > 40 and len(want["round_trip"]) == 800
    (tmp_path / "want.json").write_text(json.dumps(want, ensure_ascii=False), encoding="utf-8")
    r = subprocess.run([sys.executable, str(REPO / "tests" / "check_export.py"), str(tmp_path / "export"),
                        str(tmp_path / "want.json")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["model_max_length"] == 64
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(tmp_path / "export" / "discriminator"))
    byte_line = "鬱 ㉿ 𝔘"  # only byte pieces: what used to decode as <0xE9><0xAC><0xB1>
    assert "<0x" in " ".join(auto.tokenize(byte_line))
    assert auto.decode(auto(byte_line)["input_ids"], skip_special_tokens=True) == byte_line
    assert auto("서울 [MASK] 부산")["input_ids"].count(auto.mask_token_id) == 1
    fine_tune_classifier(tmp_path / "export" / "discriminator", texts)


def fine_tune_classifier(model_dir: Path, texts: dict[str, list[str]]) -> None:
    """ElectraForSequenceClassification from the export learns a 2-class task on real text (Korean vs Portuguese
    messages): held-out accuracy far above the 50% of chance after 60 steps from a random-weight encoder."""
    from transformers import AutoTokenizer, ElectraForSequenceClassification

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    torch.manual_seed(0)
    model = ElectraForSequenceClassification.from_pretrained(str(model_dir), num_labels=2)
    train = [(t, 0) for t in texts["ko"][300:600]] + [(t, 1) for t in texts["pt"][300:600]]
    test = [(t, 0) for t in texts["ko"][600:700]] + [(t, 1) for t in texts["pt"][600:700]]
    rng = np.random.default_rng(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(60):
        rows = [train[i] for i in rng.choice(len(train), 16, replace=False)]
        batch = tok([t for t, _ in rows], truncation=True, padding=True, return_tensors="pt")
        loss = model(**batch, labels=torch.tensor([y for _, y in rows])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        batch = tok([t for t, _ in test], truncation=True, padding=True, return_tensors="pt")
        predicted = model(**batch).logits.argmax(-1)
    accuracy = (predicted == torch.tensor([y for _, y in test])).float().mean().item()
    assert accuracy > 0.9, accuracy


@pytest.mark.slow
@pytest.mark.cli
def test_wordpiece_export_of_korean_works_in_transformers(texts, tmp_path):
    """The default path's export (a cased WordPiece on Korean): the same checks; decode equals the input up to the
    spaces WordPiece puts around punctuation."""
    from tinyelectra.hf import export_command

    corpus = write_corpus(tmp_path / "ko.txt", texts["ko"])
    P.prepare([str(corpus)], tmp_path / "data", vocab_size=5000, seq_len=64, validation_fraction=0.0, quiet=True)
    tok = Tokenizer.load(tmp_path / "data" / "tokenizer")
    ckpt = tiny_checkpoint(tmp_path, tmp_path / "data" / "tokenizer", tok.vocab_size)
    export_command(ckpt, tmp_path / "export")
    only_ko = {lang: (texts["ko"] if lang == "ko" else []) for lang in LOCALES}
    want = expectations(tok, only_ko, 64, exact=False)
    (tmp_path / "want.json").write_text(json.dumps(want, ensure_ascii=False), encoding="utf-8")
    r = subprocess.run([sys.executable, str(REPO / "tests" / "check_export.py"), str(tmp_path / "export"),
                        str(tmp_path / "want.json")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    card = (tmp_path / "export" / "generator" / "README.md").read_text(encoding="utf-8")
    assert "language:\n- ko\n" in card and "pipeline_tag: fill-mask" in card and "license: other" in card


@pytest.mark.slow
@pytest.mark.cli
def test_export_loads_in_other_transformers_versions(texts, sentencepiece_data, tmp_path):
    """The same checks under other interpreters with other transformers versions (4.x): set
    TINYELECTRA_TRANSFORMERS_PYTHONS to their paths, separated by ':' (each needs torch and transformers)."""
    pythons = [p for p in os.environ.get("TINYELECTRA_TRANSFORMERS_PYTHONS", "").split(os.pathsep) if p]
    if not pythons:
        pytest.skip("TINYELECTRA_TRANSFORMERS_PYTHONS is not set (interpreters with other transformers versions)")
    from tinyelectra.hf import export_command

    tok = Tokenizer.load(sentencepiece_data / "tokenizer")
    export_command(tiny_checkpoint(tmp_path, sentencepiece_data / "tokenizer", tok.vocab_size), tmp_path / "export")
    (tmp_path / "want.json").write_text(json.dumps(expectations(tok, texts, 64, exact=True), ensure_ascii=False),
                                        encoding="utf-8")
    for python in pythons:
        r = subprocess.run([python, str(REPO / "tests" / "check_export.py"), str(tmp_path / "export"),
                            str(tmp_path / "want.json")], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (python, r.stderr[-3000:])
