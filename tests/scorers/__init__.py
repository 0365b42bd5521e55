"""Tests of `scorers`."""
