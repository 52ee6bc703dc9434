"""The README's quick start and test command are what CI runs, the quick start installs only what the run needs, and
its run learns what the README says it learns; the README is short enough to read in five minutes (issue 36: at most
220 lines, the GPU path in the first 60, a median sentence of at most 25 words). `python tests/test_readme.py`
prints its measures."""

from __future__ import annotations

import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tinyelectra.budget import FRACTIONS, checkpoint_name, parse_budget

ROOT = Path(__file__).resolve().parents[1]


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.DOTALL)


def prose_sentences(markdown: str) -> list[str]:
    """The sentences of a markdown text's prose: code blocks, tables, headings and HTML comments left out, links
    read as their text, list items and paragraphs apart, sentences split after `.`, `!` or `?`
    and whitespace (not after an abbreviation such as "e.g.")."""
    text = re.sub(r"```.*?```", "\n\n", markdown, flags=re.DOTALL)
    text = re.sub(r"<!--.*?-->", "", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    paragraphs, current = [], []
    for line in text.splitlines():
        stripped = line.strip()
        item = re.match(r"(?:[-*]|\d+\.)\s+", stripped)
        if not stripped or stripped.startswith(("#", "|")) or item:
            if current:
                paragraphs.append(" ".join(current))
            current = [stripped[item.end():]] if item else []
        else:
            current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    sentences = []
    for paragraph in paragraphs:
        ours: list[str] = []
        for piece in re.split(r"(?<=[.!?])\s+", paragraph.replace("**", "")):
            if ours and ours[-1].endswith(ABBREVIATIONS):
                ours[-1] += " " + piece  # "e.g. this" is one sentence
            elif piece.strip():
                ours.append(piece)
        sentences += ours
    return sentences


ABBREVIATIONS = ("e.g.", "i.e.", "al.", "vs.", "etc.", "cf.")


def readme_measures(text: str) -> dict:
    """README.md's length, where the GPU path starts and its median sentence length in words."""
    lines = text.splitlines()
    words = [len(s.split()) for s in prose_sentences(text)]
    return {"lines": len(lines),
            "first --gpu 0": next(i for i, line in enumerate(lines, 1) if "--gpu 0" in line),
            "GPU steps heading": next(i for i, line in enumerate(lines, 1)
                                      if line.startswith("## Pre-train on your GPU")),
            "sentences": len(words), "median words": statistics.median(words), "longest": max(words)}


def test_prose_sentences_are_split_as_a_reader_reads_them():
    text = ("# Title\n\nOne two three. Four `five` six!\nSeven [eight](x.md#y) nine.\n\n| a | b. C |\n\n"
            "- An item, e.g. this one. another.\n1. Step one.\n```sh\nnot. Prose.\n```\nA <!--f:x-->1.5<!--/f--> x.\n")
    assert prose_sentences(text) == ["One two three.", "Four `five` six!", "Seven eight nine.",
                                     "An item, e.g. this one.", "another.", "Step one.", "A 1.5 x."]


def test_the_readme_reads_in_five_minutes():
    """Issue 36's measures: at most 220 lines; the GPU path (`--gpu 0`, then its numbered steps) in the first 60;
    the prose's median sentence at most 25 words."""
    m = readme_measures((ROOT / "README.md").read_text(encoding="utf-8"))
    assert m["lines"] <= 220, m
    assert m["first --gpu 0"] <= 60 and m["GPU steps heading"] <= 60, m
    assert m["median words"] <= 25, m


def test_ci_runs_the_readme_commands():
    quick_start, test_command = (b.strip() for b in bash_blocks()[:2])
    setup = quick_start.split(" && .venv/bin/tinyelectra ")[0]
    assert setup == "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ."  # no test extras
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci  # exactly the README's test command
    assert "python3 -m venv .venv" in ci and ".venv/bin/pip install -q torch==2.13.0 -e ." in ci
    assert test_command.startswith('.venv/bin/pip install -q -e ".[dev]" && ')  # the tests' extras, with the tests


def quick_start_args() -> list[str]:
    """The quick start's `tinyelectra` arguments (after `.venv/bin/tinyelectra` in the README's first bash block)."""
    return shlex.split(bash_blocks()[0].strip().split(" && .venv/bin/tinyelectra ", 1)[1])


@pytest.mark.slow
def test_the_quick_start_learns_context(tmp_path, cli_env):
    """The README's main job, run as written but for its run folder. Its budget is a step count, so what it learns
    holds at any machine speed (a time budget's steps follow the machine: the two-minute quick start shipped before
    fitted 188-266 steps on slow CPUs and ended "NOT LEARNED YET", issue 38). It ends in five checkpoints and the
    FLOPs report, and its last checkpoint's verdict on held-out rows, the last one printed, is "learned context through
    the generator" with the generator at least twice the unigram answer's accuracy. Measured with this command
    (benchmarks/results/quickstart_cpu.md): 0.138 vs 0.050 (2.74x) on two threads, 0.135 (2.69x) on one; the recipe at
    seeds 1 and 2 ended at 2.86x and 2.70x (quickstart_tuning_cpu.md). 55-70 s here on a quiet 2-core CPU."""
    args = quick_start_args()
    budget = args[args.index("--budget") + 1]
    assert parse_budget(budget).kind == "steps", f"the quick start's budget {budget!r} is not a step count"
    out = tmp_path / "run"
    args[args.index("--out") + 1] = str(out)
    p = subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=cli_env, capture_output=True, text=True,
                       timeout=3600)
    assert p.returncode == 0, p.stderr[-3000:]
    printed = p.stdout + p.stderr
    assert "FLOPs report" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoints"] == [checkpoint_name(f) for f in FRACTIONS]
    final = json.loads((out / "ckpt-10000" / "meta.json").read_text())["eval"]
    assert final["gen_acc"] >= 2 * final["unigram_acc"], final
    assert final["verdict"].startswith("learned context through the generator"), final["verdict"]
    assert f"ckpt-10000: {final['verdict']}" in printed  # what the user reads at the end


if __name__ == "__main__":
    print(readme_measures((ROOT / "README.md").read_text(encoding="utf-8")))
