"""Tests of `figures`."""
