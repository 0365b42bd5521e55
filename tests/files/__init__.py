"""Tests of `files`."""
