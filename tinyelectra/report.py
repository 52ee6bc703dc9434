"""The FLOPs-versus-GLUE report of one run: `tinyelectra report RUN_DIR` -> report.md, report.json and PNG plots.

Reads what a run wrote (plan.json, recipe.json, summary.json, metrics.jsonl) and what `tinyelectra glue` wrote
(RUN/glue/<checkpoint>/glue.json), puts it beside the paper's published numbers (paper.py) and renders report.md; no
training, fine-tuning or metric arithmetic. report.json is built first and holds every number report.md shows; the
markdown is rendered from it alone (the tests check the two agree), the PNG plots (plots.py) from the same dict.
A number no run can produce (a NaN or infinite median, an accuracy of 250, a negative step count) is never shown as a
result: it is left out ("-") and named in the notes. The verdict against the published anchors is computed
(metrics.verdict_against_anchors), as is every seed that answered one class for every dev row.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

from tinyelectra import paper
from tinyelectra.budget import changes_text, fractions_off_text
from tinyelectra.checkpoint import train_seconds_of
from tinyelectra.errors import UserError
from tinyelectra.files import check_writable, first_line, write_atomic
from tinyelectra.runfolder import Written, holding
from tinyelectra.glue_data import GLUE_TASK_NAMES, PAPER_TASK_NAMES, RELEASED_LR_ARM, get_task, task_title
from tinyelectra.metrics import score_range, verdict_against_anchors
from tinyelectra.plots import fmt_fraction, plot_curves, plot_glue

FORMAT = "tinyelectra-report"
CURVE_KEYS = ("gen_loss", "disc_loss", "gen_acc", "disc_acc")
HELDOUT_KEYS = ("disc_acc", "baseline_acc", "disc_auc", "disc_auc_matched", "disc_auc_context_matched",
                "disc_precision",
                "disc_recall", "gen_acc", "unigram_acc")  # numbers; the verdict's text is "learning"


def _task_order(names) -> list[str]:
    """GLUE's tasks in the usual order, then the custom ones (glue --task-file) by name."""
    return [t for t in GLUE_TASK_NAMES if t in names] + sorted(t for t in names if t not in GLUE_TASK_NAMES)


# ---------- Formatting (shared by report.md and the tests that compare it with report.json)
def fmt_score(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def fmt_flops(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def fmt_duration(seconds: float | None) -> str:
    """45 s, 12.5 min, 3.20 h."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def fmt_score_std(median: float | None, std: float | None) -> str:
    return fmt_score(median) if std is None or median is None else f"{fmt_score(median)} ± {std:.1f}"


# ---------- Reading (a damaged file is one error naming it, or a warning in the report: never a quiet omission)
def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: damaged (a JSON {type(obj).__name__}, not the object tinyelectra writes)")
    return obj


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _numbers(obj: dict, keys, path: Path) -> dict:
    """`obj`, with each of `keys` it holds checked to be a number (or null); else one error naming the file."""
    for k in keys:
        if obj.get(k) is not None and not _is_number(obj[k]):
            raise UserError(f"{path}: damaged ({k} is {obj[k]!r}, not a number)")
    return obj


COUNT = (0.0, math.inf)  # steps, tokens, FLOPs, seconds
# the counts a checkpoint's meta (glue.json) and summary.json both hold, beside their step ("step" / "steps")
COUNT_KEYS = ("tokens_seen", "train_flops_paper", "train_flops_hardware", "train_seconds")


def _possible(obj: dict, ranges: dict[str, tuple[float, float]], where: str, notes: list[str]) -> dict:
    """`obj` without the numbers of `ranges` that no run can produce (not finite, or outside their range), each
    named in `notes`: the report leaves such a number out ("-") instead of showing it as a result."""
    out = dict(obj)
    for k, (low, high) in ranges.items():
        x = obj.get(k)
        if _is_number(x) and not (math.isfinite(x) and low <= x <= high):
            out.pop(k)
            why = "not a finite number" if not math.isfinite(x) else "negative" if high == math.inf else \
                f"outside the {low:g}..{high:g} such a score can take"
            notes.append(f"{where}: {k} is {x!r}, {why}: left out of this report (the file was changed by hand or "
                         "damaged)")
    return out


_NUMBER = "a number"
# summary.json's fields that the report reads beside the numbers `_numbers` checks, and the kind each must be
SUMMARY_KINDS = {
    "recipe": str, "budget": str, "device": str, "precision": str, "runtime": dict, "checkpoints": list,
    "checkpoints_off_fraction": dict, "resumed_with_changes": list, "resumed_with_runtime_changes": list,
    "budget_seconds": _NUMBER, "median_tokens_per_second": _NUMBER, "peak_gpu_memory_gib": _NUMBER, "data": dict,
}
_KIND_WORDS = {str: "text", dict: "a JSON object", list: "a list", _NUMBER: "a number"}


def _kind_of(x: Any) -> str:
    return ("a number" if _is_number(x) else "text" if isinstance(x, str) else "a list" if isinstance(x, list) else
            "a JSON object" if isinstance(x, dict) else "true/false" if isinstance(x, bool) else type(x).__name__)


def _typed_fields(summary: dict, path: Path) -> tuple[dict, list[str]]:
    """`summary` without the fields of SUMMARY_KINDS that hold the wrong kind of value (or list entries that are
    not objects with the keys the report reads), and a note naming each: the report shows what it can and says what
    it left out, never a field it could not read as if it were absent."""
    kept, odd = dict(summary), []
    for key, kind in SUMMARY_KINDS.items():
        value = summary.get(key)
        if value is None:
            continue
        ok = _is_number(value) if kind is _NUMBER else isinstance(value, kind)
        if ok and key.startswith("resumed_with"):
            ok = all(isinstance(c, dict) and {"key", "old", "new", "step"} <= c.keys() for c in value)
        if ok and key == "checkpoints_off_fraction":
            ok = all(isinstance(o, dict) and _is_number(o.get("fraction_of_steps")) and "why" in o
                     for o in value.values())
        if not ok:
            kept.pop(key)
            odd.append(f"{key} is {_kind_of(value)}, not {_KIND_WORDS[kind]}"
                       + ("" if _kind_of(value) != _KIND_WORDS[kind] else " of the entries tinyelectra writes"))
    note = (f"{path}: fields of the wrong type, left out of this report: {'; '.join(odd)} (the file was changed by "
            "hand or damaged)") if odd else ""
    return kept, [note] if note else []


def _metrics_record(line: str) -> dict | None:
    """One line of metrics.jsonl as a log record or an event, None when it is not one tinyelectra wrote."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict):
        return None
    ev = rec.get("eval") or {}  # a checkpoint event's held-out diagnostics
    if not isinstance(ev, dict) or ev.get("learned") not in (True, False, None):
        return None
    numbers = ([rec.get(k) for k in (*CURVE_KEYS, "tokens_per_second", "train_seconds")]
               + [ev.get(k) for k in HELDOUT_KEYS])
    return rec if isinstance(rec.get("step"), int) and all(x is None or _is_number(x) for x in numbers) else None


def read_metrics(path: Path) -> tuple[list[dict], list[dict], list[int], list[int]]:
    """metrics.jsonl -> (log records with a step, checkpoint events, numbers of the lines that are neither, steps
    logged more than once: of those only the last line is kept). A last line without its newline (a run writing it)
    is skipped without counting. A file with text but no record: one UserError naming it."""
    records, events, damaged = [], [], []
    if not path.is_file():
        return records, events, damaged, []
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rec = _metrics_record(line)
        if rec is None:
            if number < len(lines):  # the last piece has no newline after it: still being written
                damaged.append(number)
        elif rec.get("event") == "checkpoint":
            events.append(rec)
        elif rec.get("event") is None:
            records.append(rec)
    if not records and not events and any(line.strip() for line in lines):
        raise UserError(f"{path}: damaged (no line is a record tinyelectra wrote); move it away to report without the "
                        "pre-training curves")
    steps = [r["step"] for r in records]
    repeated = sorted({step for step in steps if steps.count(step) > 1}) if len(set(steps)) < len(steps) else []
    if repeated:  # one run logs each step once (a --resume drops the lines it runs again): the last line of each counts
        last = {r["step"]: i for i, r in enumerate(records)}
        records = [r for i, r in enumerate(records) if last[r["step"]] == i]
    return records, events, damaged, repeated


def repeated_steps_note(path: Path, repeated: list[int]) -> str:
    shown = ", ".join(map(str, repeated[:5])) + (f" and {len(repeated) - 5} more" if len(repeated) > 5 else "")
    return (f"{path}: {len(repeated)} step(s) logged more than once (step {shown}): two runs wrote into this folder at "
            "once, or logs were joined; the curves and facts use the last line of each step, and may mix two runs")


def damaged_lines_note(path: Path, damaged: list[int]) -> str:
    shown = ", ".join(map(str, damaged[:5])) + (f" and {len(damaged) - 5} more" if len(damaged) > 5 else "")
    return (f"{path}: {len(damaged)} damaged line(s) skipped (line {shown}): the pre-training curves and facts "
            "leave them out")


# ---------- Building report.json
def _checkpoint_entry(path: Path, glue: dict, notes: list[str]) -> dict[str, Any]:
    """One checkpoint's GLUE results (its glue.json) as the report shows them; damaged: one error naming the file;
    impossible numbers left out and named in `notes`."""
    if glue.get("format") != "tinyelectra-glue":
        raise UserError(f"{path}: not GLUE results written by tinyelectra (no \"format\": \"tinyelectra-glue\")")
    try:
        return _glue_entry(path, glue, notes)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise UserError(f"{path}: damaged ({type(e).__name__}: {first_line(e)}); run `tinyelectra glue` again for this "
                        "checkpoint") from None


def _task_entries(path: Path, raw: dict, notes: list[str]) -> dict[str, dict]:
    """glue.json's `tasks` (or `arms`) as the report shows them, impossible scores left out."""
    tasks = {}
    for task in _task_order([name for name, t in raw.items() if t is not None]):
        t = _numbers(raw[task], ("median_paper", "std_paper", "median_glue", "std_glue"), path)
        paper_range = score_range(t["paper_metric"])
        t = _possible(t, {"median_paper": paper_range, "median_glue": score_range(t["glue_metric"]),
                          "std_paper": (0, 200), "std_glue": (0, 200)}, f"{path}: {task}", notes)
        seeds = [_possible(_numbers(s, ("paper_score",), path), {"paper_score": paper_range},
                           f"{path}: {task} seed {s['seed']}", notes) for s in t["seeds"]]
        majority = t.get("majority_class") and _possible(_numbers(t["majority_class"], ("paper_score",), path),
                                                         {"paper_score": paper_range},
                                                         f"{path}: {task} majority class", notes)
        tasks[task] = {
            **{k: t.get(k) for k in ("paper_metric", "glue_metric", "median_paper", "std_paper", "median_glue",
                                     "std_glue")},
            "seed_paper_scores": [s.get("paper_score") for s in seeds], "seeds": [s["seed"] for s in seeds],
            "one_class": [s.get("one_class") for s in seeds], "train_seconds": sum(s["train_seconds"] for s in seeds),
            "majority_class": majority or None,
        }
        for split, e in (t.get("splits") or {}).items():
            tasks[task].setdefault("splits", {})[split] = {"median_paper": e["median_paper"],
                                                           "std_paper": e["std_paper"]}
    return tasks


def _glue_entry(path: Path, glue: dict, notes: list[str]) -> dict[str, Any]:
    counts = ("step", *COUNT_KEYS, "wall_seconds")
    meta = _numbers(glue.get("meta") or {}, (*counts, "fraction"), path)
    meta = _possible(meta, dict.fromkeys(counts, COUNT), f"{path}: meta", notes)
    tasks = _task_entries(path, glue.get("tasks") or {}, notes)
    arm = path.parent / RELEASED_LR_ARM / "glue.json"  # glue --released-lr: the tasks again at the released code's rate
    arm_doc = _read_json(arm) if arm.is_file() else {}
    averages = {kind: _possible(a, {"score": (-100, 100)}, f"{path}: {kind} average", notes)
                for kind, a in (glue.get("averages") or {}).items() if isinstance(a, dict) and "score" in a}
    averages = {kind: a for kind, a in averages.items() if "score" in a}
    protocol = glue.get("protocol") or {}
    name = (glue.get("checkpoint") or {}).get("name", path.parent.name)
    nominal = re.fullmatch(r"ckpt-(\d{4,5})", name)
    return {
        "name": name,
        "glue_json": str(path),
        "complete": bool(glue.get("complete")),
        # the budget fraction the checkpoint stands for (its name: ckpt-0625 = 6.25%); the exact step / total
        # steps can differ slightly when the total is not a multiple of 16
        "fraction": int(nominal.group(1)) / 10_000 if nominal else meta.get("fraction"),
        "fraction_exact": meta.get("fraction"),
        "step": meta.get("step"), "tokens_seen": meta.get("tokens_seen"),
        "train_flops_paper": meta.get("train_flops_paper"), "train_flops_hardware": meta.get("train_flops_hardware"),
        "train_seconds": train_seconds_of(meta),
        "tasks": tasks, "released_lr": {"settings": {k: (arm_doc.get("protocol") or {}).get("settings", {}).get(k)
                                                     for k in ("lr", "weight_decay")},
                                        "tasks": _task_entries(arm, arm_doc.get("tasks") or {}, notes)}
                       if arm_doc else None,
        "average_paper": averages.get("paper"), "average_glue": averages.get("glue"),
        "finetune": {"device": glue.get("device"), "precision": glue.get("precision"),
                     **{k: protocol.get(k)
                        for k in ("max_train_rows", "peak_lr", "layerwise", "layerwise_decay", "epochs")},
                     "seeds": glue.get("seeds"), "batching": protocol.get("batching")},
    }


def _paper_average_over(tasks: list[str]) -> list[dict]:
    """The published per-task rows averaged over the tasks we cover (a like-for-like comparator)."""
    covered = [t for t in tasks if t in PAPER_TASK_NAMES]
    return [{"model": row.model, "tasks": covered, "score": sum(row.scores[t] for t in covered) / len(covered),
             "source": row.source} for row in paper.PER_TASK] if covered else []


def build_report(run_dir: Path) -> dict[str, Any]:
    """Everything the report shows, as one JSON-ready dict."""
    return _report_and_metrics(run_dir)[0]


def _report_and_metrics(run_dir: Path) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """build_report's dict, with metrics.jsonl's log records and checkpoint events as it read them (the curves plot
    them: the file is read once)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: a file, not a run directory (give the directory that `tinyelectra train` or "
                        "`tinyelectra glue --out` wrote)")
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    plan, recipe, summary = (_read_json(run_dir / f"{name}.json") if (run_dir / f"{name}.json").is_file() else None
                             for name in ("plan", "recipe", "summary"))
    odd: list[str] = []
    if summary is not None:
        _numbers(summary, ("steps", *COUNT_KEYS), run_dir / "summary.json")
        summary, odd = _typed_fields(summary, run_dir / "summary.json")
        summary = _possible(summary, dict.fromkeys(("steps", *COUNT_KEYS, "budget_seconds", "median_tokens_per_second",
                                                    "peak_gpu_memory_gib"), COUNT), str(run_dir / "summary.json"), odd)
    records, events, damaged, repeated = read_metrics(run_dir / "metrics.jsonl")
    # what `tinyelectra glue --checkpoint RUN` writes, or RUN/*/glue.json when RUN is itself a glue output directory
    glue_paths = sorted(run_dir.glob("glue/*/glue.json")) or sorted(run_dir.glob("*/glue.json"))
    if plan is None and not glue_paths:
        raise UserError(f"{run_dir}: neither a run directory (plan.json) nor GLUE results (glue/*/glue.json) inside")

    checkpoints = [_checkpoint_entry(p, _read_json(p), odd) for p in glue_paths]
    checkpoints.sort(key=lambda c: (c["fraction"] is None, c["fraction"] or 0.0, c["name"]))
    # a run too short (or re-planned) for its fractions
    off_fraction = (summary or {}).get("checkpoints_off_fraction") or {}
    for c in checkpoints:
        c["fraction_off"] = off_fraction.get(c["name"])
    tasks_seen = _task_order({t for c in checkpoints for t in c["tasks"]})

    table1 = paper.table1_by_fraction()
    comparison = []
    for c in checkpoints:
        row = table1.get(c["fraction"])
        avg = c["average_paper"] or {}
        comparison.append({
            "checkpoint": c["name"], "fraction": c["fraction"], "train_flops_paper": c["train_flops_paper"],
            "train_seconds": c["train_seconds"], "average_paper": avg.get("score"), "average_label": avg.get("label"),
            "paper_train_flops": getattr(row, "train_flops_paper", None), "paper_glue": getattr(row, "glue_dev", None),
            "paper_v100_time": getattr(row, "v100_time", None), "fraction_off": c["fraction_off"],
        })

    last, done = (records[-1] if records else {}), summary or {}
    pretraining = {
        "steps": done.get("steps", last.get("step")),
        **{k: done.get(k, last.get(k)) for k in COUNT_KEYS},
        "finished": summary is not None,
        "last_log": {k: last.get(k) for k in ("step", *CURVE_KEYS, "tokens_per_second") if k in last},
        "log_records": len(records),
        "checkpoint_events": [{**{k: e.get(k) for k in ("name", "step", "fraction")},
                               "train_seconds": train_seconds_of(e)}
                              for e in events],
    }
    plan_facts = None if plan is None else {k: plan.get(k) for k in (
        "budget", "budget_kind", "recipe", "total_steps", "warmup_steps", "batch_size", "seq_len", "tokens_per_step",
        "train_flops_paper", "train_flops_hardware", "budget_seconds", "checkpoint_steps")}
    hardware = {
        "pretraining_device": done.get("device") or _first(events, "device"),
        "pretraining_precision": done.get("precision") or _first(events, "precision"),
        "pretraining_runtime": done.get("runtime") or {},  # compile (or its fallback), attention kernel
        "finetuning_devices": sorted({c["finetune"]["device"] for c in checkpoints if c["finetune"]["device"]}),
        "finetuning_precisions": sorted({c["finetune"]["precision"] for c in checkpoints
                                         if c["finetune"]["precision"]}),
        "finetuning_batching": sorted({c["finetune"]["batching"] for c in checkpoints
                                       if c["finetune"].get("batching")}),
    }
    heldout = [_heldout_entry(e) for e in events if e.get("eval")]
    # what is odd in the files read: in the notes, and on stderr (report_command)
    warnings = ([damaged_lines_note(run_dir / "metrics.jsonl", damaged)] if damaged else []) + (
        [repeated_steps_note(run_dir / "metrics.jsonl", repeated)] if repeated else []) + odd
    notes = [paper.PAPER_GLUE_NOTE, *warnings]
    unlearned = [h["name"] for h in heldout if h["learned"] is False]
    finetuned_unlearned = [c["name"] for c in checkpoints if c["name"] in unlearned]
    if finetuned_unlearned:
        notes.append(f"NOT LEARNED YET when fine-tuned: {', '.join(finetuned_unlearned)} (held-out diagnostics below): "
                     "their GLUE scores measure little more than a randomly initialised encoder")
    elif unlearned:
        notes.append(f"checkpoints that had not learned yet (held-out diagnostics): {', '.join(unlearned)}")
    limited = sorted({c["finetune"]["max_train_rows"] for c in checkpoints if c["finetune"]["max_train_rows"]})
    if limited:
        notes.append(f"fine-tuned on the first {', '.join(map(str, limited))} training rows per task only "
                     "(--max-train-rows): a quick check, not comparable with the paper")
    if off := {c["name"]: c["fraction_off"] for c in checkpoints if c["fraction_off"]}:
        notes.append(f"checkpoints off their fraction (marked *; summary.json): {fractions_off_text(off)}. Their "
                     "points stand for that share of the run, not for the fraction they are named after")
    if changed := (summary or plan or {}).get("resumed_with_changes"):
        notes.append(f"NOT THE RECIPE'S RUN: settings changed on --resume ({changes_text(changed)}; summary.json)")
    if runtime := (summary or plan or {}).get("resumed_with_runtime_changes"):
        notes.append(f"runtime settings changed on --resume ({changes_text(runtime)}; summary.json): still the "
                     "recipe's run, computed another way (a changed micro-batch or compile mode also draws other "
                     "masks, samples or dropout from there on, so the losses are not an unchanged run's bit for bit)")
    incomplete = [c["name"] for c in checkpoints if not c["complete"]]
    if incomplete:
        notes.append(f"GLUE still running or interrupted for: {', '.join(incomplete)}")
    if "wnli" in tasks_seen:
        notes.append("WNLI is shown but left out of the averages, as the paper's GLUE score does")
    return {
        "format": FORMAT, "format_version": 1, "run_dir": str(run_dir.resolve()),
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": None if recipe is None else {
            **{k: recipe.get(k) for k in ("name", "description")}, "deviations": list(recipe.get("deviations") or []),
            **{k: recipe.get(k) for k in ("model", "optim", "train")}},
        "plan": plan_facts, "pretraining": pretraining, "hardware": hardware,
        "tasks": tasks_seen, "checkpoints": checkpoints, "comparison": comparison, "heldout": heldout,
        "paper_average_over_our_tasks": _paper_average_over(tasks_seen),
        "verdict": {"checkpoint": checkpoints[-1]["name"], **verdict_against_anchors(
            {t: v["median_paper"] for t, v in checkpoints[-1]["tasks"].items()})} if checkpoints else None,
        "paper": paper.published(), "notes": notes, "input_warnings": warnings, "plots": [],
    }, records, events


def _heldout_entry(event: dict) -> dict[str, Any]:
    """A checkpoint's held-out diagnostics as the trainer recorded them (diagnostics.evaluate); runs written before
    the verdict existed have learned = None."""
    ev = event["eval"]
    return {"name": event.get("name"), "step": event.get("step"), **{k: ev.get(k) for k in (*HELDOUT_KEYS, "learning")},
            "learned": ev.get("learned"), "verdict": ev.get("verdict")}


def _first(events: list[dict], key: str):
    return next((e[key] for e in events if e.get(key) is not None), None)


# ---------- report.md
def _v(x: Any) -> str:
    return "-" if x is None else str(x)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    sep = "|" + "|".join("---" for _ in header) + "|"
    return ["| " + " | ".join(header) + " |", sep] + ["| " + " | ".join(r) + " |" for r in rows]


def render_markdown(rep: dict[str, Any]) -> str:
    """report.md from report.json's dict alone."""
    recipe, plan, pre, hw = rep.get("recipe") or {}, rep.get("plan") or {}, rep["pretraining"], rep["hardware"]
    L = [f"# tinyelectra report: {recipe.get('name') or Path(rep['run_dir']).name}", "",
         f"Run directory `{rep['run_dir']}`, generated {rep['generated_utc']}.", "", "## Pre-training", ""]
    rows = [
        ["recipe", _v(recipe.get("name"))],
        ["budget", f"{_v(plan.get('budget'))} ({_v(plan.get('budget_kind'))})"],
        ["steps", f"{_v(pre['steps'])} of {_v(plan.get('total_steps'))} planned"
                  + ("" if pre["finished"] else " (run not finished: no summary.json)")],
        ["batch x length", f"{_v(plan.get('batch_size'))} x {_v(plan.get('seq_len'))}"],
        ["tokens seen", _v(pre["tokens_seen"])],
        ["train FLOPs, paper convention", fmt_flops(pre["train_flops_paper"])],
        ["train FLOPs, hardware convention", fmt_flops(pre["train_flops_hardware"])],
        ["training time", fmt_duration(pre["train_seconds"])],
        ["pre-training device", _v(hw["pretraining_device"])],
        ["pre-training precision", _v(hw["pretraining_precision"])],
        ["pre-training compile", _v(hw["pretraining_runtime"].get("compile"))],
        ["pre-training attention kernel", _v(hw["pretraining_runtime"].get("attention"))],
        ["fine-tuning device", ", ".join(hw["finetuning_devices"]) or "-"],
        ["fine-tuning precision", ", ".join(hw["finetuning_precisions"]) or "-"],
        ["fine-tuning batches", "; ".join(hw["finetuning_batching"]) or "-"],
    ]
    last = pre["last_log"]
    rows += [[f"last logged {k} (step {last.get('step')})", f"{last[k]:.4f}"] for k in CURVE_KEYS
             if last.get(k) is not None]
    L += _table(["", "value"], rows) + [""]
    if recipe.get("deviations"):
        L += ["Recipe deviations from the paper:", "", *(f"- {d}" for d in recipe["deviations"]), ""]

    if rep.get("heldout"):
        L += ["## What each checkpoint learned (held-out pre-training rows)", ""]
        rows = []
        for h in rep["heldout"]:
            gain = None if h["disc_acc"] is None or h["baseline_acc"] is None else h["disc_acc"] - h["baseline_acc"]
            rows.append([_v(h["name"]), _v(h["step"]),
                         "-" if h["disc_acc"] is None
                         else f"{h['disc_acc']:.4f} ({h['baseline_acc']:.4f}, {gain:+.4f})",
                         "-" if h["disc_auc"] is None else f"{h['disc_auc']:.3f}",
                         "-" if h["disc_auc_matched"] is None else
                         f"{h['disc_auc_matched']:.3f} / {h['disc_auc_context_matched']:.3f}",
                         "-" if h["disc_recall"] is None else f"{h['disc_precision']:.3f} / {h['disc_recall']:.3f}",
                         "-" if h["gen_acc"] is None else f"{h['gen_acc']:.4f} "
                         f"({_v(h['unigram_acc'] and round(h['unigram_acc'], 4))})",
                         {True: "learned", False: "**NOT LEARNED YET**", None: "-"}[h["learned"]]
                         # older runs: no 'learning'
                         + (f": {h['learning']}" if h["learned"] and h["learning"] else "")])
        L += _table(["pre-training checkpoint", "step", "discriminator acc. (all-original prior, gain)",
                     "disc. ROC-AUC",
                     "disc. AUC matched by token id (generator's / unigram draws)", "disc. precision / recall",
                     "generator / MLM acc. (unigram)", "verdict"], rows)
        L += ["", "What each number shows: discriminator accuracy over its all-\"original\" prior and its raw AUC, "
              "frequency cues (a weak generator's odd words give themselves away by their identity); generator "
              "accuracy over the unigram answer, context learned through the generator; the AUC matched by token id "
              "(replaced vs original occurrences of the same word; 0.5 = none) on unigram draws, context in the "
              "discriminator.", ""]

    L += ["## GLUE per checkpoint (ours)", ""]
    cks = rep["checkpoints"]
    if not cks:
        L += [f"No GLUE results yet: run `tinyelectra glue --checkpoint {rep['run_dir']} --glue-dir DIR` first.", ""]
    else:
        tasks = rep["tasks"]
        label = next((c["average_paper"]["label"] for c in cks if c["average_paper"]), "average")
        header = (["checkpoint", "fraction", "step", "FLOPs (paper)", "training time"] + [task_title(t) for t in tasks]
                  + ["average (paper metrics)", "average (GLUE metrics)"])
        rows = []
        for c in cks:
            r = [c["name"], fmt_fraction(c["fraction"]) + ("*" if c.get("fraction_off") else ""), _v(c["step"]),
                 fmt_flops(c["train_flops_paper"]), fmt_duration(c["train_seconds"])]
            r += [fmt_score_std(c["tasks"][t]["median_paper"], c["tasks"][t]["std_paper"]) if t in c["tasks"] else "-"
                  for t in tasks]
            r += [fmt_score(c[k]["score"]) if c[k] else "-" for k in ("average_paper", "average_glue")]
            rows.append(r)
        L += _table(header, rows)
        L += ["", "Scores are medians over fine-tuning seeds ± their standard deviation, dev sets, x100. Paper "
              "metrics: CoLA Matthews corr., STS-B Spearman, the rest accuracy; GLUE metrics: MRPC/QQP mean of F1 and "
              f"accuracy, STS-B mean of Pearson and Spearman. Averages cover {label}."]
        for c in (c for c in cks if "splits" in c["tasks"].get("mnli", {})):
            e = c["tasks"]["mnli"]["splits"]["dev_mismatched"]
            L.append(f"MNLI mismatched, {c['name']}: {fmt_score_std(e['median_paper'], e['std_paper'])}.")
        L += ["", "Seeds (paper metric each), and the score of always answering the training rows' most frequent "
              "class (classification tasks):", ""]
        for c in cks:
            arm = c.get("released_lr") or {"tasks": {}}
            arms = {f"{t} (--released-lr: lr {arm['settings']['lr']}, "
                    f"weight decay {arm['settings']['weight_decay']})": e for t, e in arm["tasks"].items()}
            for t, e in [(task_title(t), c["tasks"][t]) for t in tasks if t in c["tasks"]] + list(arms.items()):
                scores = ", ".join(f"seed {s}: {fmt_score(v)}" + (f" (ONE CLASS: {one!r} for every row)" if one else "")
                                   for s, v, one in zip(e["seeds"], e["seed_paper_scores"], e.get("one_class") or ()))
                if majority := e.get("majority_class"):
                    scores += f"; majority class {majority['label']!r}: {fmt_score(majority.get('paper_score'))}"
                L.append(f"- {c['name']} {t}: {scores}")
        L.append("")

    L += ["## Beside the paper", "",
          f"The paper's numbers are **published values, not ours** ({paper.TABLE1_SOURCE}); BERT-Small at the same "
          f"compute: {fmt_score(paper.BERT_SMALL['glue_dev'])} at {fmt_flops(paper.BERT_SMALL['train_flops_paper'])} "
          "FLOPs.", ""]
    rows = []
    for row in rep["paper"]["table1"]:
        o = next((c for c in rep["comparison"] if c["fraction"] == row["fraction"]), None)
        rows.append([fmt_fraction(row["fraction"]), fmt_flops(row["train_flops_paper"]), row["v100_time"],
                     fmt_score(row["glue_dev"]),
                     fmt_flops(o["train_flops_paper"]) if o else "-", fmt_duration(o["train_seconds"]) if o else "-",
                     fmt_score(o["average_paper"]) + ("*" if o.get("fraction_off") else "") if o else "-",
                     (o["average_label"] or "-") if o else "-"])
    L += _table(["fraction", "paper FLOPs", "paper V100 time", "paper GLUE (8 tasks)", "our FLOPs (paper conv.)",
                 "our training time", "our average", "our tasks"], rows) + [""]
    if rep["paper_average_over_our_tasks"]:
        L += ["The published per-task rows averaged over the tasks we cover (a like-for-like comparator):", ""]
        L += [f"- {a['model']}: {fmt_score(a['score'])} over {', '.join(a['tasks'])} ({a['source']})"
              for a in rep["paper_average_over_our_tasks"]] + [""]
    if cks:
        final = cks[-1]
        header = ["task", "metric", f"ours ({final['name']})"] + [r["model"] for r in rep["paper"]["per_task"]] + \
            ["majority class (ours)"]
        rows = []
        for t in (t for t in rep["tasks"] if t in GLUE_TASK_NAMES):  # tasks the paper reports
            ours = final["tasks"].get(t) or {}
            rows.append([task_title(t), get_task(t).paper_metric,
                         fmt_score_std(ours.get("median_paper"), ours.get("std_paper"))]
                        + [fmt_score(r["scores"].get(t)) for r in rep["paper"]["per_task"]]
                        + [fmt_score((ours.get("majority_class") or {}).get("paper_score"))])
        L += _table(header, rows)
        sources = "; ".join(f"{r['model']}: {r['source']}" for r in rep["paper"]["per_task"])
        L += ["", f"Per-task sources: {sources}.", ""]
    if v := rep.get("verdict"):
        sources = "; ".join(f"{a['anchor']}: {a['source']}" for a in v["anchors"])
        L += [f"**Verdict ({v['checkpoint']}, computed):** {v['words']}."
              + (f" Anchors: {sources}." if sources else ""), ""]
    if rep["plots"]:
        L += ["## Plots", "", *(f"![{p}]({p})" for p in rep["plots"]), ""]
    L += ["## Notes", "", *(f"- {n}" for n in rep["notes"]), ""]
    return "\n".join(L)


# ---------- The command
def report_command(run_dir: Path, out_dir: Path | None) -> dict[str, Any]:
    """`tinyelectra report RUN_DIR`: write report.json, report.md and the plots (default: into RUN_DIR)."""
    run_dir = Path(run_dir)
    rep, records, events = _report_and_metrics(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir
    with holding(out, "--out", reserves=REPORT_FILES):  # one writer per folder: not a run's while it trains
        check_writable(out, "--out")
        written = Written(out, "report")
        for name in REPORT_FILES:  # replaces only what an earlier report wrote
            if (out / name).exists() and out / name not in written.covered():
                raise UserError(f"--out {out}: {name} is not what tinyelectra's report wrote there, and the report "
                                "would replace it; move it away, or choose another --out")
        written.add(*(out / name for name in REPORT_FILES))
        if plot_glue(rep, out / "glue_vs_compute.png"):
            rep["plots"].append("glue_vs_compute.png")
        for warning in rep["input_warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
        if plot_curves(records, events, rep, out / "pretraining_curves.png"):
            rep["plots"].append("pretraining_curves.png")
        write_atomic(out / "report.json", json.dumps(_finite(rep), indent=2) + "\n", "report")
        write_atomic(out / "report.md", render_markdown(rep), "report")
    print(f"wrote {out / 'report.md'}, {out / 'report.json'}" + "".join(f", {out / p}" for p in rep["plots"]))
    return rep


REPORT_FILES = ("report.json", "report.md", "glue_vs_compute.png", "pretraining_curves.png")


def _finite(obj: Any) -> Any:
    """NaN/inf -> None, so report.json is strict JSON (a diverged seed shows as null)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
