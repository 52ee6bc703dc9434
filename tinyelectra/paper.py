"""The published numbers tinyelectra compares itself with, as data, each with its source.

What lives here: constants copied from the ELECTRA paper (Clark et al., ICLR 2020, arXiv 2003.10555), the official
repository's README and the PyTorch reproduction's README (richarddwang/electra_pytorch), and the anchors a run's
verdict is computed against (ANCHORS, metrics.verdict_against_anchors). Nothing here is computed from our runs;
report.py puts these beside ours and labels them as the paper's.

Caveats that travel with the numbers (the report prints them):
- The paper's GLUE score is the mean over 8 tasks (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE; no WNLI) with
  CoLA as Matthews correlation, STS-B as Spearman and the rest accuracy; dev set, median over fine-tuning seeds.
- Table 1's ELECTRA-Small was pre-trained on Wikipedia + BooksCorpus; the per-task row is the OpenWebText model.
- "Train FLOPs" follow the official counting convention (flops.py, paper convention); the partial rows are the
  full 1.424e18 times 1/16 ... 1/2, rounded as printed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

PAPER = "Clark et al., ELECTRA (ICLR 2020, arXiv 2003.10555)"
TABLE1_SOURCE = f"{PAPER}, Table 1 (ELECTRA-Small partially trained, GLUE dev, 8 tasks without WNLI)"
OFFICIAL_README = "google-research/electra README, GLUE dev results (ELECTRA-Small-OWT: OpenWebText, 1M steps)"
PYTORCH_README = "richarddwang/electra_pytorch README (ELECTRA-Small on OpenWebText, mean of 10 fine-tuning runs)"
REPLICATION_6_25 = ("a public PyTorch replication of ELECTRA-Small's 6.25% point (one V100, 6 h, transformers' "
                    "Trainer, OpenWebText), as quoted in tinyelectra's issue 34 (not in ../shared/REFERENCE.md)")

# Tasks of the paper's GLUE score, in the paper's column order.
PAPER_TASKS: tuple[str, ...] = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")
PAPER_GLUE_NOTE = (
    "paper GLUE = mean of 8 dev tasks without WNLI (CoLA Matthews corr., STS-B Spearman, others accuracy), "
    "median over fine-tuning seeds; pre-trained on Wikipedia + BooksCorpus (Table 1) or OpenWebText (per-task rows)"
)


@dataclass(frozen=True)
class Table1Row:
    """One row of the paper's Table 1: ELECTRA-Small at a fraction of its 1M-step run on one V100."""

    model: str
    fraction: float  # of the 1M-step schedule
    steps: int
    train_flops_paper: float  # as printed in the paper (official convention)
    v100_time: str  # as printed
    v100_hours: float
    glue_dev: float  # 8 tasks, no WNLI
    source: str = TABLE1_SOURCE

    def to_dict(self) -> dict:
        return asdict(self)


TABLE1: tuple[Table1Row, ...] = (
    Table1Row("ELECTRA-Small", 0.0625, 62_500, 8.9e16, "6h", 6.0, 74.1),
    Table1Row("ELECTRA-Small", 0.125, 125_000, 1.8e17, "12h", 12.0, 76.0),
    Table1Row("ELECTRA-Small", 0.25, 250_000, 3.6e17, "1d", 24.0, 77.7),
    Table1Row("ELECTRA-Small", 0.5, 500_000, 7.1e17, "2d", 48.0, 79.0),
    Table1Row("ELECTRA-Small", 1.0, 1_000_000, 1.4e18, "4d", 96.0, 79.9),
)

# BERT-Small trained with the same compute as the full ELECTRA-Small run (Table 1).
BERT_SMALL = {"model": "BERT-Small", "train_flops_paper": 1.4e18, "glue_dev": 75.1, "source": TABLE1_SOURCE}


@dataclass(frozen=True)
class PerTaskRow:
    """Per-task GLUE dev scores (x100): CoLA Matthews corr., STS-B Spearman, the others accuracy."""

    model: str
    scores: dict[str, float]  # task -> score
    average: float  # as published
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


PER_TASK: tuple[PerTaskRow, ...] = (
    PerTaskRow(
        "ELECTRA-Small (OpenWebText, 1M steps; median over seeds)",
        {"cola": 56.8, "sst2": 88.3, "mrpc": 87.4, "stsb": 86.8, "qqp": 88.3, "mnli": 78.9, "qnli": 87.9, "rte": 68.5},
        80.4,
        OFFICIAL_README,
    ),
    PerTaskRow(
        "ELECTRA-Small, PyTorch reproduction (mean of 10 runs)",
        {"cola": 58.7, "sst2": 88.0, "mrpc": 86.0, "stsb": 86.2, "qqp": 88.6, "mnli": 80.4, "qnli": 87.5, "rte": 67.5},
        80.4,
        PYTORCH_README,
    ),
)

# A run's verdict: its average over these five tasks (the GPU check's) against the same tasks' average of each anchor:
# the released ELECTRA-Small-OWT at 1M steps (the per-task row above; ../shared/REFERENCE.md), and the
# replication of the paper's 6.25% point, the bar a run of that length clears first.
VERDICT_TASKS: tuple[str, ...] = ("cola", "sst2", "mrpc", "stsb", "rte")
ANCHORS: dict[str, PerTaskRow] = {
    "ELECTRA-Small-OWT at 1M steps": PER_TASK[0],
    "the 6.25% point's replication": PerTaskRow(
        "ELECTRA-Small at 6.25% (62.5k steps), a replication",
        {"cola": 38.0, "sst2": 63.9, "mrpc": 67.5, "stsb": 69.9, "rte": 60.3}, 66.8, REPLICATION_6_25),  # 66.8: GLUE-8
}

# Fine-tuning run-to-run standard deviation on the small tasks (the PyTorch reproduction's runs), for reading our seed
# spreads.
FINETUNE_STD = {"rte": 1.9, "cola": 1.3}


def table1_by_fraction() -> dict[float, Table1Row]:
    return {row.fraction: row for row in TABLE1}


def published() -> dict:
    """Everything above as one JSON-ready dict (what report.json stores under "paper")."""
    return {
        "table1": [r.to_dict() for r in TABLE1],
        "bert_small": dict(BERT_SMALL),
        "per_task": [r.to_dict() for r in PER_TASK],
        "anchors": {label: r.to_dict() for label, r in ANCHORS.items()},
        "finetune_std": dict(FINETUNE_STD),
        "note": PAPER_GLUE_NOTE,
    }
