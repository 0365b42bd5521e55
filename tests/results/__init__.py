"""Tests of `results`."""
