"""HELM runs as confidence-only records (`uqbench.io.confidence`).

A HELM run folder (``benchmark_output/runs/<suite>/<run name>/``, written by
``helm.benchmark.runner.Runner.run_one``) holds, among others:

``per_instance_stats.json``
    a JSON list of ``PerInstanceStats`` (``helm.benchmark.metrics.metric``):
    ``{"instance_id", "train_trial_index", "perturbation" (absent for the original
    instance), "stats": [Stat]}``, each ``Stat`` (``helm.benchmark.metrics.statistic``)
    ``{"name": {"name", "split", ...}, "count", "sum", ..., "mean", ...}`` (``None`` fields
    omitted: ``asdict_without_nones``). uqbench reads two stats per instance: ``max_prob``,
    the model's probability of its answer (multiple-choice ``separate`` adapters: the max of
    the softmax over the choices' scores; generation: ``exp`` of the top completion's
    log-probability), and ``exact_match``, cast to an int as HELM's own calibration metrics do
    (``compute_calibration_metrics``: a tie among argmax references scored 1/k counts as 0).
``scenario_state.json``
    ``{"adapter_spec": {"model", "method", ...}, "request_states": [{"instance": {"id",
    "split", "references": [...], ...}, "train_trial_index", ...}]}``: the model's name, and
    each instance's option count (its references, for multiple-choice adapters).

Only the original instances (no ``perturbation``) of trial 0 are read; other trials and
perturbations are counted in run.json. A domain pairs HELM runs as ``--domain`` pairs lm-eval
tasks: ``{id: RUN, shift: RUN, calib: RUN}`` in ``--domains FILE.yaml`` (HELM's run names hold
colons, which ``--domain NAME=ID:SHIFT`` cannot), each RUN a folder under the source. Every
file is checked before any output is written (`UserError` naming the file and entry).
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from uqbench.core.errors import ConfigError, UserError
from uqbench.io.confidence import Row, check_row, record_set
from uqbench.io.lmeval import DomainTasks
from uqbench.io.recordset import RecordSet

STATS, STATE = "per_instance_stats.json", "scenario_state.json"
#: HELM's adapters whose references are the choices (their count gives the chance rows)
MULTIPLE_CHOICE = ("multiple_choice_joint", "multiple_choice_separate_original",
                   "multiple_choice_separate_calibrated", "multiple_choice_joint_chain_of_thought")


def is_helm(source: Path) -> bool:
    """Whether ``source`` is a folder of HELM runs (a subfolder holds
    ``per_instance_stats.json``)."""
    return source.is_dir() and any((d / STATS).is_file() for d in source.iterdir() if d.is_dir())


def _load(path: Path, kind: type) -> Any:
    if not path.is_file():
        raise UserError(f"{path} not found: a HELM run folder holds {STATS} and {STATE} "
                        "(helm-run writes them under benchmark_output/runs/<suite>/<run>)")
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); copy the run folder again") from None
    if not isinstance(data, kind):
        raise UserError(f"{path}: expected a JSON {kind.__name__} (HELM's schema), got "
                        f"{type(data).__name__}: is this a HELM run folder?")
    return data


def _instances(path: Path) -> tuple[str | None, str, dict[str, int]]:
    """(model, adapter method, option count of each instance id) of a scenario_state.json."""
    state = _load(path, dict)
    spec, states = state.get("adapter_spec"), state.get("request_states")
    if not isinstance(spec, dict) or not isinstance(states, list):
        raise UserError(f"{path}: lacks adapter_spec or request_states (HELM's ScenarioState); "
                        "is it a scenario_state.json of a finished helm-run?")
    refs: dict[str, int] = {}
    for i, rs in enumerate(states):
        inst = rs.get("instance") if isinstance(rs, dict) else None
        if not isinstance(inst, dict) or "id" not in inst:
            raise UserError(f"{path}: request_states[{i}] has no instance with an id")
        if "perturbation" not in inst:
            refs[str(inst["id"])] = len(inst.get("references") or [])
    return spec.get("model"), str(spec.get("method", "")), refs


def _stat(stats: list[Any], name: str) -> float | None:
    for s in stats:
        if isinstance(s, dict) and isinstance(s.get("name"), dict) \
                and s["name"].get("name") == name and "perturbation" not in s["name"]:
            return s.get("mean")  # type: ignore[no-any-return]
    return None


def read_run(folder: Path, domain: str, role: str, counts: dict[str, int]
             ) -> tuple[str | None, Iterator[tuple[str, Row]]]:
    """(model, the rows of one HELM run folder as ``role`` questions of ``domain``);
    ``counts`` gains the instances not read (other trials, perturbations)."""
    model, method, n_refs = _instances(folder / STATE)
    entries = _load(folder / STATS, list)

    def rows() -> Iterator[tuple[str, Row]]:
        path = folder / STATS
        for i, e in enumerate(entries):
            where = f"{path} entry {i}"
            if not isinstance(e, dict) or "instance_id" not in e or \
                    not isinstance(e.get("stats"), list):
                raise UserError(f"{where}: expected {{instance_id, train_trial_index, stats}} "
                                "(HELM's PerInstanceStats); is this a per_instance_stats.json?")
            if e.get("perturbation") is not None or e.get("train_trial_index", 0) != 0:
                key = "perturbed" if e.get("perturbation") is not None else "other_trials"
                counts[key] = counts.get(key, 0) + 1
                continue
            iid = str(e["instance_id"])
            if iid not in n_refs:
                raise UserError(f"{where}: instance {iid!r} is not in {folder / STATE}; the two "
                                "files come from different runs")
            conf, em = _stat(e["stats"], "max_prob"), _stat(e["stats"], "exact_match")
            if conf is None or em is None:
                raise UserError(f"{where}: instance {iid!r} has no "
                                f"{'max_prob' if conf is None else 'exact_match'} stat; HELM "
                                "computes max_prob for multiple-choice adapters and for "
                                "generation with log-probabilities: rerun helm-run with a "
                                "model that returns them")
            n = n_refs[iid] if method in MULTIPLE_CHOICE and n_refs[iid] >= 2 else None
            yield where, check_row(where, {
                "id": f"{folder.name}/{iid}", "domain": domain, "split": role,
                "confidence": conf, "correct": int(em), "model": model, "n_choices": n})

    return model, rows()


def read_helm(domains: Sequence[DomainTasks], source: Path, *, model_name: str | None = None,
              calib_fraction: float = 0.2, seed: int = 0) -> RecordSet:
    """The `RecordSet` of HELM runs under ``source`` (module docstring): each domain's ID,
    shifted and (optional) calib run; without a calib run a seeded fraction of the ID
    questions is held out."""
    if not domains:
        raise ConfigError("give the HELM runs of each domain: --domains FILE.yaml with "
                          "domains: {NAME: {id: RUN, shift: RUN, calib: RUN (optional)}}")
    if len({d.name for d in domains}) < len(domains):
        raise ConfigError("two domains share a name")
    counts: dict[str, int] = {}
    models: dict[str | None, str] = {}
    rows: list[tuple[str, Row]] = []
    runs = {}
    for d in domains:
        for role, run in (("id", d.id), ("shift", d.shift), ("calib", d.calib)):
            if run is None:
                continue
            folder = source / run
            if not (folder / STATS).is_file():
                have = sorted(p.name for p in source.iterdir() if (p / STATS).is_file())
                raise UserError(f"{folder}: no HELM run {run!r} under {source} (runs: "
                                f"{', '.join(have[:8])}{' ...' if len(have) > 8 else ''})")
            model, got = read_run(folder, d.name, role, counts)
            models.setdefault(model, str(folder))
            rows += got
            runs[f"{d.name}/{role}"] = str(folder)
    if len(models) > 1:
        raise UserError("mixed models: " + "; ".join(f"{m!r} in {f}" for m, f in models.items())
                        + "; score one model's runs at a time")
    if counts:
        warnings.warn(f"HELM: read the original instances of trial 0 only; not read: {counts}",
                      stacklevel=2)
    return record_set(rows, source=str(source), model_name=model_name,
                      calib_fraction=calib_fraction, seed=seed,
                      meta={"format": "helm", "runs": runs, "not_read": counts})


__all__ = ["is_helm", "read_helm", "read_run"]
