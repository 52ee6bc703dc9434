"""GLUE metrics in numpy: accuracy, F1, Matthews correlation, Pearson and Spearman; each task's two named
scores (the ELECTRA paper's and the GLUE leaderboard's); averages that say which tasks they cover; and what the
numbers allow one to say: two sides' seeds compared in words no wider than their ranges (`compare_seeds`), a run's
average against the published anchors (`verdict_against_anchors`). Arithmetic on arrays only: which column holds a
label is glue_data.py's, running a model glue.py's.

Conventions (each tested):
- Metric functions return fractions (accuracy 0..1, correlations -1..1); task scores are x100, as in the paper.
- Degenerate inputs have defined values instead of NaN or warnings: F1 with no positive label and no positive
  prediction is 0; Matthews correlation with a constant prediction or label is 0 (scikit-learn's convention);
  Pearson and Spearman of a constant array are 0. Non-finite regression predictions (a diverged run) give NaN for
  the correlations, so the failure shows instead of a number.
- Empty inputs and length mismatches are errors (ValueError).
- A task's single number comes from its primary dev split (MNLI: matched, as the paper and the official code
  report it); score mismatched separately with split="dev_mismatched".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from tinyelectra import paper

from tinyelectra.glue_data import (
    ACCURACY,
    F1,
    F1_ACCURACY_MEAN,
    GLUE_TASK_NAMES,
    MACRO_F1,
    MATTHEWS,
    PEARSON,
    PEARSON_SPEARMAN_MEAN,
    SPEARMAN,
    TaskSpec,
    get_task,
    prediction_vector,
)

METRIC_TITLES = {
    ACCURACY: "accuracy",
    F1: "F1",
    MACRO_F1: "macro F1",
    MATTHEWS: "Matthews corr.",
    PEARSON: "Pearson",
    SPEARMAN: "Spearman",
    F1_ACCURACY_MEAN: "mean of F1 and accuracy",
    PEARSON_SPEARMAN_MEAN: "mean of Pearson and Spearman",
}


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(predictions), np.asarray(labels)
    if p.ndim != 1 or y.ndim != 1:
        raise ValueError(f"metrics take 1-D arrays, got shapes {p.shape} and {y.shape}")
    if len(p) != len(y):
        raise ValueError(f"{len(p)} predictions but {len(y)} labels")
    if len(p) == 0:
        raise ValueError("no examples to score")
    return p, y


def accuracy(predictions, labels) -> float:
    """Share of predictions equal to the label."""
    p, y = _pair(predictions, labels)
    return float(np.mean(p == y))


def f1_score(predictions, labels, positive: int = 1) -> float:
    """F1 of the positive class: 2TP / (2TP + FP + FN); 0 when there is no positive label or prediction."""
    p, y = _pair(predictions, labels)
    predicted, actual = p == positive, y == positive
    denominator = int(predicted.sum() + actual.sum())  # (TP + FP) + (TP + FN)
    return 2.0 * int(np.sum(predicted & actual)) / denominator if denominator else 0.0


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation, the multi-class form (Gorodkin 2004) that reduces to
    (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) for two classes; 0 when undefined."""
    p, y = _pair(predictions, labels)
    classes, encoded = np.unique(np.concatenate([y, p]), return_inverse=True)
    y_ids, p_ids = encoded[: len(y)], encoded[len(y):]
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)  # rows: label, columns: prediction
    np.add.at(confusion, (y_ids, p_ids), 1.0)
    true_counts, pred_counts = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, n = np.trace(confusion), confusion.sum()
    numerator = correct * n - true_counts @ pred_counts
    denominator = np.sqrt((n * n - pred_counts @ pred_counts) * (n * n - true_counts @ true_counts))
    return float(numerator / denominator) if denominator > 0 else 0.0


def _correlation(x, y, ranked: bool) -> float:
    a, b = (v.astype(np.float64) for v in _pair(x, y))
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("nan")
    if ranked:
        a, b = average_ranks(a), average_ranks(b)
    da, db = a - a.mean(), b - b.mean()
    denominator = np.sqrt((da @ da) * (db @ db))
    return float(np.clip((da @ db) / denominator, -1.0, 1.0)) if denominator != 0.0 else 0.0


def pearson_corr(x, y) -> float:
    """Pearson's r; 0 when either array is constant, NaN when either holds NaN or infinity."""
    return _correlation(x, y, ranked=False)


def spearman_corr(x, y) -> float:
    """Spearman's rho: Pearson's r of the average ranks; same conventions as pearson_corr."""
    return _correlation(x, y, ranked=True)


def average_ranks(x) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of their ranks (scipy.stats.rankdata's "average")."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # sorted position where each tie group begins
    sizes = np.diff(np.append(starts, len(x)))
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.repeat(starts + (sizes + 1) / 2.0, sizes)  # ranks start+1 .. start+size, averaged
    return ranks


def roc_auc(scores, labels, groups=None) -> float:
    """Area under the ROC curve of `scores` for binary `labels` (1 = positive): the probability that a random positive
    scores above a random negative, ties counting one half (Mann-Whitney U from average ranks). 0.5 when one class
    is absent (no ranking to judge).

    With `groups` (one key per score, e.g. a token id), only pairs within a group are ranked: the probability that a
    positive scores above a negative of its own group, over all such pairs, i.e. the per-group AUCs averaged with
    weights n_pos x n_neg. A score that depends on the group alone gets exactly 0.5. Groups holding one class only
    add no pair; 0.5 when no group holds both."""
    s, y = _pair(scores, labels)
    y = y.astype(bool)
    g = np.zeros(len(s), dtype=np.int64) if groups is None else _pair(groups, labels)[0]
    order = np.lexsort((s.astype(np.float64), g))  # by group, then by score
    s, y, g = s[order], y[order], g[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    group_starts = np.flatnonzero(new_group)
    tie_starts = np.flatnonzero(new_group | np.r_[True, s[1:] != s[:-1]])  # a tie: same group, same score
    tie_sizes = np.diff(np.append(tie_starts, len(s)))
    group_sizes = np.diff(np.append(group_starts, len(s)))
    # 1.. in group
    ranks = np.repeat(tie_starts + (tie_sizes + 1) / 2.0, tie_sizes) - np.repeat(group_starts, group_sizes)
    n_pos = np.add.reduceat(y.astype(np.float64), group_starts)
    pairs = float((n_pos * (group_sizes - n_pos)).sum())
    if pairs == 0:
        return 0.5
    return float((ranks[y].sum() - (n_pos * (n_pos + 1) / 2.0).sum()) / pairs)


# ----------------------------------------------------------------------------------------------------------------
# Task scores
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskScore:
    """One task's scores on one split, all x100. `metrics` holds every metric computed for the task."""

    task: str
    split: str
    num_examples: int
    metrics: dict[str, float]
    paper_metric: str
    paper_score: float
    glue_metric: str
    glue_score: float

    def to_dict(self) -> dict:
        return asdict(self)


def task_metrics(task: TaskSpec | str, predictions, labels) -> dict[str, float]:
    """Every metric that GLUE or the paper uses for `task`, x100, plus the two means the leaderboard uses.
    `predictions` may be class ids, (M, C) scores (argmax is taken) or regression scores."""
    spec = get_task(task)
    p = prediction_vector(spec, predictions)
    y = np.asarray(labels)
    if spec.is_regression:
        values = {PEARSON: pearson_corr(p, y), SPEARMAN: spearman_corr(p, y)}
        values[PEARSON_SPEARMAN_MEAN] = (values[PEARSON] + values[SPEARMAN]) / 2
    else:
        values = {ACCURACY: accuracy(p, y)}
        wanted = (spec.paper_metric, spec.glue_metric)  # a custom task (--task-file) names its own metric
        if MATTHEWS in wanted:  # CoLA: both of its scores
            values[MATTHEWS] = matthews_corrcoef(p, y)
        if spec.glue_metric == F1_ACCURACY_MEAN or F1 in wanted:
            values[F1] = f1_score(p, y, positive=1)
        if spec.glue_metric == F1_ACCURACY_MEAN:
            values[F1_ACCURACY_MEAN] = (values[F1] + values[ACCURACY]) / 2
        if MACRO_F1 in wanted:  # the unweighted mean of every class's F1
            values[MACRO_F1] = float(np.mean([f1_score(p, y, positive=c) for c in range(spec.num_labels)]))
    return {k: 100.0 * v for k, v in values.items()}


def score_task(task: TaskSpec | str, predictions, labels, split: str | None = None) -> TaskScore:
    """The paper's and the GLUE leaderboard's score for one task (default split: the task's primary dev split)."""
    spec = get_task(task)
    values = task_metrics(spec, predictions, labels)
    return TaskScore(
        task=spec.name, split=split or spec.primary_dev_split, num_examples=len(np.asarray(labels)),
        metrics=values, paper_metric=spec.paper_metric, paper_score=values[spec.paper_metric],
        glue_metric=spec.glue_metric, glue_score=values[spec.glue_metric],
    )


@dataclass(frozen=True)
class TaskAverage:
    """A mean over tasks that names them: label "GLUE-5: cola, mrpc, rte, sst2, stsb"."""

    score: float
    tasks: tuple[str, ...]  # sorted

    @property
    def label(self) -> str:
        return f"GLUE-{len(self.tasks)}: {', '.join(self.tasks)}"

    def to_dict(self) -> dict:
        return {"score": self.score, "tasks": list(self.tasks), "label": self.label}


def average_score(scores_by_task: Mapping[str, float] | Sequence[TaskScore], kind: str = "paper") -> TaskAverage:
    """Unweighted mean over tasks. Takes {task: score} or TaskScores (then `kind` = "paper" or "glue" picks
    which of their two scores)."""
    if kind not in ("paper", "glue"):
        raise ValueError(f"kind must be 'paper' or 'glue', not {kind!r}")
    if isinstance(scores_by_task, Mapping):
        items = {get_task(t).name: float(v) for t, v in scores_by_task.items()}
    else:
        items = {}
        for s in scores_by_task:
            if s.task in items:
                raise ValueError(f"two scores for {s.task}; average one per task")
            items[s.task] = s.paper_score if kind == "paper" else s.glue_score
    if not items:
        raise ValueError("no task scores to average")
    unknown = [t for t in items if t not in GLUE_TASK_NAMES]
    if unknown:
        raise ValueError(f"{', '.join(unknown)} are not GLUE tasks with a score")
    return TaskAverage(score=float(np.mean(list(items.values()))), tasks=tuple(sorted(items)))


def score_range(metric: str) -> tuple[float, float]:
    """The values a score (x100) can take: correlations -100..100, accuracies and F1 0..100."""
    return (-100.0, 100.0) if metric in (MATTHEWS, PEARSON, SPEARMAN, PEARSON_SPEARMAN_MEAN) else (0.0, 100.0)


def compare_seeds(ours: Sequence[float], theirs: Sequence[float], majority: float | None = None) -> dict:
    """One task's seeds on two sides (x100), and the one rule for the words that compare them: "beyond the seeds'
    spread" only where the ranges do not overlap (every seed of one side above every seed of the other); "within the
    seeds' spread" where they do; no spread to judge by with one seed on a side. `majority`: the majority class's score,
    which our median is also measured against (a classifier at or below it may have learned nothing)."""
    a, b = sorted(ours), sorted(theirs)
    median = statistics.median(a)
    difference = median - statistics.median(b)
    if len(a) < 2 or len(b) < 2:
        spread, beyond = "one seed on a side: no spread to judge by", False
    else:
        beyond = a[0] > b[-1] or a[-1] < b[0]
        spread = "beyond the seeds' spread" if beyond else "within the seeds' spread: the ranges overlap"
    words = f"{difference:+.1f} ({a[0]:.1f}..{a[-1]:.1f} vs {b[0]:.1f}..{b[-1]:.1f}: {spread})"
    if majority is not None:
        words += f"; {median - majority:+.1f} against the majority class's {majority:.1f}"
    return {"difference": difference, "beyond_spread": beyond, "words": words}


def verdict_against_anchors(medians: Mapping[str, float | None]) -> dict:
    """A run's verdict, computed: its average over paper.VERDICT_TASKS (those it has) against each anchor's average
    over the same tasks (paper.ANCHORS: the paper's model at 1M steps, the replication of its 6.25% point)."""
    tasks = [t for t in paper.VERDICT_TASKS if medians.get(t) is not None]
    if not tasks:
        return {"tasks": [], "ours": None, "anchors": [], "words": "no task of the verdict's five finished"}
    ours = statistics.fmean(medians[t] for t in tasks)
    anchors = [{"anchor": label, "source": row.source, "average": statistics.fmean(row.scores[t] for t in tasks)}
               for label, row in paper.ANCHORS.items()]
    missing = [t for t in paper.VERDICT_TASKS if t not in tasks]
    words = f"average {ours:.1f} over {', '.join(tasks)}" + (f" ({', '.join(missing)} missing)" if missing else "")
    for a in anchors:
        a["gap"] = ours - a["average"]
        words += f"; {a['gap']:+.1f} against {a['anchor']} ({a['average']:.1f})"
    words += (f": {'clears' if anchors[-1]['gap'] >= 0 else 'below'} the replication's bar, "
              f"{'reaches' if anchors[0]['gap'] >= 0 else 'short of'} the 1M-step model")
    return {"tasks": tasks, "ours": ours, "anchors": anchors, "words": words}
