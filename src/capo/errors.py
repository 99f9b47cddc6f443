"""User-facing errors, and the two type tests most of their checks start from.

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


def is_int(v) -> bool:
    """``v`` is an int and not a bool (Python counts True as 1: a setting given as ``true`` is not a count)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v) -> bool:
    """``v`` is an int or a float and not a bool (NaN and infinities pass: each caller bounds its own range)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)
