"""Feature-space scores: how far an example's pooled final hidden state (`Outputs.features`) lies
from those of the training questions of the same model x gate x seed (`Outputs.train_features`).

- ``mahalanobis``: squared Mahalanobis distance to one Gaussian fitted on the training features
  (their mean, Ledoit-Wolf shrunk covariance). Lee et al. (2018) fit one Gaussian per class;
  the choices are no classes here (each question has its own options), so there is one.
- ``rmd``: relative Mahalanobis distance (Ren et al., 2021), ``min_d MD_d(x) - MD_0(x)``: the
  classes are the training domains (Gaussians with their own means and one shared, shrunk
  within-domain covariance), the background ``MD_0`` one Gaussian on all training features (every
  domain). It needs training questions of at least two domains (with one it is identically 0).
- ``knn``: Euclidean distance of the L2-normalised feature to its k-th nearest L2-normalised
  training feature (Sun et al., 2022; ``k = 10``, shown in the name: ``knn10``).

Higher = more uncertain. They have no predictive distribution of their own: their calibration
columns use the MSP of the deterministic logits (`uqbench.Scorer.confidence`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import solve_triangular

from uqbench import Outputs, Scorer, register_scorer

FEATURES = frozenset({"logits", "features", "train_features"})


def ledoit_wolf(xc: NDArray[np.float64]) -> NDArray[np.float64]:
    """Ledoit-Wolf shrunk covariance of centred rows ``xc`` (n, p): ``(1 - s) S + s mu I``,
    ``S = xc'xc / n``, ``mu = tr(S) / p``, ``s`` the shrinkage of Ledoit & Wolf (2004), as in
    ``sklearn.covariance.ledoit_wolf(xc, assume_centered=True)``."""
    n, p = xc.shape
    emp = xc.T @ xc / n
    mu = np.trace(emp) / p
    # sum_ij mean_k x_ki^2 x_kj^2 = mean_k ||x_k||^4: sklearn's sum of the (p, p) x2'x2, in O(np)
    beta_ = np.sum(np.einsum("ij,ij->i", xc, xc)**2) / n
    delta = np.sum((emp - mu * np.eye(p))**2) / p         # ||S - mu I||_F^2 / p
    beta = min((beta_ - np.sum(emp**2)) / (n * p), delta)
    s = 0.0 if beta == 0 else beta / delta
    return (1.0 - s) * emp + s * mu * np.eye(p)          # type: ignore[no-any-return]


def mahalanobis(x: NDArray[np.float64], mean: NDArray[np.float64],
                cov: NDArray[np.float64]) -> NDArray[np.float64]:
    """Squared Mahalanobis distance of each row of ``x`` (n, p) to ``mean`` under ``cov``: (n,)
    for a (p,) ``mean``; (n, k) for k means, rows of a (k, p) ``mean``."""
    return _distances(x, mean, np.linalg.cholesky(cov))


def _distances(x: NDArray[np.float64], mean: NDArray[Any],
               chol: NDArray[Any]) -> NDArray[np.float64]:
    """:func:`mahalanobis` under ``cov = chol chol'``: ``||chol^-1 (x - mean)||^2``."""
    means = np.atleast_2d(mean)
    out = np.empty((len(x), len(means)))
    for j, m in enumerate(means):
        y = solve_triangular(chol, (x - m).T, lower=True, check_finite=False)   # (p, n)
        out[:, j] = np.einsum("ij,ij->j", y, y)
    return out[:, 0] if np.ndim(mean) == 1 else out


Fit = Callable[[NDArray[np.float64], NDArray[np.str_]], Any]
#: the last fit of each fitting function, with the training arrays it was fitted on
FITS: dict[Fit, tuple[tuple[NDArray[Any], NDArray[Any] | None], Any]] = {}


def _fitted(outputs: Outputs, *fits: Fit) -> tuple[NDArray[np.float64], list[Any]]:
    """(the test features in float64, ``[fit(training features in float64, their domains)
    for fit in fits]``).

    Every split and domain of one model x gate x seed holds the very same training arrays
    (`uqbench.core.outputs.with_train`), so the fit is made once for them and kept, with the
    arrays themselves (which an ``is`` test then safely recognises), until other arrays come."""
    if outputs.features is None or outputs.train_features is None:
        raise ValueError("feature-space scorers need Outputs.features and train_features "
                         "(records made by uqbench run with this version)")
    train = (outputs.train_features, outputs.train_domain)
    got = []
    for fit in fits:
        last = FITS.get(fit)
        if last is None or last[0][0] is not train[0] or last[0][1] is not train[1]:
            last = (train, fit(train[0].astype(np.float64), np.asarray(train[1])))
            FITS[fit] = last
        got.append(last[1])
    return outputs.features.astype(np.float64), got


def _gaussian(t: NDArray[np.float64], _: Any) -> tuple[NDArray[Any], NDArray[Any]]:
    """The training features' mean and the Cholesky factor of their shrunk covariance."""
    mean = t.mean(axis=0)
    return mean, np.linalg.cholesky(ledoit_wolf(t - mean))


def _per_domain(t: NDArray[np.float64], dom: NDArray[np.str_]
                ) -> tuple[NDArray[Any], NDArray[Any]]:
    """Each training domain's mean and the factor of their shared within-domain covariance."""
    names, which = np.unique(dom, return_inverse=True)
    means = np.stack([t[which == i].mean(axis=0) for i in range(len(names))])
    return means, np.linalg.cholesky(ledoit_wolf(t - means[which]))


@register_scorer("mahalanobis")
class Mahalanobis(Scorer):
    requires = FEATURES

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        x, [(mean, chol)] = _fitted(outputs, _gaussian)
        return _distances(x, mean, chol)


@register_scorer("rmd")
class RelativeMahalanobis(Scorer):
    requires = FEATURES

    def unusable(self, train_domains: Sequence[str], n_train: int) -> str | None:
        if len(set(train_domains)) < 2:
            return ("needs training questions of at least 2 domains (its classes); with one it "
                    "is identically 0: use mahalanobis, or a suite with several domains")
        return None

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        x, [(means, shared), (mean0, background)] = _fitted(outputs, _per_domain, _gaussian)
        if why := self.unusable(list(outputs.train_domain), 0):  # type: ignore[arg-type]
            raise ValueError(f"rmd {why}")
        return _distances(x, means, shared).min(axis=1) - _distances(  # type: ignore[no-any-return]
            x, mean0, background)


@register_scorer("knn")
class KNN(Scorer):
    requires = FEATURES
    chunk = 1024  # test rows per block of the (rows, M) distance matrix

    def __init__(self, k: int = 10) -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"knn: k must be a positive integer, got {k!r}")
        self.k = int(k)
        self.name = f"knn{self.k}"

    def unusable(self, train_domains: Sequence[str], n_train: int) -> str | None:
        return f"needs k={self.k} training questions, has {n_train}" if n_train < self.k else None

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        x, [t] = _fitted(outputs, _unit_rows)
        x = _unit_rows(x, None)
        if why := self.unusable((), len(t)):
            raise ValueError(f"{self.name} {why}")
        out = np.empty(len(x))
        for i in range(0, len(x), self.chunk):
            sq = 2.0 - 2.0 * x[i:i + self.chunk] @ t.T          # |a - b|^2 of unit vectors
            out[i:i + self.chunk] = np.partition(sq, self.k - 1, axis=1)[:, self.k - 1]
        return np.sqrt(out.clip(0.0))  # type: ignore[no-any-return]


def _unit_rows(a: NDArray[np.float64], _: Any) -> NDArray[np.float64]:
    return a / np.linalg.norm(a, axis=1, keepdims=True).clip(1e-12)  # type: ignore[no-any-return]
