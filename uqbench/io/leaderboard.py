"""Open LLM Leaderboard details as `uqbench score` sources, and parquet samples files.

**v2** (June 2024 on): the details datasets ``open-llm-leaderboard/<org>__<model>-details`` hold
lm-eval's own samples, written by its ``EvaluationTracker`` (``<org>__<model>/samples_leaderboard_
<task>_<date>.jsonl``, task names ``leaderboard_*``): `uqbench.io.lmeval` reads them as any
lm-eval run, and a ``.parquet`` copy of them (the same columns: ``arguments`` a struct of
``gen_args_i`` structs, absent choices null) through `parquet_rows`.

**v1** (2023 to June 2024): the datasets ``open-llm-leaderboard-old/details_<org>__<model>``
hold one parquet file per task and run, ``<date>/details_harness|<task>|<n-shot>_<date>.parquet``
(the dataset card's config name: ``harness_<task>_<n-shot>``, every ``|``, ``:`` and ``-`` an
``_``). One row per question:

    ``choices``      the choice texts (list of str)
    ``predictions``  each choice's log-likelihood (list of float; lighteval's writer, from 2024:
                     ``[log-likelihood, is_greedy]`` per choice)
    ``gold``         the gold choice's index (int; lighteval's: ``gold_index``, a list of one,
                     its ``gold`` being the gold text)
    ``acc``, ``acc_norm``  the harness's per-question correctness, 0/1 (lighteval's: inside the
                     struct column ``metrics``)
    ``example``      the question (its hash identifies the question; also ``full_prompt``,
                     ``input_tokens``, ... which are not read)

``acc`` is the first argmax of the log-likelihoods, ``acc_norm`` that of each divided by its
choice's length in characters, ``len(choice)`` of the text in ``choices``: uqbench's
``--normalize none``/``chars``. A question's id is ``<task>/<row>``, the row counted from 0. Only
the columns named here are read, row group by row group. Both metrics are recomputed and must
equal the file's on every row, as `uqbench.io.lmeval` does for lm-eval's samples.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from uqbench.io.samples import DATE, NORMALIZE, Parsed, check_lls, fail, logged_metrics

#: a v1 details file: ``details_<task>_<date>.parquet``, task e.g. ``harness|arc:challenge|25``
V1_FILE = re.compile(rf"details_(?P<task>.+)_(?P<date>{DATE})\.parquet")
V1_FIX = "give the details parquet file as the leaderboard published it"


def v1_task_name(raw: str) -> str:
    """The dataset card's config name of a v1 task: ``harness|arc:challenge|25`` ->
    ``harness_arc_challenge_25`` (what ``--domain`` takes, its ``:`` being the separator)."""
    return re.sub(r"[|:-]", "_", raw)


def parquet_rows(path: Path, required: Sequence[str | tuple[str, ...]],
                 optional: Sequence[str] = (), fallback: Mapping[str, str] | None = None
                 ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row, values) of each row of a parquet file (rows counted from 0), reading only the
    columns asked for, one row group at a time. Each ``required`` entry is a column or a tuple
    of alternatives (the first present is read); ``optional`` columns are read where present,
    and ``fallback[c]`` where ``c`` is absent. A file that is not parquet or lacks a required
    column is refused, naming what it has, before any row is yielded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise fail(path, None, f"not a readable parquet file ({exc})", V1_FIX) from None
    have = pf.schema_arrow.names
    cols: list[str] = []
    missing: list[str] = []
    for want in required:
        alts = (want,) if isinstance(want, str) else want
        col = next((c for c in alts if c in have), None)
        (cols if col else missing).append(col or " or ".join(alts))
    if missing:
        raise fail(path, None, f"no column {', '.join(missing)} (its columns: "
                   f"{', '.join(have)})", "give a file of the published schema (see "
                   "docs/scoring-elsewhere.md)")
    cols += [c for c in optional if c in have]
    cols += [f for c, f in (fallback or {}).items() if c not in have and f in have]
    cols = list(dict.fromkeys(cols))

    def rows() -> Iterator[tuple[int, dict[str, Any]]]:
        row = 0
        for g in range(pf.num_row_groups):
            for values in pf.read_row_group(g, columns=cols).to_pylist():
                yield row, values
                row += 1

    return rows()


def _v1_sample(path: Path, row: int, d: Mapping[str, Any]) -> Parsed:
    at = f"row {row}"
    choices, preds = d["choices"], d["predictions"]
    if not (isinstance(choices, list) and all(isinstance(c, str) for c in choices)):
        raise fail(path, at, f"`choices` is {choices!r:.80}, not a list of texts", V1_FIX)
    if not isinstance(preds, list):
        raise fail(path, at, f"`predictions` is {preds!r:.80}, not one log-likelihood per "
                   "choice (text here means a generative task, which uqbench does not score)",
                   V1_FIX)
    try:  # lighteval logs [log-likelihood, is_greedy] per choice
        lls = [float(p[0] if isinstance(p, list) else p) for p in preds]
    except (TypeError, ValueError, IndexError):
        raise fail(path, at, f"`predictions` {preds!r:.80} holds something other than "
                   "log-likelihoods", V1_FIX) from None
    if len(lls) != len(choices):
        raise fail(path, at, f"{len(lls)} predictions for {len(choices)} choices", V1_FIX)
    check_lls(path, at, lls, row)
    gold = d["gold_index"] if "gold_index" in d else d["gold"]
    if isinstance(gold, list):
        if len(gold) != 1:
            raise fail(path, at, f"{len(gold)} gold indices {gold}: several gold answers are "
                       "not supported", "score a task with one gold choice per question")
        gold = gold[0]
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(lls):
        raise fail(path, at, f"gold {gold!r} is not an index among the {len(lls)} choices",
                   V1_FIX)
    nested = d.get("metrics")
    metrics: Mapping[str, Any] = nested if isinstance(nested, dict) else d
    logged = logged_metrics(path, at, {k: metrics.get(k) for k in NORMALIZE.values()})
    if not logged:
        raise fail(path, at, "neither `acc` nor `acc_norm` is logged, so the gold index cannot "
                   "be verified", "uqbench refuses labels it cannot verify; " + V1_FIX)
    doc_hash = hashlib.sha256(str(d.get("example")).encode()).hexdigest()
    return row, gold, lls, choices, doc_hash, False, logged


def details_v1_rows(path: Path) -> Iterator[tuple[int, Parsed]]:
    """(row, parsed sample) of each row of a leaderboard v1 details file (module docstring)."""
    for row, d in parquet_rows(path, ("choices", "predictions", ("gold_index", "gold"),
                                      ("acc", "acc_norm", "metrics")),
                               ("acc", "acc_norm", "example")):
        yield row, _v1_sample(path, row, d)


__all__ = ["V1_FILE", "details_v1_rows", "parquet_rows", "v1_task_name"]
