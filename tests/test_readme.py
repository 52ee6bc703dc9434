"""The README's quick start and test command are what CI runs, and the quick start installs only what the run needs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.DOTALL)


def test_ci_runs_the_readme_commands():
    quick_start, test_command = (b.strip() for b in bash_blocks()[:2])
    setup = quick_start.split(" && .venv/bin/tinyelectra ")[0]
    assert setup == "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ."  # no test extras
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci  # exactly the README's test command
    assert "python3 -m venv .venv" in ci and ".venv/bin/pip install -q torch==2.13.0 -e ." in ci
    assert test_command.startswith('.venv/bin/pip install -q -e ".[dev]" && ')  # the tests' extras, with the tests
