"""Every error ckpt expects, in one hierarchy: the command line prints one line and
exits with the class's documented code (README, "Exit codes")."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # outputs differ, memory got worse, order not followed, a --fail-if condition held
EXIT_BAD_INPUT = 2  # bad usage, unreadable or unsuitable model, unwritable output
EXIT_UNREACHABLE = 3  # a memory budget no plan can meet
EXIT_RUNTIME = 4  # the requested ONNX Runtime provider is unavailable
EXIT_RUN_FAILED = 5  # ONNX Runtime could not run a model (crash, out of memory, timeout)
EXIT_INTERRUPTED = 130  # SIGINT
EXIT_TERMINATED = 143  # SIGTERM
EXIT_INTERNAL = 70  # a bug in ckpt


class CkptError(Exception):
    """An expected failure: printed as one line, mapped to ``exit_code``."""

    exit_code = EXIT_BAD_INPUT
    # the report of what was done before the failure (a rewrite written before its check failed)
    report: dict[str, object] | None = None


class ModelError(CkptError):
    """The model cannot be read or is not a training graph ckpt can work on."""


class UsageError(CkptError):
    """An option names something that does not exist or makes no sense."""


class OptionError(UsageError, ValueError):
    """An option's value is out of its range or contradicts another: a ValueError to a
    library caller, raised where the options are checked, before any work."""


class OutputError(CkptError):
    """An output or report cannot be written (read-only folder, disk full, ...)."""


class BudgetUnreachable(CkptError):
    exit_code = EXIT_UNREACHABLE


class CheckFailed(CkptError):
    """``check`` fails before anything runs: the two models cannot be compared."""

    exit_code = EXIT_FAILED


class RuntimeCheckError(CkptError):
    """ONNX Runtime did not produce a measurement; ``kind`` says why (the worker's
    failure kinds: provider_unavailable, load_failed, run_failed, bad_feeds, bad_spec,
    crashed, timeout)."""

    exit_code = EXIT_RUN_FAILED

    def __init__(self, kind: str, message: str, stderr: str = ""):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.stderr = stderr


class RuntimeUnavailable(RuntimeCheckError):
    """The requested execution provider (or the ops a model needs) cannot run here."""

    exit_code = EXIT_RUNTIME


class RunFailed(RuntimeCheckError):
    """Loading or running a model on ONNX Runtime failed."""
