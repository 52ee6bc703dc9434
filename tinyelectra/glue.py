"""GLUE fine-tuning with the paper's protocol, `tinyelectra glue`: choosing checkpoints and tasks, running every
(checkpoint, task, seed), dev-set evaluation, seed medians, test-set submission files and OUT/<checkpoint>/glue.json.
Not here: one fine-tuning run, its settings and how its steps run (finetune.py), GLUE files and pair encoding
(glue_data.py), metrics (metrics.py), the network (model.Classifier), loading weights (hf.load_backbone), the report.

Protocol (the paper's fine-tuning appendix; official configure_finetuning.py and model/optimization.py), each knob a
`--set key=value`:
- peak LR by model size, decided by the hidden size: <= 256 Small 3e-4, <= 768 Base 1e-4, larger Large 5e-5;
- layer-wise LR decay 0.8 (Large 0.9): depth 0 = embeddings (and the E->H projection), layer j = depth j+1, the
  head on top. "intended" (default) puts the head at depth L+1, so the top layer gets lr * decay; "official" puts
  it at L+2 as the released code does (top layer lr * decay^2, an off-by-one its maintainer confirmed);
- the paper's Adam (no bias correction, beta 0.9/0.999, eps 1e-6), weight decay 0 (the paper's table; the official
  code's default is 0.01), gradient clipping at global norm 1.0 (as the official optimizer), warm-up over 10% of
  the steps applied together with the linear decay to 0 (lr * min(1, step/warmup) * (1 - step/total), step 0 first);
- batch 32, length 128 (longer segment truncated first), 3 epochs (10 for RTE and STS-B), head [CLS] -> dropout
  0.1 -> linear, STS-B as regression on the raw 0-5 score (MSE), MRPC and STS-B also trained on (B, A);
- several seeds (default 3); every seed kept, median and standard deviation reported. Test-set predictions come
  from the seed whose dev paper score is the median (the lower middle one for an even count).
Opt-in departures, recorded in glue.json: `batching=length` (batches of similar length, about half the padded tokens
on GLUE; transformers' group_by_length), `precision=bf16` on a CPU with AVX512-BF16/AMX; and `--released-lr TASKS`,
those tasks fine-tuned again with the released code's learning rate and weight decay (RELEASED), in the same process,
into OUT/<checkpoint>/released-lr/glue.json: apart from the paper's protocol, its scores and averages.

Each seed keeps its training loss every finetune.LOSS_EVERY steps and its dev rows per class; a seed that gives every
row one class is named as such (glue.json, the console line, the report). How the steps run: finetune.py's docstring;
every (checkpoint, task, seed) job is scheduled together (`Scheduler`). RUN/tensorboard gets a checkpoint's scores
only under RUN's lock: a run folder that cannot be written or that another command holds gets one line instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import io
import os
import json
import platform
import socket
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tinyelectra.checkpoint import CKPT_NAME, checkpoint_dirs, is_checkpoint, read_meta
from tinyelectra.console import make_console
from tinyelectra.errors import Interrupted, UserError
from tinyelectra.files import check_writable, write_atomic, write_json
from tinyelectra.finetune import (
    MEGABATCH, EncodedTask, FinetuneConfig, FinetuneJob, concurrency, device_split, plan_steps, predict, run_jobs,
    size_defaults, step_mode,
)
from tinyelectra.glue_data import (
    GLUE_TASK_NAMES, PAPER_TASK_NAMES, RELEASED_LR_ARM, TASKS, GlueSplit, TaskSpec, encode_split, find_split_file,
    get_task, load_hf_split, load_task_file, prediction_vector, read_split, resolve_tasks, with_swapped_pairs,
    write_submission,
)
from tinyelectra.hf import Backbone, load_backbone, read_hf_config
from tinyelectra.metrics import METRIC_TITLES, average_score, score_task
from tinyelectra.runfolder import Written, holding
from tinyelectra.runtime import configure_matmul, device_name, guard_cudnn_sdpa, pick_device, pick_precision
from tinyelectra.tokenizer import Tokenizer

FORMAT = "tinyelectra-glue"
FORMAT_VERSION = 1
# google-research/electra configure_finetuning.py's learning_rate and weight_decay_rate (Small and Base; Large 5e-5)
RELEASED = {"lr": 1e-4, "weight_decay": 0.01}
PLAIN_PROGRESS_SECONDS = 30.0


@dataclass(frozen=True)
class GlueSettings:
    """What `tinyelectra glue` is asked to do: its command line, one field per option."""

    checkpoint: Path
    glue_dir: Path | None = None
    use_hf: bool = False
    tasks: str = "all"
    seeds: int = 3
    out_dir: Path | None = None
    gpu: int | None = None
    device: str | None = None
    max_train_rows: int | None = None
    overrides: tuple[str, ...] | list[str] = ()  # --set
    command: str = "tinyelectra glue"  # the command line, recorded in glue.json
    task_files: tuple[Path, ...] | list[Path] = ()
    config: Path | None = None
    skip_bad_labels: bool = False
    task_seeds: str | None = None  # "sst2=2,stsb=1": fewer seeds for those tasks, the first N of --seeds
    released_lr: str | None = None  # "cola,rte": also fine-tuned with the released code's learning rate


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointRef:
    """One model to fine-tune: a tinyelectra fraction checkpoint or a transformers ELECTRA directory."""

    path: Path
    name: str  # ckpt-0625 ... ckpt-10000, or the directory's name
    kind: str  # tinyelectra | transformers
    run_dir: Path | None  # the pre-training run it belongs to (default output goes to RUN/glue)


def find_checkpoints(path: Path) -> list[CheckpointRef]:
    """`--checkpoint` -> the models to fine-tune: every ckpt-* of a run directory, one checkpoint, a transformers
    ELECTRA directory, or the output of `tinyelectra export` (its discriminator/)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"--checkpoint {p}: no such directory")
    if not p.is_dir():
        raise UserError(f"--checkpoint {p}: not a directory (a run, a ckpt-* directory or a transformers ELECTRA "
                        "directory)")
    if is_checkpoint(p):
        in_run = CKPT_NAME.match(p.name) is not None and (p.parent / "plan.json").is_file()
        return [CheckpointRef(p, p.name, "tinyelectra", p.parent if in_run else None)]
    inner = checkpoint_dirs(p)
    if inner:
        return [CheckpointRef(c, c.name, "tinyelectra", p) for c in inner]
    if (p / "config.json").is_file():
        read_hf_config(p)  # a UserError when it is not ELECTRA
        name = f"{p.parent.name}-{p.name}" if p.name in ("discriminator", "generator") else p.name
        return [CheckpointRef(p, name, "transformers", None)]
    if (p / "discriminator" / "config.json").is_file():  # `tinyelectra export` output
        read_hf_config(p / "discriminator")
        return [CheckpointRef(p / "discriminator", p.name, "transformers", None)]
    if (p / "plan.json").is_file():
        raise UserError(f"--checkpoint {p}: a run without fraction checkpoints yet (ckpt-0625 appears at 6.25% of the "
                        "budget)")
    raise UserError(f"--checkpoint {p}: not a run directory (with ckpt-* inside), a tinyelectra checkpoint or a "
                    "transformers ELECTRA directory (config.json with model_type \"electra\")")


def checkpoint_meta(ref: CheckpointRef) -> dict[str, Any]:
    """The pre-training facts of a tinyelectra checkpoint (meta.json), or {} for a transformers directory."""
    if ref.kind != "tinyelectra":
        return {}
    meta = read_meta(ref.path)
    keep = ("name", "step", "fraction", "tokens_seen", "train_flops_paper", "train_flops_hardware", "train_seconds",
            "precision", "device", "budget", "recipe", "eval")
    return {k: meta[k] for k in keep if k in meta}


# ----------------------------------------------------------------------------------------------------------------
# Tasks and data
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class TaskData:
    """One task's spec and splits as read (before tokenization): train (row-limited, swapped pairs added), dev, test."""

    task: TaskSpec
    train: GlueSplit
    dev: dict[str, GlueSplit]  # split name -> split; the first is the primary (MNLI: dev_matched)
    test: list[GlueSplit]  # test splits (MNLI's include AX when present)
    original_train_rows: int  # before the row limit and swapping

    def describe(self) -> dict[str, Any]:
        """Rows, source, skipped lines and a content hash of every split (reuse of results checks it)."""
        out = {}
        for s in [self.train, *self.dev.values(), *self.test]:
            h = hashlib.sha256()
            for part in (s.ids, s.text_a, s.text_b or []):
                h.update("\x1f".join(part).encode("utf-8"))
            if s.labels is not None:
                h.update(np.ascontiguousarray(s.labels).tobytes())
            out[f"{s.task.name}:{s.split}" if s.task.name != self.task.name else s.split] = {
                "rows": len(s), "source": s.source, "malformed_lines": [str(m) for m in s.malformed],
                "sha256": h.hexdigest(),
            }
        out["train"]["rows_in_file"] = self.original_train_rows
        return out

    def skipped_rows(self) -> dict[str, int]:
        """Rows of the files left out (malformed, or with --skip-bad-labels a label not the task's), per split."""
        return {s.split: len(s.malformed) for s in [self.train, *self.dev.values(), *self.test] if s.malformed}


def choose_tasks(spec: str, glue_dir: Path | None, use_hf: bool,
                 custom: list[TaskSpec] | None = None) -> tuple[list[str], dict[str, str]]:
    """`--tasks` -> (tasks to run, {skipped task: why}). 'all' with --glue-dir = the tasks whose train and dev
    files exist; a task named explicitly must have its files (else the loader's UserError names what is missing).
    `custom`: the tasks of --task-file, always run (after the GLUE tasks); with them alone no GLUE data is needed."""
    custom = [c.name for c in custom or []]
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    glue_parts = [p for p in parts if p not in custom]
    if custom and (not glue_parts or (glue_dir is None and not use_hf)):
        named = [p for p in glue_parts if p.lower() != "all"]
        if named:
            raise UserError(f"--tasks {', '.join(named)}: GLUE tasks need --glue-dir or --hf")
        return custom, {}
    if glue_dir is None and not use_hf:
        raise UserError("GLUE data: give --glue-dir DIR (the classic glue_data folders: CoLA/, SST-2/, ...) or --hf "
                        "(Hugging Face `datasets`, needs the hub), or a task of your own with --task-file")
    if glue_dir is not None and use_hf:
        raise UserError("give either --glue-dir or --hf, not both")
    names = resolve_tasks(",".join(glue_parts))
    if use_hf or not any(p.lower() == "all" for p in glue_parts):
        return names + custom, {}
    if not Path(glue_dir).is_dir():
        raise UserError(f"--glue-dir {glue_dir}: no such directory (expected the classic glue_data layout)")
    chosen, skipped = [], {}
    for name in names:
        t = TASKS[name]
        missing = [t.files[s] for s in ("train", t.primary_dev_split) if find_split_file(glue_dir, t, s) is None]
        if missing:
            skipped[name] = f"{t.dir_name}/{' and '.join(missing)} not found"
        else:
            chosen.append(name)
    if not chosen:
        raise UserError(f"--glue-dir {glue_dir}: no task has both train and dev files ({'; '.join(skipped.values())})")
    return chosen + custom, skipped


def read_task(task: TaskSpec | str, glue_dir: Path | None, max_train_rows: int | None, with_test: bool) -> TaskData:
    """Read a task's train, dev and (when present) test splits; swapped pairs added to MRPC and STS-B train."""
    spec = get_task(task)
    local = glue_dir is not None or bool(spec.paths)  # else: Hugging Face `datasets`

    def read(split: str, t: TaskSpec = spec) -> GlueSplit:
        return read_split(glue_dir, t, split) if local else load_hf_split(t, split)

    train = read("train")
    original = len(train)
    if max_train_rows is not None:
        if max_train_rows < 1:
            raise UserError("--max-train-rows must be at least 1")
        train = train.select(range(min(max_train_rows, len(train))))
    if spec.swap_pairs:
        train = with_swapped_pairs(train)
    dev = {s: read(s) for s in spec.dev_splits}
    test = [read(s) for s in spec.test_splits if with_test and (not local or find_split_file(glue_dir, spec, s))]
    if with_test and spec.name == "mnli" and (glue_dir is None or find_split_file(glue_dir, TASKS["ax"], "test")):
        test.append(read("test", TASKS["ax"]))  # the diagnostic set is predicted by the MNLI model
    return TaskData(task=spec, train=train, dev=dev, test=test, original_train_rows=original)


def encode_task(tokenizer, data: TaskData, max_length: int) -> EncodedTask:
    return EncodedTask(
        train=encode_split(tokenizer, data.train, max_length),
        dev={s: encode_split(tokenizer, split, max_length) for s, split in data.dev.items()},
        test=[encode_split(tokenizer, split, max_length) for split in data.test],
    )


def _task_name(name: str, tasks: list[str], what: str) -> str:
    """A task named on the command line (GLUE's by any spelling, a task of one's own by its name), one of `tasks`."""
    task = name if name in tasks else get_task(name).name  # an unknown name: get_task's one line
    if task not in tasks:
        raise UserError(f"{what}: {task} is not among the tasks run ({', '.join(tasks)})")
    return task


def parse_task_seeds(spec: str | None, tasks: list[str], seeds: int) -> dict[str, int]:
    """`--task-seeds sst2=2,stsb=1` -> {task: seeds}: each a task being run, once, with 1 to --seeds seeds."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        name, _, n = part.partition("=")
        try:
            count, name = int(n), name.strip() if name.strip() in tasks else get_task(name.strip()).name
        except (UserError, ValueError):
            raise UserError(f"--task-seeds {spec}: expected TASK=N[,TASK=N] with a task and a whole number, got "
                            f"{part!r}") from None
        task = _task_name(name, tasks, f"--task-seeds {spec}")
        if task in out:
            raise UserError(f"--task-seeds {spec}: {task} is given twice; give each task once")
        if not 1 <= count <= seeds:
            raise UserError(f"--task-seeds {spec}: {task} needs 1 to {seeds} seeds (--seeds {seeds}), got {count}")
        out[task] = count
    return out


def load_task_files(paths: list[Path]) -> list[TaskSpec]:
    """Every --task-file, each a task of its own name: two files naming one task are an error, not one job dropped."""
    specs: dict[str, tuple[TaskSpec, Path]] = {}
    for path in paths:
        spec = load_task_file(path)
        if spec.name in specs:
            raise UserError(f"--task-file {path}: names the task {spec.name!r}, as --task-file {specs[spec.name][1]} "
                            "does; give each task its own name")
        specs[spec.name] = (spec, path)
    return [spec for spec, _ in specs.values()]


# ----------------------------------------------------------------------------------------------------------------
# Seeds -> task summary
# ----------------------------------------------------------------------------------------------------------------


def _spread(records: list[dict]) -> dict[str, float | None]:
    """Median and sample standard deviation (None for a single seed) of the records' paper and leaderboard scores."""
    out: dict[str, float | None] = {}
    for kind in ("paper", "glue"):
        values = [r[f"{kind}_score"] for r in records]
        out[f"median_{kind}"] = float(statistics.median(values))
        out[f"std_{kind}"] = float(statistics.stdev(values)) if len(values) > 1 else None
    return out


def median_seed_index(scores: list[float]) -> int:
    """The seed whose score is the median: the lower middle one for an even count (ties: the earlier seed)."""
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    return order[(len(scores) - 1) // 2]


def summarize_task(task: TaskSpec | str, seeds: list[dict]) -> dict[str, Any]:
    """Median and standard deviation over seeds, of the paper's and the leaderboard's score, per dev split."""
    spec = get_task(task)
    summary: dict[str, Any] = {"paper_metric": spec.paper_metric, "glue_metric": spec.glue_metric, **_spread(seeds)}
    extra = {split: _spread([s["splits"][split] for s in seeds]) for split in spec.dev_splits[1:]}  # MNLI mismatched
    if extra:
        summary["splits"] = extra
    return summary


def task_averages(tasks: dict[str, dict]) -> dict[str, Any]:
    """Means of the per-task medians over the paper's tasks present (WNLI never counts), named by coverage."""
    counted = {t: v for t, v in tasks.items() if t in PAPER_TASK_NAMES}
    out: dict[str, Any] = {kind: average_score({t: v[f"median_{kind}"] for t, v in counted.items()}).to_dict()
                           for kind in ("paper", "glue")} if counted else {}
    excluded = sorted(t for t in tasks if t not in PAPER_TASK_NAMES)
    if excluded:
        out["excluded"] = {t: "not in the paper's GLUE score (BERT and ELECTRA leave WNLI out)" if t in GLUE_TASK_NAMES
                           else "a task of your own (--task-file): not part of a GLUE score" for t in excluded}
    return out


def majority_class_baseline(data: TaskData) -> dict[str, Any] | None:
    """For a classification task: the primary dev split's scores when every row gets the training rows' most frequent
    class (the score a model that learned nothing reaches; 0 Matthews correlation by definition). None for
    regression."""
    spec = data.task
    if spec.is_regression:
        return None
    majority = int(np.argmax(np.bincount(data.train.labels.astype(np.int64), minlength=spec.num_labels)))
    dev = data.dev[spec.primary_dev_split]
    score = score_task(spec, np.full(len(dev), majority), dev.labels)
    return {"label": spec.label_names[majority], "paper_score": score.paper_score, "glue_score": score.glue_score}


# ----------------------------------------------------------------------------------------------------------------
# What one command decided, and one checkpoint's fine-tuning
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Session:
    """What one `glue` command decided before fine-tuning, for all its checkpoints: the settings, device, precision,
    how the steps run, the tasks' data and each one's seeds, where results go (`arm`: a subfolder of each checkpoint's,
    for --released-lr); and each task's encoding per tokenizer, made once and shared by the checkpoints that need it."""

    settings: GlueSettings
    fc: FinetuneConfig
    device: Any
    precision: str
    precision_reason: str
    mode: str  # eager | static | graphs (finetune.step_mode)
    mode_why: str
    concurrent: int  # jobs in flight at once
    out_dir: Path
    data: dict[str, TaskData]  # task name -> its data, in running order
    seeds: list[int]
    task_seeds: dict[str, list[int]]  # task name -> its seeds (fewer with --task-seeds)
    skipped: dict[str, str]  # tasks not run, and why
    console: Any
    arm: str = ""  # "" for the paper's protocol; RELEASED_LR_ARM ("released-lr") for --released-lr's session
    encodings: dict[tuple[str, str], EncodedTask] = field(default_factory=dict)

    def encoded(self, tokenizer: Tokenizer, fingerprint: str, data: TaskData) -> EncodedTask:
        """`data` encoded by `tokenizer`, whose fingerprint (Tokenizer.fingerprint, computed once: load_model) is
        `fingerprint`."""
        key = (fingerprint, data.task.name)
        if key not in self.encodings:
            self.encodings[key] = encode_task(tokenizer, data, self.fc.max_length)
        return self.encodings[key]

    def released(self, tasks: list[str]) -> Session:
        """These tasks again with the released code's learning rate and weight decay, the encodings shared."""
        return dataclasses.replace(self, fc=dataclasses.replace(self.fc, **RELEASED), arm=RELEASED_LR_ARM,
                                   data={t: self.data[t] for t in tasks},
                                   task_seeds={t: self.task_seeds[t] for t in tasks}, encodings=self.encodings)

    def protocol(self, hidden_size: int) -> dict[str, Any]:
        """Every setting that decides the numbers (compared before reusing earlier results), and how the steps ran."""
        fc, size, tasks = self.fc, size_defaults(hidden_size)[0], [d.task for d in self.data.values()]
        padding = ("dynamic (each batch to its longest row; attention mask on padded keys)" if self.mode == "eager" else
                   f"length buckets of {fc.length_bucket} tokens (each batch to its longest row rounded up; attention "
                   "mask on padded keys), a short last batch filled with copies of its rows weighted 0: the same loss "
                   "and gradients")
        return {
            "settings": dataclasses.asdict(fc),
            **({"arm": "--released-lr: the released code's learning rate and weight decay (google-research/electra "
                       "configure_finetuning.py for Small and Base), not the paper's"} if self.arm else {}),
            "model_size_rule": f"{size} (hidden size {hidden_size}: <= 256 Small, <= 768 Base, else Large)",
            "peak_lr": fc.peak_lr(hidden_size),
            "layerwise": fc.layerwise,
            "layerwise_decay": fc.decay(hidden_size),
            "epochs": {t.name: fc.task_epochs(t) for t in tasks},
            "optimizer": "paper Adam (no bias correction), beta 0.9/0.999, eps 1e-6, decoupled weight decay "
                         f"{fc.weight_decay:g}, clip {fc.clip_norm:g}",
            "schedule": f"lr * min(1, step / ({fc.warmup_fraction:g} * total)) * (1 - step / total)",
            "head": f"[CLS] -> dropout {fc.dropout:g} -> linear (STS-B: 1 output, MSE)",
            "swapped_pairs": [t.name for t in tasks if t.swap_pairs],
            "padding": padding,
            "step": f"{self.mode} ({self.mode_why})" if self.mode_why else self.mode,
            "concurrent_jobs": self.concurrent if self.concurrent == 1 else
                               f"up to {self.concurrent}, each on its own CUDA stream; their dropout masks come from "
                               "one shared generator, so a seed's masks depend on the jobs beside it (reproducible "
                               "for the same command)",
            "batching": "random batches each epoch (paper)" if fc.batching == "random" else
                        f"length-grouped: groups of {MEGABATCH} batches sorted by length, batches shuffled (not the "
                        "paper's)",
            "max_train_rows": self.settings.max_train_rows,
            "test_predictions_from": "the median seed by dev paper score (lower middle for an even count)",
        }


def load_model(ref: CheckpointRef) -> tuple[Backbone, Tokenizer, str]:
    """A checkpoint's pre-trained weights and tokenizer, loaded once per command and shared by its runs (the paper's
    protocol and --released-lr's): every job copies the weights into a model of its own (finetune.Finetuner), so each
    starts from the untouched pre-trained weights. With the tokenizer's fingerprint, computed once: the key its tasks'
    encodings and device splits are shared under."""
    backbone = load_backbone(ref.path)
    if backbone.tokenizer_dir is None:
        raise UserError(f"{ref.path}: no tokenizer files beside the weights (tokenizer/ or tokenizer.json / "
                        "vocab.txt); fine-tuning needs the pre-training tokenizer")
    tokenizer = Tokenizer.load(backbone.tokenizer_dir)
    return backbone, tokenizer, tokenizer.fingerprint()


class CheckpointRun:
    """One checkpoint's fine-tuning under one session: its backbone and tokenizer (load_model's, shared by the
    sessions), the glue.json it fills (`result`, written after every finished seed and task), what an earlier glue.json
    for the same checkpoint, protocol and seeds lets it reuse, and each task's finished seeds. `todo` is what is left
    to train; `seed_done` evaluates and records one finished seed and writes the task's entry once all its seeds are
    in; `finish` completes glue.json."""

    def __init__(self, ref: CheckpointRef, session: Session, backbone: Backbone, tokenizer: Tokenizer,
                 fingerprint: str) -> None:
        self.ref, self.session, self.console = ref, session, session.console
        self.name = ref.name + (f" ({session.arm})" if session.arm else "")
        self.backbone, self.tokenizer, self.fingerprint = backbone, tokenizer, fingerprint
        cfg = self.backbone.config
        if session.fc.max_length > cfg.max_positions:
            raise UserError(f"--set max_length={session.fc.max_length} exceeds the model's {cfg.max_positions} "
                            "positions")
        self.folder = session.out_dir / ref.name / session.arm
        self.target = self.folder / "glue.json"
        seeds = session.seeds
        fewer = {t: v for t, v in session.task_seeds.items() if v != seeds}
        self.result: dict[str, Any] = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "checkpoint": {"name": ref.name, "path": str(ref.path.resolve()), "kind": ref.kind,
                           "run_dir": None if ref.run_dir is None else str(ref.run_dir.resolve())},
            "meta": checkpoint_meta(ref),
            "model": {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
                      "embedding_size": cfg.embedding_size,
                      "vocab_size": cfg.vocab_size, "size": size_defaults(cfg.hidden_size)[0]},
            "seeds": seeds, **({"task_seeds": fewer} if fewer else {}),
            "tasks": {}, "averages": {}, "skipped_tasks": dict(session.skipped), "data": {},
            "protocol": session.protocol(cfg.hidden_size),
            "device": device_name(session.device, threads=True), "precision": session.precision,
            "precision_reason": session.precision_reason, "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "platform": platform.platform(), "command": session.settings.command, "complete": False,
        }
        previous, previous_seeds = _reusable(self.target, self.result)
        if previous_seeds:  # kept on disk until their tasks are reached and finished
            self.result["partial"] = dict(previous_seeds)
        self.started = time.perf_counter()
        self.described = {task: data.describe() for task, data in session.data.items()}
        self.records: dict[str, dict[int, dict]] = {}  # task -> seed -> its record
        self.test_outputs: dict[str, dict[int, list]] = {}  # task -> seed -> its test-set outputs
        self.todo: dict[str, list[int]] = {}  # task -> seeds still to train
        self.tensorboard_note = ""  # why RUN/tensorboard was left alone, said once
        for task, data in session.data.items():
            described, task_seeds = self.described[task], session.task_seeds[task]
            same_seeds = task in previous and [r["seed"] for r in previous[task][0].get("seeds", [])] == task_seeds
            if task in previous and previous[task][1] == described and same_seeds:  # same rows, files and seeds
                self.console.print(f"[dim]{self.name} {task}: reusing the results in {self.target} (same checkpoint, "
                                   "protocol and seeds)[/]")
                self.result["tasks"][task], self.result["data"][task] = previous[task][0], described
                continue
            finished = {}  # seed -> its record, kept from an interrupted run of the same task on the same rows
            if task in previous_seeds and previous_seeds[task]["data"] == described:
                finished = {r["seed"]: r for r in previous_seeds[task]["seeds"] if r["seed"] in task_seeds}
                if data.test:  # a reused seed's test predictions are needed if it is the median one
                    finished = {k: r for k, r in finished.items() if self._outputs_path(task, k).is_file()}
                if finished:
                    self.console.print(f"[dim]{self.name} {task}: reusing {len(finished)} finished seed(s) from "
                                       f"{self.target}[/]")
            self.records[task] = dict(finished)
            self.test_outputs[task] = {k: self._load_outputs(data, k) for k in finished}
            self.todo[task] = [k for k in task_seeds if k not in finished]

    def encoded(self, data: TaskData) -> EncodedTask:
        return self.session.encoded(self.tokenizer, self.fingerprint, data)

    def steps(self, data: TaskData) -> int:
        fc = self.session.fc
        return plan_steps(len(self.encoded(data).train), fc.batch_size, fc.task_epochs(data.task))[1]

    def _outputs_path(self, task: str, seed: int) -> Path:
        """A finished seed's test-set outputs, kept until its task is finished (the median seed's become the
        submission)."""
        return self.folder / "partial" / f"{task}-seed{seed}.npz"

    def _load_outputs(self, data: TaskData, seed: int) -> list[np.ndarray]:
        if not data.test:
            return []
        with np.load(self._outputs_path(data.task.name, seed), allow_pickle=False) as z:
            return [z[f"arr_{i}"] for i in range(len(data.test))]

    def seed_done(self, data: TaskData, seed: int, model, facts: dict, evaluate_on=contextlib.nullcontext) -> None:
        """Score the finished seed's model on the dev splits (and predict the test splits), with the dev rows it put
        in each class; record it in glue.json at once (an interrupt loses at most the seeds in flight); the task's
        entry once all its seeds are in."""
        enc, spec, fc, s = self.encoded(data), data.task, self.session.fc, self.session
        t_eval = time.perf_counter()
        splits = {}
        with evaluate_on():  # after the job's own steps (its CUDA stream)
            for split, dev_enc in enc.dev.items():
                # one prediction per row (class ids, or STS-B's scores), scored and counted by class
                predicted = prediction_vector(spec, predict(model, dev_enc, fc.eval_batch_size, s.device, s.precision))
                score = score_task(spec, predicted, data.dev[split].labels, split=split)
                splits[split] = {"paper_score": score.paper_score, "glue_score": score.glue_score,
                                 "metrics": score.metrics, "examples": score.num_examples}
                if not spec.is_regression:
                    counts = np.bincount(predicted, minlength=spec.num_labels)
                    splits[split]["predicted_classes"] = dict(zip(spec.label_names, counts.tolist()))
            tests = [predict(model, t, fc.eval_batch_size, s.device, s.precision) for t in enc.test]
        primary = splits[spec.primary_dev_split]
        record = {"seed": seed, **{k: primary[k] for k in ("paper_score", "glue_score", "metrics")}}
        if "predicted_classes" in primary:
            used = [label for label, n in primary["predicted_classes"].items() if n]
            record.update(predicted_classes=primary["predicted_classes"], one_class=used[0] if len(used) == 1 else None)
        if len(splits) > 1:
            record["splits"] = splits
        record.update(train_seconds=facts["train_seconds"], eval_seconds=time.perf_counter() - t_eval,
                      steps=facts["steps"], final_loss=facts["final_loss"], loss_curve=facts["loss_curve"])
        self.records[spec.name][seed] = record
        self.test_outputs[spec.name][seed] = tests
        if data.test:
            buffer = io.BytesIO()
            np.savez(buffer, *tests)
            write_atomic(self._outputs_path(spec.name, seed), buffer.getvalue())
        in_order = [self.records[spec.name][k] for k in s.task_seeds[spec.name] if k in self.records[spec.name]]
        self.result.setdefault("partial", {})[spec.name] = {"seeds": in_order, "data": self.described[spec.name]}
        write_json(self.target, self.result, "GLUE results")
        if len(self.records[spec.name]) == len(s.task_seeds[spec.name]):
            self.task_done(data)

    def task_done(self, data: TaskData) -> None:
        enc, task, fc = self.encoded(data), data.task.name, self.session.fc
        per_epoch, steps = plan_steps(len(enc.train), fc.batch_size, fc.task_epochs(data.task))
        seeds = self.session.task_seeds[task]
        seed_results = [self.records[task][k] for k in seeds]
        entry = {"epochs": fc.task_epochs(data.task), "train_rows": len(enc.train), "steps_per_epoch": per_epoch,
                 "steps": steps, "peak_lr": fc.peak_lr(self.backbone.config.hidden_size),
                 "truncated_train_rows": enc.train.truncated, "seeds": seed_results,
                 **summarize_task(data.task, seed_results),
                 "majority_class": majority_class_baseline(data), "skipped_rows": data.skipped_rows()}
        if not data.task.is_regression:
            entry["one_class_seeds"] = [s["seed"] for s in seed_results if s.get("one_class")]
        if data.test:
            chosen = median_seed_index([s["paper_score"] for s in seed_results])
            files = [str(write_submission(self.folder / "submission", split, outputs))
                     for split, outputs in zip(data.test, self.test_outputs[task][seeds[chosen]])]
            entry["test_predictions"] = {"seed": seeds[chosen], "files": files}
        self.result["tasks"][task], self.result["data"][task] = entry, self.described[task]
        self.result["averages"] = task_averages(self.result["tasks"])
        (self.result.get("partial") or {}).pop(task, None)
        if not self.result.get("partial"):
            self.result.pop("partial", None)
        write_json(self.target, self.result, "GLUE results")  # after every task: a long run keeps what it finished
        for seed in seeds:
            self._outputs_path(task, seed).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the folder of unfinished tasks' outputs, once empty
            self._outputs_path(task, seeds[0]).parent.rmdir()
        self.test_outputs.pop(task, None)
        self.console.print(_task_line(self.name, task, entry), markup=False, highlight=False)
        if not self.session.arm:
            self._tensorboard(f"glue/{task}", entry["median_paper"])

    def _tensorboard(self, tag: str, value: float) -> None:
        """A tinyelectra checkpoint's score beside its pre-training curves in RUN/tensorboard, at its pre-training
        step, written under RUN's lock (taken for the write, without waiting): a run folder that cannot be written,
        or that another command holds, is said once and left alone. Nothing without TensorBoard installed."""
        run_dir, step = self.ref.run_dir, self.result["meta"].get("step")
        if run_dir is None or step is None or self.tensorboard_note:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional: tensorboard is an extra
        except ImportError:
            return
        try:
            with holding(run_dir, "the run folder"):
                check_writable(run_dir / "tensorboard", "the run folder", given=run_dir)
                # on RUN's record (train --force deletes them with the run): TensorBoard names its files by host and
                # pid, so one line covers every task's of this process; added once, not again after every task
                events = f"tensorboard/events.out.tfevents.*.{glob.escape(socket.gethostname())}.{os.getpid()}.*"
                Written(run_dir, "glue").add_once(events, kind="glob")
                with SummaryWriter(str(run_dir / "tensorboard")) as writer:
                    writer.add_scalar(tag, value, step)
        except UserError as e:
            self.tensorboard_note = str(e).split("; ")[0]
            self.console.print(f"{self.name}: GLUE scores not added to {run_dir / 'tensorboard'} "
                               f"({self.tensorboard_note}); they are in {self.target}", markup=False, highlight=False)

    def finish(self, fine_tuning: dict[str, Any]) -> dict[str, Any]:
        for task, data in self.session.data.items():  # every seed reused from an interrupted run: its entry now
            if task in self.todo and task not in self.result["tasks"] and \
                    len(self.records[task]) == len(self.session.task_seeds[task]):
                self.task_done(data)
        self.result["averages"] = task_averages(self.result["tasks"])
        self.result["seconds_total"] = time.perf_counter() - self.started
        self.result["fine_tuning"] = fine_tuning
        self.result["complete"] = True
        write_json(self.target, self.result, "GLUE results")
        return self.result


def _reusable(target: Path, fresh: dict[str, Any]) -> tuple[dict[str, tuple[dict, dict]], dict[str, dict]]:
    """What an earlier glue.json for the same checkpoint, protocol and seeds holds (else nothing): its finished tasks,
    each with the description of the data it used, {task: (task entry, data description)}; and the finished seeds of
    tasks it did not finish (interrupted), {task: {"seeds": [records], "data": description}}."""
    try:
        old = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable
        return {}, {}
    old_protocol = old.get("protocol") or {}
    same = (old.get("format") == FORMAT and old.get("checkpoint", {}).get("path") == fresh["checkpoint"]["path"]
            and all(old.get(k) == fresh[k] for k in ("seeds", "meta", "device", "precision"))
            and all(old_protocol.get(k) == fresh["protocol"][k] for k in ("settings", "max_train_rows")))
    if not same:
        return {}, {}
    tasks = {t: (v, (old.get("data") or {}).get(t)) for t, v in (old.get("tasks") or {}).items()
             if t in fresh["protocol"]["epochs"]}
    partial = {t: v for t, v in (old.get("partial") or {}).items()
               if t in fresh["protocol"]["epochs"] and t not in tasks}
    return tasks, partial


def _kept(path: Path) -> str:
    """What an interrupted `glue` left in `path`, in words."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"nothing finished was written yet ({path})"
    tasks = list(result.get("tasks") or {})
    seeds = sum(len(v.get("seeds", [])) for v in (result.get("partial") or {}).values())
    parts = (([f"finished tasks {', '.join(tasks)}"] if tasks else [])
             + ([f"{seeds} finished seed(s) of unfinished tasks"] if seeds else []))
    return f"kept {' and '.join(parts) or 'nothing finished yet'} in {path}"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _task_line(name: str, key: str, entry: dict) -> str:
    """One finished task: the paper metric's median over seeds, the seeds that answered one class for every dev row,
    the GLUE leaderboard's metric where it differs (a task of one's own has none), the majority-class baseline."""
    scores = ", ".join(f"{s['paper_score']:.1f}" for s in entry["seeds"])
    seconds = sum(s["train_seconds"] + s["eval_seconds"] for s in entry["seeds"])
    line = (f"{name} {key}: {METRIC_TITLES[entry['paper_metric']]} median {_fmt(entry['median_paper'])} ± "
            f"{_fmt(entry['std_paper'])} (seeds {scores})")
    if one := entry.get("one_class_seeds"):
        classes = sorted({s["one_class"] for s in entry["seeds"] if s.get("one_class")})
        line += (f"; ONE CLASS for every dev row: {len(one)} of {len(entry['seeds'])} seeds "
                 f"({', '.join(map(repr, classes))})")
    if key in GLUE_TASK_NAMES and entry["glue_metric"] != entry["paper_metric"]:
        line += f"; GLUE leaderboard {METRIC_TITLES[entry['glue_metric']]} {_fmt(entry['median_glue'])}"
    if majority := entry.get("majority_class"):
        line += f"; always answering the majority class {majority['label']!r}: {_fmt(majority['paper_score'])}"
        if entry["median_paper"] <= majority["paper_score"]:
            line += " (no better than that)"
    line += f"; {seconds:.0f} s"
    for split, e in (entry.get("splits") or {}).items():
        line += f"; {split} {_fmt(e['median_paper'])}"
    if skipped := entry.get("skipped_rows"):  # beside the score it was computed without them
        line += f"; rows skipped: {', '.join(f'{split} {n:,}' for split, n in skipped.items())}"
    return line


# ----------------------------------------------------------------------------------------------------------------
# Running every job
# ----------------------------------------------------------------------------------------------------------------


class JobProgress:
    """One job's steps on its task's progress bar; when the console is not a terminal (a log under nohup, CI) rich
    draws no bar, so a plain line instead at the job's first and last step and every PLAIN_PROGRESS_SECONDS (one line
    for all the jobs in flight: `clock` is shared)."""

    def __init__(self, progress: Progress, bar, console, what: str, steps: int, clock: dict) -> None:
        self.progress, self.bar, self.console = progress, bar, console
        self.what, self.steps, self.clock = what, steps, clock
        self.plain = not console.is_terminal
        self.t0 = time.perf_counter()
        self.loss: float | None = None
        self.shown = 0  # steps on the bar so far

    def __call__(self, step: int, loss: float | None) -> None:
        self.progress.update(self.bar, advance=step - self.shown, **({} if loss is None else {"loss": f"{loss:.4f}"}))
        self.shown = step
        if not self.plain:
            return
        self.loss = loss if loss is not None else self.loss
        now = time.perf_counter()
        if step == 1:
            self.t0 = now
        if step in (1, self.steps) or now - self.clock.setdefault("last", now) >= PLAIN_PROGRESS_SECONDS:
            self.clock["last"] = now
            rate = (step - 1) / max(now - self.t0, 1e-9)
            eta = f", ETA {(self.steps - step) / rate:.0f} s" if 1 < step < self.steps and rate > 0 else ""
            loss_text = "" if self.loss is None else f", loss {self.loss:.4f}"
            self.console.print(f"{self.what}: step {step}/{self.steps}{loss_text}, {now - self.t0:.0f} s{eta}",
                               markup=False, highlight=False)


class Scheduler:
    """Every (checkpoint, task, seed) job left to train, of every session, run by finetune.run_jobs `concurrent` at a
    time: longest first when several run at once (so that the last to finish are short), in order otherwise (tasks
    finish one after another); each finished seed recorded as it ends. With fixed shapes a task's training split is
    put on the device once for all the jobs that train on it, and let go after the last of them."""

    def __init__(self, runs: list[CheckpointRun]) -> None:
        self.s = runs[0].session  # the device, precision, step mode and jobs in flight all sessions share
        self.units = [(run, run.session.data[task], seed) for run in runs for task, seeds in run.todo.items()
                      for seed in seeds]
        if self.s.concurrent > 1:
            self.units.sort(key=lambda u: -u[0].steps(u[1]))  # stable: ties keep their order
        self.uses = Counter(self._split_key(run, data) for run, data, _ in self.units)  # jobs left per device split
        self.splits: dict[tuple[str, str], Any] = {}  # split key -> the training split on the device
        self.clock: dict = {}
        self.progress = self.bars = None

    @staticmethod
    def _split_key(run: CheckpointRun, data: TaskData) -> tuple[str, str]:
        return run.fingerprint, data.task.name

    def start(self, unit: tuple[CheckpointRun, TaskData, int], stream) -> FinetuneJob:
        (run, data, seed), s = unit, self.s
        seeds, enc = run.session.task_seeds[data.task.name], run.encoded(data)
        show = JobProgress(self.progress, self.bars[(run, data.task.name)], s.console,
                           f"{run.name} {data.task.name} seed {seeds.index(seed) + 1}/{len(seeds)}", run.steps(data),
                           self.clock)
        key, split = self._split_key(run, data), None
        if s.mode != "eager":
            if key not in self.splits:
                self.splits[key] = device_split(enc.train, data.task.is_regression, s.fc.length_bucket,
                                                run.backbone.config.max_positions, s.device)
            split = self.splits[key]
        return FinetuneJob(run.backbone, data.task, enc, run.session.fc, seed, s.device, s.precision, s.mode,
                           data=split, stream=stream, shared_rng=s.concurrent > 1, on_step=show)

    def done(self, unit: tuple[CheckpointRun, TaskData, int], job: FinetuneJob) -> None:
        run, data, seed = unit
        model, facts = job.finish()
        run.seed_done(data, seed, model, facts, job.on_own_stream)
        key = self._split_key(run, data)
        self.uses[key] -= 1
        if self.uses[key] == 0:  # no job left needs this split on the device
            self.splits.pop(key, None)

    def run(self) -> dict[str, Any]:
        """Every job; returns what ran (finetune.run_jobs) with the step mode."""
        s = self.s
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                   TextColumn("loss {task.fields[loss]}"))
        with Progress(*columns, console=s.console, transient=False, disable=not s.console.is_terminal) as progress:
            self.progress, self.bars = progress, {}
            for run, data, _ in self.units:
                if (run, data.task.name) not in self.bars:
                    self.bars[(run, data.task.name)] = progress.add_task(
                        f"{run.name} {data.task.name}", loss="-", total=run.steps(data) * len(run.todo[data.task.name]))
            stats = run_jobs(self.units, self.start, self.done, s.concurrent, s.device)
        if stats["steps"]:
            s.console.print(f"fine-tuned {stats['jobs']} job(s), {stats['steps']:,} steps in {stats['seconds']:.0f} s "
                            f"({stats['steps_per_second']:.1f} steps/s, at most {stats['most_in_flight']} at once; "
                            f"{s.mode})")
        return {"step": s.mode, **stats}


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------


def _session(settings: GlueSettings, console) -> tuple[list[CheckpointRef], Session, list[str]]:
    """The checkpoints, everything decided before the first loads (settings, tasks and their data, seeds, device,
    precision, step mode, where results go: checked writable, results that cannot be written are not computed) and
    the tasks of --released-lr."""
    fc = FinetuneConfig.from_overrides(list(settings.overrides), settings.config)
    if settings.seeds < 1:
        raise UserError("--seeds must be at least 1")
    refs = find_checkpoints(settings.checkpoint)
    custom = {spec.name: spec for spec in load_task_files(list(settings.task_files))}
    task_names, skipped = choose_tasks(settings.tasks, settings.glue_dir, settings.use_hf, list(custom.values()))
    fewer = parse_task_seeds(settings.task_seeds, task_names, settings.seeds)  # before any data is read
    released = list(dict.fromkeys(_task_name(t.strip(), task_names, f"--released-lr {settings.released_lr}")
                                  for t in (settings.released_lr or "").split(",") if t.strip()))
    dev = pick_device(settings.gpu, settings.device)
    precision, reason = pick_precision(fc.precision, dev)
    configure_matmul(precision, dev)
    if sdpa_note := guard_cudnn_sdpa(dev):  # a GPU whose cuDNN attention backward gives NaN: printed, in glue.json
        reason += f"; {sdpa_note}"
    out_dir = Path(settings.out_dir) if settings.out_dir is not None else \
        (refs[0].run_dir if refs[0].run_dir is not None else Path(settings.checkpoint)) / "glue"
    for ref in refs:
        check_writable(out_dir / ref.name, "--out", given=out_dir)
    for task, why in skipped.items():
        console.print(f"skipping {task}: {why}")
    data: dict[str, TaskData] = {}
    for name in task_names:
        d = data[name] = read_task(custom.get(name) or TASKS[name], settings.glue_dir, settings.max_train_rows,
                                   fc.test_predictions)
        for s in [d.train, *d.dev.values(), *d.test]:
            s.refuse_bad_labels(settings.skip_bad_labels)
            if s.malformed:
                console.print(s.summary())
    seeds = list(range(fc.seed, fc.seed + settings.seeds))
    mode, why = step_mode(fc, dev, precision)
    return refs, Session(settings, fc, dev, precision, reason, mode, why, concurrency(fc, mode), out_dir, data, seeds,
                         {t: seeds[:fewer.get(t, len(seeds))] for t in data}, skipped, console), released


def glue_command(settings: GlueSettings) -> list[Path]:
    """`tinyelectra glue`: fine-tune every selected checkpoint on every selected task (GLUE's, and those of
    --task-file), and the tasks of --released-lr again with the released code's rate; returns the glue.json paths."""
    console = make_console(stderr=False)
    refs, s, released = _session(settings, console)
    sessions = [s, s.released(released)] if released else [s]
    console.print(f"fine-tuning {len(refs)} checkpoint(s) x {len(s.data)} task(s) ({', '.join(s.data)}) x "
                  f"{settings.seeds} seed(s) on {device_name(s.device, threads=True)}, {s.precision} "
                  f"({s.precision_reason}); steps: {s.mode} ({s.mode_why}), up to {s.concurrent} job(s) at once; "
                  f"results in {s.out_dir}"
                  + (f"; again with the released code's lr {RELEASED['lr']:g} and weight decay "
                     f"{RELEASED['weight_decay']:g}: {', '.join(released)}" if released else ""))
    runs: list[CheckpointRun] = []
    # one writer per --out (runfolder.py); on its record before the first byte, what glue writes there per checkpoint
    # (and per arm: OUT/<checkpoint>/released-lr for --released-lr)
    folders = [glob.escape(ref.name) + (f"/{session.arm}" if session.arm else "")
               for session in sessions for ref in refs]
    with holding(s.out_dir, "--out", reserves=[glob.escape(ref.name) for ref in refs]):
        record = Written(s.out_dir, "glue")
        record.add(*(f"{f}/{w}" for f in folders for w in ("glue.json", ".glue.json.*.tmp", "partial/*",
                                                           "submission/*")),
                   kind="glob")
        record.add(*(f"{f}{w}" for f in folders for w in ("", "/partial", "/submission")), kind="dir")
        loaded: dict[CheckpointRef, tuple[Backbone, Tokenizer, str]] = {}  # each checkpoint read once, for every arm

        def run_of(session: Session, ref: CheckpointRef) -> CheckpointRun:
            if ref not in loaded:
                loaded[ref] = load_model(ref)
            return CheckpointRun(ref, session, *loaded[ref])

        try:
            runs = [run_of(session, ref) for session in sessions for ref in refs]
            fine_tuning = Scheduler(runs).run()
        except Interrupted as e:
            for target in [s.out_dir / ref.name / session.arm / "glue.json" for session in sessions for ref in refs]:
                console.print(f"interrupted ({e.signal_name}): {_kept(target)}; run the same command again to continue "
                              "(finished tasks and seeds are reused)", highlight=False)
            raise
        for run in runs:
            result = run.finish(fine_tuning)
            for kind in ("paper", "glue"):
                if avg := result["averages"].get(kind):
                    console.print(f"{run.name}: {kind} average {avg['score']:.1f} ({avg['label']})")
            console.print(f"wrote {run.target}")
    return [run.target for run in runs]
