"""Every measured figure that README.md, tinyelectra/docs/, benchmarks/README.md and benchmarks/lab/README.md cite,
read from its result file.

`FIGURES` is the table: a name, the result file(s) it comes from (under benchmarks/; `ARCHIVE!MEMBER` is a JSON file
inside a lease's .tar.gz), how the value is read (a JSON path with "." between keys, or a function of the loaded
files for a derived figure: a rate, a range, minutes at a measured speed) and how it is printed. In the text a
figure stands between two markers, invisible once the markdown is rendered:

    <!--f:h100.train.tokens_s-->1,232,944<!--/f-->

and the card guide of tinyelectra/docs/gpus.md between `<!--cards-->` and `<!--/cards-->`, rendered from
`tinyelectra.runtime.card_policy` (what `--gpu 0` picks on each card) so that the page says what the code does.

    python -m benchmarks.figures            # check: exit 1 naming every figure whose text is not its file's value
    python -m benchmarks.figures --write    # write every figure and the card guide from the files into the text
    python -m benchmarks.figures --list     # name, value, file of every figure

tests/test_docs.py runs the check, and shows it failing on a figure edited by hand and on a result file replaced.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

from benchmarks import ROOT

H100 = "results/h100-2026-11-26/"
H100_SUMMARY = H100 + "summary.json"
H100_TRAIN = H100 + "gpu-suite-20261126-060021.tar.gz!gpu-suite-20261126-060021/pretrain/summary.json"
H100_GLUE = H100 + "finish.json"
H200 = "results/h200-2026-11-26/"
H200_TRAIN = H200 + "gpu-suite-20261126-001425.tar.gz!gpu-suite-20261126-001425/pretrain/summary.json"
H200_PLAN = H200 + "gpu-suite-20261126-001425.tar.gz!gpu-suite-20261126-001425/pretrain/plan.json"
QUICKSTART = ("results/quickstart_cpu.json", "results/quickstart_cpu_second.json", "results/quickstart_cpu_quiet.json")
OMP_WAIT = "lab/results/omp_wait_cpu.json"
SUITE = "results/test_suite_cpu.json"
LAB = "lab/results/"
MINI_CKPTS = LAB + "mini_electra_checkpoints_cpu.json"
GRAMMAR = LAB + "plateau_tiny_grammar_cpu.json"
PAPER_FIRST_POINT_STEPS = 62_500  # the paper's 6.25% checkpoint of ELECTRA-Small (Table 1: 1M steps in all)


@dataclass(frozen=True)
class Figure:
    """One figure: `read` is a JSON path ("a.b.c") into the first file, or a function of all the loaded files
    (in `files` order) returning a number or a tuple of numbers; `fmt` formats it (`str.format(*value)`)."""

    name: str
    files: tuple[str, ...]
    read: str | Callable[..., Any]
    fmt: str
    what: str

    def value(self, root: Path = ROOT) -> str:
        docs = [load(root, f) for f in self.files]
        raw = at(docs[0], self.read) if isinstance(self.read, str) else self.read(*docs)
        return self.fmt.format(*(raw if isinstance(raw, tuple) else (raw,)))


def at(doc: Any, path: str) -> Any:
    for key in path.split("."):
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return doc


@cache
def _load(root: Path, name: str, stamp: tuple[int, float]) -> Any:
    path, _, member = name.partition("!")
    if not member:
        return json.loads((root / "benchmarks" / path).read_text(encoding="utf-8"))
    with tarfile.open(root / "benchmarks" / path) as tar:
        return json.load(tar.extractfile(member))


def load(root: Path, name: str) -> Any:
    """A result file's JSON (`ARCHIVE!MEMBER`: a member of a .tar.gz), read once per version of the file."""
    st = (root / "benchmarks" / name.partition("!")[0]).stat()
    return _load(root, name, (st.st_size, st.st_mtime))


def steps_per_s(summary: dict) -> float:
    """A run's steps over its training seconds (its tokens/s count real tokens, not padding: no steps/s from it)."""
    return summary["steps"] / summary["train_seconds"]


def stage(name: str, key: str = "seconds") -> Callable[[dict], float]:
    """One stage's record in a GPU suite's summary.json: its seconds, or its limit (`budget_s`)."""
    return lambda summary: next(s[key] for s in summary["stages"] if s["stage"] == name)


def before_pretrain_s(summary: dict) -> float:
    """The seconds the first command's stages took before pretrain (those the suite ran in turn, not in the
    background)."""
    stages = [s for s in summary["stages"] if s["kind"] != "background"]
    return sum(s["seconds"] for s in stages[:[s["stage"] for s in stages].index("pretrain")])


def glue(task: str, side: str) -> Callable[[dict], float]:
    """A GLUE task's median dev score over its seeds, on one side (pre-trained or not) of the H100 lease."""
    return lambda finish: finish["glue"]["tasks"][task][side]["median"]


def quickstart_range(key: str, threads: int | None = None) -> Callable[..., tuple[float, float]]:
    """(least, most) of `key` over the quick start's 800-step cases in all three files, those with `threads` CPU
    threads only when given."""
    def read(*docs: dict) -> tuple[float, float]:
        values = [at(case, key) for doc in docs for case in doc["cases"].values()
                  if case.get("steps") == 800 and threads in (None, case.get("cpu_threads"))]
        return min(values), max(values)
    return read


def omp_round_ratios(doc: dict) -> list[float]:
    """PASSIVE over OpenMP's default, round by round, in the busy section's valid rounds."""
    rounds = [r for r in doc["sections"]["tiny busy"]["rounds"] if r["valid"]]
    tps = [{m["variant"]: m["tokens_per_s"] for m in r["measurements"]} for r in rounds]
    return [t["passive"] / t["default"] for t in tps]


def omp_ratio_of_medians(doc: dict) -> float:
    medians = doc["sections"]["tiny busy"]["summary"]["median_tokens_per_s"]
    return medians["passive"] / medians["default"]


def arms_tokens_s(*docs: dict) -> tuple[float, float]:
    """(least, most) tokens/s over every arm of the given short_runs files."""
    return spread([arm["tokens_per_second"] for doc in docs for arm in doc["arms"].values()])


def over_prior(checkpoint: dict) -> float:
    """A scored checkpoint's discriminator accuracy over its all-original prior."""
    return checkpoint["disc_acc"] - checkpoint["baseline_acc"]


def spread(values: list[float]) -> tuple[float, float]:
    """(least, most)."""
    return min(values), max(values)


def mini_late(key: Callable[[dict], float]) -> Callable[[dict], tuple[float, float]]:
    """(least, most) of `key` over mini_electra's checkpoints from step 1,000 on."""
    return lambda doc: spread([key(c) for c in doc["checkpoints"] if c["step"] >= 1000])


def grammar_at(step: int, key: str) -> Callable[[dict], float]:
    """The `recipe` arm's checkpoint at `step` in plateau_tiny_grammar_cpu.json."""
    return lambda doc: next(c[key] for c in doc["arms"]["recipe"]["checkpoints"] if c["step"] == step)


F = Figure
FIGURES: list[Figure] = [
    # the H100 lease (benchmarks/results/h100-2026-11-26): the trainer, the step alone, memory, start-up
    F("h100.train.tokens_s", (H100_SUMMARY,), "pretrain.median_tokens_per_second", "{:,.0f}",
      "tinyelectra train --gpu 0, ELECTRA-Small 128 x 128 bf16, CUDA graphs: median tokens/s of the log windows"),
    F("h100.train.steps_s", (H100_TRAIN,), steps_per_s, "{:.1f}", "the same run's steps per training second"),
    F("h100.train.steps", (H100_TRAIN,), "steps", "{:,}", "the run's steps"),
    F("h100.train.seconds", (H100_TRAIN,), "train_seconds", "{:.0f}", "the run's training seconds"),
    F("h100.train.startup_s", (H100_TRAIN,), "excluded_seconds.startup_and_first_step", "{:.1f}",
      "start-up to the first step, compiling from the inductor cache"),
    F("h100.train.compile_cached_s", (H100_TRAIN,), "runtime.compiled.seconds", "{:.1f}",
      "the compiling within that start-up (cache hit)"),
    F("h100.train.reserved_gib", (H100_TRAIN,), "peak_gpu_memory_reserved_gib", "{:.2f}",
      "the trainer's peak memory reserved by torch's allocator (tensors, cache, CUDA-graph pools)"),
    F("h100.train.allocated_gib", (H100_TRAIN,), "peak_gpu_memory_gib", "{:.2f}", "the trainer's peak tensor memory"),
    F("h100.train.share_of_step", (H100_SUMMARY,), lambda s: 100 * s["pretrain"]["median_tokens_per_second"]
      / s["speed"]["tinyelectra CUDA graphs"]["tokens_per_s"], "{:.0f}",
      "the trainer's tokens/s over the step alone's, %"),
    F("h100.step.tokens_s", (H100_SUMMARY,), "speed.tinyelectra CUDA graphs.tokens_per_s", "{:,.0f}",
      "the step alone with CUDA graphs (throughput --compile reduce-overhead)"),
    F("h100.step.reserved_gib", (H100_SUMMARY,), "speed.tinyelectra CUDA graphs.peak_memory_gib", "{:.2f}",
      "the step alone's peak memory reserved (CUDA-graph pools counted)"),
    F("h100.step.compile_cold_s", (H100 + "gpu-suite-20261126-060021.tar.gz!gpu-suite-20261126-060021/speed.json",),
      "tinyelectra.compile_record.seconds", "{:.0f}", "the cold compile of the step (empty inductor cache)"),
    # the H100 lease's first command, stage by stage (summary.json's `stages`; suite.log prints the same)
    *[F(f"h100.stage.{name}_s", (H100_SUMMARY,), stage(name), "{:.1f}", f"the {name} stage's seconds")
      for name in ("unpack", "env", "checks", "parity", "speed")],
    F("h100.stage.before_pretrain_s", (H100_SUMMARY,), before_pretrain_s, "{:.0f}",
      "the seconds of the stages before pretrain"),
    F("h100.stage.pretrain_limit_s", (H100_SUMMARY,), stage("pretrain", "budget_s"), "{}",
      "pretrain's limit: the first command's deadline less the stages before it"),
    F("h100.stage.pretrain_overhead_s", (H100_SUMMARY, H100_TRAIN),
      lambda s, t: stage("pretrain")(s) - t["budget_seconds"], "{:.1f}",
      "pretrain's seconds beyond its training budget: start-up, checkpoints and exit"),
    F("h100.stage.pretrain_reserved_s", (H100_SUMMARY, H100_TRAIN),
      lambda s, t: stage("pretrain", "budget_s")(s) - t["budget_seconds"], "{:.0f}",
      "pretrain's limit less its training budget: the seconds reserved for start-up, checkpoints and exit"),
    F("h100.ceiling_tflops", (H100_SUMMARY,), "ceilings.gemm_tflops", "{:.0f}",
      "the measured bf16 8192^3 matrix product, TFLOP/s"),
    F("h100.minutes_to_first_point", (H100_TRAIN,), lambda s: PAPER_FIRST_POINT_STEPS / steps_per_s(s) / 60, "{:.0f}",
      "minutes to the paper's 6.25% point (62,500 steps) at the trainer's measured steps/s"),
    F("h100.hours_to_paper", (H100_TRAIN,), lambda s: 1_000_000 / steps_per_s(s) / 3600, "{:.1f}",
      "hours to the paper's whole 1M steps at the trainer's measured steps/s"),
    F("h100.left_prior_step", (H100_SUMMARY,), "pretrain.along_the_run.left_prior_at_step", "{:,}",
      "the step from which the discriminator's loss stays under 0.95 of its all-original prior's"),
    F("h100.auc_matched_end", (H100_SUMMARY,), "pretrain.along_the_run.checkpoints.ckpt-10000.auc_matched", "{:.2f}",
      "the last checkpoint's held-out AUC matched by token id (0.5 = no context)"),
    F("h100.generator_end", (H100_SUMMARY,), "pretrain.along_the_run.checkpoints.ckpt-10000.generator_over_unigram",
      "{:.2f}", "the last checkpoint's generator accuracy over the unigram answer's"),
    F("h100.train.tokens_m", (H100_SUMMARY,), lambda s: s["pretrain"]["tokens_seen"] / 1e6, "{:.1f}",
      "the run's tokens, millions"),
    F("h100.train.tokens_share", (H100_SUMMARY,), lambda s: 100 * s["pretrain"]["paper_point"]["tokens_fraction"],
      "{:.0f}", "those tokens as a share of the paper's 6.25% point's, %"),
    F("h100.passes", (H100_SUMMARY,), "pretrain.passes_over_pack", "{:.1f}", "passes over the pack's tokens"),
    # GLUE dev on the H100: the run's last checkpoint against its own initial weights, 3 seeds, medians
    *[F(f"h100.glue.{task}.{key}", (H100_GLUE,), glue(task, side), "{:.1f}", f"{task} dev, {side}, median of 3 seeds")
      for task in ("cola", "mrpc", "stsb", "rte")
      for key, side in (("pre", "pre-trained"), ("none", "no pre-training"))],
    *[F(f"h100.glue.{task}.majority", (H100_GLUE,), f"glue.tasks.{task}.majority class", "{:.1f}",
        f"{task} dev: always answering the training rows' most frequent class") for task in ("cola", "mrpc", "rte")],
    # beside them, the released ELECTRA-Small-OWT (OpenWebText, 1M steps): google-research/electra's README, not the
    # paper's Table (finish.json's `paper` key; glue.paper_source names it; ../shared/REFERENCE.md quotes it)
    *[F(f"owt.glue.{task}", (H100_GLUE,), f"glue.tasks.{task}.paper", "{:.1f}",
        f"{task} dev of the released ELECTRA-Small-OWT (its README, 1M steps)")
      for task in ("cola", "mrpc", "stsb", "rte")],
    # the H200 lease, before CUDA graphs were the trainer's default
    F("h200.train.tokens_s", (H200_TRAIN,), "median_tokens_per_second", "{:,.0f}",
      "the trainer in inductor's default mode: median tokens/s"),
    F("h200.train.steps_s", (H200_PLAN,), lambda p: p["total_steps"] / p["budget_seconds"], "{:.1f}",
      "its steps per training second (plan.json: the steps of its 242 s budget)"),
    *[F(f"h200.stage.{name}_s", (H200 + "summary.json",), stage(name), "{:.1f}", f"the H200's {name} stage's seconds")
      for name in ("unpack", "env", "checks")],
    F("h200.ceiling_tflops", (H200 + "summary.json",), "ceilings.gemm_tflops", "{:.0f}",
      "the H200's measured bf16 8192^3 matrix product, TFLOP/s"),
    F("h200.step.first_call_s", (H200 + "cudagraphs.json",), "tinyelectra.first_call_s", "{:.1f}",
      "the H200's first call of the step with CUDA graphs: its cold compile"),
    F("h200.step.tokens_s", (H200 + "cudagraphs.json",), "tinyelectra.tokens_per_s", "{:,.0f}",
      "the step alone with CUDA graphs"),
    F("h200.eager.tokens_s", (H200 + "summary.json",), "speed.tinyelectra eager.tokens_per_s", "{:,.0f}",
      "tinyelectra's step, eager"),
    F("h200.transformers_eager.tokens_s", (H200 + "summary.json",), "speed.transformers eager.tokens_per_s", "{:,.0f}",
      "transformers' ELECTRA step wired the common way, eager"),
    F("h200.eager_ratio", (H200 + "summary.json",), "ratios.eager (paired rounds in one process)", "{:.2f}",
      "tinyelectra over transformers, both eager: the median of paired rounds in one process"),
    # CPU measurements
    F("quickstart.fast_s", QUICKSTART, quickstart_range("wall_seconds", threads=2), "{:.0f}–{:.0f}",
      "the quick start from launch to exit on a shared 2-core CPU, 2 threads"),
    F("quickstart.slow_s", QUICKSTART, quickstart_range("wall_seconds", threads=1), "{:.0f}–{:.0f}",
      "the same pinned to one core with a CPU-bound process beside it"),
    F("quickstart.generator", QUICKSTART, quickstart_range("final.gen_over_unigram"), "{:.2f}–{:.2f}",
      "the quick start's generator over the unigram answer at its end (1 and 2 threads)"),
    F("prepare.enwiki_s", ("results/prepare_enwiki.json",), "end_to_end.seconds", "{:.1f}",
      "tinyelectra prepare on all 400 enwiki shards, 2 cores"),
    F("prepare.enwiki_mb", ("results/prepare_enwiki.json",), lambda d: d["end_to_end"]["text_bytes"] / 1e6, "{:.0f}",
      "their text, MB"),
    F("step_cpu.speedup", ("results/step_cpu.json",), "speedup.median_of_round_ratios", "{:.2f}",
      "one ELECTRA-Small step on the CPU against transformers wired the common way (fp32, alternating)"),
    F("step_cpu.tokens_s", ("results/step_cpu.json",), lambda d: (d["tinyelectra"]["tokens_per_s"],
      d["transformers"]["tokens_per_s"]), "{:,.0f} vs {:,.0f}", "those two steps' tokens/s (16 x 128, fp32)"),
    F("throughput_cpu.speedup", ("results/throughput_cpu_fp32.json",), "speedup.median_of_round_ratios", "{:.2f}",
      "the trainer's step with its data loading against the same transformers wiring (CPU, fp32)"),
    F("prepare.enwiki_mb_s", ("results/prepare_enwiki.json",), "end_to_end.mb_per_second", "{:.2f}",
      "tinyelectra prepare end to end, MB of text per second"),
    F("data_check.s_per_100gb", ("results/data_check.json",), "seconds_per_100_gb.new", "{:.0f}",
      "checking a prepared dataset's bytes at each start: seconds per 100 GB (warm cache, one thread)"),
    F("omp.busy_rounds", (OMP_WAIT,), lambda d: (min(omp_round_ratios(d)), max(omp_round_ratios(d))), "{:.1f}–{:.0f}",
      "OMP_WAIT_POLICY=PASSIVE over OpenMP's default with one core busy: the valid rounds' ratios"),
    F("omp.busy_rounds_n", (OMP_WAIT,), lambda d: len(omp_round_ratios(d)), "{}", "how many valid busy rounds"),
    F("omp.busy_medians", (OMP_WAIT,), omp_ratio_of_medians, "{:.1f}",
      "PASSIVE over the default with one core busy: the ratio of the medians"),
    F("omp.quiet", (OMP_WAIT,), "sections.tiny quiet.summary.ratio_to_default.passive", "{:.2f}",
      "PASSIVE over the default on a quiet CPU"),
    # the lab (benchmarks/lab/README.md)
    F("lab.short_runs.tokens_s", (LAB + "short_runs_cpu.json", LAB + "short_runs_seeds_cpu.json"), arms_tokens_s,
      "{:,.0f}-{:,.0f}", "the tiny short runs' tokens/s, one thread each"),
    F("lab.grammar.unigram", (GRAMMAR,), grammar_at(500, "unigram_acc"), "{:.3f}",
      "the grammar run's unigram answer: held-out accuracy of always answering the most frequent word"),
    F("lab.grammar.gen_500", (GRAMMAR,), grammar_at(500, "gen_over_unigram"), "{:.2f}",
      "tiny at 3e-3 on grammar0 as text: generator over the unigram answer at step 500"),
    F("lab.grammar.gen_1000", (GRAMMAR,), grammar_at(1000, "gen_over_unigram"), "{:.2f}", "the same at step 1,000"),
    F("lab.grammar.gen_2000", (GRAMMAR,), grammar_at(2000, "gen_over_unigram"), "{:.2f}", "the same at step 2,000"),
    F("lab.grammar.matched_auc", (GRAMMAR,),
      lambda d: spread([c["disc_auc_matched"] for c in d["arms"]["recipe"]["checkpoints"]]), "{:.2f}-{:.2f}",
      "the same run's AUCs matched by token id, over its checkpoints"),
    F("lab.mini.tokens_m", (MINI_CKPTS,), lambda d: d["checkpoints"][-1]["tokens_seen"] / 1e6, "{:.1f}",
      "mini ELECTRA's 4,000 steps: tokens, millions"),
    F("lab.mini.gain_250", (MINI_CKPTS,), lambda d: over_prior(d["checkpoints"][0]), "+{:.3f}",
      "its discriminator's accuracy over the all-original prior at step 250"),
    F("lab.mini.auc_250", (MINI_CKPTS,), "checkpoints.0.disc_auc", "{:.2f}", "its raw AUC at step 250"),
    F("lab.mini.gain_late", (MINI_CKPTS,), mini_late(over_prior),
      "+{:.4f} to +{:.4f}", "its accuracy over the prior from step 1,000 on"),
    F("lab.mini.auc_late", (MINI_CKPTS,), mini_late(lambda c: c["disc_auc"]), "{:.2f}-{:.2f}",
      "its raw AUC from step 1,000 on"),
    F("lab.mini.gen_end", (MINI_CKPTS,), lambda d: d["checkpoints"][-1]["gen_acc"], "{:.2f}",
      "its generator's held-out accuracy at step 4,000"),
    F("lab.mini.context_auc", (MINI_CKPTS,), lambda d: spread([c["disc_auc_context"] for c in d["checkpoints"]]),
      "{:.2f}-{:.2f}",
      "its raw context AUC (unigram draws) over all checkpoints"),
    # the test suite on this project's CPU machine (benchmarks/results/test_suite_cpu.json, from a real run)
    F("suite.full.tests", (SUITE,), lambda d: d["full"]["passed"] + d["full"]["skipped"], "{:,}",
      "the full suite's tests: passed and skipped"),
    F("suite.full.passed", (SUITE,), "full.passed", "{:,}", "the full suite's tests passed"),
    F("suite.full.skipped", (SUITE,), "full.skipped", "{:,}", "the full suite's tests skipped (no GPU)"),
    F("suite.full.minutes", (SUITE,), lambda d: d["full"]["seconds"] / 60, "{:.1f}",
      "bash .ci/run on a clean clone from start to end, minutes"),
    F("suite.full.tests_minutes", (SUITE,), lambda d: d["full"]["tests_seconds"] / 60, "{:.1f}",
      "the pytest part of that run, minutes"),
    F("suite.fast.passed", (SUITE,), "fast.passed", "{:,}", "the fast tier's tests passed"),
    F("suite.fast.seconds", (SUITE,), "fast.seconds", "{:.0f}", "the fast tier's wall seconds"),
    F("suite.commit", (SUITE,), lambda d: d["commit"][:7], "{}", "the commit the suite ran at"),
    F("suite.machine", (SUITE,), "machine", "{}", "the machine it ran on"),
    F("suite.load", (SUITE,), "load", "{}", "the machine's load average while it ran"),
]
BY_NAME = {f.name: f for f in FIGURES}
assert len(BY_NAME) == len(FIGURES), "two figures share a name"

MARKED = re.compile(r"<!--f:([a-z0-9_.]+)-->(.*?)<!--/f-->")
CARDS_BLOCK = re.compile(r"(<!--cards-->\n)(.*?)(<!--/cards-->)", re.DOTALL)
# the cards of the guide: name, compute capability (NVIDIA's list), memory in GB as sold
GUIDE_CARDS = [("V100", (7, 0), "16/32"), ("T4", (7, 5), "16"), ("RTX 2080 Ti", (7, 5), "11"),
               ("RTX 3090", (8, 6), "24"), ("RTX 4090", (8, 9), "24"), ("A100", (8, 0), "40/80"),
               ("H100", (9, 0), "80"), ("H200", (9, 0), "141")]
MEASURED_ON = {"H100": "measured (h100-2026-11-26)", "H200": "measured (h200-2026-11-26)"}


def text_files(root: Path = ROOT) -> list[Path]:
    """The text whose figures are checked: README.md, tinyelectra/docs/*.md, benchmarks/README.md and
    benchmarks/lab/README.md."""
    return [root / "README.md", *sorted((root / "tinyelectra" / "docs").glob("*.md")),
            root / "benchmarks" / "README.md", root / "benchmarks" / "lab" / "README.md"]


def card_guide() -> str:
    """The card guide's table, from the runtime's own card policy."""
    from tinyelectra.runtime import card_policy

    lines = ["| card | capability | memory (GB) | precision | compile | attention | GEMMs | install | speed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, cap, memory in GUIDE_CARDS:
        c = card_policy(cap, name)
        precision = "bf16" if c.precision == "bf16" else "fp16 + loss scaling"
        compile_ = "inductor + CUDA graphs" if c.inductor else "eager"
        install = "CUDA 12.6 build" if "cu126" in c.wheel else "default"
        lines.append(f"| {name} | {cap[0]}.{cap[1]} | {memory} | {precision} | {compile_} | {c.attention} | "
                     f"{c.gemms} | {install} | "
                     f"{MEASURED_ON.get(name, 'not measured')} |")
    return "\n".join(lines) + "\n"


def render(text: str, root: Path = ROOT) -> str:
    """`text` with every marked figure and the card guide written from the files."""
    def figure(m: re.Match) -> str:
        name = m.group(1)
        return f"<!--f:{name}-->{BY_NAME[name].value(root)}<!--/f-->" if name in BY_NAME else m.group(0)

    text = MARKED.sub(figure, text)
    return CARDS_BLOCK.sub(lambda m: m.group(1) + card_guide() + m.group(3), text)


def check(files: list[Path], root: Path = ROOT) -> list[str]:
    """One line per disagreement: a marked figure whose text is not its file's value, an unknown figure name, a card
    guide that is not the policy's; [] when the text and the files agree."""
    problems = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for m in MARKED.finditer(text):
            name, shown = m.groups()
            if name not in BY_NAME:
                problems.append(f"{path.name}: figure {name!r} is not in benchmarks/figures.py")
            elif shown != (value := BY_NAME[name].value(root)):
                problems.append(f"{path.name}: {name} says {shown!r}, its file says {value!r} "
                                f"({BY_NAME[name].files[0]})")
        for m in CARDS_BLOCK.finditer(text):
            if m.group(2) != card_guide():
                problems.append(f"{path.name}: the card guide is not what tinyelectra.runtime.card_policy picks")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write every figure and the card guide into the text")
    ap.add_argument("--list", action="store_true", help="print every figure: name, value, file")
    args = ap.parse_args(argv)
    if args.list:
        for f in FIGURES:
            print(f"{f.name:32} {f.value():>14}  {f.files[0]}  ({f.what})")
        return 0
    if args.write:
        for path in text_files():
            text = path.read_text(encoding="utf-8")
            if (new := render(text)) != text:
                path.write_text(new, encoding="utf-8")
                print(f"wrote {path.relative_to(ROOT)}")
        return 0
    problems = check(text_files())
    for line in problems:
        print(line, file=sys.stderr)
    used = {m.group(1) for p in text_files() for m in MARKED.finditer(p.read_text(encoding="utf-8"))}
    print(f"{len(used)} figures cited, {len(problems)} disagreements; {len(FIGURES) - len(used)} of the table unused")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
