"""Metrics for calibration, OOD detection and selective prediction: pure functions on arrays.

Conventions shared by every function here:

- Inputs are per-example 1-D arrays of length N (``probs`` is (N, C)). Inputs are validated
  (finite, 1-D, non-empty, equal lengths, [0, 1] where a probability is expected) and a bad one
  raises ``ValueError`` naming the argument and what was expected.
- ``uncertainty``: higher = more uncertain. ``confidence``: in [0, 1], higher = more confident.
  ``correct``: boolean or 0/1, True where the prediction was right.
- ``*_error``, ``*_loss``-like metrics (ECE, MCE, Brier, NLL, AURC, E-AURC, AUGRC, FPR@95TPR):
  lower is better. AUROC, AUPR, selective accuracy, PRR: higher is better.
- OOD detection: the OOD (shifted) split is the **positive** class and the score is the
  uncertainty. The ranking metrics use one private sort-and-group-ties helper
  (:func:`tie_groups`), so tied scores always move together; the ROC / precision-recall counts
  are the same as scikit-learn's (``roc_curve(..., drop_intermediate=False)``,
  ``roc_auc_score``, ``average_precision_score``), which the tests check, but computed without
  scikit-learn's stable argsort so that 10^6 examples take milliseconds. On tied scores AUROC,
  AURC/E-AURC, AUGRC, PRR and selective accuracy equal their expectation over uniformly random
  orderings inside the tie groups (AUROC's half credit; AUGRC's errors growing linearly inside
  a group; selective accuracy's pro rata share of a straddling group; AURC's closed form in
  :func:`aurc`); AUPR and FPR@95TPR keep scikit-learn's convention (ties move together).
- Curves come before summaries (:func:`reliability_curve` -> ECE/MCE,
  :func:`risk_coverage_curve` -> AURC/E-AURC, :func:`ood_roc_curve` -> FPR@95TPR) so that
  figures draw exactly the binning and points the numbers were computed from.
- Degenerate but valid input is not an error: a single class in ``correct`` gives risk 0 or 1,
  and the OOD metrics cannot see a single class because an empty split is a ``ValueError``. The
  convention for a metric that is undefined on its input is a :class:`UndefinedMetricWarning` and
  NaN (:func:`mean_std` follows it for NaN values); :func:`bootstrap_ci` drops NaN resamples.
"""
from __future__ import annotations

from uqbench.stats.metrics._validation import (
    ECE_BINS,
    HELM_ECE_BINS,
    HELM_SELECTIVE_FRACTION,
    NLL_EPS,
    SELECTIVE_COVERAGE,
    UndefinedMetricWarning,
    calibration_inputs,
)
from uqbench.stats.metrics.bootstrap import (
    PairedInterval,
    Resampled,
    ResampledSide,
    auroc_resampler,
    bootstrap_ci,
    bootstrap_ci_two_sample,
    bootstrap_cis,
    bootstrap_stats,
    chunk_rows,
    draw_indices,
    index_chunks,
    mean_resampler,
    mean_score,
    mean_std,
    paired_bootstrap,
    paired_difference,
    paired_interval,
    per_seed,
    percentile_bounds,
    resample_side,
    resampled_selective_accuracy,
    resampled_selective_summary,
    seed_mean,
    selective_resampler,
)
from uqbench.stats.metrics.calibration import (
    ReliabilityCurve,
    brier_resampler,
    brier_score,
    calibration_resampler,
    expected_calibration_error,
    max_calibration_error,
    negative_log_likelihood,
    nll_resampler,
    reliability_curve,
)
from uqbench.stats.metrics.ranking import aupr_in, aupr_out, fpr_at_95_tpr, ood_auroc, ood_roc_curve
from uqbench.stats.metrics.selective import (
    augrc,
    augrc_of_groups,
    aurc,
    aurc_of_groups,
    e_aurc,
    helm_selective_accuracy,
    helm_selective_accuracy_of_groups,
    prediction_rejection_ratio,
    prr_of_groups,
    risk_coverage_curve,
    selective_accuracy,
    selective_summary,
)

__all__ = [
    "ECE_BINS",
    "HELM_ECE_BINS",
    "HELM_SELECTIVE_FRACTION",
    "NLL_EPS",
    "SELECTIVE_COVERAGE",
    "PairedInterval",
    "ReliabilityCurve",
    "Resampled",
    "ResampledSide",
    "UndefinedMetricWarning",
    "augrc",
    "augrc_of_groups",
    "aupr_in",
    "aupr_out",
    "aurc",
    "aurc_of_groups",
    "auroc_resampler",
    "bootstrap_ci",
    "bootstrap_ci_two_sample",
    "bootstrap_cis",
    "bootstrap_stats",
    "brier_resampler",
    "brier_score",
    "calibration_inputs",
    "calibration_resampler",
    "chunk_rows",
    "draw_indices",
    "index_chunks",
    "e_aurc",
    "expected_calibration_error",
    "fpr_at_95_tpr",
    "helm_selective_accuracy",
    "helm_selective_accuracy_of_groups",
    "max_calibration_error",
    "mean_resampler",
    "mean_score",
    "mean_std",
    "negative_log_likelihood",
    "nll_resampler",
    "ood_auroc",
    "ood_roc_curve",
    "paired_bootstrap",
    "paired_difference",
    "paired_interval",
    "percentile_bounds",
    "per_seed",
    "prediction_rejection_ratio",
    "prr_of_groups",
    "reliability_curve",
    "resampled_selective_accuracy",
    "resample_side",
    "resampled_selective_summary",
    "risk_coverage_curve",
    "seed_mean",
    "selective_accuracy",
    "selective_resampler",
    "selective_summary",
]
