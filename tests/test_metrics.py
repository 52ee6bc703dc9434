"""Tests of tinyelectra.metrics: hand-computed values (the arithmetic is in the comments), scikit-learn and scipy
on random arrays, degenerate cases, the paper's and the GLUE leaderboard's score per task, and named averages."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyelectra.errors import UserError
from tinyelectra.metrics import (
    TaskScore,
    accuracy,
    average_ranks,
    average_score,
    f1_score,
    matthews_corrcoef,
    pearson_corr,
    roc_auc,
    score_task,
    spearman_corr,
    task_metrics,
)

# ------------------------------------------------------------------------------------------------------------
# Hand-computed values
# ------------------------------------------------------------------------------------------------------------

P = np.array([1, 0, 1, 1])
Y = np.array([1, 1, 1, 0])
# TP = 2 (positions 0, 2), FN = 1 (position 1), FP = 1 (position 3), TN = 0.


def test_accuracy_by_hand():
    assert accuracy(P, Y) == 0.5  # 2 of 4 equal (positions 0, 2)


def test_f1_by_hand():
    # precision 2/3, recall 2/3 -> F1 = 2TP / (2TP + FP + FN) = 4 / 6
    assert f1_score(P, Y) == pytest.approx(2 / 3)
    # positive class 0: TP0 = 0 (no position with p = y = 0) -> F1 = 0
    assert f1_score(P, Y, positive=0) == 0.0


def test_matthews_by_hand():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2*0 - 1*1) / sqrt(3*3*1*1) = -1/3
    assert matthews_corrcoef(P, Y) == pytest.approx(-1 / 3)
    # TP = 2, FP = 1, TN = 2, FN = 1: (2*2 - 1*1) / sqrt(3*3*3*3) = 3/9
    assert matthews_corrcoef([1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 1, 1]) == pytest.approx(1 / 3)
    assert matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == 1.0
    assert matthews_corrcoef([1, 0, 0, 1], [0, 1, 1, 0]) == -1.0


def test_pearson_by_hand():
    # x = 1,2,3 (mean 2, dx = -1,0,1); y = 1,2,5 (mean 8/3, dy = -5/3,-2/3,7/3)
    # sum dx*dy = 5/3 + 7/3 = 4; sum dx^2 = 2; sum dy^2 = (25+4+49)/9 = 78/9
    # r = 4 / sqrt(2 * 78/9) = 12 / sqrt(156) = 6 / sqrt(39)
    assert pearson_corr([1, 2, 3], [1, 2, 5]) == pytest.approx(6 / math.sqrt(39))
    assert pearson_corr([1, 2, 3], [-2, -4, -6]) == pytest.approx(-1.0)


def test_spearman_with_ties_by_hand():
    # x = 1,2,2,3 -> average ranks 1, 2.5, 2.5, 4; y = 1,3,2,4 -> ranks 1,3,2,4; both mean 2.5
    # dx = -1.5,0,0,1.5; dy = -1.5,.5,-.5,1.5: sum dx*dy = 4.5, sum dx^2 = 4.5, sum dy^2 = 5 -> 4.5/sqrt(22.5) =
    # sqrt(0.9)
    assert average_ranks([1, 2, 2, 3]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert average_ranks([3.0, 1.0, 3.0, 3.0, 0.5]).tolist() == [4.0, 2.0, 4.0, 4.0, 1.0]  # ranks 3,4,5 -> 4
    assert spearman_corr([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9))
    # Monotone but not linear: Spearman 1, Pearson below 1.
    assert spearman_corr([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)
    assert pearson_corr([1, 2, 3, 4], [1, 4, 9, 100]) < 0.9


# ------------------------------------------------------------------------------------------------------------
# Degenerate inputs
# ------------------------------------------------------------------------------------------------------------


def test_degenerate_cases_have_defined_values():
    y = np.array([0, 1, 1, 0, 1])
    assert matthews_corrcoef(np.ones(5, dtype=int), y) == 0.0  # constant prediction
    assert matthews_corrcoef(y, np.ones(5, dtype=int)) == 0.0  # constant label
    assert matthews_corrcoef([1, 1], [1, 1]) == 0.0  # one class only, even when all correct (sklearn's convention)
    assert f1_score(np.zeros(5, dtype=int), np.zeros(5, dtype=int)) == 0.0  # no positives at all
    assert pearson_corr([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
    assert spearman_corr([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == 0.0
    assert math.isnan(pearson_corr([1.0, float("nan"), 3.0], [1.0, 2.0, 3.0]))  # diverged run shows as NaN
    assert math.isnan(spearman_corr([1.0, 2.0, 3.0], [1.0, float("inf"), 3.0]))
    assert accuracy([1], [1]) == 1.0
    with pytest.raises(ValueError, match="no examples"):
        accuracy([], [])
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        f1_score([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="1-D"):
        pearson_corr(np.zeros((2, 2)), np.zeros((2, 2)))


# ------------------------------------------------------------------------------------------------------------
# Against scikit-learn and scipy on random arrays
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 500))
    y = rng.integers(0, 2, n)
    p = np.where(rng.random(n) < 0.7, y, 1 - y)  # correlated with the labels
    assert accuracy(p, y) == pytest.approx(sklearn_metrics.accuracy_score(y, p), abs=1e-12)
    assert f1_score(p, y) == pytest.approx(sklearn_metrics.f1_score(y, p), abs=1e-12)
    assert matthews_corrcoef(p, y) == pytest.approx(sklearn_metrics.matthews_corrcoef(y, p), abs=1e-12)
    # Multi-class Matthews (e.g. MNLI-like, three classes), labels not starting at 0.
    y3 = rng.integers(3, 6, n)
    p3 = np.where(rng.random(n) < 0.5, y3, rng.integers(3, 6, n))
    assert matthews_corrcoef(p3, y3) == pytest.approx(sklearn_metrics.matthews_corrcoef(y3, p3), abs=1e-12)
    assert accuracy(p3, y3) == pytest.approx(sklearn_metrics.accuracy_score(y3, p3), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_matches_sklearn(seed):
    """ROC-AUC (held-out discriminator diagnostics) against scikit-learn, with tied scores; by hand on a tiny case."""
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 2000))
    y = rng.integers(0, 2, n)
    s = np.round(rng.normal(size=n) + y, 1)  # rounded: many ties
    assert roc_auc(s, y) == pytest.approx(sklearn_metrics.roc_auc_score(y, s), abs=1e-12)


def test_roc_auc_by_hand():
    # positives 0.9, 0.4; negatives 0.4, 0.1: pairs (0.9>0.4), (0.9>0.1), (0.4=0.4 -> 1/2), (0.4>0.1) = 3.5 / 4
    assert roc_auc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == 0.875
    assert roc_auc([0.1, 0.2], [1, 1]) == 0.5  # one class only: nothing to rank


@pytest.mark.parametrize("seed", range(20))
def test_grouped_roc_auc_matches_a_pair_count(seed):
    """The identity-matched AUC of the held-out diagnostics: every (positive, negative) pair of the same group counted
    by brute force (ties one half) over small random inputs with ties, one-class groups and scores that differ by
    group; a score that is a function of the group alone gets exactly 0.5; one group is the plain AUC."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    g = rng.integers(0, 6, n) * 7 - 10  # group keys need not be small or positive
    y = rng.random(n) < rng.uniform(0.1, 0.9)
    s = np.round(rng.normal(size=n) + y + 0.5 * g, 1)
    wins = pairs = 0.0
    for i in np.flatnonzero(y):
        for j in np.flatnonzero(~y & (g == g[i])):
            pairs += 1
            wins += 1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0
    assert roc_auc(s, y, g) == pytest.approx(wins / pairs if pairs else 0.5, abs=1e-12)
    assert roc_auc(np.sin(g), y, g) == 0.5
    assert roc_auc(s, y, np.zeros(n)) == pytest.approx(roc_auc(s, y), abs=1e-12)


def test_grouped_roc_auc_by_hand():
    # group 0: positive 0.9 vs negative 0.4 (1 pair, won); group 1: positive 0.1 vs negatives 0.2, 0.1 (0 + 1/2);
    # group 2: positives only (no pair). 1.5 wins of 3 pairs; ungrouped the same scores win 3 + 0.5 + 3 of 9 pairs
    s, y, g = [0.9, 0.4, 0.1, 0.2, 0.1, 0.5], [1, 0, 1, 0, 0, 1], [0, 0, 1, 1, 1, 2]
    assert roc_auc(s, y, g) == 0.5
    assert roc_auc(s, y) == pytest.approx(6.5 / 9)


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 1500))
    labels = np.round(rng.uniform(0, 5, n) * 5) / 5  # STS-B-like scores on a grid: many ties
    predictions = labels + rng.normal(0, 1.0, n)
    assert pearson_corr(predictions, labels) == pytest.approx(stats.pearsonr(predictions, labels)[0], abs=1e-12)
    assert spearman_corr(predictions, labels) == pytest.approx(stats.spearmanr(predictions, labels)[0], abs=1e-12)
    ints = rng.integers(0, 4, n)  # ties on both sides
    assert spearman_corr(ints, labels) == pytest.approx(stats.spearmanr(ints, labels)[0], abs=1e-12)
    assert np.array_equal(average_ranks(ints), stats.rankdata(ints, method="average"))


# ------------------------------------------------------------------------------------------------------------
# Task scores: paper's and GLUE leaderboard's
# ------------------------------------------------------------------------------------------------------------


def test_mrpc_scores():
    s = score_task("mrpc", P, Y)
    # accuracy 1/2, F1 2/3: paper = accuracy x100 = 50; GLUE = (66.67 + 50) / 2 = 58.33
    assert s.paper_metric == "accuracy" and s.paper_score == pytest.approx(50.0)
    assert s.glue_metric == "f1_accuracy_mean" and s.glue_score == pytest.approx((200 / 3 + 50) / 2)
    assert s.metrics["f1"] == pytest.approx(200 / 3) and s.split == "dev" and s.num_examples == 4
    assert isinstance(s, TaskScore) and s.to_dict()["glue_score"] == s.glue_score


def test_qqp_cola_rte_scores():
    assert score_task("qqp", P, Y).glue_score == pytest.approx((200 / 3 + 50) / 2)
    cola = score_task("cola", P, Y)
    assert cola.paper_score == cola.glue_score == pytest.approx(-100 / 3)  # MCC -1/3, both boards
    rte = score_task("rte", P, Y)
    assert rte.paper_score == rte.glue_score == pytest.approx(50.0) and set(rte.metrics) == {"accuracy"}


def test_stsb_scores():
    s = score_task("stsb", np.array([[1.0], [2.0], [2.0], [3.0]]), np.array([1.0, 3.0, 2.0, 4.0]))
    # Pearson: x = 1,2,2,3 (dx -1,0,0,1), y = 1,3,2,4 (dy -1.5,.5,-.5,1.5): 3 / sqrt(2 * 5) ; Spearman sqrt(0.9)
    pearson, spearman = 3 / math.sqrt(10), math.sqrt(0.9)
    assert s.paper_metric == "spearman" and s.paper_score == pytest.approx(100 * spearman)
    assert s.glue_score == pytest.approx(100 * (pearson + spearman) / 2)


def test_mnli_scores_from_logits_and_split():
    logits = np.array([[2.0, 0.1, 0.1], [0.0, 0.0, 1.0], [0.0, 3.0, 0.0]])  # argmax 0, 2, 1
    s = score_task("mnli", logits, [0, 1, 1], split="dev_mismatched")
    assert s.paper_score == pytest.approx(200 / 3) and s.split == "dev_mismatched"
    assert score_task("mnli", [0, 2, 1], [0, 1, 1]).split == "dev_matched"
    with pytest.raises(ValueError, match="3 classes"):
        task_metrics("mnli", np.zeros((3, 2)), [0, 1, 1])
    with pytest.raises(UserError, match="unknown GLUE task"):
        score_task("squad", [1], [1])


def test_average_names_its_tasks():
    avg = average_score({"stsb": 80.0, "cola": 40.0, "rte": 60.0, "sst2": 90.0, "mrpc": 80.0})
    assert avg.score == pytest.approx(70.0)  # (80 + 40 + 60 + 90 + 80) / 5
    assert avg.label == "GLUE-5: cola, mrpc, rte, sst2, stsb"
    scores = [score_task("mrpc", P, Y), score_task("cola", P, Y)]
    assert average_score(scores, kind="paper").score == pytest.approx((50 - 100 / 3) / 2)
    assert average_score(scores, kind="glue").score == pytest.approx(((200 / 3 + 50) / 2 - 100 / 3) / 2)
    eight = average_score({t: 1.0 for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")})
    assert eight.label.startswith("GLUE-8: cola, mnli, mrpc")
    assert eight.to_dict() == {"score": 1.0, "tasks": list(eight.tasks), "label": eight.label}
    with pytest.raises(ValueError, match="no task scores"):
        average_score({})
    with pytest.raises(ValueError, match="two scores for mrpc"):
        average_score([scores[0], scores[0]])
    with pytest.raises(ValueError, match="ax are not GLUE tasks"):
        average_score({"ax": 1.0})


# ------------------------------------------------------------------------------------------------------------
# What the numbers allow one to say
# ------------------------------------------------------------------------------------------------------------


def test_beyond_the_seeds_spread_only_where_the_ranges_do_not_overlap():
    """The H100 lease's own seeds (benchmarks/results/h100-2026-11-26, glue.json): its README called RTE's +7 "beyond
    the seeds' ranges", but pre-trained 52.7..58.1 and none 50.5..53.8 overlap; MRPC's ranges do not, and its median
    69.9 is 1.5 over the majority class's 68.4; STS-B's are far apart."""
    from tinyelectra.metrics import compare_seeds

    rte = compare_seeds([58.1227, 52.7076, 57.7617], [53.7906, 50.9025, 50.5415], majority=52.7076)
    assert not rte["beyond_spread"] and rte["difference"] == pytest.approx(57.7617 - 50.9025)
    assert rte["words"] == "+6.9 (52.7..58.1 vs 50.5..53.8: within the seeds' spread: the ranges overlap); " \
                           "+5.1 against the majority class's 52.7"
    mrpc = compare_seeds([73.2843, 69.1176, 69.8529], [65.1961, 67.6471, 66.6667], majority=68.3824)
    assert mrpc["beyond_spread"] and mrpc["words"].endswith("beyond the seeds' spread); +1.5 against the majority "
                                                            "class's 68.4")
    low = compare_seeds([19.9, 19.1, 19.4], [78.6, 78.9, 78.6])  # separated the other way: beyond, and below
    assert low["beyond_spread"] and low["difference"] == pytest.approx(19.4 - 78.6) and "majority" not in low["words"]
    touching = compare_seeds([60.0, 62.0], [58.0, 60.0])  # one shared value is an overlap
    assert not touching["beyond_spread"] and "within" in touching["words"]
    single = compare_seeds([70.0], [50.0, 52.0])  # one seed has no spread: never "beyond"
    assert not single["beyond_spread"] and "no spread to judge by" in single["words"]


def test_verdict_against_the_anchors_by_hand():
    """The five tasks' average against each anchor's over the same tasks: the paper's ELECTRA-Small-OWT at 1M steps
    (56.8, 88.3, 87.4, 86.8, 68.5: mean 77.56) and the replication of the 6.25% point (38.0, 63.9, 67.5, 69.9, 60.3:
    mean 59.92); with a task missing, both averages cover the same four."""
    from tinyelectra.metrics import verdict_against_anchors

    v = verdict_against_anchors({"cola": 30.0, "sst2": 80.0, "mrpc": 70.0, "stsb": 75.0, "rte": 55.0, "wnli": 99.0})
    assert v["tasks"] == ["cola", "sst2", "mrpc", "stsb", "rte"] and v["ours"] == pytest.approx(62.0)
    assert [a["average"] for a in v["anchors"]] == [pytest.approx(77.56), pytest.approx(59.92)]
    assert v["words"] == ("average 62.0 over cola, sst2, mrpc, stsb, rte; -15.6 against ELECTRA-Small-OWT at 1M steps "
                          "(77.6); +2.1 against the 6.25% point's replication (59.9): clears the replication's bar, "
                          "short of the 1M-step model")
    four = verdict_against_anchors({"cola": 0.0, "mrpc": 69.9, "stsb": 78.6, "rte": 57.8, "sst2": None})
    assert four["ours"] == pytest.approx(51.575) and "(sst2 missing)" in four["words"]
    assert [a["average"] for a in four["anchors"]] == [pytest.approx(74.875), pytest.approx(58.925)]
    assert "below the replication's bar" in four["words"]
    assert verdict_against_anchors({"wnli": 50.0})["ours"] is None
