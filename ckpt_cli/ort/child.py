"""Child processes are untrusted: ``--python`` may name any program. Everything read from
one is bounded in size and time and parsed strictly, a misbehaving child ends in a
RunFailed (exit 5) that says what it did, and no process of its group is left behind.

A child runs in a session (and process group) of its own: a wrapper interpreter's worker,
or the worker's own process-peak child, is killed with it on a timeout, a crash, too much
output, an interruption of ckpt, or after a normal exit.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import signal
import subprocess
import time
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

import numpy as np

from ..errors import RunFailed

# The worker's answer is one JSON line: figures and the executed order (three names per node,
# ~8 MiB at 100k nodes), or a per-node timeline when asked. More is not an answer.
MAX_ANSWER_BYTES = 32 << 20
# Of stderr only the end is kept: its last lines say why a child failed.
STDERR_TAIL_BYTES = 64 << 10
# A byte count or an index has at most 20 digits; a longer number is not a measurement.
MAX_INT_DIGITS = 20
_READ_CHUNK = 1 << 16
_POLL_S = 0.1


@dataclass
class Child:
    """A finished child: its exit status (negative: the signal that killed it) and output."""

    returncode: int
    stdout: str
    stderr: str


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def how_it_ended(returncode: int) -> str:
    """'killed by SIGSEGV (signal 11)' or 'exit code 3'; a shell wrapper reports a killed
    command as 128 + the signal."""
    if returncode < 0:
        how = f"killed by {signal_name(-returncode)} (signal {-returncode})"
    elif returncode > 128 and returncode - 128 in signal.valid_signals():
        how = f"exit code {returncode} ({signal_name(returncode - 128)}?)"
    else:
        how = f"exit code {returncode}"
    if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        how += ", out of memory?"
    return how


def run_child(argv: list[str], env: dict[str, str], timeout: float | None, what: str) -> Child:
    """Run ``argv`` in a process group of its own and collect its output, bounded; ``what``
    names the run in errors ("the worker running m.onnx")."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True)
    except (OSError, ValueError) as e:
        raise RunFailed("load_failed", f"cannot start {argv[0]}: {getattr(e, 'strerror', None) or e}") from e
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        out, err = _collect(proc, deadline, timeout, what)
        _wait_exited(proc, deadline, timeout, what, err)
    finally:
        _end_group(proc)
    return Child(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def _collect(proc: subprocess.Popen[bytes], deadline: float | None, timeout: float | None,
             what: str) -> tuple[bytes, bytes]:
    """Read stdout (at most MAX_ANSWER_BYTES) and the tail of stderr until both close, the
    child exits and goes quiet (a grandchild may hold the pipes), or the deadline."""
    out, err = bytearray(), bytearray()
    assert proc.stdout is not None and proc.stderr is not None  # started with both piped
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            ready = sel.select(_poll_s(deadline, timeout, what, err))
            if not ready and _exited(proc):
                break
            for key, _ in ready:
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is err and len(err) > 2 * STDERR_TAIL_BYTES:
                    del err[:-STDERR_TAIL_BYTES]
                if len(out) > MAX_ANSWER_BYTES:
                    raise RunFailed("bad_answer", f"{what} printed more than {MAX_ANSWER_BYTES >> 20} MiB "
                                    "on stdout, which is not a worker's answer", _tail(err))
    return bytes(out), bytes(err[-STDERR_TAIL_BYTES:])


def _poll_s(deadline: float | None, timeout: float | None, what: str, err: bytearray) -> float:
    if deadline is None:
        return _POLL_S
    left = deadline - time.monotonic()
    if left <= 0:
        raise RunFailed("timeout", f"{what} ran past the {timeout:g} s timeout (--timeout)", _tail(err))
    return min(left, _POLL_S)


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the child has exited, without reaping it: its pid (= the group id) stays
    taken until ``_end_group`` has killed the rest of the group."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_exited(proc: subprocess.Popen[bytes], deadline: float | None, timeout: float | None, what: str,
                 err: bytes) -> None:
    """Wait for a child that closed its pipes to exit (not reaped)."""
    while not _exited(proc):
        _poll_s(deadline, timeout, what, bytearray(err))
        time.sleep(0.01)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill whatever is left of the child's group, then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for f in (proc.stdout, proc.stderr):
        assert f is not None  # started with both piped
        f.close()


def _tail(err: bytes | bytearray) -> str:
    return bytes(err[-STDERR_TAIL_BYTES:]).decode("utf-8", "replace")


# --------------------------------------------------------------------------- answers


def _bounded_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        raise ValueError(f"a number of {len(digits)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"a number out of range ({text[:20]})")
    return value


def _no_constant(text: str) -> NoReturn:
    raise ValueError(f"{text} is not a number")


def parse_json_line(line: str) -> object:
    """The answer line as JSON: numbers bounded and finite, no NaN or Infinity."""
    return json.loads(line, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)


# --------------------------------------------------------------------------- outputs (.npz)


def load_outputs(path: str, what: str) -> dict[str, np.ndarray]:
    """The arrays a child wrote to ``path``: a zip of .npy members whose headers match the
    bytes stored (a header that claims more is refused before anything is allocated)."""
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                _check_member(z, info)
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except FileNotFoundError as e:
        raise RunFailed("bad_answer", f"{what} reported success but wrote no outputs") from e
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, MemoryError, OverflowError,
            NotImplementedError, RuntimeError) as e:
        raise RunFailed("bad_answer", f"{what} wrote outputs that are not a readable .npz "
                                      f"({type(e).__name__}: {_short(e)})") from e


def _check_member(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    if not info.filename.endswith(".npy"):
        raise ValueError(f"member {info.filename[:80]!r} is not an array")
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        reader = {(1, 0): np.lib.format.read_array_header_1_0,
                  (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f"member {info.filename[:80]!r}: .npy version {version}")
        shape, _, dtype = reader(f)
        header = f.tell()
    if dtype.hasobject:
        raise ValueError(f"member {info.filename[:80]!r} holds Python objects")
    need = math.prod(shape) * dtype.itemsize
    if need != info.file_size - header:
        raise ValueError(f"member {info.filename[:80]!r} claims {need} bytes and holds {info.file_size - header}")


def _short(e: BaseException | str, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _opt_int(v: object) -> bool:
    return v is None or type(v) is int


def _opt_number(v: object) -> bool:
    return v is None or type(v) in (int, float)


def _strings(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) for s in v)


def _runs(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(r, dict) and _opt_int(r.get("peak_bytes"))
                                       and _opt_number(r.get("time_s")) for r in v)


def _string(v: object) -> bool:
    return isinstance(v, str)


# The worker's answer fields ckpt reads, and what each must be (worker.py's docstring).
_FIELDS: dict[str, Callable[[object], bool]] = {
    "kind": _string, "message": _string, "provider": _string, "ort_version": _string, "settings": _string,
    "method": _string, "peak_bytes": _opt_int, "time_s": _opt_number, "baseline_bytes": _opt_int,
    "peak_above_baseline_bytes": _opt_int, "peak_requested_bytes": _opt_int, "runs": _runs,
    "executed_order": _strings, "executed_ops": _strings, "executed_providers": _strings, "warnings": _strings,
    "session_settings": lambda v: isinstance(v, dict), "timeline": lambda v: isinstance(v, list),
}
# What an answer of a measured run must hold besides "ok".
MEASURED_FIELDS = ("provider", "method", "runs", "executed_order")


def checked_answer(answer: object, what: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """``answer`` when it is an object whose fields are what the worker writes, else RunFailed."""
    if not isinstance(answer, dict) or type(answer.get("ok")) is not bool:
        raise RunFailed("bad_answer", f"{what} answered something other than a worker's result")
    missing = [k for k in required if answer["ok"] and k not in answer]
    bad = [k for k, valid in _FIELDS.items() if k in answer and not valid(answer[k])]
    if missing or bad:
        raise RunFailed("bad_answer", f"{what} answered a malformed result ({', '.join(missing + bad)})")
    return answer


def printable(text: str, limit: int = 600) -> str:
    """A child's text as one printable line: control characters (terminal escapes) dropped."""
    clean = "".join(c if c.isprintable() else " " for c in text)
    return _short(clean, limit)
