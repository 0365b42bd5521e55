"""The `Outputs` record: everything a scorer may read about one (model, gate, split).

All arrays are numpy. ``N`` examples, ``C`` choices, ``T`` MC-dropout passes, ``M`` ensemble
members. Router statistics are pooled per example over non-padding tokens and MoE layers.
Missing optional fields are ``None``; a scorer declares the fields it needs in ``requires``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: Logit given to a padded (absent) choice when splits with different C are pooled.
#: Finite so validation stays strict; its softmax probability is exactly 0 in float64.
PAD_LOGIT = -1e9

#: recorded with the router statistics: ``n_tokens``, the tokens they are averaged over
ROUTER_FIELDS = ("route_entropy", "top1_mass", "disagreement", "experts", "n_tokens")
REQUIRED_FIELDS = ("ids", "labels", "logits", "domain")
#: float32 (N, H) per-example features (stored in records like the per-example fields)
FEATURE_FIELDS = ("features",)
#: a confidence and a correctness per example, for records made without a distribution over
#: choices (`uqbench.io.confidence`: HELM's ``max_prob``/``exact_match``, API models); such
#: records have ``logits`` and ``labels`` None
CONFIDENCE_FIELDS = ("confidence", "correct")
OPTIONAL_FIELDS = (*ROUTER_FIELDS, "mc_logits", "member_logits", *FEATURE_FIELDS,
                   *CONFIDENCE_FIELDS)
#: the training questions' features of the same model x gate x seed, a reference attached by
#: `with_train` (not per example: `select` and `concat` keep it whole; records do not store it,
#: they hold the training split's own record)
TRAIN_FIELDS = ("train_features", "train_domain")


@dataclass(frozen=True, eq=False)
class Outputs:
    """Forward records of one model x gate x split.

    Attributes
    ----------
    ids : (N,) example ids (str).
    labels : (N,) int gold choice index in ``[0, C)``; None in confidence-only records.
    logits : (N, C) float, from the deterministic pass; None in confidence-only records.
    domain : (N,) str domain of each example.
    route_entropy : (N,) normalised router entropy ``H(p)/log N_experts`` in [0, 1].
    top1_mass : (N,) largest router probability in [0, 1].
    disagreement : (N,) CARE disagreement ``D`` of the admitted experts, in [0, 1].
    experts : (N,) mean number of active experts (over the example's tokens and MoE layers).
    n_tokens : (N,) number of non-padding tokens those means are taken over; the average
        experts per token (the budget, as the thermostat measures it) is
        ``sum(experts * n_tokens) / sum(n_tokens)``.
    mc_logits : (T, N, C) MC-dropout logits.
    member_logits : (M, N, C) deep-ensemble member logits.
    features : (N, H) float32 pooled final hidden state of the deterministic pass (what the
        head scores from: `baselines.heads.MultipleChoiceModel.last_features`).
    train_features : (M, H) float32 ``features`` of the M training questions of the same
        model x gate x seed; the feature-space scorers fit on them (`with_train`).
    train_domain : (M,) str domain of each training question.
    confidence : (N,) a confidence in [0, 1] in the model's answer, recorded where no
        distribution over choices is (confidence-only records: ``logits`` and ``labels`` None).
    correct : (N,) 0/1 whether that answer was right; comes with ``confidence``.
    tokens : optional per-token arrays for mechanism figures (name -> 1-D array, plus
        ``"example"`` mapping each token to its example row).
    """

    ids: NDArray[Any]
    labels: NDArray[np.int64] | None
    logits: NDArray[np.float64] | None
    domain: NDArray[Any]
    route_entropy: NDArray[np.float64] | None = None
    top1_mass: NDArray[np.float64] | None = None
    disagreement: NDArray[np.float64] | None = None
    experts: NDArray[np.float64] | None = None
    n_tokens: NDArray[np.float64] | None = None
    mc_logits: NDArray[np.float64] | None = None
    member_logits: NDArray[np.float64] | None = None
    features: NDArray[np.float32] | None = None
    train_features: NDArray[np.float32] | None = None
    train_domain: NDArray[Any] | None = None
    confidence: NDArray[np.float64] | None = None
    correct: NDArray[np.float64] | None = None
    tokens: Mapping[str, NDArray[Any]] | None = None

    def __post_init__(self) -> None:
        conv = {"ids": np.asarray(self.ids), "domain": np.asarray(self.domain)}
        if self.logits is not None or self.confidence is None:  # else confidence-only
            conv.update(labels=np.asarray(self.labels),
                        logits=np.asarray(self.logits, dtype=np.float64))
        for name in (*OPTIONAL_FIELDS, *TRAIN_FIELDS):
            value = getattr(self, name)
            if value is not None:
                conv[name] = np.asarray(value, dtype=np.float32 if "features" in name
                                        else None if name == "train_domain" else np.float64)
        for name, value in conv.items():
            object.__setattr__(self, name, value)
        self._validate()

    # -- validation ------------------------------------------------------------------------
    def _validate(self) -> None:
        self._validate_confidence()
        if self.logits is None:
            self._validate_features()
            return
        logits = self.logits
        if logits.ndim != 2 or logits.shape[0] == 0 or logits.shape[1] < 2:
            raise ValueError(f"Outputs.logits must have shape (N>0, C>=2), got {logits.shape}")
        n, c = logits.shape
        for name in ("ids", "labels", "domain"):
            arr = getattr(self, name)
            if arr.shape != (n,):
                raise ValueError(
                    f"Outputs.{name} must have shape ({n},) like logits, got {arr.shape}"
                )
        labels = self.labels
        assert labels is not None  # an array: it has the shape (n,) checked above
        if not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"Outputs.labels must be integers, got dtype {labels.dtype}")
        if labels.min() < 0 or labels.max() >= c:
            raise ValueError(f"Outputs.labels must lie in [0, {c}), got range "
                             f"[{labels.min()}, {labels.max()}]")
        _check_finite("logits", logits)
        for name in ROUTER_FIELDS:
            arr = getattr(self, name)
            if arr is None:
                continue
            if arr.shape != (n,):
                raise ValueError(f"Outputs.{name} must have shape ({n},), got {arr.shape}")
            _check_finite(name, arr)
        for name in ("mc_logits", "member_logits"):
            arr = getattr(self, name)
            if arr is None:
                continue
            if arr.ndim != 3 or arr.shape[1:] != (n, c) or arr.shape[0] == 0:
                raise ValueError(f"Outputs.{name} must have shape (K>0, {n}, {c}), got {arr.shape}")
            _check_finite(name, arr)
        self._validate_features()

    def _validate_confidence(self) -> None:
        """``confidence`` in [0, 1] and 0/1 ``correct``, (N,) each; a confidence-only record
        (logits None) holds nothing that needs a distribution over choices."""
        if self.logits is not None and self.confidence is None and self.correct is None:
            return
        n = self.ids.shape[0] if self.ids.ndim == 1 else 0
        if self.logits is None:
            if self.correct is None or self.labels is not None or n == 0:
                raise ValueError("a confidence-only Outputs (logits None) needs N > 0 examples, "
                                 "confidence and correct, and no labels")
            present = [f for f in (*ROUTER_FIELDS, "mc_logits", "member_logits")
                       if getattr(self, f) is not None]
            if present:
                raise ValueError(f"a confidence-only Outputs cannot hold {', '.join(present)}")
            if self.domain.shape != (n,):
                raise ValueError(f"Outputs.domain must have shape ({n},) like ids, got "
                                 f"{self.domain.shape}")
        if (self.confidence is None) != (self.correct is None):
            raise ValueError("Outputs.confidence and correct come together")
        if self.confidence is None or self.correct is None:
            return
        for name in ("confidence", "correct"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"Outputs.{name} must have shape ({n},) like ids, got "
                                 f"{getattr(self, name).shape}")
        _check_finite("confidence", self.confidence)
        if self.confidence.min() < 0 or self.confidence.max() > 1:
            raise ValueError("Outputs.confidence must lie in [0, 1]")
        if not np.isin(self.correct, (0.0, 1.0)).all():
            raise ValueError("Outputs.correct must be 0 or 1")

    def _validate_features(self) -> None:
        n, f, tf, td = self.n, self.features, self.train_features, self.train_domain
        if f is not None and (f.ndim != 2 or f.shape[0] != n or f.shape[1] == 0):
            raise ValueError(f"Outputs.features must have shape ({n}, H>0), got {f.shape}")
        if (tf is None) != (td is None):
            raise ValueError("Outputs.train_features and train_domain come together (with_train)")
        if tf is not None:
            if f is None:
                raise ValueError("Outputs.train_features needs features of this split too")
            if tf.ndim != 2 or tf.shape[0] < 2 or tf.shape[1] != f.shape[1]:
                raise ValueError(f"Outputs.train_features must have shape (M>=2, "
                                 f"{f.shape[1]}) like features, got {tf.shape}")
            if td.shape != (tf.shape[0],):  # type: ignore[union-attr]
                raise ValueError(f"Outputs.train_domain must have shape ({tf.shape[0]},), got "
                                 f"{td.shape}")  # type: ignore[union-attr]
        for name in ("features", "train_features"):
            if getattr(self, name) is not None:
                _check_finite(name, getattr(self, name))

    # -- views -----------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.ids)

    def available(self) -> frozenset[str]:
        """Names of the fields that are present (required ones always are, but ``logits`` and
        ``labels`` in confidence-only records)."""
        present = [f for f in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS, "train_features")
                   if getattr(self, f) is not None]
        return frozenset(present)

    def select(self, mask: NDArray[Any]) -> Outputs:
        """Rows selected by a boolean mask or index array (e.g. one domain)."""
        idx = np.asarray(mask)
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None or f.name == "tokens":
                kw[f.name] = None
            elif f.name in TRAIN_FIELDS:  # a reference, not per example
                kw[f.name] = v
            elif f.name in ("mc_logits", "member_logits"):
                kw[f.name] = v[:, idx]
            else:
                kw[f.name] = v[idx]
        return Outputs(**kw)

    @staticmethod
    def concat(parts: Sequence[Outputs]) -> Outputs:
        """Stack examples of several Outputs (e.g. domains into ``pooled``).

        Choices are padded to the largest C with `PAD_LOGIT` (probability exactly 0). An
        optional field is kept only if every part has it, with the same T or M (``features``:
        the same H); the training reference only if every part has the same one.
        """
        if not parts:
            raise ValueError("Outputs.concat needs at least one Outputs")
        c = max((p.logits.shape[1] for p in parts if p.logits is not None), default=0)

        def pad(a: NDArray[Any]) -> NDArray[Any]:
            width = [(0, 0)] * (a.ndim - 1) + [(0, c - a.shape[-1])]
            return np.pad(a, width, constant_values=PAD_LOGIT)

        kw: dict[str, Any] = {}
        for name in (*REQUIRED_FIELDS, *ROUTER_FIELDS, *FEATURE_FIELDS, *CONFIDENCE_FIELDS):
            vals = [getattr(p, name) for p in parts]
            if any(v is None for v in vals) or (
                    name in FEATURE_FIELDS and len({v.shape[1] for v in vals}) > 1):
                kw[name] = None
            elif name == "logits":
                kw[name] = np.concatenate([pad(v) for v in vals])
            else:
                kw[name] = np.concatenate(vals)
        for name in ("mc_logits", "member_logits"):
            vals = [getattr(p, name) for p in parts]
            ok = all(v is not None for v in vals) and len({v.shape[0] for v in vals}) == 1
            kw[name] = np.concatenate([pad(v) for v in vals], axis=1) if ok else None
        same = all(p.train_features is not None and p.train_features is parts[0].train_features
                   and p.train_domain is parts[0].train_domain for p in parts)
        if same and kw["features"] is not None:
            kw["train_features"], kw["train_domain"] = (parts[0].train_features,
                                                        parts[0].train_domain)
        return Outputs(**kw)


def with_train(outs: Mapping[tuple[str, str, int], Outputs]
               ) -> dict[tuple[str, str, int], Outputs]:
    """Attach to every record with ``features`` the training reference of its pair and seed.

    ``outs`` is keyed ``(pair name, "domain/role", seed)``; the training questions are the
    records of role ``train`` (every domain's, as the model was trained on all of them). A
    pair/seed with no train record with features keeps its records as they are (a scorer
    requiring ``train_features`` is then skipped or refused with that field named).
    """
    train: dict[tuple[str, int], list[Outputs]] = {}
    for (pair, split, seed), o in sorted(outs.items()):
        if split.endswith("/train") and o.features is not None:
            train.setdefault((pair, seed), []).append(o)
    ref = {k: Outputs.concat(v) for k, v in train.items()}
    return {k: dataclasses.replace(o, train_features=ref[k[0], k[2]].features,
                                   train_domain=ref[k[0], k[2]].domain)
            if o.features is not None and (k[0], k[2]) in ref else o
            for k, o in outs.items()}


def _check_finite(name: str, arr: NDArray[Any]) -> None:
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(
            f"Outputs.{name} has {bad} NaN/inf value(s); the model produced non-finite numbers "
            "(check the checkpoint and the input data)"
        )
