"""One lm-eval sample, parsed and checked: the per-sample rules every reader of lm-eval-style
records shares (`uqbench.io.lmeval` for samples files, `uqbench.io.leaderboard` for the Open LLM
Leaderboard's details). A bad sample is a `UserError` naming the file, the line (or row) and the
fix."""
from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from uqbench.core.errors import UserError
from uqbench.core.outputs import PAD_LOGIT

#: ``--normalize``: how a choice's log-likelihood becomes its logit (lm-eval's metric beside it)
NORMALIZE = {"none": "acc", "chars": "acc_norm", "bytes": "acc_bytes"}

#: lm-eval's ``date_id`` in file names (``:`` or ``-`` between hours, minutes and seconds)
DATE = r"\d{4}-\d\d-\d\dT[\d:.-]+"

#: the fields every sample has, in the order a missing one is named
REQUIRED = ("doc_id", "target", "filtered_resps", "arguments")
_REQUIRED = frozenset(REQUIRED)

Parsed = tuple[int, int, list[float], list[str], str, bool, dict[str, float]]


def fail(path: Path, at: int | str | None, what: str, fix: str) -> UserError:
    """The error of a bad sample: ``at`` is its line (an int), or where else it is ("row 5")."""
    where = f"{path}" + ("" if at is None else f", line {at}" if isinstance(at, int) else f", {at}")
    return UserError(f"{where}: {what}; {fix}")


def _argmax(xs: Sequence[float]) -> int:
    """The first index of the largest value (`numpy.argmax`, which lm-eval uses)."""
    return max(range(len(xs)), key=xs.__getitem__)


def _multiple_input_label(path: Path, line: int | str, lls: list[float], acc: float | None) -> int:
    """The gold index of a multiple_input sample, from what its own ``acc`` determines."""
    why = ("a multiple_input task (every choice its own context, one shared continuation), "
           "whose samples log the continuation as `target`, not the gold index")
    if acc is None:
        raise fail(path, line, f"{why}, and no per-sample `acc` to determine it",
                   "add `- metric: acc` to the task's metric_list and rerun lm-eval")
    pred = _argmax(lls)
    if acc == 1:
        return pred
    if len(lls) == 2:
        return 1 - pred
    raise fail(path, line, f"{why}; its acc is 0 among {len(lls)} choices, which leaves the "
               "gold open", "score such a task with 2 choices per question, or write it as one "
               "context with a continuation per choice (doc_to_choice the options, "
               "doc_to_target the gold index) and rerun lm-eval")


def check_lls(path: Path, line: int | str, lls: list[float], doc_id: object) -> None:
    """Refuse log-likelihoods no choice distribution can be made of."""
    if not all(map(math.isfinite, lls)):
        raise fail(path, line, f"non-finite log-likelihood(s) {lls} (doc_id {doc_id})",
                   "the model produced NaN/inf: check its dtype and weights, and rerun lm-eval")
    if (low := min(lls)) <= PAD_LOGIT:
        raise fail(path, line, f"a log-likelihood {low:g} at or below {PAD_LOGIT:g}, the "
                   "logit uqbench gives an absent choice", "check the model's outputs")
    if len(lls) < 2:
        raise fail(path, line, f"{len(lls)} choice (doc_id {doc_id}): nothing to choose "
                   "between", "give a multiple-choice task with at least 2 choices per question")


def logged_metrics(path: Path, line: int | str, d: Mapping[str, Any]) -> dict[str, float]:
    """lm-eval's per-sample acc/acc_norm/acc_bytes of a sample (those it logged), each 0 or 1."""
    metrics: dict[str, float] = {}
    for k in NORMALIZE.values():
        if (v := d.get(k)) is not None:
            if isinstance(v, float) and 0 < v < 1:
                raise fail(path, line, f"`{k}` is {v!r}: a probability, not a correctness "
                           "(a truthfulqa_mc2-style task, whose acc is the probability mass "
                           "on several true answers)", "uqbench score reads single-answer "
                           "multiple choice (one gold choice); score truthfulqa_mc1 instead")
            if v not in (0, 1):
                raise fail(path, line, f"`{k}` is {v!r}, not 0 or 1",
                           "give the file as it was written, unedited")
            metrics[k] = float(v)
    return metrics


@functools.cache
def _gen_args(n: int) -> tuple[str, ...]:
    """The keys of ``n`` choices' arguments in a sample of lm-eval >= 0.4.3."""
    return tuple(f"gen_args_{i}" for i in range(n))


def _number(x: object) -> bool:
    """A log-likelihood as lm-eval logs one: a number, or its string."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return True
    try:
        float(str(x))
    except ValueError:
        return False
    return isinstance(x, str)


def _lls(path: Path, line: int | str, resps: object) -> list[float]:
    """The log-likelihoods of ``filtered_resps``, one (log-likelihood, is_greedy) pair per
    choice: raises unless it holds that."""
    if not (isinstance(resps, list) and resps and all(
            isinstance(r, list) and len(r) == 2 for r in resps)):
        what = ("one number per document: this is a loglikelihood_rolling task (perplexity of "
                "a whole text), with no choices") if isinstance(resps, list) and resps and all(
            _number(r) for r in resps) else ("generated text: this is a generate_until task, "
                                            "with no distribution over choices")
        raise fail(path, line, f"`filtered_resps` holds {what}, not one (log-likelihood, "
                   "is_greedy) pair per choice", "uqbench score reads single-answer "
                   "multiple-choice tasks (output_type: multiple_choice) only: drop it from "
                   "--domain")
    try:
        return [float(r[0]) for r in resps]
    except (TypeError, ValueError):
        raise fail(path, line, f"a log-likelihood in `filtered_resps` is not a number "
                   f"({resps!r:.80})", "give the samples file lm-eval wrote") from None


def parse_sample(path: Path, line: int | str, d: Mapping[str, Any], delim: str
                 ) -> tuple[int, int, list[float], list[str], str, bool, dict[str, float]]:
    """(doc_id, label, log-likelihoods, choice texts, the doc's hash, multiple_input, lm-eval's
    per-sample metrics) of one sample."""
    if not d.keys() >= _REQUIRED:
        key = next(k for k in REQUIRED if k not in d)
        raise fail(path, line, f"no `{key}` field", "give the samples file lm-eval wrote "
                   "with --log_samples, unedited")
    resps = d["filtered_resps"]
    try:  # one (log-likelihood, is_greedy) pair per choice, in one pass; else `_lls` says why not
        lls = [float(r[0]) for r in resps if isinstance(r, list) and len(r) == 2]
    except (TypeError, ValueError, OverflowError):
        lls = []
    if not (isinstance(resps, list) and resps and len(lls) == len(resps)):
        lls = _lls(path, line, resps)
    check_lls(path, line, lls, d["doc_id"])
    args = d["arguments"]
    if isinstance(args, dict):  # lm-eval >= 0.4.3; a parquet copy holds None for absent choices
        pairs = [(a.get("arg_0"), a.get("arg_1")) for a in map(args.get, _gen_args(len(args)))
                 if a]
    elif isinstance(args, list):  # lm-eval <= 0.4.2: [context, continuation] each
        pairs = [tuple(a) for a in args if isinstance(a, (list, tuple)) and len(a) == 2]
    else:
        pairs = []
    if len(pairs) != len(lls) or not all(
            isinstance(c, str) and isinstance(x, str) for c, x in pairs):
        raise fail(path, line, f"{len(pairs)} arguments for {len(lls)} responses",
                   "give the samples file lm-eval wrote")
    contexts, conts = zip(*pairs, strict=False)
    half = len(pairs) // 2
    if d.get("acc_mutual_info") is not None or (len(pairs) % 2 == 0 and half and not any(
            contexts[half:]) and any(contexts[:half])):
        raise fail(path, line, f"a task scored with acc_mutual_info: its {len(lls)} "
                   f"log-likelihoods are {half} conditional ones and {half} unconditional "
                   "ones (empty context), not one per choice",
                   "uqbench reads one log-likelihood per choice: drop acc_mutual_info from the "
                   "task's metric_list and rerun lm-eval")
    metrics = logged_metrics(path, line, d)
    multiple_input = conts.count(conts[0]) == len(conts) and len(set(contexts)) > 1
    choices = [c.removeprefix(delim) for c in conts]
    target = str(d["target"]).strip()
    if multiple_input:
        label = _multiple_input_label(path, line, lls, metrics.get("acc"))
    elif target.lstrip("-").isdigit():
        label = int(target)
    elif target in choices:
        label = choices.index(target)  # what lm-eval does with a text target
    else:
        raise fail(path, line, f"target {target[:60]!r} is neither a choice index nor one of "
                   "the choices (several gold answers are not supported)",
                   "use a task whose doc_to_target gives one choice")
    if not 0 <= label < len(lls):
        raise fail(path, line, f"target index {label} outside the {len(lls)} choices",
                   "check the task's doc_to_target")
    doc_hash = str(d.get("doc_hash") or hashlib.sha256(
        json.dumps(d.get("doc"), sort_keys=True).encode()).hexdigest())
    return int(d["doc_id"]), label, lls, choices, doc_hash, multiple_input, metrics
