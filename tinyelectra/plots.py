"""The report's plots: `tinyelectra report` draws them from report.json's content (report.py builds it).

glue_vs_compute.png: GLUE average and per task against pre-training FLOPs in the paper's convention, against the
fraction of the budget and against training time, beside the paper's Table 1 rows. pretraining_curves.png:
generator and discriminator loss and accuracy against steps, fraction checkpoints marked. Also the fraction label
("6.25%") that the plots and report.md share. matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from tinyelectra import paper
from tinyelectra.files import write_atomic
from tinyelectra.glue_data import task_title
from tinyelectra.metrics import METRIC_TITLES


def fmt_fraction(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:g}%"


def _unzip(points: list[tuple], n: int = 2) -> list[list]:
    """[(x, y), ...] -> [[x, ...], [y, ...]] (n empty lists for no points)."""
    return [[p[i] for p in points] for i in range(n)]


def _metric(rep: dict[str, Any], task: str) -> str:
    """The paper metric of a task, as glue.json recorded it (custom tasks have no spec in this process)."""
    return next(c["tasks"][task]["paper_metric"] for c in rep["checkpoints"] if task in c["tasks"])


def plot_glue(rep: dict[str, Any], path: Path) -> bool:
    """GLUE against FLOPs (log), fraction and training time, ours beside the paper's Table 1. False when nothing to
    plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, NullLocator

    cks = [c for c in rep["checkpoints"] if c["average_paper"] is not None]
    if not cks:
        return False
    t1 = rep["paper"]["table1"]
    label = cks[0]["average_paper"]["label"].split(":")[0]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax_avg, ax_task, ax_frac, ax_time = axes.flat

    def ours_xy(key, scale=1.0):
        return _unzip([(c[key] * scale, c["average_paper"]["score"]) for c in cks if c.get(key) is not None])

    # (a) average vs FLOPs
    x, y = ours_xy("train_flops_paper")
    ax_avg.plot([r["train_flops_paper"] for r in t1], [r["glue_dev"] for r in t1], "s--", color="tab:gray",
                label="paper: ELECTRA-Small, GLUE-8 (Table 1)")
    ax_avg.plot([paper.BERT_SMALL["train_flops_paper"]], [paper.BERT_SMALL["glue_dev"]], "*", color="tab:red",
                markersize=12, label="paper: BERT-Small, GLUE-8")
    if x:
        ax_avg.plot(x, y, "o-", color="tab:blue", label=f"ours: {label} average")
        for k, (c, xi, yi) in enumerate(zip([c for c in cks if c.get("train_flops_paper") is not None], x, y)):
            if c.get("fraction") is not None:  # alternate below/above: neighbouring labels do not collide
                ax_avg.annotate(fmt_fraction(c["fraction"]), (xi, yi), textcoords="offset points",
                                xytext=(2, -11 if k % 2 == 0 else 6), fontsize=7)
    for r in t1:
        ax_avg.annotate(fmt_fraction(r["fraction"]), (r["train_flops_paper"], r["glue_dev"]),
                        textcoords="offset points",
                        xytext=(-8, 6), fontsize=7, color="tab:gray")
    ax_avg.set(xscale="log", xlabel="pre-training FLOPs (paper convention)", ylabel="GLUE dev score (paper metrics)",
               title="GLUE average vs. pre-training compute")
    ax_avg.legend(fontsize=8, loc="lower right")
    ax_avg.grid(True, which="both", alpha=0.3)

    # (b) per task vs FLOPs, with seed std as error bars
    for t in rep["tasks"]:
        pts = [(c["train_flops_paper"], c["tasks"][t]["median_paper"], c["tasks"][t]["std_paper"] or 0.0)
               for c in rep["checkpoints"] if t in c["tasks"] and c["train_flops_paper"] is not None
               and c["tasks"][t]["median_paper"] is not None]
        if pts:
            x, y, err = _unzip(pts, 3)
            ax_task.errorbar(x, y, yerr=err, marker="o", capsize=3,
                             label=f"{task_title(t)} ({METRIC_TITLES.get(_metric(rep, t), _metric(rep, t))})")
    ax_task.set_xscale("log")
    ax_task.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide; 1-2-5 majors instead
    ax_task.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    marks = [(c["train_flops_paper"], fmt_fraction(c["fraction"])) for c in rep["checkpoints"]
             if c["train_flops_paper"] is not None and c["fraction"] is not None]
    if marks:  # within one run FLOPs are proportional to the fraction: label the checkpoints on top
        top = ax_task.secondary_xaxis("top")
        top.set_xticks(*_unzip(marks))
        top.xaxis.set_minor_locator(NullLocator())
        top.tick_params(labelsize=8)
    ax_task.set(xlabel="pre-training FLOPs (paper convention)", ylabel="dev score, median over seeds (± std)",
                title="ours, per task (top: fraction of the budget)")
    if ax_task.get_legend_handles_labels()[0]:
        ax_task.legend(fontsize=7, loc="best")
    ax_task.grid(True, which="both", alpha=0.3)

    # (c) vs fraction of the budget: averages (per task vs fraction: the top axis of (b))
    ax_frac.plot([r["fraction"] for r in t1], [r["glue_dev"] for r in t1], "s--", color="tab:gray",
                 label="paper: ELECTRA-Small, GLUE-8")
    x, y = ours_xy("fraction")
    if x:
        ax_frac.plot(x, y, "o-", color="tab:blue", label=f"ours: {label} average (paper metrics)")
    x, y = _unzip([(c["fraction"], c["average_glue"]["score"]) for c in cks
                   if c["fraction"] is not None and c["average_glue"]])
    if x:
        ax_frac.plot(x, y, "o:", color="tab:cyan", label=f"ours: {label} average (GLUE leaderboard metrics)")
    ax_frac.set_xscale("log", base=2)
    ax_frac.set_xticks([r["fraction"] for r in t1], [fmt_fraction(r["fraction"]) for r in t1])
    ax_frac.set(xlabel="fraction of the pre-training budget", ylabel="GLUE dev score",
                title="vs. fraction of the budget (checkpoints of one run)")
    ax_frac.legend(fontsize=8, loc="best")
    ax_frac.grid(True, alpha=0.3)

    # (d) vs training time (the paper's is its V100 run's time)
    ax_time.plot([r["v100_hours"] for r in t1], [r["glue_dev"] for r in t1], "s--", color="tab:gray",
                 label="paper: one V100, GLUE-8")
    x, y = ours_xy("train_seconds", 1 / 3600)
    device = rep["hardware"]["pretraining_device"] or "this run"
    if x:
        ax_time.plot(x, y, "o-", color="tab:blue", label=f"ours: {device}, {label}")
    ax_time.set(xscale="log", xlabel="pre-training time (hours; ours: training steps only)", ylabel="GLUE dev score",
                title="vs. pre-training time")
    ax_time.legend(fontsize=8, loc="lower right")
    ax_time.grid(True, which="both", alpha=0.3)

    fig.suptitle("tinyelectra: GLUE vs. pre-training (paper's numbers are published values, 8 tasks; ours cover "
                 f"{label})", fontsize=11)
    _save_fig(fig, path)
    return True


def plot_curves(records: list[dict], events: list[dict], rep: dict[str, Any], path: Path) -> bool:
    """Generator/discriminator loss and accuracy against steps (metrics.jsonl's log `records`), the checkpoint
    `events`' steps marked. False when nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        return False
    steps = [r["step"] for r in records]
    fig, (ax_g, ax_d, ax_acc) = plt.subplots(1, 3, figsize=(15, 4.2))

    def series(key):
        return _unzip([(r["step"], r[key]) for r in records if r.get(key) is not None])

    for ax, key, title in ((ax_g, "gen_loss", "generator MLM loss"),
                           (ax_d, "disc_loss", "discriminator loss (per token)")):
        x, y = series(key)
        if x:
            ax.plot(x, y, color="tab:blue" if key == "gen_loss" else "tab:orange")
        ax.set(title=title, xlabel="step", ylabel="loss")
    for key, color, name in (("gen_acc", "tab:blue", "generator accuracy (masked)"),
                             ("disc_acc", "tab:orange", "discriminator accuracy (all tokens)")):
        x, y = series(key)
        if x:
            ax_acc.plot(x, y, color=color, label=name)
    ax_acc.set(ylim=(0, 1), title="accuracies", xlabel="step")
    ax_acc.legend(fontsize=8)
    for ax in (ax_g, ax_d, ax_acc):
        ax.grid(True, alpha=0.3)
        for e in events:
            if e.get("step") is not None:
                ax.axvline(e["step"], color="gray", linestyle=":", linewidth=1)
        ax.set_xlim(0, max(steps) * 1.02)
    if events:
        ax_g.text(0.99, 0.98, "dotted: fraction checkpoints", transform=ax_g.transAxes, ha="right", va="top",
                  fontsize=8)
    recipe = (rep.get("recipe") or {}).get("name", "")
    fig.suptitle(f"pre-training curves ({recipe}, {len(records)} log steps)", fontsize=11)
    _save_fig(fig, path)
    return True


def _save_fig(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, png.getvalue())
