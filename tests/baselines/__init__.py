"""Tests of `baselines`."""
