"""The linter configured in pyproject.toml ([tool.ruff]) finds nothing in the package, tests, benchmarks or recipes:
no line there runs past 120 columns (E501) either."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["tinyelectra", "tests", "benchmarks", "recipes"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return subprocess.run([exe, "check", "--no-cache", *args, *CHECKED], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_is_clean():
    p = ruff()
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]

