"""The test suite: a fast tier (``make test-fast``: ``-m "not slow and not e2e"``) and the slow and
e2e tiers, marked by the fixtures a test uses (tests/conftest.py).

The folders mirror the packages: ``tests/<stage>/test_<module>.py`` tests ``uqbench/<stage>/``
(core, data, files, io, reporting, results, run, stats) or a top-level package (scorers,
baselines, figures, benchmarks); the checks of the whole tree (the layering rule, ruff and mypy,
the README and docs, every docstring example) sit at ``tests/`` itself. Shared helpers live in
``tests/support/``: suite YAML, small inputs, a check for CPU tensors reaching device ops, the
README's extension examples (``example_*.py``), the lm-evaluation-harness runner of the lm-eval
tests (``lmeval.py``), the 2-process worker of the distributed test (``dist_worker.py``) and the
committed fixture files (``fixtures/``).
"""
