"""GLUE fine-tuning with the paper's protocol, `tinyelectra glue`: choosing checkpoints and tasks, running every
(checkpoint, task, seed), dev-set evaluation, seed medians, test-set submission files and OUT/<checkpoint>/glue.json.
Not here: one fine-tuning run and its settings (finetune.py), GLUE files and pair encoding (glue_data.py), metrics
(metrics.py), the network (model.Classifier), loading weights (hf.load_backbone), the report (report.py).

Protocol (the paper's fine-tuning appendix; official configure_finetuning.py and model/optimization.py), each knob a `--set key=value`:
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
Opt-in departures for slow machines, recorded in glue.json: `batching=length` (batches of similar length, about
half the padded tokens on GLUE; transformers' group_by_length) and `precision=bf16` on a CPU with AVX512-BF16/AMX.

How the steps run (`--set step=...`, finetune.py): on a CPU each batch is padded to its longest row (dynamic
padding). With the attention mask excluding padded keys, absolute positions and per-token LayerNorm, the [CLS] output
is the same function of the real tokens however far a row is padded (tests/test_glue.py checks it to 1e-5), so on a
GPU batches are padded to fixed widths instead (32-token buckets; a short last batch filled with copies of its rows
weighted 0: the same loss and gradients), each width's whole step is captured once as a CUDA graph and replayed, and
every (checkpoint, task, seed) job of the command is scheduled together, up to `concurrent` in flight on their own
CUDA streams (longest first); glue.json records how they ran (`protocol.step`, `fine_tuning`). Evaluation batches are
formed from length-sorted rows, and the predictions put back in file order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import io
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyelectra.checkpoint import CKPT_NAME, checkpoint_dirs, is_checkpoint, read_meta
from tinyelectra.console import make_console
from tinyelectra.errors import Interrupted, UserError
from tinyelectra.files import check_writable, write_atomic, write_json
from tinyelectra.finetune import (
    MEGABATCH, EncodedTask, FinetuneConfig, FinetuneJob, concurrency, device_split, plan_steps, predict, run_jobs, size_defaults,
    step_mode,
)
from tinyelectra.glue_data import (
    CUSTOM_FILES, GLUE_TASK_NAMES, PAPER_TASK_NAMES, GlueSplit, encode_split, find_split_file, get_task, load_hf_split, load_task_file,
    read_split, resolve_tasks, with_swapped_pairs, write_submission,
)
from tinyelectra.metrics import METRIC_TITLES, average_score, score_task
from tinyelectra.runfolder import Written, holding
from tinyelectra.tokenizer import Tokenizer

FORMAT = "tinyelectra-glue"
FORMAT_VERSION = 1


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
    from tinyelectra.hf import read_hf_config

    p = Path(path)
    if not p.exists():
        raise UserError(f"--checkpoint {p}: no such directory")
    if not p.is_dir():
        raise UserError(f"--checkpoint {p}: not a directory (a run, a ckpt-* directory or a transformers ELECTRA directory)")
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
        raise UserError(f"--checkpoint {p}: a run without fraction checkpoints yet (ckpt-0625 appears at 6.25% of the budget)")
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
    """One task's splits as read (before tokenization): train (row-limited, swapped pairs added), dev, test."""

    task: str
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
            out[f"{s.task}:{s.split}" if s.task != self.task else s.split] = {
                "rows": len(s), "source": s.source, "malformed_lines": [str(m) for m in s.malformed],
                "sha256": h.hexdigest(),
            }
        out["train"]["rows_in_file"] = self.original_train_rows
        return out

    def skipped_rows(self) -> dict[str, int]:
        """Rows of the files left out (malformed, or with --skip-bad-labels a label not the task's), per split."""
        return {s.split: len(s.malformed) for s in [self.train, *self.dev.values(), *self.test] if s.malformed}


def choose_tasks(spec: str, glue_dir: Path | None, use_hf: bool, custom: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """`--tasks` -> (tasks to run, {skipped task: why}). 'all' with --glue-dir = the tasks whose train and dev
    files exist; a task named explicitly must have its files (else the loader's UserError names what is missing).
    `custom`: the tasks of --task-file, always run (after the GLUE tasks); with them alone no GLUE data is needed."""
    custom = list(custom or [])
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    glue_parts = [p for p in parts if p.lower() == "all" or get_task(p).name not in custom]
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
        t = get_task(name)
        missing = [t.files[s] for s in ("train", t.primary_dev_split) if find_split_file(glue_dir, name, s) is None]
        if missing:
            skipped[name] = f"{t.dir_name}/{' and '.join(missing)} not found"
        else:
            chosen.append(name)
    if not chosen:
        raise UserError(f"--glue-dir {glue_dir}: no task has both train and dev files ({'; '.join(skipped.values())})")
    return chosen + custom, skipped


def read_task(task: str, glue_dir: Path | None, max_train_rows: int | None, with_test: bool) -> TaskData:
    """Read a task's train, dev and (when present) test splits; swapped pairs added to MRPC and STS-B train."""
    spec = get_task(task)
    local = glue_dir is not None or spec.name in CUSTOM_FILES  # else: Hugging Face `datasets`

    def read(split: str, task_name: str = task) -> GlueSplit:
        return read_split(glue_dir, task_name, split) if local else load_hf_split(task_name, split)

    train = read("train")
    original = len(train)
    if max_train_rows is not None:
        if max_train_rows < 1:
            raise UserError("--max-train-rows must be at least 1")
        train = train.select(range(min(max_train_rows, len(train))))
    if spec.swap_pairs:
        train = with_swapped_pairs(train)
    dev = {s: read(s) for s in spec.dev_splits}
    test = [read(s) for s in spec.test_splits if with_test and (not local or find_split_file(glue_dir, task, s))]
    if with_test and task == "mnli" and (glue_dir is None or find_split_file(glue_dir, "ax", "test") is not None):
        test.append(read("test", "ax"))  # the diagnostic set is predicted by the MNLI model
    return TaskData(task=spec.name, train=train, dev=dev, test=test, original_train_rows=original)


def encode_task(tokenizer, data: TaskData, max_length: int) -> EncodedTask:
    return EncodedTask(
        train=encode_split(tokenizer, data.train, max_length),
        dev={s: encode_split(tokenizer, split, max_length) for s, split in data.dev.items()},
        test=[encode_split(tokenizer, split, max_length) for split in data.test],
    )


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


def summarize_task(task: str, seeds: list[dict]) -> dict[str, Any]:
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
        out["excluded"] = {t: "a task of your own (--task-file): not part of a GLUE score" if t in CUSTOM_FILES else
                           "not in the paper's GLUE score (BERT and ELECTRA leave WNLI out)" for t in excluded}
    return out


# ----------------------------------------------------------------------------------------------------------------
# One checkpoint, all tasks
# ----------------------------------------------------------------------------------------------------------------


def protocol_dict(fc: FinetuneConfig, hidden_size: int, tasks: list[str], max_train_rows: int | None,
                  mode: tuple[str, str, int] = ("eager", "", 1)) -> dict[str, Any]:
    """Every setting that decides the numbers (compared before reusing earlier results); `mode`: how the steps ran
    (finetune.step_mode, and how many jobs were in flight at once)."""
    size, _, _ = size_defaults(hidden_size)
    step, why, concurrent = mode
    padding = ("dynamic (each batch to its longest row; attention mask on padded keys)" if step == "eager" else
               f"length buckets of {fc.length_bucket} tokens (each batch to its longest row rounded up; attention mask on "
               "padded keys), a short last batch filled with copies of its rows weighted 0: the same loss and gradients")
    return {
        "settings": dataclasses.asdict(fc),
        "model_size_rule": f"{size} (hidden size {hidden_size}: <= 256 Small, <= 768 Base, else Large)",
        "peak_lr": fc.peak_lr(hidden_size),
        "layerwise": fc.layerwise,
        "layerwise_decay": fc.decay(hidden_size),
        "epochs": {t: fc.task_epochs(t) for t in tasks},
        "optimizer": "paper Adam (no bias correction), beta 0.9/0.999, eps 1e-6, decoupled weight decay "
                     f"{fc.weight_decay:g}, clip {fc.clip_norm:g}",
        "schedule": f"lr * min(1, step / ({fc.warmup_fraction:g} * total)) * (1 - step / total)",
        "head": f"[CLS] -> dropout {fc.dropout:g} -> linear (STS-B: 1 output, MSE)",
        "swapped_pairs": [t for t in tasks if get_task(t).swap_pairs],
        "padding": padding,
        "step": f"{step} ({why})" if why else step,
        "concurrent_jobs": concurrent if concurrent == 1 else
                           f"up to {concurrent}, each on its own CUDA stream; their dropout masks come from one shared "
                           "generator, so a seed's masks depend on the jobs beside it (reproducible for the same command)",
        "batching": "random batches each epoch (paper)" if fc.batching == "random" else
                    f"length-grouped: groups of {MEGABATCH} batches sorted by length, batches shuffled (not the paper's)",
        "max_train_rows": max_train_rows,
        "test_predictions_from": "the median seed by dev paper score (lower middle for an even count)",
    }


class CheckpointRun:
    """One checkpoint's fine-tuning: its backbone and tokenizer, the glue.json it fills (`result`, written after every
    finished seed and task), what an earlier glue.json for the same checkpoint, protocol and seeds lets it reuse, and
    each task's finished seeds. `todo` is what is left to train; `seed_done` evaluates and records one finished seed
    and writes the task's entry once all its seeds are in; `finish` completes glue.json."""

    def __init__(self, ref: CheckpointRef, data: dict[str, TaskData], fc: FinetuneConfig, seeds: list[int], out_dir: Path,
                 device, precision: str, precision_reason: str, mode: tuple[str, str, int], max_train_rows: int | None,
                 skipped: dict[str, str], command: str, console, encoded_cache: dict,
                 task_seeds: dict[str, list[int]] | None = None) -> None:
        import torch

        from tinyelectra.hf import load_backbone
        from tinyelectra.runtime import device_name

        self.ref, self.data, self.fc, self.out_dir, self.device = ref, data, fc, out_dir, device
        self.precision, self.console = precision, console
        self.task_seeds = {task: (task_seeds or {}).get(task, seeds) for task in data}  # a task's seeds (--task-seeds)
        self.backbone = load_backbone(ref.path)
        if self.backbone.tokenizer_dir is None:
            raise UserError(f"{ref.path}: no tokenizer files beside the weights (tokenizer/ or tokenizer.json / vocab.txt); "
                            "fine-tuning needs the pre-training tokenizer")
        self.tokenizer = Tokenizer.load(self.backbone.tokenizer_dir)
        cfg = self.backbone.config
        if fc.max_length > cfg.max_positions:
            raise UserError(f"--set max_length={fc.max_length} exceeds the model's {cfg.max_positions} positions")
        self.target = out_dir / ref.name / "glue.json"
        self.result: dict[str, Any] = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "checkpoint": {"name": ref.name, "path": str(ref.path.resolve()), "kind": ref.kind,
                           "run_dir": None if ref.run_dir is None else str(ref.run_dir.resolve())},
            "meta": checkpoint_meta(ref),
            "model": {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers, "embedding_size": cfg.embedding_size,
                      "vocab_size": cfg.vocab_size, "size": size_defaults(cfg.hidden_size)[0]},
            "seeds": seeds, **({"task_seeds": {t: v for t, v in self.task_seeds.items() if v != seeds}}
                               if any(v != seeds for v in self.task_seeds.values()) else {}),
            "tasks": {}, "averages": {}, "skipped_tasks": dict(skipped), "data": {},
            "protocol": protocol_dict(fc, cfg.hidden_size, list(data), max_train_rows, mode),
            "device": device_name(device, threads=True), "precision": precision,
            "precision_reason": precision_reason, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "platform": platform.platform(), "command": command, "complete": False,
        }
        previous, previous_seeds = _reusable(self.target, self.result)
        if previous_seeds:  # kept on disk until their tasks are reached and finished
            self.result["partial"] = dict(previous_seeds)
        self.started = time.perf_counter()
        self.described = {task: data[task].describe() for task in data}
        self.records: dict[str, dict[int, dict]] = {}  # task -> seed -> its record
        self.test_outputs: dict[str, dict[int, list]] = {}  # task -> seed -> its test-set outputs
        self.todo: dict[str, list[int]] = {}  # task -> seeds still to train
        self.encoded_cache = encoded_cache
        for task in data:
            described = self.described[task]
            same_seeds = task in previous and [r["seed"] for r in previous[task][0].get("seeds", [])] == self.task_seeds[task]
            if task in previous and previous[task][1] == described and same_seeds:  # same rows, files and seeds
                console.print(f"[dim]{ref.name} {task}: reusing the results in {self.target} (same checkpoint, protocol and seeds)[/]")
                self.result["tasks"][task], self.result["data"][task] = previous[task][0], described
                continue
            finished = {}  # seed -> its record, kept from an interrupted run of the same task on the same rows
            if task in previous_seeds and previous_seeds[task]["data"] == described:
                finished = {r["seed"]: r for r in previous_seeds[task]["seeds"] if r["seed"] in self.task_seeds[task]}
                if data[task].test:  # a reused seed's test predictions are needed if it is the median one
                    finished = {k: r for k, r in finished.items() if _seed_outputs_path(self.target, task, k).is_file()}
                if finished:
                    console.print(f"[dim]{ref.name} {task}: reusing {len(finished)} finished seed(s) from {self.target}[/]")
            self.records[task] = dict(finished)
            self.test_outputs[task] = {k: _load_seed_outputs(self.target, task, k, len(data[task].test)) for k in finished}
            self.todo[task] = [k for k in self.task_seeds[task] if k not in finished]

    def encoded(self, task: str) -> EncodedTask:
        key = (self.tokenizer.fingerprint(), self.fc.max_length, task)
        if key not in self.encoded_cache:
            self.encoded_cache[key] = encode_task(self.tokenizer, self.data[task], self.fc.max_length)
        return self.encoded_cache[key]

    def steps(self, task: str) -> int:
        return plan_steps(len(self.encoded(task).train), self.fc.batch_size, self.fc.task_epochs(task))[1]

    def seed_done(self, task: str, seed: int, model, facts: dict, evaluate_on=contextlib.nullcontext) -> None:
        """Score the finished seed's model on the dev splits (and predict the test splits), record it in glue.json at
        once (an interrupt loses at most the seeds in flight); the task's entry once all its seeds are in."""
        enc, data = self.encoded(task), self.data[task]
        t_eval = time.perf_counter()
        splits = {}
        with evaluate_on():  # after the job's own steps (its CUDA stream)
            for split, dev_enc in enc.dev.items():
                score = score_task(task, predict(model, dev_enc, self.fc.eval_batch_size, self.device, self.precision),
                                   data.dev[split].labels, split=split)
                splits[split] = {"paper_score": score.paper_score, "glue_score": score.glue_score,
                                 "metrics": score.metrics, "examples": score.num_examples}
            outputs = [predict(model, t, self.fc.eval_batch_size, self.device, self.precision) for t in enc.test]
        primary = splits[get_task(task).primary_dev_split]
        record = {"seed": seed, **{k: primary[k] for k in ("paper_score", "glue_score", "metrics")}}
        if len(splits) > 1:
            record["splits"] = splits
        record.update(train_seconds=facts["train_seconds"], eval_seconds=time.perf_counter() - t_eval,
                      steps=facts["steps"], final_loss=facts["final_loss"])
        self.records[task][seed] = record
        self.test_outputs[task][seed] = outputs
        if data.test:
            _save_seed_outputs(self.target, task, seed, outputs)
        in_order = [self.records[task][k] for k in self.task_seeds[task] if k in self.records[task]]
        self.result.setdefault("partial", {})[task] = {"seeds": in_order, "data": self.described[task]}
        write_json(self.target, self.result, "GLUE results")
        if len(self.records[task]) == len(self.task_seeds[task]):
            self.task_done(task)

    def task_done(self, task: str) -> None:
        enc, data, fc = self.encoded(task), self.data[task], self.fc
        per_epoch, steps = plan_steps(len(enc.train), fc.batch_size, fc.task_epochs(task))
        seeds = self.task_seeds[task]
        seed_results = [self.records[task][k] for k in seeds]
        entry = {"epochs": fc.task_epochs(task), "train_rows": len(enc.train), "steps_per_epoch": per_epoch,
                 "steps": steps, "peak_lr": fc.peak_lr(self.backbone.config.hidden_size),
                 "truncated_train_rows": enc.train.truncated, "seeds": seed_results, **summarize_task(task, seed_results),
                 "majority_class": majority_class_baseline(data), "skipped_rows": data.skipped_rows()}
        if data.test:
            chosen = median_seed_index([s["paper_score"] for s in seed_results])
            sub_dir = self.out_dir / self.ref.name / "submission"
            files = [str(write_submission(sub_dir, split, outputs))
                     for split, outputs in zip(data.test, self.test_outputs[task][seeds[chosen]])]
            entry["test_predictions"] = {"seed": seeds[chosen], "files": files}
        self.result["tasks"][task], self.result["data"][task] = entry, self.described[task]
        self.result["averages"] = task_averages(self.result["tasks"])
        (self.result.get("partial") or {}).pop(task, None)
        if not self.result.get("partial"):
            self.result.pop("partial", None)
        write_json(self.target, self.result, "GLUE results")  # after every task: a long run keeps what it finished
        for seed in seeds:
            _seed_outputs_path(self.target, task, seed).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the folder of unfinished tasks' outputs, once empty
            _seed_outputs_path(self.target, task, seeds[0]).parent.rmdir()
        self.test_outputs.pop(task, None)
        self.console.print(_task_line(self.ref.name, task, entry))
        if self.ref.run_dir is not None and self.result["meta"].get("step") is not None:
            _tensorboard_scalar(self.ref.run_dir, f"glue/{task}", entry["median_paper"], self.result["meta"]["step"])

    def finish(self, fine_tuning: dict[str, Any]) -> dict[str, Any]:
        for task in self.todo:  # every seed reused from an interrupted run: the task's entry is written now
            if task not in self.result["tasks"] and len(self.records[task]) == len(self.task_seeds[task]):
                self.task_done(task)
        self.result["averages"] = task_averages(self.result["tasks"])
        self.result["seconds_total"] = time.perf_counter() - self.started
        self.result["fine_tuning"] = fine_tuning
        self.result["complete"] = True
        write_json(self.target, self.result, "GLUE results")
        return self.result


def _tensorboard_scalar(run_dir: Path, tag: str, value: float, step: int) -> None:
    """A checkpoint's GLUE score beside its pre-training curves in RUN/tensorboard (at its pre-training step),
    when TensorBoard is installed (the pre-training run said once if it is not)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return
    with SummaryWriter(str(Path(run_dir) / "tensorboard")) as writer:
        writer.add_scalar(tag, value, step)


class _PlainProgress:
    """When the console is not a terminal (a log under nohup, CI), rich draws no bar: print a plain line instead at
    each seed's first and last step, and every PLAIN_PROGRESS_SECONDS (one line for all the jobs in flight: `clock`
    is shared)."""

    def __init__(self, console, what: str, steps: int, clock: dict) -> None:
        self.console, self.what, self.steps, self.clock = console, what, steps, clock
        self.on = not console.is_terminal
        self.t0 = time.perf_counter()
        self.loss: float | None = None

    def __call__(self, step: int, loss: float | None) -> None:
        if not self.on:
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


PLAIN_PROGRESS_SECONDS = 30.0


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
    partial = {t: v for t, v in (old.get("partial") or {}).items() if t in fresh["protocol"]["epochs"] and t not in tasks}
    return tasks, partial


def _seed_outputs_path(target: Path, task: str, seed: int) -> Path:
    """A finished seed's test-set outputs, kept until its task is finished (the median seed's become the submission)."""
    return target.parent / "partial" / f"{task}-seed{seed}.npz"


def _save_seed_outputs(target: Path, task: str, seed: int, outputs: list[np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, *outputs)
    write_atomic(_seed_outputs_path(target, task, seed), buffer.getvalue())


def _load_seed_outputs(target: Path, task: str, seed: int, count: int) -> list[np.ndarray]:
    if count == 0:
        return []
    with np.load(_seed_outputs_path(target, task, seed), allow_pickle=False) as z:
        return [z[f"arr_{i}"] for i in range(count)]


def _kept(path: Path) -> str:
    """What an interrupted `glue` left in `path`, in words."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"nothing finished was written yet ({path})"
    tasks = list(result.get("tasks") or {})
    seeds = sum(len(v.get("seeds", [])) for v in (result.get("partial") or {}).values())
    parts = ([f"finished tasks {', '.join(tasks)}"] if tasks else []) + ([f"{seeds} finished seed(s) of unfinished tasks"] if seeds else [])
    return f"kept {' and '.join(parts) or 'nothing finished yet'} in {path}"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _task_line(name: str, task: str, entry: dict) -> str:
    """One finished task: the paper metric's median over seeds, the GLUE leaderboard's metric where it differs (a
    task of one's own has no leaderboard), the majority-class baseline beside it."""
    scores = ", ".join(f"{s['paper_score']:.1f}" for s in entry["seeds"])
    seconds = sum(s["train_seconds"] + s["eval_seconds"] for s in entry["seeds"])
    line = (f"{name} {task}: {METRIC_TITLES[entry['paper_metric']]} median {_fmt(entry['median_paper'])} ± "
            f"{_fmt(entry['std_paper'])} (seeds {scores})")
    if task in GLUE_TASK_NAMES and entry["glue_metric"] != entry["paper_metric"]:
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


def majority_class_baseline(data: TaskData) -> dict[str, Any] | None:
    """For a classification task: the primary dev split's scores when every row gets the training rows' most frequent
    class (the score a model that learned nothing reaches; 0 Matthews correlation by definition). None for regression."""
    spec = get_task(data.task)
    if spec.is_regression:
        return None
    majority = int(np.argmax(np.bincount(data.train.labels.astype(np.int64), minlength=spec.num_labels)))
    dev = data.dev[spec.primary_dev_split]
    score = score_task(data.task, np.full(len(dev), majority), dev.labels)
    return {"label": spec.label_names[majority], "paper_score": score.paper_score, "glue_score": score.glue_score}


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------


def glue_command(checkpoint: Path, glue_dir: Path | None, use_hf: bool, tasks: str, seeds: int, out_dir: Path | None,
                 gpu: int | None, device: str | None, max_train_rows: int | None, overrides: list[str],
                 command: str, task_files: list[Path] | None = None, config: Path | None = None,
                 skip_bad_labels: bool = False, task_seeds: str | None = None) -> list[Path]:
    """`tinyelectra glue`: fine-tune every selected checkpoint on every selected task (GLUE's, and those of
    --task-file); returns the glue.json paths. `task_seeds` ("sst2=2,stsb=1"): fewer seeds for those tasks, the first
    N of the --seeds."""
    from tinyelectra.runtime import configure_matmul, device_name, guard_cudnn_sdpa, pick_device, pick_precision

    console = make_console(stderr=False)
    fc = FinetuneConfig.from_overrides(overrides, config)
    if seeds < 1:
        raise UserError("--seeds must be at least 1")
    refs = find_checkpoints(checkpoint)
    custom = [load_task_file(f).name for f in task_files or []]
    task_names, skipped = choose_tasks(tasks, glue_dir, use_hf, custom)
    fewer = parse_task_seeds(task_seeds, task_names, seeds)  # before any data is read
    dev = pick_device(gpu, device)
    precision, reason = pick_precision(fc.precision, dev)
    configure_matmul(precision, dev)
    if sdpa_note := guard_cudnn_sdpa(dev):  # a GPU whose cuDNN attention backward gives NaN: printed, in glue.json
        reason += f"; {sdpa_note}"
    if out_dir is None:
        out_dir = (refs[0].run_dir if refs[0].run_dir is not None else Path(checkpoint)) / "glue"
    for ref in refs:  # before any fine-tuning: results that cannot be written are not computed
        check_writable(Path(out_dir) / ref.name, "--out", given=Path(out_dir))
    for task, why in skipped.items():
        console.print(f"skipping {task}: {why}")
    data = {}
    for task in task_names:
        data[task] = read_task(task, glue_dir, max_train_rows, fc.test_predictions)
        for s in [data[task].train, *data[task].dev.values(), *data[task].test]:
            s.refuse_bad_labels(skip_bad_labels)
            if s.malformed:
                console.print(s.summary())
    seed_list = list(range(fc.seed, fc.seed + seeds))
    per_task = {task: seed_list[:n] for task, n in fewer.items()}
    mode, why = step_mode(fc, dev, precision)
    concurrent = concurrency(fc, mode)
    console.print(f"fine-tuning {len(refs)} checkpoint(s) x {len(task_names)} task(s) ({', '.join(task_names)}) x "
                  f"{seeds} seed(s) on {device_name(dev, threads=True)}, {precision} ({reason}); steps: {mode} ({why}), "
                  f"up to {concurrent} job(s) at once; results in {out_dir}")
    cache: dict = {}
    runs: list[CheckpointRun] = []
    written = []
    # one writer per --out (runfolder.py); on its record before the first byte, what glue writes there per checkpoint
    with holding(Path(out_dir), "--out", reserves=[glob.escape(ref.name) for ref in refs]):
        Written(Path(out_dir), "glue").add(*(f"{glob.escape(ref.name)}/{w}" for ref in refs
                                             for w in ("glue.json", ".glue.json.*.tmp", "partial/*", "submission/*")), kind="glob")
        Written(Path(out_dir), "glue").add(*(f"{ref.name}{w}" for ref in refs for w in ("", "/partial", "/submission")), kind="dir")
        try:
            for ref in refs:
                runs.append(CheckpointRun(ref, data, fc, seed_list, Path(out_dir), dev, precision, reason,
                                          (mode, why, concurrent), max_train_rows, skipped, command, console, cache,
                                          per_task))
            fine_tuning = _run_all(runs, fc, dev, precision, mode, concurrent, console)
        except Interrupted as e:
            for ref in refs:
                console.print(f"interrupted ({e.signal_name}): {_kept(Path(out_dir) / ref.name / 'glue.json')}; run "
                              "the same command again to continue (finished tasks and seeds are reused)", highlight=False)
            raise
        for run in runs:
            result = run.finish(fine_tuning)
            for kind in ("paper", "glue"):
                if avg := result["averages"].get(kind):
                    console.print(f"{run.ref.name}: {kind} average {avg['score']:.1f} ({avg['label']})")
            console.print(f"wrote {run.target}")
            written.append(run.target)
    return written


def parse_task_seeds(spec: str | None, tasks: list[str], seeds: int) -> dict[str, int]:
    """`--task-seeds sst2=2,stsb=1` -> {task: seeds}: each a task being run, with 1 to --seeds seeds."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        name, _, n = part.partition("=")
        try:
            task, count = get_task(name.strip()).name, int(n)
        except (UserError, ValueError):
            raise UserError(f"--task-seeds {spec}: expected TASK=N[,TASK=N] with a task and a whole number, got {part!r}") from None
        if task not in tasks:
            raise UserError(f"--task-seeds {spec}: {task} is not among the tasks run ({', '.join(tasks)})")
        if not 1 <= count <= seeds:
            raise UserError(f"--task-seeds {spec}: {task} needs 1 to {seeds} seeds (--seeds {seeds}), got {count}")
        out[task] = count
    return out


def _run_all(runs: list[CheckpointRun], fc: FinetuneConfig, device, precision: str, mode: str, concurrent: int,
             console) -> dict[str, Any]:
    """Every (checkpoint, task, seed) left to train, `concurrent` at a time (longest first when several run at once,
    so that the last ones to finish are short; in order otherwise, so that tasks finish one after another); each
    finished seed recorded as it ends. Returns what ran (finetune.run_jobs) with the step mode."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    specs = [(run, task, seed) for run in runs for task, seeds in run.todo.items() for seed in seeds]
    if concurrent > 1:
        specs.sort(key=lambda s: -s[0].steps(s[1]))  # stable: ties keep their order
    device_data: dict = {}  # (tokenizer, max_length, task) -> [DeviceSplit, jobs still to use it]
    for run, task, _ in specs:
        if mode != "eager":
            key = (run.tokenizer.fingerprint(), fc.max_length, task)
            device_data.setdefault(key, [None, 0])[1] += 1
    clock: dict = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("loss {task.fields[loss]}"),
                  console=console, transient=False, disable=not console.is_terminal) as progress:
        bars: dict = {}
        for run, task, _ in specs:
            if (run, task) not in bars:
                bars[(run, task)] = progress.add_task(f"{run.ref.name} {task}", loss="-",
                                                      total=run.steps(task) * len(run.todo[task]))

        def maker(run: CheckpointRun, task: str, seed: int):
            def make(stream) -> FinetuneJob:
                enc, steps, bar = run.encoded(task), run.steps(task), bars[(run, task)]
                lines = _PlainProgress(console, f"{run.ref.name} {task} seed {run.task_seeds[task].index(seed) + 1}/{len(run.task_seeds[task])}",
                                       steps, clock)
                shown = [0]  # this job's steps on its task's bar so far

                def on_step(step: int, loss: float | None) -> None:
                    progress.update(bar, advance=step - shown[0], **({} if loss is None else {"loss": f"{loss:.4f}"}))
                    shown[0] = step
                    lines(step, loss)

                data = None
                if mode != "eager":
                    entry = device_data[(run.tokenizer.fingerprint(), fc.max_length, task)]
                    if entry[0] is None:
                        entry[0] = device_split(enc.train, get_task(task).is_regression, fc.length_bucket,
                                                run.backbone.config.max_positions, device)
                    data = entry[0]
                job = FinetuneJob(run.backbone, task, enc, fc, seed, device, precision, mode, data=data, stream=stream,
                                  shared_rng=concurrent > 1, on_step=on_step)
                job.glue_run = run
                return job
            return make

        def on_done(job: FinetuneJob) -> None:
            run = job.glue_run
            model, facts = job.finish()
            run.seed_done(job.task, job.seed, model, facts, job.on_own_stream)
            if mode != "eager":
                entry = device_data[(run.tokenizer.fingerprint(), fc.max_length, job.task)]
                entry[1] -= 1
                if entry[1] == 0:  # no job left needs this split on the device
                    entry[0] = None

        stats = run_jobs([maker(*s) for s in specs], concurrent, device, on_done)
    steps = stats["steps"]
    if steps:
        console.print(f"fine-tuned {stats['jobs']} job(s), {steps:,} steps in {stats['seconds']:.0f} s "
                      f"({stats['steps_per_second']:.1f} steps/s, at most {stats['most_in_flight']} at once; {mode})")
    return {"step": mode, **stats}
