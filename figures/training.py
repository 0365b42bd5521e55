"""Training curves: did the models learn anything? (``run.json``'s ``training`` logs only.)

One column per trained model (``name@seed``): on top its cross-entropy per step (raw, faint;
a trailing moving average, solid; the weighted auxiliary loss dotted when it is not zero) with
the chance line ln C (the loss of a uniform guess, mean ln k_i over the training records), below
its train accuracy per step (the fraction of each step's batch the argmax got right) with the
chance accuracy (mean 1/k_i). Where the log has them, each domain's curve (its questions' mean
cross-entropy and accuracy per logging interval, ``curves``) is drawn over both, from its loss
before any update (``initial``, step 0: a star). A model whose curves stay on the chance lines
learnt nothing, and its uncertainty numbers describe guessing. Columns wrap after `MAX_COLS`
models. Every number drawn is the log's (the moving average is for display only).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from numpy.typing import NDArray

from figures.data import RunData
from figures.style import (
    BLUE,
    GREY,
    PALETTE,
    REFERENCE_COLOR,
    TEXT_WIDTH,
    VERMILLION,
    new_figure,
)

log = logging.getLogger(__name__)

MAX_COLS = 4


def smooth(values: Sequence[float], window: int | None = None) -> tuple[NDArray[np.float64],
                                                                        NDArray[np.float64]]:
    """(steps, trailing moving average) of a per-step series, for display; the window is a
    tenth of the steps (at least 1, at most 50) unless given."""
    y = np.asarray(values, dtype=np.float64)
    w = window or max(1, min(50, y.size // 10))
    if y.size == 0 or w <= 1:
        return np.arange(y.size, dtype=np.float64), y
    avg = np.convolve(y, np.ones(w) / w, mode="valid")
    return np.arange(w - 1, y.size, dtype=np.float64), avg


def _number(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _logs(run: RunData) -> dict[str, Mapping[str, Any]]:
    got = run.meta.get("training") or {}
    if not isinstance(got, Mapping):
        return {}
    return {name: t for name, t in got.items()
            if isinstance(t, Mapping) and t.get("losses")}


def training_figure(run: RunData) -> Figure | None:
    """The training curves of every model with a log in ``run.json``; None (logged) when the
    run holds none (runs before training logs were kept, or models trained before)."""
    logs = _logs(run)
    if not logs:
        log.info("training figure skipped: run.json holds no training logs")
        return None
    n = len(logs)
    cols = min(MAX_COLS, n)
    blocks = math.ceil(n / cols)
    fig = new_figure(TEXT_WIDTH if cols > 1 else TEXT_WIDTH / 2, 2.9 * blocks)
    grid = fig.add_gridspec(2 * blocks, cols, height_ratios=[1.4, 1.0] * blocks)
    for i, (name, t) in enumerate(logs.items()):
        b, c = divmod(i, cols)
        ax_loss = fig.add_subplot(grid[2 * b, c])
        ax_acc = fig.add_subplot(grid[2 * b + 1, c], sharex=ax_loss)
        summary = t.get("summary") or {}
        _loss_panel(ax_loss, t, _number(summary.get("chance_loss")))
        _accuracy_panel(ax_acc, t, _number(summary.get("chance_accuracy")))
        _domain_curves(ax_loss, ax_acc, t)
        last_loss, last_acc = (_number(summary.get(k)) for k in ("last_loss",
                                                                 "last_train_accuracy"))
        sub = ", ".join(s for s in (
            f"CE {last_loss:.3f}" if last_loss is not None else "",
            f"acc {last_acc:.2f}" if last_acc is not None else "") if s)
        window = summary.get("window", 10)
        ax_loss.set_title(f"{name}" + (f"\nlast {window}: {sub}" if sub else ""), fontsize=7)
        ax_loss.tick_params(labelbottom=False)
        ax_acc.set_xlabel("step")
        if c == 0:
            ax_loss.set_ylabel("cross-entropy")
            ax_acc.set_ylabel("train accuracy")
    handles: dict[str, Any] = {}  # one legend for all panels, below them (clear of the curves)
    for ax in fig.axes:
        for h in ax.get_lines():
            label = str(h.get_label())
            if not label.startswith("_"):
                key = "chance" if label.startswith("chance") else label
                handles.setdefault(key, h)   # one entry per label: a domain, step 0, chance
    fig.legend(list(handles.values()), [_legend_label(k, h) for k, h in handles.items()],
               loc="outside lower center", ncols=min(4, len(handles)))
    return fig


def _legend_label(key: str, handle: Any) -> str:
    return "chance (uniform guess: ln C, 1/C)" if key == "chance" else str(handle.get_label())


def _loss_panel(ax: Any, t: Mapping[str, Any], chance: float | None) -> None:
    losses = [float(x) for x in t["losses"]]
    ax.plot(np.arange(len(losses)), losses, color=VERMILLION, alpha=0.25, lw=0.7, gid="loss_raw")
    x, y = smooth(losses)
    ax.plot(x, y, color=VERMILLION, label="cross-entropy (moving avg; raw faint)",
            gid="loss_smooth")
    aux = [float(a) for a in t.get("aux_losses") or []]
    if any(a != 0 for a in aux):
        ax.plot(*smooth(aux), color=GREY, ls=":", lw=1.0, label="aux (weighted)", gid="aux")
    if chance is not None:
        ax.axhline(chance, color=REFERENCE_COLOR, ls="--", lw=0.9,
                   label="chance", gid="chance_loss")
    ax.set_ylim(bottom=0)  # from 0: a curve that hugs ln C looks as flat as it is
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _accuracy_panel(ax: Any, t: Mapping[str, Any], chance: float | None) -> None:
    acc = [float(a) for a in t.get("train_accuracy") or []]
    if acc:
        ax.plot(np.arange(len(acc)), acc, color=BLUE, alpha=0.25, lw=0.7, gid="acc_raw")
        ax.plot(*smooth(acc), color=BLUE, label="batch accuracy (moving avg; raw faint)",
                gid="acc_smooth")
    else:
        ax.text(0.5, 0.5, "no train accuracy in this log", transform=ax.transAxes,
                ha="center", va="center", fontsize=7, color="#444444")
    if chance is not None:
        ax.axhline(chance, color=REFERENCE_COLOR, ls="--", lw=0.9,
                   label="chance", gid="chance_acc")
    ax.set_ylim(-0.02, 1.02)


def _domain_curves(ax_loss: Any, ax_acc: Any, t: Mapping[str, Any]) -> None:
    """Each domain's logged curve (``curves``: one point per logging interval, at its last
    step) from its step-0 loss and accuracy (``initial``), on both panels."""
    logged, first = t.get("curves"), t.get("initial")
    curves: Mapping[str, Any] = logged if isinstance(logged, Mapping) else {}
    initial: Mapping[str, Any] = first if isinstance(first, Mapping) else {}
    steps = [int(x) - 1 for x in curves.get("steps") or []]   # the interval's last step index
    domains = list(dict.fromkeys([*(curves.get("domains") or {}),
                                  *(initial.get("domains") or {})]))
    for i, d in enumerate(domains):
        color = PALETTE[(i + 2) % len(PALETTE)]   # clear of the pooled curves' two colours
        c = (curves.get("domains") or {}).get(d) or {}
        start = (initial.get("domains") or {}).get(d) or {}
        for ax, key in ((ax_loss, "loss"), (ax_acc, "accuracy")):
            x0, y0 = ([0.0], [_number(start.get(key))]) if _number(start.get(key)) is not None \
                else ([], [])
            pts = [(x, _number(y)) for x, y in zip(steps, c.get(key) or [], strict=False)
                   if _number(y) is not None]
            xs, ys = x0 + [float(x) for x, _ in pts], y0 + [y for _, y in pts]
            if not xs:
                continue
            ax.plot(xs, ys, color=color, lw=1.0, marker=".", ms=3, label=d,
                    gid=f"domain_{key}_{d}")
            if x0:
                ax.plot(x0, y0, color=color, marker="*", ms=6, ls="none",
                        label="step 0 (before any update)", gid=f"initial_{key}_{d}")


__all__ = ["smooth", "training_figure"]
