"""Tests of `io`."""
