"""GLUE data: the task table (nine GLUE tasks, the AX diagnostic, tasks of your own), readers (classic `glue_data`
folders, Hugging Face `datasets`), pair encoding and GLUE submission files (metrics: metrics.py; fine-tuning: glue.py;
RELEASED_LR_ARM, the results folder glue and the report share).
A task travels as its `TaskSpec` (a split holds its own): GLUE's are found by name in TASKS, a table nothing writes
into; a task of your own is the TaskSpec `load_task_file` returns, its files inside it.

Facts were checked against the classic `download_glue_data.py` layout, the Hugging Face GLUE builder
(column names, label order), the official ELECTRA fine-tuning code (column positions, BERT's truncation rule,
MRPC/STS-B swapped pairs) and GLUE's submission format as written by jiant's formatter (`index<TAB>prediction`,
file names CoLA.tsv ... AX.tsv, labels in the vocabulary of the task's own files).

Reading rules (the classic files' quirks):
- Quoting is OFF: a line is split on tabs and nothing else (csv.QUOTE_NONE). With csv's default quoting an
  unbalanced `"` in SST-2, MRPC or QNLI swallows the following lines.
- The header row is found by its column names; CoLA train/dev and QQP's `dev.partial.tsv` have none and are read
  by position. A UTF-8 byte-order mark (MRPC's header) is dropped.
- A data row with the wrong number of fields, an unknown label, a bad score or bytes that are not UTF-8 is
  skipped and recorded as a `MalformedLine` (file, line number, reason); `GlueSplit.summary()` gives the caller
  one line to print. A file whose rows are mostly malformed, or a header without the expected columns, is a
  `UserError`: it is the wrong file, not a damaged one. A label that is not one of the task's is more than damage
  (a task file whose labels do not match its data): `GlueSplit.refuse_bad_labels` makes it an error naming the first
  such line, unless the user asks to skip such rows (`glue --skip-bad-labels`).

Shapes: M examples, B batch, T tokens.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from tinyelectra.config import read_toml
from tinyelectra.errors import UserError
from tinyelectra.files import path_part, write_atomic
from tinyelectra.paper import PAPER_TASKS

# ----------------------------------------------------------------------------------------------------------------
# The task table
# ----------------------------------------------------------------------------------------------------------------

# Metric keys (computed in metrics.py). The paper's score and the GLUE leaderboard's score each name one.
ACCURACY = "accuracy"
F1 = "f1"
MATTHEWS = "matthews_corr"
PEARSON = "pearson"
SPEARMAN = "spearman"
F1_ACCURACY_MEAN = "f1_accuracy_mean"  # GLUE leaderboard for MRPC and QQP
PEARSON_SPEARMAN_MEAN = "pearson_spearman_mean"  # GLUE leaderboard for STS-B

HF_DATASET = "nyu-mll/glue"
DEFAULT_MAX_LENGTH = 128  # tokens, the paper's fine-tuning length (official configure_finetuning.py)
# the folder of OUT/<checkpoint> that `glue --released-lr` writes its second arm into (glue.py) and the report reads
RELEASED_LR_ARM = "released-lr"


@dataclass(frozen=True)
class TaskSpec:
    """Everything tinyelectra knows about one GLUE task. Class id i is `file_labels[i]` in the files and
    `label_names[i]` in Hugging Face's ClassLabel, so both readers give the same ids."""

    name: str  # our key: "sst2"; also the Hugging Face `datasets` config name
    dir_name: str  # folder in glue_data: "SST-2"
    text_columns: tuple[str, ...]  # header names of segment A (and B)
    file_labels: tuple[str, ...]  # label strings as written in the files, in class-id order; () = regression
    label_names: tuple[str, ...]  # readable names in the same order (= Hugging Face ClassLabel names)
    submission_files: Mapping[str, str]  # test split -> file name in a GLUE submission
    # split -> file name in the task's folder ("train", "dev", "test", MNLI's dev_matched ...)
    files: Mapping[str, str] = field(default_factory=lambda: {s: f"{s}.tsv" for s in ("train", "dev", "test")})
    label_column: str | None = "label"  # header name of the label in labelled files (None: AX has no labels)
    index_column: str | None = "index"  # header name of the example id in test files (QQP: "id")
    paper_metric: str = ACCURACY  # the ELECTRA paper's number for this task
    glue_metric: str = ACCURACY  # the GLUE leaderboard's number for this task
    hf_text_columns: tuple[str, ...] = ()  # Hugging Face column names of segment A (and B); () = text_columns
    headerless_columns: tuple[str, ...] | None = None  # column names of labelled files written without a header
    epochs: int = 3  # fine-tuning epochs (the paper's fine-tuning appendix: 3, 10 for RTE and STS-B)
    swap_pairs: bool = False  # MRPC, STS-B: also train on (B, A) (official configure_finetuning.py: double_unordered)
    score_range: tuple[float, float] | None = None  # regression targets' range (STS-B: 0 to 5)
    paths: Mapping[str, Path] = field(default_factory=dict)  # a task of your own: split -> its file; GLUE's: {}

    @property
    def is_regression(self) -> bool:
        return not self.file_labels

    @property
    def num_labels(self) -> int:
        """Width of the classifier's output: 1 for regression."""
        return 1 if self.is_regression else len(self.file_labels)

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    @property
    def dev_splits(self) -> tuple[str, ...]:
        return tuple(s for s in self.files if s.startswith("dev"))

    @property
    def test_splits(self) -> tuple[str, ...]:
        return tuple(s for s in self.files if s.startswith("test"))

    @property
    def primary_dev_split(self) -> str:
        """The dev split behind the task's single number (MNLI: matched, as the paper and official code)."""
        return self.dev_splits[0]


TASKS: Mapping[str, TaskSpec] = MappingProxyType({
    t.name: t
    for t in (
        TaskSpec(
            name="cola", dir_name="CoLA", text_columns=("sentence",), file_labels=("0", "1"),
            label_names=("unacceptable", "acceptable"), paper_metric=MATTHEWS, glue_metric=MATTHEWS,
            submission_files={"test": "CoLA.tsv"},
            # train/dev: source code, label, the original author's mark ("*"), sentence; no header.
            headerless_columns=("source", "label", "label_notes", "sentence"),
        ),
        TaskSpec(
            name="sst2", dir_name="SST-2", text_columns=("sentence",), file_labels=("0", "1"),
            label_names=("negative", "positive"), submission_files={"test": "SST-2.tsv"},
        ),
        TaskSpec(
            name="mrpc", dir_name="MRPC", text_columns=("#1 String", "#2 String"), label_column="Quality",
            file_labels=("0", "1"), label_names=("not_equivalent", "equivalent"), glue_metric=F1_ACCURACY_MEAN,
            submission_files={"test": "MRPC.tsv"}, hf_text_columns=("sentence1", "sentence2"), swap_pairs=True,
        ),
        TaskSpec(
            name="stsb", dir_name="STS-B", text_columns=("sentence1", "sentence2"), label_column="score",
            file_labels=(), label_names=(), paper_metric=SPEARMAN, glue_metric=PEARSON_SPEARMAN_MEAN,
            submission_files={"test": "STS-B.tsv"}, epochs=10, swap_pairs=True, score_range=(0.0, 5.0),
        ),
        TaskSpec(
            name="qqp", dir_name="QQP", text_columns=("question1", "question2"), label_column="is_duplicate",
            file_labels=("0", "1"), label_names=("not_duplicate", "duplicate"), index_column="id",
            glue_metric=F1_ACCURACY_MEAN, submission_files={"test": "QQP.tsv"},
            headerless_columns=("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
        ),
        TaskSpec(
            name="mnli", dir_name="MNLI",
            files={s: f"{s}.tsv" for s in ("train", "dev_matched", "dev_mismatched", "test_matched",
                                            "test_mismatched")},
            text_columns=("sentence1", "sentence2"), label_column="gold_label",
            file_labels=("entailment", "neutral", "contradiction"),
            label_names=("entailment", "neutral", "contradiction"),
            submission_files={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"},
            hf_text_columns=("premise", "hypothesis"),
        ),
        TaskSpec(
            name="qnli", dir_name="QNLI", text_columns=("question", "sentence"),
            file_labels=("entailment", "not_entailment"), label_names=("entailment", "not_entailment"),
            submission_files={"test": "QNLI.tsv"},
        ),
        TaskSpec(
            name="rte", dir_name="RTE", text_columns=("sentence1", "sentence2"),
            file_labels=("entailment", "not_entailment"), label_names=("entailment", "not_entailment"),
            submission_files={"test": "RTE.tsv"}, epochs=10,
        ),
        TaskSpec(
            name="wnli", dir_name="WNLI", text_columns=("sentence1", "sentence2"), file_labels=("0", "1"),
            label_names=("not_entailment", "entailment"), submission_files={"test": "WNLI.tsv"},
        ),
        # The diagnostic set: test only, predicted by the MNLI model, submitted as AX.tsv.
        TaskSpec(
            name="ax", dir_name="diagnostic", files={"test": "diagnostic.tsv"}, text_columns=("sentence1", "sentence2"),
            label_column=None, file_labels=("entailment", "neutral", "contradiction"),
            label_names=("entailment", "neutral", "contradiction"), submission_files={"test": "AX.tsv"},
            hf_text_columns=("premise", "hypothesis"),
        ),
    )
})

# The nine GLUE tasks a model is fine-tuned on ("all"); AX is predicted with the MNLI model.
GLUE_TASK_NAMES: tuple[str, ...] = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
# The eight tasks of the paper's GLUE score (WNLI left out, as BERT and ELECTRA did): paper.py's.
PAPER_TASK_NAMES: tuple[str, ...] = PAPER_TASKS


def task_title(task: str) -> str:
    """How reports print a task: GLUE's own spelling (its folder's name, "SST-2"); a task of your own
    (glue --task-file) goes by its name."""
    return TASKS[task].dir_name if task in GLUE_TASK_NAMES else task


def _norm(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


# ----------------------------------------------------------------------------------------------------------------
# Custom tasks: TSV, CSV or JSONL files described by a small TOML file (KLUE, JGLUE, CLUE, ASSIN, your own)
# ----------------------------------------------------------------------------------------------------------------

MACRO_F1 = "macro_f1"
CUSTOM_METRICS = (ACCURACY, F1, MACRO_F1, MATTHEWS, PEARSON, SPEARMAN)  # pearson, spearman: regression
CUSTOM_FORMATS = (".tsv", ".csv", ".jsonl")
TASK_FILE_KEYS = {"name", "train", "dev", "test", "text_columns", "label_column", "labels", "metric", "epochs",
                  "index_column"}


def load_task_file(path: str | Path) -> TaskSpec:
    """Read a custom task's TOML description (tinyelectra/docs/glue.md, "Tasks of your own"), check its files and
    columns: its TaskSpec, files included, which reading, fine-tuning, metrics and glue.json then treat as they treat
    GLUE's."""
    path = Path(path)
    raw = read_toml(path, "--task-file ")
    where = f"--task-file {path}"
    unknown = sorted(set(raw) - TASK_FILE_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(TASK_FILE_KEYS))})")
    for key in ("name", "train", "dev", "text_columns", "label_column", "metric"):
        if key not in raw:
            raise UserError(f"{where}: missing {key!r} (a task file names: name, train, dev, text_columns, "
                            "label_column, metric; tinyelectra/docs/glue.md, \"Tasks of your own\")")
    name = path_part(str(raw["name"]), f"{where}: name")  # it names the submission file and results
    if _norm(name) in _ALIASES:
        raise UserError(f"{where}: name {name!r} is a GLUE task's; choose another")
    columns = raw["text_columns"]
    if not (isinstance(columns, list) and 1 <= len(columns) <= 2 and all(isinstance(c, str) for c in columns)):
        raise UserError(f"{where}: text_columns must list one or two column names")
    metric = raw["metric"]
    if metric not in CUSTOM_METRICS:
        raise UserError(f"{where}: metric {metric!r} is not one of {', '.join(CUSTOM_METRICS)}")
    regression = metric in (PEARSON, SPEARMAN)
    files = {}
    for split in [s for s in ("train", "dev", "test") if s in raw]:
        f = (path.parent / str(raw[split])).resolve()
        if f.suffix.lower() not in CUSTOM_FORMATS:
            raise UserError(f"{where}: {split} file {f.name}: expected {', '.join(CUSTOM_FORMATS)}")
        if not f.is_file():
            raise UserError(f"{where}: {split} file {f} not found")
        files[split] = f
    labels = raw.get("labels")
    if regression:
        if labels:
            raise UserError(f"{where}: metric {metric} is for numeric labels (regression); drop 'labels'")
        labels = []
    elif labels is None:  # the train file's label values, sorted
        rows, _ = _custom_rows(files["train"], [raw["label_column"]], where)
        labels = sorted({r[raw["label_column"]].strip() for r in rows if r and r.get(raw["label_column"]) is not None})
    labels = [str(x) for x in labels]
    if not regression and len(labels) < 2:
        raise UserError(f"{where}: a classification task needs at least two labels (found {labels})")
    if metric == F1 and len(labels) != 2:
        raise UserError(f"{where}: metric f1 is for two labels; use macro_f1 for {len(labels)}")
    epochs = raw.get("epochs", 3)
    if not isinstance(epochs, int) or epochs < 1:
        raise UserError(f"{where}: epochs must be a whole number >= 1")
    spec = TaskSpec(
        name=name, dir_name=name, files={split: split for split in files}, text_columns=tuple(columns),
        label_column=str(raw["label_column"]), file_labels=tuple(labels), label_names=tuple(labels),
        index_column=raw.get("index_column"), paper_metric=metric, glue_metric=metric,
        submission_files={"test": f"{name}.tsv"}, epochs=epochs, paths=files,
    )
    return spec


def _custom_rows(path: Path, required: list[str], where: str) -> tuple[list[dict[str, str] | None], int]:
    """The rows of a .tsv (a header line, then tab-separated fields, nothing quoted, as GLUE's files), .csv (a header
    line, RFC 4180 quoting) or .jsonl (one object per line) file as {column: text}; None for a line that could not be
    read (listed as malformed by the caller). Returns (rows, 1-based line number of the first row)."""
    suffix = path.suffix.lower()
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: {path} is not UTF-8 text (byte {e.start})") from None
    if suffix == ".jsonl":
        rows: list[dict[str, str] | None] = []
        for line in (x for x in text.split("\n") if x.strip()):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None  # listed as malformed, as a record that is not an object
            rows.append({k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()}
                        if isinstance(record, dict) else None)
        present = set().union(*(r for r in rows if r))
    else:
        lines = text.split("\n")
        table = ([line.rstrip("\r").split("\t") for line in lines if line.strip()] if suffix == ".tsv"
                 else [r for r in csv.reader(lines) if r])
        if not table:
            raise UserError(f"{where}: {path} has no rows")
        header = [c.strip() for c in table[0]]
        present = set(header)
        rows = [dict(zip(header, r)) if len(r) == len(header) else None for r in table[1:]]
    missing = [c for c in required if c not in present]
    if missing:
        raise UserError(f"{where}: {path} has no column {missing[0]!r} "
                        f"(it has: {', '.join(sorted(present)) or 'none'})")
    return rows, 1 if suffix == ".jsonl" else 2  # .tsv and .csv: the first row follows the header


def read_custom_split(spec: TaskSpec, split: str) -> GlueSplit:
    """One split of a custom task (load_task_file): texts, labels mapped to class ids (or floats), ids. Rows with
    missing fields or unknown labels are skipped and listed, as for GLUE's files."""
    path = spec.paths[split]
    labelled = split != "test"
    required = list(spec.text_columns) + ([spec.label_column] if labelled else [])
    rows, first = _custom_rows(path, required, f"{spec.name} {split}")
    kept, malformed = [], []
    for n, row in enumerate(rows):
        bad_label = False
        if row is None or any(row.get(c) is None for c in required):
            problem = "unreadable line or missing fields"
        else:
            problem = _label_problem(spec, row[spec.label_column].strip()) if labelled else None
            bad_label = problem is not None
        if problem:  # the row's line (JSONL: its record number)
            malformed.append(MalformedLine(str(path), first + n, problem, bad_label))
        else:
            row_id = row[spec.index_column].strip() if spec.index_column and row.get(spec.index_column) else str(n)
            kept.append((row_id, *(row[c] for c in required)))
    if not kept or len(malformed) > len(kept):
        first_bad = f" (first: {malformed[0]})" if malformed else ""
        raise UserError(f"{spec.name} {split}: {len(malformed)} of {len(rows)} rows of {path} are unusable{first_bad}")
    return _kept_split(spec, split, path, kept, labelled, malformed=malformed)


_ALIASES = {_norm(t.name): t.name for t in TASKS.values()} | {_norm(t.dir_name): t.name for t in TASKS.values()}


def get_task(task: TaskSpec | str) -> TaskSpec:
    """A task as its spec: a TaskSpec as it is; a name is one of GLUE's, case- and hyphen-insensitive ("SST-2",
    "sst2", "STS-B")."""
    if isinstance(task, TaskSpec):
        return task
    key = _ALIASES.get(_norm(task))
    if key is None:
        raise UserError(f"unknown GLUE task '{task}'; choose from {', '.join(GLUE_TASK_NAMES)}, ax, or all "
                        "(a task of your own: --task-file)")
    return TASKS[key]


def resolve_tasks(spec: str) -> list[str]:
    """`--tasks` text -> task names: "all" (the nine GLUE tasks) or a comma-separated list, duplicates dropped."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    names = [n for p in parts for n in (GLUE_TASK_NAMES if p.lower() == "all" else [get_task(p).name])]
    names = list(dict.fromkeys(names))  # duplicates dropped, first place kept
    if not names:
        raise UserError(f"--tasks '{spec}' names no task; choose from {', '.join(GLUE_TASK_NAMES)}, or all")
    return names


def _spec_and_split(task: TaskSpec | str, split: str) -> TaskSpec:
    spec = get_task(task)
    if split not in spec.files:
        raise UserError(f"GLUE task '{spec.name}' has no split '{split}'; it has {', '.join(spec.files)}")
    return spec


# ----------------------------------------------------------------------------------------------------------------
# What a reader returns
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MalformedLine:
    """One skipped input row: where it was and why."""

    path: str
    line_number: int  # 1-based line in the file (for Hugging Face data: 1-based row)
    reason: str
    bad_label: bool = False  # a readable row whose label is not one of the task's (or a score out of range)

    def __str__(self) -> str:
        return f"{self.path}:{self.line_number}: {self.reason}"


@dataclass
class GlueSplit:
    """One split of one task, as parallel lists. `labels` is int64 class ids, float32 scores (STS-B), or None
    for test splits. `ids` are the files' example ids (test files' `index`/`id` column, else the row ordinal)."""

    task: TaskSpec
    split: str
    source: str  # file path, or "hf:nyu-mll/glue/rte/validation"
    ids: list[str]
    text_a: list[str]
    text_b: list[str] | None
    labels: np.ndarray | None  # (M,)
    malformed: list[MalformedLine] = field(default_factory=list)
    blank_lines: int = 0  # empty lines (no data, not counted as malformed)

    def __len__(self) -> int:
        return len(self.text_a)

    def summary(self) -> str:
        """One line for the caller to print: rows read, and every skipped line (up to three shown)."""
        line = f"{self.task.name} {self.split}: {len(self):,} rows from {self.source}"
        if self.malformed:
            shown = "; ".join(f"line {m.line_number}: {m.reason}" for m in self.malformed[:3])
            n = len(self.malformed)
            more = f"; and {n - 3} more" if n > 3 else ""
            line += f"; {n} malformed line{'s' if n > 1 else ''} skipped ({shown}{more})"
        return line

    def refuse_bad_labels(self, skip: bool) -> int:
        """Rows whose label is not one of the task's are an error naming the first (file and line) unless `skip`
        (`glue --skip-bad-labels`); returns how many were skipped. Such rows are never dropped silently: a task
        file whose labels do not match its data would otherwise be scored on the rows that happen to match."""
        bad = [m for m in self.malformed if m.bad_label]
        if bad and not skip:
            more = f", and {len(bad) - 1} more such row{'s' if len(bad) > 2 else ''}" if len(bad) > 1 else ""
            raise UserError(f"{bad[0]} ({self.task.name} {self.split}{more}); correct the data (or a task file's "
                            "labels), or skip such rows with --skip-bad-labels (their count is then printed beside "
                            "the score)")
        return len(bad)

    def select(self, indices: Sequence[int] | np.ndarray) -> "GlueSplit":
        """A new split with the rows at `indices` (e.g. the first N for a quick run)."""
        idx = [int(i) for i in indices]
        return dataclasses.replace(
            self,
            ids=[self.ids[i] for i in idx],
            text_a=[self.text_a[i] for i in idx],
            text_b=None if self.text_b is None else [self.text_b[i] for i in idx],
            labels=None if self.labels is None else self.labels[np.asarray(idx, dtype=np.int64)],
        )


def with_swapped_pairs(split: GlueSplit) -> GlueSplit:
    """Training-set augmentation of MRPC and STS-B (official code's `double_unordered`): every pair (A, B) is
    also added as (B, A) with the same label, after the originals. Only for train splits of pair tasks."""
    if split.split != "train":
        raise ValueError(f"swapped pairs are a training augmentation; got the {split.split} split")
    if split.text_b is None:
        raise ValueError(f"{split.task.name} has single sentences; there is no pair to swap")
    return dataclasses.replace(
        split,
        ids=split.ids + [f"{i}-swapped" for i in split.ids],
        text_a=split.text_a + split.text_b,
        text_b=split.text_b + split.text_a,
        labels=None if split.labels is None else np.concatenate([split.labels, split.labels]),
    )


# ----------------------------------------------------------------------------------------------------------------
# The classic glue_data layout
# ----------------------------------------------------------------------------------------------------------------


def find_split_file(glue_dir: str | Path | None, task: TaskSpec | str, split: str) -> Path | None:
    """The file of one split if it exists, else None (no error): for choosing the tasks that have data."""
    if (spec := get_task(task)).paths:
        return spec.paths.get(split)
    _spec_and_split(spec, split)  # an unknown split stays an error
    try:
        return split_file(glue_dir, spec, split)
    except UserError:
        return None


def split_file(glue_dir: str | Path, task: TaskSpec | str, split: str) -> Path:
    """The file of one split, or a UserError that says which folder and files were expected."""
    spec = _spec_and_split(task, split)
    glue_dir = Path(glue_dir)
    if not glue_dir.is_dir():
        raise UserError(f"GLUE directory {glue_dir} does not exist (expected the classic glue_data layout)")
    folder = glue_dir / spec.dir_name
    if not folder.is_dir():
        wanted = {_norm(spec.dir_name), _norm(spec.name)}  # accept "sst2", "sts-b", "Cola" ...: users rename folders
        folder = next((e for e in sorted(glue_dir.iterdir()) if e.is_dir() and _norm(e.name) in wanted), None)
    expected = ", ".join(f"{spec.dir_name}/{f}" for f in spec.files.values())
    if folder is None:
        raise UserError(f"GLUE task '{spec.name}': no folder {spec.dir_name} in {glue_dir} (expected {expected}, "
                        "the classic glue_data layout)")
    path = folder / spec.files[split]
    if not path.is_file():
        present = ", ".join(sorted(p.name for p in folder.iterdir() if p.is_file())) or "nothing"
        raise UserError(f"GLUE task '{spec.name}': {path} not found (expected {expected}; {folder} holds {present})")
    return path


def read_split(glue_dir: str | Path | None, task: TaskSpec | str, split: str) -> GlueSplit:
    """Read one split from the classic glue_data layout (`glue_dir/RTE/dev.tsv`, `glue_dir/MNLI/dev_matched.tsv`),
    or a custom task's file (load_task_file)."""
    spec = get_task(task)
    return read_custom_split(spec, split) if spec.paths else read_tsv(split_file(glue_dir, spec, split), spec, split)


def read_tsv(path: str | Path, task: TaskSpec | str, split: str) -> GlueSplit:
    """Read one GLUE TSV file as `split` of `task` (any file name: e.g. QQP's `dev.partial.tsv`), by the reading rules
    of the module docstring: tabs only, nothing quoted, bad rows skipped and listed in `.malformed`."""
    spec = _spec_and_split(task, split)
    path = Path(path)
    labelled = not split.startswith("test") and spec.label_column is not None
    required = list(spec.text_columns) + ([spec.label_column] if labelled else [])
    where = f"{path} ({spec.name} {split})"

    kept, malformed = [], []
    blank_lines = data_rows = 0
    columns: list[str] | None = None
    try:
        handle = open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    with handle:
        # Binary lines split on b"\n" only: a stray "\r" inside a field must not end the row.
        for line_number, raw in enumerate(handle, start=1):
            raw = (raw.removeprefix(b"\xef\xbb\xbf") if line_number == 1 else raw).rstrip(b"\r\n")  # BOM
            if not raw:
                blank_lines += 1
                continue
            try:
                fields = raw.decode("utf-8").split("\t")
            except UnicodeDecodeError:
                fields = None

            if columns is None:  # the first non-blank line: a header, or data of a headerless file
                header = [f.strip() for f in fields] if fields is not None else []
                is_header = all(c in header for c in required)
                if is_header:
                    columns = header
                elif labelled and spec.headerless_columns is not None:
                    columns = list(spec.headerless_columns)  # CoLA train/dev, QQP dev.partial: this line is data
                else:
                    missing = ", ".join(c for c in required if c not in header)
                    found = ", ".join(header[:8]) + (" ..." if len(header) > 8 else "")
                    raise UserError(f"{where}: expected a header with columns {', '.join(required)}; "
                                    f"line {line_number} has ({found}), missing {missing}")
                positions = [columns.index(c) for c in required]
                index_position = columns.index(spec.index_column) if spec.index_column in columns else None
                if is_header:
                    continue

            data_rows += 1
            bad_label = False
            if fields is None:
                problem = "not valid UTF-8"
            elif len(fields) != len(columns):
                problem = f"{len(fields)} field{'' if len(fields) == 1 else 's'}, expected {len(columns)}"
            else:
                problem = _label_problem(spec, fields[positions[-1]].strip()) if labelled else None
                bad_label = problem is not None
            if problem:
                malformed.append(MalformedLine(str(path), line_number, problem, bad_label))
            else:
                row_id = fields[index_position].strip() if index_position is not None else str(data_rows - 1)
                kept.append((row_id, *(fields[p] for p in positions)))

    if columns is None or data_rows == 0:
        raise UserError(f"{where}: no data rows")
    if not kept or len(malformed) > len(kept):
        raise UserError(f"{where}: {len(malformed)} of {data_rows} rows are malformed (first: line "
                        f"{malformed[0].line_number}: {malformed[0].reason}); is this the {spec.name} {split} file?")
    return _kept_split(spec, split, path, kept, labelled, malformed=malformed, blank_lines=blank_lines)


def _kept_split(spec: TaskSpec, split: str, path: Path, kept: list[tuple[str, ...]], labelled: bool,
                **extra) -> GlueSplit:
    """A reader's kept rows, (id, text A[, text B][, label as written]) each, as a GlueSplit."""
    ids, *columns = (list(c) for c in zip(*kept))
    labels = None
    if labelled:
        written = [v.strip() for v in columns.pop()]
        labels = (np.asarray([float(v) for v in written], dtype=np.float32) if spec.is_regression
                  else np.asarray([spec.file_labels.index(v) for v in written], dtype=np.int64))
    return GlueSplit(task=spec, split=split, source=str(path), ids=ids, text_a=columns[0],
                     text_b=columns[1] if spec.is_pair else None, labels=labels, **extra)


def _label_problem(spec: TaskSpec, value: str) -> str | None:
    if not spec.is_regression:
        return None if value in spec.file_labels else f"label '{value}' is not one of {', '.join(spec.file_labels)}"
    try:
        score = float(value)
    except ValueError:
        return f"score '{value}' is not a number"
    low, high = spec.score_range or (-np.inf, np.inf)
    if not (low <= score <= high):  # also catches nan
        return f"score {value} outside [{low:g}, {high:g}]"
    return None


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face `datasets`
# ----------------------------------------------------------------------------------------------------------------

def load_hf_split(task: TaskSpec | str, split: str, dataset_name: str | None = None) -> GlueSplit:
    """Read one split through Hugging Face `datasets` (`load_dataset("nyu-mll/glue", "rte", split="validation")`;
    `dataset_name` default HF_DATASET, or a local copy of that repository); a missing `datasets` package or an
    unreachable hub is a UserError, one line. datasets' progress bars stay off: plain lines in logs."""
    spec = _spec_and_split(task, split)
    dataset_name = dataset_name or HF_DATASET
    try:
        import datasets
    except ImportError:
        raise UserError("reading GLUE from Hugging Face needs the `datasets` package (pip install "
                        "'tinyelectra[data]'); or use --glue-dir with the classic glue_data folders") from None
    datasets.disable_progress_bars()
    hf_split = split.replace("dev", "validation")  # dev_matched -> validation_matched; train, test_* unchanged
    try:
        ds = datasets.load_dataset(dataset_name, spec.name, split=hf_split)
    except Exception as e:  # network, offline mode, missing config: all mean "not available from here"
        reason = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserError(f"could not load {dataset_name} '{spec.name}' split '{hf_split}' from the Hugging Face hub "
                        f"({type(e).__name__}: {reason}); use --glue-dir with the classic glue_data folders "
                        "instead") from None
    return from_hf_dataset(ds, spec, split, source=f"hf:{dataset_name}/{spec.name}/{hf_split}")


def from_hf_dataset(ds, task: TaskSpec | str, split: str, source: str) -> GlueSplit:
    """Turn a loaded Hugging Face GLUE split (columns: texts, `label`, `idx`) into a GlueSplit. Class ids are mapped
    by the dataset's ClassLabel names, so they match the classic reader's ids; rows with label -1 (missing) are
    skipped and listed as malformed."""
    spec = _spec_and_split(task, split)
    labelled = not split.startswith("test") and spec.label_column is not None
    columns = spec.hf_text_columns or spec.text_columns
    needed = list(columns) + (["label"] if labelled else [])
    missing = [c for c in needed if c not in ds.column_names]
    if missing:
        raise UserError(f"{source}: columns {', '.join(missing)} missing (has {', '.join(ds.column_names)})")
    texts = [list(ds[c]) for c in columns]
    n = len(texts[0])
    ids = [str(i) for i in (ds["idx"] if "idx" in ds.column_names else range(n))]
    malformed, labels, bad = [], None, np.zeros(n, dtype=bool)
    if labelled:
        raw = np.asarray(list(ds["label"]))
        if spec.is_regression:
            labels = raw.astype(np.float32)
            bad = ~np.isfinite(labels)
        else:
            names = getattr(ds.features["label"], "names", None)
            if names is not None:  # ClassLabel: map its order onto ours by name
                unknown = [x for x in names if x not in spec.label_names]
                if unknown:
                    raise UserError(f"{source}: label names {unknown} are not {spec.name}'s {spec.label_names}")
                remap = np.asarray([spec.label_names.index(x) for x in names] + [-1], dtype=np.int64)
                raw = raw.astype(np.int64)
                labels = remap[np.clip(raw, -1, len(names))]  # missing (-1) or out of range: remap's last entry, -1
            else:
                labels = raw.astype(np.int64)
            bad = (labels < 0) | (labels >= spec.num_labels)
        malformed = [MalformedLine(source, int(i) + 1, f"label {raw[i]} missing or out of range", True)
                     for i in np.flatnonzero(bad)]
    every_row = GlueSplit(task=spec, split=split, source=source, ids=ids, text_a=texts[0],
                          text_b=texts[1] if spec.is_pair else None, labels=labels, malformed=malformed)
    return every_row.select(np.flatnonzero(~bad))


# ----------------------------------------------------------------------------------------------------------------
# Pair encoding: [CLS] A [SEP] B [SEP], BERT's truncation, dynamic or fixed padding
# ----------------------------------------------------------------------------------------------------------------


def truncate_pair_lengths(len_a: np.ndarray, len_b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Segment lengths after BERT's rule: while A + B > budget, drop the last token of the longer segment
    (of B when they are equal). Closed form of that loop, for all examples at once."""
    a, b = np.asarray(len_a, dtype=np.int64), np.asarray(len_b, dtype=np.int64)
    short = np.minimum(a, b)
    over = a + b > budget
    # Cutting only the longer one suffices when it can end at budget - short without passing the shorter.
    longer_only = over & (budget - short >= short)
    both = over & ~longer_only  # then the loop alternates: A ends at ceil(budget / 2), B at floor(budget / 2)
    keep_a = np.where(both, (budget + 1) // 2, np.where(longer_only & (a > b), budget - b, a))
    keep_b = np.where(both, budget // 2, np.where(longer_only & (a <= b), budget - a, b))
    return keep_a, keep_b


@dataclass
class PaddedBatch:
    """One batch as numpy arrays, ready for torch.from_numpy. Names follow transformers."""

    input_ids: np.ndarray  # (B, T) int64
    token_type_ids: np.ndarray  # (B, T) int64: 0 for [CLS] A [SEP], 1 for B [SEP]
    attention_mask: np.ndarray  # (B, T) int64: 1 for tokens, 0 for padding
    labels: np.ndarray | None  # (B,) int64 class ids or float32 scores


@dataclass
class EncodedSplit:
    """Every example's `[CLS] A [SEP] (B [SEP])` back to back, tokenized once; batches are cut from it."""

    token_ids: np.ndarray  # (sum of lengths,) int32
    offsets: np.ndarray  # (M + 1,) int64: example i is token_ids[offsets[i]:offsets[i + 1]]
    segment_a_lengths: np.ndarray  # (M,) int64: tokens of [CLS] A [SEP]
    labels: np.ndarray | None  # (M,)
    pad_id: int
    truncated: int  # examples that lost tokens to max_length

    def __len__(self) -> int:
        return len(self.segment_a_lengths)

    @property
    def lengths(self) -> np.ndarray:  # (M,)
        return np.diff(self.offsets)

    def batch(self, indices: Sequence[int] | np.ndarray, pad_to: int | None = None) -> PaddedBatch:
        """Rows `indices` padded to the batch's longest (pad_to=None: dynamic padding) or to `pad_to` tokens
        (static shapes, e.g. for torch.compile)."""
        idx = np.asarray(indices, dtype=np.int64)  # (B,)
        lengths = self.lengths[idx]  # (B,)
        width = int(lengths.max()) if pad_to is None else int(pad_to)
        if width < int(lengths.max()):
            raise ValueError(f"pad_to={pad_to} is shorter than the batch's longest example ({lengths.max()} tokens)")
        input_ids = np.full((len(idx), width), self.pad_id, dtype=np.int64)  # (B, T)
        for row, i in enumerate(idx):
            start, end = self.offsets[i], self.offsets[i + 1]
            input_ids[row, : end - start] = self.token_ids[start:end]
        position = np.arange(width)[None, :]  # (1, T)
        attention_mask = (position < lengths[:, None]).astype(np.int64)  # (B, T)
        token_type_ids = ((position >= self.segment_a_lengths[idx][:, None]) & (attention_mask == 1)).astype(np.int64)
        labels = None if self.labels is None else self.labels[idx]
        return PaddedBatch(input_ids, token_type_ids, attention_mask, labels)


def encode_pairs(tokenizer, text_a: Sequence[str], text_b: Sequence[str] | None = None,
                 labels: np.ndarray | None = None, max_length: int = DEFAULT_MAX_LENGTH) -> EncodedSplit:
    """Tokenize once: `[CLS] A [SEP] B [SEP]` (or `[CLS] A [SEP]`), at most `max_length` tokens, the longer segment
    truncated first one token at a time (BERT's rule, as the official ELECTRA fine-tuning code). `tokenizer`: cls_id,
    sep_id, pad_id and encode_batch(texts) giving ids WITHOUT special tokens (as tinyelectra.tokenizer.Tokenizer)."""
    pair = text_b is not None
    if max_length < (3 if pair else 2):
        raise ValueError(f"max_length={max_length} leaves no room for the text")
    if pair and len(text_b) != len(text_a):
        raise ValueError(f"{len(text_a)} first segments but {len(text_b)} second segments")
    ids_a = tokenizer.encode_batch(list(text_a))
    sample = [x for x in ids_a[:64] if len(x) >= 2][:8]
    if sample and all(x[0] == tokenizer.cls_id and x[-1] == tokenizer.sep_id for x in sample):
        raise ValueError("tokenizer.encode_batch added [CLS]/[SEP] itself; pair encoding needs ids without them")
    ids_b = tokenizer.encode_batch(list(text_b)) if pair else [[] for _ in ids_a]
    len_a, len_b = (np.asarray([len(x) for x in ids], dtype=np.int64) for ids in (ids_a, ids_b))
    keep_a, keep_b = truncate_pair_lengths(len_a, len_b, max_length - (3 if pair else 2))  # B empty: A cut alone
    truncated = int(((keep_a < len_a) | (keep_b < len_b)).sum())
    cls, sep = int(tokenizer.cls_id), int(tokenizer.sep_id)
    flat: list[int] = []
    for a, b, ka, kb in zip(ids_a, ids_b, keep_a.tolist(), keep_b.tolist()):
        flat += [cls, *a[:ka], sep, *b[:kb], sep] if pair else [cls, *a[:ka], sep]
    offsets = np.concatenate([[0], np.cumsum(keep_a + 2 + (keep_b + 1 if pair else 0))])
    return EncodedSplit(
        token_ids=np.asarray(flat, dtype=np.int32), offsets=offsets, segment_a_lengths=keep_a + 2,
        labels=None if labels is None else np.asarray(labels), pad_id=int(tokenizer.pad_id), truncated=truncated,
    )


def encode_split(tokenizer, split: GlueSplit, max_length: int = DEFAULT_MAX_LENGTH) -> EncodedSplit:
    return encode_pairs(tokenizer, split.text_a, split.text_b, split.labels, max_length)


# ----------------------------------------------------------------------------------------------------------------
# GLUE submission files
# ----------------------------------------------------------------------------------------------------------------


def prediction_vector(task: TaskSpec | str, predictions: np.ndarray | Sequence) -> np.ndarray:
    """Model outputs -> one prediction per example: class ids (int64) from ids or (M, C) scores by argmax;
    float64 scores for regression from (M,) or (M, 1)."""
    spec = get_task(task)
    p = np.asarray(predictions)
    if spec.is_regression:
        if p.ndim == 2 and p.shape[1] == 1:
            p = p[:, 0]
        if p.ndim != 1:
            raise ValueError(f"{spec.name} predictions must be (M,) or (M, 1) scores, got shape {p.shape}")
        return p.astype(np.float64)
    if p.ndim == 2:
        if p.shape[1] != spec.num_labels:
            raise ValueError(f"{spec.name} has {spec.num_labels} classes but scores have shape {p.shape}")
        return p.argmax(axis=1).astype(np.int64)
    if p.ndim != 1:
        raise ValueError(f"{spec.name} predictions must be (M,) class ids or (M, C) scores, got shape {p.shape}")
    if p.size and not np.issubdtype(p.dtype, np.integer) and not np.all(np.equal(np.mod(p, 1), 0)):
        raise ValueError(f"{spec.name} class predictions must be whole numbers")
    return p.astype(np.int64)


def write_submission(out_dir: str | Path, test_split: GlueSplit, predictions: np.ndarray | Sequence) -> Path:
    """Write one GLUE submission file (e.g. `RTE.tsv`, `MNLI-m.tsv`, `AX.tsv`) for a test split: a header
    `index<TAB>prediction`, then one row per test example with its id and its label as the task's files spell
    it ("entailment", "1") or, for STS-B, the score with 3 decimals. Written atomically."""
    spec = test_split.task
    name = spec.submission_files.get(test_split.split)
    if name is None:
        raise ValueError(f"{spec.name} {test_split.split} is not a test split; submissions are for test splits")
    if test_split.malformed:
        raise UserError(f"cannot write a complete {name}: {len(test_split.malformed)} test lines were malformed "
                        f"(first: {test_split.malformed[0]}); GLUE needs a prediction for every test example")
    values = prediction_vector(spec, predictions)
    if len(values) != len(test_split):
        raise ValueError(f"{len(values)} predictions for {len(test_split)} {spec.name} {test_split.split} examples")
    if spec.is_regression:
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{spec.name} predictions contain NaN or infinity")
        cells = [f"{v:.3f}" for v in values.tolist()]
    else:
        if values.size and (values.min() < 0 or values.max() >= spec.num_labels):
            raise ValueError(f"{spec.name} class ids must be in 0..{spec.num_labels - 1}")
        cells = [spec.file_labels[v] for v in values.tolist()]
    lines = ["index\tprediction"] + [f"{i}\t{c}" for i, c in zip(test_split.ids, cells)]
    return write_atomic(Path(out_dir) / name, "\n".join(lines) + "\n")
