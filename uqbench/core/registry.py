"""A small generic registry: decorator registration, duplicate -> ValueError, unknown ->
`UnknownNameError` (a `ConfigError` and a `KeyError`) with "did you mean".

Modelled on lm-evaluation-harness' ``api/registry.py``. Built-in members are imported lazily (so
``import uqbench`` stays light) and third-party members arrive through an entry-point group.
Every extension point is one `Registry` with the same contract: ``register`` (a decorator) or
``add``, ``get``, ``names``, ``in``; ``unregister`` and the ``scoped`` context for tests.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
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
    expects : type, optional
        The type of a member. An entry point's import may register the member itself (a
        decorated gate class registers a `GateKind`); one that registers nothing must name an
        object of this type, else a `PluginError` says how to register it.
    """

    def __init__(
        self, kind: str, *, builtins: Iterable[str] = (), entry_point_group: str | None = None,
        also: str = "", expects: type | None = None
    ) -> None:
        self.kind = kind
        self._builtins = tuple(builtins)
        self._group = entry_point_group
        self._also = also
        self._expects = expects
        self._items: dict[str, T] = {}
        self._loaded = False

    @property
    def entry_point_group(self) -> str | None:
        """The entry-point group third-party members arrive through (``uqbench.<what>``)."""
        return self._group

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
        """The registered names, sorted."""
        self.load()
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """(name, member) in registration order (built-ins first, in their modules' order)."""
        self.load()
        return list(self._items.items())

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return its member (`UnknownNameError` if absent). For tests and
        interactive sessions; a run never unregisters."""
        self.load()
        try:
            return self._items.pop(name)
        except KeyError:
            raise self.unknown(name) from None

    @contextmanager
    def scoped(self, items: Mapping[str, T] | None = None, *, replace: bool = False
               ) -> Iterator[Registry[T]]:
        """Context for tests: inside, the registry also holds ``items`` (with ``replace``: in
        place of the members of those names); on exit it holds exactly what it held on entry,
        whatever the block registered or removed.

        >>> with SCORERS.scoped({"gini": Gini}):      # doctest: +SKIP
        ...     run(...)
        """
        self.load()  # the built-ins are part of what is restored
        saved = dict(self._items)
        try:
            for name, obj in (items or {}).items():
                if replace:
                    self.unregister(name)
                self.add(name, obj)
            yield self
        finally:
            self._items.clear()
            self._items.update(saved)

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
            before = ep.name in self._items
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plugin must name itself
                raise PluginError(
                    f"{self.kind} plugin {ep.name!r} ({ep.value}) from entry-point group "
                    f"{self._group!r} failed to import: {type(exc).__name__}: {exc}. "
                    "Fix or uninstall that package."
                ) from exc
            if not before and ep.name in self._items:
                continue  # importing it registered the member (a decorated gate, head...)
            if self._expects is not None and not isinstance(obj, self._expects):
                raise PluginError(
                    f"{self.kind} plugin {ep.name!r} ({ep.value}) from entry-point group "
                    f"{self._group!r} registered nothing under {ep.name!r} and names a "
                    f"{type(obj).__name__}, not a {self._expects.__name__}. Decorate the class "
                    f"it names with uqbench's register decorator for a {self.kind}, under the "
                    "entry point's name.")
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
    """Import a user module (``--plugin``) whose import registers things.

    ``module`` is a module name -- looked up as Python does, then in the current folder (as
    ``python -m`` would: the ``uqbench`` console script starts with its own folder on the path,
    not the current one) -- or the path of a ``.py`` file, imported under its stem.
    """
    try:
        if module.endswith(".py") or "/" in module or "\\" in module:
            _import_file(Path(module))
        else:
            here = str(Path.cwd())
            if here not in sys.path and "" not in sys.path:
                sys.path.append(here)  # last: an installed module of the same name wins
            importlib.import_module(module)
    except Exception as exc:
        raise PluginError(
            f"plugin module {module!r} failed to import: {type(exc).__name__}: {exc}. "
            "Give a module name that is importable (in the current folder, on PYTHONPATH or "
            "installed) or the path of a .py file, and check that it runs without error."
        ) from exc


def _import_file(path: Path) -> None:
    """Import the ``.py`` file at ``path`` as the module named by its stem (once)."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file {str(path)!r}")
    name = path.stem
    old = sys.modules.get(name)
    if old is not None and Path(getattr(old, "__file__", "") or "").resolve() == path.resolve():
        return  # already imported (a second --plugin of the same file)
    if old is not None:
        raise ImportError(f"a module named {name!r} is already imported from "
                          f"{getattr(old, '__file__', None)}; rename {path.name}")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before exec: dataclasses and pickling look the module up
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
