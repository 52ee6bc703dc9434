"""The Hugging Face `datasets` paths on local data, offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1, a private
HF_HOME): `prepare --corpus hf:DIR` on a folder of JSON lines, and `glue --hf` on a local copy of the hub's
nyu-mll/glue repository (parquet files and the README whose YAML names each task's files, as the hub repository is
laid out), read by the same `datasets.load_dataset` calls the commands make for the hub. Each runs as a subprocess,
so that the offline settings hold from the moment `datasets` is imported.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from test_glue import make_checkpoint, one_thread, sentiment_sentence  # noqa: F401  (one_thread: autouse)

datasets = pytest.importorskip("datasets", reason="datasets is in the dev extra: pip install -e '.[dev]'")

REPO = Path(__file__).resolve().parents[1]


def offline_env(tmp_path: Path) -> dict:
    return dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"),
                PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")


@pytest.mark.slow
@pytest.mark.cli
def test_hf_corpus_from_a_local_dataset_folder(tmp_path):
    """`hf:DIR`: the train split of a local dataset (train.jsonl), streamed as the hub's would be; one record is one
    document, its lines the sentences."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    records = [{"text": f"Document {i} has a first sentence.\nAnd a second one about {i}.", "id": i} for i in range(60)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "tinyelectra", "prepare", "--corpus", f"hf:{folder}", "--out",
                        str(tmp_path / "data"), "--vocab-size", "300", "--seq-len", "32", "--validation-fraction", "0"],
                       capture_output=True, text=True, env=offline_env(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["documents"]["train"] == 60
    assert manifest["sources"][0]["kind"] == "hf" and manifest["sources"][0]["spec"] == f"hf:{folder}"


def local_glue_mirror(root: Path, train_rows: int, dev_rows: int, test_rows: int) -> Path:
    """RTE as the hub's nyu-mll/glue repository holds it: rte/{split}-00000-of-00001.parquet with the hub's columns
    and ClassLabel, and a README.md whose YAML header maps the config "rte" to those files."""
    rng = random.Random(0)
    features = datasets.Features({
        "sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
        "label": datasets.ClassLabel(names=["entailment", "not_entailment"]), "idx": datasets.Value("int32"),
    })
    (root / "rte").mkdir(parents=True)
    for split, n in (("train", train_rows), ("validation", dev_rows), ("test", test_rows)):
        labels = [i % 2 for i in range(n)]
        ds = datasets.Dataset.from_dict({
            "sentence1": [sentiment_sentence(rng, y) for y in labels], "sentence2": ["the film was seen"] * n,
            "label": labels if split != "test" else [-1] * n, "idx": list(range(n)),
        }, features=features)
        ds.to_parquet(str(root / "rte" / f"{split}-00000-of-00001.parquet"))
    files = "".join(f"  - split: {s}\n    path: rte/{s}-*\n" for s in ("train", "validation", "test"))
    (root / "README.md").write_text(f"---\nconfigs:\n- config_name: rte\n  data_files:\n{files}---\n", encoding="utf-8")
    return root


GLUE_HF = """
import sys
import tinyelectra.glue_data as glue_data
glue_data.HF_DATASET = sys.argv[1]  # the local copy instead of the hub's name: the same load_dataset call
from tinyelectra.cli import main
sys.argv = ["tinyelectra", *sys.argv[2:]]
main()
"""


@pytest.mark.slow
@pytest.mark.cli
def test_glue_hf_from_a_local_copy_of_the_hub_repository(tmp_path):
    """`glue --hf` end to end on a local copy of nyu-mll/glue's RTE: every split read through `datasets`, labels
    mapped by name, fine-tuned and scored, test predictions written; datasets draws no progress bars in the log."""
    mirror = local_glue_mirror(tmp_path / "glue-mirror", train_rows=40, dev_rows=20, test_rows=10)
    ckpt = make_checkpoint(tmp_path / "ckpt-10000")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", GLUE_HF, str(mirror), "glue", "--checkpoint", str(ckpt), "--hf",
                        "--tasks", "rte", "--seeds", "1", "--device", "cpu", "--set", "epochs=1", "--out", str(out)],
                       capture_output=True, text=True, env=offline_env(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((out / "ckpt-10000" / "glue.json").read_text(encoding="utf-8"))
    data = result["data"]["rte"]
    assert data["train"]["rows"] == 40 and data["dev"]["rows"] == 20 and data["test"]["rows"] == 10
    assert data["dev"]["source"] == f"hf:{mirror}/rte/validation"
    assert result["tasks"]["rte"]["seeds"][0]["steps"] == 2  # 40 rows, batch 32, one epoch
    submission = (out / "ckpt-10000" / "submission" / "RTE.tsv").read_text(encoding="utf-8").splitlines()
    assert submission[0] == "index\tprediction" and len(submission) == 11
    assert {line.split("\t")[1] for line in submission[1:]} <= {"entailment", "not_entailment"}
    assert "Generating" not in r.stderr and "examples/s" not in r.stderr, r.stderr[-2000:]
