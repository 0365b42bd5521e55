"""A small generic registry: decorator registration, duplicate -> ValueError, unknown ->
`UnknownNameError` (a `ConfigError` and a `KeyError`) with "did you mean".

Modelled on lm-evaluation-harness' ``api/registry.py``. Built-in members are imported lazily (so
``import uqbench`` stays light) and third-party members arrive through an entry-point group.
"""
from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from uqbench.core.errors import PluginError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> object map for one kind of thing (scorers, suites, backbones...).

    Parameters
    ----------
    kind : str
        What is registered, used in error messages ("scorer").
    builtins : iterable of str
        Modules imported on first lookup; importing them registers the built-in members.
    entry_point_group : str, optional
        Entry-point group scanned on first lookup ("uqbench.scorers").
    also : str
        What else a name may be, appended to the unknown-name error ("or a suite YAML file").
    """

    def __init__(
        self, kind: str, *, builtins: Iterable[str] = (), entry_point_group: str | None = None,
        also: str = ""
    ) -> None:
        self.kind = kind
        self._builtins = tuple(builtins)
        self._group = entry_point_group
        self._also = also
        self._items: dict[str, T] = {}
        self._loaded = False

    def add(self, name: str, obj: T) -> T:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items and self._items[name] is not obj:
            raise ValueError(
                f"{self.kind} {name!r} is already registered (by {self._items[name]!r}); "
                "pick another name"
            )
        self._items[name] = obj
        return obj

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@registry.register("name")``."""

        def deco(obj: T) -> T:
            return self.add(name, obj)

        return deco

    def get(self, name: str) -> T:
        """The member called ``name``; `UnknownNameError` (close matches, valid names) if none."""
        self.load()
        try:
            return self._items[name]
        except KeyError:
            raise self.unknown(name) from None

    def unknown(self, name: object) -> UnknownNameError:
        """The error `get` raises for ``name`` (for lookups that try other things first)."""
        self.load()
        return unknown_name(self.kind, name, sorted(self._items), self._also)

    def names(self) -> list[str]:
        self.load()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._items

    def load(self) -> None:
        """Import built-in modules and entry points once."""
        if self._loaded:
            return
        self._loaded = True
        for module in self._builtins:
            importlib.import_module(module)
        if self._group is None:
            return
        for ep in entry_points(group=self._group):
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plugin must name itself
                raise PluginError(
                    f"{self.kind} plugin {ep.name!r} ({ep.value}) from entry-point group "
                    f"{self._group!r} failed to import: {type(exc).__name__}: {exc}. "
                    "Fix or uninstall that package."
                ) from exc
            try:
                self.add(ep.name, obj)  # the same object again (a built-in's own entry point): ok
            except ValueError as exc:
                raise ValueError(
                    f"{self.kind} plugin {ep.name!r} ({ep.value}) from entry-point group "
                    f"{self._group!r} takes a name already in use: {exc}. Rename that entry "
                    "point, or uninstall one of the two packages.") from None


def unknown_name(kind: str, name: object, valid: Iterable[str], also: str = ""
                 ) -> UnknownNameError:
    """The error for a ``kind`` called ``name`` that is not among ``valid``: up to 3 close
    matches, then every valid name (in the given order), then ``also``."""
    valid = list(valid)
    close = difflib.get_close_matches(str(name), valid, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    return UnknownNameError(f"unknown {kind} {name!r}{hint}; valid: {', '.join(valid)}"
                            + (f", {also}" if also else ""))


def import_plugin(module: str) -> None:
    """Import a user module (``--plugin``) whose import registers things."""
    try:
        importlib.import_module(module)
    except Exception as exc:
        raise PluginError(
            f"plugin module {module!r} failed to import: {type(exc).__name__}: {exc}. "
            "Check that it is importable (on PYTHONPATH or installed) and runs without error."
        ) from exc
