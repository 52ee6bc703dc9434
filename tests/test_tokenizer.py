"""Tokenizer: BERT's special ids at every vocab size, exact sizes, deterministic training, transformers loading the
saved files with the same ids, the piece cache against the plain Rust pipeline, cased text, SentencePiece on
Korean/Japanese/Chinese, and a clear error for each missing special token."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from tinyelectra.errors import UserError
from tinyelectra.tokenizer import Tokenizer

SHARED = Path(os.environ.get("TINYELECTRA_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
# BERT's uncased vocabulary (bert-base-uncased vocab.txt): the ids ELECTRA's checkpoints use.
BERT_IDS = {"[PAD]": 0, "[unused0]": 1, "[unused98]": 99, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}

MIXED = [
    "Héllo WORLD, naïve café — déjà vu!",
    "ΣΑΣ and İstanbul; Ölçek ıi",
    "中文字符 and 日本語のテキスト mixed with English.",
    "tabs\tand\x0bcontrol\x1cchars\x00here\ufffd and  double  spaces ",
    "http://example.com/a_b-c?d=e&f=g#h (see: [1], {2}) 3.14159 100,000",
    "a" * 150 + " unbelievably-long-hyphenated-compound-words/and/slashes",
    "",
    "   ",
    "emoji 😀 and symbols ©®™ and math ∑∫√ and arrows →",
]


def english_lines() -> list[str]:
    """~0.5 MB of English every Python has: the pydoc reference topics, one paragraph per line."""
    from pydoc_data.topics import topics

    lines = []
    for name in sorted(topics):
        for para in topics[name].split("\n\n"):
            line = " ".join(s.strip() for s in para.split("\n") if s.strip())
            if line:
                lines.append(line)
    return lines


@pytest.fixture(scope="module")
def trained() -> Tokenizer:
    return Tokenizer.train(english_lines(), vocab_size=3000, lowercase=True)


def hf_reference(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """The plain tokenizers pipeline on whole lines (what the piece cache must reproduce)."""
    return [e.ids for e in tok._hf.encode_batch(texts, add_special_tokens=False)]


def test_bert_special_ids_and_exact_size(trained):
    assert trained.kind == "wordpiece" and trained.lowercase
    assert trained.vocab_size == 3000
    assert (trained.pad_id, trained.unk_id, trained.cls_id, trained.sep_id, trained.mask_id) == (0, 100, 101, 102, 103)
    for token, i in BERT_IDS.items():
        assert trained.id_to_token(i) == token
    assert trained.vocab_padding == 0


def test_tiny_corpus_pads_vocabulary_with_unused_tokens():
    tok = Tokenizer.train(["the cat sat on the mat", "the dog sat too"], vocab_size=500, lowercase=True)
    assert tok.vocab_size == 500
    assert tok.vocab_padding > 0
    assert tok.id_to_token(499).startswith("[unused")
    assert tok.encode_batch(["the cat"]) == hf_reference(tok, ["the cat"])


def test_vocab_size_too_small_is_a_user_error():
    with pytest.raises(UserError, match="vocab-size"):
        Tokenizer.train(["abc"], vocab_size=50, lowercase=True)


@pytest.mark.cli
def test_training_is_deterministic_across_processes(tmp_path):
    """tokenizers' trainer orders "##c" tokens by hash-map iteration; two processes must still agree."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(english_lines()[:1500]), encoding="utf-8")
    code = (
        "import sys; from tinyelectra.tokenizer import Tokenizer; "
        "lines = open(sys.argv[1], encoding='utf-8').read().split('\\n'); "
        "print(Tokenizer.train(lines, 2000, True).fingerprint())"
    )
    prints = {subprocess.run([sys.executable, "-c", code, str(corpus)], capture_output=True, text=True,
                             check=True).stdout
              for _ in range(2)}
    assert len(prints) == 1


def test_transformers_autotokenizer_loads_saved_files_with_same_ids(trained, tmp_path):
    from transformers import AutoTokenizer

    trained.save(tmp_path / "tok")
    assert (tmp_path / "tok" / "vocab.txt").read_text(encoding="utf-8").split("\n")[100:104] == [
        "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    texts = english_lines()[:200] + MIXED
    ours = trained.encode_batch(texts)
    # the call users make: [CLS] text [SEP]; pairs [CLS] A [SEP] B [SEP] with token types 0 ... 0 1 ... 1
    assert [auto(t)["input_ids"] for t in texts] == [[101] + ids + [102] for ids in ours]
    for a, b, ia, ib in zip(texts[:50], texts[1:51], ours[:50], ours[1:51]):
        enc = auto(a, b)
        assert enc["input_ids"] == [101, *ia, 102, *ib, 102]
        assert enc["token_type_ids"] == [0] * (len(ia) + 2) + [1] * (len(ib) + 1)
    assert auto.mask_token_id == 103 and auto.pad_token_id == 0
    assert auto("the [MASK] sat")["input_ids"].count(103) == 1


def test_save_load_round_trip_and_vocab_txt(trained, tmp_path):
    trained.save(tmp_path / "tok")
    again = Tokenizer.load(tmp_path / "tok")
    assert again.fingerprint() == trained.fingerprint()
    from_vocab = Tokenizer.load(tmp_path / "tok" / "vocab.txt", lowercase=True)
    texts = english_lines()[:100] + MIXED
    assert again.encode_batch(texts) == trained.encode_batch(texts) == from_vocab.encode_batch(texts)
    cased = Tokenizer.load(tmp_path / "tok" / "vocab.txt", lowercase=False)
    assert cased.fingerprint() != from_vocab.fingerprint()  # normalization settings are part of the hash


def test_piece_cache_equals_whole_line_tokenization(trained):
    rng = random.Random(0)
    alphabet = [chr(i) for i in range(128)] + list("éüßçñ中文ΣİıΩ—“”…\u00a0\u3000\u200b")
    randoms = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(3000)]
    texts = english_lines() + MIXED + randoms
    # several batches, so pieces come both fresh and from the cache
    ours = [ids for i in range(0, len(texts), 997) for ids in trained.encode_batch(texts[i : i + 997])]
    assert ours == hf_reference(trained, texts)
    assert trained.decode(trained.encode_batch(["Hello, world!"])[0]) == "hello, world!"


@pytest.mark.slow
def test_piece_cache_on_real_wikipedia_text(trained):
    files = sorted((SHARED / "enwiki").glob("*.gz"))
    if not files:
        pytest.skip(f"real data not found at {SHARED}/enwiki (set TINYELECTRA_SHARED_DATA)")
    import gzip

    with gzip.open(files[0], "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][:6000]
    ours = [ids for i in range(0, len(lines), 1500) for ids in trained.encode_batch(lines[i : i + 1500])]
    assert ours == hf_reference(trained, lines)


def test_cased_training_keeps_case_and_accents():
    lines = english_lines()[:800] + ["Café Café café Éclair éclair"] * 50
    tok = Tokenizer.train(lines, vocab_size=2000, lowercase=False)
    assert not tok.lowercase
    upper, lower = tok.encode_batch(["The", "the"])
    assert upper != lower
    assert "é" in tok.decode(tok.encode_batch(["café"])[0])


def write_vocab(path: Path, tokens: list[str]) -> Path:
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


@pytest.mark.parametrize("missing", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
def test_vocab_missing_a_special_token_names_it(tmp_path, missing):
    tokens = [t for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s"] if t != missing]
    with pytest.raises(UserError, match=rf"no \{missing[:-1]}\] token"):
        Tokenizer.load(write_vocab(tmp_path / "vocab.txt", tokens))


def test_tokenizer_json_missing_a_special_token_names_it(trained, tmp_path):
    trained.save(tmp_path / "tok")
    spec = json.loads((tmp_path / "tok" / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["vocab"] = {t: i for t, i in spec["model"]["vocab"].items() if t != "[CLS]"}
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "[CLS]"]
    spec["post_processor"] = None
    (tmp_path / "broken.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(UserError, match=r"no \[CLS\] token"):
        Tokenizer.load(tmp_path / "broken.json")


def test_bad_tokenizer_paths(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        Tokenizer.load(tmp_path / "nope.txt")
    (tmp_path / "x.bin").write_bytes(b"\x00\x01")
    with pytest.raises(UserError, match="expected a vocab.txt"):
        Tokenizer.load(tmp_path / "x.bin")
    (tmp_path / "x.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match="not a SentencePiece model"):
        Tokenizer.load(tmp_path / "x.model")


# ------------------------------------------------------------------ SentencePiece, non-Latin text
CJK_LINES = [
    "대한민국의 수도는 서울이며, 한국어는 한글로 적는다.",
    "언어 모델은 많은 텍스트에서 단어의 쓰임을 배운다.",
    "오늘은 날씨가 맑고 바람이 시원하다.",
    "日本の首都は東京で、日本語は漢字と仮名で書かれる。",
    "言語モデルは大量のテキストから言葉の使い方を学ぶ。",
    "今日は天気が良くて、風が気持ちいい。",
    "中国的首都是北京，中文使用汉字书写。",
    "语言模型从大量文本中学习词语的用法。",
    "今天天气晴朗，微风很舒服。",
]


def train_sentencepiece(tmp_path: Path, control: list[str]) -> Path:
    import sentencepiece as spm

    corpus = tmp_path / "cjk.txt"
    corpus.write_text("\n".join(CJK_LINES * 20) + "\n", encoding="utf-8")
    prefix = tmp_path / ("sp-" + "-".join(c.strip("<>") for c in control))
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=200, hard_vocab_limit=False, model_type="unigram",
        character_coverage=1.0,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, control_symbols=control, minloglevel=2, num_threads=1,
    )
    return prefix.with_suffix(".model")


def test_sentencepiece_on_korean_japanese_chinese(tmp_path):
    import sentencepiece as spm

    model = train_sentencepiece(tmp_path, ["<cls>", "<sep>", "<mask>"])
    tok = Tokenizer.load(model)
    reference = spm.SentencePieceProcessor(model_file=str(model))
    assert tok.kind == "sentencepiece" and not tok.lowercase
    assert (tok.pad_id, tok.unk_id) == (0, 1)
    assert {reference.id_to_piece(i) for i in (tok.cls_id, tok.sep_id, tok.mask_id)} == {"<cls>", "<sep>", "<mask>"}
    ids = tok.encode_batch(CJK_LINES)
    assert ids == [reference.encode(line) for line in CJK_LINES]
    assert all(tok.unk_id not in row for row in ids)
    # the model's own normalization (NFKC) is kept: e.g. the full-width comma becomes ","
    assert [tok.decode(row) for row in ids] == [unicodedata.normalize("NFKC", line) for line in CJK_LINES]
    tok.save(tmp_path / "saved")
    again = Tokenizer.load(tmp_path / "saved")
    assert again.fingerprint() == tok.fingerprint() and again.encode_batch(CJK_LINES) == ids
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    # the real call: [CLS] ... [SEP] with this model's own <cls>/<sep>, and token types for pairs
    assert [auto(line)["input_ids"] for line in CJK_LINES] == [[tok.cls_id, *row, tok.sep_id] for row in ids]
    pair = auto(CJK_LINES[0], CJK_LINES[3])
    assert pair["input_ids"] == [tok.cls_id, *ids[0], tok.sep_id, *ids[3], tok.sep_id]
    assert pair["token_type_ids"] == [0] * (len(ids[0]) + 2) + [1] * (len(ids[3]) + 1)
    assert ([auto.decode(auto(line)["input_ids"], skip_special_tokens=True) for line in CJK_LINES]
            == [tok.decode(r) for r in ids])


SPACED = ["two  spaces", "x   y    z", "trailing  ", "  leading", " ", "tab\there", "code(x)  # comment",
          "한국어  문장"]


def test_trained_sentencepiece_keeps_runs_of_spaces_as_written(tmp_path):
    """`prepare --tokenizer-type sentencepiece` keeps the text as written (its help says so): runs of spaces are not
    collapsed (SentencePiece's default remove_extra_whitespaces is off), so decode returns the text, and the copy
    written for transformers encodes and decodes the same."""
    from transformers import AutoTokenizer

    from tinyelectra.tokenizer import read_sentencepiece

    tok = Tokenizer.train_sentencepiece(english_lines()[:1500], 1000)
    assert read_sentencepiece(tok._sp_bytes)[1]["remove_extra_whitespaces"] == 0
    ids = tok.encode_batch(SPACED)
    assert [tok.decode(row) for row in ids] == SPACED
    tok.save(tmp_path / "saved")
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    assert [auto(t, add_special_tokens=False)["input_ids"] for t in SPACED] == ids
    assert [auto.decode(row) for row in ids] == SPACED


def test_sentencepiece_missing_mask_names_it(tmp_path):
    model = train_sentencepiece(tmp_path, ["<cls>", "<sep>"])
    with pytest.raises(UserError, match=r"no \[MASK\] token \(also looked for <mask>\)"):
        Tokenizer.load(model)
