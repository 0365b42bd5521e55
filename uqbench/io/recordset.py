"""Forward records from anywhere, scored the same way: `RecordSet` and its versioned file format.

A `RecordSet` holds the `Outputs` of every (model/gate pair, split, seed) of a run — made by
``uqbench run``, read back from its export, or made from lm-evaluation-harness samples
(`uqbench.io.lmeval`) — and what the tables need besides them: the domains, the split hashes, the
inputs of the reference rows (`uqbench.results.references.ReferenceInputs`) and, for a uqbench run,
its methods in order. ``uqbench score`` turns any of them into the same run folder
(`uqbench.run.score_records`).

File format ``uqbench-records``, version 1: a folder holding

``manifest.json``
    ``{"format": "uqbench-records", "version": 1, "protocol": P, "domains": [...], "seeds": S,
    "bootstrap": B, "pairs": [{"name", "model", "model_kind", "gate": {name, kind, budget,
    params}, "fields": [...]}], "methods": [{"pair", "scorer", "registered", "params"}] or null,
    "splits": {"science/id": {"hash", "n"}, ...}, "records": [{"pair", "split", "seed",
    "file", "sha256"}], "references": {"file", "sha256", "options_only", "zero_shot"},
    "meta": {...}}``
``records/NNNN.npz``
    one `Outputs` each: ``ids``, ``labels``, ``logits`` (N, C), ``domain`` and every optional
    field it has (``route_entropy`` ... ``n_tokens`` (N,), ``mc_logits`` (T, N, C),
    ``member_logits`` (M, N, C)); float64, ids and domains as unicode arrays; ``features``
    (N, H) float32. Records of role ``train`` (split ``"domain/train"``, only with features)
    are the training questions the feature-space scorers fit on (`uqbench.core.outputs.with_train`,
    applied on read); older records without them still load (those scorers are skipped).
``references.npz``
    ``n_choices|<split>`` (the option count of each ID/shift question) and, when the options-only
    classifier was fitted (a uqbench run), ``options_only|<split>`` (its 0/1 correctness);
    when the run's head answers untrained, ``zero_shot|<split>`` (the frozen backbone's 0/1
    correctness; records without the key have none).

Every file's sha256 is in the manifest and checked on read; a wrong format version, a missing
or altered file is a `UserError` naming it.
"""
from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.core.errors import UserError
from uqbench.core.outputs import OPTIONAL_FIELDS, Outputs, with_train
from uqbench.core.plan import GateSpec, ModelSpec, Pair
from uqbench.files.cache import PROTOCOL_VERSION, atomic_write_text, file_sha256, tmp_name
from uqbench.results.references import ReferenceInputs

FORMAT, VERSION = "uqbench-records", 1
MANIFEST_KEYS = ("protocol", "domains", "seeds", "bootstrap", "pairs", "methods", "splits",
                 "records", "references", "meta")
ROLES = ("id", "shift", "calib")


@dataclass(frozen=True)
class MethodEntry:
    """A method of the run the records came from: pair name, scorer name as shown, the registered
    scorer and its constructor keyword arguments (experiments rename and parametrise scorers)."""

    pair: str
    scorer: str
    registered: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class RecordSet:
    """Every forward record of one run, keyed ``(pair name, "domain/role", seed)``."""

    pairs: list[Pair]
    outputs: dict[tuple[str, str, int], Outputs]
    seeds: int
    refs: ReferenceInputs  # domains, option counts, options-only correctness, split hashes
    bootstrap: int = 1000
    methods: list[MethodEntry] | None = None  # None: score every registered scorer
    meta: dict[str, Any] = field(default_factory=dict)
    protocol: str = PROTOCOL_VERSION  # the forward-record protocol they were made under

    @property
    def domains(self) -> tuple[str, ...]:
        return self.refs.domains

    def check(self) -> None:
        """Every pair has a record of every split of every seed, and the hashes cover them."""
        need = [(p.name, f"{d}/{r}", s) for p in self.pairs for d in self.domains for r in ROLES
                for s in range(self.seeds)
                if r != "shift" or f"{d}/shift" in self.refs.hashes]  # none: no shift task
        missing = [k for k in need if k not in self.outputs]
        if missing:
            raise UserError(f"records incomplete: {len(missing)} of {len(need)} missing, e.g. "
                            f"{missing[0]}; every pair needs the id, shift and calib records of "
                            "every domain and seed")
        for d in self.domains:
            for r in ROLES:
                if f"{d}/{r}" not in self.refs.hashes and (r != "shift" or any(
                        k[1] == f"{d}/shift" for k in self.outputs)):
                    raise UserError(f"records give no hash for split {d}/{r}")


def _pair_json(p: Pair) -> dict[str, Any]:
    return {"name": p.name, "model": p.model.name, "model_kind": p.model.kind,
            "gate": p.gate.describe(), "fields": sorted(p.fields)}


def _pair_of(d: Mapping[str, Any]) -> Pair:
    g = d["gate"]
    return Pair(ModelSpec(d["model"], d["model_kind"]),
                GateSpec(g["name"], g["kind"], g.get("budget"), g.get("params") or {}),
                frozenset(d["fields"]))


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _outputs_arrays(o: Outputs) -> dict[str, np.ndarray]:
    if o.labels is None or o.logits is None:
        raise ValueError("a uqbench-records file holds labels and logits; a confidence-only "
                         "Outputs (logits None) has neither")
    arrays = {"ids": o.ids.astype(str), "labels": o.labels.astype(np.int64), "logits": o.logits,
              "domain": o.domain.astype(str)}
    arrays.update({f: getattr(o, f) for f in OPTIONAL_FIELDS if getattr(o, f) is not None})
    return arrays


def write_record_set(path: str | Path, rs: RecordSet) -> Path:
    """Write ``rs`` as a ``uqbench-records`` folder at ``path``, atomically: the folder appears
    whole or not at all (an existing one is replaced only once the new one is complete)."""
    rs.check()
    path = Path(path)
    with new_folder(path) as tmp:
        (tmp / "records").mkdir()
        entries = []
        for i, ((pair, split, seed), o) in enumerate(rs.outputs.items()):
            rel = f"records/{i:04d}.npz"
            (tmp / rel).write_bytes(_npz_bytes(_outputs_arrays(o)))
            entries.append({"pair": pair, "split": split, "seed": seed, "file": rel,
                            "sha256": file_sha256(tmp / rel)})
        refs = {f"n_choices|{k}": np.asarray(v, dtype=np.int64)
                for k, v in rs.refs.n_choices.items()}
        refs.update({f"options_only|{k}": np.asarray(v, dtype=np.float64)
                     for k, v in (rs.refs.options_only or {}).items()})
        refs.update({f"zero_shot|{k}": np.asarray(v, dtype=np.float64)
                     for k, v in (rs.refs.zero_shot or {}).items()})
        (tmp / "references.npz").write_bytes(_npz_bytes(refs))
        first = {split: o for (_, split, s), o in rs.outputs.items() if s == 0}
        manifest = {
            "format": FORMAT, "version": VERSION, "protocol": rs.protocol,
            "domains": list(rs.domains),
            "seeds": rs.seeds, "bootstrap": rs.bootstrap,
            "pairs": [_pair_json(p) for p in rs.pairs],
            "methods": None if rs.methods is None else [
                {"pair": m.pair, "scorer": m.scorer, "registered": m.registered,
                 "params": dict(m.params)} for m in rs.methods],
            "splits": {k: {"hash": h, "n": first[k].n if k in first else None}
                       for k, h in rs.refs.hashes.items()},
            "records": entries,
            "references": {"file": "references.npz",
                           "sha256": file_sha256(tmp / "references.npz"),
                           "options_only": rs.refs.options_only is not None,
                           "zero_shot": rs.refs.zero_shot is not None},
            "meta": rs.meta,
        }
        atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=1, default=str))
    return path


@contextmanager
def new_folder(path: Path) -> Iterator[Path]:
    """A temporary folder beside ``path`` to fill in the block; when the block ends it becomes
    ``path`` (`publish_dir`), and if the block raises it is removed: ``path`` is never seen
    half-written."""
    tmp = tmp_name(path)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        publish_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_dir(tmp: Path, path: Path) -> None:
    """Move the finished folder ``tmp`` to ``path``, replacing what is there only after the new
    folder is in place under a neighbouring name (a crash leaves the old or the new one)."""
    old = None
    if path.exists():
        old = tmp_name(path)
        os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        if old is not None:
            os.rename(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _load(path: Path, rel: str, digest: str) -> dict[str, np.ndarray]:
    f = path / rel
    if not f.is_file():
        raise UserError(f"{f} is missing; the records folder {path} is incomplete: export the "
                        "run again (uqbench export RUN_DIR DEST)")
    if file_sha256(f) != digest:
        raise UserError(f"{f} does not match the sha256 in {path / 'manifest.json'}: the file "
                        "was altered or truncated; export the run again")
    with np.load(f, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of a ``uqbench-records`` folder, its format and version checked."""
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.is_file():
        raise UserError(f"{mf} not found: {path} is not a uqbench records folder (written by "
                        "uqbench run into RUN_DIR/records, or by uqbench export)")
    try:
        manifest = json.loads(mf.read_text())
    except ValueError as exc:
        raise UserError(f"{mf} is not valid JSON ({exc}); export the run again") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise UserError(f"{mf}: format {manifest.get('format')!r} version "
                        f"{manifest.get('version')!r}; this uqbench reads {FORMAT!r} version "
                        f"{VERSION}: export the run again with this version of uqbench")
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise UserError(f"{mf} lacks {', '.join(missing)}: written by an unfinished version of "
                        "uqbench; export the run again")
    return manifest  # type: ignore[no-any-return]


def read_record_set(path: str | Path) -> RecordSet:
    """Read a ``uqbench-records`` folder, checking its format version and every file's hash."""
    path = Path(path)
    m = read_manifest(path)
    outputs: dict[tuple[str, str, int], Outputs] = {}
    for e in m["records"]:
        a: dict[str, Any] = _load(path, e["file"], e["sha256"])  # checked by Outputs
        try:
            outputs[e["pair"], e["split"], int(e["seed"])] = Outputs(**a)
        except (TypeError, ValueError) as exc:
            raise UserError(f"{path / e['file']}: not a valid record ({exc})") from None
    ref = m["references"]
    r = _load(path, ref["file"], ref["sha256"])

    def table(prefix: str) -> dict[str, np.ndarray]:
        return {k.split("|", 1)[1]: v for k, v in r.items() if k.startswith(prefix + "|")}

    refs = ReferenceInputs(tuple(m["domains"]), table("n_choices"),
                           table("options_only") if ref["options_only"] else None,
                           {k: v["hash"] for k, v in m["splits"].items()},
                           table("zero_shot") if ref.get("zero_shot") else None)
    methods = None if m["methods"] is None else [MethodEntry(**x) for x in m["methods"]]
    rs = RecordSet([_pair_of(p) for p in m["pairs"]], with_train(outputs), int(m["seeds"]), refs,
                   int(m["bootstrap"]), methods, dict(m.get("meta") or {}),
                   str(m["protocol"]))
    rs.check()
    return rs


def export_run(run_dir: str | Path, dest: str | Path) -> Path:
    """Copy a finished run's records (``RUN_DIR/records``) to ``dest``, after checking every
    file against the manifest; ``dest`` must not exist (nothing is replaced)."""
    src, dest = Path(run_dir) / "records", Path(dest)
    if not src.is_dir():
        raise UserError(f"{src} not found: {run_dir} is not a finished uqbench run folder, or an "
                        "older one; rerun `uqbench run` with the same options and --out (a warm "
                        "cache makes that cheap: no model work) to write its records")
    if dest.exists():
        raise UserError(f"{dest} already exists; give a new folder (export never replaces one)")
    read_record_set(src)  # the format version and every file's hash
    with new_folder(dest) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
    return dest


def method_entries(ms: Sequence[Any]) -> list[MethodEntry]:
    """`MethodEntry` of each `uqbench.core.plan.Method`, in order."""
    return [MethodEntry(m.pair.name, m.scorer.name, type(m.scorer).name or m.scorer.name,
                        dict(getattr(m.scorer, "params", {}))) for m in ms]


__all__ = ["FORMAT", "VERSION", "MethodEntry", "RecordSet", "export_run", "method_entries",
           "new_folder", "publish_dir",
           "read_manifest", "read_record_set", "write_record_set"]
