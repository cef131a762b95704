"""The ``ckpt`` group: error handling, exit codes, and the commands registered on it."""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from types import FrameType
from typing import Any, NoReturn

import click

from ..version import __version__
from ..errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_TERMINATED, CkptError
from .commands import check, inspect, plan, rewrite, session
from .compare import compare
from .export import export

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as shells report a reader that went away


def fail(message: str, code: int, *, as_json: bool, command: str | None, debug: bool = False,
         prefix: str = "ckpt: error: ") -> None:
    """The one way ckpt reports a failure: one line on stderr, with every control character
    of a name the model or the command line put in the message made visible, and under
    --json one error object on stdout (schema.json's ``error``); then the exit code."""
    from ..report.text import plain

    if debug:
        traceback.print_exc()
    message = plain(message)
    click.echo(prefix + message, err=True)
    if as_json:
        click.echo(json.dumps({"schema_version": 1, "command": command,
                               "error": {"exit_code": code, "message": message}}))
    sys.exit(code)


def _fail(ctx: click.Context, message: str, code: int, prefix: str = "ckpt: error: ") -> None:
    obj = ctx.obj or {}
    fail(message, code, as_json=bool(obj.get("json")), command=ctx.invoked_subcommand,
         debug=bool(obj.get("debug")), prefix=prefix)


def _json_requested(args: list[str]) -> bool:
    """Whether the command line asks for --json: a usage error stops click before the
    option is read, so the words themselves say."""
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def _usage_message(e: click.ClickException, command: str | None) -> str:
    """click's message for a usage error, with the command's help hint on the same line."""
    return f"{e.format_message()} (see 'ckpt {command + ' ' if command else ''}--help')"


def _os_message(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    if e.errno == errno.ENOSPC:
        return f"{where}no space left on the device"
    if e.errno == errno.EROFS:
        return f"{where}the file system is read-only"
    return f"{where}{e.strerror or e}"


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every ``finally`` (temporary files,
    the check's child process) runs before ckpt exits."""


def _on_sigterm(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise _Terminated()


class CkptGroup(click.Group):
    """Turns expected failures into one line and an exit code; no traceback unless --debug."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """click's main, with its usage errors (unknown option, missing argument, bad value,
        unknown command) reported by ``fail`` like every other error."""
        words = list(sys.argv[1:] if args is None else args)
        try:  # args as given: click expands wildcards itself on Windows when it reads sys.argv
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # plain `ckpt`: the help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        except click.ClickException as e:
            command = self._command_named(words)
            fail(_usage_message(e, command), EXIT_BAD_INPUT, as_json=_json_requested(words), command=command,
                 debug="--debug" in words)
        except click.exceptions.Abort:  # ^C while click still parses
            fail("interrupted", EXIT_INTERRUPTED, as_json=_json_requested(words), command=self._command_named(words),
                 prefix="ckpt: ")
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def _command_named(self, args: list[str]) -> str | None:
        """The command the words name: the first that is not a group option (none takes a value)."""
        first = next((a for a in args if not a.startswith("-")), None)
        return first if first in self.commands else None

    def invoke(self, ctx: click.Context) -> Any:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        # A command is one short process that makes next to no garbage cycles: without the
        # cycle collector (which the library pauses only inside its stages) a plan skips a
        # pass over every object its stages made, at no real cost in peak RSS.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return super().invoke(ctx)
        except CkptError as e:
            _fail(ctx, str(e), e.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except BrokenPipeError:
            # The reader went away (ckpt inspect m.onnx | head -1): no error to print.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(EXIT_BROKEN_PIPE)
        except KeyboardInterrupt:
            _fail(ctx, "interrupted", EXIT_INTERRUPTED, prefix="ckpt: ")
        except _Terminated:
            _fail(ctx, "terminated", EXIT_TERMINATED, prefix="ckpt: ")
        except OSError as e:  # the environment, not ckpt: unreadable, unwritable, full
            _fail(ctx, _os_message(e), EXIT_BAD_INPUT)
        except MemoryError:
            _fail(ctx, "out of memory (a --dim too large for this machine?)", EXIT_BAD_INPUT)
        except RecursionError:
            _fail(ctx, "the model nests too deeply to read", EXIT_BAD_INPUT)
        except Exception as e:  # noqa: BLE001 - a bug: one line unless --debug
            _fail(ctx, f"{type(e).__name__}: {e} (rerun with --debug for details)", EXIT_INTERNAL,
                  "ckpt: internal error: ")
        finally:
            signal.signal(signal.SIGTERM, previous)
            if collecting:  # an in-process caller (click's test runner) gets it back
                gc.enable()


@click.group(cls=CkptGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ckpt")
@click.option("--debug", is_flag=True, help="Show Python tracebacks on errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """ckpt: gradient checkpointing for ONNX training graphs.

    A training graph holds the forward and backward pass in one ONNX file; its peak
    memory is mostly forward activations stashed for the backward. ckpt predicts that
    peak, rewrites the graph to recompute activations instead of keeping them, and
    proves the result on ONNX Runtime.

    \b
    Typical use:
      ckpt inspect model.onnx                  # where does the memory go?
      ckpt rewrite model.onnx -o model.ckpt.onnx --check
      ckpt check model.onnx model.ckpt.onnx --json
      ckpt session model.ckpt.onnx             # the SessionOptions it needs
      ckpt compare model.onnx rewrite.json --fail-if 'peak_bytes>2GiB'
      ckpt export models.py:make_model -i 8,3,32,32 --loss cross_entropy -o model.onnx

    Exit codes: 0 ok, 1 check failed or a --fail-if condition held, 2 bad input or
    usage, 3 budget unreachable, 4 runtime unavailable, 5 ONNX Runtime could not run a
    model, 70 internal error, 130 interrupted, 141 output pipe closed, 143 terminated.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    _warn_of_ort_version()


_warned: list[bool] = []


def _warn_of_ort_version() -> None:
    """Once per process: the installed onnxruntime is not a release the memory model is validated on."""
    from ..report.model import ort_release, ort_version_warning

    message = None if _warned else ort_version_warning(*ort_release())
    _warned.append(True)
    if message:
        click.echo(message, err=True)



for command in (inspect, rewrite, plan, check, session, compare, export):
    main.add_command(command)
