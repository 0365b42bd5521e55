"""``uqbench reproduce RUN_DIR``: rerun a finished run from what its run.json records, into a
fresh cache, and diff every results.csv value and every scores.npz array against the original.

Order of work, so that bad input fails before any: run.json (present, readable, an
``environment`` record of format `uqbench.files.environment.FORMAT`), the recorded configuration,
the output folder, the data files (their sha256 against the recorded ones) -> warnings for every
difference of code, packages, Python, machine or threads -> the run -> the diff.

Equality is bitwise by default: on the same machine kind with the same threads a run is
reproducible bit for bit (the trained models and forward records do not depend on what the
caches held, `baselines.heads.PrefixCache`). Other thread counts sum floats in other orders, and
training amplifies the last bits: ``atol`` then states the tolerance a value may differ by.
"""
from __future__ import annotations

import csv
import json
import platform
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.core.errors import DataError, UserError
from uqbench.data.sources import file_sha256
from uqbench.data.sources.files import resolve_data_dir
from uqbench.files import rundir
from uqbench.files.environment import FORMAT, code_hash, git_commit, package_versions
from uqbench.run.runner import IDENTITY_VERSION, RunConfig, run

#: the files compared (other files of a run folder, e.g. figures, are not)
COMPARED = (rundir.TABLES["csv"], rundir.SCORES)


class ReproducibilityWarning(UserWarning):
    """The rerun differs from the recorded run in something other than its configuration."""


@dataclass(frozen=True)
class Recorded:
    """What a finished run's run.json says about how to rerun it."""

    run_dir: Path
    config: RunConfig
    environment: dict[str, Any]
    processes: int = 1


@dataclass
class Diff:
    """Differences between two run folders; ``compared`` counts values and arrays compared."""

    atol: float
    differences: list[str] = field(default_factory=list)
    compared: dict[str, int] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        how = "bitwise" if self.atol == 0 else f"|a - b| <= {self.atol:g}"
        counts = ", ".join(f"{f}: {n} compared" for f, n in self.compared.items())
        return (f"{len(self.differences)} difference(s) ({how}; {counts})" if self.differences
                else f"no differences ({how}; {counts})")


def read_recorded(run_dir: Path) -> Recorded:
    """The configuration and environment recorded in ``run_dir/run.json``.

    Raises `UserError` naming the folder and the fix for a folder without run.json, an
    unreadable one, or one without an ``environment`` record of format `FORMAT`.
    """
    path = Path(run_dir) / rundir.META
    meta = rundir.read_meta(run_dir)  # missing, unreadable or not an object: a UserError
    env = meta.get("environment")
    fmt = env.get("format") if isinstance(env, dict) else None
    if fmt != FORMAT or not isinstance(env, dict):
        found = "no environment record" if fmt is None else f"environment format {fmt!r}"
        raise UserError(f"{path} has {found}; this uqbench reproduces format {FORMAT} (written "
                        "by `uqbench run` since it records code, package versions, threads, "
                        "seeds and data hashes): rerun the run with this uqbench to record one")
    config, version = meta.get("config"), meta.get("config_version", 1)
    if version != IDENTITY_VERSION:
        raise UserError(f"{path}: its `config` follows identity version {version!r}; this "
                        f"uqbench reads version {IDENTITY_VERSION}: reproduce it with the "
                        "uqbench version that wrote it")
    names = {f.name for f in fields(RunConfig)}
    unknown = sorted(set(config) - names) if isinstance(config, dict) else config
    if unknown or not isinstance(config, dict):
        raise UserError(f"{path}: its `config` ({unknown!r}) is not a configuration this "
                        "uqbench knows; reproduce it with the uqbench version that wrote it")
    # JSON values, checked by RunConfig
    kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    return Recorded(Path(run_dir), RunConfig(**kw), env, int(meta.get("processes", 1)))


def check_data(recorded: Recorded, data_dir: Path | None) -> None:
    """Raise `DataError` listing every recorded data file that is missing or whose sha256
    differs in ``data_dir``; before any work. A run built from the hub has no files to check."""
    data = recorded.environment["data"]
    if "local" not in data["origin"]:
        return
    if data_dir is None:
        raise DataError(f"{recorded.run_dir} was built from local data files; give their "
                        "folder with --data-dir or UQBENCH_DATA")
    bad = []
    for rel, sha in data["files"].items():
        path = Path(data_dir) / rel
        if not path.is_file():
            bad.append(f"{rel}: missing")
        elif (now := file_sha256(path)) != sha:
            bad.append(f"{rel}: sha256 {now[:16]}... (recorded {sha[:16]}...)")
    if bad:
        raise DataError(f"data in {data_dir} differs from what {recorded.run_dir} was built from "
                        f"({len(bad)} of {len(data['files'])} files): " + "; ".join(bad)
                        + ". Restore the recorded files (the data folder's MANIFEST names their "
                        "sources) or give --data-dir the folder holding them")


def environment_differences(recorded: Mapping[str, Any], threads: int) -> list[str]:
    """What differs between the recorded environment and this one (code, package versions,
    Python, machine, the threads the rerun uses): one sentence each."""
    out = []
    code = {"sha256": code_hash(), **git_commit()}
    old = recorded["code"]
    if code["sha256"] != old["sha256"]:
        out.append(f"the installed code differs from the recorded code (commit "
                   f"{old.get('commit')}{' with local changes' if old.get('dirty') else ''}, "
                   f"now {code.get('commit')}{' with local changes' if code.get('dirty') else ''}"
                   f"; source sha256 {old['sha256'][:12]} -> {code['sha256'][:12]})")
    now = package_versions(recorded["packages"])
    out += [f"package {k}: recorded {v}, installed {now[k]}"
            for k, v in recorded["packages"].items() if now[k] != v]
    if platform.python_version() != recorded["python"]:
        out.append(f"python: recorded {recorded['python']}, running "
                   f"{platform.python_version()}")
    machine = {"system": platform.system(), "arch": platform.machine(),
               "processor": platform.processor()}
    if machine != recorded["machine"]:
        out.append(f"machine: recorded {recorded['machine']}, running on {machine}")
    if threads != recorded["threads"]:
        out.append(f"threads: recorded {recorded['threads']}, rerun with {threads}: floats are "
                   "summed in another order, expect differences in the last bits (give --atol)")
    return out


def reproduce(run_dir: Path, *, out: Path | None = None, cache_dir: Path | None = None,
              data_dir: Path | None = None, threads: int | None = None, atol: float = 0.0,
              progress: bool = True, runner: Callable[[RunConfig], Any] | None = None) -> Diff:
    """Rerun ``run_dir`` from its run.json and diff the rerun against it.

    Parameters
    ----------
    run_dir : path
        A finished run folder (run.json with an ``environment`` record).
    out : path, optional
        Where the rerun writes (default ``RUN_DIR-reproduced`` beside it); must not exist or be
        empty.
    cache_dir : path, optional
        The rerun's cache (default: a fresh temporary folder, removed afterwards).
    data_dir : path, optional
        The data folder (default ``$UQBENCH_DATA``); its files must match the recorded sha256.
    threads : int, optional
        Torch threads of the rerun (default: the recorded ones).
    atol : float
        Tolerance of the diff (0: bitwise).
    runner : callable
        ``runner(config)`` runs the configuration (default: `uqbench.run.runner.run`).

    Returns
    -------
    Diff
        Also written, with the warnings, to ``OUT/reproduce.json``.
    """
    recorded = read_recorded(run_dir)
    if not atol >= 0:
        raise UserError(f"--atol {atol}: give a tolerance >= 0 (0: bitwise)")
    out = Path(out) if out is not None else Path(run_dir).with_name(Path(run_dir).name
                                                                   + "-reproduced")
    if out.resolve() == Path(run_dir).resolve() or (out.exists() and any(out.iterdir())):
        raise UserError(f"--out {out} is the run folder or not empty; give a new folder for "
                        "the rerun")
    if threads is not None and threads < 1:
        raise UserError(f"--threads {threads}: give at least 1 thread")
    data_dir = resolve_data_dir(data_dir)
    check_data(recorded, data_dir)
    threads = threads or int(recorded.environment["threads"])
    notes = environment_differences(recorded.environment, threads)
    if recorded.processes != 1:
        notes.append(f"processes: recorded {recorded.processes}, rerun in one: training sums "
                     "gradients and draws dropout per process, expect differences (give --atol)")
    for note in notes:
        warnings.warn(note, ReproducibilityWarning, stacklevel=2)
    with tempfile.TemporaryDirectory(prefix="uqbench-reproduce-") as tmp:
        (runner or run)(replace(recorded.config, out=out, cache_dir=cache_dir or Path(tmp),
                       data_dir=data_dir, threads=threads, figures=False, progress=progress,
                       overwrite=False))
    diff = diff_runs(Path(run_dir), out, atol=atol)
    seeds = rundir.read_meta(out)["environment"]["seeds"]
    if seeds != recorded.environment["seeds"]:
        diff.differences.append(f"seeds: recorded {recorded.environment['seeds']}, "
                                f"rerun {seeds}")
    (out / "reproduce.json").write_text(json.dumps(
        {"run": str(run_dir), "atol": atol, "threads": threads, "warnings": notes,
         "equal": diff.equal, "compared": diff.compared, "differences": diff.differences},
        indent=1))
    return diff


def diff_runs(a: Path, b: Path, *, atol: float = 0.0) -> Diff:
    """Every difference between the results.csv values and the scores.npz arrays of run
    folders ``a`` (recorded) and ``b`` (rerun); a missing file is a difference.

    results.csv rows are matched by (method, domain); a value differs when its text differs,
    unless both parse as numbers within ``atol`` (NaN equals NaN). Arrays differ in keys,
    shape, dtype or values (``np.allclose(atol=atol, rtol=0, equal_nan=True)``; bitwise at
    ``atol=0``).
    """
    diff = Diff(atol)
    for name in COMPARED:
        missing = [str(d) for d in (a, b) if not (d / name).is_file()]
        if missing:
            diff.differences.append(f"{name}: missing in {', '.join(missing)}")
            diff.compared[name] = 0
            continue
        compare = _diff_csv if name.endswith(".csv") else _diff_npz
        diff.compared[name] = compare(a / name, b / name, atol, diff.differences)
    return diff


def _rows(path: Path) -> dict[tuple[str, ...], dict[str, str]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    keyed: dict[tuple[str, ...], dict[str, str]] = {
        (r.get("method", ""), r.get("domain", "")): r for r in rows}
    if len(keyed) < len(rows):  # no unique (method, domain): match rows by position
        return {(str(i),): r for i, r in enumerate(rows)}
    return keyed


def _diff_csv(a: Path, b: Path, atol: float, out: list[str]) -> int:
    ra, rb = _rows(a), _rows(b)
    n = 0
    for key in [*ra, *(k for k in rb if k not in ra)]:
        where = f"results.csv {'/'.join(key)}"
        if key not in ra or key not in rb:
            out.append(f"{where}: row only in {'the rerun' if key in rb else 'the recorded run'}")
            continue
        for col in dict.fromkeys([*ra[key], *rb[key]]):
            n += 1
            x, y = ra[key].get(col), rb[key].get(col)
            if x != y and not _close(x, y, atol):
                out.append(f"{where} {col}: {x} -> {y}")
    return n


def _close(x: str | None, y: str | None, atol: float) -> bool:
    try:
        fx, fy = float(x), float(y)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return (np.isnan(fx) and np.isnan(fy)) or abs(fx - fy) <= atol


def _diff_npz(a: Path, b: Path, atol: float, out: list[str]) -> int:
    with np.load(a, allow_pickle=False) as za, np.load(b, allow_pickle=False) as zb:
        keys = list(dict.fromkeys([*za.files, *zb.files]))
        for k in keys:
            if k not in za.files or k not in zb.files:
                out.append(f"scores.npz {k}: only in "
                           f"{'the rerun' if k in zb.files else 'the recorded run'}")
                continue
            x, y = za[k], zb[k]
            if x.shape != y.shape or x.dtype != y.dtype:
                out.append(f"scores.npz {k}: {x.dtype}{list(x.shape)} -> {y.dtype}{list(y.shape)}")
            elif x.dtype.kind == "f":
                bad = (x.view(f"u{x.itemsize}") != y.view(f"u{y.itemsize}") if atol == 0 else
                       ~np.isclose(x, y, rtol=0, atol=atol, equal_nan=True))
                if bad.any():
                    out.append(f"scores.npz {k}: {int(bad.sum())} of {x.size} values differ, "
                               f"max |a - b| {float(np.abs(x - y)[bad].max()):.3g}")
            elif not np.array_equal(x, y):
                out.append(f"scores.npz {k}: {int((x != y).sum())} of {x.size} values differ")
    return len(keys)


__all__ = ["COMPARED", "Diff", "Recorded", "ReproducibilityWarning", "check_data", "diff_runs",
           "environment_differences", "read_recorded", "reproduce"]
