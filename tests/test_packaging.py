"""The package outside this repository: the recipes are package data, and a wheel built from this checkout, installed
into a fresh virtual environment, finds every shipped recipe and runs prepare -> train -> export, whose output
transformers loads there (tests/check_export.py).

The fresh environment gets the wheel alone (no network: --no-deps --no-index) and reaches the dependencies already
installed here through a .pth file naming this interpreter's site-packages; tinyelectra itself must come from the
wheel (checked). CI (.ci/run) also installs the wheel with its real dependencies and runs `flops` for every recipe.
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tinyelectra.config import load_recipe, recipe_files, recipe_toml

REPO = Path(__file__).resolve().parents[1]
SOURCE_RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.toml"))


def test_every_recipe_in_the_repository_is_found_as_package_data():
    found = recipe_files()
    assert list(found) == SOURCE_RECIPES and len(SOURCE_RECIPES) >= 6
    for name, path in found.items():
        assert path.read_text(encoding="utf-8") == (REPO / "recipes" / f"{name}.toml").read_text(encoding="utf-8")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert pyproject["package-dir"]["tinyelectra.recipes"] == "recipes"
    assert "*.toml" in pyproject["package-data"]["tinyelectra.recipes"]


def test_license_file_is_the_apache_2_0_text_the_metadata_names():
    """pyproject says Apache-2.0; LICENSE holds that license's text as the Apache Software Foundation publishes it
    (apache.org/licenses/LICENSE-2.0.txt, whose sha256 this is)."""
    import hashlib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (REPO / "LICENSE").read_bytes()
    assert b"Apache License\n                           Version 2.0, January 2004" in text
    assert hashlib.sha256(text).hexdigest() == "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


@pytest.mark.parametrize("name", SOURCE_RECIPES)
def test_printed_recipe_reads_back_the_same(name, tmp_path):
    """`tinyelectra recipe NAME --set ...` prints TOML that --recipe FILE turns back into the same recipe."""
    overrides = ["train.batch_size=8", "data.casing=cased"]
    recipe = load_recipe(name, overrides)
    (tmp_path / "r.toml").write_text(recipe_toml(recipe), encoding="utf-8")
    assert load_recipe(str(tmp_path / "r.toml")) == recipe


def test_recipes_written_before_data_casing_still_load():
    """Checkpoints and recipe.json files of earlier runs say data.lowercase = true | false (now data.casing)."""
    from tinyelectra.config import Recipe, recipe_from_dict

    old = Recipe().to_dict()
    old["data"] = {"tokenizer": "", "lowercase": True, "validation_fraction": 0.01}
    assert recipe_from_dict(old).data.casing == "uncased"
    old["data"]["lowercase"] = False
    assert recipe_from_dict(old).data.casing == "cased" and Recipe().data.casing == "auto"


def run(args: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{args}\nstdout:\n{p.stdout[-2000:]}\nstderr:\n{p.stderr[-3000:]}"
    return p


@pytest.mark.slow
@pytest.mark.cli
def test_wheel_in_a_fresh_venv_finds_every_recipe_and_exports_for_transformers(tmp_path):
    from pydoc_data.topics import topics

    from tinyelectra.tokenizer import Tokenizer

    # built from a copy of what the sdist holds: setuptools' build/ directory in the checkout could hold stale files
    src = tmp_path / "src"
    for part in ("tinyelectra", "recipes"):
        shutil.copytree(REPO / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / part, src / part)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", src],
        tmp_path)
    wheel = next((tmp_path / "dist").glob("tinyelectra-*.whl"))
    shipped = sorted(Path(n).stem for n in zipfile.ZipFile(wheel).namelist() if n.startswith("tinyelectra/recipes/")
                     and n.endswith(".toml"))
    assert shipped == SOURCE_RECIPES
    licenses = [n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" in n and Path(n).name == "LICENSE"]
    assert len(licenses) == 1 and zipfile.ZipFile(wheel).read(licenses[0]) == (REPO / "LICENSE").read_bytes()

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    python, tinyelectra = venv / "bin" / "python", venv / "bin" / "tinyelectra"
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], tmp_path)
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).stdout.strip()
    Path(purelib, "outer-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")

    where = run([python, "-c", "import tinyelectra, tinyelectra.config as c; print(tinyelectra.__file__); "
                               "print(*c.recipe_files())"], tmp_path).stdout.split("\n")
    assert where[0].startswith(str(venv)) and where[1].split() == SOURCE_RECIPES  # the wheel's copy, not this checkout
    for name in SOURCE_RECIPES:
        assert name in run([tinyelectra, "flops", "--recipe", name], tmp_path).stdout
    assert run([tinyelectra, "--version"], tmp_path).stdout.startswith("tinyelectra ")

    # prepare -> train (the vocabulary comes from the data) -> export, all from the wheel; transformers loads it
    lines = [" ".join(p.split()) for t in sorted(topics) for p in topics[t].split("\n\n") if p.strip()]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run([tinyelectra, "prepare", "--corpus", tmp_path / "text.txt", "--out", tmp_path / "data", "--vocab-size", "2000",
         "--seq-len", "64"], tmp_path)
    run([tinyelectra, "train", "--recipe", "tiny", "--data", tmp_path / "data", "--budget", "2steps", "--device", "cpu",
         "--set", "train.seq_len=64", "--set", "model.max_positions=64", "--set", "model.num_layers=1",
         "--set", "train.batch_size=4", "--set", "train.eval_rows=8", "--out", tmp_path / "run"], tmp_path)
    run([tinyelectra, "export", tmp_path / "run" / "ckpt-10000", "--out", tmp_path / "export"], tmp_path)
    tok = Tokenizer.load(tmp_path / "data" / "tokenizer")
    plain = [line for line in lines[:400] if line == line.lower() and line.isascii() and 20 < len(line) < 120][:30]
    pairs = [[a, b, *tok.encode_batch([a, b])] for a, b in zip(plain[:10], plain[10:20])]
    want = {"max_positions": 64, "cls_id": tok.cls_id, "sep_id": tok.sep_id, "pairs": pairs, "round_trip": plain,
            "round_trip_ignoring_spaces": True}
    (tmp_path / "want.json").write_text(json.dumps(want), encoding="utf-8")
    facts = run([python, REPO / "tests" / "check_export.py", tmp_path / "export", tmp_path / "want.json"],
                tmp_path).stdout
    assert json.loads(facts.strip().splitlines()[-1])["model_max_length"] == 64


@pytest.mark.cli
def test_a_plain_checkout_that_is_not_installed_finds_its_recipes(tmp_path):
    """`PYTHONPATH=. python -m benchmarks...` and `python -m tinyelectra` in a checkout that was never installed: no
    `tinyelectra.recipes` package exists there, and the recipes come from the checkout's recipes/ folder. Run with
    `python -S` (no .pth files, so no editable install) and the dependencies' site-packages on PYTHONPATH; the copy
    of the checkout must be what is imported (checked), and a recipe edited in the copy is the one read."""
    checkout = tmp_path / "checkout"
    for part in ("tinyelectra", "recipes"):
        shutil.copytree(REPO / part, checkout / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    tiny = checkout / "recipes" / "tiny.toml"
    tiny.write_text(tiny.read_text(encoding="utf-8").replace("[model]", "# edited in the checkout\n[model]", 1),
                    encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join([str(checkout), *site.getsitepackages()])}
    code = ("import tinyelectra, tinyelectra.config as c; print(tinyelectra.__file__); f = c.recipe_files(); "
            "print(*f); print(f['tiny'].read_text().count('edited in the checkout'))")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=checkout, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    where = out.stdout.split("\n")
    assert where[0].startswith(str(checkout)) and where[1].split() == SOURCE_RECIPES and where[2] == "1"
    flops = subprocess.run([sys.executable, "-S", "-m", "tinyelectra", "flops", "--recipe", "electra-small"],
                           cwd=checkout,
                           env=env, capture_output=True, text=True, timeout=300)
    assert flops.returncode == 0 and "electra-small" in flops.stdout, flops.stderr


def test_python_dash_m_tinyelectra_is_the_console_script(monkeypatch, capsys):
    """`python -m tinyelectra` (tinyelectra/__main__.py, what torchrun starts) runs the console script's command line:
    `--version` prints the installed distribution's version and exits 0 (in this process, as runpy runs the module)."""
    import runpy
    from importlib.metadata import version

    monkeypatch.setattr(sys, "argv", ["tinyelectra", "--version"])
    for name in ("OMP_WAIT_POLICY", "TINYELECTRA_SET_OMP_WAIT_POLICY"):  # main() may set them: restored afterwards
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit) as done:
        runpy.run_module("tinyelectra", run_name="__main__")
    assert done.value.code in (0, None) and version("tinyelectra") in capsys.readouterr().out
