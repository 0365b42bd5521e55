"""Helpers the test modules share (not fixtures: those are in tests/conftest.py)."""
