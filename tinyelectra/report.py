"""The FLOPs-versus-GLUE report of one run: `tinyelectra report RUN_DIR` -> report.md, report.json and PNG plots.

What lives here: reading what a run wrote (plan.json, recipe.json, summary.json, metrics.jsonl) and what
`tinyelectra glue` wrote (RUN/glue/<checkpoint>/glue.json), putting it beside the paper's published numbers
(paper.py), and rendering report.md. What does not: the plots (plots.py); any training, fine-tuning or metric
arithmetic.

report.json is built first and holds every number report.md shows; the markdown is rendered from it alone (and the
tests check the two agree). The PNG plots are drawn from the same report (plots.py).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

from tinyelectra import paper
from tinyelectra.checkpoint import train_seconds_of
from tinyelectra.errors import UserError
from tinyelectra.files import check_writable, write_atomic
from tinyelectra.glue_data import GLUE_TASK_NAMES, PAPER_TASK_NAMES, get_task, task_title
from tinyelectra.plots import fmt_fraction, plot_curves, plot_glue

FORMAT = "tinyelectra-report"
TASK_ORDER = GLUE_TASK_NAMES
CURVE_KEYS = ("gen_loss", "disc_loss", "gen_acc", "disc_acc")


def _task_order(names) -> list[str]:
    """GLUE's tasks in the usual order, then the custom ones (glue --task-file) by name."""
    return [t for t in TASK_ORDER if t in names] + sorted(t for t in names if t not in TASK_ORDER)


# ----------------------------------------------------------------------------------------------------------------
# Formatting (shared by report.md and the tests that compare it with report.json)
# ----------------------------------------------------------------------------------------------------------------


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
    return fmt_score(median) if std is None else f"{fmt_score(median)} ± {std:.1f}"


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read it as JSON ({e})") from None


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """metrics.jsonl -> (log records with a step, checkpoint events). A torn last line (a run in progress) is skipped."""
    records, events = [], []
    if not path.is_file():
        return records, events
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("event") == "checkpoint":
            events.append(rec)
        elif rec.get("event") is None and "step" in rec:
            records.append(rec)
    return records, events


def find_glue_results(run_dir: Path) -> list[Path]:
    """RUN/glue/*/glue.json (what `tinyelectra glue --checkpoint RUN` writes), or RUN/*/glue.json when RUN is
    itself a glue output directory."""
    found = sorted(run_dir.glob("glue/*/glue.json")) or sorted(run_dir.glob("*/glue.json"))
    return found


# ----------------------------------------------------------------------------------------------------------------
# Building report.json
# ----------------------------------------------------------------------------------------------------------------


def _checkpoint_entry(path: Path, glue: dict) -> dict[str, Any]:
    meta = glue.get("meta") or {}
    tasks = {}
    for task in _task_order(glue.get("tasks") or {}):
        t = (glue.get("tasks") or {}).get(task)
        if t is None:
            continue
        tasks[task] = {
            "paper_metric": t["paper_metric"], "glue_metric": t["glue_metric"],
            "median_paper": t["median_paper"], "std_paper": t["std_paper"],
            "median_glue": t["median_glue"], "std_glue": t["std_glue"],
            "seed_paper_scores": [s["paper_score"] for s in t["seeds"]],
            "seeds": [s["seed"] for s in t["seeds"]],
            "train_seconds": sum(s["train_seconds"] for s in t["seeds"]),
        }
        for split, e in (t.get("splits") or {}).items():
            tasks[task].setdefault("splits", {})[split] = {"median_paper": e["median_paper"], "std_paper": e["std_paper"]}
    averages = glue.get("averages") or {}
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
        "tasks": tasks,
        "average_paper": averages.get("paper"), "average_glue": averages.get("glue"),
        "finetune": {"device": glue.get("device"), "precision": glue.get("precision"),
                     "max_train_rows": protocol.get("max_train_rows"), "peak_lr": protocol.get("peak_lr"),
                     "layerwise": protocol.get("layerwise"), "layerwise_decay": protocol.get("layerwise_decay"),
                     "epochs": protocol.get("epochs"), "seeds": glue.get("seeds"),
                     "batching": protocol.get("batching")},
    }


def _paper_average_over(tasks: list[str]) -> list[dict]:
    """The published per-task rows averaged over the tasks we cover (a like-for-like comparator)."""
    out = []
    covered = [t for t in tasks if t in PAPER_TASK_NAMES]
    if not covered:
        return out
    for row in paper.PER_TASK:
        scores = [row.scores[t] for t in covered]
        out.append({"model": row.model, "tasks": covered, "score": sum(scores) / len(scores), "source": row.source})
    return out


def build_report(run_dir: Path) -> dict[str, Any]:
    """Everything the report shows, as one JSON-ready dict."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    plan = _read_json(run_dir / "plan.json") if (run_dir / "plan.json").is_file() else None
    recipe = _read_json(run_dir / "recipe.json") if (run_dir / "recipe.json").is_file() else None
    summary = _read_json(run_dir / "summary.json") if (run_dir / "summary.json").is_file() else None
    records, events = read_metrics(run_dir / "metrics.jsonl")
    glue_paths = find_glue_results(run_dir)
    if plan is None and not glue_paths:
        raise UserError(f"{run_dir}: neither a run directory (plan.json) nor GLUE results (glue/*/glue.json) inside")

    checkpoints = [_checkpoint_entry(p, _read_json(p)) for p in glue_paths]
    checkpoints.sort(key=lambda c: (c["fraction"] is None, c["fraction"] or 0.0, c["name"]))
    tasks_seen = _task_order({t for c in checkpoints for t in c["tasks"]})

    table1 = paper.table1_by_fraction()
    comparison = []
    for c in checkpoints:
        row = table1.get(c["fraction"]) if c["fraction"] is not None else None
        comparison.append({
            "checkpoint": c["name"], "fraction": c["fraction"], "train_flops_paper": c["train_flops_paper"],
            "train_seconds": c["train_seconds"],
            "average_paper": None if c["average_paper"] is None else c["average_paper"]["score"],
            "average_label": None if c["average_paper"] is None else c["average_paper"]["label"],
            "paper_train_flops": None if row is None else row.train_flops_paper,
            "paper_glue": None if row is None else row.glue_dev,
            "paper_v100_time": None if row is None else row.v100_time,
        })

    last = records[-1] if records else {}
    pretraining = {
        "steps": (summary or {}).get("steps", last.get("step")),
        "tokens_seen": (summary or {}).get("tokens_seen", last.get("tokens_seen")),
        "train_flops_paper": (summary or {}).get("train_flops_paper", last.get("train_flops_paper")),
        "train_flops_hardware": (summary or {}).get("train_flops_hardware", last.get("train_flops_hardware")),
        "train_seconds": (summary or {}).get("train_seconds", last.get("train_seconds")),
        "finished": summary is not None,
        "last_log": {k: last.get(k) for k in ("step", *CURVE_KEYS, "tokens_per_second") if k in last},
        "log_records": len(records),
        "checkpoint_events": [{**{k: e.get(k) for k in ("name", "step", "fraction")}, "train_seconds": train_seconds_of(e)}
                              for e in events],
    }
    plan_facts = None
    if plan is not None:
        plan_facts = {k: plan.get(k) for k in ("budget", "budget_kind", "recipe", "total_steps", "warmup_steps",
                                               "batch_size", "seq_len", "tokens_per_step", "train_flops_paper",
                                               "train_flops_hardware", "budget_seconds", "checkpoint_steps")}
    hardware = {
        "pretraining_device": (summary or {}).get("device") or _first(events, "device"),
        "pretraining_precision": (summary or {}).get("precision") or _first(events, "precision"),
        "pretraining_runtime": (summary or {}).get("runtime") or {},  # compile (or its fallback), attention kernel
        "finetuning_devices": sorted({c["finetune"]["device"] for c in checkpoints if c["finetune"]["device"]}),
        "finetuning_precisions": sorted({c["finetune"]["precision"] for c in checkpoints if c["finetune"]["precision"]}),
        "finetuning_batching": sorted({c["finetune"]["batching"] for c in checkpoints if c["finetune"].get("batching")}),
    }
    heldout = [_heldout_entry(e) for e in events if e.get("eval")]
    notes = [paper.PAPER_GLUE_NOTE]
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
    incomplete = [c["name"] for c in checkpoints if not c["complete"]]
    if incomplete:
        notes.append(f"GLUE still running or interrupted for: {', '.join(incomplete)}")
    if "wnli" in tasks_seen:
        notes.append("WNLI is shown but left out of the averages, as the paper's GLUE score does")
    return {
        "format": FORMAT, "format_version": 1, "run_dir": str(run_dir.resolve()),
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": None if recipe is None else {"name": recipe.get("name"), "description": recipe.get("description"),
                                               "deviations": list(recipe.get("deviations") or []),
                                               "model": recipe.get("model"), "optim": recipe.get("optim"),
                                               "train": recipe.get("train")},
        "plan": plan_facts, "pretraining": pretraining, "hardware": hardware,
        "tasks": tasks_seen, "checkpoints": checkpoints, "comparison": comparison, "heldout": heldout,
        "paper_average_over_our_tasks": _paper_average_over(tasks_seen),
        "paper": paper.published(), "notes": notes, "plots": [],
    }


HELDOUT_KEYS = ("disc_acc", "baseline_acc", "disc_auc", "disc_precision", "disc_recall", "gen_acc", "unigram_acc")


def _heldout_entry(event: dict) -> dict[str, Any]:
    """A checkpoint's held-out diagnostics as the trainer recorded them (diagnostics.evaluate); runs written before
    the verdict existed have learned = None."""
    ev = event["eval"]
    return {"name": event.get("name"), "step": event.get("step"), **{k: ev.get(k) for k in HELDOUT_KEYS},
            "learned": ev.get("learned"), "verdict": ev.get("verdict")}


def _first(events: list[dict], key: str):
    return next((e[key] for e in events if e.get(key) is not None), None)


# ----------------------------------------------------------------------------------------------------------------
# report.md
# ----------------------------------------------------------------------------------------------------------------


def _v(x: Any) -> str:
    return "-" if x is None else str(x)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_markdown(rep: dict[str, Any]) -> str:
    """report.md from report.json's dict alone."""
    L: list[str] = []
    recipe = rep.get("recipe") or {}
    plan = rep.get("plan") or {}
    pre = rep["pretraining"]
    hw = rep["hardware"]
    L.append(f"# tinyelectra report: {recipe.get('name') or Path(rep['run_dir']).name}")
    L.append("")
    L.append(f"Run directory `{rep['run_dir']}`, generated {rep['generated_utc']}.")
    L.append("")
    L.append("## Pre-training")
    L.append("")
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
    for k in CURVE_KEYS:
        if last.get(k) is not None:
            rows.append([f"last logged {k} (step {last.get('step')})", f"{last[k]:.4f}"])
    L += _table(["", "value"], rows)
    L.append("")
    deviations = recipe.get("deviations") or []
    if deviations:
        L.append("Recipe deviations from the paper:")
        L.append("")
        L += [f"- {d}" for d in deviations]
        L.append("")

    if rep.get("heldout"):
        L.append("## What each checkpoint learned (held-out pre-training rows)")
        L.append("")
        rows = []
        for h in rep["heldout"]:
            gain = None if h["disc_acc"] is None or h["baseline_acc"] is None else h["disc_acc"] - h["baseline_acc"]
            rows.append([_v(h["name"]), _v(h["step"]),
                         "-" if h["disc_acc"] is None else f"{h['disc_acc']:.4f} ({h['baseline_acc']:.4f}, {gain:+.4f})",
                         "-" if h["disc_auc"] is None else f"{h['disc_auc']:.3f}",
                         "-" if h["disc_recall"] is None else f"{h['disc_precision']:.3f} / {h['disc_recall']:.3f}",
                         "-" if h["gen_acc"] is None else f"{h['gen_acc']:.4f} ({_v(h['unigram_acc'] and round(h['unigram_acc'], 4))})",
                         {True: "learned", False: "**NOT LEARNED YET**", None: "-"}[h["learned"]]])
        L += _table(["pre-training checkpoint", "step", "discriminator acc. (all-original prior, gain)", "disc. ROC-AUC",
                     "disc. precision / recall", "generator / MLM acc. (unigram)", "verdict"], rows)
        L.append("")
        L.append("A checkpoint has learned when its discriminator beats the all-\"original\" answer by at least one point "
                 "of accuracy (a masked LM: its predictions beat the unigram answer by two points).")
        L.append("")

    L.append("## GLUE per checkpoint (ours)")
    L.append("")
    cks = rep["checkpoints"]
    if not cks:
        L.append(f"No GLUE results yet: run `tinyelectra glue --checkpoint {rep['run_dir']} --glue-dir DIR` first.")
        L.append("")
    else:
        tasks = rep["tasks"]
        label = next((c["average_paper"]["label"] for c in cks if c["average_paper"]), "average")
        header = ["checkpoint", "fraction", "step", "FLOPs (paper)", "training time"] + [task_title(t) for t in tasks] + \
                 ["average (paper metrics)", "average (GLUE metrics)"]
        rows = []
        for c in cks:
            r = [c["name"], fmt_fraction(c["fraction"]), _v(c["step"]),
                 fmt_flops(c["train_flops_paper"]), fmt_duration(c["train_seconds"])]
            r += [fmt_score_std(c["tasks"][t]["median_paper"], c["tasks"][t]["std_paper"]) if t in c["tasks"] else "-"
                  for t in tasks]
            r.append(fmt_score(c["average_paper"]["score"]) if c["average_paper"] else "-")
            r.append(fmt_score(c["average_glue"]["score"]) if c["average_glue"] else "-")
            rows.append(r)
        L += _table(header, rows)
        L.append("")
        L.append(f"Scores are medians over fine-tuning seeds ± their standard deviation, dev sets, x100. Paper metrics: "
                 f"CoLA Matthews corr., STS-B Spearman, the rest accuracy; GLUE metrics: MRPC/QQP mean of F1 and "
                 f"accuracy, STS-B mean of Pearson and Spearman. Averages cover {label}.")
        mnli = [c for c in cks if "splits" in c["tasks"].get("mnli", {})]
        for c in mnli:
            e = c["tasks"]["mnli"]["splits"]["dev_mismatched"]
            L.append(f"MNLI mismatched, {c['name']}: {fmt_score_std(e['median_paper'], e['std_paper'])}.")
        L.append("")
        L.append("Seeds (paper metric each):")
        L.append("")
        for c in cks:
            for t in tasks:
                if t in c["tasks"]:
                    e = c["tasks"][t]
                    scores = ", ".join(f"seed {s}: {fmt_score(v)}" for s, v in zip(e["seeds"], e["seed_paper_scores"]))
                    L.append(f"- {c['name']} {task_title(t)}: {scores}")
        L.append("")

    L.append("## Beside the paper")
    L.append("")
    L.append(f"The paper's numbers are **published values, not ours** ({paper.TABLE1_SOURCE}); BERT-Small at the same "
             f"compute: {fmt_score(paper.BERT_SMALL['glue_dev'])} at {fmt_flops(paper.BERT_SMALL['train_flops_paper'])} FLOPs.")
    L.append("")
    rows = []
    for row in rep["paper"]["table1"]:
        ours = [c for c in rep["comparison"] if c["fraction"] == row["fraction"]]
        o = ours[0] if ours else None
        rows.append([fmt_fraction(row["fraction"]), fmt_flops(row["train_flops_paper"]), row["v100_time"],
                     fmt_score(row["glue_dev"]),
                     fmt_flops(o["train_flops_paper"]) if o else "-", fmt_duration(o["train_seconds"]) if o else "-",
                     fmt_score(o["average_paper"]) if o else "-", (o["average_label"] or "-") if o else "-"])
    L += _table(["fraction", "paper FLOPs", "paper V100 time", "paper GLUE (8 tasks)", "our FLOPs (paper conv.)",
                 "our training time", "our average", "our tasks"], rows)
    L.append("")
    if rep["paper_average_over_our_tasks"]:
        L.append("The published per-task rows averaged over the tasks we cover (a like-for-like comparator):")
        L.append("")
        for a in rep["paper_average_over_our_tasks"]:
            L.append(f"- {a['model']}: {fmt_score(a['score'])} over {', '.join(a['tasks'])} ({a['source']})")
        L.append("")
    if cks:
        final = cks[-1]
        header = ["task", "metric", f"ours ({final['name']})"] + [r["model"] for r in rep["paper"]["per_task"]]
        rows = []
        for t in (t for t in rep["tasks"] if t in TASK_ORDER):  # tasks the paper reports
            ours = final["tasks"].get(t)
            rows.append([task_title(t), get_task(t).paper_metric,
                         fmt_score_std(ours["median_paper"], ours["std_paper"]) if ours else "-"]
                        + [fmt_score(r["scores"].get(t)) for r in rep["paper"]["per_task"]])
        L += _table(header, rows)
        L.append("")
        L.append("Per-task sources: " + "; ".join(f"{r['model']}: {r['source']}" for r in rep["paper"]["per_task"]) + ".")
        L.append("")
    if rep["plots"]:
        L.append("## Plots")
        L.append("")
        L += [f"![{p}]({p})" for p in rep["plots"]]
        L.append("")
    L.append("## Notes")
    L.append("")
    L += [f"- {n}" for n in rep["notes"]]
    L.append("")
    return "\n".join(L)


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------


def report_command(run_dir: Path, out_dir: Path | None) -> dict[str, Any]:
    """`tinyelectra report RUN_DIR`: write report.json, report.md and the plots (default: into RUN_DIR)."""
    run_dir = Path(run_dir)
    rep = build_report(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir
    check_writable(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    if plot_glue(rep, out / "glue_vs_compute.png"):
        rep["plots"].append("glue_vs_compute.png")
    if plot_curves(*read_metrics(run_dir / "metrics.jsonl"), rep, out / "pretraining_curves.png"):
        rep["plots"].append("pretraining_curves.png")
    write_atomic(out / "report.json", json.dumps(_finite(rep), indent=2) + "\n")
    write_atomic(out / "report.md", render_markdown(rep))
    print(f"wrote {out / 'report.md'}, {out / 'report.json'}" + "".join(f", {out / p}" for p in rep["plots"]))
    return rep


def _finite(obj: Any) -> Any:
    """NaN/inf -> None, so report.json is strict JSON (a diverged seed shows as null)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
