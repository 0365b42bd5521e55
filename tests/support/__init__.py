"""Helpers the test modules share (not fixtures: those are in tests/conftest.py): small inputs and
suites, the README's extension examples (``example_*.py``), the lm-eval runner, the distributed
worker, and the committed fixture files (``fixtures/``)."""
