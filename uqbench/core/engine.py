"""The seams between the core and the packages that plug into it: models and figures.

The core never imports `baselines`, torch or `figures`; it declares what a run needs from them
and finds them by name when a run starts, as it finds the built-in scorers:

`Backend` (registry `BACKENDS`, built-in ``"torch"`` = `baselines.engine`): checks a backbone
    name, sets threads, coordinates processes, lists backbones, and builds one run's `Engine`,
    which turns (model, gate, split, repetition) into `Outputs` (training, loading, gates,
    cached forward passes). Third-party backends register with `register_backend` or through
    the entry-point group ``uqbench.backends``.
`Drawer` (registry `DRAWERS`, built-in ``"figures"`` = the `figures` package): draws a
    finished run folder's figures and returns the written files.

The registries import their built-in members on first lookup (`uqbench.core.registry.Registry`), so
``import uqbench.run.runner`` loads neither torch nor matplotlib.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from uqbench.core.outputs import Outputs
from uqbench.core.plan import Pair
from uqbench.core.profiles import Profile
from uqbench.core.registry import Registry


@dataclass
class RunStats:
    """Forward passes actually executed (cache misses), keyed by (model, seed, gate, split,
    mode); cache hits, trained models and seconds per phase."""

    passes: Counter[tuple[str, int, str, str, str]] = field(default_factory=Counter)
    cache_hits: int = 0
    trained: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def add_seconds(self, phase: str, s: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + s

    def total(self, mode: str | None = None) -> int:
        return sum(v for k, v in self.passes.items() if mode is None or k[4] == mode)


class Engine(Protocol):
    """One run's model side: ``outputs`` of a pair on a split for one repetition.

    ``gate_log`` ("pair@seed" -> the gate's description: calibrated knob, achieved budget),
    ``training_log`` ("model@seed" -> its training log) and ``zero_shot_log`` (the head, whether
    the zero-shot reference applies to it, and why not) are written to ``run.json``.
    """

    gate_log: dict[str, Any]
    training_log: dict[str, Any]
    zero_shot_log: dict[str, Any]

    def outputs(self, pair: Pair, split: Any, rep: int, need: frozenset[str]) -> Outputs: ...

    def zero_shot(self, split: Any) -> Outputs | None:
        """The frozen backbone (no adapter) through the run's head on ``split``, one
        deterministic pass (cached as forward records are): the ``zero-shot`` reference
        (`uqbench.results.references`). None where the head cannot answer untrained (an
        encoder's new head); ``zero_shot_log`` then says why."""


class Backend(Protocol):
    """What the runner asks of the model side before and around a run."""

    #: experts per MoE-LoRA layer (the upper end of CARE's budget)
    n_experts: int

    def check_backbone(self, name: str) -> None:
        """Raise `ConfigError` for a backbone that cannot be loaded (before any data work)."""

    def check_profile(self, prof: Profile) -> None:
        """Raise `ConfigError` for profile settings this machine cannot run (e.g. CUDA graphs
        without CUDA), before any data work."""

    def backbones(self) -> list[str]:
        """The registered backbone names (``uqbench list backbones``)."""

    def set_threads(self, n: int | None) -> int:
        """Set the intra-op threads (``None``: the cores this process may use); return them."""

    def main_first(self) -> AbstractContextManager[None]:
        """Context in which process 0 runs first (e.g. builds a cache) and the others follow."""

    def is_main(self) -> bool:
        """Whether this process writes the report."""

    def world(self) -> int:
        """How many processes share the run."""

    def engine(self, backbone: str, prof: Profile, suite: Any, cache_root: Path,
               stats: RunStats, *, progress: bool, head: str) -> Engine:
        """The `Engine` of one run."""


#: a figure set: run folder -> the files written
Drawer = Callable[[Path], list[Path]]

BACKENDS: Registry[Backend] = Registry("backend", builtins=("baselines.engine",),
                                       entry_point_group="uqbench.backends")
DRAWERS: Registry[Drawer] = Registry("figure set", builtins=("figures",),
                                     entry_point_group="uqbench.figures")


def register_backend(name: str) -> Callable[[type[Any]], type[Any]]:
    """Class decorator: registers an instance of the decorated `Backend` class as ``name``."""

    def deco(cls: type[Any]) -> type[Any]:
        BACKENDS.add(name, cls())
        return cls

    return deco


def register_drawer(name: str) -> Callable[[Drawer], Drawer]:
    """Decorator registering ``fn(run_dir) -> list[Path]`` as a figure set."""
    return DRAWERS.register(name)


def get_backend(name: str = "torch") -> Backend:
    """The backend registered as ``name`` (unknown -> `UnknownNameError` listing the valid
    ones)."""
    return BACKENDS.get(name)


def get_drawer(name: str = "figures") -> Drawer:
    """The figure set registered as ``name`` (unknown -> `UnknownNameError` listing the valid
    ones)."""
    return DRAWERS.get(name)


__all__ = ["BACKENDS", "DRAWERS", "Backend", "Drawer", "Engine", "RunStats", "get_backend",
           "get_drawer", "register_backend", "register_drawer"]
