"""`tinyelectra glue --task-file`: tasks of one's own (KLUE, JGLUE, CLUE, ASSIN style) from TSV, CSV and JSONL files,
fine-tuned with the same protocol, seeds, glue.json, submission files and report as GLUE's; plain progress lines when
the output is not a terminal; files readable by others (0644 under umask 022); one-line errors for bad task files.

The tasks are synthetic ones a model must learn (test_glue's cue-word sentiment, written in each format), on
test_glue's miniature random-weight checkpoint.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import stat
import sys
from pathlib import Path

import pytest

from test_glue import make_checkpoint, one_thread, sentiment_sentence  # noqa: F401  (one_thread: autouse)
from tinyelectra.errors import UserError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt-10000")


@pytest.fixture(autouse=True)
def usual_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def rows(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    labels = [i % 2 for i in range(n)]
    rng.shuffle(labels)
    return [(sentiment_sentence(rng, y), "positivo" if y else "negativo") for y in labels]


def write_tsv(path: Path, data: list[tuple[str, str]], with_label: bool = True) -> Path:
    lines = ["id\tfrase\trótulo" if with_label else "id\tfrase"]
    lines += [f"r{i}\t{t}\t{y}" if with_label else f"r{i}\t{t}" for i, (t, y) in enumerate(data)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def task_file(path: Path, **fields) -> Path:
    path.write_text("".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n" for k, v in fields.items()),
                    encoding="utf-8")
    return path


def run(ckpt: Path, out: Path, files: list[Path], seeds: int = 1, **kw) -> list[Path]:
    from tinyelectra.glue import GlueSettings, glue_command

    return glue_command(GlueSettings(checkpoint=ckpt, glue_dir=kw.get("glue_dir"), use_hf=False,
                                     tasks=kw.get("tasks", "all"),
                                     seeds=seeds, out_dir=out, gpu=None, device="cpu",
                                     max_train_rows=kw.get("max_train_rows"),
                                     overrides=kw.get("overrides", []), command="pytest", task_files=files,
                                     skip_bad_labels=bool(kw.get("skip_bad_labels"))))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_a_tsv_task_of_ones_own_learns_with_the_glue_protocol(ckpt, tmp_path, capsys):
    """A 2-class TSV task (Portuguese labels, a header, an id column, a test file): accuracy >= 90% on 200 balanced
    dev rows (chance 50%), test predictions in the submission format, the report shows it; files 0644; plain
    progress lines because pytest's output is not a terminal."""
    data = tmp_path / "sentimento"
    data.mkdir()
    write_tsv(data / "treino.tsv", rows(480, 0))
    write_tsv(data / "validacao.tsv", rows(200, 1))
    write_tsv(data / "teste.tsv", rows(20, 2), with_label=False)
    spec = task_file(tmp_path / "sentimento.toml", name="sentimento", train="sentimento/treino.tsv",
                     dev="sentimento/validacao.tsv", test="sentimento/teste.tsv", text_columns=["frase"],
                     label_column="rótulo", metric="accuracy", epochs=8, index_column="id")
    capsys.readouterr()
    paths = run(ckpt, tmp_path / "out", [spec], seeds=2)
    said = capsys.readouterr().out
    r = json.loads(paths[0].read_text())
    t = r["tasks"]["sentimento"]
    assert t["paper_metric"] == t["glue_metric"] == "accuracy" and t["steps"] == 120 and len(t["seeds"]) == 2
    assert t["median_paper"] >= 90.0, t
    assert r["averages"]["excluded"] == {"sentimento": "a task of your own (--task-file): not part of a GLUE score"}
    assert r["data"]["sentimento"]["train"]["rows"] == 480 and r["protocol"]["epochs"] == {"sentimento": 8}
    submission = Path(t["test_predictions"]["files"][0])
    lines = submission.read_text(encoding="utf-8").splitlines()
    assert submission.name == "sentimento.tsv" and lines[0] == "index\tprediction" and len(lines) == 21
    assert lines[1].split("\t")[0] == "r0" and {ln.split("\t")[1] for ln in lines[1:]} <= {"negativo", "positivo"}
    # progress as plain lines (not a terminal): each seed's first and last step at least
    for seed in (1, 2):
        assert f"ckpt-10000 sentimento seed {seed}/2: step 1/120" in said and f"seed {seed}/2: step 120/120" in said
    from tinyelectra.report import report_command

    report_command(tmp_path / "out", None)
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "sentimento" in md
    for f in (paths[0], submission, tmp_path / "out" / "report.md", tmp_path / "out" / "report.json",
              *(tmp_path / "out").glob("*.png")):
        assert mode(f) == 0o644, (f, oct(mode(f)))


def test_a_task_of_ones_own_says_its_majority_class_and_leaves_a_clean_log_and_folder(ckpt, tmp_path, capsys):
    """An unbalanced task (train 2:1, dev 20 'sim' : 10 'não'): the line and glue.json give the score of always
    answering the training rows' most frequent class, 20/30 = 66.7% (hand-computed), and no "leaderboard" (a task of
    one's own has none); under a non-terminal only plain lines (no progress-bar line); after the run no partial/
    folder is left beside glue.json."""
    data = tmp_path / "d"
    data.mkdir()
    rng = random.Random(5)
    labels = {"train": ["sim"] * 32 + ["não"] * 16, "dev": ["sim"] * 20 + ["não"] * 10, "test": [None] * 6}
    for split, ys in labels.items():
        rows_ = [(sentiment_sentence(rng, y == "sim"), y) for y in ys]
        write_tsv(data / f"{split}.tsv", rows_, with_label=split != "test")
    spec = task_file(tmp_path / "t.toml", name="desbalanceada", train="d/train.tsv", dev="d/dev.tsv", test="d/test.tsv",
                     text_columns=["frase"], label_column="rótulo", metric="accuracy", epochs=1, index_column="id")
    capsys.readouterr()
    paths = run(ckpt, tmp_path / "out", [spec], seeds=2)
    said = capsys.readouterr().out
    t = json.loads(paths[0].read_text())["tasks"]["desbalanceada"]
    assert t["majority_class"]["label"] == "sim"
    assert t["majority_class"]["paper_score"] == pytest.approx(100 * 20 / 30)
    line = next(x for x in said.splitlines() if x.startswith("ckpt-10000 desbalanceada: accuracy median"))
    assert "always answering the majority class 'sim': 66.7" in line and "leaderboard" not in said
    assert "━" not in said and "ETA 0:" not in said, said  # rich's bar and its columns
    assert "seed 2/2: step 2/2" in said  # the plain lines are there
    assert sorted(p.name for p in paths[0].parent.iterdir()) == ["glue.json", "submission"]  # no partial/


def test_csv_and_jsonl_tasks_pairs_regression_and_their_metrics(ckpt, tmp_path):
    """CSV with quoted commas and a binary F1; JSONL pairs with numeric scores (regression, Spearman) and a
    3-class macro F1: read, fine-tuned (1 epoch: the machinery), scored with the metric each file names."""
    rng = random.Random(3)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["texto", "classe"])
    for t, y in rows(64, 4):
        w.writerow([t.replace(" ", ", ", 1), "1" if y == "positivo" else "0"])  # commas inside quoted fields
    (tmp_path / "f1.csv").write_text(buf.getvalue(), encoding="utf-8")
    f1 = task_file(tmp_path / "f1.toml", name="binario", train="f1.csv", dev="f1.csv", text_columns=["texto"],
                   label_column="classe", metric="f1")
    records = []
    for _ in range(64):
        k = rng.randint(0, 4)
        records.append({"a": " ".join(["good"] * k + ["film"]), "b": "the plot", "nota": float(k), "tri": k % 3})
    (tmp_path / "pares.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + "{not json\n",
                                          encoding="utf-8")
    reg = task_file(tmp_path / "reg.toml", name="similaridade", train="pares.jsonl", dev="pares.jsonl",
                    text_columns=["a", "b"], label_column="nota", metric="spearman")
    tri = task_file(tmp_path / "tri.toml", name="tres", train="pares.jsonl", dev="pares.jsonl",
                    text_columns=["a", "b"], label_column="tri", metric="macro_f1")
    paths = run(ckpt, tmp_path / "out", [f1, reg, tri], overrides=["epochs=1"])
    tasks = json.loads(paths[0].read_text())["tasks"]
    assert [tasks[t]["paper_metric"] for t in ("binario", "similaridade", "tres")] == ["f1", "spearman", "macro_f1"]
    seed = tasks["similaridade"]["seeds"][0]
    assert set(seed["metrics"]) == {"pearson", "spearman", "pearson_spearman_mean"} and seed["steps"] == 2
    assert set(tasks["tres"]["seeds"][0]["metrics"]) == {"accuracy", "macro_f1"}
    assert 0.0 <= tasks["binario"]["median_paper"] <= 100.0
    data = json.loads(paths[0].read_text())["data"]
    assert data["similaridade"]["train"]["malformed_lines"] == [
        f"{tmp_path / 'pares.jsonl'}:65: unreadable line or missing fields"]


def test_bad_task_files_are_one_line_errors(ckpt, tmp_path):
    from tinyelectra.glue_data import load_task_file

    write_tsv(tmp_path / "d.tsv", rows(10, 0))
    base = dict(name="meu", train="d.tsv", dev="d.tsv", text_columns=["frase"], label_column="rótulo",
                metric="accuracy")
    cases = [
        ({**base, "metric": "bleu"}, "metric 'bleu'"),
        ({k: v for k, v in base.items() if k != "label_column"}, "missing 'label_column'"),
        ({**base, "label_column": "nota"}, "no column 'nota'"),
        ({**base, "train": "nada.tsv"}, "not found"),
        ({**base, "name": "RTE"}, "a GLUE task's"),
        ({**base, "metric": "f1", "labels": ["a", "b", "c"]}, "use macro_f1"),
        ({**base, "colunas": 1}, "unknown key 'colunas'"),
        # the name becomes the submission file's (OUT/CKPT/submission/NAME.tsv): a path there would write elsewhere
        ({**base, "name": "../../fora"}, "name '../../fora' holds a path separator"),
        ({**base, "name": "/tmp/fora"}, "holds a path separator"),
        ({**base, "name": ".."}, "is . or .."),
        ({**base, "name": " "}, "is empty"),
    ]
    for fields, needle in cases:
        with pytest.raises(UserError, match=needle) as e:
            load_task_file(task_file(tmp_path / "t.toml", **fields))
        assert "\n" not in str(e.value)
    ok = task_file(tmp_path / "ok.toml", **base)
    with pytest.raises(UserError, match="GLUE tasks need --glue-dir"):
        run(ckpt, tmp_path / "out", [ok], tasks="rte")


def test_labels_outside_the_task_list_are_an_error_or_skipped_when_asked(ckpt, tmp_path, capsys):
    """The task file lists two labels; 12 of the 30 dev rows (40%) carry a third, 'neutro'. Before, those rows were
    dropped and the task scored on the rest as a normal result; now the first is an error naming its file and line,
    and --skip-bad-labels skips them, the count printed beside the score and kept in glue.json."""
    data = tmp_path / "d"
    data.mkdir()
    write_tsv(data / "train.tsv", rows(40, 0))
    dev = rows(30, 1)
    dev = [(t, "neutro") if i % 5 in (1, 3) else (t, y) for i, (t, y) in enumerate(dev)]  # rows 1, 3, 6, 8, ...
    write_tsv(data / "dev.tsv", dev)
    spec = task_file(tmp_path / "t.toml", name="rotulos", train="d/train.tsv", dev="d/dev.tsv", text_columns=["frase"],
                     label_column="rótulo", metric="accuracy", labels=["negativo", "positivo"], epochs=1)
    with pytest.raises(UserError) as e:
        run(ckpt, tmp_path / "out", [spec])
    message = str(e.value)
    assert message.startswith(f"{data / 'dev.tsv'}:3: label 'neutro' is not one of negativo, positivo"), message
    assert "and 11 more such rows" in message and "--skip-bad-labels" in message and "\n" not in message
    assert not (tmp_path / "out" / "ckpt-10000" / "glue.json").exists()

    capsys.readouterr()
    paths = run(ckpt, tmp_path / "out", [spec], skip_bad_labels=True)
    said = capsys.readouterr().out
    line = next(x for x in said.splitlines() if x.startswith("ckpt-10000 rotulos: accuracy median"))
    assert line.endswith("; rows skipped: dev 12"), line
    entry = json.loads(paths[0].read_text())["tasks"]["rotulos"]
    assert entry["skipped_rows"] == {"dev": 12}


def test_two_task_files_with_one_name_are_one_line(ckpt, tmp_path, capsys):
    """Issue 35: two --task-file naming the same task ran one job and dropped the other without a word; now one line
    naming both files, exit 2, nothing fine-tuned."""
    from tinyelectra import cli

    write_tsv(tmp_path / "a.tsv", rows(16, 0))
    write_tsv(tmp_path / "b.tsv", rows(16, 1))
    base = dict(name="meu", dev="a.tsv", text_columns=["frase"], label_column="rótulo", metric="accuracy")
    first = task_file(tmp_path / "a.toml", train="a.tsv", **base)
    second = task_file(tmp_path / "b.toml", train="b.tsv", **base)
    argv = ["tinyelectra", "glue", "--checkpoint", str(ckpt), "--task-file", str(first), "--task-file", str(second),
            "--device", "cpu", "--out", str(tmp_path / "out")]
    old, sys.argv = sys.argv, argv
    try:
        with pytest.raises(SystemExit) as exc:
            cli.main()
    finally:
        sys.argv = old
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert f"--task-file {second}: names the task 'meu', as --task-file {first} does" in err
    assert not (tmp_path / "out" / "ckpt-10000" / "glue.json").exists()
