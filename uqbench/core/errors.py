"""Errors that name what is wrong and how to fix it.

`UserError` subclasses are bad input: the CLI prints their message and exits non-zero without a
traceback. Everything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import warnings


class UserError(Exception):
    """Bad input from the user (CLI flag, suite file, data folder, plugin)."""


class ConfigError(UserError, ValueError):
    """An invalid name or value in a configuration (suite, profile, backbone, scorer...)."""


class UnknownNameError(ConfigError, KeyError):
    """A name that no registry entry has (`uqbench.core.registry.unknown_name`): the message lists
    close matches and every valid name. A `ConfigError` (the CLI prints it, no traceback) and
    a `KeyError` (a failed lookup)."""

    def __str__(self) -> str:  # the message, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


class DataError(UserError):
    """Missing, malformed or changed data files."""


class PluginError(UserError):
    """A user scorer that fails to import, raises, or returns a bad array."""


class NotReachable(ValueError):
    """A statistical target that this calibration split cannot reach: a conformal α finer than
    its size resolves (n < 1/α − 1, `uqbench.stats.conformal`), or a selective risk that no
    threshold certifies (`uqbench.stats.risk`). The message says which and what was reached."""


class FallbackWarning(UserWarning):
    """A step could not do what was asked and did something else (a failed fit held at a bound,
    a sandbox limit the OS refused, ...): the run goes on, and run.json ``fallbacks`` says so."""


#: What `record_fallback` collected since the last `reset_fallbacks` (the runner's run.json
#: ``fallbacks``). One list per process: the builders' worker processes return their records
#: in their results instead (e.g. a split recipe's ``builder_stats``), and the parent records
#: them.
_FALLBACKS: list[dict[str, str]] = []


def record_fallback(what: str, where: str, reason: str) -> None:
    """Warn (`FallbackWarning`) and record ``{what, where, reason}`` for run.json ``fallbacks``.

    ``what``: the step that fell back ("temperature scaling fit"); ``where``: the thing it ran
    on (a split, a method); ``reason``: what went wrong and what was done instead. An entry
    equal to one already recorded in this run (the same split read by several passes) is not
    repeated.
    """
    if add_fallback({"what": what, "where": where, "reason": reason}):
        warnings.warn(f"{what} ({where}): {reason}", FallbackWarning, stacklevel=2)


def add_fallback(entry: dict[str, str]) -> bool:
    """Record ``entry`` (``{what, where, reason}``, e.g. one a worker process recorded) unless
    this run recorded it already; whether it is new (the caller warns)."""
    if entry in _FALLBACKS:
        return False
    _FALLBACKS.append(entry)
    return True


def reset_fallbacks() -> list[dict[str, str]]:
    """Start a new run's record: clears the collector and returns it (the live list)."""
    _FALLBACKS.clear()
    return _FALLBACKS
