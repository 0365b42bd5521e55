"""Tests of `data`."""
