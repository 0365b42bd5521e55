"""The test suite: a fast tier (``make test-fast``: ``-m "not slow and not e2e"``) and the slow and
e2e tiers, marked by the fixtures a test uses (tests/conftest.py).

Test files are named for the module they test and stay in one folder (pytest's rootdir conftest
and ``from tests.support import ...`` stay simple); this map is their layout, stage by stage
(the README's "Layout"):

- ``uqbench/core``: test_outputs, test_scorers (scorer contract and built-ins), test_registry,
  test_extending (every registry, plugins), test_experiments, test_gates (gating side).
- ``uqbench/files``: test_cache, test_reproduce (environment, run folders).
- ``uqbench`` (every module's docstring examples): test_doctests
- ``uqbench/stats``: test_metrics, test_conformal, test_risk, test_recalibration, test_features
  (feature scorers against scikit-learn).
- ``uqbench/data``: test_loaders, test_data_registry, test_suites, test_fingerprints,
  test_artifacts, test_mathmc, test_codemc, test_sandbox, test_seeds.
- ``uqbench/results``: test_columns, test_conformal_risk, test_references, test_zero_shot,
  test_score_workers (scoring in worker processes).
- ``uqbench/io``: test_records, test_lmeval, test_leaderboard, test_confidence_records.
- ``uqbench/reporting``: test_html, test_paper, test_score_many (many models in one table).
- ``uqbench/run`` and the CLI: test_runner, test_reliability (bad input, interruptions), test_e2e
  (the real smoke run), test_readme.
- ``baselines``: test_moe, test_moe_fast, test_gates, test_thermostat, test_heads,
  test_head_selection, test_prefix, test_forward, test_train, test_compile, test_dense,
  test_variants, test_checkpoint, test_backbones, test_mpnet, test_smollm2, test_accelerate,
  test_recipe; on real decoder weights, test_parity (the heads against lm-eval) and
  test_memorise (training memorises a small set).
- ``figures``: test_figures, test_figure_layout. ``benchmarks``: test_gpu_check, test_gpu_bundle,
  test_gpu_lease, test_bench_backbone, test_divergence (the bf16 divergence probe).
- the layering rule: test_layers; ruff and mypy over the tree: test_static_checks.

Shared helpers live in ``tests/support/`` (suite YAML, small inputs, a check for CPU tensors
reaching device ops); the README's examples in
``tests/example_*.py``; ``tests/lmeval.py`` runs lm-evaluation-harness for the lm-eval tests and
``tests/dist_worker.py`` is the 2-process worker of test_accelerate.
"""
