"""Errors that name what is wrong and how to fix it.

`UserError` subclasses are bad input: the CLI prints their message and exits non-zero without a
traceback. Everything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (CLI flag, suite file, data folder, plugin)."""


class ConfigError(UserError, ValueError):
    """An invalid name or value in a configuration (suite, profile, backbone, scorer...)."""


class DataError(UserError):
    """Missing, malformed or changed data files."""


class PluginError(UserError):
    """A user scorer that fails to import, raises, or returns a bad array."""
