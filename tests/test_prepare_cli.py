"""`tinyelectra prepare` through the command line: the built-in corpus works offline, and each bad input gets one
line on stderr, exit code 2, no traceback and nothing half-written."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinyelectra import cli
from tinyelectra import data as D
from tinyelectra import prepare as P


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """The real entry point (`tinyelectra.cli.main`) in this process: exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["tinyelectra", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_failure(code: int, err: str, *expected: str) -> None:
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), err
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err
    for e in expected:
        assert e in errors[0], errors[0]


def nothing_left(parent: Path, out_name: str) -> None:
    assert not (parent / out_name).exists()
    assert not [p.name for p in parent.iterdir() if p.name.startswith(out_name + ".")]  # no .tmp-PID / .old-PID


def text_file(tmp_path: Path, name: str = "c.txt") -> Path:
    p = tmp_path / name
    p.write_text("\n\n".join(f"Document {i} has a first sentence.\nAnd a second sentence about item {i}."
                             for i in range(60)), encoding="utf-8")
    return p


def test_missing_path(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli(["prepare", "--corpus", str(tmp_path / "nope"), "--out", str(tmp_path / "out")], monkeypatch,
                           capsys)
    assert_clean_failure(code, err, "no such file or directory", "nope")
    nothing_left(tmp_path, "out")


def test_corpus_without_examples(tmp_path, monkeypatch, capsys):
    """Text of blank lines only: one line before any tokenizer is trained (before, a "training a 300-entry WordPiece
    ... Latin ()" line with an empty alphabet came first)."""
    (tmp_path / "empty.txt").write_text("\n\n   \n\n", encoding="utf-8")
    code, _, err = run_cli(["prepare", "--corpus", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "out"),
                            "--vocab-size", "300"], monkeypatch, capsys)
    assert_clean_failure(code, err, "no text to prepare", "1 input(s)")
    assert "training a" not in err and "()" not in err, err
    nothing_left(tmp_path, "out")


def test_binary_and_non_utf8_files_are_skipped_counted_and_warned(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text_file(corpus)
    (corpus / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    (corpus / "latin1.txt").write_bytes("Ein Text über Käse und Öl.\n".encode("latin-1") * 20)
    code, _, err = run_cli(["prepare", "--corpus", str(corpus), "--out", str(tmp_path / "out"), "--vocab-size", "300"],
                           monkeypatch, capsys)
    assert code == 0, err
    assert "warning: skipping" in err and "image.png" in err and "latin1.txt" in err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert {Path(s["path"]).name for s in manifest["skipped_inputs"]} == {"image.png", "latin1.txt"}
    # only binary input: skipped, so the corpus yields nothing -> a clean error
    code, _, err = run_cli(["prepare", "--corpus", str(corpus / "image.png"), "--out", str(tmp_path / "out2"),
                            "--vocab-size", "300"], monkeypatch, capsys)
    assert_clean_failure(code, err, "no text to prepare", "1 skipped", "image.png: looks binary")
    nothing_left(tmp_path, "out2")


def test_vocabulary_missing_a_special_token(tmp_path, monkeypatch, capsys):
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "a"]) + "\n",
                                        encoding="utf-8")
    code, _, err = run_cli(["prepare", "--corpus", str(text_file(tmp_path)), "--out", str(tmp_path / "out"),
                            "--tokenizer", str(tmp_path / "vocab.txt")], monkeypatch, capsys)
    assert_clean_failure(code, err, "[MASK]")
    nothing_left(tmp_path, "out")


@pytest.mark.parametrize("seq_len", ["7", "513"])
def test_seq_len_out_of_range(tmp_path, monkeypatch, capsys, seq_len):
    code, _, err = run_cli(["prepare", "--corpus", str(text_file(tmp_path)), "--out", str(tmp_path / "out"),
                            "--seq-len", seq_len], monkeypatch, capsys)
    assert_clean_failure(code, err, f"--seq-len {seq_len}", "between 8 and 512")
    nothing_left(tmp_path, "out")


def test_out_dir_with_a_different_dataset_needs_force(tmp_path, monkeypatch, capsys):
    corpus, out = text_file(tmp_path), tmp_path / "out"
    base = ["prepare", "--corpus", str(corpus), "--out", str(out), "--vocab-size", "300"]
    assert run_cli(base, monkeypatch, capsys)[0] == 0
    before = (out / "manifest.json").read_text()
    code, _, err = run_cli(base + ["--seq-len", "32"], monkeypatch, capsys)
    assert_clean_failure(code, err, "different dataset", "--force")
    assert (out / "manifest.json").read_text() == before  # untouched
    code, _, err = run_cli(base, monkeypatch, capsys)
    assert code == 0 and "reusing" in err  # the identical request is a cache hit
    assert run_cli(base + ["--seq-len", "32", "--force"], monkeypatch, capsys)[0] == 0
    assert json.loads((out / "manifest.json").read_text())["seq_len"] == 32
    (tmp_path / "notdata").mkdir()
    (tmp_path / "notdata" / "precious.txt").write_text("keep me")
    code, _, err = run_cli(["prepare", "--corpus", str(corpus), "--out", str(tmp_path / "notdata"), "--force"],
                           monkeypatch, capsys)
    assert_clean_failure(code, err, "not a tinyelectra dataset")
    assert (tmp_path / "notdata" / "precious.txt").read_text() == "keep me"


def test_disk_full_while_writing_leaves_nothing(tmp_path, monkeypatch, capsys):
    calls = []

    def full_disk(path, array):
        calls.append(path)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(P, "_write_npy", full_disk)
    code, _, err = run_cli(["prepare", "--corpus", str(text_file(tmp_path)), "--out", str(tmp_path / "out"),
                            "--vocab-size", "300"], monkeypatch, capsys)
    assert calls
    assert_clean_failure(code, err, "no space left on device")
    nothing_left(tmp_path, "out")


def test_hf_source_without_datasets_package(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    code, _, err = run_cli(["prepare", "--corpus", "hf:wikitext:wikitext-2-raw-v1", "--out", str(tmp_path / "out")],
                           monkeypatch, capsys)
    assert_clean_failure(code, err, "needs the `datasets` package")
    nothing_left(tmp_path, "out")


@pytest.mark.slow
@pytest.mark.cli
def test_hf_source_with_the_hub_unreachable(tmp_path):
    pytest.importorskip("datasets")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    r = subprocess.run([sys.executable, "-m", "tinyelectra", "prepare", "--corpus", "hf:no-such-user/no-such-dataset",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=600)
    assert_clean_failure(r.returncode, r.stderr, "could not load it from the Hugging Face hub")
    nothing_left(tmp_path, "out")


@pytest.mark.slow
@pytest.mark.cli
def test_builtin_corpus_through_the_real_command(tmp_path):
    """The quickstart's data step: offline, the quickstart recipe's settings, then a cache hit."""
    cmd = [sys.executable, "-m", "tinyelectra", "prepare", "--corpus", "builtin", "--out", str(tmp_path / "data"),
           "--vocab-size", "8192", "--seq-len", "64"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, r.stderr
    data = D.PretrainData(tmp_path / "data")
    m = data.manifest
    assert m["tokenizer"]["vocab_size"] == 8192 and m["seq_len"] == 64 and m["examples"]["train"] > 4000
    assert m["sources"][0]["kind"] == "builtin" and m["command"].startswith("tinyelectra prepare --corpus builtin")
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "reusing" in again.stderr


@pytest.mark.slow
@pytest.mark.cli
def test_killed_run_leaves_nothing_that_looks_complete(tmp_path):
    """SIGKILL in the middle of writing: OUT holds no manifest.json (never taken for a dataset), only the staging folder
    OUT/.staging.tmp-PID beside the lock and record the killed process left, which the next run removes."""
    import signal
    import time

    from pydoc_data.topics import topics

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(topics[t] for t in sorted(topics)) * 6, encoding="utf-8")  # ~3 MB
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tinyelectra", "prepare", "--corpus", str(corpus), "--out", str(out),
           "--vocab-size", "2000", "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # mid-way: tokenizer written
    while not list(out.glob(".staging.tmp-*/tokenizer/vocab.txt")) and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    assert [p.name for p in out.glob(".staging.tmp-*")] == [f".staging.tmp-{proc.pid}"]
    with pytest.raises(D.UserError, match="no manifest.json"):
        D.PretrainData(out)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert (out / "manifest.json").is_file() and not list(out.glob(".staging.tmp-*"))
    assert not (out / ".tinyelectra.lock").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "out"]


@pytest.mark.cli
@pytest.mark.slow
def test_help_shows_whole_option_names_at_80_columns_and_version():
    """`-h` works; option names are never cut ("--validation-fract…" was), even at 80 columns; --version prints it."""
    from tinyelectra import __version__

    env = {**os.environ, "COLUMNS": "80", "TERMINAL_WIDTH": "80",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for command, options in (("prepare", ["--validation-fraction", "--tokenizer-sample-mb", "--character-coverage",
                                          "--tokenizer-type", "--sentencepiece-model", "--no-byte-fallback",
                                          "--pack-documents", "--casing"]),
                             ("glue", ["--max-train-rows", "--task-file"]), ("export", ["--language", "--license"])):
        r = subprocess.run([sys.executable, "-m", "tinyelectra", command, "-h"], capture_output=True, text=True,
                           env=env, timeout=600)
        assert r.returncode == 0 and "…" not in r.stdout, r.stdout
        assert max(map(len, r.stdout.splitlines())) <= 80
        for option in options:
            assert option in r.stdout, (command, option)
    for command in ("prepare", "train", "flops", "recipe", "export", "glue", "report"):  # metavars, not Python types
        r = subprocess.run([sys.executable, "-m", "tinyelectra", command, "-h"], capture_output=True, text=True,
                           env=env, timeout=600)
        assert r.returncode == 0 and max(map(len, r.stdout.splitlines())) <= 80, r.stdout
        assert not re.search(r"<(list\[|str>|int>|float>|path>|bool>)", r.stdout, flags=re.IGNORECASE), r.stdout
    r = subprocess.run([sys.executable, "-m", "tinyelectra", "--version"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == f"tinyelectra {__version__}"


# ---------------------------------------------------------------------------------------------------------------
# what a cached dataset is checked against: before, an earlier tinyelectra's SentencePiece dataset (its model collapsed
# runs of spaces) was reused by the same command, and an `hf:DIR` folder's files were not part of the key


def test_sentencepiece_dataset_of_an_earlier_tinyelectra_is_not_reused(tmp_path, monkeypatch, capsys):
    rng = random.Random(0)  # text of 400 made-up words: enough pieces for a 200-entry model
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(400)]
    corpus, out = tmp_path / "c.txt", tmp_path / "out"
    corpus.write_text("\n\n".join(" ".join(rng.choices(words, k=12)) for _ in range(300)), encoding="utf-8")
    command = ["prepare", "--corpus", str(corpus), "--out", str(out), "--vocab-size", "200", "--seq-len", "32",
               "--tokenizer-type", "sentencepiece", "--no-byte-fallback"]
    assert run_cli(command, monkeypatch, capsys)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["request"]["tokenizer"].pop("version", None) == P.SENTENCEPIECE_TRAINING_VERSION
    # the request as a tinyelectra without the version wrote it
    (out / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli(command, monkeypatch, capsys)
    assert_clean_failure(code, err, "different dataset", "an earlier tinyelectra",
                         "tokenizer.version: None there, 2 now",
                         "--force")
    assert run_cli([*command, "--force"], monkeypatch, capsys)[0] == 0  # prepared again, with today's tokenizer
    assert json.loads((out / "manifest.json").read_text())["request"]["tokenizer"]["version"] == 2


def test_a_local_hf_folder_is_identified_by_its_files(tmp_path):
    """hf:DIR's cache key holds each file's path, size and modification time, as a local --corpus file's does; a hub
    dataset's name stays its key."""
    from tinyelectra.corpus import resolve_inputs

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"text": "one"}\n', encoding="utf-8")
    key = lambda: resolve_inputs([f"hf:{folder}"])[0].identity()  # noqa: E731
    first = key()
    assert first["local_files"] == [["train.jsonl", 16, (folder / "train.jsonl").stat().st_mtime_ns]]
    assert key() == first  # nothing changed: the same key
    os.utime(folder / "train.jsonl", ns=(1, 1))
    assert key()["local_files"] == [["train.jsonl", 16, 1]]  # touched
    (folder / "train.jsonl").write_text('{"text": "two!"}\n', encoding="utf-8")
    assert key()["local_files"][0][1] == 17  # rewritten
    (folder / "more.jsonl").write_text('{"text": "three"}\n', encoding="utf-8")
    assert [f[0] for f in key()["local_files"]] == ["more.jsonl", "train.jsonl"]  # a file added
    assert resolve_inputs(["hf:no-such-user/no-such-dataset"])[0].identity() == {
        "kind": "hf", "path": "no-such-user/no-such-dataset", "size_bytes": 0, "mtime_ns": 0}


@pytest.mark.slow
@pytest.mark.cli
def test_a_changed_local_hf_folder_is_not_reused(tmp_path, monkeypatch, capsys):
    """Prepared from hf:DIR (`datasets`, offline), then a record added: the same command does not reuse the dataset
    (before: "already holds this dataset: reusing it")."""
    pytest.importorskip("datasets")
    folder, out = tmp_path / "corpus", tmp_path / "out"
    folder.mkdir()
    records = "".join(json.dumps({"text": f"Document {i} has a first sentence.\nAnd a second one about {i}."}) + "\n"
                      for i in range(60))
    (folder / "train.jsonl").write_text(records, encoding="utf-8")
    command = ["prepare", "--corpus", f"hf:{folder}", "--out", str(out), "--vocab-size", "300", "--seq-len", "32"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    r = subprocess.run([sys.executable, "-m", "tinyelectra", *command], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    with (folder / "train.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "A record added later."}) + "\n")
    code, _, err = run_cli(command, monkeypatch, capsys)  # refused before the folder is read: no `datasets` needed
    assert_clean_failure(code, err, "different dataset", "local_files[0][1]", "--force")


def test_a_truncated_gz_keeps_the_text_before_the_damage_and_says_so(tmp_path, monkeypatch, capsys):
    """A .gz cut in half (a copy that stopped): the documents before the damage are prepared, the warning says so.
    Before, the warning said the file was read up to the damage while the whole of it was dropped (the 4 MiB read
    that met the damage lost what it had decompressed)."""
    import gzip

    text = "\n\n".join(f"Document {i} has a first sentence.\nAnd a second sentence about item {i}."
                       for i in range(2000))
    packed = gzip.compress(text.encode("utf-8"))
    (tmp_path / "cut.txt.gz").write_bytes(packed[: len(packed) // 2])
    code, _, err = run_cli(["prepare", "--corpus", str(tmp_path / "cut.txt.gz"), "--out", str(tmp_path / "out"),
                            "--vocab-size", "300"], monkeypatch, capsys)
    assert code == 0, err
    assert "the text before the damage is kept" in err and "cut.txt.gz" in err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    documents = sum(manifest["documents"].values())
    assert 300 < documents < 2000, documents  # about the first half, whole documents
    assert manifest["skipped_inputs"][0]["reason"].startswith("damaged after")


def test_a_corpus_without_held_out_rows_is_warned_about(tmp_path, monkeypatch, capsys):
    """60 documents at the default --validation-fraction 0.01: no document is held out, so no checkpoint can be
    evaluated; before, prepare said nothing."""
    code, _, err = run_cli(["prepare", "--corpus", str(text_file(tmp_path)), "--out", str(tmp_path / "out"),
                            "--vocab-size", "300"], monkeypatch, capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["examples"]["validation"] == 0
    assert "warning: no held-out rows (--validation-fraction 0.01): the checkpoints will not be evaluated" in err
    code, _, err = run_cli(["prepare", "--corpus", str(text_file(tmp_path)), "--out", str(tmp_path / "out2"),
                            "--vocab-size", "300", "--validation-fraction", "0.2"], monkeypatch, capsys)
    rows = json.loads((tmp_path / "out2" / "manifest.json").read_text())["examples"]["validation"]
    assert code == 0 and 0 < rows < D.MIN_HELDOUT_ROWS
    assert f"warning: only {rows} held-out rows (--validation-fraction 0.2): fewer than 100" in err


def test_an_unwritable_out_is_named_as_given(tmp_path, monkeypatch, capsys):
    """The line names the --out given (once, prepare wrote beside --out and named its parent, not what was typed; it
    now writes inside --out), and nothing is left there."""
    import tempfile

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    out = tmp_path / "ro" / "data"
    (tmp_path / "ro").mkdir()
    code, _, err = run_cli(["prepare", "--corpus", str(text_file(tmp_path)), "--out", str(out), "--vocab-size", "300"],
                           monkeypatch, capsys)
    assert_clean_failure(code, err, f"--out {out}: cannot write there (Permission denied)")
    nothing_left(tmp_path / "ro", "data")
