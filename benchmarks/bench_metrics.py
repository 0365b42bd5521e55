"""Metric speed: the full metric set on 10^6 examples, and our ECE against netcal's ECE.

Both benchmarks run on the same synthetic, realistic-looking predictions: 4-way multiple choice
(softmax of scaled Gaussian logits), confidence = maximum probability, uncertainty = 1 - that,
10^6 ID examples and 10^6 OOD examples (flatter logits). Timings are best of 3
(``time.perf_counter``); each metric is called as a user would, inputs validated every time.
"""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from uqbench.stats import metrics as M

N = 1_000_000
N_CLASSES = 4
N_BINS = 15
REPEATS = 3
TARGET_SET_S = 1.0  # the full metric set on N examples, seconds
TARGET_ECE_RATIO = 10.0  # netcal seconds / our seconds


def _best_of(fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    """Best wall-clock seconds of ``repeats`` calls."""
    return _best_wall_and_cpu(fn, repeats)[0]


def _best_wall_and_cpu(fn: Callable[[], Any], repeats: int = REPEATS) -> tuple[float, float]:
    """Best wall-clock and best process CPU seconds of ``repeats`` calls.

    CPU time (all threads of this process) is reported next to wall time because the benchmark
    machine may be shared: a wall time far above the CPU time means others were running.
    """
    wall = cpu = float("inf")
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def _softmax(logits: NDArray[np.float64]) -> NDArray[np.float64]:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _predictions(n: int, scale: float, rng: np.random.Generator) -> dict[str, NDArray[Any]]:
    labels = rng.integers(0, N_CLASSES, n)
    logits = rng.normal(size=(n, N_CLASSES)) * scale
    logits[np.arange(n), labels] += scale  # better than chance, imperfectly calibrated
    probs = _softmax(logits)
    confidence = probs.max(axis=1)
    return {
        "probs": probs,
        "labels": labels,
        "confidence": confidence,
        "correct": probs.argmax(axis=1) == labels,
        "uncertainty": 1.0 - confidence,
    }


def _metric_calls(
    d: dict[str, NDArray[Any]], u_ood: NDArray[np.float64]
) -> dict[str, Callable[[], float]]:
    conf, corr, u = d["confidence"], d["correct"], d["uncertainty"]
    probs, labels = d["probs"], d["labels"]
    return {
        "ece": lambda: M.expected_calibration_error(conf, corr, n_bins=N_BINS),
        "mce": lambda: M.max_calibration_error(conf, corr, n_bins=N_BINS),
        "brier": lambda: M.brier_score(probs, labels),
        "nll": lambda: M.negative_log_likelihood(probs, labels),
        "ood_auroc": lambda: M.ood_auroc(u, u_ood),
        "aupr_out": lambda: M.aupr_out(u, u_ood),
        "aupr_in": lambda: M.aupr_in(u, u_ood),
        "fpr95": lambda: M.fpr_at_95_tpr(u, u_ood),
        "aurc": lambda: M.aurc(u, corr),
        "e_aurc": lambda: M.e_aurc(u, corr),
        "augrc": lambda: M.augrc(u, corr),
        "selective_accuracy": lambda: M.selective_accuracy(u, corr, coverage=M.SELECTIVE_COVERAGE),
    }


def _bench_metric_set(d: dict[str, NDArray[Any]], u_ood: NDArray[np.float64]) -> dict[str, Any]:
    calls = _metric_calls(d, u_ood)

    def full_set() -> dict[str, float]:
        return {name: call() for name, call in calls.items()}

    values = full_set()
    seconds, cpu_seconds = _best_wall_and_cpu(full_set)
    return {
        "name": "metric_set_1e6",
        "n_id": int(d["confidence"].size),
        "n_ood": int(u_ood.size),
        "n_classes": N_CLASSES,
        "n_bins": N_BINS,
        "seconds": round(seconds, 4),
        "cpu_seconds": round(cpu_seconds, 4),
        "target": f"<= {TARGET_SET_S:g} s",
        "met": seconds <= TARGET_SET_S,
        # each metric alone (best of 3), to see where the time goes
        "per_metric_s": {name: round(_best_of(call), 4) for name, call in calls.items()},
        "values": {name: round(v, 6) for name, v in values.items()},
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def _bench_ece_vs_netcal(d: dict[str, NDArray[Any]]) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # netcal's dependencies warn on import
        from netcal.metrics import ECE

    conf = d["confidence"]
    correct = d["correct"].astype(np.int64)  # the same 0/1 array goes to both
    ours = M.expected_calibration_error(conf, correct, n_bins=N_BINS)
    theirs = float(ECE(bins=N_BINS).measure(conf, correct))
    # Interleaved, so that both see the same machine load; best of 3 each.
    ours_s = theirs_s = float("inf")
    for _ in range(REPEATS):
        ours_s = min(ours_s, _best_of(
            lambda: M.expected_calibration_error(conf, correct, n_bins=N_BINS), 1))
        theirs_s = min(theirs_s, _best_of(lambda: ECE(bins=N_BINS).measure(conf, correct), 1))
    ratio = theirs_s / ours_s
    return {
        "name": "ece_vs_netcal",
        "n": int(conf.size),
        "n_bins": N_BINS,
        "uqbench_s": round(ours_s, 4),
        "netcal_s": round(theirs_s, 4),
        "ratio": round(ratio, 1),
        "target": f">= {TARGET_ECE_RATIO:g}x faster",
        "met": ratio >= TARGET_ECE_RATIO,
        # netcal bins [l, u), we bin (l, u]; continuous confidences never sit on an edge.
        "ece_uqbench": round(ours, 8),
        "ece_netcal": round(theirs, 8),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def run() -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng(0)
    ind = _predictions(N, scale=1.5, rng=rng)
    ood = _predictions(N, scale=0.8, rng=rng)
    yield _bench_metric_set(ind, ood["uncertainty"])
    yield _bench_ece_vs_netcal(ind)
