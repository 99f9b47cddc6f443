"""User-facing errors.

A :class:`CapoError` is a problem with the user's input or environment (a bad file, field, value or name).
The CLI prints its message as one paragraph and exits non-zero without a traceback (unless ``--debug``).
"""


class CapoError(Exception):
    """An error caused by user input; its message names the file/row/field and what is allowed."""

    exit_code = 2


class ConfigError(CapoError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class DataError(CapoError, ValueError):
    """A dataset or generations file is missing, malformed, or lacks a required field."""
