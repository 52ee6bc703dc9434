"""Data path: the example builder against a direct port of the official code, its invariants and random-decision
rates, the corpus readers (WikiExtractor, plain text, jsonl, parquet, compressed), byte-identical output for any
number of workers, caching, and the loader (round trip, resume from a cursor, DDP row ranges)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyelectra import data as D
from tinyelectra import prepare as P
from tinyelectra.corpus import CorpusReader, resolve_inputs, text_documents, wiki_documents
from tinyelectra.errors import UserError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "data"
CLS, SEP, PAD = 101, 102, 0


# ------------------------------------------------------------------ a direct port of the official builder
class OfficialExampleBuilder:
    """google-research/electra build_pretraining_dataset.py ExampleBuilder, kept in its original shape
    (add_line / _create_example / _make_example), with token ids given instead of text."""

    def __init__(self, max_length: int, rng: random.Random) -> None:
        self._max_length = max_length
        self._rng = rng
        self._current_sentences: list[list[int]] = []
        self._current_length = 0
        self._target_length = max_length

    def add_line(self, ids: list[int] | None):
        if ids is None:  # an empty line: the end of a document
            if self._current_length != 0:
                return self._create_example()
            self._current_sentences = []  # (tinyelectra: zero-token lines never cross documents)
            return None
        self._current_sentences.append(ids)
        self._current_length += len(ids)
        if self._current_length >= self._target_length:
            return self._create_example()
        return None

    def _create_example(self):
        if self._rng.random() < 0.1:
            first_segment_target_length = 100000
        else:
            first_segment_target_length = (self._target_length - 3) // 2
        first_segment: list[int] = []
        second_segment: list[int] = []
        for sentence in self._current_sentences:
            if (len(first_segment) == 0 or len(first_segment) + len(sentence) < first_segment_target_length
                    or (len(second_segment) == 0 and len(first_segment) < first_segment_target_length
                        and self._rng.random() < 0.5)):
                first_segment += sentence
            else:
                second_segment += sentence
        first_segment = first_segment[: self._max_length - 2]
        second_segment = second_segment[: max(0, self._max_length - len(first_segment) - 3)]
        self._current_sentences = []
        self._current_length = 0
        if self._rng.random() < 0.05:
            self._target_length = self._rng.randint(5, self._max_length)
        else:
            self._target_length = self._max_length
        return self._make_example(first_segment, second_segment)

    def _make_example(self, first_segment, second_segment):
        input_ids = [CLS] + first_segment + [SEP]
        segment_ids = [0] * len(input_ids)
        if second_segment:
            input_ids += second_segment + [SEP]
            segment_ids += [1] * (len(second_segment) + 1)
        input_mask = [1] * len(input_ids)
        input_ids += [PAD] * (self._max_length - len(input_ids))
        input_mask += [0] * (self._max_length - len(input_mask))
        segment_ids += [0] * (self._max_length - len(segment_ids))
        return input_ids, input_mask, segment_ids


def official_rows(docs: list[list[list[int]]], T: int, rng: random.Random, with_doc: bool = False):
    builder = OfficialExampleBuilder(T, rng)
    out = []
    for d, doc in enumerate(docs):
        for ids in [*doc, None]:
            example = builder.add_line(ids)
            if example:
                out.append((d, example) if with_doc else example)
    return out


def ours(docs: list[list[list[int]]], T: int, rng: random.Random):
    """tinyelectra's builder, rows padded and with the mask/segment ids derived from (boundary, length)."""
    out = []
    for _, a, b in P.build_examples(iter(docs), T, rng, P.BuilderStats()):
        row, boundary = P.example_row(a, b, CLS, SEP)
        length = len(row)
        out.append((row + [PAD] * (T - length), [1] * length + [0] * (T - length),
                    [0] * boundary + [1] * (length - boundary) + [0] * (T - length)))
    return out


def random_docs(rng: random.Random, n_docs: int, T: int) -> list[list[list[int]]]:
    """Documents of lines with lengths from 1 to 3T tokens (long lines hit every truncation branch)."""
    docs = []
    for _ in range(n_docs):
        lines = []
        for _ in range(rng.randint(1, 30)):
            n = rng.choice([rng.randint(1, 12), rng.randint(1, T), rng.randint(T, 3 * T)])
            lines.append([1000 + rng.randrange(5000) for _ in range(n)])
        docs.append(lines)
    return docs


@pytest.mark.parametrize("T", [8, 64, 128])
def test_builder_matches_the_official_code_row_for_row(T):
    docs = random_docs(random.Random(T), 400, T)
    expected = official_rows(docs, T, random.Random(7))
    got = ours(docs, T, random.Random(7))
    assert len(got) == len(expected) > 400
    assert got == expected


def test_builder_invariants():
    T = 64
    rng = random.Random(1)
    # document d only uses token ids in [1000 + 100 d, 1000 + 100 d + 100): a row's owner is visible in its tokens
    docs = [[[1000 + 100 * d + rng.randrange(100) for _ in range(rng.randint(1, 40))]
             for _ in range(rng.randint(1, 15))]
            for d in range(300)]
    rows = ours(docs, T, random.Random(3))
    for ids, mask, types in rows:
        length = sum(mask)
        text = [t for t in ids[:length] if t not in (CLS, SEP)]
        assert len({(t - 1000) // 100 for t in text}) == 1, "an example crosses documents"
        assert ids[0] == CLS and ids[length - 1] == SEP
        assert all(t == PAD for t in ids[length:])
        seps = [i for i, t in enumerate(ids[:length]) if t == SEP]
        assert ids[1:length].count(CLS) == 0 and len(seps) in (1, 2)
        boundary = types.index(1) if 1 in types else length
        assert seps[0] == (boundary - 1 if len(seps) == 2 else length - 1)
        assert len(text) > 0


@pytest.mark.slow
def test_builder_random_decision_rates_over_a_large_sample():
    """With one-token lines the two random draws are visible in the rows: a single-segment row is exactly the 10%
    draw, and a row shorter than T is exactly a 5% random target t <= T - 3 (t lines give t + 3 tokens)."""
    T = 128
    doc = [[1000 + (i % 50)] for i in range(2_500_000)]  # one long document: only its last example ends a document
    stats = P.BuilderStats()
    single = short = total = 0
    short_lengths = []
    for _, a, b in P.build_examples(iter([doc]), T, random.Random(11), stats):
        row, boundary = P.example_row(a, b, CLS, SEP)
        total += 1
        single += boundary == len(row)
        if len(row) < T:
            short += 1
            short_lengths.append(len(a) + len(b))
    assert total > 18_000
    assert abs(single / total - 0.10) < 0.012
    # P(short) = 0.05 * P(t <= T - 3) = 0.05 * 121/124 for t uniform in [5, T]
    assert abs(short / total - 0.05 * 121 / 124) < 0.008
    assert 55 < np.mean(short_lengths) < 75  # uniform on [5, 125]: mean 65
    assert abs(stats.single_segment_draws - single) <= 1 and stats.examples == total


# ------------------------------------------------------------------ corpus readers
def test_wikiextractor_documents_drop_titles_and_empty_articles():
    docs = list(wiki_documents(open(FIXTURES / "wiki_sample.txt", encoding="utf-8")))
    assert docs == [
        ["Anarchism is a political philosophy that advocates self-governed societies.",
         "Etymology and terminology.",
         'The term "anarchism" is a compound word composed from the word "anarchy" and the suffix "-ism".'],
        ["Autism is a neurodevelopmental disorder characterized by impaired social interaction.",
         "Diagnosis is based on behavior and not cause or mechanism."],
        ["A is the first letter and the first vowel of the ISO basic Latin alphabet.",
         "It is similar to the Ancient Greek letter alpha, from which it derives."],
    ]


def test_plain_text_blank_lines_separate_documents():
    text = "first line\n  second line  \n\n\n\nthird\r\n\nfourth\n"
    assert list(text_documents(text.split("\n"))) == [["first line", "second line"], ["third"], ["fourth"]]


def test_reader_handles_compression_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = (FIXTURES / "wiki_sample.txt").read_bytes()
    expected = list(wiki_documents(raw.decode("utf-8").split("\n")))
    for name, opener in (("w.gz", gzip.open), ("w.bz2", bz2.open), ("w.xz", lzma.open)):
        with opener(tmp_path / name, "wb") as f:
            f.write(raw)
        assert list(CorpusReader(resolve_inputs([str(tmp_path / name)])).documents()) == expected
    records = [{"text": "line one\nline two\n\nline three", "id": 1}, {"text": ""}, {"text": "only"}]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    assert list(CorpusReader(resolve_inputs([str(tmp_path / "r.jsonl")])).documents()) == [
        ["line one", "line two", "line three"], ["only"]]
    pq.write_table(pa.table({"text": ["a b\nc", None, "d"], "n": [1, 2, 3]}), tmp_path / "t.parquet")
    assert list(CorpusReader(resolve_inputs([str(tmp_path / "t.parquet")])).documents()) == [["a b", "c"], ["d"]]


def test_reader_skips_binary_and_non_utf8_files_and_counts_them(tmp_path):
    (tmp_path / "a.txt").write_text("good text\n", encoding="utf-8")
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 10)
    (tmp_path / "c.txt").write_bytes("caf\xe9 latin-1 text\n".encode("latin-1"))
    reader = CorpusReader(resolve_inputs([str(tmp_path)]))
    warnings: list[str] = []
    assert list(reader.documents(warnings.append)) == [["good text"]]
    reasons = {Path(s["path"]).name: s["reason"] for s in reader.stats.skipped}
    assert set(reasons) == {"b.bin", "c.txt"} and "binary" in reasons["b.bin"] and "UTF-8" in reasons["c.txt"]
    assert len(warnings) == 2


@pytest.mark.slow
def test_builtin_corpus_has_english_documents():
    docs = list(CorpusReader(resolve_inputs(["builtin"])).documents())
    assert len(docs) > 300
    text = " ".join(line for d in docs for line in d)
    assert len(text) > 1_000_000 and " the " in text


# ------------------------------------------------------------------ prepare end to end
def small_corpus(tmp_path: Path, n_docs: int = 120) -> Path:
    """A few hundred KB of English: pydoc topics rearranged into documents of paragraphs."""
    from pydoc_data.topics import topics

    paragraphs = [" ".join(p.split()) for t in sorted(topics) for p in topics[t].split("\n\n") if p.strip()]
    rng = random.Random(0)
    docs = ["\n".join(rng.sample(paragraphs, rng.randint(1, 12))) for _ in range(n_docs)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prepared")
    corpus = small_corpus(tmp)
    out = tmp / "data"
    manifest = P.prepare([str(corpus)], out, vocab_size=2000, seq_len=64, workers=1, quiet=True,
                         validation_fraction=0.1, seed=3)
    return corpus, out, manifest


def test_prepared_rows_equal_the_official_builder_on_the_tokenized_corpus(prepared):
    corpus, out, manifest = prepared
    data = D.PretrainData(out)
    tok = data.tokenizer
    docs = list(text_documents(corpus.read_text(encoding="utf-8").split("\n")))
    token_docs = [tok.encode_batch(d) for d in docs]
    # one chunk (the corpus is under 1 MiB): the builder's seed is (seed 3, chunk 0); held-out documents are drawn
    # from their own stream, so the full row sequence is the official builder's over all documents, split after
    assert len(corpus.read_text()) < P.CHUNK_CHARS
    expected = official_rows(token_docs, 64, random.Random("builder:3:0"), with_doc=True)
    val_rng = random.Random("validation:3:0")
    held_out = [val_rng.random() < 0.1 for _ in docs]
    assert manifest["documents"] == {"train": held_out.count(False), "validation": held_out.count(True)}
    n_train, n_val = data.num_rows("train"), data.num_rows("validation")
    for split, keep in (("train", False), ("validation", True)):
        b = data.batch(split, np.arange(data.num_rows(split)))
        rows = [(b.input_ids[i].tolist(), b.attention_mask[i].int().tolist(), b.token_type_ids[i].tolist())
                for i in range(len(b.input_ids))]
        assert rows == [ex for d, ex in expected if held_out[d] == keep]
        if split == "train":
            assert manifest["tokens"]["train"] == sum(sum(m) - 2 - (1 in t) for _, m, t in rows)
    assert n_val > 0
    assert manifest["line_tokens"] == sum(len(line) for d in token_docs for line in d)
    assert manifest["examples"] == {"train": n_train, "validation": n_val}
    assert manifest["tokenizer"]["fingerprint"] == tok.fingerprint()
    assert manifest["dtype"] == "uint16"


def test_output_is_byte_identical_for_any_number_of_workers(tmp_path):
    corpus = small_corpus(tmp_path, n_docs=200)
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        P.prepare([str(corpus)], out, vocab_size=1500, seq_len=32, workers=workers, quiet=True, chunk_chars=20_000,
                  rows_per_shard=700)
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir() if p.is_file() and p.name != "manifest.json")
    assert len([n for n in names if n.startswith("train-")]) >= 4  # several chunks and several shards
    assert names == sorted(p.name for p in outs[1].iterdir() if p.is_file() and p.name != "manifest.json")
    for n in names:
        assert (outs[0] / n).read_bytes() == (outs[1] / n).read_bytes(), n
    m0, m1 = (json.loads((o / "manifest.json").read_text()) for o in outs)
    for key in ("examples", "tokens", "documents", "tokenizer", "splits", "request"):
        assert m0[key] == m1[key]


def test_identical_request_is_a_cache_hit_and_a_different_one_needs_force(tmp_path):
    corpus = small_corpus(tmp_path, n_docs=30)
    out = tmp_path / "data"
    first = P.prepare([str(corpus)], out, vocab_size=1000, seq_len=32, quiet=True)
    stamp = (out / "train-00000.ids.npy").stat().st_mtime_ns
    again = P.prepare([str(corpus)], out, vocab_size=1000, seq_len=32, quiet=True)
    assert again == first and (out / "train-00000.ids.npy").stat().st_mtime_ns == stamp
    with pytest.raises(UserError, match="different dataset.*--force"):
        P.prepare([str(corpus)], out, vocab_size=1000, seq_len=48, quiet=True)
    replaced = P.prepare([str(corpus)], out, vocab_size=1000, seq_len=48, quiet=True, force=True)
    assert replaced["seq_len"] == 48 and D.PretrainData(out).seq_len == 48
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "data"]  # no temporary or old dirs left


def test_pretrain_data_rejects_a_directory_that_is_not_prepared(tmp_path):
    with pytest.raises(UserError, match="not a prepared data directory"):
        D.PretrainData(tmp_path)


# ------------------------------------------------------------------ loader
def expected_batch(ids: np.ndarray, meta: np.ndarray, T: int):
    """Mask and segment ids by hand, row by row."""
    mask = np.zeros((len(ids), T), dtype=bool)
    types = np.zeros((len(ids), T), dtype=np.int64)
    for r, (boundary, length) in enumerate(meta):
        mask[r, :length] = True
        types[r, boundary:length] = 1
    return ids.astype(np.int64), types, mask


def test_loader_batches_are_the_stored_rows_with_derived_masks(prepared):
    _, out, _ = prepared
    data = D.PretrainData(out)
    loader = D.BatchLoader(data, "train", batch_size=16, seed=5, prefetch=2)
    seen = []
    for _ in range(loader.batches_per_epoch):
        b = next(loader)
        assert b.input_ids.shape == (16, 64) and b.input_ids.dtype.is_floating_point is False
        rows = b.input_ids.numpy()
        order = np.random.default_rng([5, 0]).permutation(data.num_rows("train"))[len(seen) : len(seen) + 16]
        ids, types, mask = expected_batch(*data.rows("train", order), 64)
        assert (rows == ids).all() and (b.token_type_ids.numpy() == types).all()
        assert (b.attention_mask.numpy() == mask).all()
        assert (b.input_ids[:, 0] == CLS).all()
        seen += order.tolist()
    assert len(set(seen)) == len(seen) == loader.batches_per_epoch * 16  # each row at most once per epoch
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch_index"] == 0
    loader.close()


def test_loader_resumes_exactly_from_a_cursor_across_an_epoch_boundary(prepared):
    _, out, _ = prepared
    data = D.PretrainData(out)
    straight = D.BatchLoader(data, "train", batch_size=8, seed=1, prefetch=3)
    per_epoch = straight.batches_per_epoch
    reference = [next(straight).input_ids.clone() for _ in range(per_epoch + 5)]
    stop = per_epoch - 2
    first = D.BatchLoader(data, "train", batch_size=8, seed=1, prefetch=2)
    for _ in range(stop):
        next(first)
    cursor = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    first.close()
    for prefetch in (0, 2):
        resumed = D.BatchLoader(data, "train", batch_size=8, seed=1, prefetch=prefetch)
        resumed.load_state_dict(cursor)
        for k in range(stop, per_epoch + 5):
            assert (next(resumed).input_ids == reference[k]).all(), k
        resumed.close()
    straight.close()


def test_row_ranges_concatenate_to_the_global_batch(prepared):
    _, out, _ = prepared
    data = D.PretrainData(out)
    full = D.BatchLoader(data, "train", batch_size=12, seed=9, prefetch=0)
    halves = [D.BatchLoader(data, "train", batch_size=12, seed=9, row_range=r) for r in ((0, 5), (5, 12))]
    for _ in range(4):
        whole = next(full)
        parts = [next(h) for h in halves]
        for field in ("input_ids", "token_type_ids", "attention_mask"):
            assert (np.concatenate([getattr(p, field).numpy() for p in parts]) == getattr(whole, field).numpy()).all()
    for h in halves:
        h.close()


def test_loader_bad_input(prepared):
    _, out, _ = prepared
    data = D.PretrainData(out)
    with pytest.raises(UserError, match="fewer than one batch"):
        D.BatchLoader(data, "validation", batch_size=10_000, seed=0)
    with pytest.raises(UserError, match="no split"):
        data.num_rows("test")
    loader = D.BatchLoader(data, "train", batch_size=4, seed=0)
    with pytest.raises(UserError, match="batch_size"):
        loader.load_state_dict({"epoch": 0, "batch_index": 0, "batch_size": 8})


def test_prepare_with_a_sentencepiece_model_on_korean_japanese_chinese(tmp_path):
    import sentencepiece as spm

    lines = ["대한민국의 수도는 서울이다.", "한국어는 한글로 적는다.", "日本の首都は東京です。",
             "日本語は漢字と仮名で書く。", "中国的首都是北京。", "中文使用汉字书写。"]
    (tmp_path / "train.txt").write_text("\n".join(lines * 30) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(tmp_path / "train.txt"), model_prefix=str(tmp_path / "sp"), vocab_size=200, hard_vocab_limit=False,
        character_coverage=1.0, pad_id=3, unk_id=0, bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        minloglevel=2, num_threads=1,
    )
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join("\n".join(lines[i:] + lines[:i]) for i in range(6)) + "\n", encoding="utf-8")
    m = P.prepare([str(corpus)], tmp_path / "data", tokenizer_path=str(tmp_path / "sp.model"), seq_len=16,
                  validation_fraction=0.0, quiet=True)
    assert m["tokenizer"]["kind"] == "sentencepiece" and m["tokenizer"]["special_ids"]["pad"] == 3
    data = D.PretrainData(tmp_path / "data")
    b = data.batch("train", np.arange(data.num_rows("train")))
    tok = data.tokenizer
    for ids, mask in zip(b.input_ids.tolist(), b.attention_mask.tolist()):
        n = sum(mask)
        assert ids[0] == tok.cls_id and ids[n - 1] == tok.sep_id and all(i == 3 for i in ids[n:])
    text = "".join(tok.decode([i for i in row if i not in (tok.cls_id, tok.sep_id, 3)]) for row in b.input_ids.tolist())
    assert "서울" in text and "東京" in text and "北京" in text


def test_hf_source_reads_the_text_field_of_each_record(tmp_path, monkeypatch):
    """The `datasets` path with a stand-in for the hub (there is no network here)."""
    import types

    from pydoc_data.topics import topics

    calls = []

    def load_dataset(name, config=None, split=None, streaming=False):
        calls.append((name, config, split, streaming))
        return [{"text": topics[t], "title": t} for t in sorted(topics)[:40]]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    m = P.prepare(["hf:someone/corpus:clean"], tmp_path / "data", vocab_size=600, seq_len=32, quiet=True,
                  validation_fraction=0.0)
    assert calls[0] == ("someone/corpus", "clean", "train", True)
    assert m["documents"]["train"] == 40 and m["sources"][0]["kind"] == "hf"
    docs = list(CorpusReader(resolve_inputs(["hf:someone/corpus:clean"])).documents())
    assert docs[0] == [s for s in (line.strip() for line in topics[sorted(topics)[0]].split("\n")) if s]


def test_very_long_documents_are_cut_at_line_boundaries(monkeypatch, tmp_path):
    """A file without blank lines is one document; it is cut every MAX_DOCUMENT_CHARS (bounded memory, spread work)."""
    import tinyelectra.corpus as C

    monkeypatch.setattr(C, "MAX_DOCUMENT_CHARS", 100)
    lines = [f"line number {i} has some words" for i in range(40)]  # ~30 characters each
    (tmp_path / "one.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "r.jsonl").write_text(json.dumps({"text": "\n\n".join(lines)}) + "\n", encoding="utf-8")
    for name in ("one.txt", "r.jsonl"):
        reader = CorpusReader(resolve_inputs([str(tmp_path / name)]))
        docs = list(reader.documents())
        assert [line for d in docs for line in d] == lines  # nothing lost, order kept
        assert all(sum(map(len, d)) < 100 + 40 for d in docs) and len(docs) == 10
        assert reader.stats.documents_cut == 10  # every piece (4 lines, >= 100 characters) ends at the limit
