"""OOD detection: the OOD (shifted) split is the positive class, the score is the uncertainty."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from uqbench.stats.metrics._ties import (
    TieGroups,
    as_rows,
    average_precision,
    binary_counts,
    of_rows,
    tie_groups,
)
from uqbench.stats.metrics._validation import FloatArray, ood_inputs


def ood_roc_curve(
    uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """ROC curve of detecting OOD examples by thresholding the uncertainty.

    An example is flagged OOD when its uncertainty is >= the threshold. OOD is the positive
    class: TPR = fraction of OOD flagged, FPR = fraction of ID flagged.

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples (higher = more uncertain).
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD (shifted) examples; the length may differ from ``N_id``.

    Returns
    -------
    fpr, tpr : ndarray of shape (G + 1,)
        Non-decreasing, from (0, 0) to (1, 1).
    thresholds : ndarray of shape (G + 1,)
        Decreasing: ``inf`` and then each of the G distinct uncertainty values.

    Notes
    -----
    Identical to scikit-learn's ``roc_curve(y, u, drop_intermediate=False)`` with ``y = 1`` for
    OOD (tested), with one point per distinct value so that ties move together. Collinear points
    are kept: they matter for :func:`fpr_at_95_tpr`.

    Examples
    --------
    >>> fpr, tpr, thr = ood_roc_curve([0.1, 0.4], [0.4, 0.9])
    >>> fpr, tpr, thr
    (array([0. , 0. , 0.5, 1. ]), array([0. , 0.5, 1. , 1. ]), array([inf, 0.9, 0.4, 0.1]))
    """
    u_id, u_ood = ood_inputs(uncertainty_id, uncertainty_ood)
    fps, tps, thresholds = binary_counts(u_ood, u_id)
    fps = np.r_[0, fps]
    tps = np.r_[0, tps]
    return fps / fps[-1], tps / tps[-1], np.r_[np.inf, thresholds]


def ood_auroc(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike) -> float:
    r"""Area under :func:`ood_roc_curve`: OOD detection AUROC; higher is better, in [0, 1].

    .. math:: \mathrm{AUROC} = P(u_{ood} > u_{id}) + \tfrac12 P(u_{ood} = u_{id})

    for an independent ID/OOD pair, i.e. the trapezoid area under the ROC curve (ties count
    one half); 0.5 is chance. Equals scikit-learn's ``roc_auc_score`` with OOD as class 1.
    ``ood_auroc(a, b) == 1 - ood_auroc(b, a)``.

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples.
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD examples.

    Returns
    -------
    float

    Examples
    --------
    Pairs (id, ood): (.1,.4) win, (.1,.9) win, (.4,.4) tie, (.4,.9) win: 3.5/4.

    >>> ood_auroc([0.1, 0.4], [0.4, 0.9])
    0.875
    """
    u_id, u_ood = ood_inputs(uncertainty_id, uncertainty_ood)
    return float(auroc_of_groups(tie_groups(-u_ood, -u_id)))


def auroc_of_groups(groups: TieGroups) -> float | FloatArray:
    """AUROC from the tie groups of ``-uncertainty`` with OOD as the hits."""
    n_upto, hits_upto, batched = as_rows(groups)
    tps = np.pad(hits_upto, ((0, 0), (1, 0)))
    fps = np.pad(n_upto, ((0, 0), (1, 0))) - tps
    # Twice the trapezoid area in integer counts: exact, then one division.
    twice_area = np.sum(np.diff(fps, axis=1) * (tps[:, 1:] + tps[:, :-1]), axis=1)
    return of_rows(twice_area / (2.0 * fps[:, -1] * tps[:, -1]), batched)


def aupr_out(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike) -> float:
    r"""Area under the precision-recall curve with OOD positive (AUPR-Out); higher is better.

    Average precision with OOD as the positive class and score = uncertainty:

    .. math:: \mathrm{AP} = \sum_t (R_t - R_{t-1})\,P_t

    over the distinct thresholds t (descending), with precision :math:`P_t` and recall
    :math:`R_t` of flagging ``uncertainty >= t``. Equals scikit-learn's
    ``average_precision_score`` (tested). In (0, 1]; a random score gives about the OOD fraction.

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples.
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD examples.

    Returns
    -------
    float

    Examples
    --------
    Thresholds .9: P=1, R=1/2; .4: P=2/3, R=1: AP = 1/2 * 1 + 1/2 * 2/3.

    >>> round(aupr_out([0.1, 0.4], [0.4, 0.9]), 6)
    0.833333
    """
    u_id, u_ood = ood_inputs(uncertainty_id, uncertainty_ood)
    return average_precision(u_ood, u_id)


def aupr_in(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike) -> float:
    """Area under the precision-recall curve with ID positive (AUPR-In); higher is better.

    Average precision (as in :func:`aupr_out`) with the in-distribution examples as the positive
    class and score = -uncertainty (the least uncertain are the most surely ID).

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples.
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD examples.

    Returns
    -------
    float

    Examples
    --------
    Scores -.1 (ID): P=1, R=1/2; -.4 (ID and OOD tied): P=2/3, R=1.

    >>> round(aupr_in([0.1, 0.4], [0.4, 0.9]), 6)
    0.833333
    """
    u_id, u_ood = ood_inputs(uncertainty_id, uncertainty_ood)
    return average_precision(-u_id, -u_ood)


def fpr_at_95_tpr(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike) -> float:
    """Fraction of ID examples flagged at the first threshold that catches >= 95% of OOD.

    Lower is better, in [0, 1]. Read off :func:`ood_roc_curve` (scikit-learn's ``roc_curve``
    points): the FPR at the first (highest) threshold whose TPR >= 0.95. Ties move together, so
    the TPR there may exceed 0.95; no interpolation between points.

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples.
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD examples.

    Returns
    -------
    float

    Examples
    --------
    Catching both OOD examples needs threshold 0.4, which also flags the ID example at 0.4.

    >>> fpr_at_95_tpr([0.1, 0.4], [0.4, 0.9])
    0.5
    """
    fpr, tpr, _ = ood_roc_curve(uncertainty_id, uncertainty_ood)
    return float(fpr[int(np.searchsorted(tpr, 0.95, side="left"))])


