"""Work that can run beside the main line of a command.

``side_by_side(*calls)`` makes calls that each wait on a child process of their own at
once, in threads, where there is more than one core.

``Background(work)`` starts ``work`` in a forked child where one can run beside this
process: on Linux, with more than one core to run on. ``result()`` gives what it returned.
Where no child runs (another system, one core, ``CKPT_SERIAL=1``) or the child gives
nothing back (it raised, died, or returned what cannot be pickled), ``result()`` runs
``work`` here: a child changes when the work is done, never what it gives. The child
writes nothing to the terminal and tells no progress listener.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Generic, TypeVar, cast

from .progress import listening

T = TypeVar("T")

MIN_WAIT_S = 30.0


def can_fork() -> bool:
    """Whether a forked child can run beside this process (``Background``'s conditions)."""
    return sys.platform == "linux" and side_by_side_allowed()


def side_by_side_allowed() -> bool:
    """Whether there is more than one core to run on and ``CKPT_SERIAL=1`` does not forbid it."""
    if os.environ.get("CKPT_SERIAL", "") == "1":
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores > 1


def side_by_side(*calls: Callable[[], T]) -> list[T]:
    """Each call's result, in order: the calls made at once, each in a thread of its own, where
    ``side_by_side_allowed`` (for calls that wait on child processes: the GIL is free while
    they wait), else one after the other. An error is raised as the first call that raised
    it would raise it, one after the other."""
    if len(calls) < 2 or not side_by_side_allowed():
        return [call() for call in calls]
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]


class Background(Generic[T]):
    """``work``, started in a forked child where ``can_fork``; its result by ``result()``."""

    def __init__(self, work: Callable[[], T]) -> None:
        self._work = work
        self._started = time.monotonic()
        self._child: tuple[int, int] | None = _start(work) if can_fork() else None  # (pid, read end)
        if self._child is not None:
            self._reaper = weakref.finalize(self, _reap, *self._child)

    def result(self) -> T:
        """What ``work`` returned: the child's result, else ``work()`` run here. A child
        still at work after twice the time the command took to ask (at least
        ``MIN_WAIT_S``) is stopped, and the work done here."""
        if self._child is None:
            return self._work()
        pid, read = self._child
        self._child = None
        self._reaper.detach()
        data = _read_until(read, time.monotonic() + max(MIN_WAIT_S, 2 * (time.monotonic() - self._started)))
        _reap(pid, read)
        try:
            done, value = pickle.loads(data)
        except Exception:  # noqa: BLE001 - cut short or not a result: the work is done here instead
            return self._work()
        return cast(T, value) if done else self._work()


def _read_until(read: int, deadline: float) -> bytes:
    """Everything the child writes to ``read``, or what came before ``deadline``."""
    chunks = []
    while (left := deadline - time.monotonic()) > 0 and select.select([read], [], [], left)[0]:
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _start(work: Callable[[], object]) -> tuple[int, int] | None:
    """The child's pid and the read end of its pipe; None where no child could be made (no
    process or descriptor left: the work is then done here)."""
    try:
        read, write = os.pipe()
    except OSError:
        return None
    for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written twice
        stream.flush()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    if pid == 0:  # the child: its result down the pipe, and out without any of the parent's exit work
        os.close(read)
        _run_child(work, write)
        os._exit(0)
    os.close(write)
    return pid, read


def _run_child(work: Callable[[], object], write: int) -> None:
    try:
        # Fresh streams on the null device: the parent's may have been locked by one of its
        # threads (a progress display) when it forked, and that thread does not exist here.
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        sys.stdout = sys.stderr = open(os.devnull, "w")
        warnings.simplefilter("ignore")
        with listening(None):
            data = pickle.dumps((True, work()))
    except BaseException:  # noqa: BLE001 - the parent runs the work itself, where the error is raised
        data = pickle.dumps((False, None))
    try:
        with os.fdopen(write, "wb") as pipe:
            pipe.write(data)
    except BaseException:  # noqa: BLE001 - a parent that left: nothing to tell
        pass


def _reap(pid: int, read: int) -> None:
    """A child whose result was read or that nobody asked for: stopped and waited for."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass
    try:
        os.close(read)
    except OSError:
        pass
