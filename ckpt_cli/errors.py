"""Errors that the command line turns into one line and a documented exit code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # outputs differ, memory got worse, a --fail-if condition held
EXIT_BAD_INPUT = 2  # bad usage, unreadable or unsuitable model
EXIT_UNREACHABLE = 3  # a memory budget no plan can meet
EXIT_RUNTIME = 4  # the requested ONNX Runtime provider is unavailable


class CkptError(Exception):
    """An expected failure: printed as one line, mapped to ``exit_code``."""

    exit_code = EXIT_BAD_INPUT


class ModelError(CkptError):
    """The model cannot be read or is not a training graph ckpt can work on."""


class UsageError(CkptError):
    """An option names something that does not exist or makes no sense."""


class BudgetUnreachable(CkptError):
    exit_code = EXIT_UNREACHABLE


class RuntimeUnavailable(CkptError):
    exit_code = EXIT_RUNTIME


class OutputError(CkptError):
    """An output cannot be written: read-only filesystem, disk full, no permission, not a regular file."""
