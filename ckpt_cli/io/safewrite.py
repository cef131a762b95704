"""Writing files so that nothing is lost: targets checked (no special files, symlinks
followed, never the input or its data), temporary files beside the target that SIGTERM
removes and the next run sweeps, exclusive creation of new outputs, and filesystem
failures as one-line OutputErrors. ``save.py`` writes models and reports through it."""

from __future__ import annotations

import errno
import os
import re
import signal
import stat
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Iterator, NoReturn


from ..errors import OutputError, UsageError
from .external import external_tensors, locate

_TEMP_SUFFIX = ".tmp"
# Outputs checked by check_output_path: resolved path -> whether --force was given.
_checked: dict[Path, bool] = {}


def _process_start() -> float:
    """When this process started (its temporary files are younger than that)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


_STARTED = _process_start()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_pattern(name: str) -> re.Pattern[str]:
    """ckpt's temporary files for ``name``: ``.<name>.<pid>.<random>.tmp`` (and the same for
    its data file), plus the older ``.<name>.<random>.tmp``."""
    return re.compile(rf"^\.{re.escape(name)}(\.data)?\.(\d+\.)?[A-Za-z0-9_]{{8}}\.tmp$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove temporary files that killed ckpt runs left for ``path``: only ckpt's own
    pattern, only those whose writer (the pid in the name) is gone, or, for names without
    a pid, older than this process."""
    pattern = _temp_pattern(path.name)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if not m:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                continue
            pid = int(entry.name.rsplit(".", 3)[-3]) if m.group(2) else None
            if pid is None or pid == os.getpid():
                if st.st_mtime >= _STARTED:  # not provably older than this process
                    continue
            elif _pid_alive(pid):  # another run is writing it
                continue
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except (OSError, ValueError):
            continue
    return removed


def temp_beside(path: Path) -> Path:
    """A temporary file next to ``path`` with the permissions a new file would get
    (mkstemp makes it private, and the rename would keep that)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=_TEMP_SUFFIX, dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return Path(tmp)


def _terminated(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while writing, so ``finally`` removes temporary files."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends: a step and the record of its having
    happened (a rename and the flag that says the new file is in place) are one, so an
    interruption cannot fall between them. A held signal then gets the handling it would
    have had (KeyboardInterrupt, exit_on_sigterm's exit, the default action).

    Python-level handlers that only note the signal, not a signal mask: a mask holds a
    signal for the calling thread only, and the kernel hands a signal sent to the process
    to any other thread (numpy's BLAS threads), whose C handler still makes the main
    thread raise at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    # a handler installed from C (getsignal: None) could not be put back: left alone
    previous: dict[int, Any] = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(s) is not None}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if held:
            _deliver(held[0], previous[held[0]])


def _deliver(signum: int, handler: Any) -> None:
    """Handle ``signum`` as ``handler`` (what signal.signal returned) would have."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)  # the default action, now that the handler is back


@contextmanager
def os_errors(path: Path) -> Iterator[None]:
    """Filesystem failures (read-only, disk full, no permission) as one-line OutputErrors."""
    try:
        yield
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno == errno.ENOSPC:
            reason = "no space left on the device"
        raise OutputError(f"{path}: cannot write ({reason})") from e
    except MemoryError as e:
        raise OutputError(f"{path}: not enough memory to write it") from e


def write_target(path: str | Path) -> Path:
    """The file a write to ``path`` really replaces: a symbolic link's target (the link
    stays); refuses special files (devices, FIFOs, sockets), folders and dangling links."""
    path = Path(path)
    if path.is_symlink():
        real = Path(os.path.realpath(path))
        if not real.exists():
            raise UsageError(f"{path}: a symbolic link to '{real}', which does not exist; give a file path")
        path = real
    if path.exists():
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise UsageError(f"{path}: is a directory; give a file name")
        if not stat.S_ISREG(mode):
            raise UsageError(f"{path}: not a regular file (a device, FIFO or socket); "
                             "ckpt writes only regular files")
    return path


def commit(tmp: Path, path: Path, exclusive: bool) -> None:
    """Move the finished ``tmp`` to ``path``; with ``exclusive`` fail if ``path`` exists."""
    if not exclusive:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError as e:
        raise UsageError(f"{path}: was created by another process meanwhile; pass --force to overwrite it") from e
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if path.exists():  # no hard links on this filesystem: a best-effort check
            raise UsageError(f"{path}: was created by another process meanwhile; pass --force") from e
        os.replace(tmp, path)
    else:
        tmp.unlink()


def must_create(path: Path) -> bool:
    """Whether a write to ``path`` must create it: check_output_path saw it absent without --force."""
    return _checked.get(path.resolve()) is False


def write_text_atomic(path: str | Path, text: str) -> None:
    path = write_target(path)
    with os_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(path)
        with exit_on_sigterm():
            tmp = temp_beside(path)
            try:
                tmp.write_text(text)
                commit(tmp, path, must_create(path))
            finally:
                tmp.unlink(missing_ok=True)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def check_report_path(report: Path, protected: list[Path]) -> None:
    """Refuse a report path that is (links followed, hard links too) one of ``protected``:
    the input model, its data, the written model or plan."""
    report = Path(report)
    for p in protected:
        if p is not None and _same_file(report, Path(p)):
            raise UsageError(f"{report}: is {p}, which the report must not overwrite; choose another --report")


def _source_data_files(source: Path) -> set[Path]:
    from .load import data_files_of

    files = data_files_of(source)
    if files is not None:
        return files
    try:
        from .serialize import read_model

        model = read_model(source, embedded_weights=False)
        return {locate(t, source.parent, source).file for t in external_tensors(model)}
    except Exception:  # noqa: BLE001 - an unreadable source has no data files to protect
        return set()


def check_output_path(output: Path, source: Path | None, force: bool) -> None:
    """Refuse to overwrite the input or its external data (even with ``force``), a special
    file, or an existing file without ``force``. A new output is then created exclusively."""
    output = Path(output)
    target = write_target(output)
    if source is not None and target.exists() and _same_file(target, source):
        raise UsageError(f"{output}: refusing to overwrite the input model; choose another -o")
    if source is not None:
        if output.is_symlink() and _source_data_files(Path(source)):
            raise UsageError(f"{output}: a symbolic link; a model with external data must be written to its "
                             f"real path ({os.path.realpath(output)})")
        for data in _source_data_files(Path(source)):
            if _same_file(target, data) or target.resolve() == data:
                raise UsageError(f"{output}: is the input model's external data file; choose another -o")
    if target.exists() and not force:
        raise UsageError(f"{output}: exists; pass --force to overwrite it")
    if not target.parent.exists():
        raise UsageError(f"{target.parent}: output folder does not exist")
    _checked[target.resolve()] = bool(force)
