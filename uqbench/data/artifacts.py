"""Artifact check: can a model pick the gold option *without reading the question*?

A multiple-choice split has an annotation artifact when the options alone give the answer away
(the gold is the longest option, always in position B, or - typical for distractors made by
perturbing the gold - the option most similar to all the others). Four options-only baselines,
each with the question hidden:

``longest``
    pick the longest option (ties share the credit: expected accuracy under random tie-breaking).
``position``
    pick the gold position most common in the train split.
``centroid``
    pick the option most similar to the other options (numbers: the one with the smallest
    summed squared difference to the others, i.e. closest to their mean - the L1 median
    would tie the two middle values of 4 options every time; text: highest mean Jaccard
    similarity of character 3-gram sets). Mutant/perturbation distractors are each one edit
    away from the gold and two edits away from each other, so this baseline is the sharp test
    for built MC.
``classifier``
    logistic regression scoring each option from TF-IDF character 2-4-grams of the option and
    option-set features (length rank, numeric rank, centroid rank); the highest-scoring option
    is the prediction. Trained on the domain's train split; on the train split itself the
    predictions are 5-fold cross-fitted.

**Flag.** Under "no artifact" each baseline's correct count is a sum of independent
Bernoulli(1/k_i) (k_i = options of question i), a Poisson-binomial. A baseline is flagged when
its one-sided exact p-value is below ``alpha / 4`` (Bonferroni over the four baselines; default
``alpha = 0.01``), i.e. its accuracy exceeds the 99% upper bound of chance with the family-wise
error held at 1%. ``threshold`` is that bound expressed as an accuracy. With n = 150 questions
of 4 options it is about 0.35; with n = 32 about 0.47 - small splits only catch gross artifacts.

>>> from uqbench.data.records import MCRecord
>>> recs = [MCRecord(f"q{i}", "d", "?", ("a", "bb", "ccc", "dddd"), 3, "s") for i in range(40)]
>>> artifact_check(recs, recs).flagged
('longest', 'position', 'classifier')
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from uqbench.data.records import MCRecord

BASELINES: tuple[str, ...] = ("longest", "position", "centroid", "classifier")


@dataclass(frozen=True)
class ArtifactCheck:
    """Options-only baseline accuracies on one split and whether any beats chance.

    ``accuracy`` and ``p_value`` map each baseline of `BASELINES` to its value (NaN when it
    could not be computed, e.g. a one-class train split). ``threshold`` is the accuracy a
    baseline must reach to be flagged.
    """

    n: int
    chance: float
    accuracy: Mapping[str, float]
    p_value: Mapping[str, float]
    threshold: float
    alpha: float
    flagged: tuple[str, ...]

    @property
    def flag(self) -> bool:
        return bool(self.flagged)

    def to_json(self) -> dict[str, object]:
        return {"n": self.n, "chance": self.chance, "accuracy": dict(self.accuracy),
                "p_value": dict(self.p_value), "threshold": self.threshold,
                "alpha": self.alpha, "flagged": list(self.flagged)}


# -- chance -----------------------------------------------------------------------------------

def _option_counts(records: Sequence[MCRecord] | Sequence[int]) -> list[int]:
    """k_i of each question: records, or the option counts themselves (predictions read from
    files carry no records)."""
    return [int(r) if isinstance(r, (int, np.integer)) else len(r.choices) for r in records]


def chance_level(records: Sequence[MCRecord] | Sequence[int]) -> float:
    """Expected accuracy of uniform guessing: mean of 1/k_i (records or option counts k_i)."""
    ks = _option_counts(records)
    return float(np.mean([1.0 / k for k in ks])) if ks else float("nan")


def _null_pmf(records: Sequence[MCRecord] | Sequence[int]) -> NDArray[np.float64]:
    """pmf of the number correct under chance: Poisson-binomial, one binomial per k."""
    from scipy.stats import binom

    pmf = np.ones(1)
    for k, n in sorted(Counter(_option_counts(records)).items()):
        pmf = np.convolve(pmf, binom.pmf(np.arange(n + 1), n, 1.0 / k))
    return pmf


def chance_p_value(records: Sequence[MCRecord], accuracy: float) -> float:
    """One-sided exact p-value P(correct >= accuracy * n) under chance."""
    if not records or not np.isfinite(accuracy):
        return float("nan")
    pmf = _null_pmf(records)
    # tie-shared credit makes the count fractional: round down (conservative)
    k = math.floor(accuracy * len(records) + 1e-9)
    return float(min(1.0, pmf[k:].sum()))


def chance_interval(records: Sequence[MCRecord] | Sequence[int], level: float = 0.95
                    ) -> tuple[float, float]:
    """Central ``level`` interval of a uniform guesser's accuracy on ``records``: the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the Poisson-binomial number
    correct, divided by n (where a model guessing at random lands on this split)."""
    if not records:
        return float("nan"), float("nan")
    cdf = np.cumsum(_null_pmf(records))
    lo, hi = (int(np.searchsorted(cdf, q - 1e-12)) for q in ((1 - level) / 2, (1 + level) / 2))
    return lo / len(records), hi / len(records)


def chance_threshold(records: Sequence[MCRecord], alpha: float) -> float:
    """Smallest accuracy a/n with P(correct >= a) <= alpha under chance."""
    pmf = _null_pmf(records)
    tail = np.cumsum(pmf[::-1])[::-1]  # tail[a] = P(X >= a)
    a = int(np.argmax(tail <= alpha)) if (tail <= alpha).any() else len(pmf)
    return a / len(records)


# -- baselines --------------------------------------------------------------------------------

def _tie_credit(scores: Sequence[float], answer: int) -> float:
    best = max(scores)
    winners = [i for i, s in enumerate(scores) if s == best]
    return 1.0 / len(winners) if answer in winners else 0.0


def longest_option_accuracy(records: Sequence[MCRecord]) -> float:
    """Accuracy of picking the longest option (ties: expected accuracy of a random pick)."""
    if not records:
        return float("nan")
    return float(np.mean([_tie_credit([len(c) for c in r.choices], r.answer) for r in records]))


def majority_position(train: Sequence[MCRecord]) -> int:
    """Most common gold index in ``train`` (ties: the smallest index)."""
    c = Counter(r.answer for r in train)
    return min(c, key=lambda p: (-c[p], p))


def position_accuracy(train: Sequence[MCRecord], records: Sequence[MCRecord]) -> float:
    """Accuracy on ``records`` of always answering ``train``'s most common gold position."""
    if not records or not train:
        return float("nan")
    p = majority_position(train)
    return float(np.mean([r.answer == p for r in records]))


_NUM = re.compile(r"^[-+]?\$?\s*[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?%?$")


def _as_number(s: str) -> float | None:
    t = s.strip()
    if not t or not _NUM.match(t) or not any(ch.isdigit() for ch in t):
        return None
    try:
        return float(t.replace("$", "").replace(",", "").replace("%", "").replace(" ", ""))
    except ValueError:
        return None


def char_ngrams(s: str, n: int = 3) -> frozenset[str]:
    """The set of character n-grams of ``s`` (whitespace runs collapsed to one space)."""
    s = " ".join(s.split())
    return frozenset(s[i:i + n] for i in range(max(1, len(s) - n + 1)))


@lru_cache(maxsize=65536)
def centroid_scores(choices: tuple[str, ...]) -> tuple[float, ...]:
    """How central each option is among the options (higher = more like the others).

    All-numeric options: minus the summed squared difference to the others (the option closest
    to the mean of the options wins).
    Otherwise: mean Jaccard similarity of character 3-gram sets to the other options.
    """
    nums = [_as_number(c) for c in choices]
    k = len(choices)
    if all(x is not None for x in nums):
        xs = [float(x) for x in nums if x is not None]
        return tuple(-sum((xs[i] - xs[j]) ** 2 for j in range(k) if j != i) for i in range(k))
    g = [char_ngrams(c) for c in choices]
    sim = np.zeros((k, k))
    for i in range(k):
        for j in range(i + 1, k):
            sim[i, j] = sim[j, i] = len(g[i] & g[j]) / max(1, len(g[i] | g[j]))
    return tuple(float(sim[i].sum() / max(1, k - 1)) for i in range(k))


def centroid_accuracy(records: Sequence[MCRecord]) -> float:
    """Accuracy of picking the option most similar to the others (ties share the credit)."""
    if not records:
        return float("nan")
    return float(np.mean([_tie_credit(centroid_scores(tuple(r.choices)), r.answer)
                          for r in records]))


def _rank01(values: Sequence[float]) -> list[float]:
    """Rank of each value among its question's options, scaled to [0, 1] (ties averaged)."""
    k = len(values)
    if k < 2:
        return [0.5] * k
    out = []
    for v in values:
        below = sum(1 for w in values if w < v)
        equal = sum(1 for w in values if w == v) - 1
        out.append((below + equal / 2) / (k - 1))
    return out


def _dense_features(r: MCRecord) -> list[list[float]]:
    lens = [float(len(c)) for c in r.choices]
    cen = centroid_scores(tuple(r.choices))
    nums = [_as_number(c) for c in r.choices]
    numeric = all(x is not None for x in nums)
    nvals = [float(x) if x is not None else 0.0 for x in nums]
    lr, cr = _rank01(lens), _rank01(cen)
    nr = _rank01(nvals) if numeric else [0.5] * len(lens)
    feats = []
    for i in range(len(r.choices)):
        feats.append([math.log1p(lens[i]), lr[i], float(lens[i] == max(lens)),
                      float(lens[i] == min(lens)), cr[i], float(cen[i] == max(cen)),
                      float(numeric), nr[i], float(numeric and 0 < nr[i] < 1)])
    return feats


class OptionsOnlyClassifier:
    """Scores each option from its text and option-set features; predicts the argmax."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def _x(self, records: Sequence[MCRecord], fit: bool):
        from scipy.sparse import csr_matrix, hstack

        texts = [c for r in records for c in r.choices]
        dense = np.array([f for r in records for f in _dense_features(r)])
        if fit:
            from sklearn.feature_extraction.text import TfidfVectorizer

            self.vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), min_df=2,
                                       max_features=5000, sublinear_tf=True)
            try:
                tf = self.vec.fit_transform(texts)
            except ValueError:  # too few options for min_df=2
                self.vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4),
                                           sublinear_tf=True)
                tf = self.vec.fit_transform(texts)
        else:
            tf = self.vec.transform(texts)
        return hstack([tf, csr_matrix(dense)]).tocsr()

    def fit(self, records: Sequence[MCRecord]) -> OptionsOnlyClassifier:
        from sklearn.linear_model import LogisticRegression

        y = np.array([int(i == r.answer) for r in records for i in range(len(r.choices))])
        self.model = LogisticRegression(C=1.0, solver="liblinear", max_iter=1000,
                                        random_state=self.seed)
        self.model.fit(self._x(records, fit=True), y)
        return self

    def predict(self, records: Sequence[MCRecord]) -> NDArray[np.int64]:
        s = self.model.decision_function(self._x(records, fit=False))
        out, pos = [], 0
        for r in records:
            k = len(r.choices)
            out.append(int(np.argmax(s[pos:pos + k])))
            pos += k
        return np.array(out, dtype=np.int64)


def classifier_accuracy(train: Sequence[MCRecord], records: Sequence[MCRecord] | None = None,
                        *, seed: int = 0, folds: int = 5) -> float:
    """Options-only classifier accuracy on ``records`` (trained on ``train``).

    ``records=None`` evaluates on ``train`` itself with ``folds``-fold cross-fitting.
    NaN if the training data has a single class or is empty.
    """
    if records is None:
        return _crossfit(train, folds, seed, lambda tr, te: options_only_correct(tr, te, seed))
    return float(np.mean(options_only_correct(train, records, seed))) if records else float("nan")


def fit_options_only(train: Sequence[MCRecord], seed: int) -> OptionsOnlyClassifier | None:
    """The options-only classifier fitted on ``train``; None when it cannot be fitted (no
    records, or a single class)."""
    if not train:
        return None
    try:
        return OptionsOnlyClassifier(seed).fit(train)
    except ValueError:  # one class only (e.g. every question has a single option)
        return None


def options_only_correct(train: Sequence[MCRecord] | OptionsOnlyClassifier | None,
                         test: Sequence[MCRecord], seed: int) -> NDArray[np.float64]:
    """1.0 where the options-only classifier (fitted on ``train``, or given) answers a ``test``
    question right, else 0.0; NaN for every question when there is no classifier."""
    clf = train if isinstance(train, OptionsOnlyClassifier) or train is None \
        else fit_options_only(train, seed)
    if clf is None:
        return np.full(len(test), np.nan)
    return (clf.predict(test) == np.array([r.answer for r in test])).astype(float)


def _crossfit(records: Sequence[MCRecord], folds: int, seed: int, fn) -> float:
    n = len(records)
    if n < 2:
        return float("nan")
    order = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(order, min(folds, n))
    correct = np.full(n, np.nan)
    for p in parts:
        test_idx = set(p.tolist())
        tr = [records[i] for i in range(n) if i not in test_idx]
        te = [records[i] for i in p]
        correct[p] = fn(tr, te)
    return float(np.nanmean(correct)) if np.isfinite(correct).any() else float("nan")


# -- the check --------------------------------------------------------------------------------

def artifact_check(train: Sequence[MCRecord], records: Sequence[MCRecord] | None = None, *,
                   seed: int = 0, alpha: float = 0.01,
                   classifier: OptionsOnlyClassifier | None = None) -> ArtifactCheck:
    """Run the four options-only baselines on ``records`` and flag any that beats chance.

    Parameters
    ----------
    train : sequence of MCRecord
        The domain's train split: the position prior and the classifier learn from it.
    records : sequence of MCRecord, optional
        The split to check; None checks ``train`` itself (learned baselines cross-fitted).
    seed : int
        Seeds the classifier and the cross-fitting folds.
    alpha : float
        Family-wise error rate over the four baselines (each tested at ``alpha / 4``).
    classifier : OptionsOnlyClassifier, optional
        Already fitted on ``train`` (reused across a domain's splits); ignored if
        ``records`` is None.

    Returns
    -------
    ArtifactCheck
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    train = list(train)
    target = train if records is None else list(records)
    if not target:
        raise ValueError("artifact_check needs a non-empty split")
    acc: dict[str, float] = {"longest": longest_option_accuracy(target)}
    if records is None:
        acc["position"] = _crossfit(
            train, 5, seed, lambda tr, te: np.array([float(r.answer == majority_position(tr))
                                                     for r in te]))
    else:
        acc["position"] = position_accuracy(train, target)
    acc["centroid"] = centroid_accuracy(target)
    if records is None:
        acc["classifier"] = classifier_accuracy(train, seed=seed)
    else:
        correct = options_only_correct(
            classifier if classifier is not None else train, target, seed
        )
        acc["classifier"] = float(np.mean(correct))
    level = alpha / len(BASELINES)
    pv = {k: chance_p_value(target, v) for k, v in acc.items()}
    flagged = tuple(k for k in BASELINES if np.isfinite(pv[k]) and pv[k] <= level)
    return ArtifactCheck(n=len(target), chance=chance_level(target), accuracy=acc, p_value=pv,
                         threshold=chance_threshold(target, level), alpha=alpha,
                         flagged=flagged)


def check_suite(suite, *, seed: int = 0, alpha: float = 0.01
                ) -> dict[tuple[str, str], ArtifactCheck]:
    """`artifact_check` of every (domain, role) split of a built suite."""
    out: dict[tuple[str, str], ArtifactCheck] = {}
    fitted: dict[str, OptionsOnlyClassifier | None] = {}
    for (dom, role), split in suite.splits.items():
        train = suite.split(dom, "train").records
        if role == "train":
            out[dom, role] = artifact_check(train, None, seed=seed, alpha=alpha)
            continue
        if dom not in fitted:
            fitted[dom] = fit_options_only(train, seed)
        out[dom, role] = artifact_check(train, split.records, seed=seed, alpha=alpha,
                                        classifier=fitted[dom])
    return out


__all__ = [
    "BASELINES", "ArtifactCheck", "OptionsOnlyClassifier", "artifact_check", "centroid_accuracy",
    "centroid_scores", "chance_interval", "chance_level", "chance_p_value", "chance_threshold",
    "check_suite", "classifier_accuracy", "fit_options_only", "longest_option_accuracy",
    "majority_position", "options_only_correct", "position_accuracy",
]
