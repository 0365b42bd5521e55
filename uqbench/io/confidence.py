"""Confidence-only records: a confidence and a correctness per question, as `RecordSet`.

Some results carry no distribution over the choices: HELM's per-instance ``max_prob`` and
``exact_match`` (`uqbench.io.helm`), LM-Polygraph's saved estimations, an API model's verbalised
or sampled confidence. They still give every column that reads only a confidence, an uncertainty
and a correctness: ECE and its variants, the binary Brier of the confidence (``brier_conf``), its
recalibration on the calib split (temperature scaling in netcal's binary form, histogram
binning, isotonic), AURC/E-AURC/AUGRC, selective accuracy, OOD-AUROC and selective risk control.
The columns that need the distribution over choices (``brier``, ``nll``, the conformal sets) are
listed in run.json ``skipped_columns`` (`uqbench.results.columns.skipped_columns`), and the
scorers that read logits in ``skipped_scorers``; the one method is `ReportedConfidence`
(uncertainty ``1 - confidence``).

File format (one file; ``.jsonl``: one JSON object per line, ``.csv``: a header line), one
question per line:

``id``          the question's id, unique in the file
``domain``      its domain (a row of the table)
``split``       ``id`` (in-distribution test), ``shift`` (shifted test) or ``calib`` (labelled
                questions for recalibration and risk control)
``confidence``  the model's confidence in its answer, a number in [0, 1]
``correct``     1 if that answer was right, else 0 (``true``/``false`` too)
``model``       optional: the model's name (one model per file)
``n_choices``   optional: the question's option count (on every line or none: it gives the
                ``chance`` reference rows)

Every domain needs ``id`` and ``shift`` rows; one without ``calib`` rows has a seeded fraction
of its ``id`` questions held out as calib (their ids in run.json). Lines are read one at a time;
anything malformed is a `UserError` naming the file, the line and the fix, raised before any
output is written.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from uqbench.core.errors import ConfigError, UserError
from uqbench.core.outputs import Outputs
from uqbench.core.plan import GateSpec, ModelSpec, Pair
from uqbench.core.scorer import Scorer
from uqbench.io.lmeval import model_label
from uqbench.io.recordset import ROLES, RecordSet
from uqbench.results.references import ReferenceInputs

COLUMNS = ("id", "domain", "split", "confidence", "correct")
OPTIONAL = ("model", "n_choices")
SUFFIXES = (".jsonl", ".csv")


class ReportedConfidence(Scorer):
    """The confidence the records report: ``u = 1 - confidence``, calibrated as given. Not
    registered: no forward pass produces ``confidence``/``correct``, so `uqbench run` never
    offers it; `uqbench.run.score_records.plan_methods` adds it for records that hold them."""

    name = "reported"
    requires = frozenset({"confidence", "correct"})

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        return 1.0 - np.asarray(outputs.confidence, np.float64)

    def confidence(self, outputs: Outputs) -> NDArray[np.float64]:
        return np.asarray(outputs.confidence, np.float64)


@dataclass(frozen=True)
class Row:
    """One question of a confidence-only source."""

    id: str
    domain: str
    split: str
    confidence: float
    correct: float
    model: str | None = None
    n_choices: int | None = None


def _fail(where: str, what: str, fix: str) -> UserError:
    return UserError(f"{where}: {what}; {fix}")


def check_row(where: str, d: Mapping[str, Any]) -> Row:
    """The `Row` of one record ``d`` (a JSON object or a CSV line), every value checked;
    ``where`` names the file and line for the error."""
    if not isinstance(d, Mapping):
        raise _fail(where, f"expected an object with {', '.join(COLUMNS)}, got "
                    f"{type(d).__name__}", "write one JSON object per line")
    missing = [c for c in COLUMNS if d.get(c) in (None, "")]
    if missing:
        raise _fail(where, f"missing {', '.join(missing)}",
                    f"every line needs {', '.join(COLUMNS)} (optional: {', '.join(OPTIONAL)})")
    split = str(d["split"]).strip()
    if split not in ROLES:
        raise _fail(where, f"split {split!r} is not one of {', '.join(ROLES)}",
                    "mark in-distribution test questions id, shifted ones shift and labelled "
                    "recalibration questions calib")
    try:
        conf = float(d["confidence"])
    except (TypeError, ValueError):
        raise _fail(where, f"confidence {d['confidence']!r} is not a number",
                    "give the model's confidence in its answer in [0, 1]") from None
    if not math.isfinite(conf):
        raise _fail(where, f"confidence is {conf}", "drop the question or give a number in "
                    "[0, 1] (a failed request has no confidence)")
    if not 0.0 <= conf <= 1.0:
        raise _fail(where, f"confidence {conf!r} is outside [0, 1]", "give a probability (a "
                    "log-probability l becomes exp(l); a percentage p becomes p/100)")
    correct = {"1": 1.0, "0": 0.0, "true": 1.0, "false": 0.0, "1.0": 1.0, "0.0": 0.0}.get(
        str(d["correct"]).strip().lower())
    if correct is None:
        raise _fail(where, f"correct {d['correct']!r} is not 0 or 1", "give 1 where the answer "
                    "was right and 0 where it was wrong")
    n_choices = d.get("n_choices")
    if n_choices not in (None, ""):
        try:
            n_choices = int(n_choices)
        except (TypeError, ValueError):
            n_choices = 0
        if n_choices < 2:
            raise _fail(where, f"n_choices {d['n_choices']!r} is not a count >= 2",
                        "give the question's option count, or leave it out everywhere")
    model = d.get("model")
    return Row(str(d["id"]), str(d["domain"]), split, conf, correct,
               None if model in (None, "") else str(model),
               None if n_choices in (None, "") else int(n_choices))


def _lines(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) of each line of a ``.jsonl`` or ``.csv`` file, read one at a time."""
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{i}", json.loads(line)
                except ValueError as exc:
                    raise _fail(f"{path}:{i}", f"not JSON ({exc})",
                                "write one JSON object per line (JSON Lines)") from None
    else:
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise _fail(f"{path}:1", f"the header lacks {', '.join(missing)} (it has "
                            f"{', '.join(header) or 'nothing'})",
                            f"the first line names the columns {', '.join(COLUMNS)}")
            for i, d in enumerate(reader, 2):
                yield f"{path}:{i}", d


def read_rows(path: Path) -> list[tuple[str, Row]]:
    """Every `Row` of a confidence-only file, with where it is."""
    if path.suffix not in SUFFIXES:
        raise ConfigError(f"{path}: confidence-only records are .jsonl or .csv files, not "
                          f"{path.suffix or 'a file without suffix'}")
    if not path.is_file():
        raise UserError(f"{path} not found")
    return [(where, check_row(where, d)) for where, d in _lines(path)]


def record_set(rows: Iterable[tuple[str, Row]], *, source: str, model_name: str | None = None,
               calib_fraction: float = 0.2, seed: int = 0,
               meta: Mapping[str, Any] | None = None) -> RecordSet:
    """The `RecordSet` of checked rows (``(where, Row)``): one confidence-only `Outputs` per
    domain and split, one pair ``<model>/reported``. A domain without calib rows has a seeded
    ``calib_fraction`` of its ID rows held out (as `uqbench.io.lmeval` does)."""
    seen: dict[str, str] = {}
    by: dict[tuple[str, str], list[Row]] = {}
    models: dict[str, str] = {}
    counted = []
    for where, r in rows:
        if r.id in seen:
            raise _fail(where, f"id {r.id!r} already on {seen[r.id]}",
                        "give every question its own id (prefix ids of different tasks)")
        seen[r.id] = where
        if r.model is not None:
            models.setdefault(r.model, where)
        counted.append(r.n_choices is not None)
        by.setdefault((r.domain, r.split), []).append(r)
    if not seen:
        raise UserError(f"{source}: no questions; it needs lines with {', '.join(COLUMNS)}")
    if len(models) > 1:
        (a, wa), (b, wb) = list(models.items())[:2]
        raise UserError(f"{source}: mixed models ({a!r} on {wa}, {b!r} on {wb}); score one "
                        "model per file")
    if any(counted) and not all(counted):
        raise UserError(f"{source}: n_choices is given on some lines only; give it on every "
                        "line or on none")
    domains = list(dict.fromkeys(d for d, _ in by))
    for d in domains:
        lack = [r for r in ("id", "shift") if (d, r) not in by]
        if lack:
            raise UserError(f"{source}: domain {d!r} has no {' and no '.join(lack)} rows; every "
                            "domain needs in-distribution (split id) and shifted (split shift) "
                            "questions")
    held_out: dict[str, list[str]] = {}
    for d in domains:
        if (d, "calib") in by:
            continue
        if not 0 < calib_fraction < 1:
            raise ConfigError(f"--calib-fraction {calib_fraction}: give a fraction in (0, 1) of "
                              "the ID questions to hold out for recalibration")
        ids = by[d, "id"]
        n_cal = round(calib_fraction * len(ids))
        if not 1 <= n_cal < len(ids):
            raise UserError(f"{source}: domain {d!r} has {len(ids)} id rows and no calib rows: "
                            f"too few to hold out {calib_fraction:g} of them; add split calib "
                            "rows")
        perm = np.random.default_rng(seed).permutation(len(ids))
        cal = set(perm[:n_cal].tolist())
        by[d, "calib"] = [r for i, r in enumerate(ids) if i in cal]
        by[d, "id"] = [r for i, r in enumerate(ids) if i not in cal]
        held_out[d] = [r.id for r in by[d, "calib"]]
    model = model_name or model_label(next(iter(models), None), None, Path(Path(source).stem))
    pair = Pair(ModelSpec(model, "confidence-only"), GateSpec("reported", "none"),
                frozenset({"ids", "domain", "confidence", "correct"}))
    outputs, n_choices, hashes = {}, {}, {}
    for d in domains:
        for role in ROLES:
            part = by[d, role]
            split = f"{d}/{role}"
            outputs[pair.name, split, 0] = Outputs(
                ids=np.array([r.id for r in part]), labels=None, logits=None,
                domain=np.array([d] * len(part)),
                confidence=np.array([r.confidence for r in part]),
                correct=np.array([r.correct for r in part]))
            hashes[split] = hashlib.sha256(json.dumps(  # the questions, not one model's answers
                [(r.id, r.n_choices) for r in part]).encode()).hexdigest()[:16]
            if all(counted) and role != "calib":
                n_choices[split] = np.array([r.n_choices for r in part], dtype=np.int64)
    info = {"source": source, "model": model, "questions": len(seen),
            "calib_held_out": {"fraction": calib_fraction, "seed": seed, "ids": held_out}
            if held_out else None, **(meta or {})}
    for d, cal_ids in held_out.items():
        print(f"{d}: no calib rows; held out {len(cal_ids)} of its id questions "
              f"(fraction {calib_fraction:g}, seed {seed}) for recalibration", flush=True)
    refs = ReferenceInputs(tuple(domains), n_choices, None, hashes)
    return RecordSet([pair], outputs, 1, refs, 1000, None,
                     {"source": "confidence-only records", "confidence": info})


def read_confidence(path: Path, *, model_name: str | None = None, calib_fraction: float = 0.2,
                    seed: int = 0) -> RecordSet:
    """The `RecordSet` of a confidence-only ``.jsonl``/``.csv`` file (module docstring)."""
    return record_set(read_rows(Path(path)), source=str(path), model_name=model_name,
                      calib_fraction=calib_fraction, seed=seed,
                      meta={"format": Path(path).suffix[1:]})


__all__ = ["COLUMNS", "OPTIONAL", "ReportedConfidence", "Row", "check_row", "read_confidence",
           "read_rows", "record_set"]
