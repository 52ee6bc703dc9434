"""Tests of tinyelectra.glue_data: the task table, the classic glue_data reader (every real file, with the row
counts published in ../shared/data/README.md), small MNLI/QNLI/AX fixtures in the real format, bad input, the
Hugging Face path (offline here), pair encoding against BERT's own tokenizer, and GLUE submission files."""

from __future__ import annotations

import csv
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyelectra.errors import UserError
from tinyelectra.glue_data import (
    GLUE_TASK_NAMES,
    TASKS,
    GlueSplit,
    MalformedLine,
    encode_pairs,
    encode_split,
    find_split_file,
    from_hf_dataset,
    get_task,
    load_hf_split,
    read_split,
    read_tsv,
    resolve_tasks,
    split_file,
    truncate_pair_lengths,
    with_swapped_pairs,
    write_submission,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "glue"
SHARED_DATA = Path(os.environ.get("TINYELECTRA_SHARED_DATA",
                                  Path(__file__).resolve().parents[1].parent / "shared" / "data"))
GLUE_DIR = SHARED_DATA / "glue"
needs_glue = pytest.mark.skipif(not GLUE_DIR.is_dir(), reason=f"real GLUE data not found at {GLUE_DIR}")


# ------------------------------------------------------------------------------------------------------------
# Task table: facts from GLUE's submission format (jiant's formatter), the HF builder and the paper
# ------------------------------------------------------------------------------------------------------------


def test_task_table_submission_names_and_labels():
    expected_files = {
        ("cola", "test"): "CoLA.tsv", ("sst2", "test"): "SST-2.tsv", ("mrpc", "test"): "MRPC.tsv",
        ("stsb", "test"): "STS-B.tsv", ("qqp", "test"): "QQP.tsv", ("mnli", "test_matched"): "MNLI-m.tsv",
        ("mnli", "test_mismatched"): "MNLI-mm.tsv", ("qnli", "test"): "QNLI.tsv", ("rte", "test"): "RTE.tsv",
        ("wnli", "test"): "WNLI.tsv", ("ax", "test"): "AX.tsv",
    }
    got = {(t.name, s): f for t in TASKS.values() for s, f in t.submission_files.items()}
    assert got == expected_files
    # Labels as the submission expects them: strings for the NLI tasks, 0/1 for the others; STS-B a score.
    assert TASKS["mnli"].file_labels == TASKS["ax"].file_labels == ("entailment", "neutral", "contradiction")
    assert TASKS["rte"].file_labels == TASKS["qnli"].file_labels == ("entailment", "not_entailment")
    for t in ("cola", "sst2", "mrpc", "qqp", "wnli"):
        assert TASKS[t].file_labels == ("0", "1")
    assert TASKS["stsb"].is_regression and TASKS["stsb"].num_labels == 1
    # Hugging Face ClassLabel names (class 1 is the positive class of F1 for MRPC and QQP).
    assert TASKS["mrpc"].label_names == ("not_equivalent", "equivalent")
    assert TASKS["qqp"].label_names == ("not_duplicate", "duplicate")
    assert TASKS["wnli"].label_names == ("not_entailment", "entailment")
    # Paper protocol (its fine-tuning appendix): 10 epochs for RTE and STS-B, swapped pairs for MRPC and STS-B.
    assert {t.name for t in TASKS.values() if t.epochs == 10} == {"rte", "stsb"}
    assert {t.name for t in TASKS.values() if t.swap_pairs} == {"mrpc", "stsb"}
    assert {t.name: (t.paper_metric, t.glue_metric) for t in TASKS.values()
            if t.name in ("cola", "stsb", "mrpc", "qqp")} == {
        "cola": ("matthews_corr", "matthews_corr"), "stsb": ("spearman", "pearson_spearman_mean"),
        "mrpc": ("accuracy", "f1_accuracy_mean"), "qqp": ("accuracy", "f1_accuracy_mean"),
    }
    assert TASKS["mnli"].dev_splits == ("dev_matched", "dev_mismatched")
    assert TASKS["mnli"].primary_dev_split == "dev_matched"


def test_resolve_tasks_and_names():
    assert resolve_tasks("all") == list(GLUE_TASK_NAMES)
    assert resolve_tasks("SST-2, sts-b,CoLA,sst2") == ["sst2", "stsb", "cola"]
    assert get_task("MNLI").name == "mnli"
    with pytest.raises(UserError, match="unknown GLUE task 'squad'"):
        resolve_tasks("rte,squad")
    with pytest.raises(UserError, match="names no task"):
        resolve_tasks(" , ")


# ------------------------------------------------------------------------------------------------------------
# Every real file: row counts from ../shared/data/README.md
# ------------------------------------------------------------------------------------------------------------

README_ROWS = [
    ("cola", "train", 8551), ("cola", "dev", 1043), ("cola", "test", 1063),
    ("sst2", "train", 67349), ("sst2", "dev", 872), ("sst2", "test", 1821),
    ("mrpc", "train", 3668), ("mrpc", "dev", 408), ("mrpc", "test", 1725),
    ("stsb", "train", 5749), ("stsb", "dev", 1500), ("stsb", "test", 1379),
    ("rte", "train", 2490), ("rte", "dev", 277), ("rte", "test", 3000),
    ("wnli", "train", 635), ("wnli", "dev", 71), ("wnli", "test", 146),
    ("qnli", "dev", 5463), ("qnli", "test", 5463),
]


@needs_glue
@pytest.mark.parametrize("task,split,rows", README_ROWS)
def test_real_glue_row_counts(task, split, rows):
    data = read_split(GLUE_DIR, task, split)
    assert len(data) == rows
    assert data.malformed == [] and len(data.ids) == len(data.text_a) == rows
    assert (data.text_b is not None) == TASKS[task].is_pair
    if split == "test":
        assert data.labels is None
        assert data.ids[:3] == ["0", "1", "2"]  # the test files' index column
    else:
        assert len(data.labels) == rows
        if TASKS[task].is_regression:
            assert data.labels.dtype == np.float32 and 0.0 <= data.labels.min() and data.labels.max() <= 5.0
        else:
            assert set(np.unique(data.labels)) == set(range(TASKS[task].num_labels))  # every class occurs


@needs_glue
def test_real_glue_quirks():
    # CoLA train has no header: its first line is data (label 1, sentence in column 4).
    cola = read_split(GLUE_DIR, "cola", "train")
    assert cola.text_a[0] == "Our friends won't buy this analysis, let alone the next one we propose."
    assert cola.labels[0] == 1
    # MRPC's header starts with a UTF-8 BOM; "Quality" must still be found. Its dev row 1 has an unbalanced quote.
    assert (GLUE_DIR / "MRPC" / "dev.tsv").read_bytes().startswith(b"\xef\xbb\xbf")
    mrpc = read_split(GLUE_DIR, "mrpc", "dev")
    assert mrpc.labels[:2].tolist() == [1, 0]
    assert mrpc.text_b[0] == '"The foodservice pie business does not fit our long-term growth strategy.'
    # STS-B: ten columns, the score last.
    stsb = read_split(GLUE_DIR, "stsb", "dev")
    assert (stsb.text_a[0], stsb.text_b[0], float(stsb.labels[0])) == (
        "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)
    # RTE labels are strings in the file: "not_entailment" is class 1.
    assert read_split(GLUE_DIR, "rte", "dev").labels[0] == 1


@needs_glue
def test_real_qqp_partial_reports_the_malformed_line():
    path = GLUE_DIR / "QQP" / "dev.partial.tsv"
    data = read_tsv(path, "qqp", "dev")
    # README: 23,497 rows, line 1 has a space where a tab belongs -> 23,496 read, line 1 reported.
    assert len(data) == 23496
    assert [(m.path, m.line_number, m.reason) for m in data.malformed] == [(str(path), 1, "5 fields, expected 6")]
    assert "1 malformed line skipped (line 1: 5 fields, expected 6)" in data.summary()
    assert data.text_a[0] == "What causes stool color to change to yellow?" and data.ids[0] == "360472"
    # And the standard name is not there: QQP has no train/dev/test in this copy.
    assert find_split_file(GLUE_DIR, "qqp", "dev") is None


@needs_glue
def test_real_files_agree_with_csv_quote_none():
    """Independent reader: csv with QUOTE_NONE gives the same rows (quoting on would not, see fixture test)."""
    path = GLUE_DIR / "SST-2" / "dev.tsv"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    data = read_split(GLUE_DIR, "sst2", "dev")
    assert data.text_a == [r[0] for r in rows]
    assert data.labels.tolist() == [int(r[1]) for r in rows]


# ------------------------------------------------------------------------------------------------------------
# Fixtures in the real format (MNLI, QNLI, AX are not in the shared data)
# ------------------------------------------------------------------------------------------------------------


def test_mnli_fixture_matched_and_mismatched():
    counts = {"train": 6, "dev_matched": 4, "dev_mismatched": 3, "test_matched": 3, "test_mismatched": 2}
    for split, n in counts.items():
        assert len(read_split(FIXTURES, "mnli", split)) == n
    train = read_split(FIXTURES, "mnli", "train")  # 12 columns: texts in 9 and 10, gold_label last
    assert train.text_a[0] == "The old lighthouse keeper climbed the stairs every night."
    assert train.labels.tolist() == [2, 0, 0, 1, 2, 1]  # entailment 0, neutral 1, contradiction 2
    assert train.text_a[2] == 'Critics called the film "a quiet triumph" last week.'  # quotes kept as text
    dev = read_split(FIXTURES, "mnli", "dev_matched")  # 16 columns: label1..label5 then gold_label
    assert dev.labels.tolist() == [1, 0, 2, 2]
    test = read_split(FIXTURES, "mnli", "test_mismatched")
    assert test.labels is None and test.ids == ["0", "1"] and test.text_b[1] == "They have lived here for a decade."


def test_qnli_fixture_unbalanced_quote():
    # With csv's default quoting the unbalanced '"' in row 3 swallows row 4; quoting must be off.
    with open(FIXTURES / "QNLI" / "train.tsv", newline="", encoding="utf-8") as f:
        assert len(list(csv.reader(f, delimiter="\t"))) - 1 == 4
    train = read_split(FIXTURES, "qnli", "train")
    assert len(train) == 5
    assert train.text_b[3] == "\"In the 1890s the town's population grew quickly."
    assert train.labels.tolist() == [0, 1, 0, 1, 0]
    assert train.text_b[4].endswith("3\u20131.")  # UTF-8 text survives
    assert len(read_split(FIXTURES, "qnli", "dev")) == 3 and len(read_split(FIXTURES, "qnli", "test")) == 2


def test_one_bad_line_is_reported_not_fatal():
    path = FIXTURES / "bad" / "rte_one_bad_line.tsv"
    data = read_tsv(path, "rte", "dev")
    assert data.ids == ["0", "2", "4"] and data.labels.tolist() == [0, 1, 0]
    assert [(m.line_number, m.reason) for m in data.malformed] == [
        (3, "3 fields, expected 4"),
        (6, "label 'maybe' is not one of entailment, not_entailment"),
    ]
    assert data.blank_lines == 1
    assert data.summary().startswith(f"rte dev: 3 rows from {path}; 2 malformed lines skipped (line 3:")


def test_select_takes_rows():
    data = read_split(FIXTURES, "mnli", "train").select([4, 0])
    assert data.labels.tolist() == [2, 2] and data.ids == ["4", "0"]


# ------------------------------------------------------------------------------------------------------------
# Bad input: one clear line each
# ------------------------------------------------------------------------------------------------------------


def test_missing_task_directory_names_expected_files():
    with pytest.raises(UserError) as e:
        read_split(FIXTURES, "rte", "train")
    msg = str(e.value)
    assert "no folder RTE in" in msg and "RTE/train.tsv, RTE/dev.tsv, RTE/test.tsv" in msg and "\n" not in msg


def test_missing_file_and_missing_glue_dir(tmp_path):
    (tmp_path / "QNLI").mkdir()
    (tmp_path / "QNLI" / "dev.tsv").write_text("index\tquestion\tsentence\tlabel\n")
    (tmp_path / "QNLI" / "test.tsv").write_text("index\tquestion\tsentence\n")
    with pytest.raises(UserError, match=r"QNLI/train.tsv not found .*QNLI holds dev.tsv, test.tsv"):
        split_file(tmp_path, "qnli", "train")
    assert find_split_file(tmp_path, "qnli", "train") is None
    assert find_split_file(tmp_path, "qnli", "dev") == tmp_path / "QNLI" / "dev.tsv"
    with pytest.raises(UserError, match="does not exist"):
        read_split(tmp_path / "nope", "rte", "dev")
    with pytest.raises(UserError, match="has no split 'dev'"):
        read_split(FIXTURES, "mnli", "dev")


def test_folder_names_are_matched_loosely(tmp_path):
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "dev.tsv").write_text("sentence\tlabel\ngood film \t1\n")
    assert read_split(tmp_path, "sst-2", "dev").labels.tolist() == [1]


def test_wrong_header_is_a_user_error():
    with pytest.raises(UserError) as e:
        read_tsv(FIXTURES / "bad" / "rte_wrong_header.tsv", "rte", "train")
    msg = str(e.value)
    assert "expected a header with columns sentence1, sentence2, label" in msg and "missing sentence1, sentence2" in msg


def test_mostly_short_rows_is_a_user_error():
    with pytest.raises(UserError, match=r"4 of 5 rows are malformed .*line 3: 1 field, expected 2.*sst2 dev file"):
        read_tsv(FIXTURES / "bad" / "sst2_too_few_fields.tsv", "sst2", "dev")


def test_wrong_task_file_and_empty_file(tmp_path):
    with pytest.raises(UserError, match="expected a header"):  # a QNLI file read as RTE: no sentence1/sentence2
        read_tsv(FIXTURES / "QNLI" / "train.tsv", "rte", "train")
    empty = tmp_path / "dev.tsv"
    empty.write_text("index\tsentence1\tsentence2\tlabel\n")
    with pytest.raises(UserError, match="no data rows"):
        read_tsv(empty, "rte", "dev")
    bad_score = tmp_path / "stsb.tsv"
    bad_score.write_text("index\tsentence1\tsentence2\tscore\n0\ta\tb\t3.5\n1\ta\tb\t7\n2\ta\tb\tx\n3\ta\tb\t0\n")
    data = read_tsv(bad_score, "stsb", "dev")
    assert data.labels.tolist() == [3.5, 0.0]
    assert [m.reason for m in data.malformed] == ["score 7 outside [0, 5]", "score 'x' is not a number"]


# ------------------------------------------------------------------------------------------------------------
# Hugging Face datasets (no hub here: conversion with an in-memory dataset, errors for the rest)
# ------------------------------------------------------------------------------------------------------------


def test_hf_dataset_conversion_maps_labels_by_name():
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({
        "question": datasets.Value("string"), "sentence": datasets.Value("string"),
        # A ClassLabel in the reverse order of ours: ids must be mapped by name.
        "label": datasets.ClassLabel(names=["not_entailment", "entailment"]), "idx": datasets.Value("int32"),
    })
    ds = datasets.Dataset.from_dict(
        {"question": ["q0", "q1", "q2"], "sentence": ["s0", "s1", "s2"], "label": [1, 0, -1], "idx": [7, 8, 9]},
        features=features,
    )
    data = from_hf_dataset(ds, "qnli", "dev", source="hf:test")
    assert data.labels.tolist() == [0, 1]  # entailment -> 0, not_entailment -> 1 (our order)
    assert data.ids == ["7", "8"] and data.text_a == ["q0", "q1"] and data.text_b == ["s0", "s1"]
    assert [(m.line_number, m.reason) for m in data.malformed] == [(3, "label -1 missing or out of range")]
    stsb = datasets.Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [2.5], "idx": [0]})
    assert from_hf_dataset(stsb, "stsb", "train", source="hf:test").labels.tolist() == [2.5]
    with pytest.raises(UserError, match="columns hypothesis missing"):
        from_hf_dataset(datasets.Dataset.from_dict({"premise": ["a"], "label": [0]}), "mnli", "train", source="hf:x")


def test_hf_load_errors_are_user_errors(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(UserError,
                       match=r"could not load nyu-mll/glue 'mnli' split 'validation_mismatched'.*--glue-dir"):
        load_hf_split("mnli", "dev_mismatched")
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(UserError, match="needs the `datasets` package"):
        load_hf_split("rte", "train")


@pytest.mark.cli
def test_hf_offline_mode_gives_one_line():
    pytest.importorskip("datasets")
    code = (
        "from tinyelectra.glue_data import load_hf_split\n"
        "from tinyelectra.errors import UserError\n"
        "try:\n    load_hf_split('rte', 'dev')\nexcept UserError as e:\n    print('USERERROR', e)\n"
    )
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    lines = [x for x in out.stdout.splitlines() if x.startswith("USERERROR")]
    assert len(lines) == 1, out.stdout + out.stderr
    assert "could not load nyu-mll/glue 'rte' split 'validation'" in lines[0], out.stdout + out.stderr


# ------------------------------------------------------------------------------------------------------------
# Pair encoding
# ------------------------------------------------------------------------------------------------------------

WORDS = "the a cat dog sat on mat run ##s ##ing walk house big small red blue green tree river bank money".split()
VOCAB = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [",", "."]


class WordPieceStandIn:
    """The duck-typed interface of tinyelectra.tokenizer.Tokenizer, on an HF `tokenizers` WordPiece."""

    def __init__(self, vocab_file: Path):
        from tokenizers import Tokenizer
        from tokenizers.models import WordPiece
        from tokenizers.normalizers import BertNormalizer
        from tokenizers.pre_tokenizers import BertPreTokenizer

        self.tokenizer = Tokenizer(WordPiece.from_file(str(vocab_file), unk_token="[UNK]"))
        self.tokenizer.normalizer = BertNormalizer(lowercase=True)
        self.tokenizer.pre_tokenizer = BertPreTokenizer()
        self.cls_id, self.sep_id, self.pad_id = VOCAB.index("[CLS]"), VOCAB.index("[SEP]"), VOCAB.index("[PAD]")

    def encode_batch(self, texts):
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return path


def bert_truncate_loop(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """BERT's / ELECTRA's `_truncate_seq_pair`, literally: pop from the longer list, from B on a tie."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def test_truncation_closed_form_equals_berts_loop():
    la, lb = np.meshgrid(np.arange(0, 41), np.arange(0, 41), indexing="ij")
    for budget in (0, 1, 5, 10, 11, 25, 125):
        keep_a, keep_b = truncate_pair_lengths(la.ravel(), lb.ravel(), budget)
        expected = [bert_truncate_loop(a, b, budget) for a, b in zip(la.ravel().tolist(), lb.ravel().tolist())]
        assert list(zip(keep_a.tolist(), keep_b.tolist())) == expected


def test_pair_encoding_matches_berts_python_tokenizer(vocab_file):
    transformers = pytest.importorskip("transformers")
    # BERT's original (Python) tokenizer: transformers 5 calls it BertTokenizerLegacy, 4.x BertTokenizer.
    # (The Rust "fast" tokenizer breaks length ties the other way, so it is not the reference.)
    reference_cls = getattr(transformers, "BertTokenizerLegacy", None) or transformers.BertTokenizer
    transformers.logging.set_verbosity_error()
    reference = reference_cls(vocab_file=str(vocab_file), do_lower_case=True)
    ours = WordPieceStandIn(vocab_file)
    rng = random.Random(0)
    vocabulary = [w for w in WORDS if not w.startswith("##")] + ["runs", "walking", "zebra", ",", "."]
    text_a = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 24))) for _ in range(300)]
    text_b = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 24))) for _ in range(300)]
    for max_length in (8, 17, 32):
        encoded = encode_pairs(ours, text_a, text_b, max_length=max_length)
        for i in range(len(text_a)):
            ref = reference(text_a[i], text_b[i], truncation="longest_first", max_length=max_length,
                            return_token_type_ids=True)
            row = encoded.batch([i])
            assert row.input_ids[0].tolist() == ref["input_ids"]
            assert row.token_type_ids[0].tolist() == ref["token_type_ids"]
        single = encode_pairs(ours, text_a, None, max_length=max_length)
        for i in range(0, len(text_a), 7):
            ref = reference(text_a[i], truncation=True, max_length=max_length, return_token_type_ids=True)
            assert single.batch([i]).input_ids[0].tolist() == ref["input_ids"]


def test_pair_encoding_with_project_tokenizer(vocab_file):
    """tinyelectra.tokenizer.Tokenizer fits the duck-typed interface and encodes as the stand-in does."""
    tokenizer_module = pytest.importorskip("tinyelectra.tokenizer", reason="tinyelectra.tokenizer not written yet")
    tok = tokenizer_module.Tokenizer.load(vocab_file)
    texts_a, texts_b = ["The cat sat on the mat.", "A big dog runs"], ["Dogs walking", "the river bank, money"]
    ours = encode_pairs(tok, texts_a, texts_b, max_length=9)
    standin = encode_pairs(WordPieceStandIn(vocab_file), texts_a, texts_b, max_length=9)
    assert ours.token_ids.tolist() == standin.token_ids.tolist()
    assert ours.segment_a_lengths.tolist() == standin.segment_a_lengths.tolist()


def test_dynamic_and_fixed_padding(vocab_file):
    tok = WordPieceStandIn(vocab_file)
    # Token counts (no specials): "the cat sat" 3, "dog" 1, "big red house on the river bank" 7, "walking" 2.
    enc = encode_pairs(tok, ["the cat sat", "big red house on the river bank"], ["dog", "walking"],
                       labels=np.array([1, 0]), max_length=128)
    assert enc.lengths.tolist() == [3 + 1 + 3, 7 + 2 + 3] and enc.truncated == 0
    batch = enc.batch([0, 1])
    assert batch.input_ids.shape == (2, 12)  # the batch's longest: 1 + 7 + 1 + 2 + 1
    assert batch.input_ids.dtype == np.int64
    assert batch.attention_mask.sum(axis=1).tolist() == [7, 12]
    # [CLS] the cat sat [SEP] | dog [SEP] | pad
    assert batch.token_type_ids[0].tolist() == [0, 0, 0, 0, 0, 1, 1] + [0] * 5
    assert batch.input_ids[0, 7:].tolist() == [tok.pad_id] * 5
    assert batch.labels.tolist() == [1, 0]
    assert enc.batch([0]).input_ids.shape == (1, 7)
    fixed = enc.batch([0], pad_to=128)
    assert fixed.input_ids.shape == (1, 128) and fixed.attention_mask.sum() == 7
    with pytest.raises(ValueError, match="shorter than"):
        enc.batch([1], pad_to=8)
    truncated = encode_pairs(tok, ["big red house on the river bank"], ["dog"], max_length=6)
    assert truncated.truncated == 1 and truncated.lengths.tolist() == [6]


def test_encoder_rejects_tokenizer_that_adds_specials(vocab_file):
    class AddsSpecials(WordPieceStandIn):
        def encode_batch(self, texts):
            return [[self.cls_id, *ids, self.sep_id] for ids in super().encode_batch(texts)]

    with pytest.raises(ValueError, match="without them"):
        encode_pairs(AddsSpecials(vocab_file), ["the cat", "a dog"], ["sat", "ran"])


def test_encode_split_and_swapped_pairs(vocab_file):
    train = read_split(FIXTURES, "qnli", "train")
    doubled = with_swapped_pairs(train)
    assert len(doubled) == 10
    assert doubled.text_a[5:] == train.text_b and doubled.text_b[5:] == train.text_a
    assert doubled.labels.tolist() == train.labels.tolist() * 2
    assert doubled.ids[5] == "0-swapped"
    enc = encode_split(WordPieceStandIn(vocab_file), doubled)
    assert len(enc) == 10 and enc.labels.tolist() == doubled.labels.tolist()
    # (A, B) and (B, A) hold the same tokens with the segments exchanged.
    i, j = 0, 5
    a = enc.token_ids[enc.offsets[i]:enc.offsets[i + 1]].tolist()
    b = enc.token_ids[enc.offsets[j]:enc.offsets[j + 1]].tolist()
    assert sorted(a) == sorted(b) and a != b
    with pytest.raises(ValueError, match="training augmentation"):
        with_swapped_pairs(read_split(FIXTURES, "qnli", "dev"))
    single = GlueSplit(task=TASKS["sst2"], split="train", source="x", ids=["0"], text_a=["a"], text_b=None,
                       labels=np.array([1]))
    with pytest.raises(ValueError, match="single sentences"):
        with_swapped_pairs(single)


# ------------------------------------------------------------------------------------------------------------
# Submission files
# ------------------------------------------------------------------------------------------------------------


def read_submission(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


def test_submission_mnli_and_ax_fixtures(tmp_path):
    test_m = read_split(FIXTURES, "mnli", "test_matched")
    path = write_submission(tmp_path, test_m, np.array([[0.1, 2.0, 0.3], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))
    assert path.name == "MNLI-m.tsv"
    assert read_submission(path) == [["index", "prediction"], ["0", "neutral"], ["1", "entailment"],
                                     ["2", "contradiction"]]
    path = write_submission(tmp_path, read_split(FIXTURES, "mnli", "test_mismatched"), [2, 2])
    assert path.name == "MNLI-mm.tsv" and len(read_submission(path)) == 1 + 2
    ax = read_split(FIXTURES, "ax", "test")
    path = write_submission(tmp_path, ax, [0, 1, 2, 0])
    assert path.name == "AX.tsv" and [r[1] for r in read_submission(path)[1:]] == [
        "entailment", "neutral", "contradiction", "entailment"]
    qnli = read_split(FIXTURES, "qnli", "test")
    assert read_submission(write_submission(tmp_path, qnli, [1, 0]))[1:] == [
        ["0", "not_entailment"], ["1", "entailment"]]
    # no temp files left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "QNLI.tsv"]


@needs_glue
def test_submission_real_test_sets(tmp_path):
    expectations = {"rte": ("RTE.tsv", {"entailment", "not_entailment"}), "cola": ("CoLA.tsv", {"0", "1"}),
                    "sst2": ("SST-2.tsv", {"0", "1"}), "mrpc": ("MRPC.tsv", {"0", "1"}),
                    "wnli": ("WNLI.tsv", {"0", "1"})}
    rng = np.random.default_rng(0)
    for task, (name, labels) in expectations.items():
        test = read_split(GLUE_DIR, task, "test")
        rows = read_submission(write_submission(tmp_path, test, rng.integers(0, 2, len(test))))
        assert rows[0] == ["index", "prediction"] and len(rows) - 1 == len(test)
        assert {r[1] for r in rows[1:]} == labels
        assert [r[0] for r in rows[1:]] == test.ids and (tmp_path / name).exists()
    stsb = read_split(GLUE_DIR, "stsb", "test")
    rows = read_submission(write_submission(tmp_path, stsb, rng.uniform(0, 5, (len(stsb), 1))))
    assert len(rows) - 1 == 1379 and all(len(r[1].split(".")[1]) == 3 for r in rows[1:])


def test_submission_rejects_bad_predictions(tmp_path):
    test = read_split(FIXTURES, "qnli", "test")
    with pytest.raises(ValueError, match="1 predictions for 2"):
        write_submission(tmp_path, test, [0])
    with pytest.raises(ValueError, match="class ids must be in 0..1"):
        write_submission(tmp_path, test, [0, 2])
    with pytest.raises(ValueError, match="not a test split"):
        write_submission(tmp_path, read_split(FIXTURES, "qnli", "dev"), [0, 1, 0])
    damaged = read_split(FIXTURES, "qnli", "test")
    damaged.malformed.append(MalformedLine("x.tsv", 3, "2 fields, expected 3"))
    with pytest.raises(UserError, match="cannot write a complete QNLI.tsv"):
        write_submission(tmp_path, damaged, [0, 1])
    assert list(tmp_path.iterdir()) == []


def test_line_endings_bom_and_stray_carriage_return(tmp_path):
    path = tmp_path / "dev.tsv"
    # A BOM before the header, Windows line ends, and a lone "\r" inside a text field (must not split the row).
    path.write_bytes(b"\xef\xbb\xbfindex\tsentence1\tsentence2\tlabel\r\n0\tA\rB\tC\tentailment\r\n1\tD\tE\tnot_entailment")
    data = read_tsv(path, "rte", "dev")
    assert data.text_a == ["A\rB", "D"] and data.labels.tolist() == [0, 1] and data.malformed == []
    path.write_bytes(b"index\tsentence1\tsentence2\tlabel\n0\t\xff\xfe\tC\tentailment\n1\tD\tE\tentailment\n2\tF\tG\tentailment\n")
    data = read_tsv(path, "rte", "dev")
    assert [(m.line_number, m.reason) for m in data.malformed] == [(2, "not valid UTF-8")] and len(data) == 2
