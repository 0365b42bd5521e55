"""lm-evaluation-harness ``--log_samples`` files as uqbench forward records (`RecordSet`).

A samples file ``samples_<task>_<date>.jsonl`` of a multiple-choice task holds one JSON object per
question: ``doc_id``, ``target`` (the gold choice's index, or its text, as a string),
``arguments`` (``{"gen_args_i": {"arg_0": context, "arg_1": delimiter + choice_i}}``, one per
choice) and ``filtered_resps`` (``[[loglik_i, is_greedy_i], ...]``, numbers as strings). uqbench
reads choice i's log-likelihood ``ll_i`` and turns it into the logit

    ``none``  ll_i                              (lm-eval's ``acc``)
    ``chars`` ll_i / len(choice_i)              (``acc_norm``: characters of the choice text)
    ``bytes`` ll_i / len(choice_i.encode())     (``acc_bytes``: its UTF-8 bytes)

so that the predictive distribution is the softmax over the choices and its argmax is lm-eval's
prediction under that normalisation. (lm-eval's samples carry no token counts, so there is no
per-token normalisation.) The label is ``target``; an example's id is ``<task>/<doc_id>``.
Questions of a task may have different numbers of choices (MMLU-Pro: 3 to 10): each row is
padded with `PAD_LOGIT` (probability exactly 0) beyond its own count, which the splits'
``n_choices`` record. Files are read line by line; a task scored with ``acc_mutual_info`` (its
samples hold an unconditional log-likelihood per choice besides the conditional one) is refused.

Labels are verified, never guessed. Each per-sample metric lm-eval logged (``acc``,
``acc_norm``, ``acc_bytes``) is recomputed from the log-likelihoods and the label exactly as
lm-eval 0.4 does (``ConfigurableTask.process_results``: the first argmax of ``ll``,
``ll / len(choice)``, ``ll / len(choice.encode())``) and must equal it on every line. A
``multiple_input`` task (lm-eval's ``winogrande``: one context per choice, one shared
continuation, the gold index from ``doc_to_text``) logs ``target`` = the continuation text, so
its label is what the sample's ``acc`` determines: the argmax if ``acc`` is 1, the other choice
if it is 0 among 2; any other sample is refused. (Its ``acc_norm``/``acc_bytes`` divide by the
contexts' lengths, which the samples do not record: they are listed as not verifiable.)

A *domain* pairs an ID task with a shifted task, and optionally a calibration task; without one,
a seeded fraction of the ID questions is held out as the calib split (disjoint from the ID test
part; their doc ids are recorded in ``run.json``). Files of the same tasks from other models or
seeds (``members``) become ``member_logits`` (member 0 is the main source), for the ensemble
scorers. A folder holding several runs of a task (``--output_path`` accumulates them) gives its
newest, or the one ``runs`` (``--run``) names, and each run's own results file its model. The
same samples are also read from a JSON array (lm-eval <= 0.4.2), a parquet copy and the Open LLM
Leaderboard's details (`_runs`, `uqbench.io.leaderboard`); each sample is parsed and checked by
`uqbench.io.samples`. Anything malformed is a `UserError` naming the file, the line and the fix,
raised before any output is written.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from uqbench.core.errors import ConfigError, UserError
from uqbench.core.outputs import PAD_LOGIT, Outputs
from uqbench.core.plan import DET, GateSpec, ModelSpec, Pair
from uqbench.io.leaderboard import V1_FILE, details_v1_rows, parquet_rows, v1_task_name
from uqbench.io.recordset import RecordSet
from uqbench.io.samples import DATE, NORMALIZE, Parsed, fail, parse_sample
from uqbench.results.references import ReferenceInputs

GATES = {"none": "loglik", "chars": "loglik-per-char", "bytes": "loglik-per-byte"}


@dataclass(frozen=True)
class DomainTasks:
    """One domain: the lm-eval task of its ID split, of its shifted split (None: no shift, as
    ``uqbench score`` without ``--domain`` scores each task alone; the shift columns are then
    absent, `NO_SHIFT` says why), and of its calib split (None: hold out a fraction of the ID
    questions)."""

    name: str
    id: str
    shift: str | None
    calib: str | None = None

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(t for t in (self.id, self.shift, self.calib) if t)

    @staticmethod
    def parse(text: str) -> DomainTasks:
        """``NAME=ID_TASK:SHIFT_TASK[:CALIB_TASK]``, e.g. ``science=arc_easy:arc_challenge``."""
        m = re.fullmatch(r"([^=:\s]+)=([^:\s]+):([^:\s]+)(?::([^:\s]+))?", text.strip())
        if m is None:
            raise ConfigError(f"--domain {text!r}: write NAME=ID_TASK:SHIFT_TASK[:CALIB_TASK], "
                              "e.g. science=arc_easy:arc_challenge")
        return DomainTasks(*m.groups())

    def __post_init__(self) -> None:
        if self.id == self.shift:
            raise ConfigError(f"domain {self.name!r}: the shifted task {self.shift!r} is also its "
                              "ID task, which would score OOD detection of a task against "
                              "itself; give another task as the shift")
        if self.calib is not None and self.calib in (self.id, self.shift):
            raise ConfigError(f"domain {self.name!r}: the calib task {self.calib!r} is also its "
                              f"{'ID' if self.calib == self.id else 'shifted'} task; give "
                              "another task, or none to hold out a fraction of the ID questions")


#: known ID -> shift pairs of lm-eval's task families, as (ID pattern, shift template): ARC-Easy
#: -> ARC-Challenge, each MMLU high-school subject -> its college subject, BBH's logical
#: deduction over three objects -> seven (any prefix or suffix such as ``leaderboard_`` or
#: ``_local`` kept)
KNOWN_PAIRS = ((re.compile(r"(?P<a>.*)arc_easy(?P<b>.*)"), r"\g<a>arc_challenge\g<b>"),
               (re.compile(r"(?P<a>.*)high_school_(?P<b>.*)"), r"\g<a>college_\g<b>"),
               (re.compile(r"(?P<a>.*)three_objects(?P<b>.*)"), r"\g<a>seven_objects\g<b>"))


def task_names(root: Path) -> list[str]:
    """The tasks whose samples lie under ``root`` (samples files and simple_evaluate results)."""
    name = re.compile(rf"samples_(.+)_{DATE}\.(?:jsonl|json|parquet)")
    found = [m[1] for p in root.rglob("samples_*") if (m := name.fullmatch(p.name))] \
        if root.is_dir() else []
    found += [t for p in dump_files(root) for t in dump_index(p)[0]]
    return sorted(set(found))


def known_pairs(tasks: Sequence[str]) -> list[DomainTasks]:
    """The domains `KNOWN_PAIRS` forms of ``tasks`` (each named after its ID task)."""
    have = set(tasks)
    out = []
    for t in tasks:
        for pat, shift in KNOWN_PAIRS:
            if (m := pat.fullmatch(t)) and (s := m.expand(shift)) in have and s != t:
                out.append(DomainTasks(re.sub(r"[=:\s]", "_", t), t, s))
                break
    return out


#: why a domain without a shift task has no shift columns (run.json, the tables, the report)
NO_SHIFT = "no shift task: score with --domain NAME=ID:SHIFT to get them"


def pairs_line(tasks: Sequence[str]) -> str:
    """What `known_pairs` forms of ``tasks``, and how to score them (``--domain auto``)."""
    pairs = known_pairs(tasks)
    if not pairs:
        return ("known ID -> shift pairs: none among these tasks (ARC-Easy -> Challenge, MMLU "
                "high-school -> college subject, BBH logical deduction 3 -> 7 objects); pair "
                "tasks with --domain NAME=ID:SHIFT for the shift columns")
    return ("known ID -> shift pairs: " + " ".join(f"{d.name}={d.id}:{d.shift}" for d in pairs)
            + "; --domain auto scores them with the shift columns")


def alone(root: Path, runs: Sequence[str] = ()
          ) -> tuple[list[DomainTasks], dict[str, str], dict[tuple[Path, str], TaskSamples]]:
    """Without ``--domain``: one shift-less domain per single-answer multiple-choice task under
    ``root`` (named after it), the tasks left out with why (another output type, `NOT_MC`,
    or samples that are not one log-likelihood per choice), and the samples read to tell them
    apart, by file and task (a `simple_evaluate` dump holds several tasks), so that scoring
    does not read them again; prints each left-out task and `pairs_line`."""
    tasks = task_names(root)
    if not tasks:
        raise UserError(f"no samples file under {root}: {_inventory(root)}; run lm-eval with "
                        f"--log_samples --output_path {root}")
    kept, left_out, read = [], {}, {}
    for t in tasks:
        try:
            src = find_source(root, [t], runs, named=True)
            path = src.samples[t]
            read[path, t] = read_task(path, t, src.delimiters.get(t, " "))
        except UserError as exc:
            left_out[t] = str(exc).removesuffix(": drop it from --domain")  # none was given
            print(f"{t}: left out ({left_out[t]})", flush=True)
            continue
        kept.append(t)
    if not kept:
        raise UserError(f"no single-answer multiple-choice task under {root}: "
                        + "; ".join(f"{t}: {why}" for t, why in left_out.items()))
    print(f"no --domain: scoring {', '.join(kept)} each alone (ID, calib held out; "
          f"{NO_SHIFT})", flush=True)
    print(pairs_line(kept), flush=True)
    return [DomainTasks(re.sub(r"[=:\s/]", "_", t), t, None) for t in kept], left_out, read


def domains_from_yaml(path: Path) -> list[DomainTasks]:
    """A YAML ``domains: {NAME: {id: TASK, shift: TASK, calib: TASK (optional)}}``."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text())
        return [DomainTasks(name, d["id"], d["shift"], d.get("calib"))
                for name, d in doc["domains"].items()]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: expected `domains: {{NAME: {{id: TASK, shift: TASK, calib: "
                          f"TASK}}}}` ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class TaskSamples:
    """One task's samples, in file order."""

    task: str
    path: Path
    doc_ids: list[int]
    labels: np.ndarray  # (N,)
    lls: np.ndarray  # (N, C) log-likelihoods, `PAD_LOGIT` beyond a question's own count
    n_choices: np.ndarray  # (N,) each question's own number of choices
    lengths: dict[str, np.ndarray]  # "chars"/"bytes" -> (N, C) choice lengths, 1 beyond it
    lm_eval_metrics: dict[str, np.ndarray]  # lm-eval's own per-example acc/acc_norm/acc_bytes
    content_hash: str
    multiple_input: bool = False  # one context per choice, one shared continuation
    verified: tuple[str, ...] = ()  # lm-eval's metrics recomputed and equal on every line
    not_verifiable: tuple[str, ...] = ()  # logged, but their lengths are not in the file
    unit: str = "line"  # what `lines` count in error messages: "line" (1-based), "row" (0-based)

    def logits(self, normalize: str) -> np.ndarray:
        return self.lls if normalize == "none" else self.lls / self.lengths[normalize]


def _verify(ts: TaskSamples, lines: np.ndarray, delim: str) -> None:
    """Raise unless each metric lm-eval logged equals uqbench's correctness under that metric's
    normalisation, on every sample (lm-eval 0.4 `ConfigurableTask.process_results`)."""
    for normalize, metric in NORMALIZE.items():
        theirs = ts.lm_eval_metrics.get(metric)
        if theirs is None or metric in ts.not_verifiable:
            continue
        pred = ts.logits(normalize).argmax(axis=1)  # empty choices were refused before
        bad = np.flatnonzero((pred == ts.labels) != (theirs == 1))
        if not len(bad):
            continue
        i = int(bad[0])
        cause = ("the `target` is not the gold index lm-eval scored: the file was edited, or "
                 "the task's gold comes from elsewhere than doc_to_target (a custom "
                 "process_results)") if metric == "acc" else (
            f"the choice texts uqbench divides by (each continuation without the target "
            f"delimiter {delim!r}) are not the doc_to_choice texts lm-eval divided by: a chat "
            "template or gen_prefix changed the continuations, or the results file beside the "
            "samples names another target_delimiter")
        raise fail(ts.path, _at(ts.unit, int(lines[i])),
                   f"lm-eval logged {metric}={theirs[i]:g} for doc_id {ts.doc_ids[i]}, but "
                   f"uqbench's prediction under {metric}'s normalisation "
                   f"(--normalize {normalize}) is choice {pred[i]} and its label is "
                   f"{ts.labels[i]}, so {metric} would be {float(pred[i] == ts.labels[i]):g} "
                   f"({len(bad)} of {len(ts.labels)} samples disagree)",
                   f"uqbench refuses labels it cannot verify; likely cause: {cause}")


def _at(unit: str, n: int) -> int | str:
    return n if unit == "line" else f"{unit} {n}"


def _samples(path: Path) -> tuple[str, Iterator[tuple[int, dict[str, Any]]]]:
    """What the samples' numbers count ("line", or "row" of a parquet file) and (number, sample)
    of each sample: JSON lines read line by line, a JSON array (lm-eval <= 0.4.2) element by
    element, a parquet copy row group by row group, only the columns read here."""
    if path.suffix == ".parquet":
        return "row", parquet_rows(path, ("doc_id", "target", "arguments", "filtered_resps"), (
            "doc_hash", *NORMALIZE.values(), "acc_mutual_info"), fallback={"doc_hash": "doc"})
    try:
        f = path.open(encoding="utf-8")
    except OSError as exc:
        raise fail(path, None, f"cannot be read ({exc})", "check the path") from None
    return "line", _json_samples(path, f)


def _json_samples(path: Path, f: TextIO) -> Iterator[tuple[int, dict[str, Any]]]:
    with f:
        first = f.read(1)
        while first.isspace():
            first = f.read(1)
        f.seek(0)
        if first == "[":
            yield from array_items(path, f)
            return
        for i, raw in enumerate(f, 1):
            if raw.isspace():
                continue
            try:
                yield i, loads(raw)
            except ValueError as exc:
                raise fail(path, i, f"not JSON ({exc})", "the file is truncated or not a "
                           "samples file") from None


_RAW_DECODE = json.JSONDecoder().raw_decode


def loads(raw: str) -> Any:
    """``json.loads(raw)``, without its checks around the value where ``raw`` is a JSON object
    and a line end (which they accept): any other text is ``json.loads``'s, its errors too."""
    if raw.startswith("{"):
        try:
            value, end = _RAW_DECODE(raw)
        except ValueError:
            pass
        else:
            if end == len(raw) or raw[end:] == "\n":
                return value
    return json.loads(raw)


_SKIP = re.compile(r"[\s,]*")


def array_items(path: Path, f: TextIO, chunk: int = 1 << 20
                ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line it starts on, element) of each element of a file holding one JSON array, as
    lm-eval <= 0.4.2 wrote samples (``json.dumps(samples, indent=2)``), decoded one element at
    a time from chunks of the file (memory: the largest element, not the file)."""
    decoder = json.JSONDecoder()
    buf, pos, line, opened = "", 0, 1, False
    while True:
        skip = _SKIP.match(buf, pos)
        assert skip is not None  # [\s,]* matches the empty string too
        end = skip.end()
        line, pos = line + buf.count("\n", pos, end), end
        if pos < len(buf) and not opened:
            if buf[pos] != "[":
                raise fail(path, line, "not a JSON array of samples", "give the samples file "
                           "lm-eval wrote")
            opened, pos = True, pos + 1
            continue
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            if pos == len(buf):
                raise ValueError("more")
            item, end = decoder.raw_decode(buf, pos)
        except ValueError as exc:  # an element cut by the chunk's end, or bad JSON
            more = f.read(max(chunk, len(buf)))  # doubling: linear time for any element size
            if not more:
                raise fail(path, line, f"not JSON ({exc})" if pos < len(buf) else
                           "the array ends without its closing ]", "the file is truncated "
                           "or not a samples file") from None
            buf, pos = buf[pos:] + more, 0
            continue
        yield line, item
        line, pos = line + buf.count("\n", pos, end), end


def _padded(flat: array[float], n_choices: np.ndarray, fill: float) -> np.ndarray:
    """The per-question values of ``flat`` (questions one after another) as (N, max C), each
    row padded with ``fill`` beyond its own choice count."""
    out = np.full((len(n_choices), int(n_choices.max())), fill)
    out[np.arange(out.shape[1]) < n_choices[:, None]] = np.frombuffer(flat, dtype=np.float64)
    return out


#: one parsed sample: (doc_id, label, log-likelihoods, choice texts, the doc's hash,
#: multiple_input, the file's own per-sample metrics)



def read_task(path: Path, task: str, delim: str = " ") -> TaskSamples:
    """Read and validate one samples file, sample by sample (every sample before anything is
    returned), its labels verified against lm-eval's own per-sample metrics (the module
    docstring). Questions may have different numbers of choices: each row is padded with
    `PAD_LOGIT` (probability 0) beyond its own count, ``n_choices``. An Open LLM Leaderboard v1
    details file (``details_*.parquet``) is read by `uqbench.io.leaderboard.details_v1_rows`."""
    if path.name.startswith("details_") and path.suffix == ".parquet":
        return collect(path, task, "row", details_v1_rows(path), delim)
    dumped = read_dump(path) if path.suffix == ".json" and _sniff_dump(path) else None
    if dumped is not None:
        unit = f"samples[{task!r}] element"
        samples: Iterable[tuple[int, Any]] = enumerate(dumped["samples"].get(task) or [])
    else:
        unit, samples = _samples(path)

    def parsed() -> Iterator[tuple[int, Parsed]]:
        for i, d in samples:
            if not isinstance(d, dict):
                raise fail(path, _at(unit, i), f"a {type(d).__name__}, not a sample object",
                           "give the samples file lm-eval wrote")
            yield i, parse_sample(path, _at(unit, i), d, delim)

    return collect(path, task, unit, parsed(), delim)


#: how many samples `collect` hashes at once (memory: a block's rows and their JSON text)
HASH_BLOCK = 1 << 12


def _hash_rows(content: Any, rows: list[tuple[int, int, str]], sep: bytes) -> bytes:
    """Add ``rows`` (then emptied) to ``content``, the hash of ``json.dumps`` of every sample's
    ``[doc_id, label, doc hash]``: their part of that text, ``sep`` before it (nothing before
    the first sample); returns what comes before the next rows."""
    if not rows:
        return sep
    content.update(sep + json.dumps(rows)[1:-1].encode())
    rows.clear()
    return b", "


def collect(path: Path, task: str, unit: str, samples: Iterable[tuple[int, Parsed]],
            delim: str = " ") -> TaskSamples:
    """The `TaskSamples` of one file's parsed samples (``unit`` numbered), its labels verified
    against the file's own per-sample metrics; a repeated doc_id is refused."""
    doc_ids, labels, lines, n_choices = (array("q") for _ in range(4))
    lls, chars, nbytes = array("d"), array("d"), array("d")
    metrics = {k: array("d") for k in NORMALIZE.values()}
    acc, acc_norm, acc_bytes = metrics.values()
    content = hashlib.sha256(b"[")  # of json.dumps([[doc_id, label, doc hash], ...])
    rows: list[tuple[int, int, str]] = []  # the samples not hashed yet, hashed a block at a time
    sep = b""  # what comes before the next block in the hashed text
    first: tuple[int, bool] | None = None  # the first sample's line and multiple_input
    for i, (doc_id, label, ll, choices, h, multi, sample_metrics) in samples:
        if first is None:
            first = (i, multi)
        elif multi != first[1]:
            raise fail(path, _at(unit, i), f"{'one context per choice' if multi else 'one context'}"
                       f" where {unit} {first[0]} has "
                       f"{'one context' if multi else 'one per choice'}",
                       "give the samples file of one task as lm-eval wrote it")
        if "" in choices:
            raise fail(path, _at(unit, i), "an empty choice text", "length normalisation "
                       "divides by it; use --normalize none")
        rows.append((doc_id, label, h))
        if len(rows) == HASH_BLOCK:
            sep = _hash_rows(content, rows, sep)
        doc_ids.append(doc_id)
        labels.append(label)
        lines.append(i)
        n_choices.append(len(ll))
        lls.extend(ll)
        chars.extend(map(len, choices))
        nbytes.extend(map(len, map(str.encode, choices)))
        acc.append(sample_metrics.get("acc", math.nan))
        acc_norm.append(sample_metrics.get("acc_norm", math.nan))
        acc_bytes.append(sample_metrics.get("acc_bytes", math.nan))
    if first is None:
        raise fail(path, None, "holds no samples", "rerun lm-eval with --log_samples")
    _hash_rows(content, rows, sep)
    content.update(b"]")
    ids = np.frombuffer(doc_ids, dtype=np.int64)
    at = np.frombuffer(lines, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    dup = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if len(dup):  # the earliest line that repeats a doc_id
        j = min(dup, key=lambda j: at[order[j + 1]])
        raise fail(path, _at(unit, int(at[order[j + 1]])), f"doc_id {ids[order[j]]} also on "
                   f"{unit} {at[order[j]]}", "give one samples file per task and run (lm-eval "
                   "appends to an existing file when a run is repeated with the same output path "
                   "and date)")
    n = np.frombuffer(n_choices, dtype=np.int64)
    lengths = {"chars": _padded(chars, n, 1.0), "bytes": _padded(nbytes, n, 1.0)}
    logged = {k: a for k, v in metrics.items() if np.isfinite(a := np.frombuffer(v)).all()}
    multi = first[1]
    # a multiple_input task's acc_norm/acc_bytes divide by its contexts' lengths (doc_to_choice),
    # which the samples do not hold: the contexts logged include the few-shot prefix
    unverifiable = tuple(k for k in logged if multi and k != "acc")
    ts = TaskSamples(task, path, ids.tolist(), np.frombuffer(labels, dtype=np.int64).copy(),
                     _padded(lls, n, PAD_LOGIT), n.copy(), lengths, logged,
                     content.hexdigest()[:16], multi,
                     tuple(k for k in logged if k not in unverifiable
                           and not (multi and k == "acc")), unverifiable, unit)
    _verify(ts, at, delim)
    return ts


@dataclass(frozen=True)
class Source:
    """One model's output folder: its samples file per task and what its results file says."""

    root: Path
    samples: dict[str, Path]
    model: str | None  # model name/args from the results JSON; None without one
    delimiters: dict[str, str]
    other_runs: dict[str, list[str]]  # task -> the timestamps of its runs not chosen
    folder: Path | None = None  # the model's folder (its name names the model without results)
    #: task -> what its run's results file says of it (`_task_results`); absent without one
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_args: str | None = None  # the results file's config.model_args, as JSON


@dataclass(frozen=True)
class _Run:
    """One file of a task: its run's date ("" for lm-eval <= 0.4.2: one run per folder) and
    the model's folder."""

    date: str
    path: Path
    folder: Path

    @property
    def key(self) -> str:  # ISO order is time order
        return self.date.replace(":", "-")


def _old_model_args(folder: Path) -> str | None:
    """``config.model_args`` of lm-eval <= 0.4.2's ``results.json`` in ``folder``, if any."""
    res = folder / "results.json"
    if not res.is_file():
        return None
    try:
        return str(json.loads(res.read_text()).get("config", {}).get("model_args"))
    except (OSError, ValueError, AttributeError) as exc:
        raise UserError(f"{res}: unreadable results file ({exc})") from None


def _runs(root: Path, task: str) -> list[_Run]:
    """Every file of ``task`` under ``root``, oldest first, in the layouts uqbench reads:
    lm-eval >= 0.4.3 and the Open LLM Leaderboard v2 (``samples_<task>_<date>.jsonl``, or a
    ``.parquet`` copy; between 0.4.2 and 0.4.3 a ``.json`` array), lm-eval <= 0.4.2
    (``<model_args>_<task>.jsonl`` holding a JSON array, beside ``results.json``) and the
    leaderboard v1 (``<date>/details_<task>_<date>.parquet``, `uqbench.io.leaderboard`)."""
    found = []
    name = re.compile(rf"samples_{re.escape(task)}_({DATE})\.(?:jsonl|json|parquet)")
    found += [_Run(m[1], p, p.parent) for p in root.rglob(f"samples_{task}_*")
              if (m := name.fullmatch(p.name))]
    found += [_Run("", p, p.parent) for p in root.rglob(f"*_{task}.jsonl")
              if (args := _old_model_args(p.parent)) is not None
              and p.name == re.sub("/|=", "__", args) + f"_{task}.jsonl"]
    found += [_Run(m["date"], p, p.parent.parent if re.fullmatch(DATE, p.parent.name)
                   else p.parent) for p in root.rglob("details_*.parquet")
              if (m := V1_FILE.fullmatch(p.name)) and task in (m["task"], v1_task_name(m["task"]))]
    found += [_Run(index[1], p, p.parent) for p in dump_files(root)
              if task in (index := dump_index(p))[0]]
    return sorted(found, key=lambda r: r.key)


def _sniff_dump(path: Path) -> bool:
    """Whether ``path`` may be a `simple_evaluate` result: a JSON object naming ``results``
    in its first kilobytes (json.dump writes it first)."""
    try:
        with path.open("rb") as f:
            head = f.read(1 << 14)
    except OSError:
        return False
    return head.lstrip()[:1] == b"{" and b'"results"' in head


_DUMPS: dict[tuple[str, float, int], dict[str, Any] | None] = {}


def read_dump(path: Path) -> dict[str, Any] | None:
    """The `simple_evaluate(log_samples=True)` result saved with ``json.dump`` in ``path`` (a
    dict whose ``samples`` maps each task to its samples, beside ``results``), or None if it
    is none; parsed once per file version, from the file object (never its whole text and
    its objects at once), one file held at a time."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime, st.st_size)
    if key not in _DUMPS:
        doc = None
        if _sniff_dump(path):
            try:
                with path.open(encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError) as exc:
                raise UserError(f"{path}: looks like a simple_evaluate result but is not "
                                f"readable JSON ({exc}); the file is truncated") from None
        ok = isinstance(doc, dict) and isinstance(doc.get("samples"), dict) \
            and isinstance(doc.get("results"), dict)
        _DUMPS.clear()
        _DUMPS[key] = doc if ok else None
    return _DUMPS[key]


_INDEX: dict[tuple[str, float, int], tuple[tuple[str, ...], str, str]] = {}


def dump_index(path: Path) -> tuple[tuple[str, ...], str, str]:
    """(tasks with samples, date, model_args as JSON) of a `simple_evaluate` result (no tasks:
    none), kept per file version so a folder of dumps is parsed once per file."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime, st.st_size)
    if key not in _INDEX:
        doc = read_dump(path)
        _INDEX[key] = (tuple(doc["samples"]), _dump_date(doc), json.dumps(
            (doc.get("config") or {}).get("model_args"), sort_keys=True, default=str)) \
            if doc else ((), "", "")
    return _INDEX[key]


def dump_files(root: Path) -> list[Path]:
    """The ``*.json`` files under ``root`` that are `simple_evaluate` results with samples."""
    files = [root] if root.is_file() else sorted(root.rglob("*.json"))
    return [p for p in files if not re.match(r"(results|samples)_", p.name)
            and _sniff_dump(p) and dump_index(p)[0]]


def run_models(folder: Path) -> set[str]:
    """The models the results files under ``folder`` name (lm-eval's ``model_name``, else its
    ``model_args``, as JSON): one for a folder of one model's runs, whatever its layout."""
    found = set()
    for r in folder.rglob("results*.json"):
        try:
            doc = json.loads(r.read_text())
        except (OSError, ValueError):
            continue  # not a results file: find_source names it if a task needs it
        if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
            found.add(json.dumps(doc.get("model_name") or doc["config"].get("model_args"),
                                 sort_keys=True, default=str))
    return found


def _dump_date(doc: dict[str, Any] | None) -> str:
    """A dump's ``date`` (a Unix time) as lm-eval's date_id, for choosing the newest run."""
    import datetime

    t = (doc or {}).get("date")
    if not isinstance(t, (int, float)):
        return ""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H-%M-%S.%f")


def _inventory(root: Path) -> str:
    """What ``root`` holds that looks like lm-eval output, and why each is not usable."""
    why = []
    for p in sorted(root.rglob("*"))[:5000]:
        if not p.is_file() or p.suffix not in (".json", ".jsonl", ".parquet"):
            continue
        rel = p.relative_to(root)
        if p.name.startswith("results"):
            why.append(f"{rel}: a results file (aggregates only; samples need --log_samples)")
        elif p.name.startswith(("samples_", "details_")):
            why.append(f"{rel}: samples of another task")
        elif _sniff_dump(p):
            doc = read_dump(p)
            why.append(f"{rel}: a simple_evaluate result " + (
                f"with samples of {', '.join(doc['samples'])}" if doc else
                "without samples (call it with log_samples=True)"))
        else:
            why.append(f"{rel}: not lm-eval output")
        if len(why) == 12:
            why.append("...")
            break
    return "; ".join(why) or "no .json, .jsonl or .parquet file"


#: lm-eval output types that are not single-answer multiple choice, and why uqbench refuses them
NOT_MC = {"generate_until": "it generates text: there is no distribution over choices",
          "loglikelihood_rolling": "it logs one log-likelihood of a whole text per document "
          "(perplexity), not one per choice",
          "loglikelihood": "it logs the log-likelihood of one continuation per document, not "
          "one per choice"}


def find_source(root: Path, tasks: Sequence[str], runs: Sequence[str] = (),
                named: bool = False) -> Source:
    """The samples file of each task under ``root`` (searched recursively, `_runs`) and the
    results JSON of its run. Where a folder holds several runs of a task (``--output_path``
    accumulates them), the newest, or the one whose date starts with one of ``runs``
    (``--run``). A task whose run's model cannot be established (no results file of its run)
    beside a task whose results file names one is refused unless ``named`` (``--model-name``
    names the model of every file); a task a results file declares of another output type
    than multiple_choice is refused (`NOT_MC`)."""
    if not root.exists():
        raise UserError(f"{root} not found: give the --output_path folder of an lm-eval run "
                        "(made with --log_samples), or a downloaded leaderboard details folder")
    chosen: dict[str, _Run] = {}
    others: dict[str, list[str]] = {}
    for task in tasks:
        found = _runs(root, task)
        if not found:
            raise UserError(f"no samples file of task {task!r} under {root} (looked for "
                            f"samples_{task}_DATE.jsonl/.json/.parquet, lm-eval <= 0.4.2's "
                            f"MODEL_ARGS_{task}.jsonl beside results.json, and leaderboard v1's "
                            "details_harness|TASK|N_DATE.parquet, named harness_TASK_N, and "
                            "simple_evaluate results saved as *.json); found: "
                            f"{_inventory(root)}; run lm-eval on task {task!r} with "
                            f"--log_samples --output_path {root}")
        if len({r.folder for r in found}) > 1:
            raise UserError(f"samples files of task {task!r} in several folders under {root} ("
                            f"{', '.join(str(r.path.relative_to(root)) for r in found)}): lm-eval "
                            "writes one folder per model; point at the model's subfolder")
        keys = [r.key for r in found]
        pick = [r for r in found if any(r.key.startswith(x.replace(":", "-")) for x in runs)] \
            if runs else found[-1:]
        if len(pick) != 1:
            raise UserError(f"--run {' '.join(runs)} matches {len(pick)} of the runs of task "
                            f"{task!r} under {root} ({', '.join(keys)}); give one of these "
                            "dates (or its start)")
        chosen[task] = pick[0]
        others[task] = [r.date for r in found if r is not pick[0]]
    models: dict[str, str] = {}  # task -> the model its results file names
    delims: dict[str, str] = {}
    results: dict[str, dict[str, Any]] = {}
    args: dict[str, str] = {}
    for task, run in chosen.items():
        # the run's own results file (named by the same date): one of another date describes
        # another run, whose model need not be this file's
        own = [f / (f"results_{run.date}.json" if run.date else "results.json")
               for f in dict.fromkeys((run.path.parent, run.folder))]
        own = [r for r in own if r.is_file()][:1]
        dumped = read_dump(run.path) if run.path.suffix == ".json" else None
        for r in [run.path] if dumped else own:
            try:
                doc = dumped or json.loads(r.read_text())
            except (OSError, ValueError) as exc:
                raise UserError(f"{r}: unreadable results file ({exc})") from None
            conf = (doc.get("configs") or {}).get(task)
            general = doc.get("config_general") or {}  # the leaderboard v1's (lighteval's)
            if conf is None and not dumped and not (own and general.get("model_name")):
                continue
            kind = (conf or {}).get("output_type")
            if kind in NOT_MC:
                raise UserError(f"task {task!r} is a {kind} task ({r.name} says so): "
                                f"{NOT_MC[kind]}; uqbench score reads single-answer "
                                "multiple-choice tasks (output_type: multiple_choice) only: "
                                "drop it from --domain")
            delims[task] = (conf or {}).get("target_delimiter", " ")
            models[task] = str(doc.get("model_name") or general.get("model_name")
                               or doc.get("config", {}).get("model_args"))
            results[task] = _task_results(doc, task, r)
            args[task] = json.dumps((doc.get("config") or {}).get("model_args"),
                                    sort_keys=True, default=str)
    folders = {t: r.folder for t, r in chosen.items()}
    if len(set(folders.values())) > 1 and len(models) < len(folders):
        raise UserError("the tasks' files lie in different model folders (" + "; ".join(
            f"{t}: {f}" for t, f in folders.items()) + ") and not every one has a results file "
            "naming its model: give one model's folder (other models as members or separate "
            "runs)")
    unknown = [t for t in chosen if t not in models]
    if models and unknown and not named:
        raise UserError(
            f"the model of {', '.join(str(chosen[t].path) for t in unknown)} cannot be "
            f"established: no results file of its run (results_{chosen[unknown[0]].date or 'DATE'}"
            ".json) lies beside it, and the samples name no model; it is not "
            f"assumed to be {next(iter(models.values()))!r}, the model of the run of "
            f"{', '.join(models)}: copy that run's results file beside it, or give "
            "--model-name to name the model of every file")
    if len(set(models.values())) > 1:
        raise UserError("the samples files come from different models: " + "; ".join(
            f"{chosen[t].path} from {m!r}" for t, m in models.items()) + "; a domain's ID and "
            "shifted tasks must be scored from one model's run (give other models as members "
            "or separate runs)")
    return Source(root, {t: r.path for t, r in chosen.items()}, next(iter(models.values()), None),
                  delims, others, next(iter(folders.values()), None), results,
                  next(iter(args.values()), None))


def _task_results(doc: dict[str, Any], task: str, path: Path) -> dict[str, Any]:
    """What a results file says of ``task``: its aggregated metrics (``values``, lm-eval's
    ``acc,none`` read as ``acc``), few-shot count, ``--limit``, lm-eval's version and the
    file."""
    res = doc.get("results") or {}
    raw = res.get(task) or next((v for k, v in res.items() if v1_task_name(k) == task),
                                None) or {}
    values = {k.removesuffix(",none"): float(v) for k, v in raw.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)
              and (k.endswith(",none") or "," not in k)}
    n_shot = (doc.get("n-shot") or {}).get(task)
    config = doc.get("config") or {}
    n = (doc.get("n-samples") or {}).get(task) or {}
    return {"values": values, "n_shot": n_shot, "limit": config.get("limit"),
            "n_samples": [n.get("effective"), n.get("original")],
            "version": doc.get("lm_eval_version"), "file": str(path)}


def slug(name: str) -> str:
    """A method-name-safe model name: the last part of a path or hub id."""
    base = name.split("pretrained=")[-1].split(",")[0].rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-") or "lm-eval-model"


#: a Hugging Face cache path: ``.../models--ORG--NAME/snapshots/SHA``
_HF_CACHE = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)(?:/snapshots(?:/[^/]*)?)?/?$")
_HASH = re.compile(r"[0-9a-fA-F]{12,64}")


def _pretrained(model_args: str | None) -> str | None:
    """``pretrained=`` (or ``model=``) of a results file's model_args: a dict (lm-eval >=
    0.4.5) or its ``key=value,...`` string."""
    if not model_args:
        return None
    try:
        args = json.loads(model_args)
    except ValueError:
        args = model_args
    if isinstance(args, str):
        args = dict(kv.split("=", 1) for kv in args.split(",") if "=" in kv)
    if not isinstance(args, dict):
        return None
    found = args.get("pretrained") or args.get("model")
    return str(found) if found else None


def model_label(name: str | None, model_args: str | None, folder: Path) -> str:
    """A model's name people recognise: its ``pretrained=`` hub id (``ORG/NAME``) from
    ``model_args``, else ``name`` (the results file's model_name); a Hugging Face cache path
    ``.../models--ORG--NAME/snapshots/SHA`` is ``ORG/NAME``, another local path its folder's
    name (a bare hash never: the nearest folder above it that is not one); without either,
    ``folder``'s name (the leaderboard's ``<org>__<model>``)."""
    raw = (_pretrained(model_args) or name or "").strip()
    if not raw or raw.startswith("{"):
        return slug(folder.name.removeprefix("details_"))
    m = _HF_CACHE.search(raw)
    if m:
        return f"{slug(m['org'])}/{slug(m['name'])}"
    parts = [p for p in raw.rstrip("/").split("/") if p not in ("", ".", "..")]
    if raw.startswith(("/", ".", "~")) or len(parts) > 2:  # a local folder
        named = [p for p in parts if not _HASH.fullmatch(p) and p != "snapshots"]
        return slug(named[-1]) if named else slug(folder.name)
    return "/".join(slug(p) for p in parts)


def corresponds(ts: TaskSamples, normalize: str) -> str:
    """The lm-eval metric whose per-sample correctness uqbench's prediction of ``ts`` under
    ``normalize`` equals: a multiple_input task's choices share one continuation, so each
    normalisation ranks them as ``acc``."""
    return "acc" if ts.multiple_input else NORMALIZE[normalize]


def choose_normalize(normalize: str, tasks: Sequence[TaskSamples]) -> str:
    """A domain's normalisation: ``normalize`` unless ``auto``; under ``auto`` ``chars``
    (``acc_norm``) where each of the domain's ``tasks`` logged and verified it, else ``none``
    (``acc``), so that the accuracy printed is one lm-eval logged (multiple_input tasks rank
    as acc under any normalisation and do not decide)."""
    if normalize != "auto":
        return normalize
    decide = [ts for ts in tasks if not ts.multiple_input]
    return "chars" if all("acc_norm" in ts.verified for ts in decide) else "none"


def accuracy_check(ts: TaskSamples, normalize: str, rows: np.ndarray, split: str,
                   results: dict[str, Any] | None) -> dict[str, Any]:
    """The lm-eval metric uqbench's accuracy on ``split`` (rows ``rows`` of ``ts``) corresponds
    to, lm-eval's logged value of it (the results file's, else the mean of the per-sample
    metric; None where it logged none) and uqbench's: over all the file's questions (the
    questions lm-eval averaged) and over the split's."""
    metric = corresponds(ts, normalize)
    correct = ts.logits(normalize).argmax(axis=1) == ts.labels
    logged = (results or {}).get("values", {}).get(metric)
    where = "results file" if logged is not None else None
    if logged is None and metric in ts.lm_eval_metrics:
        logged, where = float(ts.lm_eval_metrics[metric].mean()), "mean of the samples' " + metric
    return {"split": split, "task": ts.task, "metric": metric, "lm_eval": logged,
            "lm_eval_from": where, "uqbench_all": float(correct.mean()),
            "uqbench": float(correct[rows].mean()), "questions": len(rows),
            "of": len(ts.labels)}


#: the columns a difference between ID and shift beyond the shift itself makes meaningless
OOD_COLUMNS = ("ood_auroc", "aupr_out", "fpr95")


def comparability(d: DomainTasks, main: dict[str, TaskSamples],
                  results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Where a domain's numbers mean less than they seem: ID and shift (or calib) tasks whose
    choice counts differ (the OOD columns of every scorer that reads the distribution's shape
    then measure the number of options), whose few-shot counts differ, or tasks run on a
    ``--limit`` subset (lm-eval's first N questions)."""
    found: list[dict[str, Any]] = []
    others = [(role, t) for role, t in (("shift", d.shift), ("calib", d.calib)) if t]
    ood = list(OOD_COLUMNS)
    counts = {t: sorted(set(main[t].n_choices.tolist())) for t in d.tasks}
    for role, t in others:
        if counts[t] != counts[d.id]:
            cols = ood if role == "shift" else ["ece_ts", "ece_hb", "ece_iso", "cp_*", "rc_*"]
            found.append({"domain": d.name, "kind": "choices", "tasks": [d.id, t],
                          "columns": cols, "message": (
                f"domain {d.name}: ID task {d.id} has {_counts(counts[d.id])} choices per "
                f"question, {role} task {t} {_counts(counts[t])}: "
                + ("OOD-AUROC, AUPR-out and FPR95 of every scorer that reads the predictive "
                   "distribution's shape (MSP, entropy, margin, energy...) measure the number "
                   "of options, not the shift" if role == "shift" else "recalibration, "
                   "conformal sets and risk control fitted on it do not transfer to ID"))})
    shots = {t: (results.get(t) or {}).get("n_shot") for t in d.tasks}
    for role, t in others:
        if None not in (shots[t], shots[d.id]) and shots[t] != shots[d.id]:
            found.append({"domain": d.name, "kind": "n-shot", "tasks": [d.id, t],
                          "columns": ood, "message": (
                f"domain {d.name}: ID task {d.id} ran {shots[d.id]}-shot, {role} task {t} "
                f"{shots[t]}-shot: the prompt differs as well as the data, so OOD-AUROC, "
                "AUPR-out and FPR95 measure both")})
    for t in d.tasks:
        info = results.get(t) or {}
        eff, orig = info.get("n_samples") or [None, None]
        if info.get("limit") is not None or (eff is not None and orig and eff < orig):
            found.append({"domain": d.name, "kind": "limit", "tasks": [t],
                          "columns": ["every column"], "message": (
                f"domain {d.name}: task {t} ran on a --limit subset ({eff or '?'} of "
                f"{orig or '?'} questions, lm-eval's first ones, not a random sample): every "
                "column describes those questions, not the task")})
    return found


def _counts(c: list[int]) -> str:
    return str(c[0]) if len(c) == 1 else f"{c[0]} to {c[-1]}"


def read_lmeval(domains: Sequence[DomainTasks], source: Path, *, members: Sequence[Path] = (),
                normalize: str = "auto", calib_fraction: float = 0.2, seed: int = 0,
                model_name: str | None = None, runs: Sequence[str] = ()) -> RecordSet:
    """The `RecordSet` of an lm-eval run's samples (see the module docstring); ``runs``:
    the dates (or their starts) of the source's runs to read where its folder holds several
    (default: each task's newest; members: always their newest)."""
    if normalize != "auto" and normalize not in NORMALIZE:
        raise ConfigError(f"--normalize {normalize!r}; valid: auto, {', '.join(NORMALIZE)}")
    left_out: dict[str, str] = {}
    known: dict[tuple[Path, str], TaskSamples] = {}  # samples `alone` read already
    if not domains:
        domains, left_out, known = alone(Path(source), runs)
    if len({d.name for d in domains}) < len(domains):
        raise ConfigError("two --domain entries share a name")
    if any(d.calib is None for d in domains) and not 0 < calib_fraction < 1:
        raise ConfigError(f"--calib-fraction {calib_fraction}: give a fraction in (0, 1) of the "
                          "ID questions to hold out for recalibration")
    tasks = list(dict.fromkeys(t for d in domains for t in (d.id, d.shift, d.calib) if t))
    srcs = [find_source(Path(p), tasks, runs if not k else (), named=model_name is not None)
            for k, p in enumerate((source, *members))]
    if model_name is not None and (lost := [t for t in tasks if t not in srcs[0].results]):
        print(f"{', '.join(lost)}: no results file of its run names the model; scored as "
              f"--model-name {model_name!r} says", flush=True)
    for src in srcs:
        for t, other in src.other_runs.items():
            if other:
                how = "--run" if runs and src is srcs[0] else "the newest"
                print(f"{t}: {len(other) + 1} runs under {src.root}; reading "
                      f"{src.samples[t].name} ({how}; others: {', '.join(other)}; choose with "
                      "--run DATE)", flush=True)
    read = [{t: known.get((s.samples[t], t)) or read_task(s.samples[t], t, s.delimiters.get(t, " "))
             for t in tasks} for s in srcs]
    main = read[0]
    for s, r in zip(srcs[1:], read[1:], strict=False):
        for t in tasks:
            if r[t].doc_ids != main[t].doc_ids or not np.array_equal(r[t].labels, main[t].labels
                                                                     ) or not np.array_equal(
                    r[t].n_choices, main[t].n_choices):
                raise UserError(f"member {s.samples[t]} has other questions than "
                                f"{srcs[0].samples[t]} for task {t!r}: members must be runs of "
                                "the same tasks with the same --limit")
    model = model_name or model_label(srcs[0].model, srcs[0].model_args,
                                      srcs[0].folder or srcs[0].root)
    norms = {d.name: choose_normalize(normalize, [main[t] for t in d.tasks]) for d in domains}
    not_logged = {t: NORMALIZE[norms[d.name]] for d in domains for t in d.tasks
                  if corresponds(main[t], norms[d.name]) not in main[t].verified
                  and not main[t].multiple_input}
    if not_logged:
        warnings.warn("lm-eval logged no " + "; ".join(
            f"{m} for {t} (it logs {', '.join(main[t].verified) or 'no accuracy'})"
            for t, m in not_logged.items()) + f": under --normalize {normalize} their accuracy "
            "is not one lm-eval logged (" + ("drop --normalize: auto takes the metric each "
            "task logs" if normalize != "auto" else "their samples log neither acc_norm nor "
            "acc") + "); recorded in run.json lmeval.not_logged", stacklevel=2)
    cautions = [c for d in domains for c in comparability(d, main, srcs[0].results)]
    for c in cautions:
        warnings.warn(c["message"] + " (run.json lmeval.warnings; the report's banner)",
                      stacklevel=2)
    outputs: dict[tuple[str, str, int], Outputs] = {}
    n_choices, hashes, held_out = {}, {}, {}
    gate = "+".join(dict.fromkeys(GATES[n] for n in norms.values()))
    pair_name = f"{model}/{gate}"
    checks = []

    def record(task: str, rows: np.ndarray, dom: str) -> Outputs:
        ts, how = main[task], norms[dom]
        members_ = np.stack([r[task].logits(how)[rows] for r in read]) \
            if len(read) > 1 else None
        return Outputs(ids=np.array([f"{task}/{ts.doc_ids[i]}" for i in rows]),
                       labels=ts.labels[rows], logits=ts.logits(how)[rows],
                       domain=np.array([dom] * len(rows)), member_logits=members_)

    for d in domains:
        n_id = len(main[d.id].doc_ids)
        if d.calib is None:
            perm = np.random.default_rng(seed).permutation(n_id)
            n_cal = round(calib_fraction * n_id)
            if not 1 <= n_cal < n_id:
                raise UserError(f"task {d.id!r} has {n_id} questions: too few to hold out "
                                f"{calib_fraction:g} of them for calibration; give a calib task "
                                "(NAME=ID:SHIFT:CALIB) or more samples")
            cal_rows, id_rows = np.sort(perm[:n_cal]), np.sort(perm[n_cal:])
            held_out[d.name] = [main[d.id].doc_ids[i] for i in cal_rows]
            cal_task = d.id
        else:
            id_rows, cal_rows, cal_task = np.arange(n_id), \
                np.arange(len(main[d.calib].doc_ids)), d.calib
        parts = {"id": (d.id, id_rows), "calib": (cal_task, cal_rows)}
        if d.shift is not None:
            parts["shift"] = (d.shift, np.arange(len(main[d.shift].doc_ids)))
        for role, (task, rows) in parts.items():
            split = f"{d.name}/{role}"
            outputs[pair_name, split, 0] = record(task, rows, d.name)
            n_choices[split] = main[task].n_choices[rows]
            hashes[split] = hashlib.sha256(
                f"{main[task].content_hash}:{','.join(map(str, rows))}".encode()).hexdigest()[:16]
            if role != "calib" or d.calib is not None:
                checks.append(accuracy_check(main[task], norms[d.name], rows, split,
                                             srcs[0].results.get(task)))
    fields = DET | ({"member_logits"} if members else set())
    pair = Pair(ModelSpec(model, "lm-eval"), GateSpec(gate, "none"), frozenset(fields))
    multi = [t for t in tasks if main[t].multiple_input]
    if multi and normalize not in ("none", "auto"):
        warnings.warn(f"task(s) {', '.join(multi)} are multiple_input (one shared continuation): "
                      f"--normalize {normalize} divides every choice by the same length, so "
                      "the predictions are lm-eval's acc, not its acc_norm/acc_bytes (which "
                      "divide by the contexts' lengths); recorded in run.json lmeval.labels",
                      stacklevel=2)
    meta = {
        "source": "lm-evaluation-harness samples",
        "lmeval": {
            "files": {t: str(p) for t, p in srcs[0].samples.items()},
            "runs_not_read": {t: o for t, o in srcs[0].other_runs.items() if o},
            "members": [{t: str(p) for t, p in s.samples.items()} for s in srcs[1:]],
            "model": srcs[0].model, "model_args": srcs[0].model_args,
            "named": model, "member_models": [s.model for s in srcs[1:]],
            "lm_eval_version": ", ".join(sorted({str(r["version"]) for r in
                                                 srcs[0].results.values() if r["version"]}))
            or None,
            "normalize": normalize, "normalized": norms,
            "metric": {dom: NORMALIZE[n] for dom, n in norms.items()},
            "not_logged": not_logged, "warnings": cautions,
            "accuracy": checks,
            "domains": {d.name: {"id": d.id, "shift": d.shift, "calib": d.calib}
                        for d in domains},
            **({"no_shift": {"domains": [d.name for d in domains if d.shift is None],
                             "reason": NO_SHIFT}} if any(d.shift is None for d in domains)
               else {}),
            **({"left_out": left_out} if left_out else {}),
            "calib_held_out": {"fraction": calib_fraction, "seed": seed, "doc_ids": held_out}
            if held_out else None,
            "labels": {t: {"from": "acc (multiple_input)" if main[t].multiple_input
                           else "target", "multiple_input": main[t].multiple_input,
                           "verified": list(main[t].verified),
                           "not_verifiable": list(main[t].not_verifiable),
                           "samples": len(main[t].doc_ids)} for t in tasks},
        },
    }
    refs = ReferenceInputs(tuple(d.name for d in domains), n_choices, None, hashes)
    return RecordSet([pair], outputs, 1, refs, 1000, None, meta)


__all__ = ["NORMALIZE", "NO_SHIFT", "DomainTasks", "TaskSamples", "alone", "domains_from_yaml",
           "find_source", "pairs_line", "read_lmeval", "read_task",
           "run_models"]
