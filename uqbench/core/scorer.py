"""The `Scorer` contract and its registry.

A scorer maps an `Outputs` to a per-example uncertainty, **higher = more uncertain**. It declares
the fields it reads in ``requires``; the runner computes exactly those (and only those) once.

Example
-------
>>> import numpy as np
>>> from uqbench import Outputs, Scorer, register_scorer
>>> @register_scorer("doc_example_margin")
... class Margin(Scorer):
...     requires = frozenset({"logits"})
...     def __call__(self, outputs):
...         p = np.sort(self.predictive(outputs), axis=1)
...         return 1.0 - (p[:, -1] - p[:, -2])
"""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray

from uqbench.core.errors import PluginError
from uqbench.core.outputs import Outputs
from uqbench.core.probs import softmax
from uqbench.core.registry import Registry

SCORERS: Registry[type[Scorer]] = Registry(
    "scorer", builtins=("scorers",), entry_point_group="uqbench.scorers"
)
S = TypeVar("S", bound="type[Scorer]")


class Scorer:
    """Base class for uncertainty scorers.

    Subclasses set ``requires`` and implement ``__call__``. They may override `predictive` (the
    method's predictive distribution, e.g. the mean over MC-dropout passes) and `confidence`
    (used for calibration; default: the max probability of `predictive`).
    """

    name: str = ""  # set by @register_scorer; an instance may be renamed (experiments)
    # the keyword arguments `get_scorer` built it with (its own dict; read-only when none)
    params: Mapping[str, Any] = MappingProxyType({})
    requires: ClassVar[frozenset[str]] = frozenset({"logits"})

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        raise NotImplementedError

    def logits_of(self, outputs: Outputs) -> NDArray[np.float64]:
        """(N, C) deterministic logits of ``outputs``; a TypeError naming this scorer where
        they have none (a confidence-only record)."""
        if outputs.logits is None:
            raise TypeError(f"scorer {self.name!r} reads logits; these Outputs have none "
                            "(a confidence-only record)")
        return outputs.logits

    def predictive(self, outputs: Outputs) -> NDArray[np.float64]:
        """(N, C) predictive distribution; default softmax of the deterministic logits."""
        return softmax(self.logits_of(outputs))

    def confidence(self, outputs: Outputs) -> NDArray[np.float64]:
        """(N,) confidence in [0, 1] for calibration: MSP of `predictive`."""
        return self.predictive(outputs).max(axis=1)

    def unusable(self, train_domains: Sequence[str], n_train: int) -> str | None:
        """Why this scorer cannot score a run whose ``n_train`` training questions come from
        ``train_domains``; None when it can (the default). Asked before any model work: a
        scorer with a reason is skipped, warned about and listed in ``run.json``
        ``skipped_scorers``, rather than failing the run at scoring."""
        return None

    def passes(self, outputs: Outputs) -> int:
        """Forward passes this method needs per example (1 + MC passes or members)."""
        if "member_logits" in self.requires and outputs.member_logits is not None:
            return int(outputs.member_logits.shape[0])
        if "mc_logits" in self.requires and outputs.mc_logits is not None:
            return int(outputs.mc_logits.shape[0])
        return 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def register_scorer(name: str) -> Callable[[S], S]:
    """Class decorator registering a `Scorer` subclass under ``name``.

    Duplicate names raise ``ValueError``.
    """

    def deco(cls: S) -> S:
        if not (isinstance(cls, type) and issubclass(cls, Scorer)):
            raise TypeError(f"@register_scorer({name!r}) must decorate a Scorer subclass, "
                            f"got {cls!r}")
        SCORERS.add(name, cls)
        cls.name = name
        return cls

    return deco


def get_scorer(name: str, **kwargs: Any) -> Scorer:
    """Instantiate the scorer registered as ``name`` (unknown -> `UnknownNameError`, a
    `ConfigError` and a `KeyError`, with close matches)."""
    cls = SCORERS.get(name)
    inst = cls(**kwargs)
    inst.params = dict(kwargs)
    if not inst.name:
        inst.name = name  # registered through an entry point without the decorator
    return inst


def list_scorers() -> list[str]:
    return SCORERS.names()


class _TimeLimit(Exception):
    pass


@contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise `_TimeLimit` in the main thread after ``seconds`` (SIGALRM); elsewhere, or without
    a limit, just run (the caller still checks the elapsed time afterwards)."""
    if not seconds or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise _TimeLimit

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_scorer(scorer: Scorer, outputs: Outputs, *, timeout: float | None = None
               ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Call a scorer and validate what it returns: (uncertainty, confidence), both (N,) finite.

    ``timeout``: seconds allowed for each call; a slower scorer stops the run with a
    `PluginError` naming it (interrupted in the main thread, detected afterwards elsewhere).
    """
    result = []
    for what, fn in (("uncertainty", scorer), ("confidence", scorer.confidence)):
        slow = PluginError(f"scorer {scorer.name!r} took longer than {timeout:g} s to compute "
                           f"{what} for {outputs.n} examples; make it faster (it should be "
                           "vectorised numpy) or raise the limit with --scorer-timeout") \
            if timeout else None
        t0 = time.perf_counter()
        try:
            with _time_limit(timeout):
                arr = np.asarray(fn(outputs), dtype=np.float64)
        except _TimeLimit:
            assert slow is not None  # _time_limit only fires with a timeout, which made `slow`
            raise slow from None
        except Exception as exc:
            raise PluginError(
                f"scorer {scorer.name!r} raised while computing {what}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if slow is not None and time.perf_counter() - t0 > timeout:  # type: ignore[operator]
            raise slow
        if arr.shape != (outputs.n,):
            raise PluginError(f"scorer {scorer.name!r} returned {what} of shape {arr.shape}; "
                              f"expected ({outputs.n},), one value per example")
        if not np.all(np.isfinite(arr)):
            raise PluginError(f"scorer {scorer.name!r} returned NaN/inf {what} for "
                              f"{int(np.sum(~np.isfinite(arr)))} of {outputs.n} examples")
        if what == "confidence" and (arr.min() < 0 or arr.max() > 1):
            raise PluginError(f"scorer {scorer.name!r} returned confidence outside [0, 1] "
                              f"(range [{arr.min():.3g}, {arr.max():.3g}])")
        result.append(arr)
    return result[0], result[1]


def probe_scorers(scorers: Iterable[Scorer], *, timeout: float | None = None) -> None:
    """Run each scorer once on small random but valid `Outputs` carrying every field, so that a
    plugin that raises, returns the wrong shape or NaN, or hangs stops the run before any model
    work (the real outputs are validated again by `run_scorer`)."""
    rng = np.random.default_rng(0)
    n, c = 8, 4
    probe = Outputs(
        ids=np.array([f"probe{i}" for i in range(n)]), labels=rng.integers(0, c, n),
        logits=rng.normal(size=(n, c)), domain=np.array(["probe"] * n),
        route_entropy=rng.uniform(size=n), top1_mass=rng.uniform(0.1, 1, n),
        disagreement=rng.uniform(size=n), experts=rng.uniform(1, 8, n),
        mc_logits=rng.normal(size=(3, n, c)), member_logits=rng.normal(size=(2, n, c)),
        features=rng.normal(size=(n, 6)).astype(np.float32),
        train_features=rng.normal(size=(32, 6)).astype(np.float32),
        train_domain=np.repeat(["probe_a", "probe_b"], 16), confidence=rng.uniform(size=n),
        correct=rng.integers(0, 2, n).astype(np.float64))
    for sc in scorers:
        try:
            run_scorer(sc, probe, timeout=timeout)
        except PluginError as exc:
            raise PluginError(f"{exc} (found on a probe of {n} random examples, before any "
                              "model work)") from exc.__cause__
