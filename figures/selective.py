"""Risk-coverage curves: every method of a domain on one axes, from `risk_coverage_curve`.

References: the oracle (reject all wrong predictions first) is `risk_coverage_curve` with
uncertainty ``1 - correct``; the random reference is a horizontal line at the error rate, read
off the curve's last point (coverage 1). AURC and selective accuracy at 80% coverage in the
legend are `aurc` and `selective_accuracy`; the 80% point is marked on each curve.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from numpy.typing import ArrayLike, NDArray

from figures.data import ROLE_LABELS, RunData
from figures.style import COLUMN_WIDTH, REFERENCE_COLOR, LineStyle, new_figure, note
from uqbench.stats import metrics as M
from uqbench.stats.metrics import SELECTIVE_COVERAGE


@dataclass(frozen=True)
class RiskCoverageDisplay:
    """A risk-coverage curve, its AURC and selective accuracy at ``sel_coverage``."""

    coverage: NDArray[np.float64]
    risk: NDArray[np.float64]
    thresholds: NDArray[np.float64]
    aurc: float
    sel_coverage: float
    sel_accuracy: float
    label: str = ""

    @classmethod
    def from_predictions(cls, uncertainty: ArrayLike, correct: ArrayLike, *,
                         sel_coverage: float = SELECTIVE_COVERAGE,
                         label: str = "") -> RiskCoverageDisplay:
        cov, risk, thr = M.risk_coverage_curve(uncertainty, correct)
        return cls(cov, risk, thr, M.aurc(uncertainty, correct), sel_coverage,
                   M.selective_accuracy(uncertainty, correct, coverage=sel_coverage), label)

    @classmethod
    def oracle(cls, correct: ArrayLike) -> RiskCoverageDisplay:
        """The best possible ranking: every correct prediction accepted before any wrong one."""
        c = np.asarray(correct, dtype=np.float64)
        return cls.from_predictions(1.0 - c, c, label="oracle")

    @property
    def error_rate(self) -> float:
        """Risk at full coverage (the curve's last point)."""
        return float(self.risk[-1])

    def plot(self, ax: Axes, *, style: LineStyle, lw: float = 1.3, mark: bool = True,
             legend: str | None = None) -> Line2D:
        """Draw the curve exactly as returned (one point per distinct uncertainty), plus the
        flat start from coverage 0 that AURC integrates, and the selective-accuracy point."""
        (line,) = ax.plot(self.coverage, self.risk, lw=lw, **style.kw(),
                          label=legend if legend is not None else self.label, gid=self.label)
        ax.hlines(self.risk[0], 0, self.coverage[0], lw=lw, **style.kw())
        if mark and np.isfinite(self.sel_accuracy):
            ax.plot([self.sel_coverage], [1 - self.sel_accuracy], marker="o", ms=3.5,
                    mfc="white", mec=style.color, mew=1.0, ls="none", zorder=5,
                    gid=f"{self.label}|sel")
        return line


def risk_coverage_figure(run: RunData, domain: str, methods: Sequence[str], *,
                         role: str = "id") -> Figure:
    """All ``methods`` on one domain's ``role`` split, with oracle and random references."""
    n = len(methods)
    fig = new_figure(COLUMN_WIDTH, 2.3 + 0.13 * (n + 3))
    ax = fig.add_subplot()
    skipped: list[str] = []
    # Distinct correctness vectors (methods of one model share one) -> one reference pair
    # each, drawn thin in the colour of the group's first method.
    refs: dict[bytes, tuple[np.ndarray, str]] = {}
    top = 0.0
    for method in methods:
        s = run.scores(method, domain, role)
        problem = "no per-example scores" if s is None else s.problem()
        if problem is not None:
            skipped.append(f"{method}: {problem}")
            continue
        assert s is not None
        d = RiskCoverageDisplay.from_predictions(s.uncertainty, s.correct, label=method)
        d.plot(ax, style=run.styles[method],
               legend=f"{method} (AURC {d.aurc:.3f}, SA@80 {d.sel_accuracy:.3f})")
        refs.setdefault(s.correct.tobytes(), (s.correct, run.styles.color(method)))
        top = max(top, float(np.max(d.risk)))
    for correct, color in refs.values():
        o = RiskCoverageDisplay.oracle(correct)
        o.plot(ax, style=LineStyle(color, (0, (4, 2))), lw=0.7, mark=False, legend="_oracle")
        ax.axhline(o.error_rate, color=color, ls=":", lw=0.7, alpha=0.8, gid="random")
    if refs:
        ax.plot([], [], color=REFERENCE_COLOR, ls=(0, (4, 2)), lw=0.8,
                label="oracle" + (f" (AURC {o.aurc:.3f})" if len(refs) == 1 else
                                  ", per model (colour of its first method)"))
        ax.plot([], [], color=REFERENCE_COLOR, ls=":", lw=0.8, label="random (= error rate)")
        ax.plot([], [], marker="o", ms=3.5, mfc="white", mec="#333333", ls="none",
                label=f"selective acc. at {SELECTIVE_COVERAGE:.0%} coverage")
        ax.axvline(SELECTIVE_COVERAGE, color="#DDDDDD", lw=0.6, zorder=0)
        ax.set_ylim(0, max(top, 0.01) * 1.05)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=1,
                  handlelength=2.2)
    else:
        ax.set_ylim(0, 1)
    if skipped:
        text = "not drawn:\n" + "\n".join(skipped)
        if refs:
            ax.text(0.02, 0.98, text, transform=ax.transAxes, ha="left", va="top", fontsize=6,
                    color="#444444")
        else:
            note(ax, text)
    ax.set(xlim=(0, 1), xlabel="coverage", ylabel="selective risk (error rate)")
    seed = run.seed_note()
    ax.set_title(f"Risk–coverage, {domain}, {ROLE_LABELS.get(role, role)}"
                 + (f"\n({seed})" if seed else ""))
    return fig


__all__ = ["RiskCoverageDisplay", "risk_coverage_figure"]
