"""The rows of the results table: every method on every domain and ``pooled``, then the
reference rows, from the forward records of a run (or of records made elsewhere), with the
per-example arrays the figures and verdicts read (``scores.npz``)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from uqbench.core.outputs import Outputs
from uqbench.core.plan import Method
from uqbench.files.cache import PROTOCOL_VERSION, ArrayCache
from uqbench.files.rundir import SCORE_FIELDS, score_key
from uqbench.results.evaluate import Scored, evaluate_cached
from uqbench.results.references import ReferenceInputs, reference_rows
from uqbench.stats.metrics import ECE_BINS


def score_all(ms: Sequence[Method], refs: ReferenceInputs,
              outs: Mapping[tuple[str, str, int], Outputs], n_seeds: int, n_boot: int,
              cache: ArrayCache | None = None, scorer_timeout: float | None = None,
              protocol: str = PROTOCOL_VERSION
              ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """One row per method per domain of ``refs`` and ``pooled``, then the reference rows
    (``chance``, ``options-only``: `uqbench.results.references`); also the per-example arrays for
    figures. ``outs`` is keyed ``(pair name, "domain/role", seed)``; ``n_boot`` bootstrap
    resamples. With ``cache``, rows already evaluated on identical scores are read back.
    ``protocol``: the forward-record protocol the rows name (records made elsewhere keep the
    one they were made under).

    ``outs`` holds the ``calib`` split of every domain too: each row's ``ece_ts``/``ece_hb``/
    ``ece_iso`` are the ECE on the ID split after recalibrating on it (`uqbench.stats.recalibration`)."""
    from uqbench.results.conformal_risk import conformal_risk_columns
    from uqbench.stats.recalibration import CALIBRATORS, recalibrate_cached

    rows: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    domains = list(refs.domains)
    for m in ms:
        for dom in [*domains, "pooled"]:
            parts = domains if dom == "pooled" else [dom]

            id_outs, sh_outs, cal_outs = (
                [Outputs.concat([outs[m.pair.name, f"{d}/{role}", r] for d in parts])
                 for r in range(n_seeds)]
                for role in ("id", "shift", "calib"))
            id_s, sh_s, cal_s = (Scored.of(m.scorer, o, timeout=scorer_timeout)
                                 for o in (id_outs, sh_outs, cal_outs))
            metrics = evaluate_cached(cache, id_s, sh_s, n_bins=ECE_BINS, n_boot=n_boot, seed=0)
            recal, recal_conf = recalibrate_cached(
                cache, m.scorer, cal_outs, id_outs, cal_s.confidence, id_s.confidence,
                id_s.correct, where=f"{m.name} on {dom}", n_bins=ECE_BINS, n_boot=n_boot, seed=0)
            at = list(metrics).index("ece_hi") + 1  # the recalibrated ECEs beside the raw one
            row: dict[str, Any] = {
                "method": m.name, "model": m.pair.model.name, "gate": m.pair.gate.name,
                "scorer": m.scorer.name, "domain": dom,
                **dict(list(metrics.items())[:at]), **recal, **dict(list(metrics.items())[at:]),
                "forward_passes": m.scorer.passes(id_outs[0]),
                "n_id": id_outs[0].n, "n_shift": sh_outs[0].n, "n_calib": cal_outs[0].n,
                "seeds": n_seeds, "protocol": protocol,
                "split_hashes": ",".join(refs.hashes[f"{d}/{r}"] for d in parts
                                         for r in ("id", "shift")),
                "calib_hashes": ",".join(refs.hashes[f"{d}/calib"] for d in parts),
            }
            # conformal sets and selective risk control, fitted on calib
            groups = {r: o[0].domain for r, o in (("calib", cal_outs), ("id", id_outs),
                                                   ("shift", sh_outs))} if len(parts) > 1 else None
            row.update(conformal_risk_columns(cache, cal_s, id_s, sh_s, n_boot=n_boot,
                                       arrays=arrays, owner=(m.name, dom), groups=groups))
            rows.append(row)
            # per-example arrays are (N, seeds): verdicts and figures pool every seed
            for kind in CALIBRATORS:
                arrays[score_key(m.name, dom, "id", f"confidence_{kind}")] = \
                    recal_conf.confidence[kind]
            for role, os_ in (("id", id_outs), ("shift", sh_outs)):
                for f in ("route_entropy", "top1_mass", "disagreement", "experts", "labels"):
                    if getattr(os_[0], f) is not None:
                        arrays[score_key(m.pair.name, dom, role, f)] = np.stack(
                            [getattr(o, f) for o in os_], 1)
            for role, sc in (("id", id_s), ("shift", sh_s)):
                for f in SCORE_FIELDS:
                    arrays[score_key(m.name, dom, role, f)] = getattr(sc, f)
    rows += reference_rows(refs, n_boot=n_boot, seed=0, protocol=protocol)  # chance, options-only
    return rows, arrays


__all__ = ["score_all"]
