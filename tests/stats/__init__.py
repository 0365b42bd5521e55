"""Tests of `stats`."""
